//! Server mode over real HTTP on 127.0.0.1: an external trainer creates
//! episodes, steps them with actions, injects observations, closes them and
//! fetches their traces; the traces read back with the trace library and
//! match what driver mode writes for the same actions; every error answer.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use basecamp_sandbox::episode::{EpisodeInput, EpisodeRunner, InjectionWhen, LiveInjections, ScheduledInjection};
use basecamp_sandbox::executor::{Fallback, NullWrites, ToolDef, ToolExecutor};
use basecamp_sandbox::gym::{Gym, GymConfig, GymState, serve};
use basecamp_sandbox::policy::{ChatMessage, Policy, PolicyConfig, ScriptedConfig};
use basecamp_sandbox::rewards::{ComponentSpec, RewardCalculator, RewardSpec};
use basecamp_sandbox::tools::exec::ExecTool;
use basecamp_sandbox::tools::recorded::{RecordedTool, parse_fixture};
use basecamp_sandbox::tools::{Tool, ToolError, ToolOutput};
use basecamp_trace::pb::{Header, InjectionTrigger, Outcome, StepStatus, record::Body};
use basecamp_trace::{MemoryPatch, Tail, TraceContents, read_trace, read_trace_from};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const SCRIPT: &str = r#"{"episode": "ok", "turns": [{"tool_calls": [{"name": "tracking_api", "arguments": {"order_id": "A-1"}}]}, {"content": "It ships tomorrow."}]}
"#;

const FIXTURE: &str = r#"{"tool": "tracking_api", "arguments": {"order_id": "A-1"}, "response": {"observation": {"status": "in_transit"}, "memory": {"shipping_status": "in_transit"}}}
{"tool": "tracking_api", "arguments": {"order_id": "SLOW"}, "response": {"status": "late"}, "latency_ms": 2000}
"#;

/// A runner with a recorded tool (with a fallback), two exec tools (one that
/// never answers), an after-tool injection and rewards.
fn runner(dir: &Path) -> EpisodeRunner {
    let script = dir.join("policy.jsonl");
    std::fs::write(&script, SCRIPT).unwrap();
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    let mut executor = ToolExecutor::new(NullWrites::Warn);
    executor.add_tool(
        "tracking_api",
        ToolDef {
            tool: Tool::Recorded(RecordedTool::new("tracking_api", parse_fixture("fixture.jsonl", FIXTURE).unwrap())),
            timeout: Duration::from_millis(300),
            fallback: Some(Fallback {
                observation: json!({"status": "unknown"}),
                memory_patch: MemoryPatch::default().set("shipping_status", json!("pending")),
            }),
            memory_map: Vec::new(),
        },
    );
    let py = |code: &str| Tool::Exec(ExecTool::new(vec!["python3".into(), "-c".into(), code.into()]));
    executor.add_tool(
        "note",
        ToolDef::new(
            py("import json,sys; a=json.load(sys.stdin); print(json.dumps({'observation': 'noted', 'memory': a}))"),
            Duration::from_secs(5),
        ),
    );
    executor.add_tool("hang", ToolDef::new(py("import time; time.sleep(60)"), Duration::from_secs(30)));
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
        tools: vec![basecamp_sandbox::policy::ToolSpec::new(
            "tracking_api",
            "Look up an order.",
            json!({"type": "object", "properties": {"order_id": {"type": "string"}}}),
        )],
        system_prompt: Some("You are a support agent.".into()),
        max_steps: 4,
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

fn row(id: &str) -> EpisodeInput {
    EpisodeInput {
        id: id.into(),
        messages: vec![ChatMessage::user("Where is my order?")],
        initial_memory: json!({"order_id": "A-1"}).as_object().cloned().unwrap(),
        expected_calls: vec![("tracking_api".into(), json!({"order_id": "A-1"}).as_object().cloned().unwrap(), None)],
        expected_memory: Some(json!({"shipping_status": "in_transit"}).as_object().cloned().unwrap()),
        expected_memory_hash: None,
        row_id: Some(id.into()),
    }
}

struct TestServer {
    addr: SocketAddr,
    gym: GymState,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
    dir: tempfile::TempDir,
}

impl TestServer {
    async fn start(max_episodes: usize, idle_timeout: Duration) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), max_episodes, idle_timeout, Duration::from_secs(60)).await
    }

    /// A server whose traces go to `dir`/traces (where an earlier one's may be).
    async fn start_in(
        dir: tempfile::TempDir,
        max_episodes: usize,
        idle_timeout: Duration,
        keep_closed: Duration,
    ) -> Self {
        Self::start_with(dir, max_episodes, idle_timeout, keep_closed, |_| {}).await
    }

    /// As [`TestServer::start_in`], the runner changed by `adjust` first.
    async fn start_with(
        dir: tempfile::TempDir,
        max_episodes: usize,
        idle_timeout: Duration,
        keep_closed: Duration,
        adjust: impl FnOnce(&mut EpisodeRunner),
    ) -> Self {
        let mut runner = runner(dir.path());
        adjust(&mut runner);
        let gym = Gym::new(GymConfig {
            runner,
            rows: vec![row("ok")],
            test_set_name: "tests.jsonl".into(),
            compare_args: Default::default(),
            out_dir: dir.path().join("traces"),
            max_episodes,
            idle_timeout,
            keep_closed,
        })
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, gym.clone(), async move {
            let _ = stopped.await;
        }));
        Self { addr, gym, stop: Some(stop), task, dir }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let response = client().post(self.url(path)).body(body.to_string()).send().await.unwrap();
        json_answer(response).await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        json_answer(client().get(self.url(path)).send().await.unwrap()).await
    }

    async fn trace(&self, episode: &str) -> TraceContents {
        self.trace_at(&format!("/v1/episodes/{episode}")).await
    }

    /// The trace of the episode at `path` (`/v1/episodes/<id, URL-encoded>`).
    async fn trace_at(&self, path: &str) -> TraceContents {
        let response = client().get(self.url(&format!("{path}/trace"))).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(response.headers()["content-type"], "application/octet-stream");
        let bytes = response.bytes().await.unwrap();
        read_trace_from(&bytes[..], path).unwrap()
    }

    /// Stops the server; the directory of its traces lives on in the answer.
    async fn shut_down(mut self) -> tempfile::TempDir {
        drop(self.stop.take());
        let result = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        result.expect("the server stops after the shutdown signal").unwrap().unwrap();
        self.dir
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap()
}

async fn json_answer(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("the answer is not JSON ({e}): {text}"));
    (status, value)
}

/// Asserts an error answer: status, category, and words of the message.
fn assert_error(answer: &(u16, Value), status: u16, category: &str, words: &str) {
    let (got, body) = answer;
    assert_eq!(*got, status, "{body}");
    assert_eq!(body["error"]["category"], category, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_else(|| panic!("no message: {body}"));
    assert!(message.contains(words), "{message:?} does not say {words:?}");
}

/// A plan step as compared across modes: tool, call id, input and result
/// hashes, status, memory hash after.
type PlanStepRow = (String, String, Vec<u8>, Vec<u8>, i32, Vec<u8>);

fn kind(body: &Body) -> String {
    format!("{body:?}").split('(').next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_full_episode_over_http_observes_steps_injects_rewards_and_traces() {
    let server = TestServer::start(4, Duration::from_secs(60)).await;

    let (status, created) = server.post("/v1/episodes", r#"{"row_id": "ok"}"#).await;
    assert_eq!(status, 201, "{created}");
    let id = created["episode_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("ok-"), "a generated id names its row: {id}");
    assert_eq!(created["row_id"], "ok");
    assert_eq!(created["step"], 1);
    assert_eq!(created["done"], false);
    assert_eq!((&created["terminated"], &created["truncated"]), (&json!(false), &json!(false)));
    assert_eq!(created["memory"], json!({"order_id": "A-1"}));
    assert_eq!(
        created["observation"]["messages"],
        json!([{"role": "system", "content": "You are a support agent."}, {"role": "user", "content": "Where is my order?"}])
    );
    assert_eq!(created["observation"]["tools"][0]["function"]["name"], "tracking_api");

    // A live injection while the episode waits for its first action is delivered at once.
    let (status, injected) = server
        .post(&format!("/v1/episodes/{id}/inject"), r#"{"observation": {"notice": "carrier strike"}, "id": "ops-1"}"#)
        .await;
    assert_eq!(status, 202, "{injected}");
    assert_eq!(injected["delivered_at_step"], 1);
    assert_eq!(
        injected["observation"]["messages"],
        json!([{"role": "user", "content": "[injected observation ops-1] {\"notice\":\"carrier strike\"}"}])
    );
    // One for a later step waits for it.
    let (status, later) =
        server.post(&format!("/v1/episodes/{id}/inject"), r#"{"observation": "hurry", "at_step": 2}"#).await;
    assert_eq!(status, 202, "{later}");
    assert_eq!(later["delivered_at_step"], Value::Null);
    let later_id = later["id"].as_str().unwrap().to_string();

    let (status, stepped) = server
        .post(
            &format!("/v1/episodes/{id}/step"),
            r#"{"tool_calls": [{"name": "tracking_api", "arguments": {"order_id": "A-1"}}]}"#,
        )
        .await;
    assert_eq!(status, 200, "{stepped}");
    assert_eq!(stepped["done"], false);
    assert_eq!((&stepped["terminated"], &stepped["truncated"]), (&json!(false), &json!(false)), "gymnasium's pair");
    assert_eq!(stepped["reward"], 0.0);
    let info = &stepped["info"];
    assert_eq!(info["step"], 1);
    assert_eq!(info["status"], "ok");
    assert_eq!(info["error_type"], Value::Null);
    assert_eq!(info["memory_delta_keys"], json!(["shipping_status"]));
    assert!(info["latency_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(info["calls"][0]["call_id"], "call_0_0");
    assert_eq!(info["injections"], json!(["policy-note", later_id]), "after-tool, then the one due at step 2");
    let messages = stepped["observation"]["messages"].as_array().unwrap();
    assert_eq!(
        messages[0],
        json!({"role": "tool", "tool_call_id": "call_0_0", "content": "{\"status\":\"in_transit\"}"})
    );
    assert_eq!(messages.len(), 3, "tool result, after-tool injection, step-2 injection: {messages:?}");
    assert_eq!(stepped["observation"]["memory"], json!({"order_id": "A-1", "shipping_status": "in_transit"}));

    let (status, last) = server.post(&format!("/v1/episodes/{id}/step"), r#"{"content": "It ships tomorrow."}"#).await;
    assert_eq!(status, 200, "{last}");
    assert_eq!(last["done"], true);
    assert_eq!((&last["terminated"], &last["truncated"]), (&json!(true), &json!(false)), "the agent's own end");
    let reward = last["reward"].as_f64().unwrap();
    assert!((reward - (0.7 - 0.3 * 2.0 / 4.0)).abs() < 1e-9, "{reward}");
    assert_eq!(last["info"]["outcome"], "completed");

    assert_error(
        &server.post(&format!("/v1/episodes/{id}/step"), r#"{"content": "again"}"#).await,
        409,
        "EpisodeDone",
        "ended completed at step 2",
    );
    assert_error(
        &server.post(&format!("/v1/episodes/{id}/inject"), r#"{"observation": 1}"#).await,
        409,
        "EpisodeFinished",
        "already finished",
    );

    let (status, closed) = server.post(&format!("/v1/episodes/{id}/close"), "").await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["episode_id"], id.as_str());
    assert_eq!(closed["outcome"], "completed");
    assert_eq!(closed["metrics"]["tool_call_accuracy"], 1.0);
    assert_eq!(closed["metrics"]["memory_consistency"], 1.0);
    assert_eq!(closed["reward"], last["reward"]);
    let (_, again) = server.post(&format!("/v1/episodes/{id}/close"), "").await;
    assert_eq!(again, closed, "closing twice answers the same metrics");

    let trace = server.trace(&id).await;
    assert!(matches!(trace.tail, Tail::Complete), "{:?}", trace.tail);
    assert_eq!(trace.header.episode_id, id);
    let injections: Vec<(u32, String, i32)> = trace
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::Injection(i)) => Some((r.step, i.id.clone(), i.trigger)),
            _ => None,
        })
        .collect();
    assert_eq!(
        injections,
        vec![
            (1, "ops-1".to_string(), InjectionTrigger::Live as i32),
            (1, "policy-note".to_string(), InjectionTrigger::AfterTool as i32),
            (2, later_id.clone(), InjectionTrigger::Live as i32),
        ]
    );
    let Some(Body::EpisodeEnd(end)) = trace.records.last().and_then(|r| r.body.as_ref()) else {
        panic!("the trace ends with the episode end")
    };
    assert_eq!(end.outcome, Outcome::Completed as i32);
    assert_eq!(end.final_answer, "It ships tomorrow.");
    assert!(
        trace
            .records
            .iter()
            .any(|r| matches!(&r.body, Some(Body::RewardSignal(s)) if (s.weighted_sum - reward).abs() < 1e-9))
    );

    let (status, listed) = server.get("/v1/episodes").await;
    assert_eq!(status, 200);
    assert_eq!(listed["open"], 0);
    assert_eq!(listed["episodes"][0]["episode_id"], id.as_str());
    assert_eq!(listed["episodes"][0]["state"], "completed");
    assert_eq!(listed["episodes"][0]["closed"], true);

    let metrics = client().get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"basecamp_sandbox_injections_total{trigger="live"} 2"#), "{metrics}");
    assert!(metrics.contains(r#"basecamp_sandbox_episodes_total{outcome="completed"} 1"#), "{metrics}");
    server.shut_down().await;
}

#[tokio::test]
async fn a_driver_episode_and_its_actions_replayed_through_the_api_write_the_same_trace() {
    let driver_dir = tempfile::tempdir().unwrap();
    let driven = runner(driver_dir.path()).run(&row("ok"), driver_dir.path()).await.unwrap();
    assert_eq!(driven.outcome, "completed");
    let driver_trace = read_trace(driver_dir.path().join("ok.trace")).unwrap();

    let server = TestServer::start(4, Duration::from_secs(60)).await;
    let (status, created) = server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "ok"}"#).await;
    assert_eq!(status, 201, "{created}");
    for action in [
        r#"{"tool_calls": [{"name": "tracking_api", "arguments": {"order_id": "A-1"}}]}"#,
        r#"{"content": "It ships tomorrow."}"#,
    ] {
        let (status, answer) = server.post("/v1/episodes/ok/step", action).await;
        assert_eq!(status, 200, "{answer}");
    }
    let (_, closed) = server.post("/v1/episodes/ok/close", "").await;
    assert_eq!(closed["metrics"]["tool_call_accuracy"], driven.metrics.tool_call_accuracy);
    assert_eq!(closed["reward"], json!(driven.metrics.reward.unwrap()));
    let served_trace = server.trace("ok").await;

    let shape = |t: &TraceContents| -> Vec<(u32, String)> {
        t.records.iter().filter_map(|r| r.body.as_ref().map(|b| (r.step, kind(b)))).collect()
    };
    assert_eq!(shape(&served_trace), shape(&driver_trace), "the same record kinds at the same steps, in order");
    let calls = |t: &TraceContents| -> Vec<PlanStepRow> {
        t.records
            .iter()
            .filter_map(|r| match &r.body {
                Some(Body::PlanStep(p)) => Some((
                    p.tool.clone(),
                    p.call_id.clone(),
                    p.input_hash.clone(),
                    p.result_hash.clone(),
                    p.status,
                    p.memory_hash_after.clone(),
                )),
                _ => None,
            })
            .collect()
    };
    assert_eq!(calls(&served_trace), calls(&driver_trace), "the same calls, hashes and statuses");
    assert_eq!(calls(&served_trace).len(), 2);
    assert_eq!(served_trace.header.task, driver_trace.header.task);
    server.shut_down().await;
}

#[tokio::test]
async fn an_exec_tool_past_the_plan_step_deadline_is_rolled_back_and_reported() {
    let server = TestServer::start(4, Duration::from_secs(60)).await;
    let (status, created) = server
        .post("/v1/episodes", r#"{"instruction": "Note this and wait.", "initial_memory": {"order_id": "A-1"}, "expected_tool_calls": [{"name": "note", "arguments": {"k": "v"}}]}"#)
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["episode_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("episode-"), "{id}");
    assert_eq!(created["row_id"], Value::Null);
    let (status, stepped) = server
        .post(
            &format!("/v1/episodes/{id}/step"),
            r#"{"tool_calls": [{"name": "note", "arguments": {"k": "v"}}, {"name": "hang", "arguments": "{}"}]}"#,
        )
        .await;
    assert_eq!(status, 200, "{stepped}");
    let info = &stepped["info"];
    assert_eq!(info["status"], "rolled_back");
    assert_eq!(info["error_type"], "plan_step_timeout");
    assert_eq!(info["plan_step_timed_out"], true);
    assert_eq!(info["calls"][0]["memory_delta_keys"], json!(["k"]), "the exec tool's memory patch");
    assert_eq!(stepped["observation"]["memory"], json!({"order_id": "A-1"}), "rolled back to the checkpoint");
    assert_eq!(stepped["done"], false);

    // An unknown tool is the executor's refusal, recorded, not a bad request.
    let (status, refused) =
        server.post(&format!("/v1/episodes/{id}/step"), r#"{"tool_calls": [{"name": "teleport"}]}"#).await;
    assert_eq!(status, 200, "{refused}");
    assert_eq!(refused["info"]["status"], "refused");
    assert_eq!(refused["info"]["error_type"], "unknown_tool");

    let (_, closed) = server.post(&format!("/v1/episodes/{id}/close"), "").await;
    assert_eq!(closed["outcome"], "cancelled");
    assert_eq!(closed["failure_class"], "plan_step_timeout");
    assert_eq!(closed["truncated"], true, "closed before its end: its reward is no score");
    assert_eq!(closed["rollbacks"], 1);
    assert!(closed["error"].as_str().unwrap().contains("closed by the client at step 3"), "{closed}");
    let trace = server.trace(&id).await;
    assert!(matches!(trace.tail, Tail::Complete));
    assert!(trace.records.iter().any(
        |r| matches!(&r.body, Some(Body::PlanStep(p)) if p.tool == "hang" && p.status == StepStatus::RolledBack as i32)
    ));
    let Some(Body::EpisodeEnd(end)) = trace.records.last().and_then(|r| r.body.as_ref()) else { panic!("no end") };
    assert_eq!(end.outcome, Outcome::Cancelled as i32);
    // Step 3 had begun and was never played: the close ends it in the trace, saying why (before:
    // the step had no end, so `trace validate` failed every trace closed early).
    let cancelled = trace.records.iter().find_map(|r| match &r.body {
        Some(Body::ErrorContext(e)) if r.step == 3 => Some(e),
        _ => None,
    });
    let cancelled = cancelled.expect("an error context ends step 3");
    assert_eq!(trace.header.row_id, "", "given inline: no row");
    assert_eq!(cancelled.error_type, "cancelled");
    assert!(cancelled.message.contains("closed by the client at step 3"), "{}", cancelled.message);
    let path = server.dir.path().join("traces").join(format!("{id}.trace"));
    assert_eq!(basecamp_trace::validate::validate_file(&path), vec![], "{}", path.display());
    assert!(server.dir.path().join("traces").join(format!("{id}.rollback_trace.json")).exists());
    server.shut_down().await;
}

#[tokio::test]
async fn a_step_without_tool_calls_reports_a_latency_of_zero_never_negative_zero() {
    let server = TestServer::start(4, Duration::from_secs(60)).await;
    let (status, _) = server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "answer"}"#).await;
    assert_eq!(status, 201);
    let response = client()
        .post(server.url("/v1/episodes/answer/step"))
        .body(r#"{"content": "It ships tomorrow."}"#)
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    // Before: `"latency_ms":-0.0`, the f64 sum of no calls.
    assert!(!text.contains(r#""latency_ms":-0.0"#), "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    let latency = answer["info"]["latency_ms"].as_f64().unwrap();
    assert!(latency == 0.0 && latency.is_sign_positive(), "{text}");
    assert_eq!(answer["info"]["calls"], json!([]), "{text}");
    // The header names the test-set row, which `trace replay` starts the episode from.
    let header = server.trace("answer").await.header;
    assert_eq!((header.episode_id.as_str(), header.row_id.as_str()), ("answer", "ok"));
    server.shut_down().await;
}

#[tokio::test]
async fn episode_ids_that_are_not_file_names_get_traces_of_their_own_inside_the_output_directory() {
    let server = TestServer::start(8, Duration::from_secs(60)).await;
    let long = "x/".repeat(120);
    let ids = ["../../x", "a/b", "a_b", "a~2Fb", ".hidden", "订单 7", long.as_str()];
    let mut files = Vec::new();
    for id in ids {
        let body = json!({"row_id": "ok", "episode_id": id}).to_string();
        let (status, created) = server.post("/v1/episodes", &body).await;
        assert_eq!(status, 201, "{id}: {created}");
        let path =
            format!("/v1/episodes/{}", percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC));
        let (status, closed) = server.post(&format!("{path}/close"), "").await;
        assert_eq!(status, 200, "{id}: {closed}");
        let file = closed["trace_file"].as_str().unwrap().to_string();
        assert!(!file.starts_with('.') && !file.contains('/') && file.len() < 255, "{id}: {file}");
        // The file under the output directory is this episode's, and the API serves it.
        let trace = read_trace(server.gym.out_dir().join(&file)).unwrap();
        assert_eq!(trace.header.episode_id, id);
        assert_eq!(server.trace_at(&path).await.header.episode_id, id);
        files.push(file);
    }
    // Before: `a/b` and `a_b` were both a_b.trace (the second truncated the first), and
    // `../../x` was `.._.._x.trace`.
    assert_eq!(files[0], "~2E.~2F..~2Fx.trace");
    assert_eq!(files[1], "a~2Fb.trace");
    assert_eq!(files[2], "a_b.trace");
    let distinct: std::collections::BTreeSet<&String> = files.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "{files:?}");
    let listed: Vec<String> = std::fs::read_dir(server.gym.out_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".trace"))
        .collect();
    assert_eq!(listed.len(), ids.len(), "every trace is in the output directory: {listed:?}");
    server.shut_down().await;
}

#[tokio::test]
async fn the_last_step_allowed_ends_the_episode_at_max_steps() {
    let server = TestServer::start(4, Duration::from_secs(60)).await;
    let (_, created) = server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "loop"}"#).await;
    assert_eq!(created["episode_id"], "loop");
    let action = r#"{"tool_calls": [{"name": "tracking_api", "arguments": {"order_id": "A-1"}}]}"#;
    let with_logprobs = r#"{"tool_calls": [{"name": "tracking_api", "arguments": {"order_id": "A-1"}}], "model": "trainee", "logprobs": [{"token": "track", "logprob": -0.1, "token_id": 7, "top_logprobs": [{"token": "track", "logprob": -0.1, "token_id": 7}, {"token": "look", "logprob": -2.5}]}, {"token": "ing", "logprob": -0.01}]}"#;
    for step in 1..=4 {
        let body = if step == 1 { with_logprobs } else { action };
        let (status, answer) = server.post("/v1/episodes/loop/step", body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["done"], step == 4, "step {step}: {answer}");
    }
    let (_, listed) = server.get("/v1/episodes/loop").await;
    assert_eq!(listed["state"], "max_steps");
    assert_eq!(listed["result"]["metrics"]["steps"], 4);
    let missing = listed["result"]["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w.as_str().unwrap().contains("without logprobs"));
    assert_eq!(missing.count(), 3, "steps 2-4 came without logprobs: {listed}");
    let trace = server.trace("loop").await;
    let logits: Vec<(u32, String, i32, Vec<String>)> = trace
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::TokenLogit(t)) => {
                Some((r.step, t.token.to_string(), t.token_id, t.top_tokens.iter().map(|t| t.to_string()).collect()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        logits,
        vec![
            (1, "track".to_string(), 7, vec!["track".to_string(), "look".to_string()]),
            (1, "ing".to_string(), -1, vec![])
        ]
    );
    let models: Vec<String> = trace
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::PolicyTurn(p)) => Some(p.model.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(models, ["trainee", "external", "external", "external"]);
    server.shut_down().await;
}

#[tokio::test]
async fn every_error_has_its_status_category_and_a_message_naming_the_problem() {
    let server = TestServer::start(2, Duration::from_secs(60)).await;
    for (method, path) in [
        ("POST", "/v1/episodes/nope/step"),
        ("POST", "/v1/episodes/nope/inject"),
        ("POST", "/v1/episodes/nope/close"),
        ("GET", "/v1/episodes/nope/trace"),
        ("GET", "/v1/episodes/nope"),
    ] {
        let request = if method == "GET" { client().get(server.url(path)) } else { client().post(server.url(path)) };
        let answer = json_answer(request.body(r#"{"content": "x"}"#).send().await.unwrap()).await;
        assert_error(&answer, 404, "UnknownEpisode", "no episode \"nope\"");
    }
    for (body, category, words) in [
        (
            r#"{"row_id": "missing"}"#,
            "UnknownTestSetRow",
            "row_id: no row \"missing\" in the test set tests.jsonl (1 rows: ok)",
        ),
        (r#"{"row": "ok"}"#, "InvalidEpisodeRequest", "row: unknown field"),
        (r#"{}"#, "InvalidEpisodeRequest", "row_id: missing"),
        (r#"{"row_id": "ok", "messages": []}"#, "InvalidEpisodeRequest", "messages: give either `row_id`"),
        (
            r#"{"instruction": "hi", "expected_tool_calls": [{"arguments": {}}]}"#,
            "InvalidEpisodeRequest",
            "expected_tool_calls[0]",
        ),
        (r#"{"instruction": "hi", "episode_id": ""}"#, "InvalidEpisodeRequest", "episode_id is empty"),
        ("{\"row_id\": ", "InvalidEpisodeRequest", "body: not valid JSON at line 1 column 11"),
    ] {
        assert_error(&server.post("/v1/episodes", body).await, 400, category, words);
    }

    let (status, _) = server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "a"}"#).await;
    assert_eq!(status, 201);
    assert_error(
        &server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "a"}"#).await,
        409,
        "EpisodeExists",
        "episode \"a\" exists already",
    );
    for (body, words) in [
        (r#"{"tool_calls": [{"arguments": {}}]}"#, "tool_calls[0].name: missing"),
        (r#"{"tool_calls": "tracking_api"}"#, "tool_calls: is a string, not an array"),
        (r#"{"content": 3}"#, "content: is a number, not a string"),
        (r#"{"say": "hi"}"#, "say: unknown field"),
        ("{", "body: not valid JSON"),
    ] {
        assert_error(&server.post("/v1/episodes/a/step", body).await, 400, "InvalidAction", words);
    }
    assert_error(
        &server.post("/v1/episodes/a/inject", r#"{"observation": null}"#).await,
        400,
        "InvalidInjection",
        "`observation` is null",
    );
    // Past the last step the episode may take (maxSteps 4): it was accepted and never delivered.
    assert_error(
        &server.post("/v1/episodes/a/inject", r#"{"observation": "late", "at_step": 99}"#).await,
        400,
        "InvalidInjection",
        "`at_step` is 99, but episode \"a\" ends by step 4 (its sandbox's maxSteps)",
    );
    let (_, state) = server.get("/v1/episodes/a").await;
    assert_eq!(state["step"], 1, "a refused action plays nothing: {state}");

    let (status, _) = server.post("/v1/episodes", r#"{"row_id": "ok"}"#).await;
    assert_eq!(status, 201);
    assert_error(
        &server.post("/v1/episodes", r#"{"row_id": "ok"}"#).await,
        429,
        "TooManyEpisodes",
        "2 episodes are open, the limit is 2",
    );
    let (status, _) = server.post("/v1/episodes/a/close", "").await;
    assert_eq!(status, 200);
    let (status, created) = server.post("/v1/episodes", r#"{"row_id": "ok"}"#).await;
    assert_eq!(status, 201, "a closed episode frees its place: {created}");

    assert_error(&server.get("/v2/anything").await, 404, "NoSuchEndpoint", "POST /v1/episodes/{id}/step");
    let answer = json_answer(client().delete(server.url("/v1/episodes")).send().await.unwrap()).await;
    assert_error(&answer, 405, "MethodNotAllowed", "does not serve that method");
    server.shut_down().await;
}

#[tokio::test]
async fn an_idle_episode_is_closed_as_cancelled_and_frees_its_place() {
    let server = TestServer::start(1, Duration::from_millis(300)).await;
    let (status, _) = server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "idle"}"#).await;
    assert_eq!(status, 201);
    let mut closed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (_, state) = server.get("/v1/episodes/idle").await;
        if state["closed"] == true {
            assert_eq!(state["state"], "cancelled", "{state}");
            assert!(state["result"]["error"].as_str().unwrap().contains("the idle timeout"), "{state}");
            closed = true;
            break;
        }
    }
    assert!(closed, "the idle episode was never closed");
    assert_error(
        &server.post("/v1/episodes/idle/step", r#"{"content": "late"}"#).await,
        409,
        "EpisodeDone",
        "ended cancelled",
    );
    let (status, _) = server.post("/v1/episodes", r#"{"row_id": "ok"}"#).await;
    assert_eq!(status, 201, "the place was freed");
    let trace = server.trace("idle").await;
    assert!(matches!(trace.tail, Tail::Complete));
    server.shut_down().await;
}

#[tokio::test]
async fn shutting_down_completes_the_traces_of_open_episodes() {
    let server = TestServer::start(4, Duration::from_secs(60)).await;
    let (status, _) = server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "open"}"#).await;
    assert_eq!(status, 201);
    let gym = server.gym.clone();
    let dir = server.shut_down().await;
    let trace = read_trace(dir.path().join("traces").join("open.trace")).unwrap();
    assert!(matches!(trace.tail, Tail::Complete), "{:?}", trace.tail);
    let Some(Body::EpisodeEnd(end)) = trace.records.last().and_then(|r| r.body.as_ref()) else { panic!("no end") };
    assert_eq!(end.outcome, Outcome::Cancelled as i32);
    let metrics = gym.metrics().encode_prometheus_text();
    assert!(metrics.contains(r#"basecamp_sandbox_episodes_total{outcome="cancelled"} 1"#), "{metrics}");
}

#[tokio::test]
async fn a_restarted_server_keeps_the_traces_of_the_one_before_and_numbers_past_them() {
    let first = TestServer::start(4, Duration::from_secs(60)).await;
    let (status, created) = first.post("/v1/episodes", r#"{"row_id": "ok"}"#).await;
    assert_eq!((status, created["episode_id"].as_str()), (201, Some("ok-1")), "{created}");
    let (status, _) = first.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "mine"}"#).await;
    assert_eq!(status, 201);
    let dir = first.shut_down().await;
    let traces = dir.path().join("traces");
    let read = |file: &str| std::fs::read(traces.join(file)).unwrap();
    let before = (read("ok-1.trace"), read("mine.trace"));

    // Before: the second server counted from 1 again and truncated ok-1.trace,
    // and took `mine` again over the first one's trace.
    let second = TestServer::start_in(dir, 4, Duration::from_secs(60), Duration::from_secs(60)).await;
    let (status, created) = second.post("/v1/episodes", r#"{"row_id": "ok"}"#).await;
    assert_eq!((status, created["episode_id"].as_str()), (201, Some("ok-2")), "{created}");
    assert_error(
        &second.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "mine"}"#).await,
        409,
        "EpisodeExists",
        "of this server or one before it: kept, never overwritten",
    );
    assert_eq!(second.get("/v1/episodes/mine").await.0, 404, "a refused episode is not held");
    let (_, listed) = second.get("/v1/episodes").await;
    assert_eq!(listed["open"], 1, "{listed}");
    let dir = second.shut_down().await;
    let traces = dir.path().join("traces");
    let read = |file: &str| std::fs::read(traces.join(file)).unwrap();
    assert!(before == (read("ok-1.trace"), read("mine.trace")), "the first server's traces are untouched");
    assert_eq!(read_trace(traces.join("ok-2.trace")).unwrap().header.episode_id, "ok-2");
}

#[tokio::test]
async fn a_closed_episode_is_forgotten_after_keep_closed_and_its_trace_is_still_served() {
    // Before: every episode stayed held for the life of the server (~1.8 KB
    // each, and in every listing): a trainer's millions of episodes grew it
    // without bound.
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(dir, 4, Duration::from_secs(60), Duration::from_millis(200)).await;
    let (status, _) = server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "gone"}"#).await;
    assert_eq!(status, 201);
    let (status, closed) = server.post("/v1/episodes/gone/close", "{}").await;
    assert_eq!(status, 200, "{closed}");
    let mut forgotten = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let answer = server.get("/v1/episodes/gone").await;
        if answer.0 == 404 {
            forgotten = Some(answer);
            break;
        }
    }
    let forgotten = forgotten.expect("the closed episode is forgotten within 5 s");
    assert_error(
        &forgotten,
        404,
        "UnknownEpisode",
        "is closed and no longer held (a closed episode is held for 200 ms",
    );
    let (_, listed) = server.get("/v1/episodes").await;
    assert_eq!(listed["episodes"], json!([]), "{listed}");
    let response = client().get(server.url("/v1/episodes/gone/trace")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["x-basecamp-trace-complete"], "true");
    let trace = read_trace_from(&response.bytes().await.unwrap()[..], "gone").unwrap();
    assert!(matches!(trace.tail, Tail::Complete));
    assert_eq!(trace.header.episode_id, "gone");
    assert_error(
        &server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "gone"}"#).await,
        409,
        "EpisodeExists",
        "has a trace in",
    );
    assert_error(&server.get("/v1/episodes/never/trace").await, 404, "UnknownEpisode", "no episode \"never\" here");
    server.shut_down().await;
}

// ---- the `serve` subcommand --------------------------------------------------

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
  maxSteps: 4
  planStepTimeout: 5s
  rewards:
    components:
      correctness: {weight: 1.0, source: tool_call_accuracy}
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
    endpoint: http://127.0.0.1:9/v1
    model: trained-elsewhere
    apiKeyEnv: BASECAMP_GYM_TEST_KEY_THAT_IS_NEVER_SET
  sandboxRef: {name: tools}
"#;

const MANIFEST_FIXTURE: &str = r#"{"tool": "track_order", "arguments": {"order_id": "1"}, "observation": {"status": "in_transit"}}
"#;

const TESTS: &str = r#"{"id": "ep-1", "instruction": "Where is order 1?", "expected_tool_calls": [{"name": "track_order", "arguments": {"order_id": "1"}}], "expected_memory": {"shipping_status": "in_transit"}}
"#;

#[tokio::test]
async fn the_serve_command_serves_a_task_and_completes_open_traces_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("task.yaml"), MANIFEST).unwrap();
    std::fs::write(project.path().join("fixture.jsonl"), MANIFEST_FIXTURE).unwrap();
    std::fs::write(project.path().join("tests.jsonl"), TESTS).unwrap();
    let out = project.path().join("traces");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(["serve", "--config"])
        .arg(project.path())
        .args(["--listen", "127.0.0.1:0", "--max-episodes", "2", "--idle-timeout", "5m", "--out"])
        .arg(&out)
        .env_remove("BASECAMP_SANDBOX_LISTEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first_line).unwrap();
    let Some(base) = first_line.split_whitespace().find(|w| w.starts_with("http://")).map(str::to_string) else {
        let _ = child.kill();
        let output = child.wait_with_output().unwrap();
        panic!("no address in {first_line:?}; stderr: {}", String::from_utf8_lossy(&output.stderr))
    };
    let post = |path: &str, body: &str| {
        let request = client().post(format!("{base}{path}")).body(body.to_string());
        async move { json_answer(request.send().await.unwrap()).await }
    };

    let (status, created) = post("/v1/episodes", r#"{"row_id": "ep-1", "episode_id": "one"}"#).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["observation"]["messages"][0]["content"], "You are a support agent.");
    assert_eq!(created["observation"]["tools"][0]["function"]["name"], "track_order");
    let (status, stepped) =
        post("/v1/episodes/one/step", r#"{"tool_calls": [{"name": "track_order", "arguments": {"order_id": "1"}}]}"#)
            .await;
    assert_eq!(status, 200, "{stepped}");
    assert_eq!(stepped["observation"]["memory"], json!({"shipping_status": "in_transit"}));
    let (_, done) = post("/v1/episodes/one/step", r#"{"content": "In transit."}"#).await;
    assert_eq!((done["done"].clone(), done["reward"].clone()), (json!(true), json!(1.0)), "{done}");
    let (status, _) = post("/v1/episodes", r#"{"row_id": "ep-1", "episode_id": "left-open"}"#).await;
    assert_eq!(status, 201);

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for (file, outcome) in [("one.trace", Outcome::Completed), ("left-open.trace", Outcome::Cancelled)] {
        let trace = read_trace(out.join(file)).unwrap();
        assert!(matches!(trace.tail, Tail::Complete), "{file}: {:?}", trace.tail);
        let Some(Body::EpisodeEnd(end)) = trace.records.last().and_then(|r| r.body.as_ref()) else { panic!("{file}") };
        assert_eq!(end.outcome, outcome as i32, "{file}");
        assert_eq!(trace.header.task, "shipping");
    }
}

/// `serve --base-dir`: the manifests alone in one directory (a ConfigMap
/// mount), the files they name in another (the tools image's).
#[tokio::test]
async fn the_serve_command_resolves_relative_paths_against_base_dir() {
    use std::io::{BufRead, BufReader};
    let config = tempfile::tempdir().unwrap();
    let image = tempfile::tempdir().unwrap();
    std::fs::write(config.path().join("task.yaml"), MANIFEST).unwrap();
    std::fs::write(image.path().join("fixture.jsonl"), MANIFEST_FIXTURE).unwrap();
    std::fs::write(image.path().join("tests.jsonl"), TESTS).unwrap();
    let serve = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
            .args(["serve", "--config"])
            .arg(config.path())
            .args(["--listen", "127.0.0.1:0", "--out"])
            .arg(config.path().join("traces"))
            .args(extra)
            .current_dir(image.path())
            .env_remove("BASECAMP_SANDBOX_LISTEN")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };

    let refused = serve(&[]).wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains(&config.path().join("fixture.jsonl").display().to_string()), "{said}");

    let mut child = serve(&["--base-dir", "."]);
    let mut first_line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first_line).unwrap();
    let base = first_line.split_whitespace().find(|w| w.starts_with("http://")).map(str::to_string);
    let created = match &base {
        Some(base) => {
            let request = client().post(format!("{base}/v1/episodes")).body(r#"{"row_id": "ep-1"}"#);
            Some(json_answer(request.send().await.unwrap()).await)
        }
        None => None,
    };
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    let (status, body) = created
        .unwrap_or_else(|| panic!("no address in {first_line:?}; stderr: {}", String::from_utf8_lossy(&output.stderr)));
    assert_eq!(status, 201, "the test set was found under --base-dir: {body}");
}

/// The episode once no step is under way (a read answers at once, with the
/// state the step began from, while one is).
async fn settled(server: &TestServer, episode: &str) -> Value {
    for _ in 0..200 {
        let (status, state) = server.get(&format!("/v1/episodes/{episode}")).await;
        assert_eq!(status, 200, "{state}");
        if state["step_in_progress"].is_null() {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("a step of episode {episode} is still under way after 5 s")
}

/// The records of `trace` at `step`, by kind.
fn kinds_at(trace: &TraceContents, step: u32) -> Vec<String> {
    trace.records.iter().filter(|r| r.step == step).filter_map(|r| r.body.as_ref()).map(kind).collect()
}

#[tokio::test]
async fn a_client_gone_mid_step_leaves_the_step_played_whole() {
    let server = TestServer::start(4, Duration::from_secs(60)).await;
    assert_eq!(server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "gone"}"#).await.0, 201);
    // The recorded SLOW answer takes 2 s; the tool's timeout (300 ms) takes the fallback.
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(100)).build().unwrap();
    let body = r#"{"tool_calls": [{"name": "tracking_api", "arguments": {"order_id": "SLOW"}}]}"#;
    let sent = impatient.post(server.url("/v1/episodes/gone/step")).body(body).send().await;
    assert!(sent.is_err_and(|e| e.is_timeout()), "the client gives up before the step ends");
    // The step still ends, then the episode is at step 2 with the call answered.
    // Before: step 1 again, its turn recorded without its call, and the next action played as step 1.
    let state = settled(&server, "gone").await;
    assert_eq!(state["step"], 2, "{state}");
    let answered = state["messages"].as_array().unwrap().iter().any(|m| m["tool_call_id"] == "call_0_0");
    assert!(answered, "{state}");
    // The client's retry says which step it answers: refused, not played again as step 2.
    let (status, refused) =
        server.post("/v1/episodes/gone/step", &body.replace("{\"tool_calls\"", "{\"step\": 1, \"tool_calls\"")).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["category"], "StepMismatch", "{refused}");
    assert!(
        refused["error"]["message"].as_str().unwrap().starts_with("step: is 1, but the episode is at step 2"),
        "{refused}"
    );
    let (status, done) = server.post("/v1/episodes/gone/step", r#"{"step": 2, "content": "Status unknown."}"#).await;
    assert_eq!((status, &done["done"]), (200, &json!(true)), "{done}");
    let trace = server.trace("gone").await;
    assert!(matches!(trace.tail, Tail::Complete));
    let step_1 = kinds_at(&trace, 1);
    assert_eq!(step_1.iter().filter(|k| *k == "PolicyTurn").count(), 1, "{step_1:?}");
    assert!(step_1.iter().any(|k| k == "PlanStep"), "{step_1:?}");
    assert!(kinds_at(&trace, 2).iter().any(|k| k == "PolicyTurn"), "the final answer is step 2");
    server.shut_down().await;
}

#[tokio::test]
async fn shutting_down_cuts_off_a_step_under_way_as_driver_mode_does() {
    let server = TestServer::start(4, Duration::from_secs(60)).await;
    assert_eq!(server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "busy"}"#).await.0, 201);
    let url = server.url("/v1/episodes/busy/step");
    let step = tokio::spawn(async move {
        let body = r#"{"tool_calls": [{"name": "hang", "arguments": {}}]}"#;
        json_answer(client().post(url).body(body).send().await.unwrap()).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dir = server.shut_down().await;
    // The step's client hears how it ended: cut off, the episode cancelled.
    let (status, answer) = step.await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!((&answer["done"], &answer["info"]["outcome"]), (&json!(true), &json!("cancelled")), "{answer}");
    // Before: the shutdown waited for the step (the tool to its plan-step deadline), which was
    // then played whole; the episode was cancelled at step 2 afterwards.
    let trace = read_trace(dir.path().join("traces").join("busy.trace")).unwrap();
    assert!(matches!(trace.tail, Tail::Complete), "{:?}", trace.tail);
    let cut = trace.records.iter().find_map(|r| match &r.body {
        Some(Body::ErrorContext(e)) if e.error_type == "cancelled" => Some((r.step, e.message.clone())),
        _ => None,
    });
    assert_eq!(cut, Some((1, "stopped at step 1: the server shut down".to_string())));
}

/// A client that gives up long before a step under way could end: what it
/// asks must be answered without waiting for the step.
fn prompt_client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap()
}

/// `GET` with [`prompt_client`]; a timeout fails the test, saying where.
async fn get_promptly(server: &TestServer, path: &str, what: &str) -> (u16, Value) {
    let sent = prompt_client().get(server.url(path)).send().await;
    json_answer(sent.unwrap_or_else(|e| panic!("{what} waited behind the step under way: {e}"))).await
}

/// `POST` with [`prompt_client`]; a timeout fails the test, saying where.
async fn post_promptly(server: &TestServer, path: &str, body: &str, what: &str) -> (u16, Value) {
    let sent = prompt_client().post(server.url(path)).body(body.to_string()).send().await;
    json_answer(sent.unwrap_or_else(|e| panic!("{what} waited behind the step under way: {e}"))).await
}

/// Starts a step of `episode` that calls `hang` (it runs to the plan-step
/// deadline), and returns once a read says the step is under way.
async fn hang_a_step(server: &TestServer, episode: &str, step: u32) -> JoinHandle<(u16, Value)> {
    let url = server.url(&format!("/v1/episodes/{episode}/step"));
    let played = tokio::spawn(async move {
        let body = r#"{"tool_calls": [{"name": "hang", "arguments": {}}]}"#;
        json_answer(client().post(url).body(body).send().await.unwrap()).await
    });
    for _ in 0..100 {
        let (_, state) = get_promptly(server, &format!("/v1/episodes/{episode}"), "a read").await;
        if state["step_in_progress"] == step {
            return played;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("step {step} of {episode} never showed as under way")
}

#[tokio::test]
async fn a_step_under_way_holds_up_no_read_injection_or_close() {
    // Each `hang` step runs 4 s (the plan-step deadline), twice the prompt client's patience.
    let server = TestServer::start_with(
        tempfile::tempdir().unwrap(),
        4,
        Duration::from_secs(60),
        Duration::from_secs(60),
        |r| r.plan_step_timeout = Duration::from_secs(4),
    )
    .await;
    let (status, created) = server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "busy"}"#).await;
    assert_eq!(status, 201, "{created}");
    let first = hang_a_step(&server, "busy", 1).await;

    // Before: each of these waited for the step to end.
    let (status, state) = get_promptly(&server, "/v1/episodes/busy", "describe").await;
    assert_eq!(status, 200, "{state}");
    assert_eq!((&state["step"], &state["step_in_progress"], &state["done"]), (&json!(1), &json!(1), &json!(false)));
    assert_eq!(state["messages"], created["observation"]["messages"], "the state the step began from");
    assert_eq!(state["memory"], json!({"order_id": "A-1"}));
    let (_, listed) = get_promptly(&server, "/v1/episodes", "the listing").await;
    assert_eq!(listed["episodes"][0]["step_in_progress"], 1, "{listed}");
    let inject = |body: &'static str| post_promptly(&server, "/v1/episodes/busy/inject", body, "an injection");
    assert_error(
        &inject(r#"{"observation": "too late", "at_step": 1}"#).await,
        409,
        "StepInProgress",
        "`at_step` is 1, but episode \"busy\" is playing step 1",
    );
    let (status, queued) = inject(r#"{"observation": "hold on", "id": "next-turn"}"#).await;
    assert_eq!((status, &queued["delivered_at_step"]), (202, &Value::Null), "{queued}");
    let (status, queued) = inject(r#"{"observation": "step two", "at_step": 2, "id": "at-2"}"#).await;
    assert_eq!((status, &queued["delivered_at_step"]), (202, &Value::Null), "{queued}");

    // The step ends at its deadline; the injections queued meanwhile are delivered at step 2.
    let (status, stepped) = first.await.unwrap();
    assert_eq!(status, 200, "{stepped}");
    assert_eq!((&stepped["done"], &stepped["info"]["error_type"]), (&json!(false), &json!("plan_step_timeout")));
    assert_eq!(stepped["info"]["injections"], json!(["next-turn", "at-2"]), "{stepped}");
    let state = settled(&server, "busy").await;
    assert_eq!(state["step"], 2, "{state}");

    // A close cuts the step under way off where it stands, as the server's stop does.
    let second = hang_a_step(&server, "busy", 2).await;
    let (status, closed) = post_promptly(&server, "/v1/episodes/busy/close", "", "the close").await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["outcome"], "cancelled", "{closed}");
    assert_eq!(closed["error"], "stopped at step 2: closed by the client", "{closed}");
    let (status, cut) = second.await.unwrap();
    assert_eq!(status, 200, "{cut}");
    assert_eq!((&cut["done"], &cut["info"]["outcome"]), (&json!(true), &json!("cancelled")), "{cut}");
    assert_eq!((&cut["terminated"], &cut["truncated"]), (&json!(false), &json!(true)), "cut off, not the agent's end");
    let (_, state) = server.get("/v1/episodes/busy").await;
    assert_eq!((&state["closed"], &state["step_in_progress"]), (&json!(true), &Value::Null), "{state}");

    let trace = server.trace("busy").await;
    assert!(matches!(trace.tail, Tail::Complete), "{:?}", trace.tail);
    let live: Vec<(u32, String)> = trace
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::Injection(i)) if i.trigger == InjectionTrigger::Live as i32 => Some((r.step, i.id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(live, vec![(2, "next-turn".to_string()), (2, "at-2".to_string())]);
    let cut_at = trace.records.iter().find_map(|r| match &r.body {
        Some(Body::ErrorContext(e)) if e.error_type == "cancelled" => Some((r.step, e.message.clone())),
        _ => None,
    });
    assert_eq!(cut_at, Some((2, "stopped at step 2: closed by the client".to_string())));
    let path = server.dir.path().join("traces").join("busy.trace");
    assert_eq!(basecamp_trace::validate::validate_file(&path), vec![], "{}", path.display());
    server.shut_down().await;
}

#[tokio::test]
async fn only_a_create_that_succeeds_takes_a_generated_id() {
    let server = TestServer::start(1, Duration::from_secs(60)).await;
    // Before: each of these refused creates took a number, and the first episode was ok-3.
    assert_eq!(server.post("/v1/episodes", r#"{"row_id": "missing"}"#).await.0, 400);
    assert_eq!(server.post("/v1/episodes", r#"{"instruction": "hi", "expected_tool_calls": [{}]}"#).await.0, 400);
    let (status, created) = server.post("/v1/episodes", r#"{"row_id": "ok"}"#).await;
    assert_eq!((status, created["episode_id"].as_str()), (201, Some("ok-1")), "{created}");
    assert_eq!(server.post("/v1/episodes", r#"{"row_id": "ok"}"#).await.0, 429);
    assert_eq!(server.post("/v1/episodes", r#"{"instruction": "hi"}"#).await.0, 429);
    assert_eq!(server.post("/v1/episodes/ok-1/close", "").await.0, 200);
    let (status, created) = server.post("/v1/episodes", r#"{"instruction": "hi"}"#).await;
    assert_eq!((status, created["episode_id"].as_str()), (201, Some("episode-2")), "{created}");
    server.shut_down().await;
}

#[tokio::test]
async fn an_injection_id_is_taken_once_per_episode() {
    let server = TestServer::start(4, Duration::from_secs(60)).await;
    for episode in ["a", "b"] {
        let body = json!({"row_id": "ok", "episode_id": episode}).to_string();
        assert_eq!(server.post("/v1/episodes", &body).await.0, 201);
    }
    let first = r#"{"observation": {"notice": "carrier strike"}, "id": "ops-1"}"#;
    let (status, injected) = server.post("/v1/episodes/a/inject", first).await;
    assert_eq!((status, &injected["delivered_at_step"]), (202, &json!(1)), "{injected}");
    // Before: both re-sends were accepted and injected again, under the same id.
    for again in [first, r#"{"observation": "something else", "id": "ops-1"}"#] {
        assert_error(
            &server.post("/v1/episodes/a/inject", again).await,
            409,
            "InjectionExists",
            "injection \"ops-1\" was accepted by episode \"a\" already",
        );
    }
    let queued = r#"{"observation": "later", "at_step": 2, "id": "ops-2"}"#;
    assert_eq!(server.post("/v1/episodes/a/inject", queued).await.0, 202);
    assert_error(&server.post("/v1/episodes/a/inject", queued).await, 409, "InjectionExists", "\"ops-2\"");
    // Another episode has ids of its own.
    assert_eq!(server.post("/v1/episodes/b/inject", first).await.0, 202);
    // A generated id skips one a client chose.
    assert_eq!(server.post("/v1/episodes/a/inject", r#"{"observation": 1, "id": "live-1"}"#).await.0, 202);
    let (status, generated) = server.post("/v1/episodes/a/inject", r#"{"observation": 2}"#).await;
    assert_eq!((status, generated["id"].as_str()), (202, Some("live-2")), "{generated}");

    let (_, state) = server.get("/v1/episodes/a").await;
    let told = state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["content"].as_str().is_some_and(|c| c.starts_with("[injected observation ops-1]")));
    assert_eq!(told.count(), 1, "{state}");
    assert_eq!(server.post("/v1/episodes/a/close", "").await.0, 200);
    let live: Vec<String> = server
        .trace("a")
        .await
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::Injection(i)) => Some(i.id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(live, ["ops-1", "live-1", "live-2"]);
    server.shut_down().await;
}

#[tokio::test]
async fn the_trace_complete_header_says_what_the_file_holds() {
    let first = TestServer::start(4, Duration::from_secs(60)).await;
    assert_eq!(first.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "whole"}"#).await.0, 201);
    assert_eq!(first.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "open"}"#).await.0, 201);
    let complete = |response: &reqwest::Response| response.headers()["x-basecamp-trace-complete"].clone();
    let open = client().get(first.url("/v1/episodes/open/trace")).send().await.unwrap();
    assert_eq!(complete(&open), "false", "an open episode's trace is still being written");
    let dir = first.shut_down().await;
    // A crash cut `cut.trace` off: a copy of one without its end.
    let traces = dir.path().join("traces");
    let bytes = std::fs::read(traces.join("whole.trace")).unwrap();
    std::fs::write(traces.join("cut.trace"), &bytes[..bytes.len() / 2]).unwrap();
    let second = TestServer::start_in(dir, 4, Duration::from_secs(60), Duration::from_secs(60)).await;
    let whole = client().get(second.url("/v1/episodes/whole/trace")).send().await.unwrap();
    assert_eq!(complete(&whole), "true");
    // Before: "true" for any trace an earlier server left.
    let cut = client().get(second.url("/v1/episodes/cut/trace")).send().await.unwrap();
    assert_eq!((cut.status().as_u16(), complete(&cut)), (200, "false".parse().unwrap()));
    second.shut_down().await;
}

#[tokio::test]
async fn an_inline_message_the_policy_cannot_take_is_refused_naming_it() {
    let server = TestServer::start(4, Duration::from_secs(60)).await;
    // Before: 201, and the user's question was dropped without a word.
    for (messages, words) in [
        (
            r#"[{"role": "system", "content": "sys"}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]"#,
            "messages[1]: invalid type: sequence, expected a string",
        ),
        (r#"[{"role": "bogus", "content": "x"}]"#, "messages[0]: unknown variant `bogus`"),
        (r#"[{"role": "user"}]"#, "messages[0]: missing field `content`"),
    ] {
        let body = format!(r#"{{"messages": {messages}}}"#);
        assert_error(&server.post("/v1/episodes", &body).await, 400, "InvalidEpisodeRequest", words);
    }
    let (_, listed) = server.get("/v1/episodes").await;
    assert_eq!(listed["open"], 0, "{listed}");
    server.shut_down().await;
}

#[tokio::test]
async fn a_step_that_panics_ends_its_episode_in_error_with_a_complete_trace_and_the_server_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(dir, 2, Duration::from_secs(60), Duration::from_secs(60), |runner| {
        let boom = |_: &Value| -> Result<ToolOutput, ToolError> { panic!("the tool broke") };
        runner.executor.add_tool("boom", ToolDef::new(Tool::Function(Arc::new(boom)), Duration::from_secs(5)));
    })
    .await;
    for episode in ["broken", "other"] {
        let body = json!({"row_id": "ok", "episode_id": episode}).to_string();
        assert_eq!(server.post("/v1/episodes", &body).await.0, 201);
    }
    let body = r#"{"tool_calls": [{"name": "tracking_api", "arguments": {"order_id": "A-1"}}, {"name": "boom", "arguments": {}}]}"#;
    let answer = server.post("/v1/episodes/broken/step", body).await;

    // Before: the trace ended at step 0's frame, no end, no index.
    let trace = server.trace("broken").await;
    assert!(matches!(trace.tail, Tail::Complete), "{:?}", trace.tail);
    let panicked = trace.records.iter().find_map(|r| match &r.body {
        Some(Body::ErrorContext(e)) if e.error_type == "panic" => Some((r.step, e.message.clone())),
        _ => None,
    });
    assert_eq!(panicked, Some((1, "the step panicked: the tool broke".to_string())));
    let step_1 = kinds_at(&trace, 1);
    assert!(step_1.iter().any(|k| k == "PlanStep"), "the call before the panic is kept: {step_1:?}");
    let Some(Body::EpisodeEnd(end)) = trace.records.last().and_then(|r| r.body.as_ref()) else { panic!("no end") };
    assert_eq!((end.outcome, end.steps), (Outcome::Error as i32, 1));

    // Before: 500 TraceIo, "the step of episode \"broken\" failed: task 7 panicked …; its trace may end early".
    assert_error(
        &answer,
        500,
        "StepPanicked",
        "the step of episode \"broken\" panicked: the tool broke; the episode ended in error at step 1",
    );
    let (_, state) = server.get("/v1/episodes/broken").await;
    assert_eq!((&state["state"], &state["done"], &state["closed"]), (&json!("error"), &json!(true), &json!(true)));
    // Before: 500 TraceIo, "ended without a result: its trace could not be written".
    let (status, closed) = server.post("/v1/episodes/broken/close", "").await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!((&closed["outcome"], &closed["failure_class"]), (&json!("error"), &json!("panic")), "{closed}");
    assert_eq!(closed["error"], "the step panicked: the tool broke", "{closed}");
    let metrics = server.gym.metrics().encode_prometheus_text();
    assert!(metrics.contains(r#"basecamp_sandbox_episodes_total{outcome="error"} 1"#), "{metrics}");

    // The other episode plays on, and the broken one's place is free again.
    let (status, stepped) = server.post("/v1/episodes/other/step", r#"{"content": "It ships tomorrow."}"#).await;
    assert_eq!((status, &stepped["done"]), (200, &json!(true)), "{stepped}");
    assert_eq!(server.post("/v1/episodes", r#"{"row_id": "ok"}"#).await.0, 201);
    server.shut_down().await;
}

#[tokio::test]
async fn a_live_injection_may_not_take_the_id_of_a_scheduled_one() {
    let server = TestServer::start(4, Duration::from_secs(60)).await;
    assert_eq!(server.post("/v1/episodes", r#"{"row_id": "ok", "episode_id": "a"}"#).await.0, 201);
    let reuse = r#"{"observation": "live words", "id": "policy-note"}"#;
    let refused = |answer: &(u16, Value)| {
        assert_error(
            answer,
            409,
            "InjectionExists",
            "injection \"policy-note\" is scheduled for episode \"a\" (the sandbox's spec.injections)",
        )
    };
    // Before: 202, and the trace held two injections "policy-note", the live one first.
    refused(&server.post("/v1/episodes/a/inject", reuse).await);
    let step = r#"{"tool_calls": [{"name": "tracking_api", "arguments": {"order_id": "A-1"}}]}"#;
    let (status, stepped) = server.post("/v1/episodes/a/step", step).await;
    assert_eq!((status, &stepped["info"]["injections"]), (200, &json!(["policy-note"])), "{stepped}");
    // Fired, it is refused the same.
    refused(&server.post("/v1/episodes/a/inject", reuse).await);
    assert_eq!(server.post("/v1/episodes/a/close", "").await.0, 200);
    let ids: Vec<(String, i32)> = server
        .trace("a")
        .await
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::Injection(i)) => Some((i.id.clone(), i.trigger)),
            _ => None,
        })
        .collect();
    assert_eq!(ids, [("policy-note".to_string(), InjectionTrigger::AfterTool as i32)]);
    server.shut_down().await;
}
