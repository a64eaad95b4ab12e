//! `basecamp trace validate`: everything a trace promises, checked.
//!
//! - **schema**: the file reads to its end (checksums, framing, a header,
//!   an episode end, index and trailer); enum values are ones this schema
//!   defines; a token's top-k arrays have one length, at most `top_k`.
//! - **steps**: record steps never go backwards; every step from 1 to
//!   `EpisodeEnd.steps` holds an outcome (a plan step or an error context),
//!   none comes after it; the episode end is the last record; a plan step's
//!   `index` is its record's step.
//! - **status**: `fallback_used` is set exactly when the status is `fallback`.
//! - **hashes**: `input_hash` / `result_hash` are the sha256 of the
//!   canonical JSON of the arguments / observation.
//! - **memory**: memory is replayed from the deltas (each delta's `before`
//!   must be the value memory held); each plan step's `memory_hash_before`
//!   must be the replayed memory's hash, its `memory_hash_after` the next
//!   plan step's `memory_hash_before` when only tool deltas came between
//!   (the hash chain the executor records), snapshots and the episode end's
//!   `final_memory_hash` must match the replay.
//! - **reward**: `weighted_sum` is the sum of score x weight over the
//!   components, and both are finite numbers.
//! - **index**: the footer index lists every step with the offset of the
//!   frame holding its first record, in file order, and counts every record
//!   (random access trusts it).
//!
//! Each [`Finding`] names the file and the step (or the byte offset of damage).

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::canonical::{Digest, hash_json};
use crate::error::TraceError;
use crate::memory::{Memory, MemoryPatch};
use crate::pb::{self, MemorySource, Outcome, StepKind, StepStatus, record::Body};
use crate::reader::{Tail, TraceReader};

/// One broken promise.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub file: String,
    /// The step of the record at fault (`None` for the file as a whole).
    pub step: Option<u32>,
    /// Which family of checks: `schema`, `steps`, `status`, `hashes`, `memory`, `reward`, `index`.
    pub check: &'static str,
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.step {
            Some(step) => write!(f, "{}: step {step}: {}: {}", self.file, self.check, self.message),
            None => write!(f, "{}: {}: {}", self.file, self.check, self.message),
        }
    }
}

/// Validates one file.
pub fn validate_file(path: &Path) -> Vec<Finding> {
    validate_opened(&path.display().to_string(), TraceReader::open(path))
}

/// Validates a trace whose opening (preamble and header) may have failed.
pub fn validate_opened<R: Read>(file: &str, opened: Result<TraceReader<R>, TraceError>) -> Vec<Finding> {
    match opened {
        Ok(reader) => validate_reader(reader),
        Err(e) => vec![Finding { file: file.to_string(), step: None, check: "schema", message: unreadable(&e) }],
    }
}

fn unreadable(e: &TraceError) -> String {
    // The error names the file already; the finding does too.
    let text = e.to_string();
    match text.split_once(": ") {
        Some((_, rest)) => rest.to_string(),
        None => text,
    }
}

/// Validates a trace read from any source.
pub fn validate_reader<R: Read>(mut reader: TraceReader<R>) -> Vec<Finding> {
    let mut v = Validator::new(reader.file_name().to_string(), reader.header().clone());
    // What the footer index must say: each step with the offset of the
    // frame holding its first record (the header's frame starts step 0),
    // and the records, the header included.
    let mut steps: Vec<(u32, u64)> = vec![(0, reader.frame_offset())];
    let mut records = 1u64;
    while let Some(record) = reader.next() {
        match record {
            Ok(record) => {
                if steps.last().is_some_and(|&(step, _)| step != record.step) {
                    steps.push((record.step, reader.frame_offset()));
                }
                records += 1;
                v.record(record);
            }
            Err(_) => break,
        }
    }
    match reader.tail() {
        // Read to the footer: the index is checked, and the missing end is
        // the `steps` finding `finish` makes.
        Some(Tail::Complete | Tail::Damaged(TraceError::NoEpisodeEnd { .. })) => {
            if let Some(problem) =
                reader.footer_index().and_then(|(at, index)| index_problem(at, index, &steps, records))
            {
                v.file_finding("index", problem);
            }
        }
        Some(Tail::Damaged(e)) => v.file_finding("schema", unreadable(e)),
        None => {}
    }
    v.finish()
}

/// What is wrong with the footer index at byte `at`, against the steps
/// (with their first frames' offsets) and the record count read. Random
/// access (`trace show --step`, the `serve` episode pages) trusts the
/// index: a wrong entry shows another step's records, or none.
fn index_problem(at: u64, index: Result<&pb::TraceIndex, &str>, steps: &[(u32, u64)], records: u64) -> Option<String> {
    let index = match index {
        Ok(index) => index,
        Err(e) => return Some(format!("the index frame at byte {at} does not decode: {e}")),
    };
    let listed: Vec<(u32, u64)> = index.entries.iter().map(|e| (e.step, e.offset)).collect();
    if let Some(i) = (0..listed.len().max(steps.len())).find(|&i| listed.get(i) != steps.get(i)) {
        let said = |entry: Option<&(u32, u64)>| match entry {
            Some((step, offset)) => format!("step {step} at byte {offset}"),
            None => "nothing more".to_string(),
        };
        return Some(match (listed.get(i), steps.get(i)) {
            (Some((step, offset)), Some((read, first))) if step == read => format!(
                "the index (byte {at}) points step {step} at byte {offset}, but its first record is in the frame at \
                 byte {first}"
            ),
            (l, r) => format!(
                "the index (byte {at}) lists {} steps, the trace holds {}; entry {i} is {}, the trace has {}",
                listed.len(),
                steps.len(),
                said(l),
                said(r)
            ),
        });
    }
    (index.record_count != records)
        .then(|| format!("the index (byte {at}) counts {} records, the trace holds {records}", index.record_count))
}

struct Validator {
    file: String,
    header: pb::Header,
    findings: Vec<Finding>,
    last_step: u32,
    /// Steps holding a plan step or an error context.
    steps_with_outcome: std::collections::BTreeSet<u32>,
    /// The steps that hold a policy turn: one step is one turn.
    steps_with_turn: std::collections::BTreeSet<u32>,
    end: Option<(u32, pb::EpisodeEnd)>,
    records_after_end: bool,
    /// (step, the later step it came after) -> its finding's index in
    /// `findings` and how many records it counts: a step's records that
    /// come after a later step are one finding, not one per record.
    backwards: std::collections::HashMap<(u32, u32), (usize, u32)>,
    memory: Memory,
    /// The previous plan step's (step, memory_hash_after), while only tool deltas followed it.
    chain: Option<(u32, Vec<u8>)>,
}

fn hex_short(bytes: &[u8]) -> String {
    match Digest::from_slice(bytes) {
        Some(d) => d.short(),
        None if bytes.is_empty() => "(empty)".into(),
        None => format!("{} bytes, not a sha256", bytes.len()),
    }
}

impl Validator {
    fn new(file: String, header: pb::Header) -> Self {
        let mut v = Self {
            file,
            header,
            findings: Vec::new(),
            last_step: 0,
            steps_with_outcome: Default::default(),
            steps_with_turn: Default::default(),
            end: None,
            records_after_end: false,
            backwards: Default::default(),
            memory: Memory::new(),
            chain: None,
        };
        if v.header.episode_id.is_empty() {
            v.file_finding("schema", "the header has no episode_id".into());
        }
        v
    }

    fn finding(&mut self, step: u32, check: &'static str, message: String) {
        self.findings.push(Finding { file: self.file.clone(), step: Some(step), check, message });
    }

    fn file_finding(&mut self, check: &'static str, message: String) {
        self.findings.push(Finding { file: self.file.clone(), step: None, check, message });
    }

    /// A record of `step` after a record of the later `self.last_step`.
    fn record_backwards(&mut self, step: u32) {
        let after = self.last_step;
        match self.backwards.get_mut(&(step, after)) {
            Some((at, count)) => {
                *count += 1;
                self.findings[*at].message = format!("{count} records of step {step} come after step {after}");
            }
            None => {
                self.backwards.insert((step, after), (self.findings.len(), 1));
                self.finding(step, "steps", format!("record of step {step} comes after step {after}"));
            }
        }
    }

    fn record(&mut self, record: pb::Record) {
        let step = record.step;
        if step < self.last_step {
            self.record_backwards(step);
        }
        self.last_step = self.last_step.max(step);
        if self.end.is_some() && !self.records_after_end {
            self.records_after_end = true;
            self.finding(step, "steps", "records follow the episode end".into());
        }
        match record.body {
            Some(Body::PlanStep(p)) => self.plan_step(step, *p),
            Some(Body::MemoryDelta(d)) => self.memory_delta(step, d),
            Some(Body::MemorySnapshot(s)) => {
                let replayed = self.memory.hash();
                if s.memory_hash != replayed.0 {
                    self.finding(
                        step,
                        "memory",
                        format!(
                            "memory snapshot hash {} is not the hash of the memory the deltas give ({})",
                            hex_short(&s.memory_hash),
                            replayed.short()
                        ),
                    );
                }
            }
            Some(Body::TokenLogit(t)) => {
                let n = t.top_ids.len();
                if t.top_tokens.len() != n || t.top_logprobs.len() != n {
                    self.finding(
                        step,
                        "schema",
                        format!(
                            "token at position {}: top_ids, top_tokens and top_logprobs have {}, {} and {} entries",
                            t.position,
                            n,
                            t.top_tokens.len(),
                            t.top_logprobs.len()
                        ),
                    );
                } else if self.header.top_k > 0 && n > self.header.top_k as usize {
                    self.finding(
                        step,
                        "schema",
                        format!(
                            "token at position {} has {n} alternatives; the header says top_k {}",
                            t.position, self.header.top_k
                        ),
                    );
                }
            }
            Some(Body::RewardSignal(r)) => {
                let sum: f64 = r.components.iter().map(|c| c.score * c.weight).sum();
                let parts = || -> String {
                    let parts: Vec<String> =
                        r.components.iter().map(|c| format!("{} {} x {}", c.name, c.score, c.weight)).collect();
                    parts.join(" + ")
                };
                // NaN compares false with everything, so these are checked first.
                if !sum.is_finite() || !r.weighted_sum.is_finite() {
                    self.finding(
                        step,
                        "reward",
                        format!(
                            "weighted_sum is {} and the components give {sum} ({}): a reward must be a finite number",
                            r.weighted_sum,
                            parts()
                        ),
                    );
                } else if (sum - r.weighted_sum).abs() > 1e-9 * sum.abs().max(1.0) {
                    self.finding(
                        step,
                        "reward",
                        format!("weighted_sum is {} but the components give {sum} ({})", r.weighted_sum, parts()),
                    );
                }
            }
            Some(Body::ErrorContext(_)) => {
                self.steps_with_outcome.insert(step);
            }
            Some(Body::EpisodeEnd(e)) => {
                if Outcome::try_from(e.outcome).is_err() || e.outcome == 0 {
                    self.finding(
                        step,
                        "status",
                        format!("episode end has outcome {}, not a defined outcome", e.outcome),
                    );
                }
                if self.end.is_some() {
                    self.finding(step, "steps", "a second episode end".into());
                }
                self.end = Some((step, e));
            }
            Some(Body::Header(_)) => self.finding(step, "schema", "a second header".into()),
            Some(Body::PolicyTurn(_)) => {
                // Two turns in one step: a step played again over a half-played one
                // (a server-mode step its client left, before that was fixed).
                if !self.steps_with_turn.insert(step) {
                    self.finding(step, "steps", format!("a second policy turn in step {step}: a step is one turn"));
                }
            }
            Some(Body::Injection(_)) => {}
            None => self.finding(step, "schema", "a record without a body (from a newer writer?)".into()),
        }
    }

    fn plan_step(&mut self, step: u32, p: pb::PlanStep) {
        self.steps_with_outcome.insert(step);
        let status = StepStatus::try_from(p.status).ok().filter(|s| *s != StepStatus::Unspecified);
        match status {
            None => self.finding(step, "status", format!("plan step status {} is not a defined status", p.status)),
            Some(status) => {
                if p.fallback_used != (status == StepStatus::Fallback) {
                    self.finding(
                        step,
                        "status",
                        format!("status is {} but fallback_used is {}", status.as_str_name(), p.fallback_used),
                    );
                }
            }
        }
        if StepKind::try_from(p.kind).is_err() || p.kind == 0 {
            self.finding(step, "status", format!("plan step kind {} is not a defined kind", p.kind));
        }
        if p.index != step {
            self.finding(step, "steps", format!("plan step index {} is in a record of step {step}", p.index));
        }
        for (what, text, stored) in
            [("input_hash", &p.arguments_json, &p.input_hash), ("result_hash", &p.observation_json, &p.result_hash)]
        {
            if stored.is_empty() {
                continue;
            }
            if let Ok(value) = serde_json::from_str::<Value>(text) {
                let computed = hash_json(&value);
                if stored.as_slice() != computed.0 {
                    self.finding(
                        step,
                        "hashes",
                        format!(
                            "{what} {} is not the hash of the canonical JSON ({}) of tool {:?}",
                            hex_short(stored),
                            computed.short(),
                            p.tool
                        ),
                    );
                }
            }
        }
        if let Some((prev_step, after)) = self.chain.take()
            && after != p.memory_hash_before
        {
            self.finding(
                step,
                "memory",
                format!(
                    "hash chain broken: memory_hash_before {} is not memory_hash_after {} of the call at step {prev_step}",
                    hex_short(&p.memory_hash_before),
                    hex_short(&after)
                ),
            );
        }
        let replayed = self.memory.hash();
        if p.memory_hash_before != replayed.0 {
            self.finding(
                step,
                "memory",
                format!(
                    "memory_hash_before {} is not the hash of the memory the deltas give ({})",
                    hex_short(&p.memory_hash_before),
                    replayed.short()
                ),
            );
        }
        self.chain = Some((step, p.memory_hash_after));
    }

    fn memory_delta(&mut self, step: u32, d: pb::MemoryDelta) {
        let parse = |text: &Option<String>| -> Result<Option<Value>, String> {
            text.as_deref().map(|t| serde_json::from_str(t).map_err(|e| format!("{t:?}: {e}"))).transpose()
        };
        let (before, after) = match (parse(&d.before_json), parse(&d.after_json)) {
            (Ok(b), Ok(a)) => (b, a),
            (Err(e), _) | (_, Err(e)) => {
                self.finding(step, "schema", format!("memory delta of {:?} holds invalid JSON {e}", d.key));
                return;
            }
        };
        let source = MemorySource::try_from(d.source).ok().filter(|s| *s != MemorySource::Unspecified);
        if source.is_none() {
            self.finding(
                step,
                "status",
                format!("memory delta of {:?} has source {}, not a defined source", d.key, d.source),
            );
        }
        if !matches!(source, Some(MemorySource::Tool | MemorySource::Fallback)) {
            // Memory changed outside a tool call: the next call starts from the replay, not the chain.
            self.chain = None;
        }
        let held = self.memory.get(&d.key).cloned();
        if held != before {
            let show = |v: &Option<Value>| v.as_ref().map_or("absent".to_string(), |v| v.to_string());
            self.finding(
                step,
                "memory",
                format!("delta of {:?} says it was {} but memory held {}", d.key, show(&before), show(&held)),
            );
        }
        let patch = match after {
            Some(value) => MemoryPatch::default().set(d.key, value),
            None => MemoryPatch::default().remove(d.key),
        };
        self.memory.apply(&patch, MemorySource::Tool, "");
    }

    fn finish(mut self) -> Vec<Finding> {
        match self.end.take() {
            None => {
                if !self.findings.iter().any(|f| f.check == "schema" && f.step.is_none()) {
                    self.file_finding("steps", "the trace has no episode end".into());
                }
            }
            Some((end_step, end)) => {
                // Steps past the last record are one finding, not one per step.
                let last_recorded = self.last_step;
                for step in 1..=end.steps.min(last_recorded) {
                    if !self.steps_with_outcome.contains(&step) {
                        self.finding(step, "steps", "step never ended: no plan step or error context recorded".into());
                    }
                }
                if end.steps > last_recorded {
                    self.finding(
                        end_step,
                        "steps",
                        format!("the episode end says {} steps, but records stop at step {last_recorded}", end.steps),
                    );
                }
                if let Some(&beyond) = self.steps_with_outcome.range(end.steps.saturating_add(1)..).next() {
                    self.finding(
                        beyond,
                        "steps",
                        format!("step {beyond} is after the episode end's {} steps", end.steps),
                    );
                }
                let replayed = self.memory.hash();
                if !end.final_memory_hash.is_empty() && end.final_memory_hash != replayed.0 {
                    self.finding(
                        end_step,
                        "memory",
                        format!(
                            "final_memory_hash {} is not the hash of the memory the deltas give ({})",
                            hex_short(&end.final_memory_hash),
                            replayed.short()
                        ),
                    );
                }
            }
        }
        self.findings
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{EpisodeShape, generate};

    #[test]
    fn a_synthetic_episode_is_valid() {
        let bytes = generate(&EpisodeShape { steps: 20, tokens_per_step: 3, ..Default::default() })
            .write_to(Vec::new(), 3)
            .unwrap();
        let findings = validate_reader(TraceReader::new(bytes.as_slice(), "ok.trace").unwrap());
        assert!(findings.is_empty(), "{findings:#?}");
    }

    #[test]
    fn a_second_policy_turn_in_a_step_is_a_finding() {
        let mut episode = generate(&EpisodeShape { steps: 3, tokens_per_step: 1, ..Default::default() });
        let turn = episode.steps[1].iter().find(|r| matches!(r.body, Some(Body::PolicyTurn(_)))).unwrap().clone();
        episode.steps[1].push(turn);
        let bytes = episode.write_to(Vec::new(), 3).unwrap();
        let findings = validate_reader(TraceReader::new(bytes.as_slice(), "twice.trace").unwrap());
        let said: Vec<String> = findings.iter().map(|f| format!("{} {:?} {}", f.check, f.step, f.message)).collect();
        assert_eq!(said, ["steps Some(1) a second policy turn in step 1: a step is one turn"]);
    }

    /// The footer index of `bytes`: its frame's offset and its entries.
    fn index_of(bytes: &[u8]) -> (usize, pb::TraceIndex) {
        use crate::format::{FRAME_HEADER_LEN, FrameHeader, TRAILER_LEN};
        use prost::Message as _;
        let at = u64::from_le_bytes(bytes[bytes.len() - TRAILER_LEN..][..8].try_into().unwrap()) as usize;
        let header = FrameHeader::decode(bytes[at..at + FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        let payload = &bytes[at + FRAME_HEADER_LEN..][..header.compressed_len as usize];
        (at, pb::TraceIndex::decode(zstd::decode_all(payload).unwrap().as_slice()).unwrap())
    }

    /// `bytes` with its footer index replaced by what `edit` makes of it,
    /// framed and checksummed as a writer would: only the index lies.
    fn with_index(bytes: &[u8], edit: impl FnOnce(&mut pb::TraceIndex)) -> Vec<u8> {
        use crate::format::{FRAME_HEADER_LEN, FrameHeader, trailer};
        use prost::Message as _;
        let (at, mut index) = index_of(bytes);
        edit(&mut index);
        let raw = index.encode_to_vec();
        let compressed = zstd::encode_all(raw.as_slice(), 3).unwrap();
        let header = FrameHeader::decode(bytes[at..at + FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        let header = FrameHeader {
            compressed_len: compressed.len() as u32,
            raw_len: raw.len() as u32,
            payload_crc: crc32fast::hash(&compressed),
            ..header
        };
        [&bytes[..at], &header.encode(), &compressed, &trailer(at as u64)].concat()
    }

    #[test]
    fn an_index_that_does_not_match_the_records_is_a_finding() {
        let bytes = generate(&EpisodeShape { steps: 6, tokens_per_step: 2, ..Default::default() })
            .write_to(Vec::new(), 3)
            .unwrap();
        let check = |bytes: &[u8]| -> Vec<String> {
            let findings = validate_reader(TraceReader::new(bytes, "x.trace").unwrap());
            findings.iter().map(|f| format!("{}: {}", f.check, f.message)).collect()
        };
        assert_eq!(with_index(&bytes, |_| {}), bytes, "re-framing alone changes nothing");
        let (at, index) = index_of(&bytes);
        let offset_of = |step: u32| index.entries.iter().find(|e| e.step == step).unwrap().offset;
        let (at3, at4) = (offset_of(3), offset_of(4));

        // Step 3 pointed at step 4's frame: random access would find no record of step 3.
        let moved = with_index(&bytes, |i| i.entries.iter_mut().find(|e| e.step == 3).unwrap().offset = at4);
        assert_eq!(
            check(&moved),
            [format!(
                "index: the index (byte {at}) points step 3 at byte {at4}, but its first record is in the frame at \
                 byte {at3}"
            )]
        );
        // A step left out.
        let dropped = with_index(&bytes, |i| i.entries.retain(|e| e.step != 3));
        let n = index.entries.len();
        assert_eq!(
            check(&dropped),
            [format!(
                "index: the index (byte {at}) lists {} steps, the trace holds {n}; entry 3 is step 4 at byte {at4}, \
                 the trace has step 3 at byte {at3}",
                n - 1
            )]
        );
        // A wrong record count.
        let counted = with_index(&bytes, |i| i.record_count += 1);
        assert_eq!(
            check(&counted),
            [format!(
                "index: the index (byte {at}) counts {} records, the trace holds {}",
                index.record_count + 1,
                index.record_count
            )]
        );
    }
}
