//! File names with control characters in the trace commands' plain output
//! and errors: quoted (`"a\nb"`), never printed raw, so a name cannot forge
//! another line (`error: ...: all good`) or reach the terminal (ESC).

use std::path::Path;
use std::process::Command;

use basecamp_trace::synthetic::{EpisodeShape, generate};

const FORGING: &str = "a\nerror: fake.trace: all good\nb.trace";
const ESCAPING: &str = "x\x1b[31mred\nnew.trace";

fn basecamp(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("the basecamp binary runs");
    (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

/// Neither stream holds a raw control character other than its line ends,
/// or a line the file name forged.
fn assert_quoted(what: &str, (stdout, stderr): &(String, String)) {
    for text in [stdout, stderr] {
        assert!(!text.contains('\x1b'), "{what}: a raw ESC: {text:?}");
        assert!(
            !text.lines().any(|l| l.starts_with("error: fake.trace") || l.starts_with("b.trace")),
            "{what}: {text:?}"
        );
        assert!(!text.lines().any(|l| l.starts_with("red") || l.starts_with("new.trace")), "{what}: {text:?}");
    }
}

fn write_trace(path: &Path, seed: u64, cut: bool) {
    let mut bytes = generate(&EpisodeShape { seed, steps: 3, tokens_per_step: 1, ..Default::default() })
        .write_to(Vec::new(), 3)
        .unwrap();
    if cut {
        bytes.truncate(bytes.len() * 2 / 3);
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn names_with_control_characters_are_quoted_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    write_trace(&runs.join(FORGING), 1, true);
    write_trace(&runs.join(ESCAPING), 2, false);
    let r = runs.display().to_string();
    let o = |name: &str| dir.path().join(name).display().to_string();

    let parsed = basecamp(&["trace", "parse", &r]);
    assert!(parsed.1.contains(r#"a\nerror: fake.trace: all good\nb.trace""#), "{:?}", parsed.1);
    assert_quoted("parse", &parsed);
    assert_quoted("parse one", &basecamp(&["trace", "parse", &runs.join(FORGING).display().to_string()]));
    assert_quoted("validate", &basecamp(&["trace", "validate", &r]));
    assert_quoted("search", &basecamp(&["trace", "search", "step == 1", &r]));
    assert_quoted("export", &basecamp(&["trace", "export", "--otlp", &r, "-o", &o("spans.jsonl")]));
    assert_quoted(
        "redact",
        &basecamp(&["trace", "redact", &r, "--patterns", "email", "--allow-truncated", "-o", &o("red")]),
    );
    let archive = o("a.tar.zst");
    assert_quoted("archive", &basecamp(&["trace", "archive", &r, "-o", &archive]));
    let listed = basecamp(&["trace", "archive", "list", &archive]);
    assert_eq!(listed.0.lines().count(), 3, "a header and one line a trace: {:?}", listed.0);
    assert_quoted("archive list", &listed);
    assert_quoted(
        "archive extract",
        &basecamp(&["trace", "archive", "extract", &archive, "ep-0001", "ep-0002", "-o", &o("x")]),
    );
    let cleanup = basecamp(&["trace", "cleanup", &r, "--older-than", "0s"]);
    assert_eq!(cleanup.0.lines().count(), 3, "{:?}", cleanup.0);
    assert_quoted("cleanup", &cleanup);
    assert_quoted("report", &basecamp(&["trace", "report", &r, "--metric", "steps", "-o", &o("r.html")]));
}
