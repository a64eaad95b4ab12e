//! What a directory of runs holds: every episode found under it, with its
//! task, variant and metrics — from the shard's `summary.json` next to the
//! trace when there is one (the numbers the sandbox scored against the test
//! set), else from what the trace itself holds (error rate, resolution
//! time, reward, steps). Both `basecamp serve` and `basecamp trace report`
//! start from here; `serve` keeps one up to date across requests with
//! [`super::cache::CatalogCache`], which builds it from the same pieces.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use basecamp_sandbox::driver::{SUMMARY_FILE, ShardSummary};
use basecamp_trace::TraceContents;
use basecamp_trace::inputs::{TRACE_SUFFIX, expand_inputs};
use basecamp_trace::metrics::{EpisodeMetrics, NO_FAILURE, measures_the_agent};

use super::digest::TraceDigest;
use super::insights::InsightsMemo;
use crate::run::summary::EpisodeRow;

/// The namespace of traces that name none (older local runs).
pub const DEFAULT_NAMESPACE: &str = "default";

/// One episode and where its trace is.
#[derive(Debug, Clone)]
pub struct EpisodeEntry {
    pub namespace: String,
    pub task: String,
    pub variant: String,
    pub shard: u32,
    pub id: String,
    pub outcome: String,
    /// `ok`, or the bounded class a report groups failures by.
    pub failure_class: String,
    /// Metric name -> value; only the metrics that could be measured.
    pub metrics: BTreeMap<String, f64>,
    /// True when the metrics come from a shard summary (scored against the test set).
    pub from_summary: bool,
    pub trace: PathBuf,
    /// How pages name the trace: relative to the catalog root, `/`-separated
    /// (`serve`: for `/raw/...`); the path as found, or the object's `s3://`
    /// URL (`trace report`).
    pub relative: String,
    pub started_unix_nanos: i64,
    /// The trace's digest, read when first asked for.
    pub digest: LazyDigest,
}

/// A trace's digest, read at most once and shared by the clones of an
/// entry (every catalog `serve` builds while the file stays unchanged).
#[derive(Debug, Clone, Default)]
pub struct LazyDigest(Arc<OnceLock<Result<TraceDigest, String>>>);

impl LazyDigest {
    /// A digest made already, from a trace read for another reason.
    pub fn made(digest: TraceDigest) -> Self {
        Self(Arc::new(OnceLock::from(Ok(digest))))
    }

    /// The digest of `trace`, read now unless it was before.
    pub fn get(&self, trace: &Path) -> &Result<TraceDigest, String> {
        self.0.get_or_init(|| TraceDigest::load(trace))
    }
}

impl EpisodeEntry {
    pub fn failed(&self) -> bool {
        self.failure_class != NO_FAILURE
    }

    /// Whether the episode measured the agent: not when the policy's server
    /// or a service failed it (the means leave it out, as `basecamp run`'s
    /// and the operator's do).
    pub fn measured(&self) -> bool {
        measures_the_agent(&self.failure_class)
    }

    /// `<variant>/<episode>`: unique within a task, the key of in-page links.
    pub fn key(&self) -> String {
        format!("{}/{}", self.variant, self.id)
    }

    /// What the trace holds, boiled down (read on first use).
    pub fn digest(&self) -> &Result<TraceDigest, String> {
        self.digest.get(&self.trace)
    }

    /// The row the root-cause analysis of `basecamp run` takes.
    pub fn row(&self) -> EpisodeRow {
        EpisodeRow {
            id: self.id.clone(),
            shard: self.shard,
            outcome: self.outcome.clone(),
            failure_class: self.failure_class.clone(),
            metrics: EpisodeMetrics::default(),
            trace: self.relative.clone(),
        }
    }
}

/// The metrics of a summary's episode, by name.
pub fn metrics_map(m: &EpisodeMetrics) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let mut put = |name: &str, v: Option<f64>| {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            out.insert(name.to_string(), v);
        }
    };
    put("tool_call_accuracy", Some(m.tool_call_accuracy));
    put("tool_call_accuracy_lenient", Some(m.tool_call_accuracy_lenient));
    put("plan_step_f1", Some(m.plan_step_f1));
    put("memory_consistency", m.memory_consistency);
    put("error_rate", Some(m.error_rate));
    put("resolution_time_s", Some(m.resolution_time_s));
    put("reward", m.reward);
    put("tool_calls", Some(f64::from(m.tool_calls)));
    put("steps", Some(f64::from(m.steps)));
    out
}

/// Every episode found, plus what could not be read.
#[derive(Debug, Default)]
pub struct Catalog {
    pub episodes: Vec<EpisodeEntry>,
    /// One line per file that was skipped, and why.
    pub problems: Vec<String>,
    /// How many traces could not be read (each has its line in `problems`).
    pub unreadable: usize,
    /// Episodes a stop cut off, by namespace, task and variant: their shard
    /// summaries name them, and they are left out as the run's totals leave them out.
    pub(super) cut_off: BTreeMap<(String, String, String), usize>,
    /// Shards whose summaries say they did not start their whole test set.
    pub(super) short_shards: Vec<ShortShard>,
    /// What the task page computed from these episodes, kept as long as
    /// the catalog is (`serve` builds a new one when a file changes).
    pub insights: InsightsMemo,
}

/// A shard that did not start every episode of its test set: it gave up
/// (its policy's server or a service failed episode after episode), or a
/// stop kept episodes from starting. Its traces show only what ran.
#[derive(Debug, Clone)]
pub(super) struct ShortShard {
    namespace: String,
    task: String,
    variant: String,
    shard: u32,
    started_unix_nanos: i64,
    /// Why it gave up; `None`: a stop.
    gave_up: Option<String>,
    not_started: usize,
}

/// A task as the task list shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TaskKey {
    pub namespace: String,
    pub task: String,
}

impl Catalog {
    /// Every trace under `root` (recursively). Traces whose real path lies
    /// outside `root` (a symlink out of it) are skipped: `serve` shows only
    /// what is inside its directory.
    pub fn scan(root: &Path) -> Catalog {
        let arg = root.display().to_string();
        let files = match expand_inputs(&[arg], TRACE_SUFFIX) {
            Ok(files) => files,
            Err(e) => return Catalog { problems: vec![e.to_string()], ..Catalog::default() },
        };
        let real_root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        let inside: Vec<PathBuf> =
            files.into_iter().filter(|f| f.canonicalize().is_ok_and(|real| real.starts_with(&real_root))).collect();
        Self::from_files(root, &inside)
    }

    /// The traces named by files, directories and globs (as every trace tool takes them).
    pub fn from_inputs(args: &[String]) -> anyhow::Result<Catalog> {
        let files = expand_inputs(args, TRACE_SUFFIX)?;
        Ok(Self::from_files(Path::new(""), &files))
    }

    /// `files` with their metrics; `root` is what `relative` paths are relative to.
    fn from_files(root: &Path, files: &[PathBuf]) -> Catalog {
        let mut catalog = Catalog::default();
        // One summary per directory, read once.
        let mut summaries: HashMap<PathBuf, Option<ShardIndex>> = HashMap::new();
        for file in files {
            let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
            let summary =
                summaries.entry(dir.clone()).or_insert_with(|| match ShardIndex::read(&dir.join(SUMMARY_FILE)) {
                    Ok(summary) => {
                        if let Some(index) = &summary {
                            catalog.note_shard(index);
                        }
                        summary
                    }
                    Err(problem) => {
                        catalog.problems.push(problem);
                        None
                    }
                });
            if let Some(index) = summary.as_ref().filter(|index| index.cut_off(file)) {
                catalog.left_out_cut_off(index);
                continue;
            }
            match episode_entry(root, file, summary.as_ref(), LazyDigest::default()) {
                Ok(entry) => catalog.episodes.push(entry),
                Err(problem) => catalog.unreadable_trace(problem),
            }
        }
        catalog.finish();
        catalog
    }

    /// An episode of `index`'s shard that a stop cut off, left out.
    pub(super) fn left_out_cut_off(&mut self, index: &ShardIndex) {
        let s = &index.summary;
        *self.cut_off.entry((non_empty(&s.namespace), s.task.clone(), s.variant.clone())).or_default() += 1;
    }

    /// Notes `index`'s shard when it did not start every episode (call once per summary).
    pub(super) fn note_shard(&mut self, index: &ShardIndex) {
        let s = &index.summary;
        let not_started = s.not_started.len() + s.gave_up.as_ref().map_or(0, |g| g.not_started.len());
        if not_started == 0 && s.gave_up.is_none() {
            return;
        }
        self.short_shards.push(ShortShard {
            namespace: non_empty(&s.namespace),
            task: s.task.clone(),
            variant: s.variant.clone(),
            shard: s.shard,
            started_unix_nanos: s.started_unix_nanos,
            gave_up: s.gave_up.as_ref().map(|g| g.reason.clone()),
            not_started,
        });
    }

    /// A trace that could not be read, and why.
    pub(super) fn unreadable_trace(&mut self, problem: String) {
        self.unreadable += 1;
        self.problems.push(problem);
    }

    /// What every catalog is finished with, scanned or cached: the newest
    /// run's episodes ([`Self::keep_latest`]), and a problem for each variant
    /// only partly scored by summaries ([`Self::note_unscored_shards`]).
    pub(super) fn finish(&mut self) {
        self.keep_latest();
        self.note_unscored_shards();
        self.note_short_shards();
        for ((namespace, task, variant), count) in std::mem::take(&mut self.cut_off) {
            self.problems.push(format!(
                "{namespace}/{task}/{variant}: {count} episode(s) cut off by a stop (so their shard summaries say) \
                 are left out, as the run's totals leave them out"
            ));
        }
    }

    /// A line for each shard of the newest runs that did not start its
    /// whole test set: its episodes here are not all the test set's, and
    /// for one that gave up, the rest were never tried.
    fn note_short_shards(&mut self) {
        let mut newest: BTreeMap<(String, String, String, u32), ShortShard> = BTreeMap::new();
        for s in std::mem::take(&mut self.short_shards) {
            let key = (s.namespace.clone(), s.task.clone(), s.variant.clone(), s.shard);
            if newest.get(&key).is_none_or(|kept| kept.started_unix_nanos < s.started_unix_nanos) {
                newest.insert(key, s);
            }
        }
        for ((namespace, task, variant, shard), s) in newest {
            self.problems.push(match &s.gave_up {
                Some(reason) => format!(
                    "{namespace}/{task}/{variant}: shard {shard} GAVE UP, {} episode(s) not started: {reason}",
                    s.not_started
                ),
                None => format!(
                    "{namespace}/{task}/{variant}: shard {shard}: a stop kept {} episode(s) from starting",
                    s.not_started
                ),
            });
        }
    }

    /// A variant some of whose episodes have a shard summary and some do
    /// not (a shard that failed before writing one): the others' metrics
    /// come from their traces, which hold no scores against the test set,
    /// so the variant's averages of those cover only the scored episodes.
    /// Said rather than shown as if every episode were counted. A tree of
    /// traces with no summaries at all is not a run, and gets no note.
    fn note_unscored_shards(&mut self) {
        /// A variant's episodes, how many a summary scored, and the shards of the others.
        #[derive(Default)]
        struct Seen {
            episodes: usize,
            scored: usize,
            unscored_shards: BTreeSet<u32>,
        }
        let mut variants: BTreeMap<(&str, &str, &str), Seen> = BTreeMap::new();
        for e in &self.episodes {
            let seen = variants.entry((&e.namespace, &e.task, &e.variant)).or_default();
            seen.episodes += 1;
            if e.from_summary {
                seen.scored += 1;
            } else {
                seen.unscored_shards.insert(e.shard);
            }
        }
        let notes: Vec<String> = variants
            .into_iter()
            .filter(|(_, seen)| seen.scored > 0 && seen.scored < seen.episodes)
            .map(|((namespace, task, variant), Seen { episodes, scored, unscored_shards: shards })| {
                let shards: Vec<String> = shards.iter().map(u32::to_string).collect();
                format!(
                    "{namespace}/{task}/{variant}: {} of {episodes} episodes (shard {}) have no shard summary; their metrics \
                     come from their traces, so the averages of scored metrics (tool_call_accuracy, plan_step_f1, \
                     memory_consistency) cover the other {scored} only",
                    episodes - scored,
                    shards.join(", ")
                )
            })
            .collect();
        self.problems.extend(notes);
    }

    /// The same episode of the same variant found twice (two runs of one
    /// task in the tree): the newest run's wins, so a task page shows one run.
    fn keep_latest(&mut self) {
        let mut newest: HashMap<(String, String, String, String), usize> = HashMap::new();
        for (i, e) in self.episodes.iter().enumerate() {
            let key = (e.namespace.clone(), e.task.clone(), e.variant.clone(), e.id.clone());
            match newest.get(&key) {
                Some(&j) if self.episodes[j].started_unix_nanos >= e.started_unix_nanos => {}
                _ => {
                    newest.insert(key, i);
                }
            }
        }
        let keep: std::collections::HashSet<usize> = newest.into_values().collect();
        let superseded = self.episodes.len() - keep.len();
        if superseded > 0 {
            self.problems.push(format!("{superseded} episode(s) also found in older runs; showing the newest"));
        }
        let mut i = 0;
        self.episodes.retain(|_| {
            i += 1;
            keep.contains(&(i - 1))
        });
    }

    /// The tasks, sorted, each with its episodes.
    pub fn tasks(&self) -> BTreeMap<TaskKey, Vec<&EpisodeEntry>> {
        let mut out: BTreeMap<TaskKey, Vec<&EpisodeEntry>> = BTreeMap::new();
        for e in &self.episodes {
            out.entry(TaskKey { namespace: e.namespace.clone(), task: e.task.clone() }).or_default().push(e);
        }
        out
    }

    /// One task's episodes, by variant (sorted), each variant's episodes by id.
    pub fn variants_of(&self, namespace: &str, task: &str) -> BTreeMap<String, Vec<&EpisodeEntry>> {
        let mut out: BTreeMap<String, Vec<&EpisodeEntry>> = BTreeMap::new();
        for e in self.episodes.iter().filter(|e| e.namespace == namespace && e.task == task) {
            out.entry(e.variant.clone()).or_default().push(e);
        }
        for episodes in out.values_mut() {
            episodes.sort_by(|a, b| a.id.cmp(&b.id));
        }
        out
    }
}

/// A shard's `summary.json`, with its episodes by trace file name.
#[derive(Debug)]
pub struct ShardIndex {
    summary: ShardSummary,
    by_trace_file: HashMap<String, usize>,
}

impl ShardIndex {
    /// Whether the summary names `trace` as an episode a stop cut off.
    pub fn cut_off(&self, trace: &Path) -> bool {
        let name = trace.file_name().map(|n| n.to_string_lossy());
        name.is_some_and(|name| self.summary.interrupted_traces.iter().any(|t| *t == name))
    }

    /// The summary at `path`: `None` when there is none (or it cannot be
    /// read), `Err` (the problem to show) when it is not a shard summary.
    pub fn read(path: &Path) -> Result<Option<ShardIndex>, String> {
        let Ok(text) = std::fs::read(path) else { return Ok(None) };
        Self::parse(&text, &path.display().to_string()).map(Some)
    }

    /// The summary `text`, read from `name`; `Err` (naming it) when it is
    /// not a shard summary.
    pub fn parse(text: &[u8], name: &str) -> Result<ShardIndex, String> {
        let summary = serde_json::from_slice::<ShardSummary>(text)
            .map_err(|e| format!("{name}: not a shard summary ({e}); metrics read from traces"))?;
        let mut by_trace_file = HashMap::new();
        for (i, e) in summary.episodes.iter().enumerate() {
            // The first row for a file wins, as a linear search would find it.
            by_trace_file.entry(e.trace_file.clone()).or_insert(i);
        }
        Ok(ShardIndex { summary, by_trace_file })
    }
}

/// The entry of the trace `file`: scored by its shard's summary when that
/// names it, else from the trace itself (read through `digest` now).
/// `Err` is the problem to show when neither works.
pub fn episode_entry(
    root: &Path,
    file: &Path,
    summary: Option<&ShardIndex>,
    digest: LazyDigest,
) -> Result<EpisodeEntry, String> {
    let relative = file.strip_prefix(root).unwrap_or(file).to_string_lossy().replace('\\', "/");
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let scored = summary.and_then(|s| s.by_trace_file.get(&name).map(|&i| (&s.summary, &s.summary.episodes[i])));
    if let Some((shard, e)) = scored {
        return Ok(EpisodeEntry {
            namespace: non_empty(&shard.namespace),
            task: shard.task.clone(),
            variant: shard.variant.clone(),
            shard: shard.shard,
            id: e.id.clone(),
            outcome: e.outcome.clone(),
            failure_class: e.failure_class.clone(),
            metrics: metrics_map(&e.metrics),
            from_summary: true,
            trace: file.to_path_buf(),
            relative,
            started_unix_nanos: shard.started_unix_nanos,
            digest,
        });
    }
    let trace = digest.get(file).as_ref().map_err(Clone::clone)?;
    Ok(EpisodeEntry {
        namespace: non_empty(&trace.header.namespace),
        task: trace.header.task.clone(),
        variant: trace.header.variant.clone(),
        shard: trace.header.shard,
        id: trace.header.episode_id.clone(),
        outcome: trace.outcome.clone(),
        failure_class: trace.failure_class(),
        metrics: trace.metrics(),
        from_summary: false,
        trace: file.to_path_buf(),
        relative,
        started_unix_nanos: trace.header.start_time_unix_nanos,
        digest: digest.clone(),
    })
}

/// The entry of one trace read already (`trace parse FILE --output html`),
/// as serve's catalog makes it: scored by its shard's `summary` when that
/// names `file` (the path or `s3://` URL as given), else from `trace`.
pub fn lone_entry(file: &Path, trace: &TraceContents, summary: Option<&ShardIndex>) -> EpisodeEntry {
    let digest = TraceDigest::from_records(trace.header.clone(), &trace.records, trace.damage().map(|e| e.to_string()));
    episode_entry(Path::new(""), file, summary, LazyDigest::made(digest))
        .expect("an entry with its digest made already cannot fail to read it")
}

fn non_empty(namespace: &str) -> String {
    if namespace.is_empty() { DEFAULT_NAMESPACE.to_string() } else { namespace.to_string() }
}
