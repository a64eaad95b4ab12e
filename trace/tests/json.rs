//! `write_trace_json` (what `basecamp trace parse` prints): the text of
//! `TraceJson` over the whole trace in memory, for whole, cut and corrupted
//! traces, and a trace that changes between its two reads.

use basecamp_trace::json::{TraceJson, WriteJsonError, write_trace_json};
use basecamp_trace::synthetic::{EpisodeShape, generate};
use basecamp_trace::{TraceError, TraceReader, read_trace_from};

fn trace() -> Vec<u8> {
    generate(&EpisodeShape { seed: 4, steps: 8, tokens_per_step: 4, ..Default::default() })
        .write_to(Vec::new(), 3)
        .unwrap()
}

/// What `TraceJson` writes for `bytes` held whole, pretty or compact.
fn held(bytes: &[u8], pretty: bool) -> String {
    let trace = read_trace_from(bytes, "t.trace").unwrap();
    let doc = TraceJson { file: "t.trace", trace: &trace };
    if pretty { serde_json::to_string_pretty(&doc).unwrap() } else { serde_json::to_string(&doc).unwrap() }
}

fn streamed(bytes: &[u8], pretty: bool) -> (String, Option<String>) {
    let mut out = Vec::new();
    let ending = write_trace_json(|| TraceReader::new(bytes, "t.trace"), "t.trace", &mut out, pretty).unwrap();
    (String::from_utf8(out).unwrap(), ending.damage.map(|e| e.to_string()))
}

#[test]
fn the_streamed_text_is_the_held_text_for_whole_cut_and_corrupted_traces() {
    let whole = trace();
    let mut corrupted = whole.clone();
    let middle = corrupted.len() / 2;
    corrupted[middle] ^= 0x5a;
    let cuts = [whole.len(), whole.len() - 1, whole.len() * 3 / 4, whole.len() / 3];
    let inputs = cuts.iter().map(|&n| whole[..n].to_vec()).chain([corrupted]);
    for (i, bytes) in inputs.enumerate() {
        for pretty in [true, false] {
            let (text, damage) = streamed(&bytes, pretty);
            assert_eq!(text, held(&bytes, pretty), "input {i}, pretty {pretty}");
            let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(doc["complete"], serde_json::json!(i == 0), "input {i}");
            assert_eq!(damage.is_none(), i == 0, "input {i}: {damage:?}");
            if let Some(message) = damage {
                assert_eq!(doc["damage"]["message"], serde_json::json!(message));
            }
        }
    }
}

/// A live pod's trace grows between the reads: the document is the trace
/// as the first read found it, its records and its (truncated) end agreeing.
#[test]
fn a_trace_that_grows_between_the_reads_is_shown_as_the_first_read_found_it() {
    let whole = trace();
    let cut = &whole[..whole.len() / 2];
    let mut reads = [cut, whole.as_slice()].into_iter();
    let mut out = Vec::new();
    let ending =
        write_trace_json(|| TraceReader::new(reads.next().unwrap(), "t.trace"), "t.trace", &mut out, true).unwrap();
    assert!(ending.damage.unwrap().to_string().contains("truncated"));
    assert_eq!(String::from_utf8(out).unwrap(), held(cut, true));
}

#[test]
fn a_trace_that_shrinks_between_the_reads_is_an_error_naming_both_counts() {
    let whole = trace();
    let counted = read_trace_from(whole.as_slice(), "t.trace").unwrap().records.len();
    let cut = &whole[..whole.len() / 2];
    let read = read_trace_from(cut, "t.trace").unwrap().records.len();
    let mut reads = [whole.as_slice(), cut].into_iter();
    let err = write_trace_json(|| TraceReader::new(reads.next().unwrap(), "t.trace"), "t.trace", Vec::new(), false)
        .unwrap_err();
    assert!(matches!(err, WriteJsonError::Changed { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "t.trace changed while it was read: the first read found {counted} records, the second stopped after {read}: t.trace: truncated at byte"
        )),
        "{message}"
    );
}

#[test]
fn a_file_that_is_not_a_trace_is_the_readers_error() {
    let err = write_trace_json(|| TraceReader::new(&b"not a trace at all"[..], "x.trace"), "x.trace", Vec::new(), true)
        .unwrap_err();
    assert_eq!(err.to_string(), "x.trace: not a basecamp trace (bad magic at byte 0)");
}

/// `bytes` with the frame before the index (the episode end's, which
/// `finish` writes on its own after `end_step`) taken out, and the
/// trailer's index offset moved to match: a trace that reads to its
/// trailer but never ended its episode.
fn without_end_frame(bytes: &[u8]) -> Vec<u8> {
    use basecamp_trace::format::{FRAME_HEADER_LEN, FrameHeader, PREAMBLE_LEN, TRAILER_LEN};
    let mut frames = Vec::new();
    let mut at = PREAMBLE_LEN;
    while at + TRAILER_LEN < bytes.len() {
        let h = FrameHeader::decode(bytes[at..at + FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        let end = at + FRAME_HEADER_LEN + h.compressed_len as usize;
        frames.push(at..end);
        at = end;
    }
    let end_frame = frames[frames.len() - 2].clone();
    let index_at = (frames[frames.len() - 1].start - end_frame.len()) as u64;
    let mut out = [&bytes[..end_frame.start], &bytes[end_frame.end..bytes.len() - TRAILER_LEN]].concat();
    out.extend_from_slice(&index_at.to_le_bytes());
    out.extend_from_slice(&bytes[bytes.len() - 8..]);
    out
}

#[test]
fn a_trace_without_an_episode_end_is_not_complete() {
    // `trace parse` said "complete": true, "damage": null for a trace that
    // reads to its trailer but holds no episode end, which validate reports.
    let header = basecamp_trace::pb::Header { episode_id: "ep".into(), ..Default::default() };
    let mut w = basecamp_trace::TraceWriter::new(Vec::new(), header, 3).unwrap();
    w.append(1, basecamp_trace::pb::record::Body::PlanStep(Box::default())).unwrap();
    w.end_step().unwrap();
    let whole = w.finish(basecamp_trace::pb::EpisodeEnd { outcome: 1, ..Default::default() }).unwrap();
    let unended = without_end_frame(&whole);
    let trace = read_trace_from(unended.as_slice(), "t.trace").unwrap();
    assert!(matches!(trace.damage(), Some(TraceError::NoEpisodeEnd { .. })), "{:?}", trace.tail);
    assert_eq!(trace.records.len(), 1, "the file reads to its trailer: every record is there");
    for (bytes, complete) in [(&whole, true), (&unended, false)] {
        let mut out = Vec::new();
        let ending = write_trace_json(|| TraceReader::new(&bytes[..], "t.trace"), "t.trace", &mut out, false).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(doc["complete"], complete);
        assert_eq!(ending.is_complete(), complete);
        let category = if complete { serde_json::Value::Null } else { "TraceNoEpisodeEnd".into() };
        assert_eq!(doc["damage"]["category"], category);
        assert_eq!(String::from_utf8(out).unwrap(), held(bytes, false));
    }
}
