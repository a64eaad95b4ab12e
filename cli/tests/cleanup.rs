//! `basecamp trace cleanup`: a dry run by default, and only old `.trace` files ever go.

use std::fs::File;
use std::process::Command;
use std::time::{Duration, SystemTime};

fn basecamp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("the basecamp binary runs")
}

fn write_aged(path: &std::path::Path, bytes: usize, days_old: u64) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, vec![0u8; bytes]).unwrap();
    let when = SystemTime::now() - Duration::from_secs(days_old * 86_400);
    File::options().write(true).open(path).unwrap().set_modified(when).unwrap();
}

#[test]
fn only_old_traces_go_and_only_with_delete() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_aged(&root.join("2026/01/a/ep-1.trace"), 100, 30);
    write_aged(&root.join("2026/01/a/ep-2.trace"), 50, 10);
    write_aged(&root.join("2026/01/a/ep-3.trace"), 70, 1);
    // Old, but never traces: these must survive.
    write_aged(&root.join("2026/01/a/summary.json"), 10, 30);
    write_aged(&root.join("2026/01/a/index.json"), 10, 30);
    write_aged(&root.join("checkpoints/step-1200.safetensors"), 10, 30);
    write_aged(&root.join("2026/01/a/ep-1.rollback_trace.json"), 10, 30);
    let r = root.display().to_string();

    let out = basecamp(&["trace", "cleanup", &r, "--older-than", "7d"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout,
        format!(
            "would delete {r}/2026/01/a/ep-1.trace (100 bytes)\nwould delete {r}/2026/01/a/ep-2.trace (50 bytes)\n\
             dry run: would delete 2 traces, 150 bytes; 1 newer traces kept; add --delete to delete\n"
        )
    );
    assert!(root.join("2026/01/a/ep-1.trace").exists(), "a dry run deletes nothing");

    // A glob that also matches other files leaves them alone.
    let glob = format!("{r}/**/*");
    let out = basecamp(&["trace", "cleanup", &glob, "--older-than", "7d", "--delete"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.ends_with("deleted 2 traces, 150 bytes; 1 newer traces kept; 4 files that are not .trace left alone\n"),
        "{stdout}"
    );
    assert!(!root.join("2026/01/a/ep-1.trace").exists());
    assert!(!root.join("2026/01/a/ep-2.trace").exists());
    for kept in [
        "2026/01/a/ep-3.trace",
        "2026/01/a/summary.json",
        "2026/01/a/index.json",
        "checkpoints/step-1200.safetensors",
        "2026/01/a/ep-1.rollback_trace.json",
    ] {
        assert!(root.join(kept).exists(), "{kept} was deleted");
    }

    let out = basecamp(&["trace", "cleanup", &r, "--older-than", "7 days"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown unit"));
}
