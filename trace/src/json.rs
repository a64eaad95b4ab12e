//! A trace as one JSON document, for `basecamp trace parse --output json`
//! and for anything that wants to read traces without protobuf.
//!
//! Records use the proto3 JSON mapping (camelCase names, enums by name,
//! 64-bit integers and `bytes` as strings: bytes in base64).

use serde_json::{Value, json};

use crate::pb::Record;
use crate::reader::{Tail, TraceContents};

/// `{"file", "complete", "damage", "header", "records": [...]}`.
pub fn trace_to_json(file: &str, trace: &TraceContents) -> Value {
    let damage = match &trace.tail {
        Tail::Complete => Value::Null,
        Tail::Damaged(e) => json!({ "category": e.category(), "message": e.to_string() }),
    };
    json!({
        "file": file,
        "complete": matches!(trace.tail, Tail::Complete),
        "damage": damage,
        "header": serde_json::to_value(&trace.header).unwrap_or_else(|e| json!({ "unshowable": e.to_string() })),
        "records": trace.records.iter().map(record_to_json).collect::<Vec<_>>(),
    })
}

/// A record in the proto3 JSON mapping. A record the mapping cannot show (an
/// enum value from a newer writer) becomes `{"step", "unshowable": reason}`
/// rather than failing the whole document.
pub fn record_to_json(record: &Record) -> Value {
    serde_json::to_value(record).unwrap_or_else(|e| json!({ "step": record.step, "unshowable": e.to_string() }))
}
