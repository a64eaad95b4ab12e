//! `basecamp trace validate` as a user runs it.

use std::process::Command;

use basecamp_trace::pb::record::Body;
use basecamp_trace::synthetic::{EpisodeShape, generate};

fn basecamp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("the basecamp binary runs")
}

#[test]
fn valid_traces_exit_0_and_each_finding_names_file_and_step() {
    let dir = tempfile::tempdir().unwrap();
    for seed in 1..=3 {
        let ep = generate(&EpisodeShape { seed, steps: 10, tokens_per_step: 2, ..Default::default() });
        std::fs::write(dir.path().join(format!("ep-{seed}.trace")), ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    }
    let root = dir.path().display().to_string();
    let out = basecamp(&["trace", "validate", &root]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(out.stdout.is_empty());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "3 traces checked: all valid\n");

    // Break the hash chain of ep-2 at step 4, and truncate ep-3.
    let mut ep = generate(&EpisodeShape { seed: 2, steps: 10, tokens_per_step: 2, ..Default::default() });
    for r in &mut ep.steps[3] {
        if let Some(Body::PlanStep(p)) = &mut r.body {
            p.memory_hash_after = vec![1; 32];
        }
    }
    let broken = dir.path().join("ep-2.trace");
    std::fs::write(&broken, ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    let cut = dir.path().join("ep-3.trace");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 30]).unwrap();

    let out = basecamp(&["trace", "validate", &root]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].starts_with(&format!("{}: step 4: memory: hash chain broken: memory_hash_before ", broken.display())),
        "{}",
        lines[0]
    );
    assert!(lines[1].starts_with(&format!("{}: schema: truncated at byte ", cut.display())), "{}", lines[1]);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "3 traces checked: 2 findings in 2 traces\n");

    let out = basecamp(&["trace", "validate", "--json", &broken.display().to_string()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["step"].as_u64(), v["check"].as_str()), (Some(4), Some("memory")));
}

#[test]
fn a_directory_without_traces_is_an_error_not_all_valid() {
    let dir = tempfile::tempdir().unwrap();
    // Traces saved under another name are not found by a directory search.
    let ep = generate(&EpisodeShape { seed: 1, steps: 2, tokens_per_step: 1, ..Default::default() });
    std::fs::write(dir.path().join("ep-1.trace.bak"), ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    let root = dir.path().display().to_string();
    // Before: "0 traces checked: all valid", exit 0.
    for args in [
        vec!["trace", "validate", &root],
        vec!["trace", "search", "exists(error_context)", &root],
        vec!["trace", "export", "--otlp", &root],
    ] {
        let out = basecamp(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("error: {root}: no .trace files in this directory (searched recursively)\n"),
            "{args:?}"
        );
    }
}

#[test]
fn zero_workers_or_a_zero_timeout_are_refused_naming_the_flag() {
    // Before: -j 0 (every trace command) and --timeout-s 0 were silently taken as 1.
    for command in ["validate", "search", "export", "redact", "archive", "parse", "report"] {
        let mut args = vec!["trace", command];
        args.extend(match command {
            "search" => vec!["exists(plan_execution)", "."],
            "export" => vec!["--otlp", "."],
            "redact" => vec![".", "-o", "out", "--pii-fields", "x"],
            "archive" => vec![".", "-o", "a.tar.zst"],
            _ => vec!["."],
        });
        args.extend(["-j", "0"]);
        let out = basecamp(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(stderr.contains("invalid value '0' for '--jobs <JOBS>': must be at least 1"), "{command}: {stderr}");
    }
    let out = basecamp(&[
        "sandbox",
        "inject",
        "--endpoint",
        "http://127.0.0.1:9",
        "--episode",
        "e",
        "--observation",
        "{}",
        "--timeout-s",
        "0",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invalid value '0' for '--timeout-s <TIMEOUT_S>'"), "{stderr}");
    // Before: an empty --episode was sent as /v1/episodes//inject.
    let out =
        basecamp(&["sandbox", "inject", "--endpoint", "http://127.0.0.1:9", "--episode", "", "--observation", "{}"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("a value is required for '--episode <EPISODE>' but none was supplied"), "{stderr}");
}

/// One file reached by several spellings across the arguments (`run
/// ./run`, `$PWD/run`, a symbolic link) is checked once; a hard-linked copy
/// is another name in the tree, counted as one (before: 4 traces for 2 files,
/// and an inode test that held only within one argument).
#[test]
fn a_trace_given_by_several_spellings_is_checked_once() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    for seed in 1..=2 {
        let ep = generate(&EpisodeShape { seed, steps: 3, tokens_per_step: 2, ..Default::default() });
        std::fs::write(run.join(format!("ep-{seed}.trace")), ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    }
    std::os::unix::fs::symlink(&run, dir.path().join("link")).unwrap();
    let checked = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["trace", "validate"])
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stdout));
        String::from_utf8(out.stderr).unwrap()
    };
    let absolute = run.display().to_string();
    assert_eq!(checked(&["run", "./run", &absolute, "link", "run/ep-1.trace"]), "2 traces checked: all valid\n");
    std::fs::hard_link(run.join("ep-1.trace"), run.join("copy.trace")).unwrap();
    assert_eq!(checked(&["run", "./run"]), "3 traces checked: all valid\n");
}

/// One finding, one line: a file name holding a newline (or an ESC) is
/// printed quoted and escaped. Before: the finding was split over two lines.
#[test]
fn a_file_name_with_a_control_character_keeps_its_finding_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let ep = generate(&EpisodeShape { seed: 1, steps: 4, tokens_per_step: 1, ..Default::default() });
    let bytes = ep.write_to(Vec::new(), 3).unwrap();
    let odd = dir.path().join("ep\n1.trace");
    std::fs::write(&odd, &bytes[..bytes.len() / 2]).unwrap();
    let out = basecamp(&["trace", "validate", odd.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with(&format!("{:?}: schema: truncated at byte ", odd.display().to_string())), "{stdout}");
}
