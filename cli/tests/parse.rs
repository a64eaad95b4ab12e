//! `basecamp trace parse` as a user runs it: the real binary, real files,
//! exit codes, stdout and stderr.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

#[path = "support/unended.rs"]
mod unended;
use unended::unended_trace;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../trace/tests/golden").join(name)
}

fn parse(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "parse"])
        .arg(file)
        .args(args)
        .output()
        .expect("the basecamp binary runs")
}

fn stderr_line(out: &Output) -> String {
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {stderr:?}");
    lines[0].to_string()
}

/// The committed JSON of a golden file, naming the file (in `file` and in
/// the damage message) by the path the CLI was given.
fn committed_json(name: &str, file: &Path) -> Value {
    let text = std::fs::read_to_string(golden(name).with_extension("json")).unwrap();
    let mut doc: Value = serde_json::from_str(&text).unwrap();
    doc["file"] = Value::String(file.display().to_string());
    if let Some(message) = doc["damage"]["message"].as_str() {
        let rest = message.strip_prefix(&format!("{name}: ")).expect("the message names the file");
        doc["damage"]["message"] = Value::String(format!("{}: {rest}", file.display()));
    }
    doc
}

#[test]
fn a_finished_trace_prints_its_json_and_exits_0() {
    let file = golden("episode-v1.trace");
    let out = parse(&[], &file);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert_eq!(doc["complete"], Value::Bool(true));
    assert_eq!(doc, committed_json("episode-v1.trace", &file));
    // `--output json` is the default, and may be spelled out.
    let explicit = parse(&["--output", "json"], &file);
    assert_eq!(explicit.status.code(), Some(0));
    assert_eq!(explicit.stdout, out.stdout);
}

#[test]
fn an_empty_file_exits_1_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("empty.trace");
    std::fs::write(&file, b"").unwrap();
    let out = parse(&[], &file);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "nothing to print for an empty file");
    assert_eq!(stderr_line(&out), format!("error: {}: empty file, nothing at byte 0, not a trace", file.display()));
}

#[test]
fn a_file_that_is_not_a_trace_exits_1_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("episode.json");
    std::fs::copy(golden("episode-v1.json"), &file).unwrap();
    let out = parse(&[], &file);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert_eq!(stderr_line(&out), format!("error: {}: not a basecamp trace (bad magic at byte 0)", file.display()));
}

#[test]
fn a_truncated_trace_prints_what_was_recovered_and_exits_1() {
    let file = golden("truncated-v1.trace");
    let size = std::fs::metadata(&file).unwrap().len();
    let out = parse(&[], &file);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr_line(&out),
        format!("error: {}: truncated at byte {size}: records of 2 steps recovered", file.display())
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("the recovered prefix is still printed");
    assert_eq!(doc, committed_json("truncated-v1.trace", &file));
}

#[test]
fn a_trace_cut_mid_frame_names_the_frame_it_lost() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cut.trace");
    let bytes = std::fs::read(golden("episode-v1.trace")).unwrap();
    // Cut inside the last records frame: find where the readable prefix ends
    // by asking the library, then check the CLI reports the same byte.
    let cut = bytes.len() - 200;
    std::fs::write(&file, &bytes[..cut]).unwrap();
    let expected = basecamp_trace::read_trace(&file).unwrap();
    let damage = expected.damage().expect("a cut file is damaged").to_string();
    assert!(damage.contains("truncated at byte "), "{damage}");
    let out = parse(&[], &file);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr_line(&out), format!("error: {damage}"));
    assert!(stderr_line(&out).contains(&file.display().to_string()));
}

#[test]
fn allow_truncated_accepts_a_clean_truncation_only() {
    let file = golden("truncated-v1.trace");
    let out = parse(&["--allow-truncated"], &file);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert!(stderr_line(&out).starts_with(&format!("warning: {}: truncated at byte ", file.display())));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["complete"], Value::Bool(false));

    // Corruption is not a truncation: still an error.
    let dir = tempfile::tempdir().unwrap();
    let corrupt = dir.path().join("corrupt.trace");
    let mut bytes = std::fs::read(golden("episode-v1.trace")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01; // the trailer magic
    std::fs::write(&corrupt, &bytes).unwrap();
    let out = parse(&["--allow-truncated"], &corrupt);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr_line(&out).starts_with(&format!("error: {}: corrupt frame at byte ", corrupt.display())),
        "{}",
        stderr_line(&out)
    );

    // And a file that cannot be read at all is an error with or without the flag.
    let empty = dir.path().join("empty.trace");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(parse(&["--allow-truncated"], &empty).status.code(), Some(1));
}

#[test]
fn a_missing_file_exits_1_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("missing.trace");
    let out = parse(&[], &file);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_line(&out).starts_with(&format!("error: {}: cannot read: ", file.display())));
}

#[test]
fn several_traces_print_json_lines_in_order_and_every_problem_once() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("shard-1")).unwrap();
    let (a, b, junk) = (run.join("a.trace"), run.join("shard-1/b.trace"), run.join("junk.trace"));
    std::fs::copy(golden("episode-v1.trace"), &a).unwrap();
    std::fs::copy(golden("truncated-v1.trace"), &b).unwrap();
    std::fs::write(&junk, b"not a trace").unwrap();
    let run_parse = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_basecamp")).args(["trace", "parse"]).args(args).output().unwrap()
    };
    let lines = |out: &Output| -> Vec<Value> {
        String::from_utf8(out.stdout.clone()).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };

    // A directory: one line per trace (the same document as parsing it alone), in path order;
    // the damaged one still printed, the unreadable one only named; exit 1.
    let out = run_parse(&[run.to_str().unwrap(), "-j", "2"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(lines(&out), vec![committed_json("episode-v1.trace", &a), committed_json("truncated-v1.trace", &b)]);
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    let size = std::fs::metadata(&b).unwrap().len();
    assert_eq!(
        stderr,
        format!(
            "error: {}: not a basecamp trace (bad magic at byte 0)\nerror: {}: truncated at byte {size}: records of 2 steps recovered\n",
            junk.display(),
            b.display()
        )
    );

    // Several files and a glob, in the order given; --allow-truncated accepts the cut one.
    let glob = format!("{}/shard-*/*.trace", run.display());
    let out = run_parse(&[&glob, a.to_str().unwrap(), "--allow-truncated"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let found: Vec<String> = lines(&out).iter().map(|d| d["file"].as_str().unwrap().to_string()).collect();
    assert_eq!(found, [b.display().to_string(), a.display().to_string()]);

    // One file is still one pretty document; many cannot be one HTML page.
    let one = run_parse(&[a.to_str().unwrap()]);
    assert!(String::from_utf8(one.stdout).unwrap().starts_with("{\n"));
    let out = run_parse(&[run.to_str().unwrap(), "--output", "html"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_line(&out).contains("--output html draws one trace; give one FILE, or use `basecamp trace report"));
    assert!(out.stdout.is_empty());
}

#[test]
fn a_trace_without_an_episode_end_is_not_complete() {
    // It printed "complete": true, "damage": null and exited 0, while
    // `trace validate` reports "no episode end".
    let dir = tempfile::tempdir().unwrap();
    for (name, steps) in [("no_end.trace", 3), ("only_header.trace", 0)] {
        let file = dir.path().join(name);
        std::fs::write(&file, unended_trace(steps)).unwrap();
        let out = parse(&[], &file);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["complete"], false, "{name}");
        assert_eq!(doc["damage"]["category"], "TraceNoEpisodeEnd", "{name}: the reader says why");
        assert_eq!(doc["records"].as_array().unwrap().len(), steps as usize, "{name}");
        let line = stderr_line(&out);
        let prefix = format!("error: {}: no episode end: the file reads to its footer index (byte ", file.display());
        assert!(line.starts_with(&prefix), "{line}");
        assert!(line.ends_with("`basecamp trace validate` checks the rest"), "{line}");
        assert_eq!(doc["damage"]["message"].as_str().map(|m| format!("error: {m}")), Some(line.clone()));
        // --allow-truncated accepts a writer killed mid-episode, not this.
        assert_eq!(parse(&["--allow-truncated"], &file).status.code(), Some(1), "{name}");
        // Several traces: the same line, the same status.
        let out = Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["trace", "parse"])
            .args([&file, &golden("episode-v1.trace")])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}");
        assert_eq!(stderr_line(&out), line);
    }
}

/// `basecamp ARGS` with `bytes` written to its stdin through a pipe.
fn with_piped_stdin(args: &[&str], bytes: &[u8]) -> Output {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the basecamp binary runs");
    let mut stdin = child.stdin.take().expect("piped");
    let bytes = bytes.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&bytes);
    });
    let out = child.wait_with_output().expect("it ends");
    writer.join().unwrap();
    out
}

#[test]
fn a_trace_piped_to_dev_stdin_is_parsed_and_redacted() {
    // `cat X.trace | basecamp trace parse /dev/stdin` said "empty file,
    // nothing at byte 0, not a trace": the pipe was read twice.
    let bytes = std::fs::read(golden("episode-v1.trace")).unwrap();
    let out = with_piped_stdin(&["trace", "parse", "/dev/stdin"], &bytes);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let expected = committed_json("episode-v1.trace", Path::new("/dev/stdin"));
    assert_eq!(doc, expected);

    let dir = tempfile::tempdir().unwrap();
    let o = dir.path().join("out").display().to_string();
    let out =
        with_piped_stdin(&["trace", "redact", "/dev/stdin", "--patterns", "email", "--salt", "s", "-o", &o], &bytes);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let copy = basecamp_trace::read_trace(dir.path().join("out/stdin")).unwrap();
    assert!(copy.damage().is_none());
}
