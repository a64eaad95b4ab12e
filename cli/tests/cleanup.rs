//! `basecamp trace cleanup`: a dry run by default, and only old `.trace`
//! files ever go, locally and on S3. S3 is the real test server (s3s-fs on
//! 127.0.0.1, `support/s3.rs`), which gives a file's modification time as
//! its object's `LastModified`, so an object is aged by aging its file. A
//! key refused in a `DeleteObjects` answer (which s3s-fs never does) comes
//! from a small stand-in server.

#[path = "support/s3.rs"]
mod s3;

use std::fs::File;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use s3::{BUCKET, S3Server, basecamp_with_s3};

fn basecamp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("the basecamp binary runs")
}

/// A file of `bytes` bytes, `days_old` days old: one named `*.trace` begins as a trace does.
fn write_aged(path: &std::path::Path, bytes: usize, days_old: u64) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut content = vec![0u8; bytes];
    if path.extension().is_some_and(|e| e == "trace") {
        let magic = &basecamp_trace::format::MAGIC[..bytes.min(8)];
        content[..magic.len()].copy_from_slice(magic);
    }
    std::fs::write(path, content).unwrap();
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
    // Named like a trace, but not one (before: counted and deleted as a trace).
    write_aged(&root.join("notes/fake.json"), 10, 30);
    std::fs::rename(root.join("notes/fake.json"), root.join("notes/fake.trace")).unwrap();
    // Nor is a FIFO named directly, whose read would block the command (it hung).
    let pipe = root.join("notes/pipe.trace");
    assert!(Command::new("mkfifo").arg(&pipe).status().unwrap().success());
    let out = Command::new("timeout")
        .args(["60", env!("CARGO_BIN_EXE_basecamp"), "trace", "cleanup"])
        .arg(&pipe)
        .args(["--older-than", "0s", "--delete"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pipe.trace: not a basecamp trace"));
    assert!(pipe.exists());
    std::fs::remove_file(&pipe).unwrap();
    let r = root.display().to_string();

    let out = basecamp(&["trace", "cleanup", &r, "--older-than", "7d"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout,
        format!(
            "would delete {r}/2026/01/a/ep-1.trace (100 bytes)\nwould delete {r}/2026/01/a/ep-2.trace (50 bytes)\n\
             dry run: would delete 2 traces, 150 bytes; 1 newer traces kept; 1 files that are not traces left alone; \
             add --delete to delete\n"
        )
    );
    assert!(root.join("2026/01/a/ep-1.trace").exists(), "a dry run deletes nothing");

    // A glob that also matches other files leaves them alone.
    let glob = format!("{r}/**/*");
    let out = basecamp(&["trace", "cleanup", &glob, "--older-than", "7d", "--delete"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.ends_with("deleted 2 traces, 150 bytes; 1 newer traces kept; 5 files that are not traces left alone\n"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{r}/notes/fake.trace: not a basecamp trace (bad magic); left alone")),
        "{stderr}"
    );
    assert!(!root.join("2026/01/a/ep-1.trace").exists());
    assert!(!root.join("2026/01/a/ep-2.trace").exists());
    for kept in [
        "notes/fake.trace",
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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The same tree as the local test, as objects under `runs/` of the test
/// bucket (s3s-fs stores a key as a path), plus one old trace elsewhere.
fn seed_bucket(data: &Path) {
    let bucket = data.join(BUCKET);
    write_aged(&bucket.join("runs/2026/01/a/ep-1.trace"), 100, 30);
    write_aged(&bucket.join("runs/2026/01/a/ep-2.trace"), 50, 10);
    write_aged(&bucket.join("runs/2026/01/a/ep-3.trace"), 70, 1);
    write_aged(&bucket.join("runs/2026/01/a/summary.json"), 10, 30);
    write_aged(&bucket.join("runs/2026/01/a/index.json"), 10, 30);
    write_aged(&bucket.join("runs/checkpoints/step-1200.safetensors"), 10, 30);
    write_aged(&bucket.join("runs/2026/01/a/ep-1.rollback_trace.json"), 10, 30);
    write_aged(&bucket.join("other/ep-9.trace"), 30, 20);
}

#[test]
fn s3_prefixes_and_keys_lose_only_their_old_traces() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    seed_bucket(&data);
    let local = dir.path().join("local");
    write_aged(&local.join("ep-old.trace"), 7, 30);
    write_aged(&local.join("ep-new.trace"), 8, 0);
    let server = S3Server::start(&data);
    let bucket = data.join(BUCKET);
    let prefix = format!("s3://{BUCKET}/runs");
    let l = local.display().to_string();

    // A dry run: the same lines and summary as for local files, nothing deleted.
    let out = server.basecamp(&["trace", "cleanup", &prefix, "--older-than", "7d"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!(
            "would delete {prefix}/2026/01/a/ep-1.trace (100 bytes)\nwould delete {prefix}/2026/01/a/ep-2.trace (50 bytes)\n\
             dry run: would delete 2 traces, 150 bytes; 1 newer traces kept; add --delete to delete\n"
        )
    );
    assert!(bucket.join("runs/2026/01/a/ep-1.trace").exists(), "a dry run deletes nothing");

    // Local and S3 in one run, in argument order; one object named by its key.
    let key = format!("s3://{BUCKET}/other/ep-9.trace");
    let out = server.basecamp(&["trace", "cleanup", &l, &key, "--older-than", "7d"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!(
            "would delete {l}/ep-old.trace (7 bytes)\nwould delete {key} (30 bytes)\n\
             dry run: would delete 2 traces, 37 bytes; 1 newer traces kept; add --delete to delete\n"
        )
    );

    // --delete: exactly the old traces go, under the prefix and named directly.
    let out = server.basecamp(&["trace", "cleanup", &prefix, &l, &key, "--older-than", "7d", "--delete"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!(
            "deleted {prefix}/2026/01/a/ep-1.trace (100 bytes)\ndeleted {prefix}/2026/01/a/ep-2.trace (50 bytes)\n\
             deleted {l}/ep-old.trace (7 bytes)\ndeleted {key} (30 bytes)\n\
             deleted 4 traces, 187 bytes; 2 newer traces kept\n"
        )
    );
    for gone in ["runs/2026/01/a/ep-1.trace", "runs/2026/01/a/ep-2.trace", "other/ep-9.trace"] {
        assert!(!bucket.join(gone).exists(), "{gone} was not deleted");
    }
    assert!(!local.join("ep-old.trace").exists());
    assert!(local.join("ep-new.trace").exists());
    for kept in [
        "runs/2026/01/a/ep-3.trace",
        "runs/2026/01/a/summary.json",
        "runs/2026/01/a/index.json",
        "runs/checkpoints/step-1200.safetensors",
        "runs/2026/01/a/ep-1.rollback_trace.json",
    ] {
        assert!(bucket.join(kept).exists(), "{kept} was deleted");
    }

    // Run again: nothing old is left.
    let out = server.basecamp(&["trace", "cleanup", &prefix, "--older-than", "7d", "--delete"], dir.path());
    assert_eq!(text(&out.stdout), "deleted 0 traces, 0 bytes; 1 newer traces kept\n");

    // A trace key that is not there, and a prefix without traces.
    let out = server.basecamp(&["trace", "cleanup", &key, "--older-than", "7d"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), format!("error: {key}: no such object\n"));
    let out =
        server.basecamp(&["trace", "cleanup", &format!("s3://{BUCKET}/nothing"), "--older-than", "7d"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), format!("note: s3://{BUCKET}/nothing: no .trace objects under this prefix\n"));
}

#[test]
fn an_unreachable_endpoint_is_named_and_nothing_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("local");
    write_aged(&local.join("ep-old.trace"), 7, 30);
    let prefix = format!("s3://{BUCKET}/runs");
    let port = basecamp_sandbox::testing::free_port();
    let l = local.display().to_string();
    let out = basecamp_with_s3(port, &["trace", "cleanup", &l, &prefix, "--older-than", "7d", "--delete"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), format!("error: failed to list {prefix}: connection refused (after 4 attempts)\n"));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(local.join("ep-old.trace").exists(), "nothing is deleted when a location cannot be read");
}

#[test]
fn a_key_s3_refuses_to_delete_is_named_and_the_others_still_go() {
    let dir = tempfile::tempdir().unwrap();
    // Lists ep-1, denied and ep-2 under runs/ (old, 10 bytes each) and refuses denied.trace.
    let port = basecamp_sandbox::testing::RefusingDeleteServer::start().port;
    let prefix = format!("s3://{BUCKET}/runs");
    let out = basecamp_with_s3(port, &["trace", "cleanup", &prefix, "--older-than", "7d", "--delete"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!(
            "deleted {prefix}/ep-1.trace (10 bytes)\ndeleted {prefix}/ep-2.trace (10 bytes)\n\
             deleted 2 traces, 20 bytes; 0 newer traces kept\n"
        )
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "error: failed to delete {prefix}/denied.trace: AccessDenied: Access Denied (after 1 attempt); check"
        )),
        "{stderr}"
    );
    assert!(stderr.ends_with("error: 1 traces could not be deleted\n"), "{stderr}");
}

#[test]
fn a_trace_reached_by_two_spellings_counts_once_and_is_deleted_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("runs");
    write_aged(&root.join("a/ep-1.trace"), 100, 30);
    write_aged(&root.join("a/ep-2.trace"), 50, 30);
    std::os::unix::fs::symlink(root.join("a"), dir.path().join("latest")).unwrap();
    let r = root.display().to_string();
    let (dotted, latest) =
        (format!("{}/./runs", dir.path().display()), dir.path().join("latest").display().to_string());

    let out = basecamp(&["trace", "cleanup", &r, &dotted, &latest, "--older-than", "7d"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!(
            "would delete {r}/a/ep-1.trace (100 bytes)\nwould delete {r}/a/ep-2.trace (50 bytes)\n\
             dry run: would delete 2 traces, 150 bytes; 0 newer traces kept; add --delete to delete\n"
        )
    );

    let out = basecamp(&["trace", "cleanup", &r, &dotted, &latest, "--older-than", "7d", "--delete"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert!(String::from_utf8(out.stdout).unwrap().ends_with("deleted 2 traces, 150 bytes; 0 newer traces kept\n"));
    assert!(!root.join("a/ep-1.trace").exists() && !root.join("a/ep-2.trace").exists());
}

/// A snapshot tree of hard links (`cp -al`, `rsync --link-dest`) holds
/// each old trace under two names: both go, or nothing is freed.
#[test]
fn hard_linked_copies_of_an_old_trace_all_go() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_aged(&root.join("a/ep-1.trace"), 100, 30);
    std::fs::create_dir_all(root.join("b")).unwrap();
    std::fs::hard_link(root.join("a/ep-1.trace"), root.join("b/ep-1.trace")).unwrap();
    let r = root.display().to_string();
    let out = basecamp(&["trace", "cleanup", &r, "--older-than", "7d", "--delete"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("deleted 2 traces, 200 bytes; 0 newer traces kept\n"));
    assert!(!root.join("a/ep-1.trace").exists() && !root.join("b/ep-1.trace").exists());
}

/// A symbolic link named `*.trace` is aged and counted as itself (what
/// `--delete` removes), not as its target: a new link to an old trace stays,
/// and a link to a trace also found is not its bytes twice. Before: a link
/// made now to a 10-day-old trace was deleted "(N bytes)" with N the
/// target's size, freeing nothing.
#[test]
fn a_symbolic_link_is_aged_and_counted_as_itself() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_aged(&root.join("keep/old.trace"), 1000, 10);
    std::fs::create_dir_all(root.join("links")).unwrap();
    std::os::unix::fs::symlink("../keep/old.trace", root.join("links/new-link.trace")).unwrap();
    let links = root.join("links").display().to_string();
    let out = basecamp(&["trace", "cleanup", &links, "--older-than", "7d", "--delete"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "deleted 0 traces, 0 bytes; 1 newer traces kept\n");
    assert!(root.join("links/new-link.trace").exists());
    // The link's own size when it does go: not the target's 1,000 bytes.
    let out = basecamp(&["trace", "cleanup", &links, "--older-than", "0s"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let link_bytes = "../keep/old.trace".len();
    assert!(stdout.contains(&format!("new-link.trace ({link_bytes} bytes)")), "{stdout}");
}
