//! An action of server mode: what the external trainer's policy answered
//! for one step, in the shape a scripted policy's response takes —
//! `{"tool_calls": [{"name", "arguments", "id"?}]}` or `{"content": …}`,
//! with optional `logprobs`, `raw_logits` (`crate::policy::raw_logits`),
//! `finish_reason` and `model` — turned into the
//! [`PolicyResponse`] the driver loop would have received.
//!
//! An optional `step` says which step the action answers: a client that
//! retries a step whose answer it never got (its timeout, a dropped
//! connection: the step was played all the same) is told the episode has
//! moved on ([`ActionError::step_mismatch`]) instead of having the action
//! played again as the next step.
//!
//! A structural problem (a missing name, a field of the wrong type, an
//! unknown field) is refused with the field's path. Arguments that are not
//! valid JSON, or not an object, are what a model can produce: they are
//! accepted and recorded as the refused call driver mode would record.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::policy::{FinishReason, PolicyResponse, RawLogits, TokenLogprob, ToolArguments, ToolCall, TopLogprob};

/// The `model` a turn is recorded with when the action does not name one.
pub const EXTERNAL_MODEL: &str = "external";

/// What a well-formed action looks like, for error messages.
pub const ACTION_SHAPE: &str = r#"an action is {"tool_calls": [{"name": <string>, "arguments": <object or JSON text>, "id": <string, optional>}]} or {"content": <string>}, optionally with "step", "logprobs", "raw_logits", "finish_reason" and "model""#;

/// A refused action: the field path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}; {ACTION_SHAPE}")]
pub struct ActionError {
    pub field: String,
    pub message: String,
    /// The action is well formed but names a step other than the
    /// episode's current one (a conflict with its state, not a bad body).
    pub step_mismatch: bool,
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> ActionError {
    ActionError { field: field.into(), message: message.into(), step_mismatch: false }
}

/// Reads an action for plan step `step` (1-based). Tool calls without an
/// `id` get `call_<step-1>_<index>`, the ids a scripted policy gives.
pub fn parse_action(body: &[u8], step: u32) -> Result<PolicyResponse, ActionError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| refuse("body", format!("not valid JSON at line {} column {}: {e}", e.line(), e.column())))?;
    let Value::Object(fields) = value else {
        return Err(refuse("body", format!("is {}, not an object", crate::tools::json_type(&value))));
    };
    const FIELDS: [&str; 7] = ["tool_calls", "content", "logprobs", "raw_logits", "finish_reason", "model", "step"];
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(refuse(unknown.as_str(), "unknown field"));
    }
    match fields.get("step") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => {
            let named = n.as_u64().unwrap_or_default();
            if named != u64::from(step) {
                return Err(ActionError {
                    field: "step".into(),
                    message: format!(
                        "is {named}, but the episode is at step {step}: the action was not played (GET the episode for where it stands)"
                    ),
                    step_mismatch: true,
                });
            }
        }
        Some(other) => return Err(refuse("step", format!("is {other}, not a step number (1 or more)"))),
    }
    let content = optional_string(&fields, "content")?;
    let tool_calls = match fields.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => {
            calls.iter().enumerate().map(|(index, call)| tool_call(call, index, step)).collect::<Result<Vec<_>, _>>()?
        }
        Some(other) => {
            return Err(refuse("tool_calls", format!("is {}, not an array", crate::tools::json_type(other))));
        }
    };
    if tool_calls.is_empty() && content.is_none() {
        return Err(refuse("tool_calls", "no tool calls and no `content`: give one or the other"));
    }
    // Each call's tool message answers it by id: two of one id could not be told apart.
    for (index, call) in tool_calls.iter().enumerate() {
        if let Some(first) = tool_calls[..index].iter().position(|c| c.id == call.id) {
            return Err(refuse(
                format!("tool_calls[{index}].id"),
                format!("{:?} is the id of tool_calls[{first}] too; give each call its own, or leave ids out", call.id),
            ));
        }
    }
    let finish_reason = match optional_string(&fields, "finish_reason")? {
        Some(reason) => FinishReason::parse(&reason),
        None if tool_calls.is_empty() => FinishReason::Stop,
        None => FinishReason::ToolCalls,
    };
    let logprobs = match fields.get("logprobs") {
        None | Some(Value::Null) => None,
        Some(Value::Array(tokens)) => Some(
            tokens
                .iter()
                .enumerate()
                .map(|(i, token)| token_logprob(token, &format!("logprobs[{i}]"), true))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(other) => {
            return Err(refuse("logprobs", format!("is {}, not an array", crate::tools::json_type(other))));
        }
    };
    let raw_logits = match fields.get("raw_logits") {
        None | Some(Value::Null) => None,
        Some(value) => Some(RawLogits::from_json(value, None).map_err(|m| refuse("raw_logits", m))?),
    };
    Ok(PolicyResponse {
        model: optional_string(&fields, "model")?.unwrap_or_else(|| EXTERNAL_MODEL.to_string()),
        content,
        tool_calls,
        finish_reason: Some(finish_reason),
        logprobs,
        raw_logits,
        usage: None,
        latency: Duration::ZERO,
        attempts: 1,
        warnings: Vec::new(),
    })
}

fn optional_string(fields: &Map<String, Value>, field: &str) -> Result<Option<String>, ActionError> {
    match fields.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(refuse(field, format!("is {}, not a string", crate::tools::json_type(other)))),
    }
}

fn tool_call(call: &Value, index: usize, step: u32) -> Result<ToolCall, ActionError> {
    let path = format!("tool_calls[{index}]");
    let Value::Object(fields) = call else {
        return Err(refuse(path, format!("is {}, not an object", crate::tools::json_type(call))));
    };
    if let Some(unknown) = fields.keys().find(|k| !["name", "arguments", "id"].contains(&k.as_str())) {
        return Err(refuse(format!("{path}.{unknown}"), "unknown field"));
    }
    let name = match fields.get("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name.clone(),
        Some(Value::String(_)) => return Err(refuse(format!("{path}.name"), "is empty")),
        Some(other) => {
            return Err(refuse(format!("{path}.name"), format!("is {}, not a string", crate::tools::json_type(other))));
        }
        None => return Err(refuse(format!("{path}.name"), "missing")),
    };
    let id = match fields.get("id") {
        None | Some(Value::Null) => format!("call_{}_{index}", step.saturating_sub(1)),
        Some(Value::String(id)) if !id.trim().is_empty() => id.clone(),
        Some(_) => return Err(refuse(format!("{path}.id"), "must be a non-empty string")),
    };
    let arguments = match fields.get("arguments") {
        None | Some(Value::Null) => ToolArguments::Parsed(Value::Object(Map::new())),
        Some(Value::String(raw)) => ToolArguments::parse(raw),
        Some(value) => ToolArguments::from_value(value.clone(), value.to_string()),
    };
    Ok(ToolCall { id, name, arguments })
}

fn token_logprob(token: &Value, path: &str, with_top: bool) -> Result<TokenLogprob, ActionError> {
    let Value::Object(fields) = token else {
        return Err(refuse(path, format!("is {}, not an object", crate::tools::json_type(token))));
    };
    let text = match fields.get("token") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(refuse(format!("{path}.token"), "missing or not a string")),
    };
    let logprob = match fields.get("logprob").and_then(Value::as_f64) {
        Some(lp) if lp.is_finite() => lp as f32,
        _ => return Err(refuse(format!("{path}.logprob"), "missing or not a finite number")),
    };
    let token_id = match fields.get("token_id") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_i64()
                .and_then(|id| i32::try_from(id).ok())
                .ok_or_else(|| refuse(format!("{path}.token_id"), "not a 32-bit integer"))?,
        ),
    };
    let top = match fields.get("top_logprobs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(top)) if with_top => top
            .iter()
            .enumerate()
            .map(|(i, t)| {
                token_logprob(t, &format!("{path}.top_logprobs[{i}]"), false).map(|t| TopLogprob {
                    token: t.token,
                    token_id: t.token_id,
                    logprob: t.logprob,
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(refuse(format!("{path}.top_logprobs"), "not an array of tokens")),
    };
    Ok(TokenLogprob { token: text, token_id, logprob, top, entropy: None, kl: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_call_action_reads_as_the_scripted_policy_would_answer() {
        let response =
            parse_action(br#"{"tool_calls": [{"name": "track", "arguments": {"order_id": "1"}}]}"#, 2).unwrap();
        assert_eq!(response.tool_calls[0].id, "call_1_0");
        assert_eq!(response.tool_calls[0].arguments.as_value(), Some(&serde_json::json!({"order_id": "1"})));
        assert_eq!(response.finish_reason, Some(FinishReason::ToolCalls));
        assert!(response.logprobs_missing());
        let answer = parse_action(br#"{"content": "done"}"#, 3).unwrap();
        assert!(answer.is_final());
        assert_eq!(answer.content.as_deref(), Some("done"));
    }

    #[test]
    fn invalid_argument_text_is_kept_for_the_executor_to_refuse() {
        let response = parse_action(br#"{"tool_calls": [{"name": "t", "arguments": "{\"a\": "}]}"#, 1).unwrap();
        assert_eq!(response.tool_calls[0].arguments.invalid().map(|i| i.error_type), Some("invalid_json"));
    }

    #[test]
    fn raw_logits_ride_along_with_an_action() {
        let body =
            br#"{"content": "ok", "raw_logits": {"safetensors_base64": "AAEC", "reference": "q", "token_ids": [4]}}"#;
        let raw = parse_action(body, 2).unwrap().raw_logits.expect("raw logits");
        assert_eq!(raw.source, crate::policy::RawLogitsSource::Inline(vec![0u8, 1, 2].into()));
        assert_eq!((raw.reference.as_deref(), raw.token_ids), (Some("q"), Some(vec![4])));
    }

    #[test]
    fn a_step_other_than_the_current_one_is_a_mismatch_not_a_bad_body() {
        assert!(parse_action(br#"{"content": "x", "step": 3}"#, 3).is_ok());
        let err = parse_action(br#"{"content": "x", "step": 2}"#, 3).unwrap_err();
        assert!(err.step_mismatch, "{err}");
        assert!(err.message.starts_with("is 2, but the episode is at step 3"), "{err}");
    }

    #[test]
    fn structural_problems_name_the_field() {
        for (body, field) in [
            (r#"{"tool_calls": [{"arguments": {}}]}"#, "tool_calls[0].name: missing"),
            (r#"{"tool_calls": [{"name": 3}]}"#, "tool_calls[0].name: is a number"),
            (r#"{"tool_calls": {"name": "x"}}"#, "tool_calls: is an object, not an array"),
            (r#"{"tool_calls": [{"name": "x", "args": {}}]}"#, "tool_calls[0].args: unknown field"),
            (r#"{"content": 1}"#, "content: is a number"),
            (r#"{"answer": "x"}"#, "answer: unknown field"),
            (r#"{}"#, "tool_calls: no tool calls and no `content`"),
            (r#"[1]"#, "body: is an array"),
            (r#"{"content": "x", "logprobs": [{"token": "a"}]}"#, "logprobs[0].logprob: missing"),
            (
                r#"{"content": "x", "raw_logits": {"path": "rel.safetensors"}}"#,
                "raw_logits: path \"rel.safetensors\" is relative",
            ),
            (r#"{"content": "x", "raw_logits": {"path": "/a", "tensr": "l"}}"#, "raw_logits: unknown field `tensr`"),
            ("{\"content\": ", "body: not valid JSON at line 1 column 12"),
            (r#"{"content": "x", "step": "1"}"#, "step: is \"1\", not a step number"),
            (r#"{"content": "x", "step": 0}"#, "step: is 0, not a step number"),
            (
                r#"{"tool_calls": [{"name": "a", "id": "c"}, {"name": "b", "id": "c"}]}"#,
                "tool_calls[1].id: \"c\" is the id of tool_calls[0] too",
            ),
        ] {
            let err = parse_action(body.as_bytes(), 1).unwrap_err().to_string();
            assert!(err.starts_with(field), "{body}: {err}");
        }
    }
}
