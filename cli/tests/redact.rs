//! `basecamp trace redact` as a user runs it: a directory of real traces in,
//! valid traces out, and no order id left anywhere in the decoded output.

use std::path::Path;
use std::process::Command;

use basecamp_trace::read_trace;
use basecamp_trace::synthetic::{EpisodeShape, generate};

fn basecamp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("the basecamp binary runs")
}

fn decoded_text(path: &std::path::Path) -> String {
    let trace = read_trace(path).unwrap();
    assert!(trace.damage().is_none());
    format!("{}{}", serde_json::to_string(&trace.header).unwrap(), serde_json::to_string(&trace.records).unwrap())
}

#[test]
fn redacted_traces_are_valid_and_hold_no_original_value() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::create_dir_all(input.join("shard-0")).unwrap();
    for seed in 1..=3 {
        let ep = generate(&EpisodeShape { seed, steps: 12, tokens_per_step: 2, ..Default::default() });
        std::fs::write(input.join(format!("shard-0/ep-{seed}.trace")), ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    }
    let before = decoded_text(&input.join("shard-0/ep-1.trace"));
    assert!(before.contains("\\\"order_id\\\":\\\"A-10") || before.contains("A-10"), "the input holds order ids");

    let (i, o) = (input.display().to_string(), output.display().to_string());
    let out = basecamp(&[
        "trace",
        "redact",
        &i,
        "--pii-fields",
        "order_id,carrier",
        "--patterns",
        "email",
        "--salt",
        "s",
        "-o",
        &o,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.ends_with("3 traces redacted, ") || stdout.lines().last().unwrap().starts_with("3 traces redacted, "),
        "{stdout}"
    );
    for seed in 1..=3 {
        // Outputs keep their path below the input directory.
        let text = decoded_text(&output.join(format!("shard-0/ep-{seed}.trace")));
        assert!(!text.contains("A-10"), "an order id survived in ep-{seed}");
        assert!(!text.contains("ACME"), "a carrier survived in ep-{seed}");
        assert!(text.contains("redacted:"));
    }
    let out = basecamp(&["trace", "validate", &o]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));

    // Refusals: nothing to do, an unknown pattern, overwriting the input.
    let out = basecamp(&["trace", "redact", &i, "-o", &o]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: nothing to redact: give --pii-fields, --patterns or both\n"
    );
    let out = basecamp(&["trace", "redact", &i, "--patterns", "ssn", "-o", &o]);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "error: unknown pattern \"ssn\"; patterns are email, phone\n");
    let shard = input.join("shard-0").display().to_string();
    let out = basecamp(&["trace", "redact", &shard, "--patterns", "email", "-o", &shard]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the output would overwrite the input"));
}

/// Two file names that differ only in bytes that are not UTF-8 display
/// alike ("ep�.trace"); each is still a trace of its own.
#[test]
fn file_names_that_are_not_utf8_are_each_read_and_keep_their_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let names = [std::ffi::OsStr::from_bytes(b"ep\xfe.trace"), std::ffi::OsStr::from_bytes(b"ep\xff.trace")];
    for (seed, name) in names.iter().enumerate() {
        let ep = generate(&EpisodeShape { seed: seed as u64 + 1, steps: 3, tokens_per_step: 1, ..Default::default() });
        std::fs::write(input.join(name), ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    }
    let i = input.display().to_string();

    // Before: the second was dropped as a duplicate of the first (one match, "1 traces").
    let out = basecamp(&["trace", "search", "step == 1", &i]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);

    // Redacted copies keep each file's own name (before: one, named "ep\u{FFFD}.trace").
    let output = dir.path().join("out");
    let out = basecamp(&["trace", "redact", &i, "--pii-fields", "order_id", "-o", &output.display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    for name in names {
        assert!(output.join(name).is_file(), "{name:?}");
    }
    assert_eq!(std::fs::read_dir(&output).unwrap().count(), 2);

    // An archive cannot name them (its index is JSON): refused, naming the file.
    let archive = dir.path().join("a.tar.zst");
    let out = basecamp(&["trace", "archive", &i, "-o", &archive.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ep\\xFE.trace\": the file name is not UTF-8"), "{stderr}");
    assert!(!archive.exists());
}

/// Traces named directly need not end in .trace; each is redacted into its
/// own file even when several are written at once.
#[test]
fn traces_named_without_the_trace_suffix_are_redacted_each_into_its_own_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut inputs = Vec::new();
    for seed in 1..=6u64 {
        let ep = generate(&EpisodeShape { seed, steps: 4, tokens_per_step: 1, ..Default::default() });
        let path = dir.path().join(format!("ep.b{seed}"));
        std::fs::write(&path, ep.write_to(Vec::new(), 3).unwrap()).unwrap();
        inputs.push(path.display().to_string());
    }
    let output = dir.path().join("out");
    let mut args = vec!["trace", "redact", "--pii-fields", "order_id", "-j", "4", "-o"];
    let o = output.display().to_string();
    args.push(&o);
    args.extend(inputs.iter().map(String::as_str));
    // Before: all six were written through one temporary file, ep.trace.partial:
    // renames failed and outputs held other inputs' episodes.
    let out = basecamp(&args);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    for seed in 1..=6u64 {
        let input = read_trace(dir.path().join(format!("ep.b{seed}"))).unwrap();
        let redacted = read_trace(output.join(format!("ep.b{seed}"))).unwrap();
        assert_eq!(redacted.header.episode_id, input.header.episode_id, "ep.b{seed}");
    }
    assert_eq!(std::fs::read_dir(&output).unwrap().count(), 6, "no temporary left");
}

/// `basecamp trace redact ... | head -1`: the reader goes away; every trace
/// is still redacted, and the closed pipe is one error line, not a panic.
#[test]
fn a_closed_stdout_still_redacts_every_trace() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    for seed in 1..=20u64 {
        let ep = generate(&EpisodeShape { seed, steps: 2, tokens_per_step: 1, ..Default::default() });
        std::fs::write(input.join(format!("ep-{seed:02}.trace")), ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    }
    let output = dir.path().join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "redact", input.to_str().unwrap(), "--pii-fields", "order_id", "-j", "1", "-o"])
        .arg(&output)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Before: "panicked ... failed printing to stdout: Broken pipe", exit 101, after the first trace;
    // then "error: Broken pipe (os error 32)", exit 1. A reader gone is not an error of the command.
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr, "");
    assert_eq!(std::fs::read_dir(&output).unwrap().count(), 20);
}

/// `-o runs/sub` where `runs/sub/ep.trace` is itself an input: the copy of
/// `runs/ep.trace` would replace it (and a second run into `-o runs/redacted`
/// would replace the first run's outputs while reading them).
#[test]
fn an_output_that_is_another_input_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    std::fs::create_dir_all(runs.join("sub")).unwrap();
    let mut bytes = Vec::new();
    for (seed, path) in [(1, "ep.trace"), (2, "sub/ep.trace")] {
        let ep = generate(&EpisodeShape { seed, steps: 3, tokens_per_step: 2, ..Default::default() });
        bytes.push(ep.write_to(Vec::new(), 3).unwrap());
        std::fs::write(runs.join(path), bytes.last().unwrap()).unwrap();
    }
    let (r, sub) = (runs.display().to_string(), runs.join("sub").display().to_string());
    let out = basecamp(&["trace", "redact", &r, "--patterns", "email", "-o", &sub]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "error: {r}/sub/ep.trace: the redacted copy of {r}/ep.trace would overwrite this input; \
             choose an -o directory that holds no input\n"
        )
    );
    assert_eq!(std::fs::read(runs.join("sub/ep.trace")).unwrap(), bytes[1], "the input is untouched");
    assert!(!runs.join("sub/sub").exists(), "nothing is written");

    // A new directory inside an input (before: 2 copies written into runs/, read with the
    // originals by every later search, validate or parse over runs/), by any spelling.
    for (input, out) in
        [(r.clone(), format!("{r}/redacted")), (format!("{r}/**/*.trace"), format!("{r}/./x/../redacted"))]
    {
        let said = basecamp(&["trace", "redact", &input, "--patterns", "email", "-o", &out]);
        assert_eq!(said.status.code(), Some(1));
        assert_eq!(
            String::from_utf8_lossy(&said.stderr),
            format!(
                "error: -o {out} is inside the input directory {r}: the redacted copies would be read with the \
                 originals by every later command over it; choose an -o directory outside the inputs\n"
            )
        );
        assert!(!runs.join("redacted").exists(), "nothing is written");
    }
    // Beside the inputs is fine.
    let beside = dir.path().join("redacted").display().to_string();
    let said = basecamp(&["trace", "redact", &r, "--patterns", "email", "-o", &beside]);
    assert_eq!(said.status.code(), Some(0), "{}", String::from_utf8_lossy(&said.stderr));
}

/// `--pii-fields ""` (an unset shell variable) was taken as a field list, so
/// every trace was copied with nothing replaced and exit 0; `"a, b"` looked
/// for a field named " b".
#[test]
fn an_empty_pii_field_is_refused_and_spaces_around_names_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let ep = generate(&EpisodeShape { seed: 1, steps: 6, tokens_per_step: 2, ..Default::default() });
    let trace = dir.path().join("ep.trace");
    std::fs::write(&trace, ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    assert!(decoded_text(&trace).contains("ACME"), "the input names a carrier");
    let t = trace.display().to_string();
    for (n, fields) in ["", ",", "order_id,,carrier"].into_iter().enumerate() {
        let o = dir.path().join(format!("empty-{n}")).display().to_string();
        let out = basecamp(&["trace", "redact", &t, "--pii-fields", fields, "-o", &o]);
        assert_eq!(out.status.code(), Some(2), "{fields:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).starts_with(
                "error: invalid value '' for '--pii-fields <FIELDS>': an empty field name (two commas in a row, \
                 or an empty list?)"
            ),
            "{fields:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!Path::new(&o).exists(), "{fields:?}: nothing is written");
    }
    let (spaced, plain) = (dir.path().join("spaced"), dir.path().join("plain"));
    for (fields, out_dir) in [("order_id, carrier ", &spaced), ("order_id,carrier", &plain)] {
        let o = out_dir.display().to_string();
        let out = basecamp(&["trace", "redact", &t, "--pii-fields", fields, "--salt", "s", "-o", &o]);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(std::fs::read(spaced.join("ep.trace")).unwrap(), std::fs::read(plain.join("ep.trace")).unwrap());
    assert!(!decoded_text(&spaced.join("ep.trace")).contains("ACME"), "the carrier is replaced");
}

/// A field named in --pii-fields that no trace holds (a typo) replaced
/// nothing, and nothing said so: the copies kept the values it meant.
#[test]
fn a_pii_field_found_in_no_trace_is_pointed_out() {
    let dir = tempfile::tempdir().unwrap();
    let ep = generate(&EpisodeShape { seed: 1, steps: 6, tokens_per_step: 2, ..Default::default() });
    let trace = dir.path().join("ep.trace");
    std::fs::write(&trace, ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    let (t, o) = (trace.display().to_string(), dir.path().join("out").display().to_string());
    let out = basecamp(&["trace", "redact", &t, "--pii-fields", "order_id,order-id", "-o", &o]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "warning: --pii-fields order-id: no JSON field or memory key of this name in any of the 1 traces redacted \
         (misspelt?); nothing was replaced for it\n"
    );
}

/// What a crashed pod leaves, a trace cut off mid-write, is refused with a
/// hint by default; with `--allow-truncated` its records are redacted into
/// a copy cut off the same way (not dressed up as a complete episode).
/// Corruption is still refused.
#[test]
fn a_truncated_trace_is_redacted_into_a_copy_cut_off_the_same_way_when_allowed() {
    use basecamp_trace::TraceError;
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::create_dir_all(&input).unwrap();
    let ep = generate(&EpisodeShape { seed: 4, steps: 12, tokens_per_step: 2, ..Default::default() });
    let bytes = ep.write_to(Vec::new(), 3).unwrap();
    let cut = input.join("crashed.trace");
    std::fs::write(&cut, &bytes[..bytes.len() * 3 / 5]).unwrap();
    let original = read_trace(&cut).unwrap();
    let Some(TraceError::Truncated { steps_recovered, .. }) = original.damage() else {
        panic!("a cut file reads as truncated: {:?}", original.damage())
    };
    assert!(*steps_recovered > 2 && *steps_recovered < 12, "{steps_recovered}");
    let recovered = format!("records of {steps_recovered} steps recovered");
    let (c, o) = (cut.display().to_string(), output.display().to_string());
    let redact = |extra: &[&str]| {
        let mut args = vec!["trace", "redact", &c, "--pii-fields", "order_id,carrier", "-o", &o];
        args.extend(extra);
        basecamp(&args)
    };

    let out = redact(&[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&recovered) && stderr.contains("(--allow-truncated redacts the records recovered)"),
        "{stderr}"
    );
    assert!(!output.join("crashed.trace").exists());

    let out = redact(&["--allow-truncated"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.starts_with("warning: ") && stderr.contains(&recovered), "{stderr}");
    assert!(stderr.contains("is cut off after them too (no episode end)"), "{stderr}");
    let copy = read_trace(output.join("crashed.trace")).unwrap();
    match copy.damage() {
        Some(TraceError::Truncated { steps_recovered: n, .. }) => assert_eq!(n, steps_recovered),
        other => panic!("the copy is cut off too: {other:?}"),
    }
    assert_eq!(copy.records.len(), original.records.len());
    let text = serde_json::to_string(&copy.records).unwrap();
    assert!(serde_json::to_string(&original.records).unwrap().contains("A-10"));
    assert!(!text.contains("A-10") && !text.contains("ACME") && text.contains("redacted:"));
    // The copy's recovered steps still validate as far as they go: the only finding is the cut.
    let out = basecamp(&["trace", "validate", &o]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains("schema: truncated at byte "), "{stdout}");

    // A flipped byte inside a frame is corruption, not a truncation.
    let mut corrupt = bytes.clone();
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0xff;
    std::fs::write(&cut, &corrupt).unwrap();
    let out = redact(&["--allow-truncated"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("corrupt frame at byte") && !stderr.contains("--allow-truncated"), "{stderr}");

    // Cut in its footer: every record is there, the end included, and the warning says so.
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
    let out = redact(&["--allow-truncated"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("is cut off after them too (its episode end kept, no index)"), "{stderr}");
    assert_eq!(
        read_trace(output.join("crashed.trace")).unwrap().records.len(),
        read_trace(&cut).unwrap().records.len()
    );
    // Cut inside its header: nothing to redact, and no hint to give the flag already given.
    std::fs::write(&cut, &bytes[..100]).unwrap();
    let out = redact(&["--allow-truncated"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("(cut before its header ended: there is nothing to redact)"), "{stderr}");
    assert!(!stderr.contains("(--allow-truncated redacts"), "{stderr}");
}

/// `-o s3://...` is refused: redact writes local files only, and before it
/// created a local directory `s3:/bucket/...` while printing `-> s3://...`.
#[test]
fn an_s3_output_is_refused_not_written_to_a_local_directory_named_s3() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("ep.trace");
    let ep = generate(&EpisodeShape { seed: 3, steps: 2, tokens_per_step: 1, ..Default::default() });
    std::fs::write(&trace, ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    for (args, flag) in [
        (vec!["trace", "redact", trace.to_str().unwrap(), "--pii-fields", "order_id", "-o", "s3://bucket/red"], "-o"),
        (vec!["trace", "archive", trace.to_str().unwrap(), "-o", "s3://bucket/a.tar.zst"], "-o"),
        (vec!["trace", "report", trace.to_str().unwrap(), "-o", "s3://bucket/r.html"], "--output"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_basecamp")).args(&args).current_dir(dir.path()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("is a URL; this command writes a local path only"),
            "{stderr}"
        );
        assert!(!dir.path().join("s3:").exists(), "{args:?}");
    }
}

/// A trace named after its episode id, as the sandbox names them: the id
/// is an email address, and so is the row id.
#[test]
fn the_row_id_and_the_file_name_are_redacted_with_the_episode_id() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in/shard-0"), dir.path().join("out"));
    std::fs::create_dir_all(&input).unwrap();
    let mut ep = generate(&EpisodeShape { seed: 3, steps: 6, tokens_per_step: 1, ..Default::default() });
    ep.header.episode_id = "dave@example.com".into();
    ep.header.row_id = "dave@example.com".into();
    std::fs::write(input.join("dave~40example.com.trace"), ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    let (i, o) = (dir.path().join("in").display().to_string(), output.display().to_string());
    let out = basecamp(&["trace", "redact", &i, "--patterns", "email", "--salt", "s", "-o", &o]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    // Before: out/shard-0/dave~40example.com.trace, its header's rowId "dave@example.com".
    let names: Vec<String> = std::fs::read_dir(output.join("shard-0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(!names[0].contains("dave"), "{names:?}");
    let copy = read_trace(output.join("shard-0").join(&names[0])).unwrap();
    assert!(copy.header.episode_id.starts_with("redacted:"), "{}", copy.header.episode_id);
    assert_eq!(copy.header.row_id, copy.header.episode_id);
    assert_eq!(names[0], basecamp_sandbox::episode::trace_file_name(&copy.header.episode_id));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let written = stdout.lines().next().and_then(|line| line.split(" -> ").nth(1)).unwrap();
    assert!(written.contains(&names[0]), "the line names the file written: {stdout}");
}

/// `--pii-fields shipping_status` made `shipping_status == null` find
/// nothing in the copies: null became a "redacted:…" string.
#[test]
fn a_null_pii_field_stays_null_for_search() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("ep.trace"), null_status_episode()).unwrap();
    let (i, o) = (input.display().to_string(), output.display().to_string());
    let out = basecamp(&["trace", "redact", &i, "--pii-fields", "shipping_status", "--salt", "s", "-o", &o]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let matches = |dir: &str| {
        let out = basecamp(&["trace", "search", "memory_state.shipping_status == null", dir]);
        String::from_utf8(out.stdout).unwrap().lines().count()
    };
    let before = matches(&i);
    assert!(before > 0, "the input has steps with shipping_status null");
    assert_eq!(matches(&o), before);
}

/// Three tool steps while memory's shipping_status is null.
fn null_status_episode() -> Vec<u8> {
    use basecamp_trace::pb::{EpisodeEnd, Header, MemorySource, PlanStep, StepKind, StepStatus, record::Body};
    use basecamp_trace::{Memory, MemoryPatch, TraceWriter};
    let header = Header { episode_id: "ep".into(), ..Default::default() };
    let mut w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    let mut memory = Memory::new();
    let initial = serde_json::json!({"shipping_status": null, "order_id": "A-1"});
    for d in memory.apply(&MemoryPatch::from_object(initial.as_object().unwrap()), MemorySource::Initial, "test_set") {
        w.append(0, Body::MemoryDelta(d.to_record())).unwrap();
    }
    w.end_step().unwrap();
    for step in 1..=3 {
        let plan = PlanStep {
            index: step,
            kind: StepKind::ToolCall as i32,
            tool: "tracking_api".into(),
            arguments_json: "{}".into(),
            observation_json: "{}".into(),
            status: StepStatus::Ok as i32,
            memory_hash_before: memory.hash().0.to_vec(),
            memory_hash_after: memory.hash().0.to_vec(),
            ..Default::default()
        };
        w.append(step, Body::PlanStep(Box::new(plan))).unwrap();
        w.end_step().unwrap();
    }
    let end = EpisodeEnd { outcome: 1, steps: 3, final_memory_hash: memory.hash().0.to_vec(), ..Default::default() };
    w.finish(end).unwrap()
}

#[test]
fn an_empty_salt_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let ep = generate(&EpisodeShape { seed: 4, steps: 2, tokens_per_step: 1, ..Default::default() });
    std::fs::write(input.join("ep.trace"), ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    let (i, o) = (input.display().to_string(), dir.path().join("out").display().to_string());
    for salt in ["", "  "] {
        let out = basecamp(&["trace", "redact", &i, "--patterns", "email", "--salt", salt, "-o", &o]);
        assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("the salt is empty"));
        assert!(!dir.path().join("out").exists(), "nothing written");
    }
}
