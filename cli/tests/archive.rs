//! `basecamp trace archive`, `archive list` and `archive extract` as a user runs them.

use std::process::Command;

use basecamp_trace::synthetic::{EpisodeShape, generate};

#[path = "support/unended.rs"]
mod unended;

fn basecamp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("the basecamp binary runs")
}

#[test]
fn archive_list_and_extract_one_trace() {
    let dir = tempfile::tempdir().unwrap();
    let traces = dir.path().join("traces");
    std::fs::create_dir_all(traces.join("b")).unwrap();
    for seed in 1..=4 {
        let ep = generate(&EpisodeShape { seed, steps: 6, tokens_per_step: 5, ..Default::default() });
        let sub = if seed > 2 { "b/" } else { "" };
        std::fs::write(traces.join(format!("{sub}ep-{seed}.trace")), ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    }
    std::fs::write(traces.join("summary.json"), "{}").unwrap();
    let archive = dir.path().join("run.tar.zst");
    let (t, a) = (traces.display().to_string(), archive.display().to_string());

    let out = basecamp(&["trace", "archive", &t, "-o", &a]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("archived 4 traces ("));

    let out = basecamp(&["trace", "archive", "list", &a]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    assert!(lines[0].starts_with("NAME"));
    // Directory order (b/ sorts before ep-1.trace); members keep their path below the directory.
    assert!(lines[1].starts_with("b/ep-3.trace"), "{stdout}");
    assert!(
        lines[3].starts_with("ep-1.trace") && lines[3].contains("ep-0001") && lines[3].contains(" yes "),
        "{stdout}"
    );

    let dest = dir.path().join("out");
    let d = dest.display().to_string();
    let out = basecamp(&["trace", "archive", "extract", &a, "ep-0003", "-o", &d]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(dest.join("b/ep-3.trace")).unwrap(), std::fs::read(traces.join("b/ep-3.trace")).unwrap());
    // By name, with or without directories and .trace.
    for key in ["ep-4", "b/ep-4.trace"] {
        let out = basecamp(&["trace", "archive", "extract", &a, key, "-o", &d]);
        assert_eq!(out.status.code(), Some(0), "{key}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(dest.join("b/ep-4.trace").exists());
    assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 1);

    let out = basecamp(&["trace", "archive", "extract", &a, "ep-9", "-o", &d]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "error: {a}: no trace named \"ep-9\" or of episode \"ep-9\" (4 traces; see `basecamp trace archive list`)\n"
        )
    );

    // The extracted trace is intact; the archive is an ordinary tar.zst.
    let out = basecamp(&["trace", "validate", &dest.join("b/ep-3.trace").display().to_string()]);
    assert_eq!(out.status.code(), Some(0));
    let out = basecamp(&["trace", "archive", "list", &t]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot read")
            || String::from_utf8_lossy(&out.stderr).contains("Is a directory")
    );
}

#[test]
fn an_output_that_is_an_input_or_a_directory_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let ep = generate(&EpisodeShape { seed: 3, steps: 3, tokens_per_step: 2, ..Default::default() });
    let trace = dir.path().join("ep.trace");
    let bytes = ep.write_to(Vec::new(), 3).unwrap();
    std::fs::write(&trace, &bytes).unwrap();
    let t = trace.display().to_string();

    let out = basecamp(&["trace", "archive", &t, "-o", &t]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("error: {t}: the output would overwrite this input; choose another -o file\n")
    );
    assert_eq!(std::fs::read(&trace).unwrap(), bytes, "the input is untouched");

    let sub = dir.path().join("runs");
    std::fs::create_dir(&sub).unwrap();
    let s = sub.display().to_string();
    let out = basecamp(&["trace", "archive", &t, "-o", &s]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("error: {s} is a directory; give the archive's file name, e.g. {s}/traces.tar.zst\n")
    );
    let mut names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["ep.trace", "runs"], "no runs.partial left behind");
}

#[test]
fn extract_keeps_a_different_file_already_there_and_writes_each_member_once() {
    let dir = tempfile::tempdir().unwrap();
    let traces = dir.path().join("traces");
    std::fs::create_dir_all(&traces).unwrap();
    let mut bytes = Vec::new();
    for seed in 1..=2 {
        let ep = generate(&EpisodeShape { seed, steps: 3, tokens_per_step: 2, ..Default::default() });
        bytes.push(ep.write_to(Vec::new(), 3).unwrap());
        std::fs::write(traces.join(format!("ep-{seed}.trace")), &bytes[seed as usize - 1]).unwrap();
    }
    let archive = dir.path().join("run.tar.zst");
    let (t, a) = (traces.display().to_string(), archive.display().to_string());
    let out = basecamp(&["trace", "archive", &t, "-o", &a]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    // Asked for by episode and by name: one member, written once.
    let dest = dir.path().join("out");
    let d = dest.display().to_string();
    let out = basecamp(&["trace", "archive", "extract", &a, "ep-0001", "ep-1", "-o", &d]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("extracted ep-1.trace (episode ep-0001) -> {d}/ep-1.trace\n")
    );

    // The same bytes already there: nothing to do, and said so.
    let out = basecamp(&["trace", "archive", "extract", &a, "ep-1", "-o", &d]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("ep-1.trace (episode ep-0001) is already at {d}/ep-1.trace\n")
    );

    // Another trace under that name is kept, and nothing else is extracted either.
    std::fs::write(dest.join("ep-1.trace"), &bytes[1]).unwrap();
    let out = basecamp(&["trace", "archive", "extract", &a, "ep-2", "ep-1", "-o", &d]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "error: {d}/ep-1.trace: already exists and is not the archived ep-1.trace (of episode ep-0001); \
             nothing was extracted: extract into another directory or move the file away\n"
        )
    );
    assert_eq!(std::fs::read(dest.join("ep-1.trace")).unwrap(), bytes[1], "the file already there is kept");
    let mut names: Vec<_> = std::fs::read_dir(&dest).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["ep-1.trace"], "ep-2 is not extracted, and no .partial is left");
}

/// An archive not written by basecamp may hold two members of one name:
/// the second was written over the first, and the command said both were extracted.
#[test]
fn two_members_of_one_name_are_refused_before_anything_is_extracted() {
    use basecamp_trace::archive::{ArchiveWriter, prepare_member};
    let dir = tempfile::tempdir().unwrap();
    let mut writer = ArchiveWriter::new(Vec::new());
    for seed in 1..=2 {
        let ep = generate(&EpisodeShape { seed, steps: 3, tokens_per_step: 2, ..Default::default() });
        let bytes = ep.write_to(Vec::new(), 3).unwrap();
        writer.append(prepare_member(&format!("ep-{seed}"), "same.trace", &bytes).unwrap()).unwrap();
    }
    let archive = dir.path().join("two.tar.zst");
    std::fs::write(&archive, writer.finish().unwrap()).unwrap();
    let (a, d) = (archive.display().to_string(), dir.path().join("out").display().to_string());
    let listed = basecamp(&["trace", "archive", "list", &a]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(listed.lines().filter(|l| l.contains("same.trace")).count(), 2, "{listed}");
    let out = basecamp(&["trace", "archive", "extract", &a, "same.trace", "-o", &d]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("and same.trace (of episode ep-0002) would both be extracted to"), "{said}");
    assert!(!dir.path().join("out").exists(), "nothing is extracted");
}

#[test]
fn an_archive_and_an_export_can_go_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let ep = generate(&EpisodeShape { seed: 7, steps: 4, tokens_per_step: 3, ..Default::default() });
    let trace = dir.path().join("ep-7.trace");
    std::fs::write(&trace, ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    let t = trace.display().to_string();

    // Before: "cannot create -" and "cannot create /dev/stdout" (a .partial
    // file beside it, renamed over it).
    for out in ["-", "/dev/stdout"] {
        let piped = basecamp(&["trace", "archive", &t, "-o", out]);
        assert_eq!(piped.status.code(), Some(0), "{out}: {}", String::from_utf8_lossy(&piped.stderr));
        // The summary line goes to stderr: stdout is the archive alone.
        assert!(String::from_utf8_lossy(&piped.stderr).contains("archived 1 traces ("), "{out}");
        let archive = dir.path().join("piped.tar.zst");
        std::fs::write(&archive, &piped.stdout).unwrap();
        let listed = basecamp(&["trace", "archive", "list", &archive.display().to_string()]);
        assert_eq!(listed.status.code(), Some(0), "{out}: {}", String::from_utf8_lossy(&listed.stderr));
        assert!(String::from_utf8_lossy(&listed.stdout).contains("ep-7.trace"), "{out}");

        let exported = basecamp(&["trace", "export", "--otlp", &t, "-o", out]);
        assert_eq!(exported.status.code(), Some(0), "{out}: {}", String::from_utf8_lossy(&exported.stderr));
        let line = String::from_utf8(exported.stdout).unwrap();
        assert_eq!(line.lines().count(), 1, "{out}");
        serde_json::from_str::<serde_json::Value>(line.trim()).expect("one OTLP request");
    }
    assert!(!std::path::Path::new("/dev/stdout.partial").exists());

    // At a terminal (script(1) gives the command one), the archive is
    // refused before anything is read (script is Debian's essential
    // bsdutils). Before: zstd frames on the screen.
    let command = format!("{} trace archive {t} -o -", env!("CARGO_BIN_EXE_basecamp"));
    let tty = Command::new("script").args(["-qec", &command, "/dev/null"]).output().expect("script(1) runs");
    let shown = String::from_utf8_lossy(&tty.stdout);
    assert_eq!(tty.status.code(), Some(1), "{shown}");
    assert!(shown.contains("- is a terminal: the archive is compressed binary"), "{shown}");
    assert!(!shown.contains("archived 1 traces"), "{shown}");
}

/// A trace cut short or damaged is archived as it is, and the warning says
/// what is wrong with it (before: "not complete (a killed writer?)" for a
/// corrupt frame too).
#[test]
fn a_damaged_trace_is_archived_with_what_is_wrong_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let ep = generate(&EpisodeShape { seed: 3, steps: 4, tokens_per_step: 3, ..Default::default() });
    let bytes = ep.write_to(Vec::new(), 3).unwrap();
    let cut = dir.path().join("cut.trace");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let (c, a) = (cut.display().to_string(), dir.path().join("a.tar.zst").display().to_string());
    let out = basecamp(&["trace", "archive", &c, "-o", &a]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.starts_with(&format!("warning: {c}: truncated at byte ")), "{said}");
    assert!(said.contains("; archived as it is\n"), "{said}");
}

/// `x.trace` from one input and `x.trace/y.trace` from another cannot both
/// come out: refused before writing (before: archived, and extract failed
/// half-way). An archive none of whose inputs could be read is not written.
#[test]
fn a_member_that_is_another_members_directory_is_refused_and_an_empty_archive_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let ep = generate(&EpisodeShape { seed: 1, steps: 2, tokens_per_step: 1, ..Default::default() });
    let bytes = ep.write_to(Vec::new(), 3).unwrap();
    let (r1, r2) = (dir.path().join("r1"), dir.path().join("r2"));
    std::fs::create_dir_all(r2.join("x.trace")).unwrap();
    std::fs::create_dir_all(&r1).unwrap();
    std::fs::write(r1.join("x.trace"), &bytes).unwrap();
    std::fs::write(r2.join("x.trace/y.trace"), &bytes).unwrap();
    let archive = dir.path().join("clash.tar.zst");
    let out =
        basecamp(&["trace", "archive", r1.to_str().unwrap(), r2.to_str().unwrap(), "-o", archive.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("would be archived as a file where") && stderr.contains("x.trace/y.trace"), "{stderr}");
    assert!(!archive.exists());

    // Every input unreadable: an error, and no archive of nothing.
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("cut.trace"), &bytes[..20]).unwrap();
    let out = basecamp(&["trace", "archive", bad.to_str().unwrap(), "-o", archive.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no trace could be archived (each is named above)"), "{stderr}");
    assert!(!archive.exists());
}

/// A file whose name is not UTF-8 cannot be a member (the index is JSON).
/// Before, it made the whole archive fail: nothing was archived. Now the
/// others are, and it is named in an error with exit 1, so nothing is lost
/// silently. A trace that reads to its footer without an episode end is
/// archived as it is, listed as not complete (before: `COMPLETE yes`).
#[test]
fn a_file_name_that_is_not_utf8_is_left_out_and_named_and_the_others_are_archived() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let ep = generate(&EpisodeShape { seed: 1, steps: 2, tokens_per_step: 1, ..Default::default() });
    std::fs::write(input.join("good.trace"), ep.write_to(Vec::new(), 3).unwrap()).unwrap();
    std::fs::write(input.join(std::ffi::OsStr::from_bytes(b"odd-\xff.trace")), ep.write_to(Vec::new(), 3).unwrap())
        .unwrap();
    std::fs::write(input.join("unended.trace"), unended::unended_trace(2)).unwrap();
    let archive = dir.path().join("a.tar.zst");
    let (i, a) = (input.display().to_string(), archive.display().to_string());

    let out = basecamp(&["trace", "archive", &i, "-o", &a]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "error: \"{i}/odd-\\xFF.trace\": the file name is not UTF-8, which archive member names must be (the \
             archive's index is JSON), so it was not archived; rename it and archive it on its own"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("error: 1 of 3 traces could not be archived (each is named above)"), "{stderr}");
    assert!(
        stderr.contains(&format!("warning: {i}/unended.trace: no episode end: the file reads to its footer index")),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("archived 2 traces ("), "{stderr}");

    let out = basecamp(&["trace", "archive", "list", &a, "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let members: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let listed: Vec<(&str, bool)> =
        members.iter().map(|m| (m["name"].as_str().unwrap(), m["complete"].as_bool().unwrap())).collect();
    assert_eq!(listed, [("good.trace", true), ("unended.trace", false)]);
}
