//! Damaged files: truncation at every byte, a bit flip in every byte, and
//! the exact one-line message for each kind of damage a user will meet.
//!
//! The rules: the reader never panics; it either refuses the file with one
//! line naming the file (and the byte where that applies) or returns a
//! prefix of the records the writer wrote, with the damage as its tail.
//!
//! The sweeps run over the version-1 golden file and over a version-2 file
//! written today (token logits in frames of their own, record-kind masks),
//! which search also reads with frame skipping.

use std::io::Cursor;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use basecamp_trace::format::{self, FRAME_HEADER_LEN, FrameHeader, FrameKind, PREAMBLE_LEN, TRAILER_LEN};
use basecamp_trace::pb::Record;
use basecamp_trace::query::Query;
use basecamp_trace::synthetic::{EpisodeShape, generate};
use basecamp_trace::{IndexedTrace, Tail, TraceContents, TraceError, TraceReader, read_trace, read_trace_from};

const NAME: &str = "episode-v1.trace";

fn golden(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Today's writer (format version 2), the golden episode's shape.
fn written_today() -> Vec<u8> {
    let shape = EpisodeShape { steps: 3, tokens_per_step: 4, memory_keys: 6, ..Default::default() };
    generate(&shape).write_to(Vec::new(), 3).expect("writing to a Vec cannot fail")
}

/// Both layouts the sweeps cover.
fn sweep_inputs() -> [(&'static str, Vec<u8>); 2] {
    [("v1 golden", golden(NAME)), ("v2 written today", written_today())]
}

/// A query that names no token_logit, so search skips the token frames.
fn skipping_query() -> Query {
    Query::parse(r#"plan_execution.status == "ok" or exists(reward_signal)"#).unwrap()
}

fn full_trace(bytes: &[u8]) -> TraceContents {
    let trace = read_trace_from(bytes, NAME).unwrap();
    assert!(matches!(trace.tail, Tail::Complete), "{:?}", trace.tail);
    trace
}

/// A frame of the file: where it starts, its decoded header.
struct FrameAt {
    offset: usize,
    header: FrameHeader,
}

impl FrameAt {
    fn payload_start(&self) -> usize {
        self.offset + FRAME_HEADER_LEN
    }

    fn end(&self) -> usize {
        self.payload_start() + self.header.compressed_len as usize
    }
}

/// Walks the frames of an undamaged file.
fn frames(bytes: &[u8]) -> Vec<FrameAt> {
    let mut out = Vec::new();
    let mut at = PREAMBLE_LEN;
    loop {
        let header = FrameHeader::decode(bytes[at..at + FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        let frame = FrameAt { offset: at, header };
        at = frame.end();
        let kind = frame.header.kind;
        out.push(frame);
        if kind == FrameKind::Index {
            assert_eq!(at + TRAILER_LEN, bytes.len(), "the trailer ends the file");
            return out;
        }
    }
}

/// Runs `read` on `bytes`, turning a panic into a test failure that names `what`.
fn no_panic<T>(what: &str, read: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(read)).unwrap_or_else(|_| panic!("the reader panicked on {what}"))
}

fn assert_one_line_naming_the_file(err: &TraceError, what: &str) {
    let message = err.to_string();
    assert!(message.starts_with(&format!("{NAME}: ")), "{what}: message does not name the file: {message}");
    assert!(!message.contains('\n'), "{what}: message is more than one line: {message}");
}

fn assert_prefix(recovered: &[Record], full: &[Record], what: &str) {
    assert!(recovered.len() <= full.len(), "{what}: more records than were written");
    assert_eq!(
        recovered,
        &full[..recovered.len()],
        "{what}: the recovered records are not a prefix of the written ones"
    );
}

/// Every step the indexed reader offers reads back as a prefix of that
/// step's records in the undamaged file, or fails cleanly.
fn check_indexed(bytes: &[u8], full: &TraceContents, what: &str) {
    let Ok(mut indexed) = no_panic(what, || IndexedTrace::new(Cursor::new(bytes), NAME)) else {
        return;
    };
    let steps: Vec<u32> = indexed.steps().collect();
    for step in steps {
        let want: Vec<Record> = full.records.iter().filter(|r| r.step == step).cloned().collect();
        match no_panic(what, || indexed.read_step(step)) {
            Ok(mut got) => {
                if step == 0 {
                    let first = got.remove(0);
                    assert!(
                        matches!(first.body, Some(basecamp_trace::pb::record::Body::Header(_))),
                        "{what}: step 0 does not start with the header"
                    );
                }
                assert_prefix(&got, &want, &format!("{what}, step {step}"));
            }
            Err(e) => assert_one_line_naming_the_file(&e, what),
        }
    }
}

#[test]
fn truncation_at_every_byte_recovers_a_prefix() {
    for (layout, bytes) in sweep_inputs() {
        truncation_sweep(layout, &bytes);
    }
}

fn truncation_sweep(layout: &str, bytes: &[u8]) {
    let full = full_trace(bytes);
    let mut last_recovered = 0;
    for cut in 0..bytes.len() {
        let what = format!("{layout}: a cut at byte {cut} of {}", bytes.len());
        match no_panic(&what, || read_trace_from(&bytes[..cut], NAME)) {
            Err(e) => {
                assert_one_line_naming_the_file(&e, &what);
                // Only a file too short to hold its header is refused.
                let header_end = frames(bytes)[0].end();
                assert!(cut < header_end, "{what}: refused although the header is complete: {e}");
                let expected = if cut == 0 { "TraceEmpty" } else { "TraceTruncated" };
                assert_eq!(e.category(), expected, "{what}: {e}");
            }
            Ok(trace) => {
                assert_eq!(trace.header, full.header, "{what}");
                assert_prefix(&trace.records, &full.records, &what);
                assert!(trace.records.len() >= last_recovered, "{what}: a longer file recovered fewer records");
                last_recovered = trace.records.len();
                let Tail::Damaged(err) = &trace.tail else { panic!("{what}: read as complete") };
                assert!(matches!(err, TraceError::Truncated { .. }), "{what}: a cut is not corruption: {err}");
                assert_one_line_naming_the_file(err, &what);
                assert!(err.to_string().contains(" byte "), "{what}: {err}");
            }
        }
        check_indexed(&bytes[..cut], &full, &what);
        check_search(&bytes[..cut], &what);
    }
    // Everything but the index frame and the trailer survives a cut in them.
    assert_eq!(last_recovered, full.records.len());
}

#[test]
fn a_bit_flip_in_any_byte_is_caught() {
    for (layout, bytes) in sweep_inputs() {
        flip_sweep(layout, &bytes);
    }
}

fn flip_sweep(layout: &str, bytes: &[u8]) {
    let full = full_trace(bytes);
    for at in 0..bytes.len() {
        for bit in [at % 8, 7 - at % 8] {
            let mut flipped = bytes.to_vec();
            flipped[at] ^= 1 << bit;
            let what = format!("{layout}: a flip of bit {bit} of byte {at}");
            match no_panic(&what, || read_trace_from(flipped.as_slice(), NAME)) {
                Err(e) => {
                    assert_one_line_naming_the_file(&e, &what);
                    if let TraceError::UnsupportedFormat { .. } = e {
                        // The version field of the preamble: no byte to name
                        // beyond "format version N".
                        assert!((8..PREAMBLE_LEN).contains(&at), "{what}: {e}");
                    } else {
                        assert!(e.to_string().contains("byte"), "{what}: message names no byte: {e}");
                    }
                }
                Ok(trace) => {
                    assert_eq!(trace.header, full.header, "{what}");
                    assert_prefix(&trace.records, &full.records, &what);
                    let Tail::Damaged(err) = &trace.tail else { panic!("{what} went unnoticed") };
                    assert_one_line_naming_the_file(err, &what);
                    assert!(err.to_string().contains("byte"), "{what}: message names no byte: {err}");
                }
            }
            check_indexed(&flipped, &full, &what);
            // Search skips the token frames, yet a flip in one is still caught
            // (by the header or the payload checksum).
            let (_, err) = check_search(&flipped, &what);
            assert!(err.is_some(), "{what}: search did not notice the flip");
        }
    }
}

/// Searches `bytes` with a query that skips frames: never a panic, and damage
/// is one line naming the file. Returns the matched steps and the damage.
fn check_search(bytes: &[u8], what: &str) -> (Vec<u32>, Option<TraceError>) {
    let query = skipping_query();
    no_panic(what, || match TraceReader::new(bytes, NAME) {
        Err(e) => {
            assert_one_line_naming_the_file(&e, what);
            (Vec::new(), Some(e))
        }
        Ok(mut reader) => {
            let mut steps = Vec::new();
            let err = query.search(&mut reader, &mut |m| steps.push(m.step)).err();
            if let Some(e) = &err {
                assert_one_line_naming_the_file(e, what);
            }
            (steps, err)
        }
    })
}

#[test]
fn the_truncated_golden_file_survives_every_cut_and_flip() {
    let bytes = golden("truncated-v1.trace");
    let whole = read_trace_from(bytes.as_slice(), NAME).unwrap();
    for cut in 0..bytes.len() {
        if let Ok(trace) = no_panic(&format!("cut {cut}"), || read_trace_from(&bytes[..cut], NAME)) {
            assert_prefix(&trace.records, &whole.records, &format!("cut {cut}"));
        }
        let mut flipped = bytes.clone();
        flipped[cut] ^= 1 << (cut % 8);
        if let Ok(trace) = no_panic(&format!("flip at {cut}"), || read_trace_from(flipped.as_slice(), NAME)) {
            assert_prefix(&trace.records, &whole.records, &format!("flip at {cut}"));
            assert!(matches!(trace.tail, Tail::Damaged(_)));
        }
        check_indexed(&flipped, &whole, &format!("flip at {cut}"));
    }
}

// ---- the messages a user reads ---------------------------------------------------

fn refusal(bytes: &[u8], name: &str) -> String {
    read_trace_from(bytes, name).expect_err("the file is refused").to_string()
}

#[test]
fn an_empty_file() {
    assert_eq!(refusal(b"", "empty.trace"), "empty.trace: empty file, nothing at byte 0, not a trace");
}

#[test]
fn a_file_that_is_not_a_trace() {
    let json = br#"{"records": [], "note": "this is the JSON of a trace, not a trace"}"#;
    assert_eq!(refusal(json, "episode.json"), "episode.json: not a basecamp trace (bad magic at byte 0)");
    // A file that starts like a trace but is text-mode mangled (CRLF -> LF).
    let mut mangled = golden(NAME);
    mangled.remove(5);
    assert_eq!(refusal(&mangled, NAME), format!("{NAME}: not a basecamp trace (bad magic at byte 0)"));
}

#[test]
fn a_truncated_preamble() {
    let bytes = golden(NAME);
    assert_eq!(refusal(&bytes[..5], "short.trace"), "short.trace: truncated at byte 5: records of 0 steps recovered");
    assert_eq!(refusal(&bytes[..11], "short.trace"), "short.trace: truncated at byte 11: records of 0 steps recovered");
    // The preamble alone: the header frame is missing.
    assert_eq!(
        refusal(&bytes[..PREAMBLE_LEN], "short.trace"),
        "short.trace: truncated at byte 12: records of 0 steps recovered"
    );
}

#[test]
fn a_future_format_version() {
    let mut bytes = golden(NAME);
    bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
    assert_eq!(
        refusal(&bytes, "future.trace"),
        "future.trace: trace format version 3 (byte 8) is newer than this reader supports (2); upgrade basecamp"
    );
}

#[test]
fn a_zero_format_version_is_damage_not_the_future() {
    let mut bytes = golden(NAME);
    bytes[8] ^= 0x01;
    assert_eq!(
        refusal(&bytes, "zero.trace"),
        "zero.trace: corrupt frame at byte 8: the preamble's format version is 0, which no writer produces"
    );
}

#[test]
fn a_flipped_payload_bit_names_the_frame() {
    let bytes = golden(NAME);
    let full = full_trace(&bytes);
    let frames = frames(&bytes);
    // The third frame: step 1 (after the header and step 0's initial memory).
    let target = &frames[2];
    let mut flipped = bytes.clone();
    flipped[target.payload_start() + 3] ^= 0x10;
    let computed = crc32fast::hash(&flipped[target.payload_start()..target.end()]);
    let trace = read_trace_from(flipped.as_slice(), NAME).unwrap();
    let Tail::Damaged(err) = &trace.tail else { panic!("the flip went unnoticed") };
    assert_eq!(
        err.to_string(),
        format!(
            "{NAME}: corrupt frame at byte {}: payload checksum mismatch (stored {:08x}, computed {computed:08x})",
            target.offset, target.header.payload_crc
        )
    );
    // Steps 0 is recovered, nothing after the bad frame.
    let step_zero = full.records.iter().take_while(|r| r.step == 0).count();
    assert_eq!(trace.records, full.records[..step_zero]);

    // The indexed reader still serves the undamaged steps and names the bad frame for step 1.
    let mut indexed = IndexedTrace::new(Cursor::new(&flipped), NAME).unwrap();
    let step_three: Vec<Record> = full.records.iter().filter(|r| r.step == 3).cloned().collect();
    assert_eq!(indexed.read_step(3).unwrap(), step_three);
    assert!(
        indexed
            .read_step(1)
            .unwrap_err()
            .to_string()
            .starts_with(&format!("{NAME}: corrupt frame at byte {}: payload checksum mismatch", target.offset))
    );
}

#[test]
fn a_flipped_frame_header_bit_names_the_frame() {
    let bytes = golden(NAME);
    let frames = frames(&bytes);
    let target = &frames[1];
    let mut flipped = bytes.clone();
    flipped[target.offset + 5] ^= 0x01; // compressed_len
    let trace = read_trace_from(flipped.as_slice(), NAME).unwrap();
    let Tail::Damaged(err) = &trace.tail else { panic!("the flip went unnoticed") };
    let message = err.to_string();
    assert!(
        message
            .starts_with(&format!("{NAME}: corrupt frame at byte {}: frame header checksum mismatch", target.offset)),
        "{message}"
    );
    assert!(trace.records.is_empty());
}

#[test]
fn garbage_after_the_trailer() {
    let bytes = golden(NAME);
    let full = full_trace(&bytes);
    let mut extended = bytes.clone();
    extended.extend_from_slice(b"\n");
    let trace = read_trace_from(extended.as_slice(), NAME).unwrap();
    assert_eq!(trace.records, full.records, "every record is still there");
    let Tail::Damaged(err) = &trace.tail else { panic!("the garbage went unnoticed") };
    assert_eq!(
        err.to_string(),
        format!("{NAME}: corrupt frame at byte {}: unexpected bytes after the trailer", bytes.len() - TRAILER_LEN)
    );
}

#[test]
fn a_bad_trailer() {
    let bytes = golden(NAME);
    let mut wrong_offset = bytes.clone();
    let at = bytes.len() - TRAILER_LEN;
    wrong_offset[at] ^= 0x01;
    let trace = read_trace_from(wrong_offset.as_slice(), NAME).unwrap();
    let Tail::Damaged(err) = &trace.tail else { panic!("the bad trailer went unnoticed") };
    assert_eq!(err.to_string(), format!("{NAME}: corrupt frame at byte {at}: bad trailer"));
    // Without a usable footer the indexed reader falls back to a scan, which stops at the same place.
    let indexed = IndexedTrace::new(Cursor::new(&wrong_offset), NAME).unwrap();
    assert_eq!(indexed.damage().map(ToString::to_string), Some(err.to_string()));
    assert_eq!(indexed.steps().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
}

#[test]
fn errors_from_a_path_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.trace");
    let bytes = golden(NAME);
    let cut = frames(&bytes)[2].offset + 7;
    std::fs::write(&path, &bytes[..cut]).unwrap();
    let trace = read_trace(&path).unwrap();
    assert_eq!(
        trace.damage().map(ToString::to_string),
        Some(format!(
            "{}: truncated at byte {}: records of 0 steps recovered",
            path.display(),
            frames(&bytes)[2].offset
        ))
    );
    let missing = dir.path().join("missing.trace");
    let err = read_trace(&missing).unwrap_err();
    assert!(err.to_string().starts_with(&format!("{}: cannot read: ", missing.display())), "{err}");
    assert_eq!(err.category(), "TraceIo");
}

#[test]
fn the_preamble_is_what_the_format_says() {
    let golden = golden(NAME);
    assert_eq!(golden[..8], format::MAGIC);
    assert_eq!(golden[8..PREAMBLE_LEN], 1u32.to_le_bytes(), "the golden file is version 1");
    let today = written_today();
    assert_eq!(today[..PREAMBLE_LEN], format::preamble());
    assert_eq!(today[8..PREAMBLE_LEN], format::FORMAT_VERSION.to_le_bytes());
}

#[test]
fn a_version_one_frame_with_a_kind_mask_is_corrupt() {
    // Version 1 reserved header bytes 1..4; a v1 file using them is damage,
    // even with a valid header checksum.
    let mut bytes = golden(NAME);
    let target = &frames(&bytes)[1];
    let mut header = target.header;
    header.record_kinds = format::kind_bit(4);
    bytes[target.offset..target.offset + FRAME_HEADER_LEN].copy_from_slice(&header.encode());
    let trace = read_trace_from(bytes.as_slice(), NAME).unwrap();
    let Tail::Damaged(err) = &trace.tail else { panic!("a v1 frame with a kind mask read as intact") };
    assert_eq!(
        err.to_string(),
        format!("{NAME}: corrupt frame at byte {}: reserved frame header bytes are not zero", target.offset)
    );
}

#[test]
fn a_frame_whose_mask_lies_is_corrupt() {
    // A v2 header whose mask leaves out a kind it holds would let skipping
    // readers lose records: a reader that decompresses it says so.
    let mut bytes = written_today();
    let frames = frames(&bytes);
    let target = frames.iter().find(|f| f.header.record_kinds == format::kind_bit(5)).expect("a token frame");
    let mut header = target.header;
    header.record_kinds = format::kind_bit(3);
    bytes[target.offset..target.offset + FRAME_HEADER_LEN].copy_from_slice(&header.encode());
    let trace = read_trace_from(bytes.as_slice(), NAME).unwrap();
    let Tail::Damaged(err) = &trace.tail else { panic!("a lying mask went unnoticed") };
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("{NAME}: corrupt frame at byte {}: ", target.offset))
            && message.contains("body field 5"),
        "{message}"
    );
}

/// `bytes` with the episode end's frame (the records frame before the index)
/// taken out and the trailer's index offset moved to match: the file reads
/// to its footer, but the episode never ended.
fn without_the_end_frame(bytes: &[u8]) -> (Vec<u8>, u64) {
    let frames = frames(bytes);
    let end = &frames[frames.len() - 2];
    let index = &frames[frames.len() - 1];
    let index_at = (index.offset - (end.end() - end.offset)) as u64;
    let mut out = [&bytes[..end.offset], &bytes[end.end()..bytes.len() - TRAILER_LEN]].concat();
    out.extend_from_slice(&format::trailer(index_at));
    (out, index_at)
}

/// The reader called a file that reads to its footer index without an
/// episode end complete, so report, search, archive and preprocess took an
/// episode that never ended for a finished one. Every reader now ends it
/// with `NoEpisodeEnd`, also one that skips the frames holding the end
/// (search), and every record read is kept.
#[test]
fn a_trace_read_to_its_footer_without_an_episode_end_is_not_complete() {
    for (layout, bytes) in sweep_inputs() {
        let full = full_trace(&bytes);
        // The end frame holds the episode end only (the golden shape has no reward).
        let end_frame = &frames(&bytes)[frames(&bytes).len() - 2];
        assert_eq!(
            end_frame.header.record_kinds & !basecamp_trace::RecordKind::EpisodeEnd.bit(),
            0,
            "{layout}: the frame before the index holds only the episode end"
        );
        let (unended, index_at) = without_the_end_frame(&bytes);
        let expected = format!(
            "{NAME}: no episode end: the file reads to its footer index (byte {index_at}) but holds no episode end \
             record, so the episode's outcome is unknown (no basecamp writer leaves this: the file was written by \
             another tool or edited); `basecamp trace validate` checks the rest"
        );
        let trace = read_trace_from(unended.as_slice(), NAME).unwrap();
        assert_eq!(trace.damage().map(ToString::to_string), Some(expected.clone()), "{layout}");
        assert_eq!(trace.damage().map(TraceError::category), Some("TraceNoEpisodeEnd"));
        assert_eq!(trace.records, full.records[..full.records.len() - 1], "{layout}: every other record is read");
        let without_tokens =
            TraceReader::new(unended.as_slice(), NAME).unwrap().without(&[basecamp_trace::RecordKind::TokenLogit]);
        assert_eq!(without_tokens.into_contents().damage().map(ToString::to_string), Some(expected.clone()));
        let (_, err) = check_search(&unended, layout);
        assert_eq!(err.map(|e| e.to_string()), Some(expected), "{layout}: search");
        // The whole file, read by the same readers, is complete: an end in
        // a frame that search skips undecompressed still counts.
        assert!(matches!(full.tail, Tail::Complete));
        assert_eq!(check_search(&bytes, layout).1.map(|e| e.to_string()), None, "{layout}: search of the whole file");
    }
}
