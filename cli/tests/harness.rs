//! `basecamp harness validate | convert` and the bad-input paths of
//! `basecamp run`, through the real binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn basecamp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("the basecamp binary runs")
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn a_manifest_with_five_mistakes_reports_all_five_with_their_places() {
    let broken = repo("examples/manifests/broken/shipping-broken.yaml");
    let output = basecamp(&["harness", "validate", broken.to_str().unwrap()]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    for expected in [
        "shipping-broken.yaml:23: spec.planStepTimout: unknown field \"planStepTimout\"",
        "spec.taskDefinition.successCriteria[1]: success criterion \"avg_resolution_time < 90 seconds\" does not parse at column 26",
        "spec.dataPipeline.source: \"s3://ds-logs/ecommerce-v3/?versionId=abc123\" has a query string",
        "spec.shards: shards is 0",
        "spec.fallbacks.track_ordr: a fallback names tool \"track_ordr\"",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    assert!(out.contains("5 error(s)"), "{out}");
}

#[test]
fn the_example_manifests_are_valid_and_the_null_fallback_is_warned_about() {
    let output = basecamp(&["harness", "validate", repo("examples/ecommerce").to_str().unwrap()]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("SandboxConfig/shipping-a: spec.fallbacks.track_order.memoryPatch.shipping_status"), "{out}");
    assert!(out.contains("0 error(s), 1 warning(s) in 3 object(s)"), "{out}");
    // A file named twice (its directory and itself) is read once, not "defined twice" at itself.
    let task = repo("examples/ecommerce/task.yaml");
    let twice =
        basecamp(&["harness", "validate", repo("examples/ecommerce").to_str().unwrap(), task.to_str().unwrap()]);
    let out = text(&twice);
    assert!(twice.status.success(), "{out}");
    assert!(out.contains("0 error(s), 1 warning(s) in 3 object(s)"), "{out}");
}

const HARNESS: &str = r#"{
  "task_definition": {"name": "e_commerce_support_v4", "goal": "resolve delayed shipping", "success_criteria": ["tool_call_accuracy >= 0.9"]},
  "data_pipeline": {"source": "s3://ds-logs/ecommerce-v3/", "batch_size": 64},
  "training_config": {"model_id": "base", "resume_frm": "s3://ckpt/last/"},
  "evaluation": {"metrics": ["tool_call_accuracy"], "test_set": "tests.jsonl"},
  "policy": {"scripted": "policy.jsonl"}
}"#;

#[test]
fn a_json_harness_is_validated_in_its_own_spelling_and_converts_to_a_valid_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo("examples/ecommerce");
    for file in ["tests.jsonl", "policy.jsonl", "sandbox-b.yaml"] {
        std::fs::copy(example.join(file), dir.path().join(file)).unwrap();
    }
    let harness = dir.path().join("harness.json");
    std::fs::write(&harness, HARNESS).unwrap();
    let sandbox = dir.path().join("sandbox-b.yaml");
    let (h, s) = (harness.to_str().unwrap(), sandbox.to_str().unwrap());

    let output = basecamp(&["harness", "validate", h, s, "--sandbox", "shipping-b"]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains("training_config.resume_frm: unknown field \"resume_frm\""), "{out}");
    assert!(out.contains("Did you mean \"resume_from\"?"), "{out}");
    assert!(out.contains("1 error(s)"), "{out}");

    let fixed = dir.path().join("fixed.json");
    std::fs::write(&fixed, HARNESS.replace("resume_frm", "resume_from")).unwrap();
    let converted = dir.path().join("task.yaml");
    let output = basecamp(&[
        "harness",
        "convert",
        fixed.to_str().unwrap(),
        "--sandbox",
        "shipping-b",
        "-o",
        converted.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output));
    let yaml = std::fs::read_to_string(&converted).unwrap();
    assert!(yaml.contains("name: e-commerce-support-v4") && yaml.contains("resumeFrom: s3://ckpt/last/"), "{yaml}");
    let output = basecamp(&["harness", "validate", converted.to_str().unwrap(), s]);
    assert!(output.status.success(), "the converted manifest is valid: {}", text(&output));
}

#[test]
fn a_task_defined_again_by_a_json_harness_is_an_error_at_the_json_file() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo("examples/ecommerce");
    for file in ["tests.jsonl", "policy.jsonl", "sandbox-b.yaml"] {
        std::fs::copy(example.join(file), dir.path().join(file)).unwrap();
    }
    let path = |file: &str| dir.path().join(file).to_str().unwrap().to_string();
    let fixed = HARNESS.replace("resume_frm", "resume_from");
    // The first opens its object on line 2, where "first at" points.
    std::fs::write(path("harness.json"), format!("\n{fixed}")).unwrap();
    std::fs::write(path("again.json"), &fixed).unwrap();
    let (harness, again, sandbox) = (path("harness.json"), path("again.json"), path("sandbox-b.yaml"));
    let validate = |paths: &[&str]| {
        let output = basecamp(&[&["harness", "validate", "--sandbox", "shipping-b"], paths].concat());
        (output.status.code(), text(&output))
    };
    let (code, out) = validate(&[&harness, &sandbox]);
    assert_eq!(code, Some(0), "one definition is valid: {out}");

    // Two JSON harness files naming the same task. Before: "ok", and the
    // second replaced the first when applied.
    let (code, out) = validate(&[&harness, &again, &sandbox]);
    assert_eq!(code, Some(1), "{out}");
    let expected = format!(
        "error: {again} (HarnessTask/e-commerce-support-v4): task_definition.name: HarnessTask \"e-commerce-support-v4\" is defined twice (first at {harness}:2); rename one"
    );
    assert!(out.contains(&expected), "missing {expected:?} in:\n{out}");
    assert!(out.contains("1 error(s)"), "{out}");

    // A YAML manifest and a JSON harness naming the same task, the YAML one
    // in a namespace (the JSON form has none, so it may land in any).
    let output = basecamp(&["harness", "convert", &harness, "--sandbox", "shipping-b", "-o", &path("task.yaml")]);
    assert!(output.status.success(), "{}", text(&output));
    let yaml = std::fs::read_to_string(path("task.yaml")).unwrap();
    let yaml =
        yaml.replacen("  name: e-commerce-support-v4\n", "  name: e-commerce-support-v4\n  namespace: team-a\n", 1);
    std::fs::write(path("task.yaml"), yaml).unwrap();
    let task = path("task.yaml");
    let (code, out) = validate(&[&again, &task, &sandbox]);
    assert_eq!(code, Some(1), "{out}");
    let expected = format!(
        "error: {again} (HarnessTask/e-commerce-support-v4): task_definition.name: HarnessTask \"e-commerce-support-v4\" is defined twice (first at {task}:2); rename one"
    );
    // :2, the object's first line, under convert's heading comment.
    assert!(out.contains(&expected), "missing {expected:?} in:\n{out}");
    assert!(out.contains("1 error(s)"), "{out}");
}

#[test]
fn a_yaml_task_and_a_json_harness_of_one_name_each_have_their_problems_at_their_own_file() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo("examples/ecommerce");
    for file in ["tests.jsonl", "policy.jsonl", "sandbox-b.yaml"] {
        std::fs::copy(example.join(file), dir.path().join(file)).unwrap();
    }
    let path = |file: &str| dir.path().join(file).to_str().unwrap().to_string();
    let (harness, task, sandbox) = (path("harness.json"), path("task.yaml"), path("sandbox-b.yaml"));
    std::fs::write(&harness, HARNESS.replace("resume_frm", "resume_from")).unwrap();
    let output = basecamp(&["harness", "convert", &harness, "--sandbox", "shipping-b", "-o", &task]);
    assert!(output.status.success(), "{}", text(&output));
    // The YAML task's criterion does not parse; the JSON one's source has a query string.
    let yaml =
        std::fs::read_to_string(&task).unwrap().replace("tool_call_accuracy >= 0.9", "tool_call_accuracy >= lots");
    std::fs::write(&task, yaml).unwrap();
    let json = HARNESS.replace("resume_frm", "resume_from").replace("ecommerce-v3/", "ecommerce-v3/?versionId=abc");
    std::fs::write(&harness, json).unwrap();

    let output = basecamp(&["harness", "validate", "--sandbox", "shipping-b", &task, &harness, &sandbox]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    let object = "(HarnessTask/e-commerce-support-v4)";
    // Before: both were reported at the JSON file, the YAML task's in the JSON spelling.
    let yaml_problem = format!(
        "error: {task}:2 {object}: spec.taskDefinition.successCriteria[0]: success criterion \"tool_call_accuracy >= lots\" does not parse"
    );
    let json_problem = format!(
        "error: {harness} {object}: data_pipeline.source: \"s3://ds-logs/ecommerce-v3/?versionId=abc\" has a query string"
    );
    for expected in [&yaml_problem, &json_problem] {
        assert!(out.contains(expected.as_str()), "missing {expected:?} in:\n{out}");
    }
    assert!(!out.contains("success_criteria"), "the YAML task's problem is not the JSON file's: {out}");
    assert!(!out.contains("spec.dataPipeline.source"), "the JSON harness's problem is not the YAML file's: {out}");
    assert!(out.contains("3 error(s)"), "the two and the task defined twice: {out}");
}

#[test]
fn a_missing_sandbox_config_is_named_by_validate_and_by_run() {
    let dir = tempfile::tempdir().unwrap();
    let task = std::fs::read_to_string(repo("examples/ecommerce/task.yaml")).unwrap();
    std::fs::write(dir.path().join("task.yaml"), task).unwrap();
    let path = dir.path().to_str().unwrap();
    let output = basecamp(&["harness", "validate", path]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains("shipping-a") && out.contains("shipping-b"), "both missing sandboxes are named: {out}");
    let output = basecamp(&["run", path, "--no-progress", "--out", dir.path().join("out").to_str().unwrap()]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains("shipping-a"), "{out}");
}

#[test]
fn a_sandbox_config_of_another_namespace_is_refused_by_validate_and_by_run_naming_both_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo("examples/ecommerce");
    for file in ["policy.jsonl", "tests.jsonl"] {
        std::fs::copy(example.join(file), dir.path().join(file)).unwrap();
    }
    let with_metadata = |file: &str, name: &str, more: &str| {
        let text = std::fs::read_to_string(example.join(file)).unwrap();
        let text = text.replacen(&format!("  name: {name}\n"), &format!("  name: {name}\n{more}"), 1);
        std::fs::write(dir.path().join(file), text).unwrap();
    };
    with_metadata("task.yaml", "shipping-delay-ab", "  namespace: team-a\n");
    with_metadata("sandbox-a.yaml", "shipping-a", "  namespace: team-b\n");
    // Without a namespace: it goes where it is applied, with the task.
    with_metadata("sandbox-b.yaml", "shipping-b", "");
    // Before: both passed, and variant a ran with team-b's SandboxConfig.
    let expected =
        "spec.variants[0].sandboxRef.name: SandboxConfig \"shipping-a\" is in namespace team-b, the task in team-a";
    let path = dir.path().to_str().unwrap();
    let output = basecamp(&["harness", "validate", path]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains(expected), "{expected:?} in:\n{out}");
    assert!(!out.contains("\"shipping-b\" not found"), "{out}");
    let output = basecamp(&["run", path, "--no-progress", "--out", dir.path().join("out").to_str().unwrap()]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains(expected), "{expected:?} in:\n{out}");
    assert!(!dir.path().join("out").exists(), "nothing ran: {out}");
}

#[test]
fn what_the_api_server_would_refuse_stops_validate_and_run_naming_field_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo("examples/raw-logits");
    for file in ["policy.jsonl", "tests.jsonl"] {
        std::fs::copy(example.join(file), dir.path().join(file)).unwrap();
    }
    std::fs::create_dir(dir.path().join("fixtures")).unwrap();
    std::fs::copy(example.join("fixtures/orders.jsonl"), dir.path().join("fixtures/orders.jsonl")).unwrap();
    let manifest = std::fs::read_to_string(example.join("task.yaml"))
        .unwrap()
        .replace("kind: SandboxConfig", "kind: sandboxconfig")
        .replacen(
            "  name: raw-logits-tools\n",
            "  name: raw-logits-tools\n  namespce: team-a\n  labels: {team: 1}\n",
            1,
        )
        .replace("  maxSteps: 4\n", "  maxSteps: 4\n  planStepTimeout: 9223372036854775807\n");
    let task = dir.path().join("task.yaml");
    std::fs::write(&task, &manifest).unwrap();
    let line_of = |needle: &str| manifest.lines().position(|l| l.contains(needle)).unwrap() + 1;
    let t = task.display();
    // Before: validate passed and the run ran (with timers 292 million years out).
    let expected = [
        format!("{t}:{}: kind: \"sandboxconfig\": kinds are case-sensitive", line_of("kind: sandboxconfig")),
        format!("{t}:{}: metadata.labels.team is the number 1, not a string; quote it", line_of("labels:")),
        format!("{t}:{}: metadata.namespce: unknown field \"namespce\"", line_of("namespce")),
        "SandboxConfig/raw-logits-tools: spec.planStepTimeout: the duration is 9223372036854775807ms, longer than 168h"
            .to_string(),
    ];
    let output = basecamp(&["harness", "validate", task.to_str().unwrap()]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    for expected in &expected {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    assert!(out.contains("4 error(s)"), "{out}");
    let output = basecamp(&[
        "run",
        dir.path().to_str().unwrap(),
        "--no-progress",
        "--out",
        dir.path().join("out").to_str().unwrap(),
    ]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    for expected in &expected {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    assert!(!dir.path().join("out").join("run.json").exists(), "nothing ran: {out}");
}

#[test]
fn a_test_set_line_that_is_not_utf8_is_named_by_validate_and_by_run() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo("examples/ecommerce");
    for file in ["task.yaml", "sandbox-a.yaml", "sandbox-b.yaml", "policy.jsonl"] {
        std::fs::copy(example.join(file), dir.path().join(file)).unwrap();
    }
    // Line 3 saved as Latin-1: "café" with the byte 0xE9.
    let mut lines: Vec<Vec<u8>> =
        std::fs::read(example.join("tests.jsonl")).unwrap().split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
    // At the start of the instruction's text: `"instruction":"` is 14 bytes.
    let at = lines[2].windows(11).position(|w| w == b"instruction").unwrap() + 14;
    lines[2].splice(at..at, *b"caf\xe9 ");
    let tests = dir.path().join("tests.jsonl");
    std::fs::write(&tests, lines.join(&b'\n')).unwrap();
    // Before: "cannot read the test set: stream did not contain valid UTF-8", no line.
    let expected = format!(
        "{}:3: the line is not UTF-8 text (byte 0xE9 at column {}); save the test set as UTF-8",
        tests.display(),
        at + 4
    );
    let path = dir.path().to_str().unwrap();
    let output = basecamp(&["harness", "validate", path]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains(&expected), "{expected:?} in:\n{out}");
    let output = basecamp(&["run", path, "--no-progress", "--out", dir.path().join("out").to_str().unwrap()]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains(&expected), "{expected:?} in:\n{out}");
}

#[test]
fn a_test_set_on_an_unreachable_s3_endpoint_fails_with_the_location() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo("examples/ecommerce");
    for file in ["policy.jsonl", "sandbox-a.yaml"] {
        std::fs::copy(example.join(file), dir.path().join(file)).unwrap();
    }
    let task = std::fs::read_to_string(example.join("task.yaml"))
        .unwrap()
        .replace("testSet: tests.jsonl", "testSet: s3://eval-sets/shipping/tests.jsonl")
        .replace("    - name: b\n      sandboxRef: {name: shipping-b}\n", "");
    std::fs::write(dir.path().join("task.yaml"), task).unwrap();
    // Port 9 (discard) on loopback: nothing listens there.
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["run", dir.path().to_str().unwrap(), "--no-progress"])
        .env("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains("test set s3://eval-sets/shipping/tests.jsonl"), "{out}");
    assert!(out.contains("127.0.0.1:9") || out.to_lowercase().contains("connect"), "says it could not connect: {out}");
    assert!(!dir.path().join("basecamp-runs").join("shipping-delay-ab").join("a").join("shard-0").exists());
}

#[test]
fn paths_without_a_harness_task_or_sandbox_config_fail_validation() {
    let dir = tempfile::tempdir().unwrap();
    // `kind` misspelt, an empty file: before, "ok: 0 error(s), ... in 0 object(s)" and exit 0.
    let misspelt = dir.path().join("task.yaml");
    std::fs::write(&misspelt, "apiVersion: basecamp.dev/v1alpha1\nkindd: HarnessTask\nmetadata: {name: t}\n").unwrap();
    let empty = dir.path().join("empty.yaml");
    std::fs::write(&empty, "").unwrap();
    let comments = dir.path().join("comments.yaml");
    std::fs::write(&comments, "# nothing here yet\n").unwrap();
    let separators = dir.path().join("separators.yaml");
    std::fs::write(&separators, "---\n---\n").unwrap();
    let nothing = ": no HarnessTask or SandboxConfig to validate; give the files that define them";
    for (file, error) in [
        // Kubernetes refuses a Basecamp document without a kind, so validate says so where it is.
        (
            &misspelt,
            ":1: a document of apiVersion basecamp.dev/v1alpha1 without `kind`, so Kubernetes refuses it; write kind: HarnessTask or kind: SandboxConfig",
        ),
        (&empty, nothing),
        (&comments, nothing),
        (&separators, nothing),
    ] {
        let f = file.to_str().unwrap();
        let output = basecamp(&["harness", "validate", f]);
        let out = text(&output);
        assert_eq!(output.status.code(), Some(1), "{out}");
        assert!(out.contains(&format!("error: {f}{error}")), "{out}");
        assert!(!out.contains("ok:"), "{out}");
        // Counted as the error it is (before: "0 error(s), ..." with exit 1).
        assert!(out.contains("1 error(s), 0 warning(s) in 0 object(s) from 1 path(s)"), "{out}");
    }
}

/// `... | head`, `... | grep -q`: the reader goes away before the output is written.
fn with_stdout_closed(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the basecamp binary runs");
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

/// A reader that goes away (`| head`) ends a command quietly, status 0, as
/// it ends `cat` or `grep`: no panic, and no "error: Broken pipe" line.
fn ended_quietly(args: &[&str], output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
}

#[test]
fn a_closed_stdout_ends_the_command_quietly_not_with_a_panic() {
    let example = repo("examples/ecommerce");
    let out = tempfile::tempdir().unwrap();
    let raw = repo("examples/raw-logits");
    let run = basecamp(&["run", raw.to_str().unwrap(), "--no-progress", "--out", out.path().to_str().unwrap()]);
    assert!(run.status.success(), "{}", text(&run));
    let variant = out.path().join("default");
    let v = variant.to_str().unwrap();
    // Before: "thread 'main' panicked ... failed printing to stdout: Broken pipe", exit 101;
    // then "error: Broken pipe (os error 32)", exit 1.
    let trace = walk(&variant).into_iter().find(|p| p.extension().is_some_and(|e| e == "trace")).unwrap();
    let t = trace.to_str().unwrap();
    for args in [
        vec!["harness", "validate", example.to_str().unwrap()],
        vec!["ab", "compare", v, v, "--json"],
        vec!["trace", "parse", t],
        vec!["trace", "parse", v],
    ] {
        ended_quietly(&args, &with_stdout_closed(&args));
    }
}

#[test]
fn convert_refuses_to_write_over_its_own_input() {
    let dir = tempfile::tempdir().unwrap();
    let harness = dir.path().join("harness.json");
    std::fs::write(&harness, HARNESS).unwrap();
    let h = harness.to_str().unwrap();
    // Before: the JSON harness was replaced by the YAML manifest, exit 0.
    let output = basecamp(&["harness", "convert", h, "--sandbox", "shipping-b", "-o", h]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: {h}: -o would replace the JSON harness with its conversion; write the manifest to another file\n"
        )
    );
    assert_eq!(std::fs::read_to_string(&harness).unwrap(), HARNESS);
}

#[test]
fn a_closed_stdout_stops_no_deletion_or_run() {
    let out = tempfile::tempdir().unwrap();
    let raw = repo("examples/raw-logits");
    let run_dir = out.path().join("run");
    // Before: the summary table's print! panicked (exit 101) after the run.
    let args = ["run", raw.to_str().unwrap(), "--no-progress", "--out", run_dir.to_str().unwrap()];
    ended_quietly(&args, &with_stdout_closed(&args));
    assert!(run_dir.join("run.json").is_file(), "the run's files are written before its table");

    // Before: the first "deleted ..." line panicked, and the other local traces stayed.
    let traces = |dir: &Path| walk(dir).into_iter().filter(|p| p.extension().is_some_and(|e| e == "trace")).count();
    assert!(traces(&run_dir) > 1);
    let args = ["trace", "cleanup", run_dir.to_str().unwrap(), "--older-than", "0s", "--delete"];
    ended_quietly(&args, &with_stdout_closed(&args));
    assert_eq!(traces(&run_dir), 0, "every trace was still deleted");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() { found.extend(walk(&path)) } else { found.push(path) }
    }
    found
}

#[test]
fn a_huge_file_is_refused_by_its_size_not_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    // Sparse: 64 MiB of NUL bytes that take no disk. Before, validate and
    // convert read any file whole to see whether it is a JSON harness (a
    // data set named by mistake, however large, went into memory) and then
    // reported "invalid JSON: expected value at line 1 column 1".
    let big = dir.path().join("harness.json");
    std::fs::File::create(&big).unwrap().set_len(64 << 20).unwrap();
    let b = big.to_str().unwrap();
    let output = basecamp(&["harness", "validate", b]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains(&format!("error: {b}: cannot read it: more than 16 MiB")), "{out}");
    let output = basecamp(&["harness", "convert", b]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains(b) && out.contains("more than 16 MiB"), "{out}");
}

#[test]
fn convert_refuses_a_harness_with_an_unknown_field_as_validate_does() {
    let dir = tempfile::tempdir().unwrap();
    let harness = dir.path().join("harness.json");
    std::fs::write(&harness, HARNESS.replace("\"goal\"", "\"colour\": \"red\", \"goal\"")).unwrap();
    let (h, out) = (harness.to_str().unwrap(), dir.path().join("task.yaml"));
    // Before: written with `resumeFrm` and `colour` carried over as they were, exit 0: a manifest
    // `harness validate` (and the API server) refuses, the typo found only later.
    let output = basecamp(&["harness", "convert", h, "--sandbox", "shipping-b", "-o", out.to_str().unwrap()]);
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "error: {h}: training_config.resume_frm: unknown field \"resume_frm\" in HarnessTask; remove it or fix its name. Did you mean \"resume_from\"?"
        )),
        "{said}"
    );
    assert!(said.contains(&format!("error: {h}: task_definition.colour: unknown field \"colour\"")), "{said}");
    assert!(said.contains(&format!("error: {h} cannot be converted")), "{said}");
    assert!(!out.exists(), "nothing written");
    // Fixed, it converts.
    std::fs::write(&harness, HARNESS.replace("resume_frm", "resume_from")).unwrap();
    let output = basecamp(&["harness", "convert", h, "--sandbox", "shipping-b", "-o", out.to_str().unwrap()]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(std::fs::read_to_string(&out).unwrap().contains("resumeFrom: s3://ckpt/last/"));
}

/// The scripted policy is read as a run reads it (before: validate said ok,
/// and `run` or `serve` then refused the file, or played an episode with no
/// script as a policy error).
#[test]
fn validate_reads_the_scripted_policy_as_a_run_does() {
    let dir = tempfile::tempdir().unwrap();
    let project = basecamp_sandbox::testing::example_copy(dir.path());
    let p = project.display().to_string();
    let script = std::fs::read_to_string(project.join("policy.jsonl")).unwrap();
    let mut lines: Vec<&str> = script.lines().collect();
    lines.pop(); // ship-059's script
    let stray = r#"{"episode": "ship-999", "turns": [{"content": "x"}]}"#;
    std::fs::write(project.join("policy.jsonl"), format!("{}\n{stray}\n", lines.join("\n"))).unwrap();
    let output = basecamp(&["harness", "validate", &p]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "warnings only: {out}");
    assert!(
        out.contains(&format!(
            "warning: HarnessTask/shipping-delay-ab: spec.policy.scripted: 1 of the 60 rows of tests.jsonl have no \
             script in {p}/policy.jsonl (\"ship-059\"); each of their episodes ends with a policy error"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("{p}/policy.jsonl:60: scripts episode \"ship-999\", which is no row of tests.jsonl")),
        "{out}"
    );

    // An episode's line with `id` for `episode`: refused by validate as by run, in words that say so.
    std::fs::write(project.join("policy.jsonl"), "{\"id\": \"ship-000\", \"turns\": [{\"content\": \"x\"}]}\n")
        .unwrap();
    let said = format!(
        "{p}/policy.jsonl:1: a line with \"turns\" scripts one episode and needs \"episode\": the id of the test-set row it answers"
    );
    let output = basecamp(&["harness", "validate", &p]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        text(&output).contains(&format!("error: HarnessTask/shipping-delay-ab: spec.policy.scripted: {said}")),
        "{}",
        text(&output)
    );
    let out_dir = dir.path().join("out").display().to_string();
    let output = basecamp(&["run", &p, "--no-progress", "--out", &out_dir]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(text(&output).contains(&said), "{}", text(&output));
}

/// A script written for another test set: one warning naming the first
/// strays, not one line each (before: 20,000 stray scripts printed 20,000
/// warnings, and the check scanned every script for every row).
#[test]
fn scripts_for_no_row_beyond_five_are_one_warning() {
    let dir = tempfile::tempdir().unwrap();
    let project = basecamp_sandbox::testing::example_copy(dir.path());
    let p = project.display().to_string();
    let script = std::fs::read_to_string(project.join("policy.jsonl")).unwrap();
    let strays: Vec<String> =
        (0..30).map(|i| format!(r#"{{"episode": "other-{i:02}", "turns": [{{"content": "x"}}]}}"#)).collect();
    std::fs::write(project.join("policy.jsonl"), format!("{script}{}\n", strays.join("\n"))).unwrap();
    let output = basecamp(&["harness", "validate", &p]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "warnings only: {out}");
    let first = (0..5).map(|i| format!("\"other-{i:02}\" (line {})", 61 + i)).collect::<Vec<_>>().join(", ");
    assert!(
        out.contains(&format!(
            "warning: HarnessTask/shipping-delay-ab: spec.policy.scripted: 30 of the 90 episodes scripted in \
             {p}/policy.jsonl are no row of tests.jsonl and are never played: {first}, …"
        )),
        "{out}"
    );
    assert!(!out.contains("scripts episode"), "no warning a stray line: {out}");
    assert!(out.contains("0 error(s), 2 warning(s)"), "the null fallback's and this one: {out}");
}

/// Every bad line of the scripted policy at once, as the test set's are
/// (before: only the first).
#[test]
fn validate_lists_every_bad_line_of_the_scripted_policy() {
    let dir = tempfile::tempdir().unwrap();
    let project = basecamp_sandbox::testing::example_copy(dir.path());
    let p = project.display().to_string();
    let bad = "{\"tool_calls\":[]}\n{\"id\": \"ship-000\", \"turns\":[]}\n{not json\n";
    std::fs::write(project.join("policy.jsonl"), bad).unwrap();
    let output = basecamp(&["harness", "validate", &p]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    for line in 1..=3 {
        assert!(
            out.contains(&format!(
                "error: HarnessTask/shipping-delay-ab: spec.policy.scripted: {p}/policy.jsonl:{line}: "
            )),
            "line {line}: {out}"
        );
    }
    assert!(out.contains("3 error(s)"), "{out}");
}

/// `convert` refuses what the task's own rules refuse (a criterion that
/// does not parse, a batch size of 0), as `validate` reports it, and writes
/// nothing. Before: exit 0 and a manifest `validate` then refused.
#[test]
fn convert_refuses_a_task_its_own_rules_refuse_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let harness = dir.path().join("sem.json");
    std::fs::write(
        &harness,
        r#"{"task_definition": {"name": "t1", "goal": "g", "success_criteria": ["tool_call_accuracy >>= 0.9"]},
 "data_pipeline": {"source": "s3://ds-logs/x/", "batch_size": 0},
 "evaluation": {"metrics": ["tool_call_accuracy"], "test_set": "s3://ds-eval/t.jsonl"},
 "policy": {"endpoint": "http://127.0.0.1:8000/v1", "model": "m"}, "sandbox": "shipping-b"}"#,
    )
    .unwrap();
    let out_file = dir.path().join("sem.yaml");
    let out = basecamp(&["harness", "convert", harness.to_str().unwrap(), "-o", out_file.to_str().unwrap()]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(!out_file.exists(), "nothing is written");
    assert!(
        said.contains(
            "task_definition.success_criteria[0]: success criterion \"tool_call_accuracy >>= 0.9\" does not parse"
        ),
        "{said}"
    );
    assert!(said.contains("data_pipeline.batch_size: the batch size is 0; use a positive batch size"), "{said}");
    // Each names the file, as validate does (before: `error: HarnessTask/t1: ...`).
    let h = harness.to_str().unwrap();
    assert!(
        said.contains(&format!(
            "error: {h} (HarnessTask/t1): data_pipeline.batch_size: the batch size is 0; use a positive batch size"
        )),
        "{said}"
    );
    // The SandboxConfig it names is not beside it: that is for `validate`, not a reason to refuse.
    assert!(!said.contains("not found"), "{said}");
}

/// Problems of the JSON form name its keys as the user wrote them: a key
/// that is not snake_case keeps its spelling in the path, and a missing
/// field is named in snake_case. Before: `data_pipeline._b_a_t_c_h__s_i_z_e`
/// and "missing field `testSet`".
#[test]
fn json_harness_problems_name_keys_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let harness = dir.path().join("keys.json");
    std::fs::write(
        &harness,
        r#"{"task_definition": {"name": "t1", "goal": "g", "success_criteria": ["tool_call_accuracy >= 0.9"]},
 "data_pipeline": {"source": "s3://ds-logs/x/", "batch_size": 4, "BATCH_SIZE": 4},
 "evaluation": {"metrics": ["tool_call_accuracy"]},
 "policy": {"endpoint": "http://127.0.0.1:8000/v1", "model": "m"}}"#,
    )
    .unwrap();
    let out = basecamp(&["harness", "convert", harness.to_str().unwrap()]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("data_pipeline.BATCH_SIZE: unknown field \"BATCH_SIZE\""), "{said}");
    assert!(said.contains("missing field `test_set`"), "{said}");
    assert!(!said.contains("_b_a_t") && !said.contains("testSet"), "{said}");
}

/// The article's harness names its preprocessor by a dotted Python path;
/// convert writes it as `python:…` (and says so), so the manifest validates
/// and `data preprocess` imports it. One that is no form at all is refused
/// as validate refuses it. Before: written as it was, and refused only by
/// `data preprocess` in the trainer pod.
#[test]
fn convert_writes_a_dotted_preprocessor_as_python_and_refuses_one_a_run_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = dir.path().join("sandbox-b.yaml");
    std::fs::copy(repo("examples/ecommerce/sandbox-b.yaml"), &sandbox).unwrap();
    let article = |preprocessor: &str| {
        format!(
            r#"{{"task_definition": {{"name": "e_commerce_support_v4", "goal": "g", "success_criteria": ["tool_call_accuracy >= 0.9"]}},
 "data_pipeline": {{"source": "s3://ds-logs/ecommerce-v3/", "preprocessor": "{preprocessor}", "batch_size": 64}},
 "evaluation": {{"metrics": ["tool_call_accuracy"], "test_set": "s3://ds-eval/t.jsonl"}},
 "policy": {{"endpoint": "http://127.0.0.1:8000/v1", "model": "m"}}}}"#
        )
    };
    let harness = dir.path().join("article.json");
    std::fs::write(&harness, article("deepseek.harness.preprocess.shipping_delay_filter")).unwrap();
    let (h, out_file) = (harness.to_str().unwrap(), dir.path().join("task.yaml"));
    let o = out_file.to_str().unwrap();
    let output = basecamp(&["harness", "convert", h, "--sandbox", "shipping-b", "-o", o]);
    let said = text(&output);
    assert!(output.status.success(), "{said}");
    let yaml = std::fs::read_to_string(&out_file).unwrap();
    assert!(yaml.contains("preprocessor: python:deepseek.harness.preprocess.shipping_delay_filter"), "{yaml}");
    assert!(
        said.contains(&format!(
            "note: {h}: data_pipeline.preprocessor \"deepseek.harness.preprocess.shipping_delay_filter\" is the Python function python:deepseek.harness.preprocess.shipping_delay_filter in the manifest"
        )),
        "{said}"
    );
    let output = basecamp(&["harness", "validate", o, sandbox.to_str().unwrap()]);
    assert!(output.status.success(), "the converted manifest is valid: {}", text(&output));

    std::fs::remove_file(&out_file).unwrap();
    std::fs::write(&harness, article("shipping_delay_filter")).unwrap();
    let output = basecamp(&["harness", "convert", h, "--sandbox", "shipping-b", "-o", o]);
    let said = text(&output);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(!out_file.exists(), "nothing is written");
    assert!(
        said.contains(&format!(
            "error: {h} (HarnessTask/e-commerce-support-v4): data_pipeline.preprocessor: preprocessor \"shipping_delay_filter\" \
             is not one of builtin:trajectory, exec:PROGRAM ARGS..., python:module.function"
        )),
        "{said}"
    );
    let output = basecamp(&["harness", "validate", h, sandbox.to_str().unwrap(), "--sandbox", "shipping-b"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(text(&output).contains("data_pipeline.preprocessor: preprocessor \"shipping_delay_filter\""));
}

/// The example manifest's preprocessor was `shipping_delay_filter`, which
/// `data preprocess` refuses; validation now refuses it too.
#[test]
fn a_manifest_preprocessor_a_run_would_refuse_fails_validation_at_its_field() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(repo("examples/manifests/shipping-support.yaml")).unwrap();
    assert!(example.contains("preprocessor: builtin:trajectory"), "the example's preprocessor");
    let manifest = dir.path().join("m.yaml");
    std::fs::write(&manifest, example.replace("builtin:trajectory", "shipping_delay_filter")).unwrap();
    let output = basecamp(&["harness", "validate", manifest.to_str().unwrap()]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(
        out.contains(
            "error: HarnessTask/shipping-support: spec.dataPipeline.preprocessor: preprocessor \"shipping_delay_filter\" \
             is not one of builtin:trajectory, exec:PROGRAM ARGS..., python:module.function"
        ),
        "{out}"
    );
}

/// A service's or an exec tool's program that is not there is named by
/// `validate` (a warning) and refused by `run`, at its field, saying what to do.
#[test]
fn a_program_that_cannot_start_is_warned_of_by_validate_and_refused_by_run_at_its_field() {
    let dir = tempfile::tempdir().unwrap();
    let project = basecamp_sandbox::testing::example_copy(dir.path());
    let sandbox = project.join("sandbox-a.yaml");
    let original = std::fs::read_to_string(&sandbox).unwrap();
    let edited = original.replace("command: [python3, services/tracking.py]", "command: [nosuchbinary-xyz]");
    assert_ne!(edited, original, "the example's service");
    std::fs::write(&sandbox, edited).unwrap();
    let field = "spec.services.tracking.command[0]: \"nosuchbinary-xyz\" is not an executable on PATH";
    let path = project.to_str().unwrap();

    // Before: "ok" and nothing said. A warning, not an error: a manifest for
    // the cluster names programs of the sandbox image, which this machine need not have.
    let output = basecamp(&["harness", "validate", path]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(out.contains(&format!("warning: SandboxConfig/shipping-a: {field}")), "{out}");
    assert!(out.contains("install it, or give its path"), "{out}");
    assert!(out.contains("the image the sandbox pods run must have it"), "{out}");

    // Before: `service tracking: cannot start "nosuchbinary-xyz": No such file or directory`, no field.
    let runs = tempfile::tempdir().unwrap();
    let out_dir = runs.path().join("out");
    let output = basecamp(&["run", path, "--no-progress", "--out", out_dir.to_str().unwrap()]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains(&format!("variant a: {field}")), "{out}");
    assert!(!out_dir.exists(), "nothing ran, nothing is left: {out}");

    // An exec tool's missing program: validate says it as the run does.
    let tool = original.replace("command: [python3, tools/issue_credit.py]", "command: [tools/no-such-tool]");
    std::fs::write(&sandbox, tool).unwrap();
    let output = basecamp(&["harness", "validate", path]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    let missing = project.join("tools/no-such-tool");
    assert!(
        out.contains(&format!(
            "SandboxConfig/shipping-a: spec.tools.issue_credit.exec.command[0]: \"tools/no-such-tool\" ({}) does not exist",
            missing.display()
        )),
        "{out}"
    );
}
