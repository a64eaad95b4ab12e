//! A trace as one JSON document, for `basecamp trace parse --output json`
//! and for anything that wants to read traces without protobuf.
//!
//! Records use the proto3 JSON mapping (camelCase names, enums by name,
//! 64-bit integers and `bytes` as strings: bytes in base64).

use std::cell::RefCell;
use std::io::{Read, Write};

use serde::ser::{Error as _, Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Value, json};

use crate::TraceError;
use crate::pb::{Header, Record, record::Body};
use crate::reader::{Tail, TraceContents, TraceReader};

/// `{"complete", "damage", "file", "header", "records": [...]}`, written as
/// it is serialized: one record's JSON at a time, never the whole document
/// as a [`Value`] (which took about 100 times the trace's decoded size: 2.1
/// GB for a 2,000-step episode). Keys come in the sorted order of a
/// [`Value`] object, so the text equals that of [`trace_to_json`].
/// [`write_trace_json`] writes the same text without holding the trace.
pub struct TraceJson<'a> {
    pub file: &'a str,
    pub trace: &'a TraceContents,
}

impl Serialize for TraceJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let records = Records(&self.trace.records);
        document(serializer, self.file, &self.trace.header, self.trace.damage(), &records)
    }
}

/// The document's five keys, in sorted order, around `records`.
/// `"complete"` is true only for a trace read to its end with nothing
/// wrong: an index and trailer after the last step do not make an episode
/// that never ended complete (the reader reports
/// [`TraceError::NoEpisodeEnd`] as its damage).
fn document<S: Serializer>(
    serializer: S,
    file: &str,
    header: &Header,
    damage: Option<&TraceError>,
    records: &impl Serialize,
) -> Result<S::Ok, S::Error> {
    let damage_value = damage.map_or(Value::Null, |e| json!({ "category": e.category(), "message": e.to_string() }));
    let header = serde_json::to_value(header).unwrap_or_else(|e| json!({ "unshowable": e.to_string() }));
    let mut map = serializer.serialize_map(Some(5))?;
    map.serialize_entry("complete", &damage.is_none())?;
    map.serialize_entry("damage", &damage_value)?;
    map.serialize_entry("file", file)?;
    map.serialize_entry("header", &header)?;
    map.serialize_entry("records", records)?;
    map.end()
}

/// The records as a JSON array, each converted when it is written.
struct Records<'a>(&'a [Record]);

impl Serialize for Records<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(record_to_json))
    }
}

/// Why [`write_trace_json`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum WriteJsonError {
    /// Not even the header could be read.
    #[error(transparent)]
    Open(#[from] TraceError),
    /// The second read did not give the records the first one counted: the
    /// file was replaced or damaged in between. What was written so far
    /// stands; the document is unfinished.
    #[error(
        "{file} changed while it was read: the first read found {counted} records, the second {}",
        match .cause { Some(e) => format!("stopped after {read}: {e}"), None => format!("ended after {read}") }
    )]
    Changed { file: String, counted: u64, read: u64, cause: Option<TraceError> },
    #[error("writing the JSON: {0}")]
    Write(#[source] serde_json::Error),
}

/// Writes the text [`TraceJson`] writes for the trace `open` reads, without
/// holding the trace: memory is that of one record, however long the
/// episode. The document names how the trace ended before its records, so
/// the trace is read twice through `open` (a reader of the same trace each
/// time): the first read decodes every record to learn how many are
/// readable and how the file ends, the second writes them. A trace still
/// being written (a live pod's) is shown as the first read found it.
/// Returns how the trace ended (a damaged trace is a document, not an error).
pub fn write_trace_json<R: Read>(
    mut open: impl FnMut() -> Result<TraceReader<R>, TraceError>,
    file: &str,
    out: impl Write,
    pretty: bool,
) -> Result<TraceEnding, WriteJsonError> {
    let mut first = open()?;
    let counted = first.by_ref().map_while(Result::ok).count() as u64;
    let damage = match first.tail() {
        Some(Tail::Damaged(e)) => Some(e.clone()),
        Some(Tail::Complete) | None => None,
    };
    let second = open()?;
    let header = second.header().clone();
    let records = Streamed { reader: RefCell::new(second), counted, stopped: RefCell::new(None) };
    let doc = StreamedDocument { file, header: &header, damage: damage.as_ref(), records: &records };
    let written = if pretty { serde_json::to_writer_pretty(out, &doc) } else { serde_json::to_writer(out, &doc) };
    if let Some((read, cause)) = records.stopped.into_inner() {
        return Err(WriteJsonError::Changed { file: file.to_string(), counted, read, cause });
    }
    written.map_err(WriteJsonError::Write)?;
    Ok(TraceEnding { damage })
}

/// How a trace written by [`write_trace_json`] ended.
#[derive(Debug, Clone)]
pub struct TraceEnding {
    /// What cut the file short or broke it, or that it reads to its trailer
    /// without an episode end ([`TraceError::NoEpisodeEnd`]); `None` when
    /// the trace is complete.
    pub damage: Option<TraceError>,
}

impl TraceEnding {
    /// Nothing wrong: the document's `"complete"`.
    pub fn is_complete(&self) -> bool {
        self.damage.is_none()
    }
}

struct StreamedDocument<'a, R> {
    file: &'a str,
    header: &'a Header,
    damage: Option<&'a TraceError>,
    records: &'a Streamed<R>,
}

impl<R: Read> Serialize for StreamedDocument<'_, R> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        document(serializer, self.file, self.header, self.damage, self.records)
    }
}

/// The first `counted` records of `reader`, decoded one at a time as the
/// array is written; `stopped`: (records read, why) when fewer were there.
struct Streamed<R> {
    reader: RefCell<TraceReader<R>>,
    counted: u64,
    stopped: RefCell<Option<(u64, Option<TraceError>)>>,
}

impl<R: Read> Serialize for Streamed<R> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut reader = self.reader.borrow_mut();
        let mut seq = serializer.serialize_seq(None)?;
        for read in 0..self.counted {
            match reader.next() {
                Some(Ok(record)) => seq.serialize_element(&record_to_json(&record))?,
                other => {
                    *self.stopped.borrow_mut() = Some((read, other.and_then(Result::err)));
                    return Err(S::Error::custom("the trace changed while it was read"));
                }
            }
        }
        seq.end()
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
    let mut value =
        serde_json::to_value(record).unwrap_or_else(|e| json!({ "step": record.step, "unshowable": e.to_string() }));
    restore_non_finite(record, &mut value);
    value
}

/// serde_json writes a float JSON cannot hold (NaN, ±infinity) as `null`;
/// the proto3 JSON mapping writes it as the text "NaN", "Infinity" or
/// "-Infinity", so the three stay apart. Put back where the record has one
/// (its float fields: rewards, token logprobs).
fn restore_non_finite(record: &Record, value: &mut Value) {
    let mut set = |pointer: String, v: f64| {
        if v.is_finite() {
            return;
        }
        let text = if v.is_nan() {
            "NaN"
        } else if v > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        };
        if let Some(slot) = value.pointer_mut(&pointer) {
            *slot = Value::String(text.into());
        }
    };
    match &record.body {
        Some(Body::RewardSignal(r)) => {
            set("/rewardSignal/weightedSum".into(), r.weighted_sum);
            for (i, c) in r.components.iter().enumerate() {
                set(format!("/rewardSignal/components/{i}/score"), c.score);
                set(format!("/rewardSignal/components/{i}/weight"), c.weight);
            }
            for (i, d) in r.weight_deltas.iter().enumerate() {
                set(format!("/rewardSignal/weightDeltas/{i}/oldWeight"), d.old_weight);
                set(format!("/rewardSignal/weightDeltas/{i}/newWeight"), d.new_weight);
            }
        }
        Some(Body::TokenLogit(t)) => {
            set("/tokenLogit/logprob".into(), f64::from(t.logprob));
            for (i, lp) in t.top_logprobs.iter().enumerate() {
                set(format!("/tokenLogit/topLogprobs/{i}"), f64::from(*lp));
            }
            if let Some(entropy) = t.entropy {
                set("/tokenLogit/entropy".into(), f64::from(entropy));
            }
            if let Some(kl) = t.kl {
                set("/tokenLogit/kl".into(), f64::from(kl));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TraceError;
    use crate::pb::{Header, PlanStep, RewardComponent, RewardSignal, TokenLogit};

    fn contents(tail: Tail) -> TraceContents {
        let records = vec![
            Record {
                step: 0,
                body: Some(Body::PlanStep(Box::new(PlanStep { tool: "search".into(), ..Default::default() }))),
            },
            // An enum value this reader has no name for: shown as unshowable.
            Record { step: 1, body: Some(Body::PlanStep(Box::new(PlanStep { status: 42, ..Default::default() }))) },
            Record { step: 1, body: Some(Body::EpisodeEnd(crate::pb::EpisodeEnd::default())) },
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

    #[test]
    fn a_float_json_cannot_hold_is_the_proto3_text_not_null() {
        let reward = Record {
            step: 2,
            body: Some(Body::RewardSignal(RewardSignal {
                components: vec![RewardComponent { name: "c".into(), score: f64::NAN, weight: f64::INFINITY }],
                weighted_sum: f64::NEG_INFINITY,
                weight_deltas: vec![],
            })),
        };
        // Before: null, null, null — which of the three was lost.
        let json = record_to_json(&reward);
        assert_eq!(json["rewardSignal"]["components"][0]["score"], "NaN");
        assert_eq!(json["rewardSignal"]["components"][0]["weight"], "Infinity");
        assert_eq!(json["rewardSignal"]["weightedSum"], "-Infinity");
        let token = Record {
            step: 1,
            body: Some(Body::TokenLogit(TokenLogit {
                token: "a".into(),
                logprob: -0.5,
                top_logprobs: [-0.5, f32::NEG_INFINITY].into_iter().collect(),
                kl: Some(f32::INFINITY),
                ..Default::default()
            })),
        };
        let json = record_to_json(&token);
        assert_eq!(json["tokenLogit"]["logprob"], -0.5);
        assert_eq!(json["tokenLogit"]["topLogprobs"], json!([-0.5, "-Infinity"]));
        assert_eq!(json["tokenLogit"]["kl"], "Infinity");
    }
}
