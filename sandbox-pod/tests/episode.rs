//! The agent loop end to end: scripted policy, recorded and exec tools,
//! traces on disk read back with the trace library.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use basecamp_sandbox::episode::{
    EpisodeInput, EpisodeRunner, InjectionWhen, LiveInjection, LiveInjections, ScheduledInjection, rollback_path,
};
use basecamp_sandbox::executor::{Fallback, NullWrites, ToolDef, ToolExecutor};
use basecamp_sandbox::metrics::SandboxMetrics;
use basecamp_sandbox::policy::{
    ChatMessage, Policy, PolicyConfig, PolicyResponse, ScriptedConfig, ToolArguments, ToolCall,
};
use basecamp_sandbox::rewards::{ComponentSpec, RewardCalculator, RewardSpec};
use basecamp_sandbox::tools::exec::ExecTool;
use basecamp_sandbox::tools::recorded::{RecordedTool, parse_fixture};
use basecamp_sandbox::tools::{Tool, ToolOutput};
use basecamp_trace::pb::{Header, InjectionTrigger, MemorySource, Outcome, StepStatus, record::Body};
use basecamp_trace::{MemoryPatch, Tail, hash_json, read_trace};
use serde_json::{Value, json};

const SCRIPT: &str = r#"{"episode": "ok", "turns": [{"tool_calls": [{"name": "tracking_api", "arguments": {"order_id": "A-1"}}]}, {"content": "It ships tomorrow."}]}
{"episode": "slow", "turns": [{"tool_calls": [{"name": "tracking_api", "arguments": {"order_id": "SLOW"}}]}, {"content": "Status unknown."}]}
{"episode": "stuck", "turns": [{"tool_calls": [{"name": "note", "arguments": {"k": "v"}}, {"name": "hang", "arguments": {}}]}, {"content": "done"}]}
{"episode": "stepwise", "turns": [{"tool_calls": [{"name": "note", "arguments": {"k": "a"}}]}, {"tool_calls": [{"name": "note", "arguments": {"k": "b"}}]}, {"tool_calls": [{"name": "note", "arguments": {"k": "c"}}]}, {"tool_calls": [{"name": "note", "arguments": {"k": "d"}}, {"name": "hang", "arguments": {}}]}, {"content": "done"}]}
{"episode": "bad-json", "turns": [{"tool_calls": [{"name": "tracking_api", "arguments": "{\"order_id\": "}]}, {"content": "oops"}]}
{"episode": "slow-then-down", "turns": [{"tool_calls": [{"name": "tracking_api", "arguments": {"order_id": "SLOW"}}]}, {"error": "the model server went away"}]}
"#;

const FIXTURE: &str = r#"{"tool": "tracking_api", "arguments": {"order_id": "A-1"}, "response": {"observation": {"status": "in_transit"}, "memory": {"shipping_status": "in_transit"}}}
{"tool": "tracking_api", "arguments": {"order_id": "SLOW"}, "response": {"status": "late"}, "latency_ms": 2000}
"#;

fn runner(dir: &Path) -> EpisodeRunner {
    let script = dir.join("policy.jsonl");
    std::fs::write(&script, SCRIPT).unwrap();
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    let recordings = parse_fixture("fixture.jsonl", FIXTURE).unwrap();
    let mut executor = ToolExecutor::new(NullWrites::Warn);
    executor.add_tool(
        "tracking_api",
        ToolDef {
            tool: Tool::Recorded(RecordedTool::new("tracking_api", recordings)),
            timeout: Duration::from_millis(300),
            fallback: Some(Fallback {
                observation: json!({"status": null}),
                memory_patch: MemoryPatch::default().set("shipping_status", Value::Null),
            }),
            memory_map: Vec::new(),
        },
    );
    let py = |code: &str| Tool::Exec(ExecTool::new(vec!["python3".into(), "-c".into(), code.into()]));
    executor.add_tool(
        "note",
        ToolDef {
            tool: py(
                "import json,sys; a=json.load(sys.stdin); print(json.dumps({'observation': 'noted', 'memory': a}))",
            ),
            timeout: Duration::from_secs(5),
            fallback: None,
            memory_map: Vec::new(),
        },
    );
    executor.add_tool(
        "hang",
        ToolDef {
            tool: py("import time; time.sleep(60)"),
            timeout: Duration::from_secs(30),
            fallback: None,
            memory_map: Vec::new(),
        },
    );
    let rewards = RewardCalculator::new(&RewardSpec {
        components: [
            ("tool_call_accuracy".to_string(), ComponentSpec { weight: 0.7 }),
            ("efficiency_penalty".to_string(), ComponentSpec { weight: 0.3 }),
        ]
        .into(),
        schedule: Default::default(),
    })
    .unwrap();
    EpisodeRunner {
        executor,
        policy,
        tools: Vec::new(),
        system_prompt: Some("You are a support agent.".into()),
        max_steps: 5,
        plan_step_timeout: Duration::from_millis(1500),
        rollback_enabled: true,
        checkpoint_every: 1,
        snapshot_interval: 1,
        error_context: true,
        injections: vec![ScheduledInjection {
            id: "policy-note".into(),
            when: InjectionWhen::AfterTool("tracking_api".into()),
            observation: json!("Reminder: never promise a date."),
            description: "after tracking".into(),
        }],
        rewards: Some(rewards),
        reward_sources: Default::default(),
        training_step: 0,
        header: Header { task: "shipping".into(), variant: "a".into(), ..Default::default() },
        live: LiveInjections::default(),
        metrics: None,
        logits: Default::default(),
        policy_readiness: None,
    }
}

fn input(id: &str, expected_tool: &str, expected_args: Value) -> EpisodeInput {
    EpisodeInput {
        id: id.into(),
        messages: vec![ChatMessage::user("Where is my order?")],
        initial_memory: json!({"order_id": "A-1"}).as_object().cloned().unwrap(),
        expected_calls: vec![(expected_tool.into(), expected_args.as_object().cloned().unwrap(), None)],
        expected_memory: Some(json!({"shipping_status": "in_transit"}).as_object().cloned().unwrap()),
        expected_memory_hash: None,
        row_id: Some(id.into()),
    }
}

#[tokio::test]
async fn a_good_episode_scores_full_marks_and_its_trace_reads_back_complete() {
    let dir = tempfile::tempdir().unwrap();
    let runner = runner(dir.path());
    runner.live.push("ok", LiveInjection { id: "live-1".into(), observation: json!({"hint": 1}), at_step: Some(2) });
    let result = runner.run(&input("ok", "tracking_api", json!({"order_id": "A-1"})), dir.path()).await.unwrap();
    assert_eq!(result.outcome, "completed");
    assert_eq!(result.failure_class, "ok");
    assert_eq!(result.metrics.tool_call_accuracy, 1.0);
    assert_eq!(result.metrics.memory_consistency, Some(1.0));
    assert_eq!(result.metrics.steps, 2);
    let reward = result.metrics.reward.unwrap();
    assert!((reward - (0.7 - 0.3 * 2.0 / 5.0)).abs() < 1e-9, "{reward}");
    assert!(result.warnings.iter().any(|w| w.contains("without logprobs")), "{:?}", result.warnings);

    let trace = read_trace(dir.path().join("ok.trace")).unwrap();
    assert!(matches!(trace.tail, Tail::Complete));
    assert_eq!(trace.header.episode_id, "ok");
    let bodies: Vec<&Body> = trace.records.iter().filter_map(|r| r.body.as_ref()).collect();
    let injections: Vec<_> = bodies
        .iter()
        .filter_map(|b| match b {
            Body::Injection(i) => Some((i.id.as_str(), i.trigger)),
            _ => None,
        })
        .collect();
    assert_eq!(
        injections,
        vec![("policy-note", InjectionTrigger::AfterTool as i32), ("live-1", InjectionTrigger::Live as i32)]
    );
    assert!(bodies.iter().any(|b| matches!(b, Body::RewardSignal(_))));
    assert!(bodies.iter().any(|b| matches!(b, Body::MemorySnapshot(_))));
    let Some(Body::EpisodeEnd(end)) = bodies.last() else { panic!("last record is not the episode end") };
    assert_eq!(end.outcome, Outcome::Completed as i32);
    assert_eq!(end.final_answer, "It ships tomorrow.");
}

#[tokio::test]
async fn a_tool_timeout_takes_the_fallback_and_the_null_it_writes_is_traced() {
    let dir = tempfile::tempdir().unwrap();
    let result =
        runner(dir.path()).run(&input("slow", "tracking_api", json!({"order_id": "SLOW"})), dir.path()).await.unwrap();
    assert_eq!(result.failure_class, "timeout");
    assert_eq!(result.metrics.memory_consistency, Some(0.0));
    assert!(result.warnings.iter().any(|w| w.contains("the fallback of tracking_api wrote null")));
    let trace = read_trace(dir.path().join("slow.trace")).unwrap();
    let null_delta = trace.records.iter().find_map(|r| match &r.body {
        Some(Body::MemoryDelta(d)) if d.key == "shipping_status" => Some(d.clone()),
        _ => None,
    });
    let d = null_delta.expect("the fallback's write is in the trace");
    assert_eq!(d.after_json.as_deref(), Some("null"));
    assert_eq!(d.source, MemorySource::Fallback as i32);
    assert!(trace.records.iter().any(|r| matches!(&r.body, Some(Body::ErrorContext(e)) if e.error_type == "timeout")));
}

/// Memory bigger than a trace frame (17 values of 4 MiB): the episode's
/// error context names the values it leaves out and the memory snapshot is
/// skipped with a warning (before: the writer refused the 71 MB record and
/// the episode was lost, trace and all).
#[tokio::test]
async fn memory_over_a_frame_keeps_the_episode_and_its_error_context() {
    let dir = tempfile::tempdir().unwrap();
    let mut input = input("slow", "tracking_api", json!({"order_id": "SLOW"}));
    let big = "x".repeat(4 << 20);
    for i in 0..17 {
        input.initial_memory.insert(format!("notes_{i:02}"), Value::String(big.clone()));
    }
    let result = runner(dir.path()).run(&input, dir.path()).await.unwrap();
    assert_eq!(result.failure_class, "timeout");
    assert!(
        result.warnings.iter().any(|w| w.starts_with("step 1: the memory snapshot was not written: memory is ")),
        "{:?}",
        result.warnings
    );
    let trace = read_trace(dir.path().join("slow.trace")).unwrap();
    assert!(matches!(trace.tail, Tail::Complete), "{:?}", trace.tail);
    let context = trace
        .records
        .iter()
        .find_map(|r| match &r.body {
            Some(Body::ErrorContext(e)) if e.error_type == "timeout" => Some(e.clone()),
            _ => None,
        })
        .expect("the timeout's error context");
    let omitted: Vec<String> = (0..17).map(|i| format!("notes_{i:02}")).collect();
    assert_eq!(context.omitted_memory_keys, omitted, "each value is over the 1 MiB a value may take");
    assert_eq!(context.memory_snapshot_json.get("order_id").map(String::as_str), Some("\"A-1\""));
    assert!(!context.memory_snapshot_json.keys().any(|k| k.starts_with("notes_")));
}

#[tokio::test]
async fn a_plan_step_timeout_rolls_memory_back_and_writes_rollback_trace() {
    let dir = tempfile::tempdir().unwrap();
    let result = runner(dir.path()).run(&input("stuck", "note", json!({"k": "v"})), dir.path()).await.unwrap();
    assert_eq!(result.rollbacks, 1);
    assert_eq!(result.failure_class, "plan_step_timeout");
    let trace_path = dir.path().join("stuck.trace");
    let rollback: Value = serde_json::from_slice(&std::fs::read(rollback_path(&trace_path)).unwrap()).unwrap();
    assert_eq!(rollback[0]["step"], 1);
    // The key was not in memory at the checkpoint: no `before`, not `before: null`.
    assert_eq!(rollback[0]["modified_keys"]["k"], json!({"after": "v"}));
    assert_eq!(rollback[0]["triggering_observation"]["tool"], "hang");
    let trace = read_trace(&trace_path).unwrap();
    let rolled_back = trace.records.iter().find_map(|r| match &r.body {
        Some(Body::PlanStep(p)) if p.status == StepStatus::RolledBack as i32 && p.tool == "hang" => Some(p),
        _ => None,
    });
    let rolled_back = rolled_back.expect("the call the timeout cut off is recorded");
    // Its input_hash was left empty, unlike every other call's.
    assert_eq!(
        (rolled_back.arguments_json.as_str(), rolled_back.input_hash.as_slice()),
        ("{}", &hash_json(&json!({})).0[..])
    );
    let undo = trace.records.iter().any(|r| {
        matches!(&r.body, Some(Body::MemoryDelta(d)) if d.source == MemorySource::Rollback as i32 && d.key == "k" && d.after_json.is_none())
    });
    assert!(undo, "the rollback's delta removes the key the step added");
}

#[tokio::test]
async fn a_timed_out_step_rolls_back_to_the_checkpoint_of_every_nth_completed_step() {
    // Steps 1-3 set k to a, b, c; step 4 sets d, then hangs past the plan step's deadline.
    for (every, before) in [(1, Some("c")), (2, Some("b")), (10, None)] {
        let dir = tempfile::tempdir().unwrap();
        let runner = EpisodeRunner { checkpoint_every: every, ..runner(dir.path()) };
        let result = runner.run(&input("stepwise", "note", json!({"k": "a"})), dir.path()).await.unwrap();
        assert_eq!(result.rollbacks, 1, "checkpointEvery {every}");
        let trace_path = dir.path().join("stepwise.trace");
        let rollback: Value = serde_json::from_slice(&std::fs::read(rollback_path(&trace_path)).unwrap()).unwrap();
        assert_eq!(rollback[0]["step"], 4);
        let expected = match before {
            Some(before) => json!({"before": before, "after": "d"}),
            None => json!({"after": "d"}),
        };
        assert_eq!(rollback[0]["modified_keys"]["k"], expected, "checkpointEvery {every}");
        let trace = read_trace(&trace_path).unwrap();
        let undo = trace.records.iter().find_map(|r| match &r.body {
            Some(Body::MemoryDelta(d)) if d.source == MemorySource::Rollback as i32 && d.key == "k" => Some(d),
            _ => None,
        });
        let undo = undo.expect("the rollback's delta is in the trace");
        assert_eq!(undo.after_json, before.map(|b| format!("{b:?}")), "checkpointEvery {every}");
    }
}

#[tokio::test]
async fn invalid_tool_arguments_are_a_recorded_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let result = runner(dir.path())
        .run(&input("bad-json", "tracking_api", json!({"order_id": "A-1"})), dir.path())
        .await
        .unwrap();
    assert_eq!(result.outcome, "completed");
    assert_eq!(result.failure_class, "invalid_arguments");
    assert_eq!(result.metrics.tool_call_accuracy, 0.0);
    assert_eq!(result.metrics.error_rate, 1.0);
}

#[tokio::test]
async fn an_unscripted_episode_is_a_recorded_policy_error() {
    let dir = tempfile::tempdir().unwrap();
    let result = runner(dir.path()).run(&input("nobody", "x", json!({})), dir.path()).await.unwrap();
    assert_eq!(result.outcome, "error");
    assert!(result.error.as_deref().unwrap_or("").contains("no script for episode `nobody`"), "{:?}", result.error);
    let trace = read_trace(dir.path().join("nobody.trace")).unwrap();
    assert!(matches!(trace.tail, Tail::Complete));
}

/// A policy that fails after a tool timed out classes the episode as the
/// policy's failure: it ended because the infrastructure broke, and
/// aggregates leave it out of the agent's numbers (it was `timeout`, the
/// first error, and counted as the agent's).
#[tokio::test]
async fn a_policy_failure_after_a_tool_error_classes_the_episode_as_the_policy_s() {
    let dir = tempfile::tempdir().unwrap();
    let input = input("slow-then-down", "tracking_api", json!({"order_id": "SLOW"}));
    let result = runner(dir.path()).run(&input, dir.path()).await.unwrap();
    assert_eq!(result.outcome, "error");
    assert_eq!(result.failure_class, "policy_error", "{:?}", result.error);
    assert!(!basecamp_trace::metrics::measures_the_agent(&result.failure_class));
}

// ---- recorded sequences: a position of each episode's own ------------------

/// Episode `id` calling `track` `calls` times, one call a step, then answering.
fn tracking_script(id: &str, calls: usize) -> String {
    let mut turns: Vec<Value> =
        (0..calls).map(|i| json!({"tool_calls": [{"name": "track", "arguments": {"call": i}}]})).collect();
    turns.push(json!({"content": "done"}));
    json!({"episode": id, "turns": turns}).to_string() + "\n"
}

fn sequence_runner(dir: &Path, executor: ToolExecutor, episodes: &[(&str, usize)]) -> EpisodeRunner {
    let script = dir.join("policy.jsonl");
    std::fs::write(&script, episodes.iter().map(|(id, calls)| tracking_script(id, *calls)).collect::<String>())
        .unwrap();
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    EpisodeRunner { max_steps: 8, snapshot_interval: 0, ..EpisodeRunner::new(executor, policy) }
}

/// What each of the episode's `track` calls got: its observation, or its error.
fn track_answers(trace: &Path) -> Vec<String> {
    let trace = read_trace(trace).unwrap();
    trace
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::PlanStep(p)) if p.tool == "track" => Some(match p.error_type.as_str() {
                "" => p.observation_json.clone(),
                error_type => format!("{error_type}: {}", p.error_message),
            }),
            _ => None,
        })
        .collect()
}

fn bare_input(id: &str) -> EpisodeInput {
    EpisodeInput { id: id.into(), messages: vec![ChatMessage::user("Track it.")], ..Default::default() }
}

/// Used to be one position for the whole shard: episodes running side by
/// side took turns through the fixture, so which answer each got depended
/// on how their calls interleaved.
#[tokio::test]
async fn concurrent_episodes_each_get_a_recorded_sequence_from_its_first_answer() {
    let dir = tempfile::tempdir().unwrap();
    // Each answer takes 20 ms, so the two episodes' calls interleave.
    let lines: String = (1..=3)
        .map(|n| format!("{{\"tool\": \"track\", \"response\": {{\"answer\": {n}}}, \"latency_ms\": 20}}\n"))
        .collect();
    let mut executor = ToolExecutor::new(NullWrites::Warn);
    let tool = RecordedTool::new("track", parse_fixture("f.jsonl", &lines).unwrap());
    executor.add_tool("track", ToolDef::new(Tool::Recorded(tool), Duration::from_secs(5)));
    let runner = sequence_runner(dir.path(), executor, &[("a", 3), ("b", 3)]);

    let (a, b) = (bare_input("a"), bare_input("b"));
    let (a, b) = tokio::join!(runner.run(&a, dir.path()), runner.run(&b, dir.path()));
    let in_order = [r#"{"answer":1}"#, r#"{"answer":2}"#, r#"{"answer":3}"#];
    for (id, result) in [("a", a), ("b", b)] {
        assert_eq!(result.unwrap().outcome, "completed", "{id}");
        assert_eq!(track_answers(&dir.path().join(format!("{id}.trace"))), in_order, "{id}");
    }
}

/// A `match: sequence` tool built from a SandboxConfig, as `basecamp run`
/// and a pod build it: the next episode of the shard starts at the first
/// answer again (it used to go on where the last one stopped, wrapping),
/// and a call past the last answer fails, naming the fixture.
#[tokio::test]
async fn a_sequence_fixture_restarts_for_each_episode_and_fails_past_its_last_answer() {
    let dir = tempfile::tempdir().unwrap();
    let fixture: String =
        (1..=3).map(|n| format!("{{\"tool\": \"track\", \"observation\": {{\"answer\": {n}}}}}\n")).collect();
    std::fs::write(dir.path().join("track.jsonl"), fixture).unwrap();
    let answers = |n: usize| (1..=n).map(|n| format!(r#"{{"answer":{n}}}"#)).collect::<Vec<_>>();
    for (match_by, fourth) in [
        (
            "sequence",
            "no_recording: tool track no recorded response matches: fixture track.jsonl has 3 answers for track, \
             one per call in order (match: sequence), and this episode has used them all (this is its call 4); \
             add answers to the fixture, or set match: cycle to start again at the first",
        ),
        ("cycle", r#"{"answer":1}"#),
    ] {
        let spec: basecamp_api::SandboxConfigSpec = serde_json::from_value(
            json!({"tools": {"track": {"recorded": {"fixture": "track.jsonl", "match": match_by}}}}),
        )
        .unwrap();
        let executor = basecamp_sandbox::config::build_executor(&spec, dir.path()).unwrap();
        let runner = sequence_runner(dir.path(), executor, &[("two", 2), ("three", 3), ("four", 4)]);
        for (id, calls) in [("two", 2), ("three", 3), ("four", 4)] {
            runner.run(&bare_input(id), dir.path()).await.unwrap();
            let got = track_answers(&dir.path().join(format!("{id}.trace")));
            let mut expected = answers(calls.min(3));
            if calls == 4 {
                expected.push(fourth.to_string());
            }
            assert_eq!(got, expected, "match: {match_by}, episode {id}");
        }
    }
}

/// Tools that answer from one fixture file: the file is read once and each
/// tool answers with its own lines, in file order, whatever its match.
#[tokio::test]
async fn tools_answering_from_one_fixture_file_each_get_their_own_lines() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = [
        r#"{"tool": "faq", "arguments": {"q": "returns"}, "observation": {"faq": "30 days"}}"#,
        r#"{"tool": "track", "observation": {"answer": 1}}"#,
        r#"{"tool": "faq", "arguments": {"q": "shipping"}, "observation": {"faq": "2 days"}}"#,
        r#"{"tool": "track", "observation": {"answer": 2}}"#,
        r#"{"tool": "unused", "observation": {"never": true}}"#,
    ]
    .join("\n");
    std::fs::write(dir.path().join("shared.jsonl"), fixture).unwrap();
    let spec: basecamp_api::SandboxConfigSpec = serde_json::from_value(json!({"tools": {
        "faq": {"recorded": {"fixture": "shared.jsonl", "match": "args"}},
        "track": {"recorded": {"fixture": "./shared.jsonl", "match": "sequence"}},
    }}))
    .unwrap();
    let executor = basecamp_sandbox::config::build_executor(&spec, dir.path()).unwrap().for_episode();
    let call = async |tool: &str, arguments: Value| {
        let def = executor.tool(tool).unwrap_or_else(|| panic!("{tool} is not built"));
        def.tool.call(tool, &arguments).await.map(|out| out.observation).map_err(|e| e.to_string())
    };
    assert_eq!(call("faq", json!({"q": "shipping"})).await, Ok(json!({"faq": "2 days"})));
    assert_eq!(call("faq", json!({"q": "returns"})).await, Ok(json!({"faq": "30 days"})));
    assert_eq!(call("track", json!({})).await, Ok(json!({"answer": 1})));
    assert_eq!(call("track", json!({"any": "thing"})).await, Ok(json!({"answer": 2})));
    let past = call("track", json!({})).await.unwrap_err();
    assert!(past.contains("has 2 answers for track"), "{past}");
    let unknown = call("faq", json!({"q": "unknown"})).await.unwrap_err();
    assert!(unknown.contains("no line for faq"), "{unknown}");
}

// ---- one turn of several tool calls ----------------------------------------

/// A runner whose `note` answers at once (writing `noted`), whose `hang`
/// answers after a minute, with an injection after each `note` and the
/// metrics on; the deadline `act` is given cuts a turn off, not its 30 s
/// plan-step timeout.
fn turn_runner(dir: &Path) -> EpisodeRunner {
    let script = dir.join("policy.jsonl");
    std::fs::write(&script, r#"{"episode": "unused", "turns": [{"content": "done"}]}"#).unwrap();
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    let mut executor = ToolExecutor::new(NullWrites::Warn);
    let note = |_: &Value| ToolOutput::from_json(json!({"observation": "noted", "memory": {"noted": true}}), 0);
    let def = |tool| ToolDef { tool, timeout: Duration::from_secs(30), fallback: None, memory_map: Vec::new() };
    executor.add_tool("note", def(Tool::Function(Arc::new(note))));
    executor.add_tool("hang", def(Tool::Exec(ExecTool::new(vec!["sleep".into(), "60".into()]))));
    EpisodeRunner {
        plan_step_timeout: Duration::from_secs(30),
        injections: vec![ScheduledInjection {
            id: "after-note".into(),
            when: InjectionWhen::AfterTool("note".into()),
            observation: json!("Notes are kept for a week."),
            description: "after note".into(),
        }],
        metrics: Some(Arc::new(SandboxMetrics::new())),
        ..EpisodeRunner::new(executor, policy)
    }
}

/// An assistant turn calling each `(id, tool)` with no arguments.
fn turn(calls: &[(&str, &str)]) -> PolicyResponse {
    PolicyResponse {
        model: "scripted".into(),
        content: None,
        tool_calls: calls
            .iter()
            .map(|(id, name)| ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                arguments: ToolArguments::Parsed(json!({})),
            })
            .collect(),
        finish_reason: None,
        logprobs: None,
        raw_logits: None,
        usage: None,
        latency: Duration::ZERO,
        attempts: 1,
        warnings: Vec::new(),
    }
}

/// The messages after the (last) assistant turn.
fn after_the_turn(messages: &[ChatMessage]) -> &[ChatMessage] {
    let at = messages.iter().rposition(|m| matches!(m, ChatMessage::Assistant { .. })).expect("an assistant turn");
    &messages[at + 1..]
}

fn role(message: &ChatMessage) -> &'static str {
    match message {
        ChatMessage::System { .. } => "system",
        ChatMessage::User { .. } => "user",
        ChatMessage::Assistant { .. } => "assistant",
        ChatMessage::Tool { .. } => "tool",
    }
}

#[tokio::test]
async fn a_turn_cut_off_by_the_plan_step_deadline_still_answers_each_of_its_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let runner = turn_runner(dir.path());
    let mut episode = runner.start(bare_input("cut"), dir.path()).unwrap();
    assert!(episode.advance(&runner).unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    let report =
        episode.act(&runner, &turn(&[("c1", "note"), ("c2", "hang"), ("c3", "note")]), deadline).await.unwrap();
    assert!(report.plan_step_timed_out);

    // Before: assistant(c1, c2, c3), tool(c1), user — c2 and c3 unanswered,
    // which an OpenAI-compatible server refuses with HTTP 400.
    let messages = episode.messages().to_vec();
    let Some(ChatMessage::Assistant { tool_calls, .. }) =
        messages.iter().rfind(|m| matches!(m, ChatMessage::Assistant { .. }))
    else {
        unreachable!()
    };
    let asked: Vec<&str> = tool_calls.iter().map(|c| c.id.as_str()).collect();
    let answers: Vec<(&str, &str)> = after_the_turn(&messages)
        .iter()
        .map_while(|m| match m {
            ChatMessage::Tool { tool_call_id, content } => Some((tool_call_id.as_str(), content.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(answers.iter().map(|(id, _)| *id).collect::<Vec<_>>(), asked);
    assert!(answers[2].1.contains("not run: the plan step timed out in an earlier call of this turn (hang c2)"));
    assert_eq!(after_the_turn(&messages).iter().map(role).collect::<Vec<_>>(), ["tool", "tool", "tool", "user"]);

    // The cut-off call's answer is what the trace records for it.
    let trace_path = episode.trace_path().to_path_buf();
    assert!(episode.advance(&runner).unwrap(), "the episode goes on after the rollback");
    episode.cancel("done".into()).unwrap();
    episode.finish(&runner).unwrap();
    let trace = read_trace(&trace_path).unwrap();
    let rolled_back = trace.records.iter().find_map(|r| match &r.body {
        Some(Body::PlanStep(p)) if p.status == StepStatus::RolledBack as i32 => Some(p),
        _ => None,
    });
    assert_eq!(rolled_back.expect("the cut-off call is recorded").observation_json, answers[1].1);
}

#[tokio::test]
async fn the_injections_a_turn_triggers_follow_all_of_its_tool_messages() {
    let dir = tempfile::tempdir().unwrap();
    let runner = turn_runner(dir.path());
    let mut episode = runner.start(bare_input("two"), dir.path()).unwrap();
    assert!(episode.advance(&runner).unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    episode.act(&runner, &turn(&[("a", "note"), ("b", "note")]), deadline).await.unwrap();
    // Before: [tool, user, tool], a user message between one turn's answers.
    assert_eq!(after_the_turn(episode.messages()).iter().map(role).collect::<Vec<_>>(), ["tool", "tool", "user"]);
    assert_eq!(episode.take_delivered(), ["after-note"]);
    // Every turn that calls the tool gets it again (it used to fire once an episode).
    assert!(episode.advance(&runner).unwrap());
    episode.act(&runner, &turn(&[("c", "note")]), deadline).await.unwrap();
    assert_eq!(after_the_turn(episode.messages()).iter().map(role).collect::<Vec<_>>(), ["tool", "user"]);
    assert_eq!(episode.take_delivered(), ["after-note"]);

    // The trace keeps the conversation's order: the injection after both calls.
    let trace_path = episode.trace_path().to_path_buf();
    episode.cancel("done".into()).unwrap();
    episode.finish(&runner).unwrap();
    let order: Vec<String> = read_trace(&trace_path)
        .unwrap()
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::PlanStep(p)) => Some(format!("call {}", p.call_id)),
            Some(Body::Injection(i)) => Some(format!("injection {}", i.id)),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["call a", "call b", "injection after-note", "call c", "injection after-note"]);
}

#[tokio::test]
async fn a_call_cut_off_by_the_plan_step_deadline_is_counted_as_rolled_back_with_the_time_it_ran() {
    let dir = tempfile::tempdir().unwrap();
    let runner = turn_runner(dir.path());
    let metrics = runner.metrics.clone().unwrap();
    metrics.declare_tools(["note", "hang"]);
    let mut episode = runner.start(bare_input("slow"), dir.path()).unwrap();
    assert!(episode.advance(&runner).unwrap());
    // The plan step's timeout is 30 s, but most of it went before the call.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
    let report = episode.act(&runner, &turn(&[("h", "hang")]), deadline).await.unwrap();
    assert_eq!(report.calls[0].status, StepStatus::RolledBack);
    let latency = report.calls[0].latency;
    // Before: the whole plan-step timeout, 30 s.
    assert!(latency >= Duration::from_millis(250) && latency < Duration::from_secs(10), "{latency:?}");

    // Before: never observed, so the rolled_back series stayed at 0.
    let text = metrics.encode();
    assert!(text.contains(r#"basecamp_sandbox_tool_calls_total{tool="hang",status="rolled_back"} 1"#), "{text}");
    assert!(text.contains(r#"basecamp_sandbox_tool_call_duration_seconds_count{tool="hang"} 1"#), "{text}");
    let sum: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"basecamp_sandbox_tool_call_duration_seconds_sum{tool="hang"} "#))
        .expect("the latency sum of hang")
        .parse()
        .unwrap();
    assert!((sum - latency.as_secs_f64()).abs() < 1e-3, "{sum} vs {latency:?}");

    let trace_path = episode.trace_path().to_path_buf();
    episode.cancel("done".into()).unwrap();
    episode.finish(&runner).unwrap();
    let recorded = read_trace(&trace_path).unwrap().records.iter().find_map(|r| match &r.body {
        Some(Body::PlanStep(p)) if p.call_id == "h" => Some(p.latency_micros),
        _ => None,
    });
    assert_eq!(recorded, Some(latency.as_micros() as u64), "the trace records the same latency");
}
