//! `basecamp trace parse FILE --output html`: one self-contained page with
//! every section, and no way for trace contents to inject markup.

use std::process::Command;

use basecamp_trace::pb::{MemoryDelta, MemorySource, record::Body};
use basecamp_trace::synthetic::{EpisodeShape, generate};

#[test]
fn the_html_page_is_self_contained_and_escapes_trace_contents() {
    // The first seed whose episode holds a timed-out call.
    let mut ep = (1..)
        .map(|seed| generate(&EpisodeShape { seed, steps: 12, tokens_per_step: 3, ..Default::default() }))
        .find(|ep| {
            ep.steps.iter().flatten().any(|r| {
                matches!(&r.body, Some(Body::PlanStep(p)) if p.status == basecamp_trace::pb::StepStatus::Fallback as i32)
            })
        })
        .unwrap();
    ep.steps[2].push(basecamp_trace::pb::Record {
        step: 2,
        body: Some(Body::MemoryDelta(MemoryDelta {
            key: "note".into(),
            before_json: None,
            after_json: Some("\"<script>alert(1)</script>\"".into()),
            source: MemorySource::SystemInjection as i32,
            origin: "inj-1".into(),
        })),
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ep.trace");
    std::fs::write(&file, ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "parse", "--output", "html"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let html = String::from_utf8(out.stdout).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.trim_end().ends_with("</html>"));
    for section in
        ["Step timeline (12 calls)", "Memory deltas (", "Rewards (12 signals)", "Errors (", "Generated tokens (36)"]
    {
        assert!(html.contains(section), "missing {section}");
    }
    for tool in ["tracking_api", "order_lookup"] {
        assert!(html.contains(tool));
    }
    assert!(html.contains("class=\"badge fallback\""), "a timed-out call shows its status");
    assert!(html.contains("tool_call_accuracy"));
    // Nothing is fetched, nothing runs, and trace contents cannot inject markup.
    assert!(!html.contains("<script"), "a script tag got through");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    for external in ["src=", "href=", "http://", "https://", "@import", "url("] {
        assert!(!html.contains(external), "the page references {external}");
    }
}
