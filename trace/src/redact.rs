//! `basecamp trace redact`: a copy of a trace with personal data replaced
//! by salted hashes, still a valid trace.
//!
//! What is replaced, by `redacted:` and the first 16 hex digits of
//! sha256(salt, 0, value) — the same value gives the same token within one
//! run (one salt), so joins across steps and files still work:
//!
//! - the values of the **PII fields**: memory keys of that name (deltas,
//!   snapshots, error-context memory) and object keys of that name at any
//!   depth of any JSON the trace holds (tool arguments, observations, the
//!   policy's tool calls — including JSON nested in JSON strings —, payloads,
//!   injections, memory values), except `null` and booleans, which hold no
//!   personal data;
//! - **pattern** matches (`email`, `phone`) inside every string: free-text
//!   fields (policy content, error messages and causes, final answer, token
//!   strings, ...) and string values inside JSON. Numbers in JSON are not
//!   strings and are left alone; a value split over several generated
//!   tokens is not recognised in the token_logit section. Object keys and
//!   memory keys are strings too: a PII value or pattern match in a key is
//!   replaced the same way (`{"jane@example.com": "vip"}` becomes
//!   `{"redacted:…": "vip"}`). Two keys never become one: a key left alone
//!   keeps its name, and a redacted key whose text another key already has
//!   gets `#2`, `#3`, ... in key order. A memory key gets one name for the
//!   whole trace (deltas, snapshots, error contexts, refused writes), so
//!   memory replays to the same keys everywhere.
//!
//! Everything derived from a replaced value is recomputed so the output is a
//! valid trace (`validate` passes on it when it passed on the input): the
//! argument and result hashes, every memory hash (memory is replayed from
//! the original and the redacted deltas side by side, and each recorded
//! hash is mapped to the hash of the same state redacted), snapshots, the
//! final memory hash, and the index (the output is written by the writer,
//! with the same step frames). The header's episode and row ids are free
//! text: their pattern matches and known PII values are replaced.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{Read, Write};
use std::ops::Range;

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::canonical::{canonical_json, hash_json};
use crate::error::TraceError;
use crate::memory::{Memory, MemoryPatch};
use crate::pb::{self, MemorySource, Record, record::Body};
use crate::reader::{RecordKind, TraceReader};
use crate::token_logit::TokenText;
use crate::writer::TraceWriter;

/// A pattern recognised inside strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pattern {
    /// `local@domain.tld`.
    Email,
    /// 7 to 15 digits, optionally with a leading `+` and ` -.()` between
    /// groups; without separators at least 10 digits (so ids and counts stay).
    Phone,
}

impl Pattern {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "email" => Some(Self::Email),
            "phone" => Some(Self::Phone),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RedactError {
    #[error(transparent)]
    Read(#[from] TraceError),
    #[error("{file}: cannot write the redacted trace: {cause}")]
    Write { file: String, cause: std::io::Error },
    #[error("{file}: the {count} PII values found are too many to search for: {cause}")]
    TooManyValues { file: String, count: usize, cause: aho_corasick::BuildError },
    #[error(
        "{file}: changed while being redacted (is a writer still appending to it?): first read {first}, then {second}"
    )]
    Changed { file: String, first: String, second: String },
}

/// What to replace, and the salt of this run.
#[derive(Debug, Clone)]
pub struct Redactor {
    pii_fields: BTreeSet<String>,
    patterns: Vec<Pattern>,
    salt: Vec<u8>,
    /// For the trace being redacted: the PII field values found in it,
    /// replaced by their tokens wherever they recur in text.
    known: Known,
    /// For the trace being redacted: every memory key and its name in the
    /// copy (see [`distinct_names`]).
    memory_keys: BTreeMap<String, String>,
    /// Whether a cleanly truncated trace (a killed writer's) is redacted
    /// into a copy cut off the same way ([`Redactor::allowing_truncated`]).
    allow_truncated: bool,
}

/// The PII values of one trace and their tokens. One automaton finds all of
/// them in a string in a single pass (leftmost-longest: of two values that
/// start at one place the longer is replaced), so the cost per string does
/// not grow with the number of values, and a token put in is never searched
/// again.
#[derive(Debug, Clone, Default)]
struct Known {
    /// `None` when the trace holds no value worth searching for.
    matcher: Option<AhoCorasick>,
    /// The token of each value, by the automaton's pattern id.
    tokens: Vec<String>,
    /// By pattern id: whether the value is made only of hex digits (an
    /// account number, a customer id), so it is replaced only where it
    /// stands alone, not inside a longer number or a word.
    whole_only: Vec<bool>,
}

/// How much one trace's redaction replaced.
#[derive(Debug, Clone, Default)]
pub struct RedactStats {
    pub records: u64,
    /// Values (fields, memory values, pattern matches) replaced, and keys renamed.
    pub replaced: u64,
    /// The PII fields that occur in the trace (as a JSON key or a memory
    /// key), so a field found in no trace (misspelt?) can be pointed out.
    pub fields_found: BTreeSet<String>,
    /// The input's truncation, when it was a cleanly truncated trace
    /// redacted under [`Redactor::allowing_truncated`]: the copy holds the
    /// records recovered and is cut off after them (no index; an episode
    /// end only when the input's was read, see [`RedactStats::kept_end`]).
    pub truncated: Option<TraceError>,
    /// Whether the copy holds an episode end (a truncated input's cut came
    /// after its end record, in the index or trailer).
    pub kept_end: bool,
    /// The input's episode id, and the copy's ([`Redactor::redact`] redacts
    /// it as free text): outputs named after the id are named after the
    /// copy's, so the file name does not give away what the header hides.
    pub episode_id: (String, String),
}

/// What the first pass over a trace finds: PII values and the fields holding them.
#[derive(Default)]
struct Found {
    values: BTreeSet<String>,
    fields: BTreeSet<String>,
    memory_keys: BTreeSet<String>,
}

impl Redactor {
    pub fn new(pii_fields: impl IntoIterator<Item = String>, mut patterns: Vec<Pattern>, salt: Vec<u8>) -> Self {
        // E-mail first: an address's digits are not a phone number.
        patterns.sort();
        patterns.dedup();
        Self {
            pii_fields: pii_fields.into_iter().collect(),
            patterns,
            salt,
            known: Known::default(),
            memory_keys: BTreeMap::new(),
            allow_truncated: false,
        }
    }

    /// Also redacts a cleanly truncated trace (what a killed writer leaves):
    /// its records are copied, redacted, and the copy is cut off after them,
    /// so it reads as truncated too. Other damage is still an error.
    pub fn allowing_truncated(mut self, allow: bool) -> Self {
        self.allow_truncated = allow;
        self
    }

    /// What a pass over the input that ended on `damage` (the error its
    /// reader gave last, after which it gives nothing) leaves to do: `None`
    /// for a complete trace, the truncation when a clean one is allowed, else the error.
    fn damage_allowed(&self, damage: Option<TraceError>) -> Result<Option<TraceError>, TraceError> {
        match damage {
            Some(e @ TraceError::Truncated { .. }) if self.allow_truncated => Ok(Some(e)),
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// A random salt (from the operating system), for runs that do not give one.
    pub fn random_salt() -> Vec<u8> {
        let mut salt = vec![0u8; 16];
        let filled = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut salt)).is_ok();
        if !filled {
            // No /dev/urandom: the process's randomly keyed hasher and the clock.
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
            );
            salt[..8].copy_from_slice(&h.finish().to_le_bytes());
        }
        salt
    }

    /// The token that replaces `text`.
    pub fn token(&self, text: &str) -> String {
        let mut h = Sha256::new();
        h.update(&self.salt);
        h.update([0u8]);
        h.update(text.as_bytes());
        format!("redacted:{}", &hex::encode(h.finalize())[..16])
    }

    /// The token of a PII field's whole value (see [`keeps_as_is`] for
    /// those kept).
    fn token_of_value(&self, value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.token(s)),
            other => Value::String(self.token(&canonical_json(other))),
        }
    }

    /// Replaces the trace's known PII values, then pattern matches, in free text.
    /// [`Self::text`] for a token's inline text.
    fn token_text(&self, token: &mut TokenText, n: &mut u64) {
        let mut text = token.to_string();
        self.text(&mut text, n);
        if text != *token {
            *token = text.into();
        }
    }

    fn text(&self, s: &mut String, n: &mut u64) {
        if let Some(matcher) = &self.known.matcher {
            let tokens = token_spans(s);
            let alone = |r: &Range<usize>| {
                let b = s.as_bytes();
                let before = r.start.checked_sub(1).and_then(|i| b.get(i));
                !before.is_some_and(u8::is_ascii_alphanumeric) && !b.get(r.end).is_some_and(u8::is_ascii_alphanumeric)
            };
            let spans: Vec<(Range<usize>, &str)> = matcher
                .find_iter(s.as_str())
                .filter(|m| !tokens.iter().any(|t| t.start < m.end() && m.start() < t.end))
                .filter(|m| !self.known.whole_only[m.pattern()] || alone(&m.range()))
                .map(|m| (m.range(), self.known.tokens[m.pattern()].as_str()))
                .collect();
            *n += splice(s, spans);
        }
        for &p in &self.patterns {
            let spans = match p {
                Pattern::Email => email_spans(s),
                Pattern::Phone => phone_spans(s),
            };
            let spans: Vec<(Range<usize>, String)> =
                spans.into_iter().map(|(a, b)| (a..b, self.token(&s[a..b]))).collect();
            *n += splice(s, spans);
        }
    }

    fn json(&self, v: &mut Value, n: &mut u64) {
        match v {
            Value::Object(map) => {
                for (k, val) in map.iter_mut() {
                    if self.pii_fields.contains(k) && !keeps_as_is(val) {
                        *val = self.token_of_value(val);
                        *n += 1;
                    } else {
                        self.json(val, n);
                    }
                }
                self.object_keys(map, n);
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.json(item, n)),
            Value::String(s) => {
                // JSON inside a string (a tool call's "arguments"): redact inside it.
                let trimmed = s.trim_start();
                if (trimmed.starts_with('{') || trimmed.starts_with('['))
                    && let Ok(mut inner) = serde_json::from_str::<Value>(s)
                {
                    let before = *n;
                    self.json(&mut inner, n);
                    if *n != before {
                        *s = canonical_json(&inner);
                    }
                    return;
                }
                self.text(s, n);
            }
            _ => {}
        }
    }

    /// A key with the trace's known PII values and pattern matches replaced.
    fn redacted_key(&self, key: &str) -> String {
        let mut text = key.to_string();
        self.text(&mut text, &mut 0);
        text
    }

    /// Redacts an object's keys (its values are done), keeping them apart.
    fn object_keys(&self, map: &mut serde_json::Map<String, Value>, n: &mut u64) {
        let keys: Vec<(String, String)> = map.keys().map(|k| (k.clone(), self.redacted_key(k))).collect();
        if keys.iter().all(|(key, redacted)| key == redacted) {
            return;
        }
        let names = distinct_names(&keys);
        for ((key, value), name) in std::mem::take(map).into_iter().zip(names) {
            if key != name {
                *n += 1;
            }
            map.insert(name, value);
        }
    }

    /// The name of memory key `key` in the copy.
    fn memory_key(&self, key: &str, n: &mut u64) -> String {
        let name = match self.memory_keys.get(key) {
            Some(name) => name.clone(),
            // Not seen by the first pass: the trace changed between passes.
            None => self.redacted_key(key),
        };
        if name != key {
            *n += 1;
        }
        name
    }

    /// Memory key -> canonical JSON (a snapshot, an error's memory, refused
    /// writes): values redacted as their key's, keys renamed as in deltas.
    fn memory_entries(&self, entries: &mut BTreeMap<String, String>, n: &mut u64) {
        for (key, mut value) in std::mem::take(entries) {
            self.memory_value(&key, &mut value, n);
            entries.insert(self.memory_key(&key, n), value);
        }
    }

    /// Redacts JSON text; text that is not JSON is treated as free text.
    /// Unchanged text is returned as it was (not re-serialised).
    fn json_text(&self, text: &mut String, n: &mut u64) {
        if text.is_empty() {
            return;
        }
        match serde_json::from_str::<Value>(text) {
            Ok(mut value) => {
                let before = *n;
                self.json(&mut value, n);
                if *n != before {
                    *text = canonical_json(&value);
                }
            }
            Err(_) => self.text(text, n),
        }
    }

    /// A memory value (canonical JSON) of `key`: all of it when the key is a PII field.
    fn memory_value(&self, key: &str, text: &mut String, n: &mut u64) {
        if self.pii_fields.contains(key) {
            if serde_json::from_str::<Value>(text).is_ok_and(|value| keeps_as_is(&value)) {
                return;
            }
            if let Ok(value) = serde_json::from_str::<Value>(text) {
                *text = canonical_json(&self.token_of_value(&value));
            } else {
                *text = canonical_json(&Value::String(self.token(text)));
            }
            *n += 1;
        } else {
            self.json_text(text, n);
        }
    }

    /// Redacts one trace into `out`, reading it twice through `open` (which
    /// gives a reader of the same trace each time): the first pass collects
    /// the PII values it holds, so that where they recur in free text (a
    /// final answer quoting an order id) they are replaced too; the second
    /// writes the copy one step at a time, so memory stays that of one step
    /// however long the episode. A damaged input is an error (naming file
    /// and offset), found in the first pass, before anything is written;
    /// a cleanly truncated one too unless [`Redactor::allowing_truncated`].
    pub fn redact<R: Read, W: Write>(
        &self,
        mut open: impl FnMut() -> Result<TraceReader<R>, TraceError>,
        out: W,
        out_name: &str,
    ) -> Result<RedactStats, RedactError> {
        let write_err = |cause| RedactError::Write { file: out_name.to_string(), cause };
        // Token logits and rewards hold no PII field: not even decoded here.
        let mut reader = open()?.without(&[RecordKind::TokenLogit, RecordKind::RewardSignal]);
        let mut found = Found::default();
        let mut damage = None;
        for record in reader.by_ref() {
            match record {
                Ok(record) => self.find_pii(&record, &mut found),
                Err(e) => damage = Some(e),
            }
        }
        let truncated = self.damage_allowed(damage)?;
        let mut this = self.clone();
        let count = found.values.len();
        this.known = self.known_values(found.values).map_err(|cause| RedactError::TooManyValues {
            file: reader.file_name().to_string(),
            count,
            cause,
        })?;
        let keys: Vec<(String, String)> = std::mem::take(&mut found.memory_keys)
            .into_iter()
            .map(|key| {
                let redacted = this.redacted_key(&key);
                (key, redacted)
            })
            .collect();
        this.memory_keys = keys.iter().map(|(key, _)| key.clone()).zip(distinct_names(&keys)).collect();

        let mut reader = open()?;
        let mut header = reader.header().clone();
        let original_id = header.episode_id.clone();
        // The row id is often the episode id, or the id a user was given
        // (an email address): redacted by the same rules.
        this.text(&mut header.episode_id, &mut 0);
        this.text(&mut header.row_id, &mut 0);
        let episode_id = (original_id, header.episode_id.clone());
        let mut writer = TraceWriter::new(out, header, crate::writer::DEFAULT_ZSTD_LEVEL).map_err(write_err)?;
        let mut state = MemoryMap::new();
        let mut stats = RedactStats { fields_found: found.fields, episode_id, ..RedactStats::default() };
        let mut step_records: Vec<Record> = Vec::new();
        let mut end: Option<pb::EpisodeEnd> = None;
        let mut end_step = 0;
        let mut damage = None;
        for record in reader.by_ref() {
            let record = match record {
                Ok(record) => record,
                Err(e) => {
                    damage = Some(e);
                    continue;
                }
            };
            if let Some(Body::EpisodeEnd(e)) = record.body {
                end = Some(e);
                end_step = record.step;
                continue;
            }
            if step_records.first().is_some_and(|r| r.step != record.step) {
                this.flush_step(&mut step_records, &mut state, &mut stats, &mut writer).map_err(write_err)?;
            }
            step_records.push(record);
        }
        // Damaged now but not in the first pass, or cut off elsewhere: the
        // file changed in between (a writer still appending to it), and
        // records the first pass did not search for PII values may follow.
        let truncated_now = self.damage_allowed(damage)?;
        let said = |cut: &Option<TraceError>| cut.as_ref().map_or_else(|| "complete".to_string(), |e| e.to_string());
        if said(&truncated_now) != said(&truncated) {
            return Err(RedactError::Changed {
                file: reader.file_name().to_string(),
                first: said(&truncated),
                second: said(&truncated_now),
            });
        }
        this.flush_step(&mut step_records, &mut state, &mut stats, &mut writer).map_err(write_err)?;
        let end = end.map(|mut end| {
            end.final_memory_hash = state.map(&end.final_memory_hash);
            this.text(&mut end.final_answer, &mut stats.replaced);
            end
        });
        match (truncated, end) {
            (None, end) => writer.finish(end.unwrap_or_default()).map_err(write_err)?,
            (Some(cut), end) => {
                // An end record read before the cut (the index was lost) is kept, still without an index.
                if let Some(end) = end {
                    writer.append(end_step, Body::EpisodeEnd(end)).map_err(write_err)?;
                    stats.kept_end = true;
                }
                stats.truncated = Some(cut);
                writer.finish_truncated().map_err(write_err)?
            }
        };
        Ok(stats)
    }

    /// Adds the string values of PII fields and memory keys in `record`,
    /// and the PII fields that occur, to `found`.
    fn find_pii(&self, record: &Record, found: &mut Found) {
        let from_text = |text: &str, found: &mut Found| {
            if let Ok(value) = serde_json::from_str::<Value>(text) {
                self.collect_pii(&value, false, found);
            }
        };
        // Memory key -> canonical JSON: a PII key's whole value is PII.
        let from_entries = |entries: &BTreeMap<String, String>, found: &mut Found| {
            for (k, v) in entries {
                found.note_field(self, k);
                found.memory_keys.insert(k.clone());
                if let Ok(value) = serde_json::from_str::<Value>(v) {
                    self.collect_pii(&value, self.pii_fields.contains(k), found);
                }
            }
        };
        match &record.body {
            Some(Body::MemoryDelta(d)) => {
                found.note_field(self, &d.key);
                found.memory_keys.insert(d.key.clone());
                for text in [&d.before_json, &d.after_json].into_iter().flatten() {
                    if self.pii_fields.contains(&d.key) {
                        if let Ok(value) = serde_json::from_str::<Value>(text) {
                            self.collect_pii(&value, true, found);
                        }
                    } else {
                        from_text(text, found);
                    }
                }
            }
            Some(Body::MemorySnapshot(s)) => from_entries(&s.entries_json, found),
            Some(Body::PlanStep(p)) => {
                from_text(&p.arguments_json, found);
                from_text(&p.observation_json, found);
                from_entries(&p.refused_memory_json, found);
            }
            Some(Body::PolicyTurn(t)) => from_text(&t.tool_calls_json, found),
            Some(Body::ErrorContext(e)) => {
                from_entries(&e.memory_snapshot_json, found);
                for p in &e.last_tool_payloads {
                    from_text(&p.arguments_json, found);
                    from_text(&p.response_json, found);
                }
            }
            Some(Body::Injection(i)) => from_text(&i.observation_json, found),
            _ => {}
        }
    }

    /// PII values with their tokens. Values shorter than 4 characters are
    /// left to the field and pattern rules; a value made only of hex digits
    /// (`48213977`) is searched for as a whole number or word only, and
    /// never inside a token the text already holds.
    fn known_values(&self, values: BTreeSet<String>) -> Result<Known, aho_corasick::BuildError> {
        let values: Vec<String> = values.into_iter().filter(|v| v.chars().count() >= 4 && !is_token(v)).collect();
        if values.is_empty() {
            return Ok(Known::default());
        }
        let matcher = AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(&values)?;
        Ok(Known {
            matcher: Some(matcher),
            tokens: values.iter().map(|v| self.token(v)).collect(),
            whole_only: values.iter().map(|v| v.bytes().all(|c| c.is_ascii_hexdigit())).collect(),
        })
    }

    /// Collects string leaves that are PII: everything under a PII field
    /// (`inside`), at any depth, including JSON nested in strings.
    fn collect_pii(&self, value: &Value, inside: bool, found: &mut Found) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    found.note_field(self, k);
                    self.collect_pii(v, inside || self.pii_fields.contains(k), found);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| self.collect_pii(v, inside, found)),
            Value::String(s) => {
                let trimmed = s.trim_start();
                if (trimmed.starts_with('{') || trimmed.starts_with('['))
                    && let Ok(inner) = serde_json::from_str::<Value>(s)
                {
                    self.collect_pii(&inner, inside, found);
                } else if inside {
                    found.values.insert(s.clone());
                }
            }
            Value::Number(n) if inside => {
                found.values.insert(n.to_string());
            }
            _ => {}
        }
    }

    fn flush_step<W: Write>(
        &self,
        records: &mut Vec<Record>,
        state: &mut MemoryMap,
        stats: &mut RedactStats,
        writer: &mut TraceWriter<W>,
    ) -> std::io::Result<()> {
        // (index in `records`, original memory_hash_after) of the plan step whose deltas follow.
        let mut pending_after: Option<(usize, Vec<u8>)> = None;
        let n = &mut stats.replaced;
        for i in 0..records.len() {
            if matches!(records[i].body, Some(Body::PlanStep(_)))
                && let Some((at, after)) = pending_after.take()
            {
                set_after(&mut records[at], state.map(&after));
            }
            match records[i].body.as_mut() {
                Some(Body::PlanStep(p)) => {
                    self.plan_step(p, n);
                    p.memory_hash_before = state.map(&p.memory_hash_before);
                    pending_after = Some((i, std::mem::take(&mut p.memory_hash_after)));
                }
                Some(Body::MemoryDelta(d)) => {
                    let original = d.clone();
                    for text in [&mut d.before_json, &mut d.after_json].into_iter().flatten() {
                        self.memory_value(&original.key, text, n);
                    }
                    d.key = self.memory_key(&original.key, n);
                    state.apply(&original, d);
                }
                Some(Body::MemorySnapshot(s)) => {
                    self.memory_entries(&mut s.entries_json, n);
                    let entries: serde_json::Map<String, Value> = s
                        .entries_json
                        .iter()
                        .map(|(k, v)| (k.clone(), serde_json::from_str(v).unwrap_or(Value::String(v.clone()))))
                        .collect();
                    s.memory_hash = Memory::from_object(&entries).hash().0.to_vec();
                }
                Some(Body::TokenLogit(t)) => {
                    self.token_text(&mut t.token, n);
                    t.top_tokens.iter_mut().for_each(|s| self.token_text(s, n));
                }
                Some(Body::PolicyTurn(t)) => {
                    self.text(&mut t.content, n);
                    self.json_text(&mut t.tool_calls_json, n);
                }
                Some(Body::ErrorContext(e)) => {
                    self.text(&mut e.message, n);
                    self.text(&mut e.stack, n);
                    e.cause_chain.iter_mut().for_each(|s| self.text(s, n));
                    self.memory_entries(&mut e.memory_snapshot_json, n);
                    for payload in &mut e.last_tool_payloads {
                        self.json_text(&mut payload.arguments_json, n);
                        self.json_text(&mut payload.response_json, n);
                    }
                }
                Some(Body::Injection(inj)) => {
                    self.json_text(&mut inj.observation_json, n);
                    self.text(&mut inj.description, n);
                }
                Some(Body::RewardSignal(_) | Body::Header(_) | Body::EpisodeEnd(_)) | None => {}
            }
        }
        if let Some((at, after)) = pending_after.take() {
            set_after(&mut records[at], state.map(&after));
        }
        for record in records.drain(..) {
            stats.records += 1;
            writer.write_record(&record)?;
        }
        writer.end_step()
    }

    fn plan_step(&self, p: &mut pb::PlanStep, n: &mut u64) {
        let before = *n;
        self.json_text(&mut p.arguments_json, n);
        let args_changed = *n != before;
        let mid = *n;
        self.json_text(&mut p.observation_json, n);
        let observation_changed = *n != mid;
        self.text(&mut p.error_message, n);
        self.memory_entries(&mut p.refused_memory_json, n);
        let rehash = |text: &str, stored: &mut Vec<u8>| {
            if let Ok(value) = serde_json::from_str::<Value>(text)
                && !stored.is_empty()
            {
                *stored = hash_json(&value).0.to_vec();
            }
        };
        if args_changed {
            rehash(&p.arguments_json, &mut p.input_hash);
        }
        if observation_changed {
            rehash(&p.observation_json, &mut p.result_hash);
            p.response_bytes = p.observation_json.len() as u64;
        }
    }
}

/// A PII field's value that is kept as it is: `null` and booleans, which
/// can hold no personal data (a search for `shipping_status == null` finds
/// the same steps in the copy), and a token already (a redacted trace
/// redacted again).
fn keeps_as_is(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(_) => true,
        Value::String(s) => is_token(s),
        _ => false,
    }
}

/// Where `text` holds tokens ([`is_token`]).
fn token_spans(text: &str) -> Vec<Range<usize>> {
    const TOKEN_LEN: usize = "redacted:".len() + 16;
    text.match_indices("redacted:")
        .map(|(at, _)| at..at + TOKEN_LEN)
        .filter(|span| text.get(span.clone()).is_some_and(is_token))
        .collect()
}

/// Replaces each range of `s` (in order, not overlapping) by its text;
/// returns how many were replaced.
fn splice<T: AsRef<str>>(s: &mut String, spans: Vec<(Range<usize>, T)>) -> u64 {
    if spans.is_empty() {
        return 0;
    }
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for (range, text) in &spans {
        out.push_str(&s[last..range.start]);
        out.push_str(text.as_ref());
        last = range.end;
    }
    out.push_str(&s[last..]);
    *s = out;
    spans.len() as u64
}

/// Names for keys after redaction (`(key, redacted text)`, in key order),
/// one each: a key redaction leaves alone keeps its name; a redacted key
/// whose text is already a name gets `#2`, `#3`, ..., so two keys never
/// become one, and the same keys always get the same names.
fn distinct_names(keys: &[(String, String)]) -> Vec<String> {
    let mut taken: HashSet<String> =
        keys.iter().filter(|(key, redacted)| key == redacted).map(|(key, _)| key.clone()).collect();
    keys.iter()
        .map(|(key, redacted)| {
            if key == redacted {
                return key.clone();
            }
            let mut name = redacted.clone();
            let mut suffix = 2;
            while taken.contains(&name) {
                name = format!("{redacted}#{suffix}");
                suffix += 1;
            }
            taken.insert(name.clone());
            name
        })
        .collect()
}

/// A token [`Redactor::token`] makes: `redacted:` and 16 hex digits.
fn is_token(text: &str) -> bool {
    text.strip_prefix("redacted:").is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|c| c.is_ascii_hexdigit()))
}

impl Found {
    fn note_field(&mut self, redactor: &Redactor, key: &str) {
        if redactor.pii_fields.contains(key) {
            self.fields.insert(key.to_string());
        }
    }
}

fn set_after(record: &mut Record, hash: Vec<u8>) {
    if let Some(Body::PlanStep(p)) = record.body.as_mut() {
        p.memory_hash_after = hash;
    }
}

/// Memory replayed twice, from the original and from the redacted deltas,
/// and the map from each state's original hash to its redacted hash.
struct MemoryMap {
    original: Memory,
    redacted: Memory,
    hashes: HashMap<Vec<u8>, Vec<u8>>,
}

impl MemoryMap {
    fn new() -> Self {
        let mut original = Memory::new();
        let mut redacted = Memory::new();
        let mut hashes = HashMap::new();
        hashes.insert(original.hash().0.to_vec(), redacted.hash().0.to_vec());
        Self { original, redacted, hashes }
    }

    fn apply(&mut self, original: &pb::MemoryDelta, redacted: &pb::MemoryDelta) {
        fn patch(d: &pb::MemoryDelta) -> MemoryPatch {
            match d.after_json.as_deref().map(|t| serde_json::from_str::<Value>(t).unwrap_or(Value::String(t.into()))) {
                Some(value) => MemoryPatch::default().set(d.key.clone(), value),
                None => MemoryPatch::default().remove(d.key.clone()),
            }
        }
        self.original.apply(&patch(original), MemorySource::Tool, "");
        self.redacted.apply(&patch(redacted), MemorySource::Tool, "");
        self.hashes.insert(self.original.hash().0.to_vec(), self.redacted.hash().0.to_vec());
    }

    /// The redacted hash of the state `original` names; an unknown state
    /// (memory changed without a delta) gets the current redacted hash, so
    /// no hash of unredacted memory is ever written.
    fn map(&mut self, original: &[u8]) -> Vec<u8> {
        if original.is_empty() {
            return Vec::new();
        }
        match self.hashes.get(original) {
            Some(h) => h.clone(),
            None => self.redacted.hash().0.to_vec(),
        }
    }
}

/// Byte spans of e-mail addresses.
fn email_spans(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let local = |c: u8| c.is_ascii_alphanumeric() || b"._%+-".contains(&c);
    let domain = |c: u8| c.is_ascii_alphanumeric() || c == b'.' || c == b'-';
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (at, _) in s.match_indices('@') {
        let mut start = at;
        while start > 0 && local(b[start - 1]) {
            start -= 1;
        }
        let mut end = at + 1;
        while end < b.len() && domain(b[end]) {
            end += 1;
        }
        while end > at + 1 && (b[end - 1] == b'.' || b[end - 1] == b'-') {
            end -= 1;
        }
        let host = &s[at + 1..end];
        let tld_ok = host.rsplit_once('.').is_some_and(|(name, tld)| {
            !name.is_empty() && tld.len() >= 2 && tld.bytes().all(|c| c.is_ascii_alphabetic())
        });
        if start < at && tld_ok && out.last().is_none_or(|&(_, e)| e <= start) {
            out.push((start, end));
        }
    }
    out
}

/// Byte spans of phone numbers (see [`Pattern::Phone`]).
fn phone_spans(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = b[i].is_ascii_digit()
            || ((b[i] == b'+' || b[i] == b'(') && b.get(i + 1).is_some_and(|c| c.is_ascii_digit()));
        let boundary = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.' || b[i - 1] == b'_');
        if !(starts && boundary) {
            i += 1;
            continue;
        }
        let (mut j, mut digits, mut separators, mut last_digit_end) = (i, 0usize, 0usize, i);
        while j < b.len() {
            let c = b[j];
            if c.is_ascii_digit() {
                digits += 1;
                last_digit_end = j + 1;
            } else if b" -.()".contains(&c) || (c == b'+' && j == i) {
                if j > i && !(b[j - 1].is_ascii_digit() || b" -.()+".contains(&b[j - 1])) {
                    break;
                }
                if c != b'+' {
                    separators += 1;
                }
            } else {
                break;
            }
            j += 1;
        }
        let end = last_digit_end;
        let glued = end < b.len() && (b[end].is_ascii_alphabetic() || b[end] == b'_');
        let ok = (7..=15).contains(&digits)
            && (separators > 0 || digits >= 10 || b[i] == b'+')
            && !glued
            && !looks_like_date(&s[i..end]);
        if ok {
            out.push((i, end));
            i = end;
        } else {
            i = j.max(i + 1);
        }
    }
    out
}

/// `2026-12-03`, `03/12/2026`, `3.12.26`: three digit groups shaped like a date.
fn looks_like_date(s: &str) -> bool {
    let parts: Vec<&str> = s.split(['-', '/', '.']).collect();
    if parts.len() != 3 || !parts.iter().all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit())) {
        return false;
    }
    let len: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    matches!(len.as_slice(), [4, 1..=2, 1..=2] | [1..=2, 1..=2, 2] | [1..=2, 1..=2, 4])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_are_found_with_their_exact_spans() {
        let s = "write to jane.doe+x@mail.example.com, or bob@example.org. Not a@b or @x.io";
        let found: Vec<&str> = email_spans(s).into_iter().map(|(a, b)| &s[a..b]).collect();
        assert_eq!(found, ["jane.doe+x@mail.example.com", "bob@example.org"]);
    }

    #[test]
    fn phones_are_found_and_ids_and_decimals_are_not() {
        let s = "call +1 415-555-0134 or (415) 555.0199 or 4155550123; order A-1037, 3.14159, 1234567, 2026, eta 2026-12-03 or 03/12/2026";
        let found: Vec<&str> = phone_spans(s).into_iter().map(|(a, b)| &s[a..b]).collect();
        assert_eq!(found, ["+1 415-555-0134", "(415) 555.0199", "4155550123"]);
    }

    #[test]
    fn json_fields_nested_json_and_patterns_are_replaced_deterministically() {
        let r = Redactor::new(["user_phone".to_string()], vec![Pattern::Email], b"salt".to_vec());
        let mut text =
            r#"{"args":"{\"user_phone\":\"555\"}","note":"mail a@example.com","user_phone":{"n":1}}"#.to_string();
        let mut n = 0;
        r.json_text(&mut text, &mut n);
        assert_eq!(n, 3);
        let v: Value = serde_json::from_str(&text).unwrap();
        let inner: Value = serde_json::from_str(v["args"].as_str().unwrap()).unwrap();
        assert_eq!(inner["user_phone"], Value::String(r.token("555")));
        assert_eq!(v["note"], Value::String(format!("mail {}", r.token("a@example.com"))));
        assert_eq!(v["user_phone"], Value::String(r.token(r#"{"n":1}"#)));
        assert_ne!(r.token("555"), Redactor::new([], vec![], b"other".to_vec()).token("555"));
    }

    /// Known values are replaced in one pass: the longer of two that start
    /// at one place wins, and a value that occurs inside a token put in for
    /// another (`redacted`, say a user's address) does not rewrite it. One
    /// value after another (the earlier way) turned `ORD-1000-B` into a
    /// token with a token inside.
    #[test]
    fn known_values_are_replaced_in_one_pass_and_tokens_stay_whole() {
        let mut r = Redactor::new(["order_id".to_string()], vec![], b"salt".to_vec());
        let values = ["ORD-1000", "ORD-1000-B", "redacted", "abc"].map(String::from).into_iter().collect();
        r.known = r.known_values(values).unwrap();
        let mut text = "ORD-1000-B and ORD-1000, marked redacted; abc stays (too short)".to_string();
        let mut n = 0;
        r.text(&mut text, &mut n);
        assert_eq!(n, 3);
        let [long, short, word] = ["ORD-1000-B", "ORD-1000", "redacted"].map(|v| r.token(v));
        assert_eq!(text, format!("{long} and {short}, marked {word}; abc stays (too short)"));
    }
}
