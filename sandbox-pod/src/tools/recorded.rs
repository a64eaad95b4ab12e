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
//! the call's (compared as canonical JSON); lines without `arguments` answer
//! any call, taken in turn (cycling). `latency_ms` delays the answer (so a
//! fixture can exercise timeouts), `error` makes the call fail.

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
    #[serde(default)]
    pub latency_ms: u64,
    #[serde(default)]
    pub error: Option<String>,
    /// The recorded failure's type (one of [`super::TOOL_ERROR_TYPES`]);
    /// absent or unknown: `tool_error`.
    #[serde(default)]
    pub error_type: Option<String>,
}

#[derive(Debug)]
struct Entry {
    recording: Recording,
    arguments_hash: Option<Digest>,
}

#[derive(Debug, Default)]
struct Fixture {
    entries: Vec<Entry>,
    /// Next wildcard line to use (counted over the tool's wildcard lines).
    cursor: AtomicUsize,
}

/// A fixture for one tool; cheap to clone (shared cursor).
#[derive(Debug, Clone)]
pub struct RecordedTool {
    fixture: Arc<Fixture>,
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
    /// The recordings of `tool` among `recordings`.
    pub fn new(tool: &str, recordings: impl IntoIterator<Item = Recording>) -> Self {
        let entries = recordings
            .into_iter()
            .filter(|r| r.tool == tool)
            .map(|recording| Entry { arguments_hash: recording.arguments.as_ref().map(hash_json), recording })
            .collect();
        Self { fixture: Arc::new(Fixture { entries, cursor: AtomicUsize::new(0) }) }
    }

    pub fn len(&self) -> usize {
        self.fixture.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fixture.entries.is_empty()
    }

    pub async fn call(&self, tool: &str, arguments: &Value) -> Result<ToolOutput, ToolError> {
        let hash = hash_json(arguments);
        let entries = &self.fixture.entries;
        let entry = match entries.iter().find(|e| e.arguments_hash == Some(hash)) {
            Some(e) => e,
            None => {
                let wildcards: Vec<&Entry> = entries.iter().filter(|e| e.arguments_hash.is_none()).collect();
                if wildcards.is_empty() {
                    return Err(ToolError::NoRecording(format!(
                        "the fixture has no line for {tool} with arguments {}",
                        basecamp_trace::canonical_json(arguments)
                    )));
                }
                let i = self.fixture.cursor.fetch_add(1, Ordering::Relaxed) % wildcards.len();
                wildcards[i]
            }
        };
        let r = &entry.recording;
        if r.latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(r.latency_ms)).await;
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
    async fn exact_arguments_win_then_wildcards_cycle() {
        let tool = RecordedTool::new("t", parse_fixture("f.jsonl", FIXTURE).unwrap());
        let exact = tool.call("t", &json!({"x": 1, "id": 1})).await.unwrap();
        assert_eq!(exact.observation, json!({"status": "a"}));
        let seq: Vec<Value> = call_with_fresh_args(&tool, 3).await;
        assert_eq!(seq, vec![json!({"status": "any-1"}), json!({"status": "any-2"}), json!({"status": "any-1"})]);
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
