//! Compiling a parsed query into per-record conditions ("groups") and a
//! per-step formula over them, and running it over a trace's raw records.
//!
//! A group is a maximal sub-expression whose comparisons all read the same
//! section (and, for `memory_state`, the same key): it holds for a step
//! when one record of the step satisfies all of it at once. Only the record
//! kinds some group reads are looked at; every other record is skipped by
//! its kind, undecoded, and in version-2 files whole frames holding none of
//! those kinds are skipped undecompressed ([`TraceReader::skip_frames_without`]):
//! a query that does not name token_logit never decompresses token logits.

use std::io::Read;

use super::fields::{self, Getter, SECTIONS, Section, Target, Val, any_value, compare};
use super::parser::{Expr, Literal, Op};
use super::wire::{Malformed, record_body};
use super::{Match, QueryError};
use crate::error::TraceError;
use crate::pb::Header;
use crate::reader::{RecordKind, TraceReader};

/// A condition on one record of a group's section.
#[derive(Debug, Clone)]
pub(super) enum RecExpr {
    And(Box<RecExpr>, Box<RecExpr>),
    Or(Box<RecExpr>, Box<RecExpr>),
    Not(Box<RecExpr>),
    Compare { getter: Getter, op: Op, literal: Literal },
    Present(Getter),
}

#[derive(Debug, Clone)]
pub(super) struct Group {
    pub section: Section,
    pub memory_key: Option<String>,
    pub expr: RecExpr,
}

/// The formula evaluated once per step.
#[derive(Debug, Clone)]
pub(super) enum StepExpr {
    And(Box<StepExpr>, Box<StepExpr>),
    Or(Box<StepExpr>, Box<StepExpr>),
    Not(Box<StepExpr>),
    Group(usize),
    Context { target: Target, op: Op, literal: Literal },
}

/// The parsed tree with every path resolved and every literal checked.
enum Typed {
    And(Box<Typed>, Box<Typed>),
    Or(Box<Typed>, Box<Typed>),
    Not(Box<Typed>),
    Compare { target: Target, op: Op, literal: Literal },
    Exists { section: Section, memory_key: Option<String>, getter: Getter },
}

fn type_check(query: &str, expr: Expr) -> Result<Typed, QueryError> {
    Ok(match expr {
        Expr::And(a, b) => Typed::And(Box::new(type_check(query, *a)?), Box::new(type_check(query, *b)?)),
        Expr::Or(a, b) => Typed::Or(Box::new(type_check(query, *a)?), Box::new(type_check(query, *b)?)),
        Expr::Not(a) => Typed::Not(Box::new(type_check(query, *a)?)),
        Expr::Compare { path, op, op_at, literal, literal_at } => {
            let target = fields::resolve(query, &path, false)?;
            let literal = fields::check_literal(query, &target, path[0].at, op, op_at, literal, literal_at)?;
            Typed::Compare { target, op, literal }
        }
        Expr::Exists { path } => match fields::resolve(query, &path, true)? {
            Target::Record { section, memory_key, getter } => Typed::Exists { section, memory_key, getter },
            Target::Step | Target::Episode(_) => {
                return Err(QueryError::new(
                    query,
                    path[0].at,
                    "exists() takes a section or a record field, e.g. exists(error_context)".into(),
                ));
            }
        },
    })
}

type GroupKey = (Section, Option<String>);

fn group_key(t: &Typed) -> Option<GroupKey> {
    match t {
        Typed::Compare { target: Target::Record { section, memory_key, .. }, .. } => {
            Some((*section, memory_key.clone()))
        }
        Typed::Compare { .. } | Typed::Exists { .. } => None,
        Typed::Not(a) => group_key(a),
        Typed::And(a, b) | Typed::Or(a, b) => {
            let (ka, kb) = (group_key(a)?, group_key(b)?);
            (ka == kb).then_some(ka)
        }
    }
}

fn record_expr(t: Typed) -> RecExpr {
    match t {
        Typed::And(a, b) => RecExpr::And(Box::new(record_expr(*a)), Box::new(record_expr(*b))),
        Typed::Or(a, b) => RecExpr::Or(Box::new(record_expr(*a)), Box::new(record_expr(*b))),
        Typed::Not(a) => RecExpr::Not(Box::new(record_expr(*a))),
        Typed::Compare { target: Target::Record { getter, .. }, op, literal } => {
            RecExpr::Compare { getter, op, literal }
        }
        Typed::Compare { .. } | Typed::Exists { .. } => unreachable!("group_key admits only record comparisons"),
    }
}

fn step_expr(t: Typed, groups: &mut Vec<Group>) -> StepExpr {
    if let Some((section, memory_key)) = group_key(&t) {
        groups.push(Group { section, memory_key, expr: record_expr(t) });
        return StepExpr::Group(groups.len() - 1);
    }
    match t {
        Typed::And(a, b) => StepExpr::And(Box::new(step_expr(*a, groups)), Box::new(step_expr(*b, groups))),
        Typed::Or(a, b) => StepExpr::Or(Box::new(step_expr(*a, groups)), Box::new(step_expr(*b, groups))),
        Typed::Not(a) => StepExpr::Not(Box::new(step_expr(*a, groups))),
        Typed::Compare { target, op, literal } => StepExpr::Context { target, op, literal },
        Typed::Exists { section, memory_key, getter } => {
            groups.push(Group { section, memory_key, expr: RecExpr::Present(getter) });
            StepExpr::Group(groups.len() - 1)
        }
    }
}

/// The reward components a group's expression reads.
fn reward_names(expr: &RecExpr, out: &mut Vec<(NameKind, String)>) {
    match expr {
        RecExpr::And(a, b) | RecExpr::Or(a, b) => {
            reward_names(a, out);
            reward_names(b, out);
        }
        RecExpr::Not(a) => reward_names(a, out),
        RecExpr::Compare { getter: Getter::Reward { name, .. }, .. }
        | RecExpr::Present(Getter::Reward { name, .. }) => out.push((NameKind::RewardComponent, name.clone())),
        RecExpr::Compare { .. } | RecExpr::Present(_) => {}
    }
}

pub(super) fn compile(query: &str, expr: Expr) -> Result<(StepExpr, Vec<Group>), QueryError> {
    let typed = type_check(query, expr)?;
    let mut groups = Vec::new();
    let step = step_expr(typed, &mut groups);
    Ok((step, groups))
}

fn eval_record(expr: &RecExpr, body: &[u8]) -> Result<bool, Malformed> {
    Ok(match expr {
        RecExpr::And(a, b) => eval_record(a, body)? && eval_record(b, body)?,
        RecExpr::Or(a, b) => eval_record(a, body)? || eval_record(b, body)?,
        RecExpr::Not(a) => !eval_record(a, body)?,
        RecExpr::Compare { getter, op, literal } => any_value(getter, body, &mut |v| compare(v, *op, literal))?,
        RecExpr::Present(getter) => fields::has_value(getter, body)?,
    })
}

fn eval_step(expr: &StepExpr, hits: &[bool], step: u32, header: &Header) -> bool {
    match expr {
        StepExpr::And(a, b) => eval_step(a, hits, step, header) && eval_step(b, hits, step, header),
        StepExpr::Or(a, b) => eval_step(a, hits, step, header) || eval_step(b, hits, step, header),
        StepExpr::Not(a) => !eval_step(a, hits, step, header),
        StepExpr::Group(g) => hits[*g],
        StepExpr::Context { target, op, literal } => {
            let value = match target {
                Target::Step => Val::Num(step as f64),
                Target::Episode(name) => match *name {
                    "id" => Val::Str(header.episode_id.as_str().into()),
                    "task" => Val::Str(header.task.as_str().into()),
                    "variant" => Val::Str(header.variant.as_str().into()),
                    "namespace" => Val::Str(header.namespace.as_str().into()),
                    "shard" => Val::Num(header.shard as f64),
                    "shard_count" => Val::Num(header.shard_count as f64),
                    "training_step" => Val::Num(header.training_step as f64),
                    "config_hash" => Val::Str(hex::encode(&header.config_hash).into()),
                    other => unreachable!("resolve admits only known episode fields, not {other}"),
                },
                Target::Record { .. } => unreachable!("record comparisons are groups"),
            };
            compare(&value, *op, literal)
        }
    }
}

/// Notes the memory key of a delta, or the component names of a reward signal.
fn note_names(
    names: &[(NameKind, String)],
    kind: NameKind,
    record: &[u8],
    seen: &mut NamesSeen,
) -> Result<(), Malformed> {
    let body = record_body(record)?;
    match kind {
        NameKind::MemoryKey => seen.note(names, kind, fields::memory_key(body)?),
        NameKind::RewardComponent => {
            for name in fields::reward_component_names(body) {
                seen.note(names, kind, name?);
            }
        }
    }
    Ok(())
}

/// Every record kind [`section_of`] maps to a section.
const KINDS_WITH_A_SECTION: [RecordKind; SECTIONS.len()] = [
    RecordKind::PlanStep,
    RecordKind::MemoryDelta,
    RecordKind::TokenLogit,
    RecordKind::RewardSignal,
    RecordKind::ErrorContext,
    RecordKind::PolicyTurn,
    RecordKind::Injection,
    RecordKind::EpisodeEnd,
];

fn section_of(kind: RecordKind) -> Option<Section> {
    Some(match kind {
        RecordKind::PlanStep => Section::PlanExecution,
        RecordKind::MemoryDelta => Section::MemoryState,
        RecordKind::TokenLogit => Section::TokenLogit,
        RecordKind::RewardSignal => Section::RewardSignal,
        RecordKind::ErrorContext => Section::ErrorContext,
        RecordKind::PolicyTurn => Section::PolicyTurn,
        RecordKind::Injection => Section::Injection,
        RecordKind::EpisodeEnd => Section::EpisodeEnd,
        _ => return None,
    })
}

/// The compiled query, ready to run over traces.
pub(super) struct Program {
    pub step: StepExpr,
    pub groups: Vec<Group>,
    /// Groups by section (indexed by `Section as usize`).
    by_section: [Vec<usize>; SECTIONS.len()],
    /// The memory keys and reward components the query names.
    pub names: Vec<(NameKind, String)>,
}

/// What kind of name a query uses that a trace may not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NameKind {
    /// `memory_state.KEY`.
    MemoryKey,
    /// `reward_signal.NAME`.
    RewardComponent,
}

impl NameKind {
    fn section(self) -> Section {
        match self {
            NameKind::MemoryKey => Section::MemoryState,
            NameKind::RewardComponent => Section::RewardSignal,
        }
    }
}

/// How many names of each kind [`NamesSeen`] keeps to show (all are checked).
const NAMES_SHOWN: usize = 20;

/// Which of a query's names (`NameKind`) the searched traces have, and a
/// few of the names they have instead: a name that no trace has is most
/// likely a typo, and the search would otherwise just find nothing.
#[derive(Debug, Clone, Default)]
pub struct NamesSeen {
    /// Per name of the query (in [`Program::names`] order): met in a trace.
    met: Vec<bool>,
    /// The first [`NAMES_SHOWN`] names of each kind met, sorted.
    shown: [std::collections::BTreeSet<String>; 2],
    /// Names of each kind met beyond those shown.
    more: [bool; 2],
    /// Traces whose records were read (some of them, for a damaged one).
    pub traces: usize,
}

impl NamesSeen {
    /// Adds what another search met (of the same query).
    pub fn merge(&mut self, other: NamesSeen) {
        if self.met.len() < other.met.len() {
            self.met.resize(other.met.len(), false);
        }
        for (mine, theirs) in self.met.iter_mut().zip(other.met) {
            *mine |= theirs;
        }
        for kind in 0..2 {
            for name in &other.shown[kind] {
                self.note_shown(kind, name);
            }
            self.more[kind] |= other.more[kind];
        }
        self.traces += other.traces;
    }

    /// Keeps `name` among the first [`NAMES_SHOWN`] of its kind in sorted order.
    fn note_shown(&mut self, kind: usize, name: &str) {
        let shown = &mut self.shown[kind];
        if shown.contains(name) {
            return;
        }
        if shown.len() == NAMES_SHOWN {
            self.more[kind] = true;
            if shown.last().is_some_and(|last| name > last.as_str()) {
                return;
            }
            shown.pop_last();
        }
        shown.insert(name.to_string());
    }

    fn note(&mut self, names: &[(NameKind, String)], kind: NameKind, name: &[u8]) {
        for (i, (k, wanted)) in names.iter().enumerate() {
            if *k == kind && wanted.as_bytes() == name {
                self.met[i] = true;
            }
        }
        self.note_shown(kind as usize, &String::from_utf8_lossy(name));
    }
}

impl Program {
    pub fn new(step: StepExpr, groups: Vec<Group>) -> Self {
        let mut by_section: [Vec<usize>; SECTIONS.len()] = Default::default();
        let mut names = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            by_section[g.section as usize].push(i);
            if let Some(key) = &g.memory_key {
                names.push((NameKind::MemoryKey, key.clone()));
            }
            reward_names(&g.expr, &mut names);
        }
        names.sort();
        names.dedup();
        Self { step, groups, by_section, names }
    }

    /// The names of the query ([`Program::names`]) that no trace of `seen`
    /// has, each with the names of its kind the traces do have; nothing
    /// when no trace was read.
    pub fn unseen(&self, seen: &NamesSeen) -> Vec<String> {
        if seen.traces == 0 {
            return Vec::new();
        }
        let what = |kind: NameKind| match kind {
            NameKind::MemoryKey => ("memory key", "keys"),
            NameKind::RewardComponent => ("reward component", "components"),
        };
        self.names
            .iter()
            .enumerate()
            .filter(|(i, _)| !seen.met.get(*i).copied().unwrap_or(false))
            .map(|(_, (kind, name))| {
                let (one, many) = what(*kind);
                let k = *kind as usize;
                let (traces, they) = if seen.traces == 1 {
                    ("the searched trace has no".to_string(), "it has")
                } else {
                    (format!("none of the {} searched traces has", seen.traces), "they have")
                };
                if seen.shown[k].is_empty() {
                    format!("{traces} {one} `{name}`: {they} no {many} at all")
                } else {
                    let list = seen.shown[k].iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ");
                    let more = if seen.more[k] { ", ..." } else { "" };
                    format!("{traces} {one} `{name}` ({many} {they}: {list}{more})")
                }
            })
            .collect()
    }

    /// The record kinds some group reads.
    pub fn kinds_read(&self) -> Vec<RecordKind> {
        KINDS_WITH_A_SECTION
            .into_iter()
            .filter(|&k| section_of(k).is_some_and(|s| !self.by_section[s as usize].is_empty()))
            .collect()
    }

    /// Scans every record of `reader`, calling `on_match` for each matching
    /// step. Damage ends the scan with its error after the steps before it.
    /// Frames holding none of [`Program::kinds_read`] are skipped: every
    /// step is still visited (a skipped frame only continues a step already
    /// read), so the steps found are those a full read finds.
    /// The names the query uses that the records read have go to `seen`.
    pub fn run<R: Read>(
        &self,
        reader: &mut TraceReader<R>,
        on_match: &mut dyn FnMut(Match),
        seen: &mut NamesSeen,
    ) -> Result<(), TraceError> {
        reader.skip_frames_without(&self.kinds_read());
        if seen.met.len() < self.names.len() {
            seen.met.resize(self.names.len(), false);
        }
        seen.traces += 1;
        let noted: Vec<NameKind> = [NameKind::MemoryKey, NameKind::RewardComponent]
            .into_iter()
            .filter(|kind| self.names.iter().any(|(k, _)| k == kind))
            .collect();
        let header = reader.header().clone();
        let mut hits = vec![false; self.groups.len()];
        let mut current: Option<u32> = None;
        let mut step_offset = 0u64;
        let mut witness: Option<(u64, Section)> = None;
        let finish = |step: u32,
                      hits: &[bool],
                      witness: Option<(u64, Section)>,
                      step_offset: u64,
                      on_match: &mut dyn FnMut(Match)| {
            if eval_step(&self.step, hits, step, &header) {
                on_match(Match {
                    episode: header.episode_id.clone(),
                    step,
                    offset: witness.map_or(step_offset, |(o, _)| o),
                    section: witness.map(|(_, s)| s),
                });
            }
        };
        loop {
            let (step, hit, bad) = match reader.next_raw() {
                None => break,
                Some(Err(e)) => {
                    if let Some(step) = current {
                        finish(step, &hits, witness, step_offset, on_match);
                    }
                    return Err(e);
                }
                Some(Ok(raw)) => {
                    let step = raw.step;
                    if current != Some(step) {
                        if let Some(prev) = current {
                            finish(prev, &hits, witness, step_offset, on_match);
                        }
                        hits.iter_mut().for_each(|h| *h = false);
                        witness = None;
                    }
                    let mut hit = None;
                    let mut bad = None;
                    if let Some(section) = section_of(raw.kind) {
                        if let Some(&kind) = noted.iter().find(|k| k.section() == section)
                            && note_names(&self.names, kind, raw.bytes, seen).is_err()
                        {
                            bad = Some(section);
                        }
                        let groups = &self.by_section[section as usize];
                        if !groups.is_empty() && groups.iter().any(|&g| !hits[g]) {
                            match self.eval_groups(groups, raw.bytes, &mut hits) {
                                Ok(true) => hit = Some(section),
                                Ok(false) => {}
                                Err(Malformed) => bad = Some(section),
                            }
                        }
                    }
                    (step, hit, bad)
                }
            };
            let offset = reader.frame_offset();
            if current != Some(step) {
                current = Some(step);
                step_offset = offset;
            }
            if let Some(section) = bad {
                return Err(TraceError::Corrupt {
                    file: reader.file_name().to_string(),
                    offset,
                    reason: format!("step {step}: a {} record does not decode", section.name()),
                });
            }
            if let Some(section) = hit
                && witness.is_none()
            {
                witness = Some((offset, section));
            }
        }
        if let Some(step) = current {
            finish(step, &hits, witness, step_offset, on_match);
        }
        Ok(())
    }

    /// Evaluates the not-yet-satisfied groups of one section on a record;
    /// true when one of them became satisfied.
    fn eval_groups(&self, groups: &[usize], record: &[u8], hits: &mut [bool]) -> Result<bool, Malformed> {
        let body = record_body(record)?;
        let mut any = false;
        let mut key: Option<&[u8]> = None;
        for &g in groups {
            if hits[g] {
                continue;
            }
            let group = &self.groups[g];
            if let Some(want) = &group.memory_key {
                let k = match key {
                    Some(k) => k,
                    None => *key.insert(fields::memory_key(body)?),
                };
                if k != want.as_bytes() {
                    continue;
                }
            }
            if eval_record(&group.expr, body)? {
                hits[g] = true;
                any = true;
            }
        }
        Ok(any)
    }
}
