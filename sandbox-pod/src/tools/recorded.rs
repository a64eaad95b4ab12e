//! `recorded` tools: answers from a fixture instead of a live service, for
//! tests, demos and replay.
//!
//! A fixture is JSON Lines, one recorded call a line:
//!
//! ```json
//! {"tool": "tracking_api", "arguments": {"order_id": "A-1"}, "response": {"status": "in_transit"}}
//! {"tool": "tracking_api", "response": {"status": "delayed"}, "latency_ms": 1200}
//! {"tool": "refund", "error": "service unavailable"}
//! ```
//!
//! A call is answered by the first line for its tool whose `arguments` equal
//! the call's (compared as canonical JSON); lines without `arguments` are a
//! sequence, answering the other calls in file order. `latency_ms` delays
//! the answer (so a fixture can exercise timeouts), `timeout: true` never
//! answers, `error` makes the call fail.
//!
//! Each episode walks the sequence from its first line (the executor gives
//! every episode its own position, [`crate::executor::ToolExecutor::for_episode`]),
//! so concurrent episodes of a shard get the same answers in the same order.
//! A call past the last line fails with `no_recording`, naming the fixture
//! and how many answers it has, unless the tool cycles (`match: cycle`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use basecamp_trace::{Digest, hash_json};
use serde::Deserialize;
use serde_json::Value;

use super::{ToolError, ToolOutput};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recording {
    pub tool: String,
    #[serde(default)]
    pub arguments: Option<Value>,
    #[serde(default)]
    pub response: Value,
    /// How long the answer takes (`latency_ms` in JSON, fractional allowed).
    #[serde(default, rename = "latency_ms", deserialize_with = "basecamp_api::duration::fractional_millis")]
    pub latency: Duration,
    /// Never answers: the executor's timeout (or the plan step's) ends the call.
    #[serde(default)]
    pub timeout: bool,
    #[serde(default)]
    pub error: Option<String>,
    /// The recorded failure's type (one of [`super::TOOL_ERROR_TYPES`]);
    /// absent or unknown: `tool_error`.
    #[serde(default)]
    pub error_type: Option<String>,
}

/// One tool's lines of a fixture, shared by every episode.
#[derive(Debug, Default)]
struct Fixture {
    /// The lines, without their `arguments` (looked up by hash in `by_arguments`).
    entries: Vec<Recording>,
    /// The index in `entries` of the first line with each `arguments` (by
    /// canonical hash): a call finds its line at once, however long the fixture.
    by_arguments: HashMap<Digest, usize>,
    /// The indices in `entries` of the lines without `arguments`, in file order.
    sequence: Vec<usize>,
}

/// A fixture for one tool. Clones share the fixture and the position in its
/// sequence; [`RecordedTool::for_episode`] gives an episode a position of
/// its own.
#[derive(Debug, Clone)]
pub struct RecordedTool {
    fixture: Arc<Fixture>,
    /// The next sequence line to answer with, counted over this episode's calls.
    position: Arc<AtomicUsize>,
    /// Start the sequence again after its last line instead of failing.
    cycle: bool,
    /// The fixture's file, for error messages.
    source: Arc<str>,
}

/// A fixture line that could not be read, with its file and line.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct FixtureError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl RecordedTool {
    /// The recordings of `tool` among `recordings`. A call past the last
    /// line of the sequence fails; see [`Self::cycling`].
    pub fn new(tool: &str, recordings: impl IntoIterator<Item = Recording>) -> Self {
        let mut entries: Vec<Recording> = recordings.into_iter().filter(|r| r.tool == tool).collect();
        let mut by_arguments = HashMap::new();
        let mut sequence = Vec::new();
        for (i, recording) in entries.iter_mut().enumerate() {
            // Only their hash is looked up: the arguments are not kept (a
            // long fixture's argument maps were a tenth of a run's memory).
            match recording.arguments.take() {
                // The first line with these arguments answers; later ones never do.
                Some(arguments) => {
                    by_arguments.entry(hash_json(&arguments)).or_insert(i);
                }
                None => sequence.push(i),
            }
        }
        Self {
            fixture: Arc::new(Fixture { entries, by_arguments, sequence }),
            position: Arc::default(),
            cycle: false,
            source: Arc::from("the fixture"),
        }
    }

    /// Names the fixture's file in error messages.
    pub fn from_file(mut self, file: impl AsRef<str>) -> Self {
        self.source = Arc::from(format!("fixture {}", file.as_ref()));
        self
    }

    /// Starts the sequence again at its first line after the last (`match:
    /// cycle`), instead of failing the call.
    pub fn cycling(mut self) -> Self {
        self.cycle = true;
        self
    }

    /// The same fixture, its sequence starting at the first line, for one
    /// episode: other episodes' calls do not move its position.
    pub fn for_episode(&self) -> Self {
        Self { position: Arc::default(), ..self.clone() }
    }

    pub fn len(&self) -> usize {
        self.fixture.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fixture.entries.is_empty()
    }

    pub async fn call(&self, tool: &str, arguments: &Value) -> Result<ToolOutput, ToolError> {
        let hash = hash_json(arguments);
        let fixture = &self.fixture;
        let index = match fixture.by_arguments.get(&hash) {
            Some(&i) => i,
            None => self.next_in_sequence(tool, arguments)?,
        };
        let r = &fixture.entries[index];
        if r.timeout {
            std::future::pending::<()>().await;
        }
        if !r.latency.is_zero() {
            tokio::time::sleep(r.latency).await;
        }
        if let Some(error) = &r.error {
            let known = r.error_type.as_deref().and_then(|t| super::TOOL_ERROR_TYPES.iter().find(|k| **k == t));
            return Err(match known {
                Some(error_type) => ToolError::Recorded { error_type, message: error.clone() },
                None => ToolError::Failed(error.clone()),
            });
        }
        let bytes = serde_json::to_vec(&r.response).map(|b| b.len() as u64).unwrap_or(0);
        ToolOutput::from_json(r.response.clone(), bytes)
    }

    /// The entry index of the sequence line that answers this call, taking it.
    fn next_in_sequence(&self, tool: &str, arguments: &Value) -> Result<usize, ToolError> {
        let sequence = &self.fixture.sequence;
        if sequence.is_empty() {
            return Err(ToolError::NoRecording(format!(
                "{} has no line for {tool} with arguments {}",
                self.source,
                basecamp_trace::canonical_json(arguments)
            )));
        }
        let position = self.position.fetch_add(1, Ordering::Relaxed);
        if position < sequence.len() {
            return Ok(sequence[position]);
        }
        if self.cycle {
            return Ok(sequence[position % sequence.len()]);
        }
        let answers = match sequence.len() {
            1 => "1 answer".to_string(),
            n => format!("{n} answers"),
        };
        Err(ToolError::NoRecording(format!(
            "{} has {answers} for {tool}, one per call in order (match: sequence), and this episode has used them all \
             (this is its call {}); add answers to the fixture, or set match: cycle to start again at the first",
            self.source,
            position + 1
        )))
    }
}

/// Parses a fixture; every bad line is reported with its number.
pub fn parse_fixture(file: &str, text: &str) -> Result<Vec<Recording>, FixtureError> {
    let lines: Vec<&str> = text.lines().collect();
    let last_content = lines.iter().rposition(|l| !l.trim().is_empty()).map_or(0, |i| i + 1);
    let mut out = Vec::new();
    for (i, line) in lines[..last_content].iter().enumerate() {
        let err = |message: String| FixtureError { file: file.to_string(), line: i + 1, message };
        if line.trim().is_empty() {
            return Err(err("blank line in the middle of the fixture".into()));
        }
        out.push(serde_json::from_str(line).map_err(|e| err(format!("invalid recording: {e}")))?);
    }
    Ok(out)
}

pub fn load_fixture(path: &Path) -> Result<Vec<Recording>, FixtureError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| FixtureError {
        file: file.clone(),
        line: 0,
        message: format!("cannot read: {e}"),
    })?;
    parse_fixture(&file, &text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FIXTURE: &str = r#"{"tool": "t", "arguments": {"id": 1, "x": 1.0}, "response": {"status": "a"}}
{"tool": "t", "response": {"status": "any-1"}}
{"tool": "t", "response": {"status": "any-2"}}
{"tool": "other", "error": "down"}
"#;

    #[tokio::test]
    async fn exact_arguments_win_then_the_sequence_answers_in_order() {
        let tool = RecordedTool::new("t", parse_fixture("f.jsonl", FIXTURE).unwrap());
        let exact = tool.call("t", &json!({"x": 1, "id": 1})).await.unwrap();
        assert_eq!(exact.observation, json!({"status": "a"}));
        let seq: Vec<Value> = call_with_fresh_args(&tool, 2).await;
        assert_eq!(seq, vec![json!({"status": "any-1"}), json!({"status": "any-2"})]);
        let again = tool.call("t", &json!({"id": 1, "x": 1})).await.unwrap();
        assert_eq!(again.observation, json!({"status": "a"}), "an exact match takes no sequence line");
    }

    #[tokio::test]
    async fn of_lines_with_the_same_arguments_the_first_answers_among_thousands() {
        let mut lines: Vec<Recording> = (0..5_000)
            .map(|i| Recording {
                tool: "t".into(),
                arguments: Some(json!({"order": i, "region": "eu"})),
                response: json!({"line": i}),
                latency: Duration::ZERO,
                timeout: false,
                error: None,
                error_type: None,
            })
            .collect();
        // The same arguments again, keys in another order: never answers.
        let mut repeat = lines[4_321].clone();
        (repeat.arguments, repeat.response) = (Some(json!({"region": "eu", "order": 4321})), json!({"line": "repeat"}));
        lines.push(repeat);
        let tool = RecordedTool::new("t", lines);
        for i in [0, 4_321, 4_999] {
            let answer = tool.call("t", &json!({"region": "eu", "order": i})).await.unwrap();
            assert_eq!(answer.observation, json!({"line": i}));
        }
        assert_eq!(tool.call("t", &json!({"order": 5_000})).await.unwrap_err().error_type(), "no_recording");
    }

    #[tokio::test]
    async fn a_call_past_the_last_sequence_line_fails_naming_the_fixture_and_its_length() {
        let tool = RecordedTool::new("t", parse_fixture("f.jsonl", FIXTURE).unwrap()).from_file("tools/f.jsonl");
        call_with_fresh_args(&tool, 2).await;
        let err = tool.call("t", &json!({"id": 9})).await.unwrap_err();
        assert_eq!(err.error_type(), "no_recording");
        assert_eq!(
            err.to_string(),
            "no recorded response matches: fixture tools/f.jsonl has 2 answers for t, one per call in order \
             (match: sequence), and this episode has used them all (this is its call 3); add answers to the \
             fixture, or set match: cycle to start again at the first"
        );
    }

    #[tokio::test]
    async fn a_cycling_sequence_starts_again_after_its_last_line() {
        let tool = RecordedTool::new("t", parse_fixture("f.jsonl", FIXTURE).unwrap()).cycling();
        let seq: Vec<Value> = call_with_fresh_args(&tool, 3).await;
        assert_eq!(seq, vec![json!({"status": "any-1"}), json!({"status": "any-2"}), json!({"status": "any-1"})]);
    }

    #[tokio::test]
    async fn each_episode_starts_the_sequence_at_its_first_line() {
        let tool = RecordedTool::new("t", parse_fixture("f.jsonl", FIXTURE).unwrap());
        let (first, second) = (tool.for_episode(), tool.for_episode());
        assert_eq!(call_with_fresh_args(&first, 1).await, vec![json!({"status": "any-1"})]);
        assert_eq!(
            call_with_fresh_args(&second, 2).await,
            vec![json!({"status": "any-1"}), json!({"status": "any-2"})]
        );
        assert_eq!(call_with_fresh_args(&first, 1).await, vec![json!({"status": "any-2"})]);
        let shared = first.clone();
        assert_eq!(shared.call("t", &json!({})).await.unwrap_err().error_type(), "no_recording", "a clone shares");
    }

    async fn call_with_fresh_args(tool: &RecordedTool, n: usize) -> Vec<Value> {
        let mut out = Vec::new();
        for i in 0..n {
            out.push(tool.call("t", &json!({"id": 100 + i})).await.unwrap().observation);
        }
        out
    }

    #[tokio::test]
    async fn recorded_errors_fail_the_call() {
        let tool = RecordedTool::new("other", parse_fixture("f.jsonl", FIXTURE).unwrap());
        let err = tool.call("other", &json!({})).await.unwrap_err();
        assert_eq!(err.to_string(), "down");
    }

    #[tokio::test]
    async fn no_matching_line_is_a_clear_error() {
        let tool = RecordedTool::new("t", parse_fixture("f.jsonl", FIXTURE.lines().next().unwrap()).unwrap());
        let err = tool.call("t", &json!({"id": 2})).await.unwrap_err();
        assert_eq!(err.error_type(), "no_recording");
        assert!(err.to_string().contains(r#"{"id":2}"#), "{err}");
    }

    #[test]
    fn bad_lines_are_named() {
        let err = parse_fixture("f.jsonl", "{\"tool\":\"t\"}\n\n{\"tool\":\"t\"}\n").unwrap_err();
        assert_eq!(err.to_string(), "f.jsonl:2: blank line in the middle of the fixture");
        let err = parse_fixture("f.jsonl", "{\"tool\":\"t\", \"bogus\": 1}\n").unwrap_err();
        assert!(err.to_string().starts_with("f.jsonl:1: invalid recording: unknown field `bogus`"), "{err}");
        assert!(parse_fixture("f.jsonl", "{\"tool\":\"t\"}\n\n").is_ok(), "trailing blank lines are fine");
    }
}
