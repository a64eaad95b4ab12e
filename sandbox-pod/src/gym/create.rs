//! The body of `POST /v1/episodes`: a row of the task's test set by id, or
//! an episode given inline in the test-set row format (`messages` or
//! `instruction`, `initial_memory`, `expected_tool_calls`, …), checked by
//! the same parser as a test-set file so the rules and messages are the same.

use std::collections::BTreeMap;

use basecamp_api::TestSet;
use serde_json::{Map, Value};

use crate::config::episode_input;
use crate::episode::EpisodeInput;

/// The ad hoc episode fields: a test-set row's, less its `id`.
pub const INLINE_FIELDS: [&str; 7] = [
    "messages",
    "instruction",
    "initial_memory",
    "expected_tool_calls",
    "expected_memory",
    "expected_memory_hash",
    "expected_outputs",
];

/// A create request, read.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    /// The id the client chose, if it chose one.
    pub episode_id: Option<String>,
    pub source: Source,
}

#[derive(Debug, Clone)]
pub enum Source {
    /// A row of the task's test set, by its `id`.
    Row(String),
    /// The fields of a test-set row, given inline.
    Inline(Map<String, Value>),
}

/// A refused create body: the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct CreateError {
    pub field: String,
    pub message: String,
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> CreateError {
    CreateError { field: field.into(), message: message.into() }
}

/// Reads the body; `{}`-less bodies and unknown fields are refused.
pub fn parse_create(body: &[u8]) -> Result<CreateRequest, CreateError> {
    let value: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        serde_json::from_slice(body)
            .map_err(|e| refuse("body", format!("not valid JSON at line {} column {}: {e}", e.line(), e.column())))?
    };
    let Value::Object(mut fields) = value else {
        return Err(refuse("body", format!("is {}, not an object", crate::tools::json_type(&value))));
    };
    if let Some(unknown) =
        fields.keys().find(|k| !INLINE_FIELDS.contains(&k.as_str()) && !["row_id", "episode_id"].contains(&k.as_str()))
    {
        return Err(refuse(
            unknown.as_str(),
            format!(
                "unknown field; give `row_id` (a row of the task's test set) or the row's fields inline ({}), and optionally `episode_id`",
                INLINE_FIELDS.join(", ")
            ),
        ));
    }
    let episode_id = match fields.remove("episode_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id),
        Some(other) => {
            return Err(refuse("episode_id", format!("is {}, not a string", crate::tools::json_type(&other))));
        }
    };
    let source = match fields.remove("row_id") {
        None | Some(Value::Null) => {
            if !fields.contains_key("messages") && !fields.contains_key("instruction") {
                return Err(refuse(
                    "row_id",
                    "missing: give `row_id` (a row of the task's test set), or `messages` or `instruction` for an episode of your own",
                ));
            }
            Source::Inline(fields)
        }
        Some(row) => {
            let row = match row {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                other => {
                    return Err(refuse("row_id", format!("is {}, not a string", crate::tools::json_type(&other))));
                }
            };
            if let Some(extra) = fields.keys().next() {
                return Err(refuse(extra.as_str(), "give either `row_id` or the episode's fields inline, not both"));
            }
            Source::Row(row)
        }
    };
    Ok(CreateRequest { episode_id, source })
}

/// The inline fields as an episode, checked as a one-row test set.
pub fn inline_input(
    id: &str,
    mut fields: Map<String, Value>,
    compare_args: &BTreeMap<String, Vec<String>>,
) -> Result<EpisodeInput, CreateError> {
    fields.insert("id".into(), Value::String(id.to_string()));
    let line = Value::Object(fields).to_string();
    let set = TestSet::parse("request", &line).map_err(|errors| {
        let first = errors.0.first().map(|e| e.to_problem().message).unwrap_or_else(|| errors.to_string());
        match first.split_once(": ") {
            Some((field, message)) if !field.contains(' ') => refuse(field, message),
            _ => refuse("body", first),
        }
    })?;
    let row = set.episodes.first().ok_or_else(|| refuse("body", "holds no episode"))?;
    // Of no test set: a replay has no row to start it from.
    let input = episode_input(row, compare_args).map_err(|e| match e.split_once(": ") {
        Some((field, message)) => refuse(field, message),
        None => refuse("body", e),
    })?;
    Ok(EpisodeInput { row_id: None, ..input })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_id_or_inline_fields_but_not_both() {
        assert!(matches!(parse_create(br#"{"row_id": "a"}"#).unwrap().source, Source::Row(r) if r == "a"));
        let inline = parse_create(br#"{"instruction": "hi", "episode_id": "e"}"#).unwrap();
        assert_eq!(inline.episode_id.as_deref(), Some("e"));
        assert!(matches!(inline.source, Source::Inline(_)));
        let both = parse_create(br#"{"row_id": "a", "instruction": "hi"}"#).unwrap_err();
        assert_eq!(both.field, "instruction");
        assert_eq!(parse_create(b"").unwrap_err().field, "row_id");
        assert_eq!(parse_create(br#"{"rowid": "a"}"#).unwrap_err().field, "rowid");
    }

    #[test]
    fn inline_fields_are_checked_like_a_test_set_row() {
        let Source::Inline(fields) =
            parse_create(br#"{"instruction": "hi", "expected_tool_calls": [{"arguments": {}}]}"#).unwrap().source
        else {
            panic!("inline")
        };
        let err = inline_input("e", fields, &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("expected_tool_calls[0]"), "{err}");
        let Source::Inline(fields) =
            parse_create(br#"{"instruction": "hi", "initial_memory": {"k": 1}}"#).unwrap().source
        else {
            panic!("inline")
        };
        let input = inline_input("e", fields, &BTreeMap::new()).unwrap();
        assert_eq!(input.id, "e");
        assert_eq!(input.initial_memory["k"], 1);
    }
}
