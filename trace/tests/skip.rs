//! Format version 2: token logits in frames of their own, each frame's
//! record kinds in its header, and readers (search) skipping the frames they
//! cannot need without decompressing them, losing no record and no step.

use std::path::Path;

use basecamp_trace::format::{
    FLAG_CONTINUES_STEP, FORMAT_VERSION, FRAME_HEADER_LEN, FrameHeader, FrameKind, PREAMBLE_LEN,
};
use basecamp_trace::pb::{EpisodeEnd, Header, PlanStep, Record, StepStatus, TokenLogit, record::Body};
use basecamp_trace::query::{Query, Section};
use basecamp_trace::synthetic::{EpisodeShape, generate};
use basecamp_trace::{
    RecordKind, Tail, TraceError, TraceReader, TraceWriter, read_trace_from, read_trace_from_without,
};

/// The shape the golden files were generated with.
fn golden_shape() -> EpisodeShape {
    EpisodeShape { steps: 3, tokens_per_step: 4, memory_keys: 6, ..Default::default() }
}

fn golden_v1() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/episode-v1.trace");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// (offset, header) of every frame of an undamaged or truncated file.
fn frames(bytes: &[u8]) -> Vec<(usize, FrameHeader)> {
    let mut out = Vec::new();
    let mut at = PREAMBLE_LEN;
    while at + FRAME_HEADER_LEN <= bytes.len() {
        let header = FrameHeader::decode(bytes[at..at + FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        out.push((at, header));
        at += FRAME_HEADER_LEN + header.compressed_len as usize;
    }
    out
}

/// The records of each records frame, in file order (the header frame first).
fn records_by_frame(bytes: &[u8]) -> Vec<(FrameHeader, Vec<Record>)> {
    use prost::Message;
    frames(bytes)
        .into_iter()
        .filter(|(_, h)| h.kind == FrameKind::Records)
        .map(|(at, h)| {
            let payload = &bytes[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + h.compressed_len as usize];
            let raw = zstd::bulk::decompress(payload, h.raw_len as usize).unwrap();
            let mut slice = raw.as_slice();
            let mut records = Vec::new();
            while !slice.is_empty() {
                records.push(Record::decode_length_delimited(&mut slice).unwrap());
            }
            (h, records)
        })
        .collect()
}

/// (step, section) of every match; offsets differ between layouts.
type Found = Vec<(u32, Option<Section>)>;

/// The matches, the damage, and the frames decompressed and skipped.
fn search(bytes: &[u8], query: &str) -> (Found, Option<TraceError>, u64, u64) {
    let query = Query::parse(query).unwrap_or_else(|e| panic!("{e}"));
    let mut reader = TraceReader::new(bytes, "t.trace").unwrap();
    let mut found = Vec::new();
    let err = query.search(&mut reader, &mut |m| found.push((m.step, m.section))).err();
    (found, err, reader.frames_decompressed(), reader.frames_skipped())
}

const QUERIES: &[&str] = &[
    r#"plan_execution.tool == "tracking_api""#,
    "exists(token_logit)",
    "token_logit.logprob < -1.5",
    // Token logits and plan execution in one query.
    r#"token_logit.logprob < -2 and plan_execution.status == "ok""#,
    r#"token_logit.logprob < -2 or plan_execution.latency_ms > 500"#,
    "not exists(error_context)",
    "step >= 0",
    r#"episode.task == "shipping-delay" and step > 1"#,
    "exists(memory_state) or exists(reward_signal)",
    "policy_turn.completion_tokens > 0 and not exists(token_logit)",
];

#[test]
fn todays_writer_puts_token_logits_in_frames_of_their_own() {
    let episode = generate(&EpisodeShape { steps: 6, tokens_per_step: 7, ..Default::default() });
    let bytes = episode.write_to(Vec::new(), 3).unwrap();
    assert_eq!(bytes[8..PREAMBLE_LEN], FORMAT_VERSION.to_le_bytes());
    let by_frame = records_by_frame(&bytes);
    let mut previous_step: Option<u32> = None;
    let mut token_frames = 0;
    for (i, (header, records)) in by_frame.iter().enumerate() {
        assert!(!records.is_empty(), "frame {i} is empty");
        let kinds: Vec<RecordKind> = records.iter().map(|r| RecordKind::of_body(r.body.as_ref())).collect();
        let mask = kinds.iter().fold(0u16, |m, k| m | k.bit());
        assert_eq!(header.record_kinds, mask, "frame {i}: the mask is exactly the kinds it holds");
        let tokens = kinds.iter().filter(|&&k| k == RecordKind::TokenLogit).count();
        assert!(tokens == 0 || tokens == kinds.len(), "frame {i} mixes token logits with other records");
        token_frames += usize::from(tokens > 0);
        let step = records[0].step;
        assert!(records.iter().all(|r| r.step == step), "frame {i} holds more than one step");
        let continues = header.flags & FLAG_CONTINUES_STEP != 0;
        // The header frame counts as no step; step 0's first records frame does not continue it.
        assert_eq!(continues, i > 1 && previous_step == Some(step), "frame {i}: continues-step flag");
        if i > 0 {
            previous_step = Some(step);
        }
    }
    assert_eq!(token_frames, 6, "one token frame per step");
    // The file's record order is the order of appending.
    let contents = read_trace_from(bytes.as_slice(), "t.trace").unwrap();
    assert!(matches!(contents.tail, Tail::Complete));
    let appended: Vec<Record> = episode.steps.iter().flatten().cloned().collect();
    assert_eq!(contents.records[..appended.len()], appended[..]);
}

#[test]
fn search_finds_the_same_matches_in_the_v1_golden_file_and_todays_v2_file() {
    // The golden file and today's writer hold the same records (tests/golden.rs).
    let v1 = golden_v1();
    let v2 = generate(&golden_shape()).write_to(Vec::new(), 3).unwrap();
    for query in QUERIES {
        let (old, old_err, _, old_skipped) = search(&v1, query);
        let (new, new_err, _, _) = search(&v2, query);
        assert!(old_err.is_none() && new_err.is_none(), "{query}: {old_err:?} {new_err:?}");
        assert_eq!(old_skipped, 0, "{query}: a v1 file has no masks, so nothing is skipped");
        assert_eq!(new, old, "{query}");
    }
    // Every query above has something to find, and the mixed ones see both sections.
    let (mixed, _, _, _) = search(&v2, QUERIES[4]);
    assert!(!mixed.is_empty());
}

#[test]
fn a_query_not_naming_token_logit_never_decompresses_a_token_frame() {
    let v2 = generate(&golden_shape()).write_to(Vec::new(), 3).unwrap();
    let token_frames = frames(&v2).iter().filter(|(_, h)| h.record_kinds == RecordKind::TokenLogit.bit()).count();
    assert_eq!(token_frames, 3);
    let records_frames = frames(&v2).iter().filter(|(_, h)| h.kind == FrameKind::Records).count() as u64;
    // The episode end sits in a frame of its own after the last step's frame.
    let end_frames = frames(&v2).iter().filter(|(_, h)| h.record_kinds == RecordKind::EpisodeEnd.bit()).count() as u64;
    assert_eq!(end_frames, 1);
    // A query naming every other kind of the episode skips only that frame
    // (the index frame is decompressed too, hence the + 1).
    let every_kind = "exists(token_logit) or exists(plan_execution) or exists(memory_state) \
                      or exists(reward_signal) or exists(policy_turn) or exists(error_context)";
    let (_, _, decompressed, skipped) = search(&v2, every_kind);
    assert_eq!((decompressed, skipped), (records_frames + 1 - end_frames, end_frames));
    // A plan_execution query skips every token frame (each continues its step) as well.
    let (_, _, decompressed, skipped) = search(&v2, r#"plan_execution.tool == "tracking_api""#);
    assert_eq!(skipped, token_frames as u64 + end_frames);
    assert_eq!(decompressed + skipped, records_frames + 1);
}

/// Replaces the payload of the frame at `at` with bytes that are not zstd,
/// under a valid header and payload checksum: only decompressing it shows the damage.
fn with_undecompressable_payload(bytes: &[u8], at: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let mut header = FrameHeader::decode(out[at..at + FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
    let payload = at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + header.compressed_len as usize;
    out[payload.clone()].fill(0xA5);
    header.payload_crc = crc32fast::hash(&out[payload]);
    out[at..at + FRAME_HEADER_LEN].copy_from_slice(&header.encode());
    out
}

#[test]
fn a_skipped_frame_is_not_decompressed_but_a_read_one_is() {
    let v2 = generate(&golden_shape()).write_to(Vec::new(), 3).unwrap();
    let (at, _) =
        frames(&v2).into_iter().find(|(_, h)| h.record_kinds == RecordKind::TokenLogit.bit()).expect("a token frame");
    let damaged = with_undecompressable_payload(&v2, at);

    // A query that does not name token_logit never opens the frame: same matches, no error.
    for query in QUERIES.iter().filter(|q| !q.contains("token_logit")) {
        let (want, _, _, _) = search(&v2, query);
        let (got, err, _, _) = search(&damaged, query);
        assert!(err.is_none(), "{query}: {err:?}");
        assert_eq!(got, want, "{query}");
    }
    // One that names it decompresses the frame and reports the damage, with its offset.
    let (_, err, _, _) = search(&damaged, r#"token_logit.logprob < 0 and plan_execution.status == "ok""#);
    let message = err.expect("the damaged token frame is reported").to_string();
    assert!(message.starts_with(&format!("t.trace: corrupt frame at byte {at}: zstd: ")), "{message}");
    // So does a full read.
    let contents = read_trace_from(damaged.as_slice(), "t.trace").unwrap();
    let Tail::Damaged(err) = &contents.tail else { panic!("the damage went unnoticed") };
    assert!(err.to_string().contains(&format!("byte {at}: zstd: ")), "{err}");
}

#[test]
fn a_flipped_byte_in_a_skipped_frame_is_still_reported() {
    // Skipping checks the payload checksum: damage does not depend on the query.
    let v2 = generate(&golden_shape()).write_to(Vec::new(), 3).unwrap();
    let (at, _) =
        frames(&v2).into_iter().find(|(_, h)| h.record_kinds == RecordKind::TokenLogit.bit()).expect("a token frame");
    let mut flipped = v2.clone();
    flipped[at + FRAME_HEADER_LEN + 2] ^= 0x04;
    let (_, err, _, skipped) = search(&flipped, r#"plan_execution.tool == "tracking_api""#);
    let message = err.expect("the flip is reported").to_string();
    assert!(
        message.starts_with(&format!("t.trace: corrupt frame at byte {at}: payload checksum mismatch")),
        "{message}"
    );
    assert_eq!(skipped, 0, "the damaged frame is not counted as skipped");
}

fn token(position: u32) -> Body {
    Body::TokenLogit(TokenLogit { position, token: "x".into(), logprob: -0.5, ..Default::default() })
}

fn plan(tool: &str) -> Body {
    Body::PlanStep(Box::new(PlanStep { tool: tool.into(), status: StepStatus::Ok as i32, ..Default::default() }))
}

#[test]
fn a_step_of_token_logits_alone_is_still_visited_by_queries_that_skip_them() {
    let header = Header { episode_id: "ep-t".into(), ..Default::default() };
    let mut w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    w.append(1, plan("a")).unwrap();
    w.append(1, token(0)).unwrap();
    w.end_step().unwrap();
    // Step 2: token logits only; they start the step, so they are read.
    w.append(2, token(0)).unwrap();
    w.append(2, token(1)).unwrap();
    w.end_step().unwrap();
    // Step 3: no end_step before step 4 (the writer still closes the frame at the step change).
    w.append(3, token(0)).unwrap();
    w.append(3, plan("b")).unwrap();
    w.append(3, token(1)).unwrap();
    w.append(4, plan("c")).unwrap();
    let bytes = w.finish(EpisodeEnd::default()).unwrap();
    assert_eq!(search(&bytes, "step > 0").0.iter().map(|m| m.0).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    assert_eq!(search(&bytes, "not exists(plan_execution)").0.iter().map(|m| m.0).collect::<Vec<_>>(), vec![2]);
    assert_eq!(search(&bytes, r#"tool == "b""#).0, vec![(3, Some(Section::PlanExecution))]);
    // Skipped: step 1's token frame, and step 3's plan frame and trailing token
    // frame; read: the header frame, the first frame of each step, the index.
    assert_eq!(search(&bytes, "step > 0").3, 3);
    assert_eq!(search(&bytes, "step > 0").2, 6);
    let records = read_trace_from(bytes.as_slice(), "t").unwrap().records;
    let steps: Vec<u32> = records.iter().map(|r| r.step).collect();
    assert_eq!(steps, vec![1, 1, 2, 2, 3, 3, 3, 4, 4]);
}

#[test]
fn a_writer_killed_mid_step_leaves_a_searchable_prefix() {
    let episode = generate(&golden_shape());
    let mut out = Vec::new();
    {
        let mut writer = TraceWriter::new(&mut out, episode.header.clone(), 3).unwrap();
        for step in &episode.steps[..3] {
            for record in step {
                writer.write_record(record).unwrap();
            }
            writer.end_step().unwrap();
        }
        let last = &episode.steps[3];
        for record in &last[..last.len() / 2] {
            writer.write_record(record).unwrap();
        }
        // Dropped without finish: a crashed pod.
    }
    let full = episode.write_to(Vec::new(), 3).unwrap();
    for query in QUERIES {
        let (want, _, _, _) = search(&full, query);
        let (got, err, _, _) = search(&out, query);
        assert!(matches!(err, Some(TraceError::Truncated { .. })), "{query}: {err:?}");
        let finished: Vec<_> = want.iter().filter(|m| m.0 < 3).cloned().collect();
        assert_eq!(got.iter().filter(|m| m.0 < 3).cloned().collect::<Vec<_>>(), finished, "{query}");
    }
    // Every cut keeps a prefix of the records, and skipping never panics.
    let whole = read_trace_from(out.as_slice(), "t").unwrap();
    for cut in PREAMBLE_LEN..out.len() {
        if let Ok(trace) = read_trace_from(&out[..cut], "t") {
            assert_eq!(trace.records[..], whole.records[..trace.records.len()], "cut {cut}");
        }
        if let Ok(mut reader) = TraceReader::new(&out[..cut], "t") {
            let query = Query::parse(r#"plan_execution.status == "ok""#).unwrap();
            let err = query.search(&mut reader, &mut |_| {}).expect_err("a cut file is damaged");
            assert!(!err.to_string().contains('\n'));
        }
    }
}

/// `read_trace_without(TokenLogit)` of `bytes` against a full read: the same
/// header, every other record in order, the same tail; (decompressed, skipped).
fn read_without_token_logits_agrees(bytes: &[u8], what: &str) -> (u64, u64) {
    let full = read_trace_from(bytes, "t.trace").unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut reader = TraceReader::new(bytes, "t.trace").unwrap().without(&[RecordKind::TokenLogit]);
    let records: Vec<Record> = reader.by_ref().map_while(Result::ok).collect();
    let counts = (reader.frames_decompressed(), reader.frames_skipped());
    let lean = read_trace_from_without(bytes, "t.trace", &[RecordKind::TokenLogit]).unwrap();
    assert_eq!(lean.records, records, "{what}: the function and the reader agree");
    assert_eq!(lean.header, full.header, "{what}");
    let others: Vec<&Record> =
        full.records.iter().filter(|r| RecordKind::of_body(r.body.as_ref()) != RecordKind::TokenLogit).collect();
    assert_eq!(lean.records.iter().collect::<Vec<_>>(), others, "{what}: every other record, in order");
    let tail = |t: &Tail| match t {
        Tail::Complete => "complete".to_string(),
        Tail::Damaged(e) => e.to_string(),
    };
    assert_eq!(tail(&lean.tail), tail(&full.tail), "{what}: the same end");
    counts
}

#[test]
fn a_read_without_token_logits_skips_their_frames_and_loses_nothing_else() {
    let v2 = generate(&EpisodeShape { steps: 6, tokens_per_step: 40, ..Default::default() })
        .write_to(Vec::new(), 3)
        .unwrap();
    let token_frames = frames(&v2).iter().filter(|(_, h)| h.record_kinds == RecordKind::TokenLogit.bit()).count();
    let (_, skipped) = read_without_token_logits_agrees(&v2, "whole");
    assert_eq!(skipped, token_frames as u64, "every token frame is skipped undecompressed");
    // A v1 file has no kinds in its frame headers: nothing is skipped, the token logits are still left out.
    assert_eq!(read_without_token_logits_agrees(&golden_v1(), "v1").1, 0);
    // Cut anywhere: the same prefix and the same truncation.
    for cut in (PREAMBLE_LEN + 200..v2.len()).step_by(v2.len() / 23) {
        read_without_token_logits_agrees(&v2[..cut], &format!("cut at {cut}"));
    }
    // A flipped byte in a skipped token frame is found by its checksum, as a full read finds it.
    let (at, _) =
        frames(&v2).into_iter().find(|(_, h)| h.record_kinds == RecordKind::TokenLogit.bit()).expect("a token frame");
    let mut flipped = v2.clone();
    flipped[at + FRAME_HEADER_LEN + 5] ^= 0x10;
    read_without_token_logits_agrees(&flipped, "flipped");
    let lean = read_trace_from_without(flipped.as_slice(), "t.trace", &[RecordKind::TokenLogit]).unwrap();
    assert!(matches!(lean.tail, Tail::Damaged(TraceError::Corrupt { offset, .. }) if offset == at as u64));
}

#[test]
fn a_capped_read_decodes_the_first_n_token_logits_and_counts_the_rest_per_step() {
    let bytes =
        generate(&EpisodeShape { steps: 6, tokens_per_step: 7, ..Default::default() }).write_to(Vec::new(), 3).unwrap();
    let full = read_trace_from(bytes.as_slice(), "t").unwrap();
    let is_logit = |r: &Record| matches!(r.body, Some(Body::TokenLogit(_)));
    let logits = full.records.iter().filter(|r| is_logit(r)).count();
    assert_eq!(logits, 42);
    for n in [0, 1, 10, 41, 42, 1000] {
        let mut reader = TraceReader::new(bytes.as_slice(), "t").unwrap().at_most(RecordKind::TokenLogit, n);
        let capped: Vec<Record> = reader.by_ref().map(|r| r.unwrap()).collect();
        // Every other record, in order, and the first n token logits.
        let mut seen = 0;
        let expected: Vec<&Record> = full
            .records
            .iter()
            .filter(|r| {
                let keep = !is_logit(r) || seen < n;
                seen += usize::from(is_logit(r));
                keep
            })
            .collect();
        assert_eq!(capped.iter().collect::<Vec<_>>(), expected, "n = {n}");
        // The rest, counted by step.
        let mut left = std::collections::BTreeMap::new();
        for r in full.records.iter().filter(|r| is_logit(r)).skip(n) {
            *left.entry(r.step).or_insert(0usize) += 1;
        }
        assert_eq!(*reader.left_out(), left, "n = {n}");
    }
    // From a file, with the tail as a full read has it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.trace");
    std::fs::write(&path, &bytes).unwrap();
    let (contents, left) = basecamp_trace::read_trace_at_most(&path, RecordKind::TokenLogit, 5).unwrap();
    assert!(matches!(contents.tail, Tail::Complete));
    assert_eq!(contents.header, full.header);
    assert_eq!(left.values().sum::<usize>(), 37);
}
