//! Traces as OpenTelemetry GenAI spans, in the OTLP/JSON encoding (one
//! `ExportTraceServiceRequest` per episode, the line format of the OTLP
//! file exporter), so any OpenTelemetry backend or tool can read them.
//!
//! - one `invoke_agent {task}` span per episode (`gen_ai.operation.name =
//!   invoke_agent`, `gen_ai.agent.name`, `gen_ai.conversation.id` = the
//!   episode id, `gen_ai.request.model`, token usage), from the header's
//!   start time to the episode end, status ERROR when the outcome is an error;
//! - one `execute_tool {tool}` child span per tool call (`gen_ai.tool.name`,
//!   `gen_ai.tool.call.id`, `gen_ai.tool.type = function`), from the call's
//!   start for its latency; a failed call has `error.type` (`timeout` on
//!   timeouts) and status ERROR;
//! - `gen_ai.evaluation.result` events on the episode span for every reward
//!   component (`gen_ai.evaluation.name`, `gen_ai.evaluation.score.value`,
//!   the weight), the weighted sum, and the metrics a trace alone gives
//!   (`error_rate`, `resolution_time_s`); `exception` events for error contexts.
//!
//! Trace and span ids are derived from the episode (sha256), so exporting
//! the same trace twice gives the same ids.

use std::io::Read;

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::error::TraceError;
use crate::pb::{Outcome, StepKind, StepStatus, record::Body};
use crate::reader::{RecordKind, Tail, TraceReader};

const SPAN_KIND_INTERNAL: i32 = 1;
const SPAN_KIND_CLIENT: i32 = 3;
const STATUS_OK: i32 = 1;
const STATUS_ERROR: i32 = 2;

fn attr(key: &str, value: Value) -> Value {
    let v = match value {
        Value::String(s) => json!({ "stringValue": s }),
        Value::Bool(b) => json!({ "boolValue": b }),
        Value::Number(n) if n.is_i64() || n.is_u64() => json!({ "intValue": n.to_string() }),
        Value::Number(n) => json!({ "doubleValue": n.as_f64() }),
        other => json!({ "stringValue": other.to_string() }),
    };
    json!({ "key": key, "value": v })
}

fn id(parts: &[&[u8]], len: usize) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex::encode(&h.finalize()[..len])
}

/// One trace as an OTLP/JSON `ExportTraceServiceRequest`. A damaged trace
/// is exported as far as it reads, and the damage is returned with it.
/// Token logits have no span: their frames are skipped unread.
pub fn export<R: Read>(reader: TraceReader<R>) -> (Value, Option<TraceError>) {
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
                    attr("gen_ai.operation.name", json!("execute_tool")),
                    attr("gen_ai.tool.name", json!(p.tool)),
                    attr("gen_ai.tool.call.id", json!(p.call_id)),
                    attr("gen_ai.tool.type", json!("function")),
                    attr("basecamp.step", json!(step)),
                    attr("basecamp.tool.status", json!(status.as_str_name())),
                    attr("basecamp.tool.timeout_ms", json!(p.timeout_ms)),
                    attr("basecamp.tool.fallback_used", json!(p.fallback_used)),
                    attr("basecamp.tool.response_bytes", json!(p.response_bytes)),
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
                    attributes.push(attr("error.type", json!(t)));
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
                tool_spans.push(json!({
                    "traceId": trace_id,
                    "spanId": span_id,
                    "parentSpanId": root_id,
                    "name": format!("execute_tool {}", p.tool),
                    "kind": SPAN_KIND_CLIENT,
                    "startTimeUnixNano": span_start.to_string(),
                    "endTimeUnixNano": span_end.to_string(),
                    "attributes": attributes,
                    "status": match &error_type {
                        Some(_) => json!({"code": STATUS_ERROR, "message": p.error_message}),
                        None => json!({"code": STATUS_OK}),
                    },
                }));
            }
            Some(Body::RewardSignal(r)) => {
                for c in &r.components {
                    events.push(evaluation(
                        last_time,
                        &c.name,
                        c.score,
                        &[attr("basecamp.reward.weight", json!(c.weight)), attr("basecamp.step", json!(step))],
                    ));
                }
                events.push(evaluation(
                    last_time,
                    "reward.weighted_sum",
                    r.weighted_sum,
                    &[attr("basecamp.step", json!(step))],
                ));
            }
            Some(Body::ErrorContext(e)) => {
                events.push(json!({
                    "timeUnixNano": last_time.to_string(),
                    "name": "exception",
                    "attributes": [
                        attr("exception.type", json!(e.error_type)),
                        attr("exception.message", json!(e.message)),
                        attr("exception.stacktrace", json!(if e.stack.is_empty() { e.cause_chain.join("\ncaused by: ") } else { e.stack.clone() })),
                        attr("basecamp.step", json!(step)),
                    ],
                }));
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
        events.push(evaluation(end_time, "error_rate", failed_calls as f64 / calls as f64, &[]));
    }
    events.push(evaluation(end_time, "resolution_time_s", end_time.saturating_sub(start) as f64 / 1e9, &[]));
    let outcome = end.as_ref().and_then(|e| Outcome::try_from(e.outcome).ok());
    let status = match (&damage, outcome) {
        (Some(e), _) => json!({"code": STATUS_ERROR, "message": e.to_string()}),
        (None, Some(Outcome::Error)) => json!({"code": STATUS_ERROR, "message": "episode ended with an error"}),
        _ => json!({"code": STATUS_OK}),
    };
    let mut attributes = vec![
        attr("gen_ai.operation.name", json!("invoke_agent")),
        attr("gen_ai.agent.name", json!(header.task)),
        attr("gen_ai.conversation.id", json!(header.episode_id)),
        attr("gen_ai.usage.input_tokens", json!(input_tokens)),
        attr("gen_ai.usage.output_tokens", json!(output_tokens)),
        attr("basecamp.variant", json!(header.variant)),
        attr("basecamp.shard", json!(header.shard)),
        attr("basecamp.training_step", json!(header.training_step)),
    ];
    if !model.is_empty() {
        attributes.push(attr("gen_ai.request.model", json!(model)));
    }
    if let Some(outcome) = outcome {
        attributes.push(attr("basecamp.outcome", json!(outcome.as_str_name())));
    }
    let root = json!({
        "traceId": trace_id,
        "spanId": root_id,
        "name": format!("invoke_agent {}", header.task),
        "kind": SPAN_KIND_INTERNAL,
        "startTimeUnixNano": start.to_string(),
        "endTimeUnixNano": end_time.to_string(),
        "attributes": attributes,
        "events": events,
        "status": status,
    });
    let mut spans = vec![root];
    spans.extend(tool_spans);
    let request = json!({
        "resourceSpans": [{
            "resource": {"attributes": [
                attr("service.name", json!("basecamp")),
                attr("basecamp.namespace", json!(header.namespace)),
                attr("basecamp.task", json!(header.task)),
            ]},
            "scopeSpans": [{
                "scope": {"name": "basecamp-trace", "version": env!("CARGO_PKG_VERSION")},
                "spans": spans,
            }],
        }],
    });
    (request, damage)
}

fn evaluation(time: u64, name: &str, score: f64, extra: &[Value]) -> Value {
    let mut attributes =
        vec![attr("gen_ai.evaluation.name", json!(name)), attr("gen_ai.evaluation.score.value", json!(score))];
    attributes.extend(extra.iter().cloned());
    json!({"timeUnixNano": time.to_string(), "name": "gen_ai.evaluation.result", "attributes": attributes})
}
