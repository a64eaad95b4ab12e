//! The trace tools on damaged input: whatever the bytes, validate, redact
//! and the OTLP export finish with findings or errors, never a panic (the
//! HTML episode view is tested the same way where it lives, in the CLI's
//! `serve::episode`).

use basecamp_trace::TraceReader;
use basecamp_trace::json::{TraceJson, write_trace_json};
use basecamp_trace::otlp::export;
use basecamp_trace::redact::{Pattern, Redactor};
use basecamp_trace::synthetic::{EpisodeShape, generate};
use basecamp_trace::validate::validate_reader;
use proptest::prelude::*;

fn trace() -> Vec<u8> {
    generate(&EpisodeShape { seed: 9, steps: 6, tokens_per_step: 3, ..Default::default() })
        .write_to(Vec::new(), 3)
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn damaged_traces_never_panic(cut in 0.0f64..1.0, flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..3)) {
        let mut bytes = trace();
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        bytes.truncate(((bytes.len() as f64) * (0.5 + cut / 2.0)) as usize);
        let open = || TraceReader::new(bytes.as_slice(), "d.trace");
        if let Ok(reader) = open() {
            let findings = validate_reader(reader);
            prop_assert!(!findings.is_empty(), "a damaged trace has findings");
        }
        if let Ok(reader) = open() {
            let _ = export(reader);
        }
        // trace parse's streamed JSON is the text of the trace held whole.
        if let Ok(trace) = basecamp_trace::read_trace_from(bytes.as_slice(), "d.trace") {
            let mut streamed = Vec::new();
            let ending = write_trace_json(open, "d.trace", &mut streamed, false).unwrap();
            prop_assert_eq!(ending.damage.map(|e| e.to_string()), trace.damage().map(|e| e.to_string()));
            let held = serde_json::to_vec(&TraceJson { file: "d.trace", trace: &trace }).unwrap();
            prop_assert_eq!(streamed, held);
        }
        let redactor = Redactor::new(["order_id".to_string()], vec![Pattern::Email, Pattern::Phone], b"s".to_vec());
        let _ = redactor.redact(open, Vec::new(), "out.trace");
    }
}
