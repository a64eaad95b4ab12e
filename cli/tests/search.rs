//! `basecamp trace search` as a user runs it: real traces in a directory,
//! the real binary, stdout, stderr and exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use basecamp_trace::pb::record::Body;
use basecamp_trace::read_trace;
use basecamp_trace::synthetic::{EpisodeShape, generate};
use serde_json::Value;

#[path = "support/unended.rs"]
mod unended;

const QUERY: &str = r#"plan_execution.tool == "tracking_api" and latency_ms >= 800"#;

fn basecamp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("the basecamp binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Writes episodes with seeds 1..=n under `dir` (some in a subdirectory),
/// and a file that is not a trace next to them.
fn write_traces(dir: &Path, n: u64) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir.join("shard-1")).unwrap();
    std::fs::write(dir.join("summary.json"), "{}").unwrap();
    (1..=n)
        .map(|seed| {
            let sub = if seed % 2 == 0 { "shard-1/" } else { "" };
            let path = dir.join(format!("{sub}ep-{seed:02}.trace"));
            let shape = EpisodeShape { seed, steps: 30, tokens_per_step: 4, ..Default::default() };
            std::fs::write(&path, generate(&shape).write_to(Vec::new(), 3).unwrap()).unwrap();
            path
        })
        .collect()
}

/// (episode, step) of slow tracking_api calls, found by decoding every record.
fn expected(paths: &[PathBuf]) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for path in paths {
        let trace = read_trace(path).unwrap();
        for r in &trace.records {
            if let Some(Body::PlanStep(p)) = &r.body
                && p.tool == "tracking_api"
                && p.latency_micros >= 800_000
            {
                out.push((trace.header.episode_id.clone(), r.step));
            }
        }
    }
    out
}

#[test]
fn a_directory_is_searched_recursively_in_a_stable_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = write_traces(dir.path(), 6);
    // The order of the output: by path, as the directory walk sorts.
    paths.sort();
    let want = expected(&paths);
    assert!(!want.is_empty(), "the synthetic episodes should hold slow tracking_api calls");

    let root = dir.path().display().to_string();
    let out = basecamp(&["trace", "search", "--json", QUERY, &root]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let lines: Vec<Value> = text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let got: Vec<(String, u32)> = lines
        .iter()
        .map(|v| (v["episode"].as_str().unwrap().to_string(), v["step"].as_u64().unwrap() as u32))
        .collect();
    assert_eq!(got, want);
    for line in &lines {
        assert_eq!(line["section"], "plan_execution");
        // The offset is the start of the frame holding that step.
        let file = PathBuf::from(line["file"].as_str().unwrap());
        let mut indexed = basecamp_trace::IndexedTrace::open(&file).unwrap();
        let step = line["step"].as_u64().unwrap() as u32;
        assert!(!indexed.read_step(step).unwrap().is_empty());
        let bytes = std::fs::read(&file).unwrap();
        let at = line["offset"].as_u64().unwrap() as usize;
        let header: [u8; 20] = bytes[at..at + 20].try_into().unwrap();
        basecamp_trace::format::FrameHeader::decode(&header).unwrap();
    }

    // The text form says the same, one line per match, and the same with one worker.
    let out1 = basecamp(&["trace", "search", QUERY, &root, "--jobs", "1"]);
    let out2 = basecamp(&["trace", "search", QUERY, &root]);
    assert_eq!(out1.stdout, out2.stdout);
    let first = text(&out2.stdout).lines().next().unwrap().to_string();
    let (ep, step) = &want[0];
    assert!(first.ends_with(&format!(": episode {ep} step {step} (plan_execution)")), "{first}");
    assert_eq!(text(&out2.stdout).lines().count(), want.len());
}

#[test]
fn globs_and_files_select_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_traces(dir.path(), 4);
    let pattern = format!("{}/shard-*/*.trace", dir.path().display());
    let out = basecamp(&["trace", "search", "--json", "exists(plan_execution)", &pattern]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let episodes: std::collections::BTreeSet<String> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["episode"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(episodes.into_iter().collect::<Vec<_>>(), ["ep-0002", "ep-0004"]);

    let one = paths[0].display().to_string();
    let out = basecamp(&["trace", "search", "step == 3", &one]);
    assert_eq!(text(&out.stdout), format!("{one}:{}: episode ep-0001 step 3 (step)\n", step_offset(&paths[0], 3)));
}

fn step_offset(path: &Path, step: u32) -> u64 {
    // The first frame of a step, from a scan of the trace.
    let mut reader = basecamp_trace::TraceReader::open(path).unwrap();
    while let Some(r) = reader.next_raw() {
        if r.unwrap().step == step {
            return reader.frame_offset();
        }
    }
    panic!("step {step} not found");
}

#[test]
fn a_bad_query_shows_a_caret_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    write_traces(dir.path(), 1);
    let out = basecamp(&["trace", "search", "latency_ms >> 3", &dir.path().display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert_eq!(
        text(&out.stderr),
        "error: invalid query: expected a value (a \"string\", a number, true, false or null) after '>', found '>'\n  latency_ms >> 3\n              ^\n"
    );
}

#[test]
fn a_damaged_file_is_named_with_its_offset_and_the_others_are_still_searched() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = write_traces(dir.path(), 3);
    paths.sort();
    let bad = dir.path().join("ep-00-bad.trace");
    let mut bytes = std::fs::read(&paths[0]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&bad, &bytes).unwrap();

    let out = basecamp(&["trace", "search", "--json", QUERY, &dir.path().display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with(&format!("error: {}: corrupt frame at byte ", bad.display())), "{stderr}");
    let files: std::collections::BTreeSet<String> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["file"].as_str().unwrap().to_string())
        .collect();
    for p in &paths {
        if !expected(std::slice::from_ref(p)).is_empty() {
            assert!(files.contains(&p.display().to_string()), "{} was not searched", p.display());
        }
    }
}

#[test]
fn a_missing_path_is_one_clear_line() {
    let out = basecamp(&["trace", "search", "step == 1", "/nonexistent/traces"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "error: /nonexistent/traces: no such file or directory\n");
}

#[test]
fn a_generated_query_too_deep_or_too_long_is_refused_not_a_stack_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let ep = generate(&EpisodeShape { seed: 1, steps: 3, tokens_per_step: 1, ..Default::default() });
    let trace = dir.path().join("ep.trace");
    std::fs::write(&trace, ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    let t = trace.display().to_string();
    // Before: "thread 'main' has overflowed its stack", abort (exit 134).
    let nested = format!("{}step == 1{}", "(".repeat(2000), ")".repeat(2000));
    let chained = vec!["step == 1"; 2000].join(" and ");
    let negated = format!("{}step == 1", "not ".repeat(2000));
    for (query, expected) in [
        (&nested, "the query nests '(' and 'not' more than 64 levels deep; simplify it"),
        (&negated, "the query nests '(' and 'not' more than 64 levels deep; simplify it"),
        (&chained, "the query has more than 256 conditions; split it into several searches"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_basecamp")).args(["trace", "search", query, &t]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.starts_with(&format!("error: invalid query: {expected}")), "{stderr}");
    }
    // Within the limits, as before.
    let fine = vec!["step == 1"; 200].join(" and ");
    let out = Command::new(env!("CARGO_BIN_EXE_basecamp")).args(["trace", "search", &fine, &t]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}

#[test]
fn a_reader_that_stops_reading_early_is_not_an_error() {
    // `basecamp trace search ... | head -1` with fewer matches than fill the
    // output buffer: the only write is the final flush, which met the closed
    // pipe and printed "error: Broken pipe (os error 32)" with exit 1.
    let dir = tempfile::tempdir().unwrap();
    write_traces(dir.path(), 2);
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "search", "step == 1", &dir.path().display().to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before anything is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stderr), "");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn once_the_reader_is_gone_no_further_trace_is_read() {
    // After a failed write the search still read every remaining input
    // (`| head -1` over an S3 prefix kept downloading and scanning it all);
    // a FIFO that nobody writes stands for such an input here: opening it
    // blocks for ever, so reaching it means the search did not stop.
    let dir = tempfile::tempdir().unwrap();
    let mut paths: Vec<String> = write_traces(dir.path(), 8).iter().map(|p| p.display().to_string()).collect();
    paths.sort();
    let fifo = dir.path().join("never-written.trace");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(made.success());
    paths.push(fifo.display().to_string());
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "search", "-j", "1", "step >= 0"])
        .args(&paths)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(30) {
            child.kill().ok();
            panic!("the search went on to the inputs after the closed pipe and blocked on the FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stderr), "");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn a_memory_key_or_reward_component_no_trace_has_is_a_warning_listing_those_they_have() {
    // Before: a misspelt key found nothing, as silently as a key with no
    // matching value, and the exit status was 0 either way.
    let dir = tempfile::tempdir().unwrap();
    write_traces(dir.path(), 3);
    let trace_dir = dir.path().to_str().unwrap();
    let out =
        basecamp(&["trace", "search", "memory_state.shiping_status == null or reward_signal.eficiency < 0", trace_dir]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0]
            .starts_with("warning: none of the 3 searched traces has memory key `shiping_status` (keys they have: "),
        "{stderr}"
    );
    assert!(lines[0].contains("`shipping_status`"), "{stderr}");
    assert_eq!(
        lines[1],
        "warning: none of the 3 searched traces has reward component `eficiency` (components they have: \
         `efficiency_penalty`, `tool_call_accuracy`, `user_satisfaction`)"
    );
    // One trace searched: the warning speaks of it alone.
    let one = dir.path().join("ep-01.trace");
    let out = basecamp(&["trace", "search", "reward_signal.eficiency < 0", one.to_str().unwrap()]);
    assert_eq!(
        text(&out.stderr),
        "warning: the searched trace has no reward component `eficiency` (components it has: \
         `efficiency_penalty`, `tool_call_accuracy`, `user_satisfaction`)\n"
    );
    // Spelt right, there is nothing to warn about, whatever matched.
    let out = basecamp(&[
        "trace",
        "search",
        "memory_state.shipping_status == null or reward_signal.efficiency_penalty < -100",
        trace_dir,
    ]);
    assert_eq!((out.status.code(), text(&out.stderr)), (Some(0), String::new()));

    // A trace damaged early: its keys were never read, and the warning says it
    // speaks of what could be read (before: "it has no keys at all").
    let mut bytes = std::fs::read(&one).unwrap();
    bytes[200] ^= 0x40;
    let damaged = dir.path().join("damaged.trace");
    std::fs::write(&damaged, &bytes).unwrap();
    let out = basecamp(&["trace", "search", "memory_state.eta != null", damaged.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains("corrupt frame at byte"), "{stderr}");
    assert!(
        lines[1].starts_with("warning: the searched trace has no memory key `eta`")
            && lines[1].ends_with(" (in what could be read: 1 trace was read only up to its damage, or not at all)"),
        "{stderr}"
    );
}

/// A newline in a file name (or an episode id) would make one match look
/// like two lines of plain output: such a name is printed quoted, escaped.
#[test]
fn plain_output_quotes_a_name_with_a_control_character() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_traces(dir.path(), 1);
    let odd = dir.path().join("ep\n00.trace");
    std::fs::rename(&paths[0], &odd).unwrap();
    let out = basecamp(&["trace", "search", "step == 1", odd.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let quoted = format!("{:?}", odd.display().to_string());
    assert!(stdout.starts_with(&format!("{quoted}:")), "{stdout}");
}

/// A file whose name is not UTF-8, named directly (as a shell's glob
/// expands it) or matched by a quoted glob, is searched under its own
/// bytes. Before: clap refused the whole command ("invalid UTF-8 was
/// detected in one or more arguments"), and a glob's match was opened under
/// its lossy name, which does not exist.
#[test]
fn a_file_name_that_is_not_utf8_is_searched_named_directly_or_by_a_glob() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let paths = write_traces(dir.path(), 1);
    let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"ep-\xff.trace"));
    std::fs::rename(&paths[0], &odd).unwrap();
    let glob = format!("{}/ep-*.trace", dir.path().display());
    for arg in [odd.as_os_str(), std::ffi::OsStr::new(&glob)] {
        let out = Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["trace", "search", "--json", "step == 1"])
            .arg(arg)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{arg:?}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).lines().count(), 1, "{arg:?}: {}", text(&out.stdout));
    }
    // Plain output names it with its byte escaped, not as "ep-\u{fffd}.trace".
    let out =
        Command::new(env!("CARGO_BIN_EXE_basecamp")).args(["trace", "search", "step == 1"]).arg(&odd).output().unwrap();
    assert!(text(&out.stdout).starts_with(&format!("{odd:?}:")), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("\\xFF"), "{}", text(&out.stdout));
}

/// A trace that reads to its footer without an episode end: search printed
/// its matches and exited 0, as for a finished episode. Its matches are
/// still printed; then one line says the episode did not end, and the exit
/// status is 1, as for a trace cut short.
#[test]
fn a_trace_without_an_episode_end_is_searched_and_said_to_be_unended() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("unended.trace");
    std::fs::write(&file, unended::unended_trace(3)).unwrap();
    let f = file.display().to_string();
    let out = basecamp(&["trace", "search", "step >= 2", &f]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).lines().map(|l| l.rsplit_once(": ").unwrap().1.to_string()).collect::<Vec<_>>(),
        ["episode ep step 2 (step)", "episode ep step 3 (step)"]
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!("error: {f}: no episode end: the file reads to its footer index (byte ")),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// `trace validate` names a hash by its first 12 hex digits; search
/// refused those ("a hash is a sha256, 32 bytes ... 64 digits"), so the
/// step a finding names could not be found by the hash it prints. The
/// prefix, copied from the finding, now finds that step.
#[test]
fn a_hash_as_validate_prints_it_finds_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut ep = generate(&EpisodeShape { seed: 5, steps: 6, tokens_per_step: 1, ..Default::default() });
    for r in &mut ep.steps[2] {
        if let Some(Body::PlanStep(p)) = &mut r.body {
            p.memory_hash_after = vec![7; 32];
        }
    }
    let file = dir.path().join("ep.trace");
    std::fs::write(&file, ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    let f = file.display().to_string();
    let out = basecamp(&["trace", "validate", &f]);
    assert_eq!(out.status.code(), Some(1));
    let finding = text(&out.stdout);
    // "F: step N: memory: hash chain broken: memory_hash_before X is not memory_hash_after Y of the call at step M"
    let words: Vec<&str> = finding.split_whitespace().collect();
    let after = |word: &str| words[words.iter().position(|w| *w == word).unwrap() + 1].to_string();
    let step = after("step").trim_end_matches(':').to_string();
    let (before, broken_after) = (after("memory_hash_before"), after("memory_hash_after"));
    assert_eq!((before.len(), broken_after.len()), (12, 12), "{finding}");
    assert_eq!(broken_after, "07".repeat(6), "{finding}");
    let search = |query: String| -> Vec<String> {
        let out = basecamp(&["trace", "search", &query, &f, "--json"]);
        assert_eq!(out.status.code(), Some(0), "{query}: {}", text(&out.stderr));
        text(&out.stdout).lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["step"].to_string()).collect()
    };
    assert_eq!(step, "3", "the step after the broken call: {finding}");
    assert_eq!(search(format!("memory_hash_after == \"{broken_after}\"")), ["2"], "the call that broke the chain");
    // Memory a step does not change gives the next step the same hash.
    assert!(search(format!("memory_hash_before == \"{before}\"")).contains(&step), "{finding}");
}
