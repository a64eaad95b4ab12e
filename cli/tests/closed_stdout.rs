//! The trace commands started with stdout closed (`>&-`): Rust's runtime
//! puts /dev/null on fd 1, so output vanished and the command exited 0.
//! That is an error, unlike a reader of a pipe that went away.

use std::process::Command;

use basecamp_trace::synthetic::{EpisodeShape, generate};

/// `basecamp ARGS >&-`, through sh; its status and stderr.
fn with_stdout_closed(args: &[&str], redirect: &str) -> (Option<i32>, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("exec \"$0\" \"$@\" {redirect}"))
        .arg(env!("CARGO_BIN_EXE_basecamp"))
        .args(args)
        .output()
        .expect("sh runs");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_closed_stdout_is_an_error_and_dev_null_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("ep.trace");
    let ep = generate(&EpisodeShape { seed: 1, steps: 3, tokens_per_step: 1, ..Default::default() });
    std::fs::write(&trace, ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    let t = trace.to_str().unwrap();
    let archive = dir.path().join("a.tar.zst");
    let commands: [&[&str]; 3] =
        [&["trace", "parse", t], &["trace", "archive", t, "-o", "-"], &["trace", "validate", t]];
    for args in commands {
        let (code, stderr) = with_stdout_closed(args, ">&-");
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: stdout is closed"), "{args:?}: {stderr}");
        // Discarding output on purpose is fine.
        let (code, stderr) = with_stdout_closed(args, ">/dev/null");
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
    }
    let (code, _) = with_stdout_closed(&["trace", "archive", t, "-o", archive.to_str().unwrap()], ">&-");
    assert_eq!(code, Some(1));
    assert!(!archive.exists(), "refused before anything was written");
}
