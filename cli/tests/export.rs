//! `basecamp trace export --otlp` as a user runs it.

use std::process::Command;

use basecamp_trace::synthetic::{EpisodeShape, generate};
use serde_json::Value;

fn basecamp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("the basecamp binary runs")
}

#[test]
fn one_otlp_request_per_trace_in_input_order() {
    let dir = tempfile::tempdir().unwrap();
    for seed in 1..=3 {
        let ep = generate(&EpisodeShape { seed, steps: 5, tokens_per_step: 2, ..Default::default() });
        std::fs::write(dir.path().join(format!("ep-{seed}.trace")), ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    }
    let d = dir.path().display().to_string();
    let out = basecamp(&["trace", "export", "--otlp", &d]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    for (i, doc) in lines.iter().enumerate() {
        let spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().unwrap();
        assert_eq!(spans.len(), 6, "the agent span and 5 tool spans");
        let conversation =
            spans[0]["attributes"].as_array().unwrap().iter().find(|a| a["key"] == "gen_ai.conversation.id").unwrap();
        assert_eq!(conversation["value"]["stringValue"], format!("ep-000{}", i + 1));
    }
    // -o writes the same to a file.
    let file = dir.path().join("spans.jsonl");
    let out = basecamp(&["trace", "export", "--otlp", &d, "-o", &file.display().to_string()]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 3);

    let out = basecamp(&["trace", "export", &d]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: choose a format: --otlp (OpenTelemetry GenAI spans as OTLP/JSON)\n"
    );
}

#[test]
fn an_output_that_is_an_input_is_refused_and_the_input_kept() {
    let dir = tempfile::tempdir().unwrap();
    let ep = generate(&EpisodeShape { seed: 7, steps: 3, tokens_per_step: 2, ..Default::default() });
    let trace = dir.path().join("ep.trace");
    let bytes = ep.write_to(Vec::new(), 3).unwrap();
    std::fs::write(&trace, &bytes).unwrap();
    let t = trace.display().to_string();
    let out = basecamp(&["trace", "export", "--otlp", &t, "-o", &t]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("error: {t}: the output would overwrite this input; choose another -o file\n")
    );
    assert_eq!(std::fs::read(&trace).unwrap(), bytes, "the input is untouched");

    // A directory as -o is named as such, and nothing is left next to it.
    let d = dir.path().display().to_string();
    let out = basecamp(&["trace", "export", "--otlp", &t, "-o", &d]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with(&format!("error: {d} is a directory;")));
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["ep.trace"]);

    // A good export leaves the file only, no temporary.
    let file = dir.path().join("spans.jsonl");
    let out = basecamp(&["trace", "export", "--otlp", &t, "-o", &file.display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 1);
    assert!(!dir.path().join("spans.jsonl.partial").exists());
}

#[test]
fn a_failed_write_stops_the_export() {
    let dir = tempfile::tempdir().unwrap();
    // The first trace's request is larger than the output's buffer, so its
    // write fails at once; the damaged traces after it would each say so.
    let big = generate(&EpisodeShape { seed: 1, steps: 50, tokens_per_step: 2, ..Default::default() });
    std::fs::write(dir.path().join("ep-0.trace"), big.write_to(Vec::new(), 3).unwrap()).unwrap();
    for i in 1..=4 {
        let bytes = generate(&EpisodeShape { seed: i, steps: 5, tokens_per_step: 2, ..Default::default() })
            .write_to(Vec::new(), 3)
            .unwrap();
        std::fs::write(dir.path().join(format!("ep-{i}.trace")), &bytes[..bytes.len() / 2]).unwrap();
    }
    let full = std::fs::File::create("/dev/full").expect("/dev/full, a file every write to fails");
    let out = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "export", "--otlp", "-j", "1"])
        .arg(dir.path())
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "only the write error, no later trace read: {stderr}");
    assert!(stderr.starts_with("error: cannot write the export:"), "{stderr}");
}

#[test]
fn an_export_that_read_no_trace_leaves_an_existing_output_as_it_was() {
    // `export --otlp garbage.trace -o k.jsonl` replaced k.jsonl with an
    // empty file before exiting 1.
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.trace");
    std::fs::write(&garbage, b"not a trace at all").unwrap();
    let out_file = dir.path().join("k.jsonl");
    std::fs::write(&out_file, "{\"earlier\": true}\n").unwrap();
    let (g, o) = (garbage.display().to_string(), out_file.display().to_string());
    let out = basecamp(&["trace", "export", "--otlp", &g, "-o", &o]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "error: {g}: not a basecamp trace (bad magic at byte 0)\n\
             error: no trace could be exported (each is named above); {o} was not written\n"
        )
    );
    assert_eq!(std::fs::read_to_string(&out_file).unwrap(), "{\"earlier\": true}\n");
    assert!(!dir.path().join("k.jsonl.partial").exists());
}
