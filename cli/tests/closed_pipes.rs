//! The commands when stderr's reader goes away early: they used to panic in
//! `eprintln!`, and the trace commands could hang with their workers waiting
//! forever. Now what stderr would have said is lost and the command ends as
//! it would have.

use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use basecamp_trace::synthetic::{EpisodeShape, generate};

/// Writes `n` traces under `dir`, every other one cut in half, so each
/// command has many lines to say on stderr.
fn write_damaged_traces(dir: &Path, n: u64) {
    std::fs::create_dir_all(dir).unwrap();
    for seed in 1..=n {
        let shape = EpisodeShape { seed, steps: 8, tokens_per_step: 2, ..Default::default() };
        let mut bytes = generate(&shape).write_to(Vec::new(), 3).unwrap();
        if seed % 2 == 0 {
            bytes.truncate(bytes.len() / 2);
        }
        std::fs::write(dir.join(format!("ep-{seed:03}.trace")), bytes).unwrap();
    }
}

/// Runs basecamp with stderr's read end closed before it starts writing;
/// its status and stdout. A run past 60 s is killed and fails the test.
fn run_with_stderr_closed(args: &[&str], cwd: &Path) -> (ExitStatus, Vec<u8>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the basecamp binary runs");
    drop(child.stderr.take());
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for basecamp") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still running 60 s after its stderr was closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, reader.join().expect("the stdout reader ends"))
}

fn partial_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(partial_files(&path));
        } else if path.to_string_lossy().ends_with(".partial") {
            found.push(path.display().to_string());
        }
    }
    found
}

#[test]
fn a_closed_stderr_neither_hangs_nor_panics_nor_leaves_partial_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_damaged_traces(&root.join("runs"), 40);
    let commands: [&[&str]; 7] = [
        &["trace", "search", "step == 1", "runs", "-j", "4"],
        &["trace", "parse", "runs/ep-002.trace"],
        &["trace", "validate", "runs", "-j", "4"],
        &["trace", "export", "--otlp", "runs", "-j", "4", "-o", "spans.jsonl"],
        &["trace", "redact", "runs", "--patterns", "email", "--salt", "s", "-o", "red", "-j", "4"],
        &["trace", "archive", "runs", "-o", "a.tar.zst", "-j", "4"],
        &["trace", "report", "runs", "--metric", "steps", "-o", "r.html", "-j", "4"],
    ];
    for args in commands {
        for _ in 0..3 {
            let (status, _) = run_with_stderr_closed(args, root);
            // The damaged traces make most of them fail (1); a panic is 101.
            assert!(matches!(status.code(), Some(0 | 1)), "{args:?}: {status}");
            assert_eq!(partial_files(root), Vec::<String>::new(), "{args:?}");
        }
    }
    // What stderr would have said is lost; the outputs are whole.
    let (_, stdout) = run_with_stderr_closed(&["trace", "search", "step == 1", "runs", "-j", "4"], root);
    assert_eq!(String::from_utf8(stdout).unwrap().lines().count(), 40, "every trace has a step 1");
    assert!(root.join("a.tar.zst").is_file());
    assert!(root.join("spans.jsonl").is_file());
}

#[test]
fn the_other_commands_outlive_a_closed_stderr_too() {
    let dir = tempfile::tempdir().unwrap();
    let harness = r#"{
      "task_definition": {"name": "shop", "success_criteria": ["bogus_metric >= 0.9"]},
      "evaluation": {"test_set": "s3://data/tests.jsonl", "metrics": ["bogus"]},
      "policy": {"endpoint": "http://127.0.0.1:8000/v1", "model": "m"}
    }"#;
    std::fs::write(dir.path().join("harness.json"), harness).unwrap();
    // convert says its warnings on stderr, the manifest on stdout.
    let (status, stdout) =
        run_with_stderr_closed(&["harness", "convert", "harness.json", "--sandbox", "shop"], dir.path());
    assert_eq!(status.code(), Some(0), "harness convert: {status}");
    assert!(String::from_utf8(stdout).unwrap().contains("kind: HarnessTask"));
}
