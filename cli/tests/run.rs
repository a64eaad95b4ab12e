//! `basecamp run examples/ecommerce` end to end: the real binary, the real
//! tracking service (a local process), real HTTP and exec tools. The A/B
//! story is asserted on what the run measured, not on constants.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use basecamp_sandbox::testing::{example_copy, never_ready, services_in, wait_for_no_services, wait_for_services};
use basecamp_trace::pb::{Outcome, record::Body};
use serde_json::Value;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce")
}

fn traces_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "trace") {
                found.push(path);
            }
        }
    }
    found
}

fn variant<'a>(run: &'a Value, name: &str) -> &'a Value {
    run["variants"].as_array().unwrap().iter().find(|v| v["name"] == name).unwrap()
}

#[test]
fn the_ecommerce_ab_run_shows_the_null_fallback_in_a_and_b_fixing_it() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", example().to_str().unwrap(), "--no-progress", "--out", out.path().to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    let (a, b) = (variant(&run, "a"), variant(&run, "b"));
    assert_eq!(a["aggregate"]["episodes"], 60);
    assert_eq!(b["aggregate"]["episodes"], 60);

    // A fails on the orders the tracking service is slow or rate-limited for…
    let a_failed = a["failed"].as_u64().unwrap();
    assert!(a_failed >= 10, "A's 800 ms timeout and no retry must fail some episodes: {stdout}");
    // …and its failures cluster on shipping_status = null written by the fallback.
    let top = &a["root_causes"][0];
    assert_eq!(top["key"], "null:shipping_status:fallback:track_order", "{stdout}");
    assert!(top["episodes"].as_u64().unwrap() * 10 >= a_failed * 9, "at least 90% of A's failures: {stdout}");
    let hint = top["hint"].as_str().unwrap();
    assert!(hint.contains("`shipping_status` was set to null by the fallback of `track_order`"), "{hint}");
    assert!(hint.contains("timeout") && hint.contains("rate_limited"), "both causes are counted: {hint}");

    // B never writes the null, and is measurably better.
    let b_null = b["root_causes"].as_array().unwrap().iter().any(|c| c["key"].as_str().unwrap().starts_with("null:"));
    assert!(!b_null, "{stdout}");
    let consistency = |v: &Value| v["aggregate"]["means"]["memory_consistency"].as_f64().unwrap();
    assert!(consistency(b) > consistency(a) + 0.05, "{stdout}");
    assert!(b["failed"].as_u64().unwrap() < a_failed, "{stdout}");
    let delta =
        run["comparison"]["rows"].as_array().unwrap().iter().find(|r| r["metric"] == "memory_consistency").unwrap();
    assert!(delta["delta_percent"].as_f64().unwrap() > 5.0);

    // The table printed it; the report and every trace are there.
    assert!(stdout.contains("b vs a:") && stdout.contains("memory_consistency"), "{stdout}");
    let report = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(report.contains("id=\"comparison\"") && report.contains("<code>shipping_status</code>"));
    let traces = traces_under(out.path());
    assert_eq!(traces.len(), 120);
    for trace in &traces {
        let contents = basecamp_trace::read_trace(trace).unwrap();
        assert!(contents.damage().is_none(), "{} is complete", trace.display());
        // Each shard's runner is its variant's, built once, with the shard's own header.
        let shard_dir = trace.parent().unwrap().file_name().unwrap().to_str().unwrap();
        let variant_dir = trace.parent().unwrap().parent().unwrap().file_name().unwrap().to_str().unwrap();
        let header = &contents.header;
        assert_eq!((format!("shard-{}", header.shard), header.shard_count), (shard_dir.to_string(), 2), "{header:?}");
        assert_eq!(header.variant, variant_dir, "{}", trace.display());
    }
    for v in ["a", "b"] {
        for shard in 0..2 {
            let summary = out.path().join(format!("{v}/shard-{shard}/summary.json"));
            let summary: Value = serde_json::from_slice(&std::fs::read(summary).unwrap()).unwrap();
            assert_eq!((summary["variant"].as_str(), summary["shard"].as_u64()), (Some(v), Some(shard)));
        }
    }

    // `ab compare` reads the same story back from the shard summaries and traces.
    let compare =
        Command::new(env!("CARGO_BIN_EXE_basecamp")).args(["ab", "compare"]).arg(out.path()).output().unwrap();
    let text = String::from_utf8_lossy(&compare.stdout);
    assert!(compare.status.success(), "{text}");
    let cluster = text.lines().find(|l| l.starts_with("null:shipping_status:fallback:track_order")).expect(&text);
    let counts: Vec<&str> = cluster.split_whitespace().skip(1).collect();
    assert_eq!(counts, [top["episodes"].to_string().as_str(), "0"], "{text}");
    assert!(text.contains("gone in b"), "{text}");

    // Variants are what the summaries say, not directories: before, `a/` alone was
    // compared as two variants (its shards), and `out` against `b/` merged a and b into one side.
    let ab = |args: &[&std::path::Path]| {
        let output = Command::new(env!("CARGO_BIN_EXE_basecamp")).args(["ab", "compare"]).args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{args:?}: {}", String::from_utf8_lossy(&output.stdout));
        String::from_utf8(output.stderr).unwrap()
    };
    let (dir_a, dir_b) = (out.path().join("a"), out.path().join("b"));
    let err = ab(&[&dir_a]);
    assert!(err.contains("holds shard summaries of 1 variant(s) (default/shipping-delay-ab/a), not two"), "{err}");
    let err = ab(&[out.path(), &dir_b]);
    assert!(
        err.contains("holds shard summaries of 2 variants (default/shipping-delay-ab/a, default/shipping-delay-ab/b), which would be counted as one"),
        "{err}"
    );
    // A shard twice (a copied directory) would count its episodes twice.
    let copy = out.path().join("a-copy/shard-0");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(dir_a.join("shard-0/summary.json"), copy.join("summary.json")).unwrap();
    let err = ab(&[&dir_b, out.path()]);
    assert!(err.contains("shard 0 of default/shipping-delay-ab/a is there twice"), "{err}");
    std::fs::remove_dir_all(out.path().join("a-copy")).unwrap();
    let err = ab(&[&dir_a, &out.path().join("nonexistent")]);
    assert!(err.contains("nonexistent: No such file or directory"), "{err}");
    // Before: "no summary.json below this directory" for the summary itself.
    let err = ab(&[&dir_a.join("shard-0/summary.json"), &dir_b]);
    assert!(
        err.contains("shard-0/summary.json: is a file; give a `basecamp run` output or a variant directory"),
        "{err}"
    );

    // Each root-cause sentence is under the name of the side whose episodes it counts: before,
    // shard-1's line held shard-0's numbers (the first side's sentence, the larger side's name).
    let compared = |args: &[&Path]| {
        let output = Command::new(env!("CARGO_BIN_EXE_basecamp")).args(["ab", "compare"]).args(args).output().unwrap();
        assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        (String::from_utf8(output.stdout).unwrap(), String::from_utf8(output.stderr).unwrap())
    };
    let (shard_0, shard_1) = (dir_a.join("shard-0"), dir_a.join("shard-1"));
    let (text, _) = compared(&[&shard_0, &shard_1]);
    for (shard, dir) in [("shard-0", &shard_0), ("shard-1", &shard_1)] {
        let summary: Value = serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
        let failed = summary["episodes"].as_array().unwrap().iter().filter(|e| e["failure_class"] != "ok").count();
        assert!(failed > 0, "the top cluster is in both shards: {text}");
        let line = text.lines().find(|l| l.starts_with(&format!("  {shard}: "))).expect(&text);
        assert!(line.contains(&format!("of {failed} failed episodes")), "{shard} failed {failed}: {line}");
    }

    // A shard without its summary (one that failed, or a partial copy) is not counted: said, not silent.
    let partial = out.path().join("partial");
    std::fs::create_dir_all(partial.join("shard-0")).unwrap();
    std::fs::copy(dir_a.join("shard-0/summary.json"), partial.join("shard-0/summary.json")).unwrap();
    let (text, warnings) = compared(&[&partial, &dir_b]);
    assert!(text.starts_with("b (60 episodes"), "{text}");
    assert!(
        warnings.contains("partial: default/shipping-delay-ab/a has 2 shards, but no summary.json of shard(s) 1 here"),
        "{warnings}"
    );
    assert!(warnings.contains("the two sides ran different episodes: 0 of partial's 30 are not in b, 30 of b's 60"));
}

#[test]
fn ctrl_c_during_a_run_leaves_readable_traces_and_a_partial_summary() {
    let out = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", example().to_str().unwrap(), "--no-progress", "--concurrency", "1"])
        .args(["--out", out.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until episodes are under way, then interrupt as a terminal would.
    let deadline = Instant::now() + Duration::from_secs(60);
    while traces_under(out.path()).len() < 6 {
        assert!(Instant::now() < deadline, "no traces appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let started = Instant::now();
    let output = loop {
        if child.try_wait().unwrap().is_some() {
            break child.wait_with_output().unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the run did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(130), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("STOPPED EARLY"), "{stdout}");

    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    assert_eq!(run["stopped_early"], true);
    // The report says what the stop left out, as the console does (before: only "partial results").
    let report = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(
        report.contains("cut off (their traces end as cancelled: <a href=\""),
        "the report links the cut-off traces"
    );
    let linked = run["variants"][0]["interrupted_traces"][0].as_str().expect("run.json lists the cut-off traces");
    assert!(out.path().join(linked).exists(), "{linked}");
    assert!(report.contains(&format!("<a href=\"{linked}\">")), "{linked}");
    let finished: u64 =
        run["variants"].as_array().unwrap().iter().map(|v| v["aggregate"]["episodes"].as_u64().unwrap()).sum();
    assert!(finished < 120, "the run was cut short");
    for v in ["a", "b"] {
        for shard in 0..2 {
            let summary = out.path().join(format!("{v}/shard-{shard}/summary.json"));
            let summary: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
            assert_eq!(summary["stopped_early"], true, "{v}/{shard}");
        }
    }
    // Every trace on disk is whole: the episodes cut off end theirs as cancelled, saying why
    // (before: a truncated prefix, which `trace validate` reported as damage).
    let traces = traces_under(out.path());
    assert!(traces.len() as u64 >= finished);
    let interrupted: Vec<(String, String)> = run["variants"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| {
            let variant = v["name"].as_str().unwrap().to_string();
            v["interrupted"].as_array().unwrap().iter().map(move |id| (variant.clone(), id.as_str().unwrap().into()))
        })
        .collect();
    assert!(!interrupted.is_empty(), "at concurrency 1 each shard had an episode under way");
    for trace in traces {
        let contents = basecamp_trace::read_trace(&trace).unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
        assert!(contents.damage().is_none(), "{} is complete", trace.display());
        let end = contents
            .records
            .iter()
            .find_map(|r| match &r.body {
                Some(Body::EpisodeEnd(end)) => Some(end),
                _ => None,
            })
            .expect("a complete trace has its end");
        if interrupted.contains(&(contents.header.variant.clone(), contents.header.episode_id.clone())) {
            assert_eq!(end.outcome, Outcome::Cancelled as i32, "{}", trace.display());
        } else {
            assert_ne!(end.outcome, Outcome::Cancelled as i32, "{}", trace.display());
        }
    }
    let validate =
        Command::new(env!("CARGO_BIN_EXE_basecamp")).args(["trace", "validate"]).arg(out.path()).output().unwrap();
    assert!(validate.status.success(), "{}", String::from_utf8_lossy(&validate.stdout));
    // serve's and report's catalog leaves the cut-off episodes out, as the run's totals do
    // (before: counted as failures, and said to have no shard summary).
    let report = out.path().join("report-of-traces.html");
    let reported = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "report"])
        .arg(out.path())
        .arg("-o")
        .arg(&report)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&reported.stderr);
    assert!(reported.status.success(), "{said}");
    assert!(!said.contains("no shard summary"), "{said}");
    assert!(said.contains("episode(s) cut off by a stop (so their shard summaries say) are left out"), "{said}");
    let reported_episodes: u64 = String::from_utf8_lossy(&reported.stdout)
        .split_once(": ")
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .expect("wrote FILE: N episodes");
    assert_eq!(reported_episodes, finished, "{}", String::from_utf8_lossy(&reported.stdout));
    // A cut-off episode is not one to replay: said so (before: a divergence at its end).
    let (variant, id) = &interrupted[0];
    let shard = (0..2).map(|s| out.path().join(format!("{variant}/shard-{s}/{id}.trace"))).find(|p| p.exists());
    let replay = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "replay"])
        .arg(shard.expect("the interrupted episode's trace"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&replay.stderr);
    assert_eq!(replay.status.code(), Some(1), "{said}");
    assert!(said.contains("the episode was cancelled before it finished"), "{said}");
}

#[test]
fn the_raw_logits_example_reduces_logits_to_top_k_records_and_a_divergence() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/raw-logits");
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", example.to_str().unwrap(), "--no-progress", "--out", out.path().to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("logit_divergence"), "the table shows the divergence: {stdout}");

    // The example's own float64 check: every episode's divergence and every
    // token record's logprob, entropy and KL, and `trace search` on kl.
    let check = Command::new("python3")
        .arg(example.join("gen.py"))
        .args(["--check", out.path().to_str().unwrap(), "--basecamp", env!("CARGO_BIN_EXE_basecamp")])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    // The records carry the sandbox's trace.topK alternatives (default 5),
    // best first, and the header says so.
    let traces = traces_under(out.path());
    assert_eq!(traces.len(), 5);
    for path in traces {
        let trace = basecamp_trace::read_trace(&path).unwrap();
        assert_eq!(trace.header.top_k, 5, "{}", path.display());
        let tokens: Vec<_> = trace
            .records
            .iter()
            .filter_map(|r| match &r.body {
                Some(basecamp_trace::pb::record::Body::TokenLogit(t)) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(tokens.len(), 5, "3 tool-call tokens and 2 answer tokens: {}", path.display());
        for t in tokens {
            assert_eq!(t.top_ids.len(), 5, "{t:?}");
            assert!(t.top_logprobs.windows(2).all(|w| w[0] >= w[1]), "best first: {t:?}");
            assert!(t.top_logprobs[0] >= t.logprob, "the emitted token is at most the best: {t:?}");
            assert!(t.entropy.is_some() && t.kl.is_some(), "{t:?}");
        }
    }
}

#[test]
fn raw_logits_a_run_could_not_use_are_said_under_the_table() {
    // Episodes whose raw logits were refused (here: two token ids for three
    // rows) got no divergence, and the run printed `met (2/2)` on the other
    // episodes without a word; the warning was only in summary.json.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/raw-logits");
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("raw-logits");
    std::fs::create_dir_all(project.join("fixtures")).unwrap();
    for file in ["task.yaml", "tests.jsonl", "fixtures/orders.jsonl"] {
        std::fs::copy(example.join(file), project.join(file)).unwrap();
    }
    let policy = std::fs::read_to_string(example.join("policy.jsonl")).unwrap();
    let mut lines: Vec<Value> = policy.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[1]["episode"], "order-2");
    lines[1]["turns"][0]["raw_logits"]["token_ids"] = serde_json::json!([1, 2]);
    let policy: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(project.join("policy.jsonl"), policy).unwrap();

    let out = dir.path().join("out");
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", project.to_str().unwrap(), "--no-progress", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let said = stdout.lines().find(|l| l.starts_with("default: 1 of 5 episodes have warnings")).expect(&stdout);
    let first = said.split_once(", the first: ").expect(said).1;
    assert!(
        first.starts_with("order-2: step 1: raw logits not used (RowCountMismatch): inline raw_logits ("),
        "{said}"
    );
    assert!(
        first.ends_with(
            "tensor \"logits\": token_ids has 2 ids but the logits have 3 rows: give one emitted token per row"
        ),
        "{said}"
    );
    let run: Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(variant(&run, "default")["warned"]["episodes"], 1, "{run}");
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        report.contains("<p class=\"muted warned\">variant default: 1 of 5 episodes have warnings"),
        "the report too"
    );
}

#[test]
fn a_rerun_into_the_same_directory_replaces_the_earlier_shards() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/raw-logits");
    let out = tempfile::tempdir().unwrap();
    let run = |shards: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["run", example.to_str().unwrap(), "--no-progress", "--shards", shards])
            .args(["--out", out.path().to_str().unwrap()])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    run("2");
    let variant_dir = out.path().join("default");
    assert!(variant_dir.join("shard-1/summary.json").is_file());
    assert_eq!(traces_under(out.path()).len(), 5);
    // Something of the user's in a shard directory is not the run's to remove.
    std::fs::write(variant_dir.join("shard-1/notes.txt"), "mine").unwrap();

    let stderr = run("1");
    assert!(stderr.contains(&format!("replacing an earlier run in {}", variant_dir.display())), "{stderr}");
    // Before: the first run's shard-1 stayed, so its traces and summary were
    // counted again (7 traces of 5 episodes, shard summaries of two runs).
    assert_eq!(traces_under(out.path()).len(), 5);
    assert!(!variant_dir.join("shard-1/summary.json").exists());
    assert_eq!(std::fs::read_to_string(variant_dir.join("shard-1/notes.txt")).unwrap(), "mine");
    let summary: Value =
        serde_json::from_slice(&std::fs::read(variant_dir.join("shard-0/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["shard_count"], 1);
    assert_eq!(summary["episodes"].as_array().unwrap().len(), 5);
}

#[test]
fn a_shard_that_cannot_write_its_traces_stops_no_other_and_exits_2() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/raw-logits");
    let out = tempfile::tempdir().unwrap();
    // A file where shard 1's directory goes: an earlier run's shards are
    // replaced, but a file is not a shard's, so it stays and shard 1 fails at once.
    let variant_dir = out.path().join("default");
    std::fs::create_dir_all(&variant_dir).unwrap();
    std::fs::write(variant_dir.join("shard-1"), "not a directory").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", example.to_str().unwrap(), "--no-progress", "--shards", "2", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    // Before: exit 1 on the first shard error, shard 0 aborted mid-episode, no run.json.
    assert_eq!(output.status.code(), Some(2), "{stdout}\n{stderr}");
    let shard_1 = variant_dir.join("shard-1");
    assert!(
        stderr.contains(&format!("error: variant default, shard 1: cannot write the traces of {}", shard_1.display())),
        "{stderr}"
    );
    assert!(stdout.contains("default: shard 1 wrote no summary"), "{stdout}");
    let summary: Value =
        serde_json::from_slice(&std::fs::read(variant_dir.join("shard-0/summary.json")).unwrap()).unwrap();
    let finished = summary["episodes"].as_array().unwrap().len();
    assert!(finished > 0, "{summary}");
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    assert_eq!(variant(&run, "default")["aggregate"]["episodes"], finished);
    assert_eq!(run["failed_shards"][0]["shard"], 1, "{run}");
    // The rows the shard was to run, none of them counted, and said so.
    let rows = std::fs::read_to_string(example.join("tests.jsonl")).unwrap().lines().count();
    assert_eq!(run["failed_shards"][0]["episodes"], rows - finished, "{run}");
    assert!(stdout.contains(&format!("shard 1 wrote no summary, its {} episodes are not counted", rows - finished)));
    let report = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(report.contains("variant default, shard 1 wrote no summary"));
}

#[test]
fn two_runs_whose_directories_end_alike_are_told_apart_in_ab_compare() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/raw-logits");
    let out = tempfile::tempdir().unwrap();
    for run in ["x", "y"] {
        let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["run", example.to_str().unwrap(), "--no-progress", "--out"])
            .arg(out.path().join(run))
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }
    let compare = |json: bool| {
        let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["ab", "compare"])
            .args([out.path().join("x/default"), out.path().join("y/default")])
            .args(json.then_some("--json"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    // Before: `metric  default  default  delta`, and one name for both sides in the JSON.
    let text = compare(false);
    let header = text.lines().find(|l| l.starts_with("metric")).expect(&text);
    assert_eq!(header.split_whitespace().collect::<Vec<_>>(), ["metric", "x/default", "y/default", "delta"]);
    let json: Value = serde_json::from_str(&compare(true)).unwrap();
    assert_eq!(
        (&json["comparison"]["baseline"], &json["comparison"]["candidate"]),
        (&"x/default".into(), &"y/default".into())
    );
}

#[test]
fn a_concurrency_of_0_is_refused_naming_the_flag() {
    let out = tempfile::tempdir().unwrap();
    // Before: taken as 1 without a word.
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", example().to_str().unwrap(), "--concurrency", "0", "--out", out.path().to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invalid value '0' for '--concurrency <CONCURRENCY>': must be at least 1"), "{stderr}");
    assert!(traces_under(out.path()).is_empty());
}

#[test]
fn an_out_that_is_a_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("results");
    std::fs::write(&file, "notes").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", example().to_str().unwrap(), "--out", file.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    // Before: "cannot create .../results: File exists (os error 17)".
    let expected = format!("{} is a file; the output goes into a directory (created if missing)", file.display());
    assert!(stderr.contains(&expected), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "notes");
}

#[test]
fn a_concurrency_above_the_episodes_runs_them_all_at_once() {
    let out = tempfile::tempdir().unwrap();
    let raw = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/raw-logits");
    // Before: a shard task panicked ("a semaphore may not have more than MAX_PERMITS permits").
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", raw.to_str().unwrap(), "--no-progress", "--concurrency", "18446744073709551615", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.path().join("run.json").is_file());
}

#[test]
fn sigterm_stops_a_run_like_ctrl_c_and_stops_its_services() {
    // A copy of the example: its services are the only processes working in it.
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let out = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", project.to_str().unwrap(), "--no-progress", "--concurrency", "1"])
        .args(["--out", out.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while traces_under(out.path()).len() < 4 {
        assert!(Instant::now() < deadline, "no traces appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(services_in(&project).len(), 2, "each variant's tracking service runs");
    // What `timeout`, `kill` or a cancelled CI job sends.
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(30), "the run did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    // Before: killed by the signal, no summaries, and both tracking services left running for good.
    assert_eq!(output.status.code(), Some(130), "{}", String::from_utf8_lossy(&output.stderr));
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    assert_eq!(run["stopped_early"], true);
    wait_for_no_services(&project, Duration::from_secs(10));
}

#[test]
fn a_closed_stderr_loses_its_lines_not_the_run() {
    let out = tempfile::tempdir().unwrap();
    // `2>&1 | head -1`, after head has gone: every write to stderr fails.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", example().to_str().unwrap(), "--no-progress", "--out", out.path().to_str().unwrap()])
        .stderr(writer)
        .output()
        .unwrap();
    // Before: the first warning (variant a's null fallback) panicked, exit 101, before any episode.
    assert_eq!(output.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&output.stdout).contains("b vs a:"));
    assert!(out.path().join("run.json").is_file());
}

#[test]
fn a_second_ctrl_c_or_sigterm_quits_at_once_and_stops_the_services() {
    // A second SIGTERM quits too (only a second Ctrl-C did), and the message names the signal
    // that came (it said "Ctrl-C again" after a SIGTERM).
    for (signal, named) in [("INT", "Ctrl-C"), ("TERM", "SIGTERM")] {
        let dir = tempfile::tempdir().unwrap();
        let project = example_copy(dir.path());
        never_ready(&project);
        // ...and ignores SIGTERM: stopping it takes a 2 s grace period, in which the second signal comes.
        let script = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n";
        std::fs::write(project.join("services/tracking.py"), script).unwrap();
        let out = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["run", project.to_str().unwrap(), "--no-progress", "--out", out.path().to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_services(&project, Duration::from_secs(20));
        let send = || {
            let sent = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status();
            assert!(sent.unwrap().success());
        };
        send();
        std::thread::sleep(Duration::from_millis(500));
        send();
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(started.elapsed() < Duration::from_secs(10), "the second {named} did not quit");
            std::thread::sleep(Duration::from_millis(50));
        }
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(130));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&format!("stopping on {named}: no new episodes")), "{stderr}");
        // Before: the service, in a process group of its own, was left sleeping.
        wait_for_no_services(&project, Duration::from_secs(5));
    }
}

#[test]
fn ctrl_c_while_a_service_starts_ends_the_wait_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    never_ready(&project);
    let out = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", project.to_str().unwrap(), "--no-progress", "--out", out.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_services(&project, Duration::from_secs(20));
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        // Before: the stop waited for the service's readyTimeout, then failed the run with NotReady.
        assert!(started.elapsed() < Duration::from_secs(10), "Ctrl-C did not end the wait for the service");
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", String::from_utf8_lossy(&output.stderr));
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    assert_eq!(run["stopped_early"], true);
    wait_for_no_services(&project, Duration::from_secs(5));
}

#[test]
fn sigkill_of_a_run_takes_its_services_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let out = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", project.to_str().unwrap(), "--no-progress", "--concurrency", "1"])
        .args(["--out", out.path().to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while traces_under(out.path()).is_empty() {
        assert!(Instant::now() < deadline, "no traces appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(services_in(&project).len(), 2, "each variant's tracking service runs");
    // The OOM killer, `kill -9`: no handler and no destructor runs, only the kernel acts.
    child.kill().unwrap();
    child.wait().unwrap();
    // Before: both tracking services slept on, reparented to init.
    wait_for_no_services(&project, Duration::from_secs(5));
}

/// Runs one episode whose first step calls an exec tool, `sh -c SCRIPT`
/// with `PIDS` in it replaced by a file, waits for the script to write
/// `count` process ids there, SIGKILLs the run and returns the ids.
fn sigkill_a_run_during_a_tool_call(script: &str, count: usize) -> Vec<u32> {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("tool.pids");
    let script = script.replace("PIDS", &pid_file.display().to_string());
    let manifests = format!(
        r#"apiVersion: basecamp.dev/v1alpha1
kind: SandboxConfig
metadata: {{name: sb}}
spec:
  tools:
    slow:
      parameters: {{type: object}}
      exec: {{command: [sh, -c, '{script}']}}
  toolTimeouts: {{default: 90s}}
  planStepTimeout: 100s
---
apiVersion: basecamp.dev/v1alpha1
kind: HarnessTask
metadata: {{name: kl}}
spec:
  taskDefinition: {{name: kl}}
  evaluation: {{testSet: tests.jsonl}}
  policy: {{scripted: policy.jsonl}}
  sandboxRef: {{name: sb}}
"#
    );
    std::fs::write(dir.path().join("task.yaml"), manifests).unwrap();
    std::fs::write(dir.path().join("tests.jsonl"), "{\"id\": \"s1\", \"instruction\": \"x\"}\n").unwrap();
    std::fs::write(
        dir.path().join("policy.jsonl"),
        "{\"episode\": \"s1\", \"turns\": [{\"tool_calls\": [{\"name\": \"slow\", \"arguments\": {}}]}, {\"content\": \"done\"}]}\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", dir.path().to_str().unwrap(), "--no-progress", "--out"])
        .arg(dir.path().join("out"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let pids = loop {
        let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
        let pids: Vec<u32> = text.split_whitespace().filter_map(|p| p.parse().ok()).collect();
        if pids.len() == count {
            break pids;
        }
        assert!(Instant::now() < deadline, "the tool never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    pids
}

fn assert_gone_soon(pids: &[u32], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let alive = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')))
    };
    while let Some(pid) = pids.iter().find(|pid| alive(pid)) {
        assert!(Instant::now() < deadline, "{what} (pid {pid}) still runs after its run was killed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigkill_of_a_run_takes_a_running_exec_tool_with_it() {
    let pids = sigkill_a_run_during_a_tool_call("echo $$ > PIDS; exec sleep 60", 1);
    // Before: the tool slept on for its minute, reparented to init.
    assert_gone_soon(&pids, "the tool");
}

#[test]
fn sigkill_of_a_run_takes_what_its_exec_tool_started_with_it() {
    let pids = sigkill_a_run_during_a_tool_call("sleep 60 & echo $$ $! > PIDS; wait", 2);
    // Before: the tool died (its parent-death signal) and its `sleep` slept
    // on, reparented to init: that signal is not inherited.
    assert_gone_soon(&pids, "the tool or what it started");
}

#[test]
fn a_shard_count_above_the_episodes_is_refused_naming_where_it_came_from() {
    let raw = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/raw-logits");
    let out = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", raw.to_str().unwrap(), "--no-progress", "--shards", "4000000000", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Before: a runner built for every one of the 4e9 shards, memory growing until the machine gave out.
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "--shards 4000000000: the test set tests.jsonl has 5 episodes, so at most 5 shards can hold one each; give --shards 5 or fewer"
        ),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(traces_under(out.path()).is_empty());

    // The task's own `shards`, when it is the one too large, is named instead.
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let task = std::fs::read_to_string(project.join("task.yaml")).unwrap();
    assert!(task.contains("shards: 2"), "{task}");
    std::fs::write(project.join("task.yaml"), task.replace("shards: 2", "shards: 61")).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", project.to_str().unwrap(), "--no-progress", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("spec.shards is 61: the test set tests.jsonl has 60 episodes"), "{stderr}");
    assert!(stderr.contains("give --shards 60 or fewer to run it here"), "{stderr}");
    assert!(services_in(&project).is_empty(), "refused before any service started");
}

#[test]
fn a_run_into_the_directory_of_another_tasks_run_is_refused_before_anything_changes() {
    let raw = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/raw-logits");
    let tmp = tempfile::tempdir().unwrap();
    // The same example under another task name: its single variant is also `default`.
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let copied = Command::new("cp").arg("-r").arg(format!("{}/.", raw.display())).arg(&other).status().unwrap();
    assert!(copied.success());
    let task = std::fs::read_to_string(other.join("task.yaml")).unwrap();
    assert!(task.contains("  name: raw-logits\n"), "{task}");
    std::fs::write(other.join("task.yaml"), task.replace("  name: raw-logits\n", "  name: raw-logits-copy\n")).unwrap();

    let out = tmp.path().join("runs");
    let run = |manifests: &Path| {
        Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["run", manifests.to_str().unwrap(), "--no-progress", "--out", out.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let output = run(&raw);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let run_json = std::fs::read(out.join("run.json")).unwrap();
    let mut traces = traces_under(&out);
    traces.sort();
    assert_eq!(traces.len(), 5);
    let first_trace = std::fs::read(&traces[0]).unwrap();

    // Before: the other task's run removed these traces (the same variant name), then
    // replaced run.json and report.html with its own, exit 0.
    let output = run(&other);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{} holds a run of task \"raw-logits\" ({}), not of \"raw-logits-copy\"",
            out.display(),
            out.join("run.json").display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("give another --out (the default is basecamp-runs/raw-logits-copy)"), "{stderr}");
    assert_eq!(std::fs::read(out.join("run.json")).unwrap(), run_json);
    let mut after = traces_under(&out);
    after.sort();
    assert_eq!(after, traces);
    assert_eq!(std::fs::read(&traces[0]).unwrap(), first_trace);

    // A rerun of the same task still replaces its earlier run.
    let output = run(&raw);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// `--variant b` into a directory holding a run of both keeps variant a's
/// results: its shards stay, and run.json and the report still include it,
/// marked as an earlier run's (serve and ab compare read both). Before:
/// run.json and report.html held b alone while a's shards stayed on disk.
#[test]
fn a_rerun_of_one_variant_keeps_the_other_in_run_json_and_the_report() {
    let out = tempfile::tempdir().unwrap();
    let o = out.path().to_str().unwrap();
    let run = |extra: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["run", example().to_str().unwrap(), "--no-progress", "--out", o])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        output
    };
    run(&[]);
    let output = run(&["--variant", "b"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("a: from an earlier run in this directory (not run now)"), "{stdout}");
    // The headline counts what ran (it said 120 episodes at the rate of 60).
    assert!(
        stdout.contains(": 60 episodes in ") && stdout.contains(", plus 1 variant(s) from an earlier run"),
        "{stdout}"
    );
    let run_json: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    let names: Vec<&str> =
        run_json["variants"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(run_json["variants"][0]["kept_from_earlier_run"], true);
    assert!(run_json["variants"][1].get("kept_from_earlier_run").is_none());
    assert_eq!(run_json["variants"][0]["aggregate"]["episodes"], 60);
    let report = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(report.contains("variant a: from an earlier run in this directory (not run now)"));
    assert!(report.contains("A/B: b vs a") || report.contains("A/B: a vs b"), "the comparison is still there");
}

/// A run refused before it starts (more shards than episodes) leaves no
/// output directory behind.
#[test]
fn a_run_refused_before_it_starts_creates_no_output_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", example().to_str().unwrap(), "--no-progress", "--shards", "61", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--shards 61"));
    assert!(!out.exists());
}

/// A run whose scripted policy is refused leaves no output directory (it
/// used to hold the services' logs alone), and in the directory of an
/// earlier run the earlier services' logs stay as they were; the error
/// names the file and the line.
#[test]
fn a_run_whose_policy_is_refused_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let mut policy = std::fs::read_to_string(project.join("policy.jsonl")).unwrap();
    let bad_line = policy.lines().count() + 1;
    policy.push_str("{\"episode\": \"ship-999\", \"turns\": 5}\n");
    std::fs::write(project.join("policy.jsonl"), policy).unwrap();
    let outs = tempfile::tempdir().unwrap();
    let run = |out: &Path| {
        let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["run", project.to_str().unwrap(), "--no-progress", "--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stderr).into_owned()
    };

    let out = outs.path().join("never");
    let stderr = run(&out);
    assert!(stderr.contains(&format!("policy.jsonl:{bad_line}: ")), "{stderr}");
    // Before: never/a/services/tracking.log.
    assert!(!out.exists());

    let earlier = outs.path().join("earlier");
    std::fs::create_dir_all(earlier.join("a/services")).unwrap();
    std::fs::write(earlier.join("a/services/tracking.log"), "the earlier run's log\n").unwrap();
    run(&earlier);
    assert_eq!(std::fs::read_to_string(earlier.join("a/services/tracking.log")).unwrap(), "the earlier run's log\n");
    let entries: Vec<_> = std::fs::read_dir(&earlier).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(entries, ["a"]);
}

/// Refused once its services are up (a tool's program is checked with the
/// services' addresses in place), a run removes the directories it made.
#[test]
fn a_run_refused_after_its_services_started_removes_what_it_created() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let sandbox = std::fs::read_to_string(project.join("sandbox-b.yaml")).unwrap();
    let missing = sandbox.replace("command: [python3, tools/issue_credit.py]", "command: [tools/no-such-tool]");
    assert_ne!(missing, sandbox, "the example's exec tool");
    std::fs::write(project.join("sandbox-b.yaml"), missing).unwrap();
    let outs = tempfile::tempdir().unwrap();
    let out = outs.path().join("runs/never");
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", project.to_str().unwrap(), "--no-progress", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("variant b: spec.tools.issue_credit.exec.command[0]"), "{stderr}");
    // Variant a's services started and wrote their log before b's tool was found missing.
    assert!(!outs.path().join("runs").exists());
    wait_for_no_services(&project, Duration::from_secs(5));
}

/// A null the test set starts an episode with is given, not a cause: the
/// hints name what failed (before: every failed episode was "`shipping_status`
/// was set to null by initial memory `test_set`", hiding the timeouts and
/// rate limits behind it).
#[test]
fn a_null_in_the_initial_memory_is_not_the_root_cause() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let tests = project.join("tests.jsonl");
    let rows: Vec<String> = std::fs::read_to_string(&tests)
        .unwrap()
        .lines()
        .map(|line| {
            let mut row: Value = serde_json::from_str(line).unwrap();
            row["initial_memory"]["shipping_status"] = Value::Null;
            row.to_string()
        })
        .collect();
    std::fs::write(&tests, rows.join("\n") + "\n").unwrap();
    let out = dir.path().join("out");
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", project.to_str().unwrap(), "--variant", "a", "--no-progress", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let run: Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    let a = variant(&run, "a");
    let causes = a["root_causes"].as_array().unwrap();
    assert!(a["failed"].as_u64().unwrap() > 0 && !causes.is_empty(), "{stdout}");
    // The fallback writes null over a null: memory does not change, so the
    // failures are told by their class, with the errors before the fallback.
    let keys: Vec<&str> = causes.iter().map(|c| c["key"].as_str().unwrap()).collect();
    assert!(keys.iter().all(|k| k.starts_with("class:")), "{keys:?}");
    let hints: Vec<&str> = causes.iter().map(|c| c["hint"].as_str().unwrap()).collect();
    assert!(hints.iter().any(|h| h.contains("(after timeout x")), "{hints:?}");
    assert!(!stdout.contains("initial memory"), "{stdout}");
}

/// `--shards 0` is a usage error like `--concurrency 0` (exit 2, before
/// anything is read); before, it exited 1 after reading the manifests.
#[test]
fn zero_shards_is_a_usage_error() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", example().to_str().unwrap(), "--shards", "0", "--out", out.path().join("o").to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invalid value '0' for '--shards <SHARDS>': must be at least 1"), "{stderr}");
    assert!(!stderr.contains("warning:"), "refused before the manifests are read: {stderr}");
    assert!(!out.path().join("o").exists());
}

/// `basecamp run PROJECT --variant VARIANT --no-progress --out OUT EXTRA...`.
fn run_variant(project: &Path, out: &Path, variant: &str, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", project.to_str().unwrap(), "--variant", variant])
        .args(extra)
        .args(["--no-progress", "--out"])
        .arg(out)
        .output()
        .unwrap()
}

/// A loopback port nothing listens on (bound, then let go).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The copied example's task with `policy` (YAML under `spec.policy:`) in
/// place of its scripted policy.
fn use_policy(project: &Path, policy: &str) {
    let task = std::fs::read_to_string(project.join("task.yaml")).unwrap();
    assert!(task.contains("scripted: policy.jsonl"), "{task}");
    std::fs::write(project.join("task.yaml"), task.replace("scripted: policy.jsonl", policy)).unwrap();
}

/// The example's tracking service, replaced by one that answers its
/// readiness probe and exits with status 3 on the first order asked for.
const CRASHING_TRACKER: &str = r#"import os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/healthz":
            print("tracking crashed on", self.path, flush=True)
            os._exit(3)
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
HTTPServer((os.environ["HOST"], int(os.environ["PORT"])), Handler).serve_forever()
"#;

/// A service that dies during the run is named with its exit status and its
/// log in the table, run.json and on stderr, the calls to it fail as
/// `service_exited` naming it (they were bare `transport` errors, "connection
/// refused", blamed on the agent and the fallback's null), the root-cause
/// hint says the sandbox broke, and the exit status is 3 (it was 0).
#[test]
fn a_service_that_dies_during_the_run_is_reported_with_its_status_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    std::fs::write(project.join("services/tracking.py"), CRASHING_TRACKER).unwrap();
    let out = tempfile::tempdir().unwrap();
    let output = run_variant(&project, out.path(), "b", &[]);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let log = out.path().join("b/services/tracking.log");
    assert!(std::fs::read_to_string(&log).unwrap().contains("tracking crashed on /orders/"), "the service died");
    assert_eq!(output.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("failed because a service it calls had exited (`service_exited`: the sandbox broke"),
        "the hint: {stdout}"
    );

    // Before: none of these.
    let said = "b: service tracking EXITED during the run (exit status: 3)";
    assert!(stdout.contains(said) && stdout.contains(&log.display().to_string()), "{stdout}");
    assert!(
        stderr.contains("warning: variant b: service tracking exited with exit status: 3 during the run"),
        "{stderr}"
    );
    assert!(stderr.contains("tracking crashed on /orders/"), "the end of its log: {stderr}");
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    let exits = run["service_exits"].as_array().unwrap_or_else(|| panic!("no service_exits in {run}"));
    assert_eq!(exits.len(), 1, "{run}");
    assert_eq!(exits[0]["variant"], "b");
    assert_eq!(exits[0]["service"], "tracking");
    assert_eq!(exits[0]["status"], "exit status: 3");
    assert_eq!(exits[0]["log"], log.display().to_string());
    let report = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(report.contains("service-exit") && report.contains("service tracking EXITED"), "the report says it too");
    // Every episode's first failed call says which service and why.
    let episodes = run["variants"][0]["episodes"].as_array().unwrap_or_else(|| panic!("no episodes in {run}"));
    assert!(!episodes.is_empty() && episodes.iter().all(|e| e["failure_class"] == "service_exited"), "{run}");
    let trace = basecamp_trace::read_trace(&traces_under(&out.path().join("b"))[0]).unwrap();
    let failed = trace
        .records
        .iter()
        .find_map(|r| match &r.body {
            Some(basecamp_trace::pb::record::Body::PlanStep(step)) if !step.error_type.is_empty() => Some(step.clone()),
            _ => None,
        })
        .expect("a failed call");
    assert_eq!(failed.error_type, "service_exited");
    assert!(
        failed.error_message.starts_with("tool track_order failed because service tracking exited with exit status: 3"),
        "{}",
        failed.error_message
    );
    assert!(failed.error_message.contains(&log.display().to_string()), "{}", failed.error_message);
}

/// Another process on a service's fixed port would answer its readiness
/// probe while the service dies of EADDRINUSE: the run is refused before
/// any episode, naming the port and the field.
#[test]
fn a_fixed_service_port_held_by_another_process_refuses_the_run() {
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = squatter.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut stream in squatter.incoming().flatten() {
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let sandbox = project.join("sandbox-b.yaml");
    let text = std::fs::read_to_string(&sandbox).unwrap();
    let fixed = text.replace("readyPath: /healthz", &format!("readyPath: /healthz\n      port: {port}"));
    assert_ne!(fixed, text);
    std::fs::write(&sandbox, fixed).unwrap();
    let out = tempfile::tempdir().unwrap();
    let output = run_variant(&project, out.path(), "b", &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Before: exit 0, every episode run against the squatter.
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("port {port} on 127.0.0.1 is already in use by another process")), "{stderr}");
    assert!(stderr.contains("spec.services.tracking.port"), "{stderr}");
    assert!(traces_under(out.path()).is_empty(), "no episode ran");
}

/// Two variants whose services take one fixed port cannot run side by side
/// here: said before anything starts, with the way out (one variant at a
/// time). Before: the second variant's service found the port taken.
#[test]
fn variants_whose_services_share_a_fixed_port_are_refused_naming_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    for file in ["sandbox-a.yaml", "sandbox-b.yaml"] {
        let path = project.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let fixed = text.replace(
            "      command: [python3, services/tracking.py]\n",
            &format!("      command: [python3, services/tracking.py]\n      port: {port}\n"),
        );
        assert_ne!(fixed, text, "{file}: the tracking service");
        std::fs::write(&path, fixed).unwrap();
    }
    let out = dir.path().join("out");
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["run", project.to_str().unwrap(), "--no-progress", "--out", out.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let both = run(&[]);
    let stderr = String::from_utf8_lossy(&both.stderr);
    assert_eq!(both.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("variants a and b both give a service the fixed port {port}")), "{stderr}");
    assert!(stderr.contains("`--variant a`, then `--variant b`"), "{stderr}");
    assert!(!out.exists(), "refused before anything started");
    // The way out works: one at a time into the same directory.
    for variant in ["a", "b"] {
        let one = run(&["--variant", variant]);
        assert!(one.status.success(), "{variant}: {}", String::from_utf8_lossy(&one.stderr));
    }
    let summary: Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(summary["variants"].as_array().unwrap().len(), 2, "both variants' results");
}

/// Episodes that failed with nothing but a class (`policy_error`) are
/// explained by the first one's error: before, the hint said only "the
/// episode failed with `policy_error`", and why was in summary.json and
/// the traces alone.
#[test]
fn a_failure_class_hint_quotes_the_first_episode_s_error() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let closed = closed_port();
    use_policy(&project, &format!("endpoint: http://127.0.0.1:{closed}/v1\n    model: m"));
    let rows = std::fs::read_to_string(project.join("tests.jsonl")).unwrap();
    std::fs::write(project.join("tests.jsonl"), rows.lines().take(2).map(|l| format!("{l}\n")).collect::<String>())
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let output = run_variant(&project, out.path(), "b", &["--shards", "1"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let hint = stdout.lines().find(|l| l.contains("failed episodes the episode failed with")).expect(&stdout);
    assert!(
        hint.contains(&format!(
            "`policy_error` (the first: policy failed: cannot reach policy endpoint http://127.0.0.1:{closed}/v1 after"
        )),
        "{hint}"
    );

    // The agent was never asked: not an accuracy of 0 and exit status 0, as before.
    let said = "b: 2 of 2 episodes NOT MEASURED: the policy or a service failed, not the agent (policy_error x2); \
                no metric measured the agent";
    assert!(stdout.contains(said), "{stdout}");
    assert!(stderr.contains("error: variant b: 2 of 2 episodes NOT MEASURED"), "{stderr}");
    assert_eq!(output.status.code(), Some(3), "{stdout}\n{stderr}");
    let row = stdout.lines().find(|l| l.starts_with("b ")).expect(&stdout);
    assert_eq!(row.split_whitespace().collect::<Vec<_>>()[..4], ["b", "2", "-", "-"], "{row}");
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    let aggregate = &run["variants"][0]["aggregate"];
    assert_eq!((aggregate["episodes"].as_u64(), aggregate["not_measured"].as_u64()), (Some(2), Some(2)), "{run}");
    assert!(aggregate["means"].as_object().is_some_and(|m| m.is_empty()), "{aggregate}");
    let report = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(report.contains("not-measured") && report.contains("2 of 2 episodes NOT MEASURED"), "the report too");
}

/// `basecamp run` does not start `spec.policy.server` (the operator runs it
/// as a pod's sidecar): one that never answers says so and how to go on;
/// before, the error's advice was a pod's ("check the policy-server
/// container's logs").
#[test]
fn a_policy_server_that_never_answers_says_basecamp_run_does_not_start_it() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let closed = closed_port();
    let server = format!(
        "endpoint: http://127.0.0.1:{closed}/v1\n    model: m\n    server:\n      image: vllm/vllm-openai:v0.11.0\n      \
         port: {closed}\n      startupTimeout: 1s"
    );
    use_policy(&project, &server);
    let out = tempfile::tempdir().unwrap();
    let output = run_variant(&project, out.path(), "b", &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("did not answer 200 at http://127.0.0.1:{closed}/v1/models within 1s")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "`basecamp run` does not start the policy server (in a cluster the operator runs spec.policy.server as a \
             sidecar of each pod): start it on this machine so that it answers at http://127.0.0.1:{closed}/v1/models"
        )),
        "{stderr}"
    );
}

/// Writes the example's `task.yaml` as `task` (its text) with `criterion`
/// added to its success criteria.
fn with_criterion(project: &Path, task: &str, criterion: &str) {
    let criteria = format!("successCriteria:\n      - {criterion}");
    std::fs::write(project.join("task.yaml"), task.replacen("successCriteria:", &criteria, 1)).unwrap();
}

/// Makes the scripted policy of the first `episodes` episodes fail on its
/// second turn, as a server answering 503 does.
fn fail_the_policy_midway(project: &Path, episodes: usize) {
    let script = std::fs::read_to_string(project.join("policy.jsonl")).unwrap();
    let mut lines: Vec<Value> = script.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for line in &mut lines[..episodes] {
        line["turns"][1] = serde_json::json!({"error": "upstream connect error (503)"});
    }
    std::fs::write(project.join("policy.jsonl"), lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
}

/// A policy that fails every episode makes each shard give up after
/// `outage_threshold` in a row (5 at `--concurrency 1`): the table, stderr
/// and `run.json` say why and which episodes were not started, and the run
/// exits 3 even with a criterion that tolerates every episode not measured
/// (the test set was not covered). Before, all 60 episodes ran into the
/// dead server, each after its retries.
#[test]
fn a_run_gives_up_on_a_policy_that_fails_episode_after_episode() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    fail_the_policy_midway(&project, 60);
    let task = std::fs::read_to_string(project.join("task.yaml")).unwrap();
    with_criterion(&project, &task, "not_measured_rate <= 100%");
    let out = tempfile::tempdir().unwrap();
    let output = run_variant(&project, out.path(), "a", &["--shards", "1", "--concurrency", "1"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(3), "{stdout}{stderr}");
    assert!(
        stdout.contains("a: shard 0 GAVE UP: 5 episodes in a row were ended by the policy's server or a service"),
        "{stdout}"
    );
    assert!(stdout.contains("55 episode(s) not started"), "{stdout}");
    assert!(stderr.contains("error: variant a, shard 0: 5 episodes in a row"), "said when it happened: {stderr}");
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    let variant = &run["variants"][0];
    assert_eq!(variant["aggregate"]["episodes"], 5);
    assert_eq!(variant["gave_up"][0]["not_started"].as_array().map(Vec::len), Some(55), "{variant}");
    assert!(run["stopped_early"] != true, "not a stop: {run}");
    let report = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(report.contains("gave-up") && report.contains("55 episode(s) not started"), "the report says it too");
    // `ab compare` says its comparison is over part of the test set.
    let b = run_variant(&project, out.path(), "b", &["--shards", "1", "--concurrency", "1"]);
    assert_eq!(b.status.code(), Some(3));
    let ab = Command::new(env!("CARGO_BIN_EXE_basecamp")).args(["ab", "compare"]).arg(out.path()).output().unwrap();
    let said = String::from_utf8_lossy(&ab.stdout);
    assert!(said.contains("5 episodes, 5 failed, 5 NOT MEASURED, 1 shard(s) GAVE UP (55 not started)"), "{said}");
}

/// A hosted OpenAI-compatible endpoint on a loopback port, served by a
/// thread: chat completions answer "done" while it is up and 503 (with
/// `Retry-After: 0`, so the client's retries take no time) while it is
/// down; it goes down at chat request `down_at`, and `GET /v1/models`
/// (503 while down) brings it back on its `back_at`-th poll. Returns its
/// endpoint and the `Authorization` header of each poll of `/v1/models`.
fn flaky_endpoint(down_at: usize, back_at: usize) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}/v1", listener.local_addr().unwrap());
    let polls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = polls.clone();
    std::thread::spawn(move || {
        let (mut chats, mut up) = (0, true);
        for stream in listener.incoming().flatten() {
            let (stream, request_line, auth) = read_request(stream);
            if request_line.starts_with("GET /v1/models") {
                let mut polls = seen.lock().unwrap();
                polls.push(auth);
                up |= polls.len() == back_at;
            } else {
                chats += 1;
                up &= chats != down_at;
            }
            let status = if up { "200 OK" } else { "503 Service Unavailable\r\nRetry-After: 0" };
            answer(stream, status, DONE);
        }
    });
    (endpoint, polls)
}

/// A chat completion that ends the episode.
const DONE: &str = r#"{"choices": [{"message": {"content": "done"}, "finish_reason": "stop"}]}"#;

/// One HTTP/1.1 request read off `stream`: its request line and its
/// `Authorization` header; its body is read and dropped.
fn read_request(stream: std::net::TcpStream) -> (std::net::TcpStream, String, String) {
    use std::io::{BufRead, BufReader, Read};
    let mut reader = BufReader::new(stream);
    let (mut request_line, mut length, mut auth) = (String::new(), 0, String::new());
    reader.read_line(&mut request_line).unwrap_or_default();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or_default() == 0 || line == "\r\n" {
            break;
        }
        let (name, value) = line.split_once(':').unwrap_or_default();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().unwrap_or(0),
            "authorization" => auth = value.trim().to_string(),
            _ => {}
        }
    }
    let _ = reader.by_ref().take(length).read_to_end(&mut Vec::new());
    (reader.into_inner(), request_line, auth)
}

/// Answers `status` (the status line's rest, and any more header lines)
/// with a JSON `body`, and closes the connection.
fn answer(mut stream: std::net::TcpStream, status: &str, body: &str) {
    use std::io::Write;
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(reply.as_bytes());
}

/// `basecamp run` against a hosted endpoint that goes down midway: the shard
/// waits for `GET /v1/models` (with the API key) to answer, goes on, and
/// every episode of the test set runs; the five the outage failed are not
/// measured, within the criteria's tolerance, so the run exits 0. Before,
/// the shard gave up at the outage (exit 3, the rest never started).
#[test]
fn a_run_waits_out_a_hosted_endpoint_s_outage_and_runs_the_whole_test_set() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let (endpoint, polls) = flaky_endpoint(11, 2);
    use_policy(&project, &format!("endpoint: {endpoint}\n    model: m\n    apiKeyEnv: BASECAMP_TEST_KEY"));
    let task = std::fs::read_to_string(project.join("task.yaml")).unwrap();
    with_criterion(&project, &task, "not_measured_rate <= 20%");
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", project.to_str().unwrap(), "--variant", "b", "--shards", "1", "--concurrency", "1"])
        .args(["--no-progress", "--out", out.path().to_str().unwrap()])
        .env("BASECAMP_TEST_KEY", "sk-test")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    let waiting = format!("waiting up to 5m for the policy endpoint to answer at {endpoint}/models");
    assert!(stderr.contains(&waiting), "{stderr}");
    assert!(stderr.contains(&format!("the policy answers again at {endpoint}/models after ")), "{stderr}");
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    let variant = &run["variants"][0];
    let aggregate = &variant["aggregate"];
    assert_eq!((aggregate["episodes"].as_u64(), aggregate["not_measured"].as_u64()), (Some(60), Some(5)), "{run}");
    assert!(variant.get("gave_up").is_none_or(|g| g.as_array().is_some_and(Vec::is_empty)), "{variant}");
    assert_eq!(*polls.lock().unwrap(), ["Bearer sk-test", "Bearer sk-test"], "polled until back, with the key");
}

/// An OpenAI-compatible endpoint on a loopback port, a thread per
/// connection, that serves `allowed` chat requests at once (each answered
/// "done" after 30 ms) and answers any beyond them at once with 429 and
/// `retry-after-ms: 20`, as a hosted API's per-key limit does. Returns its
/// endpoint and the most requests it served at once.
fn rate_limited_endpoint(allowed: usize) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}/v1", listener.local_addr().unwrap());
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let served_most = most.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (in_flight, most) = (in_flight.clone(), most.clone());
            std::thread::spawn(move || {
                let (stream, _, _) = read_request(stream);
                let now = in_flight.fetch_add(1, SeqCst) + 1;
                let (status, body) = if now > allowed {
                    ("429 Too Many Requests\r\nretry-after-ms: 20", r#"{"error": {"message": "Rate limit reached"}}"#)
                } else {
                    most.fetch_max(now, SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(30));
                    ("200 OK", DONE)
                };
                in_flight.fetch_sub(1, SeqCst);
                answer(stream, status, body);
            });
        }
    });
    (endpoint, served_most)
}

/// `basecamp run` with 2 shards of 4 episodes at once against an endpoint
/// that serves 2 requests at once: its 429s lower the requests at once of
/// both shards (one client), every episode is measured, and the table and
/// `run.json` say how far the run came down. Before, 6 of every 8 requests
/// met 429, retried together and met it again, and episodes failed their
/// turns after 4 attempts.
#[test]
fn a_rate_limited_endpoint_slows_the_run_down_instead_of_failing_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    let (endpoint, most) = rate_limited_endpoint(2);
    use_policy(&project, &format!("endpoint: {endpoint}\n    model: m"));
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", project.to_str().unwrap(), "--variant", "b", "--shards", "2", "--concurrency", "4"])
        .args(["--no-progress", "--out", out.path().to_str().unwrap()])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    let lowered = format!("warning: policy endpoint {endpoint} answered 429 (too many requests): at most ");
    assert!(stderr.contains(&lowered), "{stderr}");
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    let variant = &run["variants"][0];
    assert_eq!(variant["aggregate"]["episodes"].as_u64(), Some(60), "{variant}");
    assert!(variant["aggregate"].get("not_measured").is_none(), "every episode measured: {variant}");
    let rate_limits = &variant["rate_limits"];
    assert!(rate_limits["answers_429"].as_u64().is_some_and(|n| n > 0), "{variant}");
    assert!(rate_limits["lowest_requests_at_once"].as_u64().is_some_and(|n| (1..=4).contains(&n)), "{variant}");
    assert!(stdout.contains("b: the policy endpoint answered 429 (too many requests) "), "{stdout}");
    assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 2);
    // `ab compare` says which side waited for its endpoint (a, run at its limit, never did).
    let a = run_variant(&project, out.path(), "a", &["--shards", "1", "--concurrency", "2"]);
    assert_eq!(a.status.code(), Some(0), "{}", String::from_utf8_lossy(&a.stderr));
    let ab = Command::new(env!("CARGO_BIN_EXE_basecamp")).args(["ab", "compare"]).arg(out.path()).output().unwrap();
    let said = String::from_utf8_lossy(&ab.stdout);
    let b_waited = format!(
        "b (60 episodes, 60 failed, {} answers 429 (its waits for the endpoint are in its resolution times))",
        rate_limits["answers_429"]
    );
    assert!(said.contains(&b_waited), "{said}");
    assert!(said.contains("vs a (60 episodes, 60 failed)"), "{said}");
}

/// A criterion on `not_measured_rate` is the run's tolerance for episodes
/// its infrastructure failed: within it the run is judged on the measured
/// episodes (b's criteria are met over its 50: exit 0 with
/// `--fail-on-criteria`); beyond it, exit 3 as without a tolerance. Before,
/// one not-measured episode failed any run, however long.
#[test]
fn a_criterion_on_not_measured_rate_sets_the_runs_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    fail_the_policy_midway(&project, 10);
    let task = std::fs::read_to_string(project.join("task.yaml")).unwrap();
    let with = |criterion: &str| {
        with_criterion(&project, &task, criterion);
        let out = tempfile::tempdir().unwrap();
        let output = run_variant(&project, out.path(), "b", &["--fail-on-criteria"]);
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = with("not_measured_rate <= 20%");
    assert_eq!(code, Some(0), "10 of 60 is within 20%: {stdout}{stderr}");
    assert!(stdout.contains("b: 10 of 60 episodes NOT MEASURED"), "still said: {stdout}");
    assert!(stdout.contains("(within the tolerance the criteria set: not_measured_rate <= 20%)"), "{stdout}");
    assert!(stderr.contains("warning: variant b: 10 of 60 episodes NOT MEASURED"), "{stderr}");
    let (code, stdout, stderr) = with("not_measured_rate <= 10%");
    assert_eq!(code, Some(3), "16.7% is beyond 10%: {stdout}{stderr}");
    assert!(stdout.contains("(beyond the tolerance the criteria set: not_measured_rate <= 10%)"), "{stdout}");
    assert!(stdout.contains("criterion `not_measured_rate <= 10%` not met"), "{stdout}");
    assert!(stderr.contains("error: variant b: 10 of 60"), "{stderr}");
}

/// Variant a's example with the policy failing the second turn of its
/// first ten episodes (after their tool call, some of which a fallback
/// answered with a null): those ten are NOT MEASURED, the means are over
/// the other 50, and the root-cause hint names the policy's failure for all
/// ten. Before, the three whose fallback wrote a null were in the null's
/// cluster (the hint said 7 policy failures), and the means counted all 60.
#[test]
fn episodes_the_policy_failed_midway_are_not_measured_and_clustered_as_the_policy_s() {
    let dir = tempfile::tempdir().unwrap();
    let project = example_copy(dir.path());
    fail_the_policy_midway(&project, 10);
    let out = tempfile::tempdir().unwrap();
    let output = run_variant(&project, out.path(), "a", &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(3), "{stdout}");
    assert!(
        stdout.contains("in 10 of 26 failed episodes the episode failed with `policy_error` (the first:"),
        "{stdout}"
    );
    assert!(stdout.contains("a: 10 of 60 episodes NOT MEASURED"), "{stdout}");
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    let variant = &run["variants"][0];
    let measured: Vec<&Value> =
        variant["episodes"].as_array().unwrap().iter().filter(|e| e["failure_class"] != "policy_error").collect();
    assert_eq!(measured.len(), 50);
    let mean = measured.iter().map(|e| e["metrics"]["memory_consistency"].as_f64().unwrap()).sum::<f64>() / 50.0;
    let said = variant["aggregate"]["means"]["memory_consistency"].as_f64().unwrap();
    assert!((said - mean).abs() < 1e-12, "the mean over the 50 measured: {said} vs {mean}");
}
