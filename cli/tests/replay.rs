//! `basecamp trace replay`: an episode re-executed from its trace is
//! identical; the same trace under another sandbox configuration diverges
//! where the configurations differ, and says how.

#[path = "support/s3.rs"]
mod s3;

use std::path::{Path, PathBuf};
use std::process::Command;

use basecamp_trace::pb::StepStatus;
use serde_json::Value;

fn basecamp(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().expect("basecamp runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

#[test]
fn a_recorded_episode_replays_identically_and_diverges_under_the_other_variant() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce");
    let example = example.to_str().unwrap();
    let out = tempfile::tempdir().unwrap();
    let (ok, text) = basecamp(&[
        "run",
        example,
        "--variant",
        "a",
        "--shards",
        "1",
        "--concurrency",
        "16",
        "--no-progress",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    let run: Value = serde_json::from_slice(&std::fs::read(out.path().join("run.json")).unwrap()).unwrap();
    let episodes = run["variants"][0]["episodes"].as_array().unwrap();
    let failed = episodes.iter().find(|e| e["failure_class"] != "ok").expect("variant a has failures");
    let passed = episodes.iter().find(|e| e["failure_class"] == "ok").expect("and successes");

    for episode in [failed, passed] {
        let trace = out.path().join(episode["trace"].as_str().unwrap());
        let (ok, text) = basecamp(&["trace", "replay", trace.to_str().unwrap(), "--config", example]);
        assert!(ok && text.starts_with("identical:"), "{text}");
    }

    // Without --config: the manifests of the run whose directory holds the trace.
    let trace = out.path().join(passed["trace"].as_str().unwrap());
    let replayed = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "replay", trace.to_str().unwrap()])
        .output()
        .expect("basecamp runs");
    let (said, noted) = (String::from_utf8_lossy(&replayed.stdout), String::from_utf8_lossy(&replayed.stderr));
    assert!(replayed.status.success() && said.starts_with("identical:"), "{said}{noted}");
    assert!(noted.contains("examples/ecommerce (from ") && noted.contains("run.json)"), "{noted}");
    // Server mode calls a row's episodes `<row>-<n>` and names the row in the header (before:
    // replay looked the episode id up in the test set, and no server-mode trace replayed).
    let served = out.path().join("served.trace");
    rewrite_header(&trace, &served, |h| {
        h.row_id = h.episode_id.clone();
        h.episode_id = format!("{}-1", h.episode_id);
    });
    let (ok, text) = basecamp(&["trace", "replay", served.to_str().unwrap(), "--config", example]);
    assert!(ok && text.starts_with("identical:"), "{text}");
    // An episode given inline has no row: said so.
    let inline = out.path().join("inline.trace");
    rewrite_header(&trace, &inline, |h| {
        h.row_id.clear();
        h.episode_id = "episode-1".into();
    });
    let (ok, text) = basecamp(&["trace", "replay", inline.to_str().unwrap(), "--config", example]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(
            "episode episode-1: no row \"episode-1\" in the test set tests.jsonl (an episode created in \
                       server mode with its fields inline has no row to replay)"
        ),
        "{text}"
    );
    // Outside a run directory, or under another task's run, it says to pass --config.
    let elsewhere = tempfile::tempdir().unwrap();
    let lone = elsewhere.path().join("lone.trace");
    std::fs::copy(&trace, &lone).unwrap();
    let (ok, text) = basecamp(&["trace", "replay", lone.to_str().unwrap()]);
    assert!(!ok && text.contains("no --config, and no run.json") && text.contains("pass --config"), "{text}");
    std::fs::write(elsewhere.path().join("run.json"), r#"{"task": "another", "manifests": ["x.yaml"]}"#).unwrap();
    let (ok, text) = basecamp(&["trace", "replay", lone.to_str().unwrap()]);
    assert!(!ok && text.contains("a run of task \"another\""), "{text}");

    // The same episode where the operator keeps it: one object on S3 (s3s-fs on 127.0.0.1).
    let data = out.path().join("s3");
    let key = "traces/shard-0/failed.trace";
    std::fs::create_dir_all(data.join(s3::BUCKET).join("traces/shard-0")).unwrap();
    std::fs::copy(out.path().join(failed["trace"].as_str().unwrap()), data.join(s3::BUCKET).join(key)).unwrap();
    let server = s3::S3Server::start(&data);
    let url = format!("s3://{}/{key}", s3::BUCKET);
    let replayed = server.basecamp(&["trace", "replay", &url, "--config", example], out.path());
    let said = String::from_utf8_lossy(&replayed.stdout);
    assert!(
        replayed.status.success() && said.starts_with("identical:"),
        "{said}{}",
        String::from_utf8_lossy(&replayed.stderr)
    );

    // The failed episode hit track_order's fallback; variant b's fallback writes "pending", not null.
    let trace = out.path().join(failed["trace"].as_str().unwrap());
    let (ok, text) = basecamp(&["trace", "replay", trace.to_str().unwrap(), "--config", example, "--variant", "b"]);
    assert!(!ok, "{text}");
    assert!(text.starts_with("diverged:"), "{text}");
    assert!(
        text.contains("(record")
            && text
                .contains("memory_state): after recorded shipping_status=null vs replayed shipping_status=\"pending\""),
        "{text}"
    );

    // A truncated trace is refused with the reason.
    let bytes = std::fs::read(&trace).unwrap();
    let cut = out.path().join("cut.trace");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let (ok, text) = basecamp(&["trace", "replay", cut.to_str().unwrap(), "--config", example]);
    assert!(!ok && text.contains("incomplete"), "{text}");
}

/// `from` written again to `to` with its header changed by `change`.
fn rewrite_header(from: &Path, to: &Path, change: impl FnOnce(&mut basecamp_trace::pb::Header)) {
    use basecamp_trace::pb::record::Body;
    let contents = basecamp_trace::read_trace(from).unwrap();
    let mut header = contents.header.clone();
    change(&mut header);
    let mut writer = basecamp_trace::TraceWriter::create(to, header).unwrap();
    let mut end = None;
    let mut step = None;
    for record in contents.records {
        match record.body {
            Some(Body::EpisodeEnd(e)) => end = Some(e),
            Some(Body::Header(_)) | None => {}
            Some(body) => {
                if step.is_some_and(|s| s != record.step) {
                    writer.end_step().unwrap();
                }
                step = Some(record.step);
                writer.append(record.step, body).unwrap();
            }
        }
    }
    writer.end_step().unwrap();
    writer.finish(end.expect("a complete trace")).unwrap();
}

/// The `token_logit` records of a trace.
fn token_logits(path: &Path) -> Vec<basecamp_trace::pb::TokenLogit> {
    let trace = basecamp_trace::read_trace(path).unwrap();
    trace
        .records
        .into_iter()
        .filter_map(|r| match r.body {
            Some(basecamp_trace::pb::record::Body::TokenLogit(t)) => Some(t),
            _ => None,
        })
        .collect()
}

#[test]
fn a_raw_logits_episode_replays_with_its_entropy_and_kl_so_a_divergence_reward_is_identical() {
    // The raw-logits example with a reward that weighs logit_divergence: the
    // raw logits are not in the trace, so a replay must carry the recorded
    // entropy and KL of every token, or the reward (and the metric) differ.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/raw-logits");
    let dir = tempfile::tempdir().unwrap();
    for name in ["policy.jsonl", "tests.jsonl"] {
        std::fs::copy(example.join(name), dir.path().join(name)).unwrap();
    }
    std::fs::create_dir(dir.path().join("fixtures")).unwrap();
    for entry in std::fs::read_dir(example.join("fixtures")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join("fixtures").join(entry.file_name())).unwrap();
    }
    let manifest = std::fs::read_to_string(example.join("task.yaml")).unwrap();
    let rewards = "  maxSteps: 4\n  rewards:\n    components:\n      correctness: {weight: 1.0, source: tool_call_accuracy}\n      fidelity: {weight: -10.0, source: logit_divergence}\n";
    assert!(manifest.contains("  maxSteps: 4\n"), "the example's SandboxConfig changed: {manifest}");
    std::fs::write(dir.path().join("task.yaml"), manifest.replacen("  maxSteps: 4\n", rewards, 1)).unwrap();
    let config = dir.path().to_str().unwrap();

    let out = dir.path().join("out");
    let (ok, text) = basecamp(&["run", config, "--no-progress", "--out", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    let run: Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    let episodes = run["variants"][0]["episodes"].as_array().unwrap();
    assert_eq!(episodes.len(), 5);
    for episode in episodes {
        let trace = out.join(episode["trace"].as_str().unwrap());
        let recorded = token_logits(&trace);
        assert!(!recorded.is_empty() && recorded.iter().all(|t| t.kl.is_some_and(|kl| kl > 0.0)), "{recorded:?}");

        let kept = dir.path().join(format!("replayed-{}", episode["id"].as_str().unwrap()));
        let (ok, text) = basecamp(&[
            "trace",
            "replay",
            trace.to_str().unwrap(),
            "--config",
            config,
            "--out",
            kept.to_str().unwrap(),
        ]);
        assert!(ok && text.starts_with("identical:"), "{text}");
        let replayed: Vec<_> = std::fs::read_dir(kept.join("replayed"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "trace"))
            .collect();
        assert_eq!(replayed.len(), 1, "{replayed:?}");
        // Bit for bit: the same tokens, alternatives, entropy and KL.
        assert_eq!(token_logits(&replayed[0]), recorded, "{}", trace.display());
    }
}

#[test]
fn an_episode_id_with_dot_dot_does_not_steer_the_scratch_directory() {
    // The scratch directory was `$TMPDIR/basecamp-replay-<pid>-<episode id>`,
    // removed afterwards: a trace whose header says `x/../victim` had replay
    // create, fill and then delete `$TMPDIR/victim` with everything in it.
    use basecamp_trace::pb::{EpisodeEnd, Header, PolicyTurn, record::Body};
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce");
    let tmp = tempfile::tempdir().unwrap();
    let victim = tmp.path().join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("keep.txt"), "mine").unwrap();
    let header = Header {
        episode_id: "x/../victim".into(),
        task: "shipping-delay-ab".into(),
        variant: "a".into(),
        ..Default::default()
    };
    let mut writer = basecamp_trace::TraceWriter::new(Vec::new(), header, 3).unwrap();
    writer.append(1, Body::PolicyTurn(PolicyTurn { content: "done".into(), ..Default::default() })).unwrap();
    writer.end_step().unwrap();
    let bytes = writer.finish(EpisodeEnd { steps: 1, ..Default::default() }).unwrap();
    let trace = tmp.path().join("odd.trace");
    std::fs::write(&trace, bytes).unwrap();

    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "replay", trace.to_str().unwrap(), "--config", example.to_str().unwrap()])
        .env("TMPDIR", tmp.path())
        .output()
        .expect("basecamp runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("episode x/../victim: no row \"x/../victim\" in the test set"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(victim.join("keep.txt")).ok().as_deref(), Some("mine"), "{stderr}");
    // Nothing is left behind in TMPDIR either.
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

/// A sandbox with one recorded tool whose `count` must be an integer in
/// memory and which may not write null, and a policy that sends arguments
/// that are not JSON, calls a tool that does not exist, and gets answers
/// whose memory writes are refused (one through the config's `memoryPatch`,
/// one the tool's own).
const REFUSALS_TASK: &str = r#"apiVersion: basecamp.dev/v1alpha1
kind: SandboxConfig
metadata:
  name: refusals-tools
spec:
  tools:
    lookup:
      description: Look an order up.
      parameters:
        type: object
        properties:
          id: {type: string}
      recorded:
        fixture: fixture.jsonl
      memoryPatch:
        count: /count
  memory:
    strictTypes: true
    schema: {count: integer}
    nullWrites: error
  maxSteps: 6
---
apiVersion: basecamp.dev/v1alpha1
kind: HarnessTask
metadata:
  name: refusals
spec:
  taskDefinition:
    name: refusals
    description: calls the sandbox refuses
  evaluation:
    metrics: [tool_call_accuracy]
    testSet: tests.jsonl
  policy:
    scripted: policy.jsonl
  sandboxRef:
    name: refusals-tools
"#;

/// Writes REFUSALS_TASK, its fixture, test set and policy into `dir`.
/// [`write_refusals`] into `dir`, run with `basecamp run` into `dir/out`; that directory.
fn run_refusals(dir: &Path) -> PathBuf {
    write_refusals(dir);
    let out = dir.join("out");
    let (ok, text) = basecamp(&["run", dir.to_str().unwrap(), "--no-progress", "--out", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    out
}

fn write_refusals(dir: &Path) {
    let files = [
        ("task.yaml", REFUSALS_TASK),
        (
            "fixture.jsonl",
            concat!(
                r#"{"tool": "lookup", "arguments": {"id": "1"}, "observation": {"status": "shipped", "count": 3}}"#,
                "\n",
                r#"{"tool": "lookup", "arguments": {"id": "2"}, "observation": {"status": "lost", "count": "three"}}"#,
                "\n",
                r#"{"tool": "lookup", "arguments": {"id": "3"}, "observation": {"status": "late", "count": 1}, "#,
                r#""memoryPatch": {"eta": "friday", "courier": null, "count": 2}}"#,
                "\n"
            ),
        ),
        (
            "tests.jsonl",
            concat!(
                r#"{"id": "bad-args", "instruction": "a", "expected_tool_calls": [{"name": "lookup", "arguments": {"id": "1"}}]}"#,
                "\n",
                r#"{"id": "bad-memory", "instruction": "b", "expected_tool_calls": [{"name": "lookup", "arguments": {"id": "2"}}]}"#,
                "\n",
                r#"{"id": "bad-own-memory", "instruction": "c", "expected_tool_calls": [{"name": "lookup", "arguments": {"id": "3"}}]}"#,
                "\n"
            ),
        ),
        (
            "policy.jsonl",
            concat!(
                r#"{"episode": "bad-args", "turns": [{"tool_calls": [{"name": "lookup", "arguments": "{\"id\": 1"}]}, "#,
                r#"{"tool_calls": [{"name": "nope", "arguments": {}}]}, {"tool_calls": [{"name": "lookup", "arguments": [1]}]}, "#,
                r#"{"tool_calls": [{"name": "lookup", "arguments": {"id": "1"}}]}, {"content": "done"}]}"#,
                "\n",
                r#"{"episode": "bad-memory", "turns": [{"tool_calls": [{"name": "lookup", "arguments": {"id": "2"}}]}, {"content": "done"}]}"#,
                "\n",
                r#"{"episode": "bad-own-memory", "turns": [{"tool_calls": [{"name": "lookup", "arguments": {"id": "3"}}]}, {"content": "done"}]}"#,
                "\n"
            ),
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

#[test]
fn calls_the_sandbox_refused_replay_identically() {
    // Refused before the tool was asked (arguments not JSON, or not an
    // object; an unknown tool): replay stopped at "the trace's tool
    // arguments is not JSON", and such a call must not take the tool's next
    // recorded answer either. Refused after the tool answered (its memory
    // write broke memory.schema): the answer was replayed as a tool failure,
    // so the fallback-free call came back `error` ("status recorded 6 vs
    // replayed 2").
    let dir = tempfile::tempdir().unwrap();
    let out = run_refusals(dir.path());
    let config = dir.path().to_str().unwrap();
    for (episode, statuses) in [
        ("bad-args", vec![StepStatus::Refused, StepStatus::Refused, StepStatus::Refused, StepStatus::Ok]),
        ("bad-memory", vec![StepStatus::Refused]),
        // The tool's own null write is refused, its other writes go in.
        // Before: the refused write was in no record, so the replayed answer
        // did not make it ("status recorded refused vs replayed ok").
        ("bad-own-memory", vec![StepStatus::Refused]),
    ] {
        let trace = out.join("default/shard-0").join(format!("{episode}.trace"));
        let recorded: Vec<StepStatus> = basecamp_trace::read_trace(&trace)
            .unwrap()
            .records
            .into_iter()
            .filter_map(|r| match r.body {
                Some(basecamp_trace::pb::record::Body::PlanStep(s)) if !s.tool.is_empty() => Some(s.status()),
                _ => None,
            })
            .collect();
        assert_eq!(recorded, statuses, "{episode}: the run did not refuse what this test is about");
        let (ok, text) = basecamp(&["trace", "replay", trace.to_str().unwrap(), "--config", config]);
        assert!(ok && text.starts_with("identical:"), "{episode}: {text}");
    }
    // The plan step records the write it refused; the deltas hold the others.
    let trace = basecamp_trace::read_trace(out.join("default/shard-0/bad-own-memory.trace")).unwrap();
    let step = trace
        .records
        .iter()
        .find_map(|r| match &r.body {
            Some(basecamp_trace::pb::record::Body::PlanStep(s)) if !s.tool.is_empty() => Some(s),
            _ => None,
        })
        .unwrap();
    assert_eq!(step.error_type, "null_write_refused");
    assert_eq!(step.refused_memory_json, [("courier".to_string(), "null".to_string())].into());
}

#[test]
fn a_tool_failure_without_a_fallback_replays_identically() {
    // The replayed failure's message was "tool fail tool fail exited with …":
    // the call's message, named by the call again, so the observation (the
    // error) hashed differently and every fallback-free failure diverged.
    let dir = tempfile::tempdir().unwrap();
    let task = REFUSALS_TASK.replace("maxSteps: 6", "maxSteps: 6\n  toolTimeouts: {default: 5s}").replace(
        "      memoryPatch:\n        count: /count\n",
        "    fail:\n      parameters: {type: object}\n      exec:\n        command: [sh, -c, 'cat >/dev/null; echo boom >&2; exit 3']\n",
    );
    std::fs::write(dir.path().join("task.yaml"), task).unwrap();
    std::fs::write(
        dir.path().join("fixture.jsonl"),
        "{\"tool\": \"lookup\", \"arguments\": {\"id\": \"1\"}, \"error\": \"down\"}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("tests.jsonl"), "{\"id\": \"f1\", \"instruction\": \"a\"}\n").unwrap();
    std::fs::write(
        dir.path().join("policy.jsonl"),
        concat!(
            r#"{"episode": "f1", "turns": [{"tool_calls": [{"name": "fail", "arguments": {}}]}, "#,
            r#"{"tool_calls": [{"name": "lookup", "arguments": {"id": "1"}}]}, {"content": "done"}]}"#,
            "\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let (ok, text) = basecamp(&["run", dir.path().to_str().unwrap(), "--no-progress", "--out", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    let trace = out.join("default/shard-0/f1.trace");
    let errors: Vec<(String, String)> = basecamp_trace::read_trace(&trace)
        .unwrap()
        .records
        .into_iter()
        .filter_map(|r| match r.body {
            Some(basecamp_trace::pb::record::Body::PlanStep(s)) if !s.tool.is_empty() => {
                Some((s.error_type, s.error_message))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        errors,
        [
            ("exit_status".to_string(), "tool fail exited with exit status: 3; stderr: boom".to_string()),
            ("tool_error".to_string(), "tool lookup down".to_string())
        ],
        "the run did not fail the calls this test is about"
    );
    let replayed = dir.path().join("replayed");
    let (ok, text) = basecamp(&[
        "trace",
        "replay",
        trace.to_str().unwrap(),
        "--config",
        dir.path().to_str().unwrap(),
        "--out",
        replayed.to_str().unwrap(),
    ]);
    assert!(ok && text.starts_with("identical:"), "{text}");
}

#[test]
fn a_divergence_names_enum_values() {
    // "status recorded 6 vs replayed 1": the numbers of the proto enums.
    let dir = tempfile::tempdir().unwrap();
    let out = run_refusals(dir.path());
    // The same sandbox without its memory schema accepts the write it refused.
    let lenient = dir.path().join("lenient");
    std::fs::create_dir(&lenient).unwrap();
    write_refusals(&lenient);
    let task = REFUSALS_TASK
        .replace("  memory:\n    strictTypes: true\n    schema: {count: integer}\n    nullWrites: error\n", "");
    assert_ne!(task, REFUSALS_TASK);
    std::fs::write(lenient.join("task.yaml"), task).unwrap();
    let trace = out.join("default/shard-0/bad-memory.trace");
    let (ok, text) = basecamp(&["trace", "replay", trace.to_str().unwrap(), "--config", lenient.to_str().unwrap()]);
    assert!(!ok, "{text}");
    assert!(text.contains("(record 1 of 3, plan_execution): status recorded refused vs replayed ok"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_injection_is_delivered_again_so_the_episode_replays_identically() {
    // A live injection (`basecamp sandbox inject`) is an event from outside,
    // like a tool's answer: recorded in the trace, it was not delivered again
    // on replay, so every such episode "diverged" at its injection record.
    use basecamp_sandbox::config::{RunContext, build_runner, episode_input};
    use basecamp_sandbox::episode::LiveInjection;
    use basecamp_sandbox::run::{load_manifests, load_test_set, resolve_variants, select_task};
    use basecamp_trace::pb::{InjectionTrigger, record::Body};

    let dir = tempfile::tempdir().unwrap();
    write_refusals(dir.path());
    let (manifests, _) = load_manifests(&[dir.path().to_path_buf()]).unwrap();
    let loaded = select_task(&manifests, Some("refusals")).unwrap();
    let task = &loaded.object;
    let variant = resolve_variants(&manifests, task, None).unwrap().remove(0);
    let test_set = load_test_set(&task.spec.evaluation.test_set, &loaded.base_dir()).await.unwrap();
    let row = test_set.episodes.iter().find(|e| e.id == "bad-args").unwrap();
    let ctx = RunContext {
        base_dir: loaded.base_dir(),
        namespace: "default".into(),
        task: "refusals".into(),
        variant: variant.name.clone(),
        shard: 0,
        shard_count: 1,
        training_step: 0,
    };
    let runner = build_runner(&task.spec, &variant.sandbox, &ctx).unwrap();
    let notice = serde_json::json!({"notice": "the carrier is on strike"});
    runner.live.push("bad-args", LiveInjection { id: "strike".into(), observation: notice, at_step: Some(2) });
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let result = runner.run(&episode_input(row, &task.spec.evaluation.compare_args).unwrap(), &out).await.unwrap();
    let trace = out.join(&result.trace_file);
    let injected: Vec<(u32, i32)> = basecamp_trace::read_trace(&trace)
        .unwrap()
        .records
        .into_iter()
        .filter_map(|r| match r.body {
            Some(Body::Injection(i)) => Some((r.step, i.trigger)),
            _ => None,
        })
        .collect();
    assert_eq!(injected, [(2, InjectionTrigger::Live as i32)]);

    let config = dir.path().to_str().unwrap().to_string();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(["trace", "replay", trace.to_str().unwrap(), "--config", &config])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && said.starts_with("identical:"),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_relative_out_directory_keeps_the_replay() {
    // `--out kept` named the fixture kept/replay-tools.jsonl, which the
    // sandbox then looked for relative to its base directory, kept/:
    // "cannot read fixture kept/kept/replay-tools.jsonl".
    let dir = tempfile::tempdir().unwrap();
    run_refusals(dir.path());
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "replay", "out/default/shard-0/bad-memory.trace", "--config", ".", "--out", "kept"])
        .current_dir(dir.path())
        .output()
        .expect("basecamp runs");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && said.starts_with("identical:"),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(dir.path().join("kept/replayed/bad-memory.trace").is_file());
}

#[test]
fn a_missing_trace_is_one_line_that_says_why_once() {
    // It said "...: No such file or directory (os error 2): No such file or directory (os error 2)".
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("gone.trace");
    let output = Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(["trace", "replay", missing.to_str().unwrap()])
        .output()
        .expect("basecamp runs");
    assert_eq!(output.status.code(), Some(1));
    let m = missing.display();
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!("error: cannot replay {m}: {m}: cannot read: No such file or directory (os error 2)\n")
    );
}

#[test]
fn a_plan_step_that_timed_out_replays_identically() {
    // A call cut off by planStepTimeout is recorded rolled_back with
    // error_type plan_step_timeout; replay made its tool fail at once with
    // that type, an ordinary error ("input_hash recorded (none) vs replayed
    // …"), instead of letting the step run out of time again.
    let dir = tempfile::tempdir().unwrap();
    let task = r#"apiVersion: basecamp.dev/v1alpha1
kind: SandboxConfig
metadata:
  name: slow-tools
spec:
  tools:
    slow:
      description: Takes its time.
      parameters:
        type: object
        properties:
          id: {type: string}
      exec:
        command: [sleep, "5"]
  toolTimeouts:
    default: 30s
  planStepTimeout: 500ms
  maxSteps: 4
---
apiVersion: basecamp.dev/v1alpha1
kind: HarnessTask
metadata:
  name: slow
spec:
  taskDefinition:
    name: slow
    description: a plan step that runs out of time
  evaluation:
    metrics: [tool_call_accuracy]
    testSet: tests.jsonl
  policy:
    scripted: policy.jsonl
  sandboxRef:
    name: slow-tools
"#;
    std::fs::write(dir.path().join("task.yaml"), task).unwrap();
    std::fs::write(
        dir.path().join("tests.jsonl"),
        r#"{"id": "e1", "instruction": "a", "expected_tool_calls": [{"name": "slow", "arguments": {"id": "1"}}]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("policy.jsonl"),
        r#"{"episode": "e1", "turns": [{"tool_calls": [{"name": "slow", "arguments": {"id": "1"}}]}, {"content": "done"}]}"#,
    )
    .unwrap();
    let config = dir.path().to_str().unwrap();
    let out = dir.path().join("out");
    let (ok, text) = basecamp(&["run", config, "--no-progress", "--out", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    let trace = out.join("default/shard-0/e1.trace");
    assert_eq!(tool_call_statuses(&trace), [(StepStatus::RolledBack, "plan_step_timeout".to_string())]);
    let (ok, text) = basecamp(&["trace", "replay", trace.to_str().unwrap(), "--config", config]);
    assert!(ok && text.starts_with("identical:"), "{text}");
}

#[test]
fn an_s3_trace_without_config_asks_for_it_instead_of_using_the_cwds_run() {
    // s3://BUCKET/KEY was looked up as the local path ./s3:/BUCKET/KEY, whose
    // ancestors include the working directory: a run.json there (a `basecamp
    // run` output directory of the same task) supplied the manifests of
    // whatever that run was, although the object belongs to no local run.
    let dir = tempfile::tempdir().unwrap();
    let out = run_refusals(dir.path());
    let data = dir.path().join("s3");
    std::fs::create_dir_all(data.join(s3::BUCKET).join("t")).unwrap();
    std::fs::copy(out.join("default/shard-0/bad-memory.trace"), data.join(s3::BUCKET).join("t/bad-memory.trace"))
        .unwrap();
    let server = s3::S3Server::start(&data);
    let url = format!("s3://{}/t/bad-memory.trace", s3::BUCKET);
    let replayed = server.basecamp(&["trace", "replay", &url], &out);
    let stderr = String::from_utf8_lossy(&replayed.stderr);
    assert_eq!(replayed.status.code(), Some(1), "{stderr}{}", String::from_utf8_lossy(&replayed.stdout));
    assert!(!stderr.contains("(from "), "{stderr}");
    assert!(stderr.contains(&format!("cannot replay {url}: ")) && stderr.contains("pass --config"), "{stderr}");
}

/// A sandbox whose `issue_credit` tool answers with its own memory patch
/// (`memory` and `memory_remove`) beside the SandboxConfig's `memoryPatch`.
const OWN_PATCH_TASK: &str = r#"apiVersion: basecamp.dev/v1alpha1
kind: SandboxConfig
metadata:
  name: credit-tools
spec:
  tools:
    issue_credit:
      description: Issue a goodwill credit.
      parameters:
        type: object
        properties:
          days_late: {type: integer}
      exec:
        command: [python3, credit.py]
      memoryPatch:
        credit_usd: /credit_usd
        status: /status
  # A python3 start on a loaded CI machine can take seconds: no timeout may cut it.
  toolTimeouts:
    default: 60s
  planStepTimeout: 120s
  maxSteps: 4
---
apiVersion: basecamp.dev/v1alpha1
kind: HarnessTask
metadata:
  name: credit
spec:
  taskDefinition:
    name: credit
    description: a tool that writes memory itself
  evaluation:
    metrics: [tool_call_accuracy, memory_consistency]
    testSet: tests.jsonl
  policy:
    scripted: policy.jsonl
  sandboxRef:
    name: credit-tools
"#;

#[test]
fn a_tool_that_answers_with_its_own_memory_patch_replays_identically() {
    // The fixture replay made of the trace carried only the tool's
    // observation, so the replayed call wrote only the `memoryPatch` keys
    // and every such episode diverged ("key recorded credit_note vs
    // replayed credit_usd"). The tool also writes `status` (which the
    // `memoryPatch` then overwrites) and removes a key.
    let dir = tempfile::tempdir().unwrap();
    let files = [
        ("task.yaml", OWN_PATCH_TASK),
        (
            "credit.py",
            "import json, sys\nargs = json.load(sys.stdin)\ndays = args['days_late']\n\
             json.dump({'observation': {'credit_usd': 5.0 * days, 'status': 'issued'},\n\
             'memory': {'credit_note': 'issued %d' % days, 'status': 'pending'}, 'memory_remove': ['customer_id']}, sys.stdout)\n",
        ),
        (
            "tests.jsonl",
            r#"{"id": "e1", "instruction": "a", "initial_memory": {"customer_id": "C-1"}, "expected_tool_calls": [{"name": "issue_credit", "arguments": {"days_late": 2}}]}"#,
        ),
        (
            "policy.jsonl",
            r#"{"episode": "e1", "turns": [{"tool_calls": [{"name": "issue_credit", "arguments": {"days_late": 2}}]}, {"content": "done"}]}"#,
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let config = dir.path().to_str().unwrap();
    let out = dir.path().join("out");
    let (ok, text) = basecamp(&["run", config, "--no-progress", "--out", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    let trace = out.join("default/shard-0/e1.trace");
    let deltas: Vec<(String, Option<String>)> = basecamp_trace::read_trace(&trace)
        .unwrap()
        .records
        .into_iter()
        .filter_map(|r| match r.body {
            Some(basecamp_trace::pb::record::Body::MemoryDelta(d))
                if d.source == basecamp_trace::pb::MemorySource::Tool as i32 =>
            {
                Some((d.key, d.after_json))
            }
            _ => None,
        })
        .collect();
    let delta = |key: &str, after: Option<&str>| (key.to_string(), after.map(String::from));
    assert_eq!(
        deltas,
        [
            delta("credit_note", Some("\"issued 2\"")),
            delta("status", Some("\"pending\"")),
            delta("customer_id", None),
            delta("credit_usd", Some("10")),
            delta("status", Some("\"issued\"")),
        ],
        "the run did not write what this test is about"
    );
    let kept = dir.path().join("kept");
    let (ok, text) =
        basecamp(&["trace", "replay", trace.to_str().unwrap(), "--config", config, "--out", kept.to_str().unwrap()]);
    assert!(ok && text.starts_with("identical:"), "{text}");
    // The answer carries what the tool wrote, not what `memoryPatch` writes again.
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(kept.join("replay-tools.jsonl")).unwrap()).unwrap();
    assert_eq!(fixture["memoryPatch"], serde_json::json!({"credit_note": "issued 2", "status": "pending"}));
    assert_eq!(fixture["memoryRemove"], serde_json::json!(["customer_id"]));

    // Under memory rules that refuse the tool's own write, the replay says so.
    let strict = dir.path().join("strict");
    std::fs::create_dir(&strict).unwrap();
    for (name, _) in files {
        std::fs::copy(dir.path().join(name), strict.join(name)).unwrap();
    }
    let task = OWN_PATCH_TASK.replace(
        "  maxSteps: 4\n",
        "  maxSteps: 4\n  memory:\n    strictTypes: true\n    schema: {credit_note: integer}\n",
    );
    std::fs::write(strict.join("task.yaml"), task).unwrap();
    let (ok, text) = basecamp(&["trace", "replay", trace.to_str().unwrap(), "--config", strict.to_str().unwrap()]);
    assert!(!ok, "{text}");
    assert!(text.contains("plan_execution): status recorded ok vs replayed refused"), "{text}");
}

/// `first` answers after 1 s; `second` would take 5 s but times out after
/// 1.5 s; a plan step has 2 s. After `first` (e1), or after a policy that
/// took 1 s to answer (e2), the plan step's deadline cuts `second` before its
/// own timeout does.
const SLOW_STEP_TASK: &str = r#"apiVersion: basecamp.dev/v1alpha1
kind: SandboxConfig
metadata:
  name: slow-step-tools
spec:
  tools:
    first:
      description: Answers after a second.
      parameters: {type: object}
      recorded: {fixture: tools.jsonl}
    second:
      description: Would answer after five.
      parameters: {type: object}
      recorded: {fixture: tools.jsonl}
  toolTimeouts:
    default: 1500ms
  planStepTimeout: 2s
  maxSteps: 4
---
apiVersion: basecamp.dev/v1alpha1
kind: HarnessTask
metadata:
  name: slow-step
spec:
  taskDefinition:
    name: slow-step
    description: calls that together run past the plan step's deadline
  evaluation:
    metrics: [tool_call_accuracy]
    testSet: tests.jsonl
  policy:
    scripted: policy.jsonl
  sandboxRef:
    name: slow-step-tools
"#;

#[test]
fn a_call_cut_by_the_plan_step_deadline_after_slow_calls_replays_identically() {
    // Replay answered every call at once, so `second` started at the step's
    // start and its own 1.5 s timeout ended it ("timeout") before the 2 s
    // plan step did: recorded rolled_back vs replayed timeout. The calls and
    // the policy now take their recorded time, on a paused clock.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("task.yaml"), SLOW_STEP_TASK).unwrap();
    std::fs::write(
        dir.path().join("tools.jsonl"),
        "{\"tool\": \"first\", \"observation\": {\"ok\": 1}, \"latencyMs\": 1000}\n\
         {\"tool\": \"second\", \"observation\": {\"late\": true}, \"latencyMs\": 5000}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("tests.jsonl"),
        "{\"id\": \"e1\", \"instruction\": \"a\", \"expected_tool_calls\": [{\"name\": \"first\", \"arguments\": {}}]}\n\
         {\"id\": \"e2\", \"instruction\": \"b\", \"expected_tool_calls\": [{\"name\": \"second\", \"arguments\": {}}]}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("policy.jsonl"),
        "{\"episode\": \"e1\", \"turns\": [{\"tool_calls\": [{\"name\": \"first\", \"arguments\": {}}, \
         {\"name\": \"second\", \"arguments\": {}}]}, {\"content\": \"done\"}]}\n\
         {\"episode\": \"e2\", \"turns\": [{\"delay_ms\": 1000, \"tool_calls\": [{\"name\": \"second\", \"arguments\": {}}]}, \
         {\"content\": \"done\"}]}\n",
    )
    .unwrap();
    let config = dir.path().to_str().unwrap();
    let out = dir.path().join("out");
    let (ok, text) = basecamp(&["run", config, "--no-progress", "--out", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    for (episode, recorded) in [
        ("e1", vec![(StepStatus::Ok, ""), (StepStatus::RolledBack, "plan_step_timeout")]),
        ("e2", vec![(StepStatus::RolledBack, "plan_step_timeout")]),
    ] {
        let trace = out.join(format!("default/shard-0/{episode}.trace"));
        let recorded: Vec<(StepStatus, String)> = recorded.into_iter().map(|(s, e)| (s, e.to_string())).collect();
        assert_eq!(tool_call_statuses(&trace), recorded, "{episode}");
        let (ok, text) = basecamp(&["trace", "replay", trace.to_str().unwrap(), "--config", config]);
        assert!(ok && text.starts_with("identical:"), "{episode}: {text}");
    }
}

/// The status and error type of each tool call in the trace at `path`.
fn tool_call_statuses(path: &Path) -> Vec<(StepStatus, String)> {
    basecamp_trace::read_trace(path)
        .unwrap()
        .records
        .into_iter()
        .filter_map(|r| match r.body {
            Some(basecamp_trace::pb::record::Body::PlanStep(s)) if !s.tool.is_empty() => {
                Some((s.status(), s.error_type))
            }
            _ => None,
        })
        .collect()
}

/// REFUSALS_TASK's sandbox and task, answered by a fixture whose tool
/// writes `count` itself as 2.0 (a Python float), 2.5, and a key "".
#[test]
fn integral_floats_in_an_integer_key_and_the_empty_key_replay_identically() {
    let dir = tempfile::tempdir().unwrap();
    write_refusals(dir.path());
    let line = |id: &str, patch: &str| {
        format!(
            r#"{{"tool": "lookup", "arguments": {{"id": "{id}"}}, "observation": {{"status": "late"}}, "memoryPatch": {patch}}}"#
        )
    };
    let fixture =
        [line("1", r#"{"count": 2.0}"#), line("2", r#"{"count": 2.5}"#), line("3", r#"{"": "x", "eta": "friday"}"#)];
    std::fs::write(dir.path().join("fixture.jsonl"), fixture.join("\n") + "\n").unwrap();
    let out = dir.path().join("out");
    let (ok, text) = basecamp(&["run", dir.path().to_str().unwrap(), "--no-progress", "--out", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    let config = dir.path().to_str().unwrap();
    // bad-args calls lookup {"id": "1"} last; bad-memory {"id": "2"}; bad-own-memory {"id": "3"}.
    for (episode, last, error_type) in [
        // Before: refused "must hold integer, the patch from lookup wrote a number", and replay
        // reported "status recorded refused vs replayed ok" (the trace holds 2.0 as 2).
        ("bad-args", StepStatus::Ok, ""),
        ("bad-memory", StepStatus::Refused, "memory_type"),
        // Before: ok, a key named "" in memory.
        ("bad-own-memory", StepStatus::Refused, "memory_key"),
    ] {
        let trace = out.join("default/shard-0").join(format!("{episode}.trace"));
        let statuses = tool_call_statuses(&trace);
        assert_eq!(statuses.last(), Some(&(last, error_type.to_string())), "{episode}: {statuses:?}");
        let (ok, text) = basecamp(&["trace", "replay", trace.to_str().unwrap(), "--config", config]);
        assert!(ok && text.starts_with("identical:"), "{episode}: {text}");
    }
}
