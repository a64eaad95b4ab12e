//! A trace as one JSON document, for `basecamp trace parse --output json`
//! and for anything that wants to read traces without protobuf.
//!
//! Records use the proto3 JSON mapping (camelCase names, enums by name,
//! 64-bit integers and `bytes` as strings: bytes in base64).

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Value, json};

use crate::pb::Record;
use crate::reader::{Tail, TraceContents};

/// `{"complete", "damage", "file", "header", "records": [...]}`, written as
/// it is serialized: one record's JSON at a time, never the whole document
/// as a [`Value`] (which took about 100 times the trace's decoded size: 2.1
/// GB for a 2,000-step episode). Keys come in the sorted order of a
/// [`Value`] object, so the text equals that of [`trace_to_json`].
pub struct TraceJson<'a> {
    pub file: &'a str,
    pub trace: &'a TraceContents,
}

impl Serialize for TraceJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let damage = match &self.trace.tail {
            Tail::Complete => Value::Null,
            Tail::Damaged(e) => json!({ "category": e.category(), "message": e.to_string() }),
        };
        let header =
            serde_json::to_value(&self.trace.header).unwrap_or_else(|e| json!({ "unshowable": e.to_string() }));
        let mut map = serializer.serialize_map(Some(5))?;
        map.serialize_entry("complete", &matches!(self.trace.tail, Tail::Complete))?;
        map.serialize_entry("damage", &damage)?;
        map.serialize_entry("file", self.file)?;
        map.serialize_entry("header", &header)?;
        map.serialize_entry("records", &Records(&self.trace.records))?;
        map.end()
    }
}

/// The records as a JSON array, each converted when it is written.
struct Records<'a>(&'a [Record]);

impl Serialize for Records<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(record_to_json))
    }
}

/// The whole document as a [`Value`]; [`TraceJson`] writes the same text
/// without holding it.
pub fn trace_to_json(file: &str, trace: &TraceContents) -> Value {
    serde_json::to_value(TraceJson { file, trace }).expect("a document of Values always serializes")
}

/// A record in the proto3 JSON mapping. A record the mapping cannot show (an
/// enum value from a newer writer) becomes `{"step", "unshowable": reason}`
/// rather than failing the whole document.
pub fn record_to_json(record: &Record) -> Value {
    serde_json::to_value(record).unwrap_or_else(|e| json!({ "step": record.step, "unshowable": e.to_string() }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TraceError;
    use crate::pb::{Header, PlanStep, record::Body};

    fn contents(tail: Tail) -> TraceContents {
        let records = vec![
            Record {
                step: 0,
                body: Some(Body::PlanStep(Box::new(PlanStep { tool: "search".into(), ..Default::default() }))),
            },
            // An enum value this reader has no name for: shown as unshowable.
            Record { step: 1, body: Some(Body::PlanStep(Box::new(PlanStep { status: 42, ..Default::default() }))) },
        ];
        TraceContents { header: Header { task: "t".into(), ..Default::default() }, records, tail }
    }

    /// The streamed text is the text of the old whole-document Value (sorted
    /// keys), complete or damaged, compact or pretty.
    #[test]
    fn the_streamed_document_is_the_text_of_the_value_document() {
        let damaged = TraceError::Corrupt { file: "x.trace".into(), offset: 7, reason: "bad crc".into() };
        for trace in [contents(Tail::Complete), contents(Tail::Damaged(damaged))] {
            let file = "dir/x.trace";
            let mut keys: Vec<&str> = vec!["file", "complete", "damage", "header", "records"];
            keys.sort_unstable();
            let value = json!({
                "file": file,
                "complete": matches!(trace.tail, Tail::Complete),
                "damage": match &trace.tail {
                    Tail::Complete => Value::Null,
                    Tail::Damaged(e) => json!({ "category": e.category(), "message": e.to_string() }),
                },
                "header": serde_json::to_value(&trace.header).unwrap(),
                "records": trace.records.iter().map(record_to_json).collect::<Vec<_>>(),
            });
            assert_eq!(value.as_object().unwrap().keys().map(String::as_str).collect::<Vec<_>>(), keys);
            let streamed = TraceJson { file, trace: &trace };
            assert_eq!(serde_json::to_string_pretty(&streamed).unwrap(), serde_json::to_string_pretty(&value).unwrap());
            assert_eq!(serde_json::to_string(&streamed).unwrap(), value.to_string());
            assert_eq!(trace_to_json(file, &trace), value);
            assert!(value["records"][1]["unshowable"].as_str().unwrap().contains("42"));
        }
    }
}
