//! The trace query language of `basecamp trace search`.
//!
//! ```text
//! memory_state.shipping_status == null
//! plan_execution.tool == "tracking_api" and latency_ms > 800
//! exists(error_context) and not plan_execution.status == "ok"
//! reward_signal.efficiency_penalty < -0.1 or (step >= 40 and episode.variant == "b")
//! ```
//!
//! **Unit.** A query is evaluated once per *step* of each episode (the
//! records sharing a `Record.step`; step 0 holds the initial memory). A
//! matching step is reported with its episode, step, file and the byte
//! offset of the frame holding the first record that satisfied a condition
//! (or the step's first frame when the match rests only on `not` or on
//! episode/step facts).
//!
//! **Conditions.** `PATH OP LITERAL` with `==`, `!=`, `<`, `<=`, `>`, `>=`;
//! literals are `"strings"` (or `'strings'`), numbers, `true`, `false`,
//! `null`. `exists(PATH)` holds when some record of the step has PATH with a
//! value (for scalar fields: not the proto default — a non-empty string, a
//! non-zero number, `true`; `token_logit.entropy` and `kl` whenever they
//! were recorded, 0 included; a JSON path whenever the JSON has it, 0, `""`,
//! `false` and `null` included); `exists(SECTION)` when the step has a record of
//! that section; `exists(memory_state.KEY)` when the step changed KEY (a
//! removal included). Combine with `and` (`&&`), `or` (`||`), `not` (`!`) and
//! parentheses; `not` binds tightest, then `and`, then `or`. Keywords are
//! written in lower case or in capitals (`AND`, `EXISTS`, `NULL`).
//!
//! **One record at a time.** A sub-expression whose comparisons all read the
//! same section (and for `memory_state`, the same key) is checked against
//! each record of that section alone: `plan_execution.tool == "a" and
//! latency_ms > 800` needs one tool call that is both, and `not
//! plan_execution.status == "ok"` means some call whose status is not ok.
//! Conditions on different sections combine per step, and `exists(...)` is
//! always a fact of the step, so `not exists(error_context)` is a step
//! without an error context.
//!
//! **Comparison.** Equality across types is false (`!=` true); `<`, `<=`,
//! `>`, `>=` hold only between two numbers or two strings (byte order).
//! Paths to scalar fields check the literal's type when the query is
//! compiled; enum fields compare by lower-case name (`"timeout"`; the proto
//! name `"STEP_STATUS_TIMEOUT"` is accepted too).
//!
//! **Paths** (against `proto/trace.proto`):
//!
//! | path | value |
//! | --- | --- |
//! | `memory_state.KEY` | the JSON value a `MemoryDelta` of KEY wrote (`after_json`); a delta that removed KEY has no value; `memory_state.KEY.a.0` navigates into it |
//! | `plan_execution.F` (or bare `F`) | a `PlanStep` field: `index`, `kind` (`tool_call`, `final_answer`, `policy_error`), `plan_label`, `tool`, `call_id`, `arguments[.path]` and `observation[.path]` (JSON), `input_hash`, `result_hash`, `memory_hash_before`, `memory_hash_after` (hex: all 64 digits, or a prefix of 8 or more, such as the 12 `trace validate` and the reports print, which matches every hash starting with it (`==` and `!=` only); or the base64 `trace parse` prints), `response_bytes`, `status` (`ok`, `error`, `timeout`, `fallback`, `rolled_back`, `refused`), `error_type`, `error_message`, `fallback_used`, `start_unix_nanos`, `latency_ms` (latency_micros / 1000), `latency_us`, `timeout_ms` |
//! | `reward_signal.NAME` | the raw `score` of component NAME (`.score`, `.weight` explicitly); `reward_signal.weighted_sum` the weighted sum |
//! | `error_context.F` | `error_type`, `message`, `stack`, `cause` (any entry of the cause chain), `tool` (any of the last tool payloads), `memory.KEY[.path]` (the snapshot's JSON value) |
//! | `token_logit.F` | `position`, `token_id`, `token`, `logprob` of the generated token; `entropy` and `kl` (nats) where the record was derived from raw logits (absent otherwise) |
//! | `policy_turn.F` | `model`, `content`, `tool_calls[.path]` (JSON), `finish_reason`, `latency_ms`, `prompt_tokens`, `completion_tokens`, `logprobs_missing` |
//! | `injection.F` | `id`, `trigger` (`at_step`, `after_tool`, `memory_match`, `live`), `observation[.path]`, `description` |
//! | `episode_end.F` | how the episode ended (a record of its last step, absent from a trace cut off before its end): `outcome` (`completed`, `max_steps`, `error`, `cancelled`), `failure_class` (as `summary.json` classes it: `ok`, `wrong_tool_calls`, `memory_mismatch`, an error type such as `timeout`, or the infrastructure's `policy_error`, `service_exited`), `final_answer`, `steps`, `final_memory_hash` (a hash, as the plan step's), `end_time_unix_nanos` |
//! | `episode.F` | header facts: `id`, `task`, `variant`, `namespace`, `shard`, `shard_count`, `training_step`, `config_hash` (a hash, as the plan step's) |
//! | `step` | the step number |
//!
//! Names may contain letters, digits, `_` and `-`; quote any other segment
//! (`memory_state."user.phone"`). A query that does not compile is a
//! [`QueryError`] that shows the query with a caret under the problem.
//!
//! **Speed.** Evaluation runs on [`crate::RawRecord`]s: only the record
//! kinds the query names are looked at, and their fields are read straight
//! from the protobuf bytes ([`wire`]) without decoding whole messages.
//! Frames (of version-2 files) that hold none of those kinds and continue
//! a step already read are not even decompressed: a query that does not
//! name `token_logit` skips the token logits, most of a trace's bytes. Their
//! checksums are still verified, so damage is reported whatever the query.

mod eval;
mod fields;
mod lexer;
mod parser;
pub mod wire;

use std::fmt;
use std::io::Read;
use std::path::Path;

pub use eval::NamesSeen;
pub use fields::Section;
pub use parser::{Expr, Literal, Op};

use crate::error::TraceError;
use crate::reader::TraceReader;

/// A query that does not compile: the message, and where in the query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryError {
    pub query: String,
    /// Byte offset in `query` of the problem.
    pub at: usize,
    pub message: String,
}

impl QueryError {
    pub(crate) fn new(query: &str, at: usize, message: String) -> Self {
        Self { query: query.to_string(), at: at.min(query.len()), message }
    }

    /// The column the caret goes under, in terminal cells: a wide character
    /// (CJK, most emoji) takes two, a combining mark none.
    pub fn column(&self) -> usize {
        self.query[..self.at].chars().map(cell_width).sum()
    }
}

/// How a query character is shown on its one line: whitespace (a tab, a
/// newline) as a space, another control character as U+FFFD.
fn shown_char(c: char) -> char {
    if c.is_whitespace() {
        ' '
    } else if c.is_control() {
        char::REPLACEMENT_CHARACTER
    } else {
        c
    }
}

fn cell_width(c: char) -> usize {
    unicode_width::UnicodeWidthChar::width(shown_char(c)).unwrap_or(0)
}

impl fmt::Display for QueryError {
    /// `invalid query: MESSAGE`, then the query and a caret under the problem.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.query.chars().map(shown_char).collect();
        write!(f, "invalid query: {}\n  {}\n  {}^", self.message, shown, " ".repeat(self.column()))
    }
}

impl std::error::Error for QueryError {}

/// A matching step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub episode: String,
    pub step: u32,
    /// Byte offset of the frame holding the record that matched (see the module doc).
    pub offset: u64,
    /// The section of that record; `None` when the step matched without one.
    pub section: Option<Section>,
}

/// The matches in one file, the damage that ended its scan, if any, and
/// which of the query's names the file has.
#[derive(Debug)]
pub struct FileMatches {
    pub matches: Vec<Match>,
    pub error: Option<TraceError>,
    pub seen: NamesSeen,
}

/// A compiled query.
pub struct Query {
    text: String,
    program: eval::Program,
}

impl Query {
    pub fn parse(text: &str) -> Result<Self, QueryError> {
        let expr = parser::parse(text)?;
        let (step, groups) = eval::compile(text, expr)?;
        Ok(Self { text: text.to_string(), program: eval::Program::new(step, groups) })
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// The sections whose records the query reads (all others are skipped undecoded).
    pub fn sections(&self) -> Vec<Section> {
        let mut out: Vec<Section> = self.program.groups.iter().map(|g| g.section).collect();
        out.sort_by_key(|s| *s as u8);
        out.dedup();
        out
    }

    /// Runs the query over a reader positioned after the header. Sets the
    /// reader to skip frames the query cannot need ([`TraceReader::skip_frames_without`]).
    pub fn search<R: Read>(
        &self,
        reader: &mut TraceReader<R>,
        on_match: &mut dyn FnMut(Match),
    ) -> Result<(), TraceError> {
        self.program.run(reader, on_match, &mut NamesSeen::default())
    }

    /// [`Query::search`], noting in `seen` which of the memory keys and
    /// reward components the query names the trace has (for
    /// [`Query::unseen_names`]).
    pub fn search_noting<R: Read>(
        &self,
        reader: &mut TraceReader<R>,
        on_match: &mut dyn FnMut(Match),
        seen: &mut NamesSeen,
    ) -> Result<(), TraceError> {
        self.program.run(reader, on_match, seen)
    }

    /// Runs the query over one file, keeping the matches found before any damage.
    pub fn search_file(&self, path: &Path) -> FileMatches {
        self.search_opened(TraceReader::open(path))
    }

    /// Runs the query over a trace as it was opened (from a file, S3, ...):
    /// one that could not be opened has no matches and that error.
    pub fn search_opened<R: Read>(&self, opened: Result<TraceReader<R>, TraceError>) -> FileMatches {
        let mut matches = Vec::new();
        let mut seen = NamesSeen::default();
        let error = match opened {
            Ok(mut reader) => self.search_noting(&mut reader, &mut |m| matches.push(m), &mut seen).err(),
            Err(e) => Some(e),
        };
        FileMatches { matches, error, seen }
    }

    /// One line for each memory key (`memory_state.KEY`) and reward
    /// component (`reward_signal.NAME`) the query names that none of the
    /// searched traces has, listing the ones they have: such a query can
    /// only find what `not` or `!=` make of the absence, and a typo would
    /// otherwise look like "no matches".
    pub fn unseen_names(&self, seen: &NamesSeen) -> Vec<String> {
        self.program.unseen(seen)
    }
}

impl fmt::Debug for Query {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Query").field("text", &self.text).finish()
    }
}
