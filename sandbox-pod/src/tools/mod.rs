//! The tool kinds an agent can call. A tool never touches memory: it returns
//! an observation and, optionally, a memory patch that the executor applies
//! and records.
//!
//! - [`http`]: a templated HTTP request, with a per-tool rate limit;
//! - [`exec`]: a subprocess, JSON on stdin and JSON on stdout, its whole
//!   process group killed when the call is abandoned or the runner is
//!   killed (`group_keeper`);
//! - [`recorded`]: answers from a fixture, for replay and tests;
//! - [`Tool::Function`]: an in-process function (tests, benchmarks, embedding).

pub mod exec;
#[cfg(target_os = "linux")]
pub(crate) mod group_keeper;
pub mod http;
pub mod recorded;

use std::fmt;
use std::sync::Arc;

use basecamp_trace::{MemoryPatch, PatchOp};
use serde_json::Value;

/// What a tool call produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub observation: Value,
    pub memory_patch: MemoryPatch,
    /// Size of the raw response (stdout, HTTP body), before parsing.
    pub response_bytes: u64,
}

impl ToolOutput {
    pub fn observation(observation: Value) -> Self {
        Self { observation, memory_patch: MemoryPatch::default(), response_bytes: 0 }
    }

    /// Reads a tool's JSON answer. An object with an `observation` key may
    /// also carry `memory` (keys to set; `null` writes null) and
    /// `memory_remove` (keys to delete); any other value is the observation.
    pub fn from_json(value: Value, response_bytes: u64) -> Result<Self, ToolError> {
        let Value::Object(mut map) = value else {
            return Ok(Self { observation: value, memory_patch: MemoryPatch::default(), response_bytes });
        };
        let Some(observation) = map.remove("observation") else {
            return Ok(Self { observation: Value::Object(map), memory_patch: MemoryPatch::default(), response_bytes });
        };
        let mut patch = MemoryPatch::default();
        match map.remove("memory") {
            None | Some(Value::Null) => {}
            Some(Value::Object(set)) => patch = MemoryPatch::from_object(&set),
            Some(other) => {
                return Err(ToolError::InvalidOutput(format!(
                    "`memory` must be an object of keys to set, got {}",
                    json_type(&other)
                )));
            }
        }
        match map.remove("memory_remove") {
            None | Some(Value::Null) => {}
            Some(Value::Array(keys)) => {
                for key in keys {
                    let Value::String(key) = key else {
                        return Err(ToolError::InvalidOutput("`memory_remove` must be a list of key names".into()));
                    };
                    patch.ops.push(PatchOp::Remove { key });
                }
            }
            Some(other) => {
                return Err(ToolError::InvalidOutput(format!(
                    "`memory_remove` must be a list of key names, got {}",
                    json_type(&other)
                )));
            }
        }
        Ok(Self { observation, memory_patch: patch, response_bytes })
    }
}

pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Why a tool call failed. `error_type()` is the trace's `error_type` and a
/// bounded metrics label.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    #[error("timed out after {0} ms")]
    Timeout(u64),
    /// `stderr` is its end, `stdout` its start (a tool may print its error
    /// as its JSON answer), each shortened, empty when there was none.
    #[error("exited with {status}{}{}", suffix("stderr", .stderr), suffix("stdout", .stdout))]
    ExitStatus { status: String, stderr: String, stdout: String },
    /// What an exec tool printed, or an HTTP tool answered as `application/json`.
    #[error("answered with output that is not JSON: {0}")]
    InvalidJson(String),
    #[error("returned an invalid answer: {0}")]
    InvalidOutput(String),
    #[error("response larger than the limit of {limit} bytes")]
    ResponseTooLarge { limit: u64 },
    #[error("HTTP {status}: {body}")]
    HttpStatus { status: u16, body: String },
    #[error("rate limited by the server (HTTP 429): {0}")]
    RateLimited(String),
    #[error("request failed: {0}")]
    Transport(String),
    #[error("could not start: {0}")]
    Spawn(String),
    #[error("no recorded response matches: {0}")]
    NoRecording(String),
    #[error("bad arguments: {0}")]
    Arguments(String),
    #[error("{0}")]
    Failed(String),
    /// A failure replayed from a fixture or trace, keeping its recorded type.
    #[error("{message}")]
    Recorded { error_type: &'static str, message: String },
    /// The call failed (`cause`) after a service it calls had exited: the
    /// sandbox broke, not the agent's call.
    #[error("failed because service {service} exited with {status} during the run (its output: {log}): {cause}")]
    ServiceExited { service: String, status: String, log: String, cause: Box<ToolError> },
}

/// The `error_type` of a call that failed because a service it calls had
/// exited ([`ToolError::ServiceExited`]), and the failure class of its
/// episode: aggregates leave such episodes out of the agent's numbers.
pub use basecamp_trace::metrics::SERVICE_EXITED;

/// Every `error_type` a tool call can have, for mapping recorded names back.
pub const TOOL_ERROR_TYPES: [&str; 13] = [
    "timeout",
    "exit_status",
    "invalid_json",
    "invalid_output",
    "response_too_large",
    "http_status",
    "rate_limited",
    "transport",
    "spawn",
    "no_recording",
    "bad_arguments",
    "tool_error",
    SERVICE_EXITED,
];

fn suffix(stream: &str, text: &str) -> String {
    if text.is_empty() { String::new() } else { format!("; {stream}: {text}") }
}

impl ToolError {
    /// The trace's `error_type`, from a fixed set.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::ExitStatus { .. } => "exit_status",
            Self::InvalidJson(_) => "invalid_json",
            Self::InvalidOutput(_) => "invalid_output",
            Self::ResponseTooLarge { .. } => "response_too_large",
            Self::HttpStatus { .. } => "http_status",
            Self::RateLimited(_) => "rate_limited",
            Self::Transport(_) => "transport",
            Self::Spawn(_) => "spawn",
            Self::NoRecording(_) => "no_recording",
            Self::Arguments(_) => "bad_arguments",
            Self::Failed(_) => "tool_error",
            Self::Recorded { error_type, .. } => error_type,
            Self::ServiceExited { .. } => SERVICE_EXITED,
        }
    }

    /// Whether this failure may come of a service gone: not an answer the
    /// service gave (an HTTP status, a 429, a body too large), nor the
    /// call's own arguments, nor a replayed fixture.
    pub fn may_be_a_dead_service(&self) -> bool {
        matches!(
            self,
            Self::Transport(_)
                | Self::Timeout(_)
                | Self::ExitStatus { .. }
                | Self::InvalidJson(_)
                | Self::InvalidOutput(_)
                | Self::Spawn(_)
                | Self::Failed(_)
        )
    }
}

/// An in-process tool.
pub type ToolFn = Arc<dyn Fn(&Value) -> Result<ToolOutput, ToolError> + Send + Sync>;

/// One tool of any kind.
#[derive(Clone)]
pub enum Tool {
    Http(http::HttpTool),
    Exec(exec::ExecTool),
    Recorded(recorded::RecordedTool),
    Function(ToolFn),
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Http(t) => t.fmt(f),
            Self::Exec(t) => t.fmt(f),
            Self::Recorded(t) => t.fmt(f),
            Self::Function(_) => f.write_str("Function"),
        }
    }
}

impl Tool {
    /// Runs the tool. The caller bounds it with a timeout; dropping the
    /// future abandons the call (and kills an exec tool's process group).
    pub async fn call(&self, name: &str, arguments: &Value) -> Result<ToolOutput, ToolError> {
        self.call_until(name, arguments, None, &std::sync::atomic::AtomicU32::new(0)).await
    }

    /// [`Self::call`] for a caller that gives up at `deadline`: an HTTP tool
    /// makes no retry that could not start before it, and counts each
    /// request it sends again in `sent_again` (the trace's `retries`).
    pub async fn call_until(
        &self,
        name: &str,
        arguments: &Value,
        deadline: Option<std::time::Instant>,
        sent_again: &std::sync::atomic::AtomicU32,
    ) -> Result<ToolOutput, ToolError> {
        match self {
            Self::Http(t) => t.call_until(arguments, deadline, sent_again).await,
            Self::Exec(t) => t.call(arguments).await,
            Self::Recorded(t) => t.call(name, arguments).await,
            Self::Function(f) => f(arguments),
        }
    }

    /// This tool as one episode uses it: a recorded tool's sequence starts
    /// at its first answer, apart from other episodes'; every other kind is
    /// the same tool (an HTTP tool's rate limit stays one for all episodes).
    pub fn for_episode(&self) -> Self {
        match self {
            Self::Recorded(t) => Self::Recorded(t.for_episode()),
            other => other.clone(),
        }
    }

    /// This tool as another shard of a local run uses it: an HTTP tool's
    /// rate limit is the shard's own, as each pod's is in a cluster; every
    /// other kind is the same tool (a recorded tool shares its fixture).
    pub fn for_shard(&self) -> Self {
        match self {
            Self::Http(t) => Self::Http(t.with_own_limiter()),
            other => other.clone(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::Http(_) => "http",
            Self::Exec(_) => "exec",
            Self::Recorded(_) => "recorded",
            Self::Function(_) => "function",
        }
    }
}

/// Default cap on a tool's raw response.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 4 << 20;

/// Keeps the first `limit` bytes of text for an error message, on a char boundary.
pub(crate) fn excerpt(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.trim().to_string();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", text[..end].trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn plain_values_are_observations() {
        let out = ToolOutput::from_json(json!({"status": "shipped"}), 20).unwrap();
        assert_eq!(out.observation, json!({"status": "shipped"}));
        assert!(out.memory_patch.is_empty());
    }

    #[test]
    fn observation_with_memory_patch() {
        let out = ToolOutput::from_json(
            json!({"observation": {"ok": true}, "memory": {"shipping_status": null}, "memory_remove": ["tmp"]}),
            0,
        )
        .unwrap();
        assert_eq!(out.observation, json!({"ok": true}));
        assert_eq!(
            out.memory_patch.ops,
            vec![
                PatchOp::Set { key: "shipping_status".into(), value: Value::Null },
                PatchOp::Remove { key: "tmp".into() }
            ]
        );
    }

    #[test]
    fn malformed_memory_is_an_error_not_a_silent_drop() {
        let err = ToolOutput::from_json(json!({"observation": 1, "memory": [1]}), 0).unwrap_err();
        assert_eq!(err.error_type(), "invalid_output");
        assert!(err.to_string().contains("an array"), "{err}");
    }

    #[test]
    fn excerpt_respects_char_boundaries() {
        assert_eq!(excerpt("héllo wörld", 2), "h…");
    }
}
