//! Traces as OpenTelemetry GenAI spans, in the OTLP/JSON encoding (one
//! `ExportTraceServiceRequest` per episode, the line format of the OTLP
//! file exporter), so any OpenTelemetry backend or tool can read them.
//!
//! - one `invoke_agent {task}` span per episode (`gen_ai.operation.name =
//!   invoke_agent`, `gen_ai.agent.name`, `gen_ai.conversation.id` = the
//!   episode id, `gen_ai.request.model`, token usage), from the header's
//!   start time to the episode end, status ERROR when the outcome is an error,
//!   `basecamp.outcome` and `basecamp.failure_class` from the episode end;
//! - one `execute_tool {tool}` child span per tool call (`gen_ai.tool.name`,
//!   `gen_ai.tool.call.id`, `gen_ai.tool.type = function`), from the call's
//!   start for its latency; a failed call has `error.type` (`timeout` on
//!   timeouts) and status ERROR;
//! - `gen_ai.evaluation.result` events on the episode span for every reward
//!   component (`gen_ai.evaluation.name`, `gen_ai.evaluation.score.value`,
//!   the weight), the weighted sum, and the metrics a trace alone gives
//!   (`error_rate`, `resolution_time_s`), each dated no earlier than the
//!   step it is of; `exception` events for error contexts, on the failed
//!   tool call of their step (at its end), else on the episode span.
//!
//! Trace and span ids are derived from the episode (sha256), so exporting
//! the same trace twice gives the same ids.

use std::io::Read;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::error::TraceError;
use crate::pb::{Outcome, StepKind, StepStatus, record::Body};
use crate::reader::{RecordKind, Tail, TraceReader};

const SPAN_KIND_INTERNAL: i32 = 1;
const SPAN_KIND_CLIENT: i32 = 3;
const STATUS_OK: i32 = 1;
const STATUS_ERROR: i32 = 2;

// The OTLP/JSON document as types: it is serialized as it is written, never
// held as a `Value` tree (about 40 times its text for a long episode). Fields
// are declared in sorted order, the order a `Value` object has, so the text
// is the same either way (`export` gives the `Value`).

/// One episode's `ExportTraceServiceRequest`.
#[derive(Debug, Serialize)]
pub struct Request {
    #[serde(rename = "resourceSpans")]
    resource_spans: [ResourceSpans; 1],
}

#[derive(Debug, Serialize)]
struct ResourceSpans {
    resource: Resource,
    #[serde(rename = "scopeSpans")]
    scope_spans: [ScopeSpans; 1],
}

#[derive(Debug, Serialize)]
struct Resource {
    attributes: Vec<KeyValue>,
}

#[derive(Debug, Serialize)]
struct ScopeSpans {
    scope: Scope,
    spans: Vec<Span>,
}

#[derive(Debug, Serialize)]
struct Scope {
    name: &'static str,
    version: &'static str,
}

#[derive(Debug, Serialize)]
struct Span {
    attributes: Vec<KeyValue>,
    #[serde(rename = "endTimeUnixNano")]
    end_time_unix_nano: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    events: Option<Vec<Event>>,
    kind: i32,
    name: String,
    #[serde(rename = "parentSpanId", skip_serializing_if = "Option::is_none")]
    parent_span_id: Option<String>,
    #[serde(rename = "spanId")]
    span_id: String,
    #[serde(rename = "startTimeUnixNano")]
    start_time_unix_nano: String,
    status: Status,
    #[serde(rename = "traceId")]
    trace_id: String,
}

#[derive(Debug, Serialize)]
struct Status {
    code: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

impl Status {
    fn ok() -> Self {
        Self { code: STATUS_OK, message: None }
    }

    fn error(message: impl Into<String>) -> Self {
        Self { code: STATUS_ERROR, message: Some(message.into()) }
    }
}

#[derive(Debug, Serialize)]
struct Event {
    attributes: Vec<KeyValue>,
    name: &'static str,
    #[serde(rename = "timeUnixNano")]
    time_unix_nano: String,
}

#[derive(Debug, Serialize)]
struct KeyValue {
    key: &'static str,
    value: AnyValue,
}

/// An OTLP `AnyValue`: `{"stringValue": ...}` and so on; 64-bit integers
/// are strings in OTLP/JSON.
#[derive(Debug, Serialize)]
enum AnyValue {
    #[serde(rename = "boolValue")]
    Bool(bool),
    #[serde(rename = "doubleValue")]
    Double(f64),
    #[serde(rename = "intValue")]
    Int(String),
    #[serde(rename = "stringValue")]
    String(String),
}

fn text(key: &'static str, value: impl Into<String>) -> KeyValue {
    KeyValue { key, value: AnyValue::String(value.into()) }
}

fn int(key: &'static str, value: impl Into<u64>) -> KeyValue {
    KeyValue { key, value: AnyValue::Int(value.into().to_string()) }
}

fn flag(key: &'static str, value: bool) -> KeyValue {
    KeyValue { key, value: AnyValue::Bool(value) }
}

/// JSON has no NaN or infinity: such a value is the text the proto3 JSON
/// mapping gives it ("NaN", "Infinity", "-Infinity"), so the three stay
/// apart (they were all "null").
fn double(key: &'static str, value: f64) -> KeyValue {
    let value = match value {
        v if v.is_finite() => AnyValue::Double(v),
        v if v.is_nan() => AnyValue::String("NaN".into()),
        v if v > 0.0 => AnyValue::String("Infinity".into()),
        _ => AnyValue::String("-Infinity".into()),
    };
    KeyValue { key, value }
}

fn id(parts: &[&[u8]], len: usize) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex::encode(&h.finalize()[..len])
}

/// One trace as an OTLP/JSON `ExportTraceServiceRequest` [`Value`]; see
/// [`export_request`], which gives the same document without the tree.
pub fn export<R: Read>(reader: TraceReader<R>) -> (Value, Option<TraceError>) {
    let (request, damage) = export_request(reader);
    (serde_json::to_value(request).expect("an OTLP request always serializes"), damage)
}

/// One trace as an OTLP/JSON `ExportTraceServiceRequest`, to serialize. A
/// damaged trace is exported as far as it reads, and the damage is returned
/// with it. Token logits have no span: their frames are skipped unread.
pub fn export_request<R: Read>(reader: TraceReader<R>) -> (Request, Option<TraceError>) {
    let mut reader = reader.without(&[RecordKind::TokenLogit]);
    let header = reader.header().clone();
    let start = header.start_time_unix_nanos.max(0) as u64;
    let trace_id = id(&[b"basecamp", header.episode_id.as_bytes(), &start.to_le_bytes()], 16);
    let root_id = id(&[trace_id.as_bytes(), b"invoke_agent"], 8);
    let mut tool_spans = Vec::new();
    let mut events = Vec::new();
    let (mut model, mut input_tokens, mut output_tokens) = (String::new(), 0u64, 0u64);
    let (mut calls, mut failed_calls) = (0u64, 0u64);
    let mut last_time = start;
    // The newest tool span: its step and whether it failed (an error
    // context of that step is recorded on it, where the error happened).
    let mut last_tool: Option<(u32, bool)> = None;
    let mut end: Option<crate::pb::EpisodeEnd> = None;
    let mut damage = None;
    for record in reader.by_ref() {
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                damage = Some(e);
                break;
            }
        };
        let step = record.step;
        match record.body {
            Some(Body::PolicyTurn(t)) => {
                if model.is_empty() {
                    model = t.model;
                }
                input_tokens += u64::from(t.prompt_tokens);
                output_tokens += u64::from(t.completion_tokens);
            }
            Some(Body::PlanStep(p)) if p.kind == StepKind::ToolCall as i32 => {
                calls += 1;
                let span_start = if p.start_unix_nanos > 0 { p.start_unix_nanos as u64 } else { last_time };
                let span_end = span_start.saturating_add(p.latency_micros.saturating_mul(1000));
                last_time = last_time.max(span_end);
                let status = StepStatus::try_from(p.status).unwrap_or(StepStatus::Unspecified);
                let failed = status != StepStatus::Ok;
                let mut attributes = vec![
                    text("gen_ai.operation.name", "execute_tool"),
                    text("gen_ai.tool.name", p.tool.as_str()),
                    text("gen_ai.tool.call.id", p.call_id.as_str()),
                    text("gen_ai.tool.type", "function"),
                    int("basecamp.step", step),
                    text("basecamp.tool.status", status.as_str_name()),
                    int("basecamp.tool.timeout_ms", p.timeout_ms),
                    flag("basecamp.tool.fallback_used", p.fallback_used),
                    int("basecamp.tool.response_bytes", p.response_bytes),
                ];
                let error_type = if status == StepStatus::Timeout || p.error_type == "timeout" {
                    Some("timeout".to_string())
                } else if failed {
                    Some(if p.error_type.is_empty() {
                        status.as_str_name().to_lowercase()
                    } else {
                        p.error_type.clone()
                    })
                } else {
                    None
                };
                if let Some(t) = &error_type {
                    failed_calls += 1;
                    attributes.push(text("error.type", t.as_str()));
                }
                let span_id = id(
                    &[
                        trace_id.as_bytes(),
                        b"execute_tool",
                        &step.to_le_bytes(),
                        p.call_id.as_bytes(),
                        &calls.to_le_bytes(),
                    ],
                    8,
                );
                last_tool = Some((step, error_type.is_some()));
                tool_spans.push(Span {
                    attributes,
                    end_time_unix_nano: span_end.to_string(),
                    events: None,
                    kind: SPAN_KIND_CLIENT,
                    name: format!("execute_tool {}", p.tool),
                    parent_span_id: Some(root_id.clone()),
                    span_id,
                    start_time_unix_nano: span_start.to_string(),
                    status: if error_type.is_some() { Status::error(p.error_message) } else { Status::ok() },
                    trace_id: trace_id.clone(),
                });
            }
            // A final answer (or another step that calls no tool) moves the
            // clock on too: a reward of that step is not dated before it.
            Some(Body::PlanStep(p)) if p.start_unix_nanos > 0 => {
                let span_start = p.start_unix_nanos as u64;
                last_time = last_time.max(span_start.saturating_add(p.latency_micros.saturating_mul(1000)));
            }
            Some(Body::RewardSignal(r)) => {
                for c in &r.components {
                    let extra = [double("basecamp.reward.weight", c.weight), int("basecamp.step", step)];
                    events.push(evaluation(last_time, &c.name, c.score, extra));
                }
                events.push(evaluation(last_time, "reward.weighted_sum", r.weighted_sum, [int("basecamp.step", step)]));
            }
            Some(Body::ErrorContext(e)) => {
                let stack = if e.stack.is_empty() { e.cause_chain.join("\ncaused by: ") } else { e.stack };
                let mut exception = Event {
                    attributes: vec![
                        text("exception.type", e.error_type),
                        text("exception.message", e.message),
                        text("exception.stacktrace", stack),
                        int("basecamp.step", step),
                    ],
                    name: "exception",
                    time_unix_nano: last_time.to_string(),
                };
                // On the failed tool call of its step, at the call's end;
                // an error no tool call shows (a policy's) on the root.
                match tool_spans.last_mut().filter(|_| last_tool == Some((step, true))) {
                    Some(span) => {
                        exception.time_unix_nano.clone_from(&span.end_time_unix_nano);
                        span.events.get_or_insert_with(Vec::new).push(exception);
                    }
                    None => events.push(exception),
                }
            }
            Some(Body::EpisodeEnd(e)) => end = Some(e),
            _ => {}
        }
    }
    if damage.is_none()
        && let Some(Tail::Damaged(e)) = reader.tail()
    {
        damage = Some(e.clone());
    }
    let end_time = end.as_ref().map_or(last_time, |e| (e.end_time_unix_nanos.max(0) as u64).max(start));
    if calls > 0 {
        events.push(evaluation(end_time, "error_rate", failed_calls as f64 / calls as f64, []));
    }
    events.push(evaluation(end_time, "resolution_time_s", end_time.saturating_sub(start) as f64 / 1e9, []));
    let outcome = end.as_ref().and_then(|e| Outcome::try_from(e.outcome).ok());
    let status = match (&damage, outcome) {
        (Some(e), _) => Status::error(e.to_string()),
        (None, Some(Outcome::Error)) => Status::error("episode ended with an error"),
        _ => Status::ok(),
    };
    let mut attributes = vec![
        text("gen_ai.operation.name", "invoke_agent"),
        text("gen_ai.agent.name", header.task.as_str()),
        text("gen_ai.conversation.id", header.episode_id.as_str()),
        int("gen_ai.usage.input_tokens", input_tokens),
        int("gen_ai.usage.output_tokens", output_tokens),
        text("basecamp.variant", header.variant.as_str()),
        int("basecamp.shard", header.shard),
        int("basecamp.training_step", header.training_step),
    ];
    if !model.is_empty() {
        attributes.push(text("gen_ai.request.model", model));
    }
    if let Some(outcome) = outcome {
        attributes.push(text("basecamp.outcome", outcome.as_str_name()));
    }
    if let Some(class) = end.as_ref().map(|e| e.failure_class.as_str()).filter(|c| !c.is_empty()) {
        attributes.push(text("basecamp.failure_class", class));
    }
    let root = Span {
        attributes,
        end_time_unix_nano: end_time.to_string(),
        events: Some(events),
        kind: SPAN_KIND_INTERNAL,
        name: format!("invoke_agent {}", header.task),
        parent_span_id: None,
        span_id: root_id,
        start_time_unix_nano: start.to_string(),
        status,
        trace_id,
    };
    let mut spans = Vec::with_capacity(1 + tool_spans.len());
    spans.push(root);
    spans.extend(tool_spans);
    let request = Request {
        resource_spans: [ResourceSpans {
            resource: Resource {
                attributes: vec![
                    text("service.name", "basecamp"),
                    text("basecamp.namespace", header.namespace),
                    text("basecamp.task", header.task),
                ],
            },
            scope_spans: [ScopeSpans {
                scope: Scope { name: "basecamp-trace", version: env!("CARGO_PKG_VERSION") },
                spans,
            }],
        }],
    };
    (request, damage)
}

fn evaluation<const N: usize>(time: u64, name: &str, score: f64, extra: [KeyValue; N]) -> Event {
    let mut attributes = vec![text("gen_ai.evaluation.name", name), double("gen_ai.evaluation.score.value", score)];
    attributes.extend(extra);
    Event { attributes, name: "gen_ai.evaluation.result", time_unix_nano: time.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_finite_double_keeps_which_it_is() {
        let shown = |v: f64| serde_json::to_value(double("x", v).value).unwrap();
        assert_eq!(shown(0.5), serde_json::json!({"doubleValue": 0.5}));
        assert_eq!(shown(f64::NAN), serde_json::json!({"stringValue": "NaN"}));
        assert_eq!(shown(f64::INFINITY), serde_json::json!({"stringValue": "Infinity"}));
        assert_eq!(shown(f64::NEG_INFINITY), serde_json::json!({"stringValue": "-Infinity"}));
    }
}
