//! Format stability: committed `.trace` files must keep reading, and keep
//! producing exactly the committed JSON.
//!
//! The files under `tests/golden/` were written by an earlier build. A change
//! that makes this test fail has changed how existing traces read: that is a
//! format break, not a reason to regenerate. Regenerating is an explicit
//! opt-in for when a new golden file is added on purpose:
//!
//! ```text
//! BASECAMP_REGENERATE_GOLDEN=1 cargo test -p basecamp-trace --test golden
//! ```

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Once;

use basecamp_trace::json::trace_to_json;
use basecamp_trace::synthetic::{EpisodeShape, generate};
use basecamp_trace::{IndexedTrace, Tail, TraceContents, TraceError, TraceWriter, read_trace_from};
use serde_json::Value;

const REGENERATE: &str = "BASECAMP_REGENERATE_GOLDEN";

/// The golden files: name, and whether the writer finished.
const GOLDEN: [(&str, bool); 2] = [("episode-v1.trace", true), ("truncated-v1.trace", false)];

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn shape() -> EpisodeShape {
    EpisodeShape { steps: 3, tokens_per_step: 4, memory_keys: 6, ..Default::default() }
}

/// A finished three-step episode.
fn episode_bytes() -> Vec<u8> {
    generate(&shape()).write_to(Vec::new(), 3).expect("writing to a Vec cannot fail")
}

/// A writer dropped in the middle of step 2: steps 0 and 1 closed, step 2's
/// records flushed by `Drop`, no episode end, no index, no trailer.
fn truncated_bytes() -> Vec<u8> {
    let episode = generate(&shape());
    let mut out = Vec::new();
    let mut writer = TraceWriter::new(&mut out, episode.header.clone(), 3).expect("writing to a Vec cannot fail");
    for step in &episode.steps[..2] {
        for record in step {
            writer.write_record(record).expect("writing to a Vec cannot fail");
        }
        writer.end_step().expect("writing to a Vec cannot fail");
    }
    let step_two = &episode.steps[2];
    for record in &step_two[..step_two.len() / 2] {
        writer.write_record(record).expect("writing to a Vec cannot fail");
    }
    drop(writer);
    out
}

fn to_json(name: &str, trace: &TraceContents) -> String {
    let mut text = serde_json::to_string_pretty(&trace_to_json(name, trace)).expect("a Value always serializes");
    text.push('\n');
    text
}

/// Rewrites the golden files, only when asked to.
fn regenerate_if_asked() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var(REGENERATE).as_deref() != Ok("1") {
            return;
        }
        let dir = golden_dir();
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in [(GOLDEN[0].0, episode_bytes()), (GOLDEN[1].0, truncated_bytes())] {
            let trace = read_trace_from(bytes.as_slice(), name).unwrap();
            std::fs::write(dir.join(name), &bytes).unwrap();
            std::fs::write(dir.join(name).with_extension("json"), to_json(name, &trace)).unwrap();
            eprintln!("regenerated {}", dir.join(name).display());
        }
    });
}

fn read_golden(name: &str) -> (Vec<u8>, String) {
    regenerate_if_asked();
    let path = golden_dir().join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{}: {e}; golden files are committed (to add one on purpose: {REGENERATE}=1)", path.display())
    });
    let json_path = path.with_extension("json");
    let json = std::fs::read_to_string(&json_path).unwrap_or_else(|e| panic!("{}: {e}", json_path.display()));
    (bytes, json)
}

#[test]
fn golden_files_read_to_the_committed_json() {
    for (name, finished) in GOLDEN {
        let (bytes, committed) = read_golden(name);
        let trace = read_trace_from(bytes.as_slice(), name).unwrap();
        assert_eq!(matches!(trace.tail, Tail::Complete), finished, "{name}: {:?}", trace.tail);
        let produced = to_json(name, &trace);
        let committed_value: Value = serde_json::from_str(&committed).unwrap();
        let produced_value: Value = serde_json::from_str(&produced).unwrap();
        if produced_value != committed_value {
            let first_difference = produced
                .lines()
                .zip(committed.lines())
                .enumerate()
                .find(|(_, (p, c))| p != c)
                .map(|(n, (p, c))| format!("line {}: now {p:?}, committed {c:?}", n + 1))
                .unwrap_or_else(|| "the documents differ in length".into());
            panic!(
                "{name} no longer reads to the committed JSON ({first_difference}). Existing traces would read \
                 differently: fix the reader, or if the change is deliberate, bump the format and add a new golden file."
            );
        }
    }
}

#[test]
fn the_golden_episode_has_the_shape_it_was_generated_with() {
    let (bytes, _) = read_golden("episode-v1.trace");
    let trace = read_trace_from(bytes.as_slice(), "episode-v1.trace").unwrap();
    assert_eq!(trace.header.schema_major, 1);
    assert_eq!(trace.header.task, "shipping-delay");
    assert_eq!(trace.header.episode_id, "ep-0001");
    let steps: std::collections::BTreeSet<u32> = trace.records.iter().map(|r| r.step).collect();
    assert_eq!(steps.into_iter().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    let json: Value = serde_json::from_str(&to_json("episode-v1.trace", &trace)).unwrap();
    let kinds: std::collections::BTreeSet<String> = json["records"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_object().unwrap().keys().filter(|k| *k != "step").cloned())
        .collect();
    for kind in ["memoryDelta", "policyTurn", "tokenLogit", "planStep", "rewardSignal", "episodeEnd"] {
        assert!(kinds.contains(kind), "no {kind} record in the golden episode: {kinds:?}");
    }
    // 4 tokens per step, 3 steps.
    assert_eq!(json["records"].as_array().unwrap().iter().filter(|r| r.get("tokenLogit").is_some()).count(), 12);
}

#[test]
fn the_truncated_golden_file_reports_where_it_ends() {
    let (bytes, _) = read_golden("truncated-v1.trace");
    let trace = read_trace_from(bytes.as_slice(), "truncated-v1.trace").unwrap();
    let Tail::Damaged(err) = &trace.tail else { panic!("the truncated golden file reads as complete") };
    assert!(matches!(err, TraceError::Truncated { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!("truncated-v1.trace: truncated at byte {}: records of 2 steps recovered", bytes.len())
    );
    assert!(trace.records.iter().all(|r| r.step <= 2));
    assert!(trace.records.iter().any(|r| r.step == 2), "step 2's flushed records are recovered");
}

#[test]
fn golden_files_read_by_step_match_the_sequential_read() {
    for (name, finished) in GOLDEN {
        let (bytes, _) = read_golden(name);
        let trace = read_trace_from(bytes.as_slice(), name).unwrap();
        let mut indexed = IndexedTrace::new(Cursor::new(&bytes), name).unwrap();
        assert_eq!(indexed.damage().is_none(), finished, "{name}: {:?}", indexed.damage());
        assert_eq!(indexed.header(), &trace.header);
        let steps: Vec<u32> = indexed.steps().collect();
        assert_eq!(steps, vec![0, 1, 2, 3][..if finished { 4 } else { 3 }], "{name}");
        for step in steps {
            let want: Vec<_> = trace.records.iter().filter(|r| r.step == step).cloned().collect();
            let mut got = indexed.read_step(step).unwrap();
            if step == 0 {
                // The header frame is step 0's first frame.
                assert!(matches!(got.remove(0).body, Some(basecamp_trace::pb::record::Body::Header(_))));
            }
            assert_eq!(got, want, "{name} step {step}");
        }
    }
}

/// Today's writer and generator still produce files that read to the same
/// records as the committed ones (the bytes themselves may differ with the
/// zstd version, the producer version with each release, and the schema
/// minor with each added field).
#[test]
fn todays_writer_reads_back_like_the_golden_files() {
    for ((name, _), bytes) in GOLDEN.into_iter().zip([episode_bytes(), truncated_bytes()]) {
        let (golden, _) = read_golden(name);
        let golden = read_trace_from(golden.as_slice(), name).unwrap();
        let today = read_trace_from(bytes.as_slice(), name).unwrap();
        // The golden files were written at schema 1.0; today's writer says
        // 1.2 (1.1: TokenLogit gained the optional entropy and kl; 1.2: the
        // header's row_id), which reads the old files unchanged.
        let strip_versions = |mut h: basecamp_trace::pb::Header| {
            h.producer_versions.clear();
            h.schema_minor = 0;
            h
        };
        assert_eq!(strip_versions(today.header.clone()), strip_versions(golden.header.clone()), "{name}");
        // 1.3: the episode end names its failure class (the golden files,
        // written before, leave it empty).
        let mut today = today;
        for record in &mut today.records {
            if let Some(basecamp_trace::pb::record::Body::EpisodeEnd(end)) = &mut record.body {
                assert_eq!(end.failure_class, "timeout", "{name}: the generator's episode has a timed-out step");
                end.failure_class.clear();
            }
        }
        assert_eq!(
            today.records, golden.records,
            "{name}: the synthetic generator or the writer changed what it writes"
        );
        assert_eq!(today.damage().map(TraceError::category), golden.damage().map(TraceError::category));
    }
}
