//! Tool definitions: what the agent may call, and how the sandbox runs it.
//!
//! A tool is one of three kinds, written Kubernetes-style as exactly one of
//! the sub-objects `http`, `exec` or `recorded` (like a Volume's
//! `configMap` / `secret`): that keeps the CRD schema structural and lets
//! unknown fields be caught, which an internally tagged `kind:` field would
//! not. Tools never write memory directly: `memoryPatch` says which parts of
//! the tool's JSON result the sandbox copies into memory.
//!
//! Templates (`http.url`, `http.body`, header values) use `{{name}}`
//! placeholders, replaced by the call argument `name` (strings verbatim,
//! other values as JSON; percent-encoded in the URL). A dotted name
//! (`{{order.id}}`) reaches into an object argument.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema;

/// One tool the agent may call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    /// What the tool does, shown to the policy model in its `tools` list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the tool's arguments (an object schema), passed to the
    /// policy model as the function's `parameters`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::json_object")]
    pub parameters: Option<serde_json::Value>,
    /// How the tool's JSON result patches memory: memory key -> JSON pointer
    /// (RFC 6901) into the result, e.g. `shipping_status: /status`. `""`
    /// copies the whole result. Every write is recorded with the tool as its
    /// source.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub memory_patch: BTreeMap<String, String>,
    /// Call an HTTP endpoint. Set exactly one of `http`, `exec`, `recorded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpTool>,
    /// Run a subprocess with the arguments as JSON on stdin and read one JSON
    /// value from stdout. Set exactly one of `http`, `exec`, `recorded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecTool>,
    /// Answer from a recorded fixture (for replay and tests). Set exactly one
    /// of `http`, `exec`, `recorded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<RecordedTool>,
}

/// The kind of a tool, borrowed from its definition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ToolKind<'a> {
    /// An HTTP call.
    Http(&'a HttpTool),
    /// A subprocess.
    Exec(&'a ExecTool),
    /// A recorded fixture.
    Recorded(&'a RecordedTool),
}

impl ToolSpec {
    /// The names of the kinds set (`http`, `exec`, `recorded`); a valid tool
    /// has exactly one.
    pub fn kinds_set(&self) -> Vec<&'static str> {
        let mut kinds = Vec::new();
        if self.http.is_some() {
            kinds.push("http");
        }
        if self.exec.is_some() {
            kinds.push("exec");
        }
        if self.recorded.is_some() {
            kinds.push("recorded");
        }
        kinds
    }

    /// The tool's kind, or `None` unless exactly one kind is set (validation
    /// reports that case).
    pub fn kind(&self) -> Option<ToolKind<'_>> {
        match (&self.http, &self.exec, &self.recorded) {
            (Some(http), None, None) => Some(ToolKind::Http(http)),
            (None, Some(exec), None) => Some(ToolKind::Exec(exec)),
            (None, None, Some(recorded)) => Some(ToolKind::Recorded(recorded)),
            _ => None,
        }
    }
}

/// An HTTP tool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpTool {
    /// URL template, e.g. `http://tracking.shop.svc:8080/orders/{{order_id}}`.
    pub url: String,
    /// HTTP method. Default: GET.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<HttpMethod>,
    /// Request headers; values are templates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Request body template, e.g. `{"order": "{{order_id}}"}`. Default: the
    /// call's arguments as JSON for POST/PUT/PATCH, no body otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Client-side rate limit for this tool. Check the API's documented limit
    /// and its unit: 1000/minute is not 1000/second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Retries of answers that say "try again" (429, 502, 503, 504 by
    /// default), inside the tool's timeout: a `Retry-After` header is
    /// honoured, otherwise the backoff doubles from `backoff`. Default: no
    /// retry — the first 429 is the tool's failure (and its fallback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<HttpRetry>,
}

/// How an HTTP tool retries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRetry {
    /// Attempts in all, the first included (2 to 10).
    pub attempts: u32,
    /// The statuses retried. Default: 429, 502, 503, 504.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_status: Vec<u16>,
    /// The wait before the second attempt when the answer has no
    /// `Retry-After`; doubled for each further one. At most 7 days (168h).
    /// Default: 100ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<crate::duration::Duration>,
}

impl HttpRetry {
    /// The statuses retried.
    pub fn retries_status(&self, status: u16) -> bool {
        if self.on_status.is_empty() {
            matches!(status, 429 | 502 | 503 | 504)
        } else {
            self.on_status.contains(&status)
        }
    }

    /// The wait before attempt `attempt` (1-based; attempt 2 is the first retry).
    pub fn backoff_before(&self, attempt: u32) -> std::time::Duration {
        let base =
            self.backoff.and_then(crate::duration::Duration::to_std).unwrap_or(std::time::Duration::from_millis(100));
        base.saturating_mul(1 << attempt.saturating_sub(2).min(16))
    }
}

/// HTTP methods a tool may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    /// GET
    Get,
    /// POST
    Post,
    /// PUT
    Put,
    /// PATCH
    Patch,
    /// DELETE
    Delete,
}

/// A token-bucket rate limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    /// Sustained requests per second (may be fractional: 0.5 is one request
    /// every two seconds). Must be greater than zero.
    pub requests_per_second: f64,
    /// Requests allowed at once before the limit applies. Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

/// A subprocess tool: JSON arguments on stdin, one JSON value on stdout.
/// On timeout the whole process group is killed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecTool {
    /// The program and its arguments (argv; no shell), e.g.
    /// `["python3", "tools/refund.py"]`.
    pub command: Vec<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory. Default: the sandbox's working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
}

/// A tool answered from a fixture file (JSONL, one
/// `{"tool", "arguments", "observation"}` per line, optionally with
/// `memoryPatch`, `memoryRemove`, `latencyMs`, `timeout`, or `error` and
/// `errorType`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecordedTool {
    /// Path of the fixture file (relative to the manifest's directory for
    /// `basecamp run`, to the working directory in a pod).
    pub fixture: String,
    /// How a call finds its answer: `args`, `sequence` or `cycle` (see
    /// [`RecordedMatch`]). Default: args.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_by: Option<RecordedMatch>,
}

/// How a recorded tool matches calls to fixture entries: `args` (the entry
/// whose arguments equal the call's, canonically), `sequence` (the tool's
/// entries in file order, one per call; every episode starts at the first,
/// and a call past the last fails with `no_recording`) or `cycle` (as
/// `sequence`, starting again at the first after the last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum RecordedMatch {
    /// By canonical arguments.
    #[default]
    Args,
    /// In order of calls, each episode from the first entry; a call past the
    /// last fails.
    Sequence,
    /// In order of calls, starting again at the first entry after the last.
    Cycle,
}

/// A template with unbalanced braces or a bad placeholder name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("template {template:?}: {reason}; placeholders look like {{{{order_id}}}} or {{{{order.id}}}}")]
pub struct TemplateError {
    /// The template.
    pub template: String,
    /// What is wrong.
    pub reason: String,
}

impl TemplateError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        "InvalidTemplate"
    }
}

/// The placeholder names in a template, in order (`{{ a.b }}` -> `a.b`).
pub fn template_placeholders(template: &str) -> Result<Vec<String>, TemplateError> {
    let error = |reason: String| TemplateError { template: template.to_string(), reason };
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or_else(|| error("a \"{{\" is never closed".into()))?;
        let name = after[..close].trim();
        let valid = !name.is_empty()
            && name.split('.').all(|part| {
                !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            });
        if !valid {
            return Err(error(format!("{{{{{}}}}} is not a placeholder name", &after[..close])));
        }
        names.push(name.to_string());
        rest = &after[close + 2..];
    }
    if rest.contains("}}") {
        return Err(error("a \"}}\" has no matching \"{{\"".into()));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_found_in_order() {
        let names = template_placeholders("http://x/orders/{{order_id}}?u={{ user.id }}").expect("valid");
        assert_eq!(names, ["order_id", "user.id"]);
        assert!(template_placeholders("no placeholders").expect("valid").is_empty());
    }

    #[test]
    fn unbalanced_or_empty_placeholders_are_errors() {
        for bad in ["http://x/{{order_id", "http://x/order_id}}", "{{}}", "{{a b}}", "{{a..b}}"] {
            let err = template_placeholders(bad).expect_err(bad);
            assert_eq!(err.category(), "InvalidTemplate");
        }
    }

    #[test]
    fn exactly_one_kind_makes_a_tool() {
        let mut tool = ToolSpec {
            exec: Some(ExecTool { command: vec!["true".into()], ..Default::default() }),
            ..Default::default()
        };
        assert!(matches!(tool.kind(), Some(ToolKind::Exec(_))));
        tool.http = Some(HttpTool { url: "http://x".into(), ..Default::default() });
        assert_eq!(tool.kind(), None);
        assert_eq!(tool.kinds_set(), ["http", "exec"]);
        assert_eq!(ToolSpec::default().kind(), None);
    }
}
