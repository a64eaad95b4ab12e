//! Driver mode end to end: manifests on disk -> `basecamp-sandbox run` ->
//! traces, summary.json and the upload to the task's destination.

use std::path::Path;
use std::process::Command;

use basecamp_trace::{Tail, read_trace};
use serde_json::Value;

const MANIFEST: &str = r#"
apiVersion: basecamp.dev/v1alpha1
kind: SandboxConfig
metadata:
  name: tools
spec:
  tools:
    track_order:
      description: Look up an order.
      parameters: {type: object, properties: {order_id: {type: string}}}
      recorded:
        fixture: fixture.jsonl
      memoryPatch:
        shipping_status: /status
  toolTimeouts:
    default: 300ms
  fallbacks:
    track_order:
      observation: {status: unknown}
      memoryPatch: {shipping_status: pending}
  maxSteps: 4
  planStepTimeout: 5s
  rewards:
    components:
      correctness: {weight: 1.0, source: tool_call_accuracy}
    weightSchedule:
      - atTrainingStep: 20
        weights: {correctness: 2.0}
---
apiVersion: basecamp.dev/v1alpha1
kind: HarnessTask
metadata:
  name: shipping
spec:
  taskDefinition:
    description: You are a support agent.
    successCriteria: ["tool_call_accuracy >= 0.5"]
  evaluation:
    metrics: [tool_call_accuracy]
    testSet: tests.jsonl
  policy:
    scripted: policy.jsonl
  sandboxRef: {name: tools}
  shards: 2
  traces:
    destination: DEST
"#;

const FIXTURE: &str = r#"{"tool": "track_order", "arguments": {"order_id": "1"}, "observation": {"status": "in_transit"}}
{"tool": "track_order", "arguments": {"order_id": "2"}, "observation": {"status": "late"}, "timeout": true}
"#;

const TESTS: &str = r#"{"id": "ep-1", "instruction": "Where is order 1?", "expected_tool_calls": [{"name": "track_order", "arguments": {"order_id": "1"}}], "expected_memory": {"shipping_status": "in_transit"}}
{"id": "ep-2", "instruction": "Where is order 2?", "expected_tool_calls": [{"name": "track_order", "arguments": {"order_id": "2"}}], "expected_memory": {"shipping_status": "late"}}
{"id": "ep-3", "instruction": "Hi", "expected_tool_calls": []}
"#;

const POLICY: &str = r#"{"episode": "ep-1", "turns": [{"tool_calls": [{"name": "track_order", "arguments": {"order_id": "1"}}]}, {"content": "In transit."}]}
{"episode": "ep-2", "turns": [{"tool_calls": [{"name": "track_order", "arguments": {"order_id": "2"}}]}, {"content": "Pending."}]}
{"episode": "ep-3", "turns": [{"content": "Hello!"}]}
"#;

fn write_project(dir: &Path, dest: &Path) {
    std::fs::write(dir.join("task.yaml"), MANIFEST.replace("DEST", &dest.display().to_string())).unwrap();
    std::fs::write(dir.join("fixture.jsonl"), FIXTURE).unwrap();
    std::fs::write(dir.join("tests.jsonl"), TESTS).unwrap();
    std::fs::write(dir.join("policy.jsonl"), POLICY).unwrap();
}

fn sandbox(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox")).args(args).output().unwrap()
}

#[test]
fn a_shard_runs_writes_traces_and_summary_and_uploads_them() {
    let project = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), dest.path());
    let manifest = project.path().join("task.yaml");
    let out_dir = out.path().join("shard-0");
    let run =
        sandbox(&["run", "--config", manifest.to_str().unwrap(), "--shard", "0/2", "--out", out_dir.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("shipping/default shard 0/2: 2 episodes"), "{stdout}");

    // Shard 0 of 2 holds the first two rows (contiguous shards).
    let summary: Value = serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    let episodes = summary["episodes"].as_array().unwrap();
    assert_eq!(episodes.len(), 2);
    assert_eq!(episodes[0]["id"], "ep-1");
    assert_eq!(episodes[0]["failure_class"], "ok");
    assert_eq!(episodes[0]["metrics"]["memory_consistency"], 1.0);
    assert_eq!(episodes[1]["id"], "ep-2");
    assert_eq!(episodes[1]["failure_class"], "timeout", "the recorded timeout takes the fallback");
    assert_eq!(episodes[1]["metrics"]["memory_consistency"], 0.0, "the fallback wrote pending, not late");
    assert_eq!(summary["aggregate"]["episodes"], 2);
    assert_eq!(summary["aggregate"]["means"]["tool_call_accuracy"], 1.0);

    let trace = read_trace(out_dir.join("ep-1.trace")).unwrap();
    assert!(matches!(trace.tail, Tail::Complete));
    assert_eq!(trace.header.task, "shipping");
    assert_eq!(trace.header.shard_count, 2);

    // Uploaded under <dest>/<yyyy>/<mm>/<dd>/<namespace>/<task>/<variant>/<shard>/.
    let uploaded: Vec<_> = walk(dest.path());
    assert!(uploaded.iter().any(|p| p.ends_with("default/shipping/default/0/summary.json")), "{uploaded:?}");
    assert!(uploaded.iter().any(|p| p.ends_with("default/shipping/default/0/ep-2.trace")), "{uploaded:?}");
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path.display().to_string());
        }
    }
    out
}

#[test]
fn bad_manifests_are_refused_with_every_problem() {
    let project = tempfile::tempdir().unwrap();
    write_project(project.path(), Path::new("/tmp/unused"));
    let text = std::fs::read_to_string(project.path().join("task.yaml")).unwrap();
    let broken =
        text.replace("shards: 2", "shards: 0").replace("sandboxRef: {name: tools}", "sandboxRef: {name: nope}");
    std::fs::write(project.path().join("task.yaml"), broken).unwrap();
    let run = sandbox(&["run", "--config", project.path().join("task.yaml").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("spec.shards"), "{stderr}");
    assert!(stderr.contains("nope"), "{stderr}");
}

#[test]
fn a_bad_shard_argument_is_explained() {
    let run = sandbox(&["run", "--config", "x.yaml", "--shard", "2/2"]);
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("the index must be below the count"));
}

#[test]
fn a_checkpoint_evaluation_runs_as_task_at_step_n_with_that_steps_weights() {
    let project = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    write_project(project.path(), dest.path());
    let manifest = project.path().join("task.yaml");
    let out_dir = out.path().join("shard-0");
    let run = sandbox(&[
        "run",
        "--config",
        manifest.to_str().unwrap(),
        "--shard",
        "0/2",
        "--checkpoint-step",
        "30",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("shipping@step-30/default shard 0/2: 2 episodes"), "{stdout}");

    // summary.json names the run, as the operator aggregates it.
    let summary: Value = serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["task"], "shipping@step-30");
    // Step 30 is past the schedule's step 20: correctness weighs 2.0 (1.0 before).
    assert_eq!(summary["episodes"][0]["metrics"]["tool_call_accuracy"], 1.0);
    assert_eq!(summary["episodes"][0]["metrics"]["reward"], 2.0, "{}", summary["episodes"][0]);

    let trace = read_trace(out_dir.join("ep-1.trace")).unwrap();
    assert_eq!(trace.header.training_step, 30);
    assert_eq!(trace.header.task, "shipping@step-30");

    // Uploaded under <dest>/<yyyy>/<mm>/<dd>/<namespace>/<task>@step-30/<variant>/<shard>/.
    let uploaded: Vec<_> = walk(dest.path());
    assert!(uploaded.iter().any(|p| p.ends_with("/default/shipping@step-30/default/0/summary.json")), "{uploaded:?}");
    assert!(uploaded.iter().any(|p| p.ends_with("/default/shipping@step-30/default/0/ep-1.trace")), "{uploaded:?}");
    assert!(!uploaded.iter().any(|p| p.contains("/shipping/")), "nothing under the task's own name: {uploaded:?}");

    // Without the flag the same shard is the task's own, at step 0's weights.
    let plain = out.path().join("plain");
    let run = sandbox(&[
        "run",
        "--config",
        manifest.to_str().unwrap(),
        "--shard",
        "0/2",
        "--no-upload",
        "--out",
        plain.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let summary: Value = serde_json::from_slice(&std::fs::read(plain.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["task"], "shipping");
    assert_eq!(summary["episodes"][0]["metrics"]["reward"], 1.0);
    assert_eq!(read_trace(plain.join("ep-1.trace")).unwrap().header.training_step, 0);
}
