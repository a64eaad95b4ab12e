//! `basecamp trace replay`: an episode re-executed from its trace is
//! identical; the same trace under another sandbox configuration diverges
//! where the configurations differ, and says how.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn basecamp(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("basecamp runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

#[test]
fn a_recorded_episode_replays_identically_and_diverges_under_the_other_variant() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce");
    let example = example.to_str().unwrap();
    let out = tempfile::tempdir().unwrap();
    let (ok, text) = basecamp(&[
        "run",
        example,
        "--variant",
        "a",
        "--shards",
        "1",
        "--concurrency",
        "16",
        "--no-progress",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    let episodes = run["variants"][0]["episodes"].as_array().unwrap();
    let failed = episodes.iter().find(|e| e["failure_class"] != "ok").expect("variant a has failures");
    let passed = episodes.iter().find(|e| e["failure_class"] == "ok").expect("and successes");

    for episode in [failed, passed] {
        let trace = out.path().join(episode["trace"].as_str().unwrap());
        let (ok, text) = basecamp(&["trace", "replay", trace.to_str().unwrap(), "--config", example]);
        assert!(ok && text.starts_with("identical:"), "{text}");
    }

    // The failed episode hit track_order's fallback; variant b's fallback writes "pending", not null.
    let trace = out.path().join(failed["trace"].as_str().unwrap());
    let (ok, text) = basecamp(&["trace", "replay", trace.to_str().unwrap(), "--config", example, "--variant", "b"]);
    assert!(!ok, "{text}");
    assert!(text.starts_with("diverged:"), "{text}");
    assert!(
        text.contains("(record")
            && text
                .contains("memory_state): after recorded shipping_status=null vs replayed shipping_status=\"pending\""),
        "{text}"
    );

    // A truncated trace is refused with the reason.
    let bytes = std::fs::read(&trace).unwrap();
    let cut = out.path().join("cut.trace");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let (ok, text) = basecamp(&["trace", "replay", cut.to_str().unwrap(), "--config", example]);
    assert!(!ok && text.contains("incomplete"), "{text}");
}
