//! `spec.policy.server`: the sandbox waits for the policy server's
//! readiness path to answer 200 before its first episode, against a real
//! HTTP server on 127.0.0.1 that plays a model server still loading (503)
//! and then serving chat completions.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde_json::{Value, json};

/// A model server: `/v1/models` answers 503 until `ready_after` has passed
/// since the first poll, then 200 (never, without it); chat completions
/// always answer "Hello!".
struct ModelServer {
    port: u16,
    readiness_polls: Arc<AtomicU32>,
    completions: Arc<AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct ServerState {
    first_poll: Arc<std::sync::OnceLock<Instant>>,
    ready_after: Option<Duration>,
    readiness_polls: Arc<AtomicU32>,
    completions: Arc<AtomicU32>,
}

impl ModelServer {
    async fn start(ready_after: Option<Duration>) -> Self {
        let state = ServerState {
            first_poll: Arc::default(),
            ready_after,
            readiness_polls: Arc::default(),
            completions: Arc::default(),
        };
        let (readiness_polls, completions) = (state.readiness_polls.clone(), state.completions.clone());
        let app =
            Router::new().route("/v1/models", get(models)).route("/v1/chat/completions", post(chat)).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("model server");
        });
        Self { port, readiness_polls, completions, task }
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn models(State(state): State<ServerState>) -> (StatusCode, String) {
    state.readiness_polls.fetch_add(1, Ordering::SeqCst);
    match state.ready_after {
        Some(after) if state.first_poll.get_or_init(Instant::now).elapsed() >= after => {
            (StatusCode::OK, json!({"object": "list", "data": [{"id": "served"}]}).to_string())
        }
        _ => (StatusCode::SERVICE_UNAVAILABLE, "loading the model".into()),
    }
}

async fn chat(State(state): State<ServerState>) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    state.completions.fetch_add(1, Ordering::SeqCst);
    let body = json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "served",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Hello!"},
            "finish_reason": "stop",
            "logprobs": {"content": [{"token": "Hello", "logprob": -0.1, "top_logprobs": [{"token": "Hello", "logprob": -0.1}]}]}
        }],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    });
    (StatusCode::OK, [("content-type", "application/json")], body.to_string())
}

fn write_project(dir: &Path, port: u16, startup_timeout: &str) {
    let manifest = format!(
        r#"
apiVersion: basecamp.dev/v1alpha1
kind: SandboxConfig
metadata:
  name: tools
spec:
  tools:
    track_order:
      description: Look up an order.
      parameters: {{type: object, properties: {{order_id: {{type: string}}}}}}
      recorded:
        fixture: fixture.jsonl
  maxSteps: 2
---
apiVersion: basecamp.dev/v1alpha1
kind: HarnessTask
metadata:
  name: greet
spec:
  taskDefinition:
    description: You are a support agent.
  evaluation:
    metrics: [tool_call_accuracy]
    testSet: tests.jsonl
  policy:
    model: served
    server:
      image: vllm/vllm-openai:v0.11.0
      port: {port}
      startupTimeout: {startup_timeout}
  sandboxRef: {{name: tools}}
"#
    );
    std::fs::write(dir.join("task.yaml"), manifest).unwrap();
    std::fs::write(
        dir.join("fixture.jsonl"),
        "{\"tool\": \"track_order\", \"arguments\": {\"order_id\": \"1\"}, \"observation\": {\"status\": \"late\"}}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("tests.jsonl"),
        "{\"id\": \"ep-1\", \"instruction\": \"Hi\", \"expected_tool_calls\": []}\n",
    )
    .unwrap();
}

async fn sandbox(args: Vec<String>) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .expect("basecamp-sandbox runs")
}

fn run_args(dir: &Path) -> Vec<String> {
    let out = dir.join("out");
    ["run", "--config", &dir.join("task.yaml").display().to_string(), "--out", &out.display().to_string()]
        .map(String::from)
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_episode_waits_until_the_policy_server_answers_200() {
    let server = ModelServer::start(Some(Duration::from_millis(1000))).await;
    let project = tempfile::tempdir().unwrap();
    write_project(project.path(), server.port, "30s");
    let started = Instant::now();
    let run = sandbox(run_args(project.path())).await;
    let took = started.elapsed();
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(took >= Duration::from_millis(1000), "it waited for the server: {took:?}");
    assert!(took < Duration::from_secs(20), "and no longer than needed: {took:?}");

    // One line when ready, with the URL and the time it took.
    let url = format!("http://127.0.0.1:{}/v1/models", server.port);
    let ready: Vec<&str> = stderr.lines().filter(|l| l.starts_with("policy server ready")).collect();
    assert_eq!(ready.len(), 1, "{stderr}");
    assert!(ready[0].contains(&url), "{}", ready[0]);
    let seconds: f64 = ready[0].rsplit("after ").next().and_then(|s| s.trim_end_matches('s').parse().ok()).unwrap();
    assert!((1.0..10.0).contains(&seconds), "{}", ready[0]);

    // Polled every 500 ms: 503 at 0 and 0.5 s, 200 at 1.0 s (or 1.5 s, by a hair).
    let polls = server.readiness_polls.load(Ordering::SeqCst);
    assert!((3..=6).contains(&polls), "{polls} polls");
    // The episode ran against the server, after it was ready.
    assert_eq!(server.completions.load(Ordering::SeqCst), 1);
    let summary: Value =
        serde_json::from_slice(&std::fs::read(project.path().join("out/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["episodes"][0]["outcome"], "completed", "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_server_that_never_gets_ready_fails_the_run_with_the_url_the_timeout_and_the_last_status() {
    let server = ModelServer::start(None).await;
    let project = tempfile::tempdir().unwrap();
    write_project(project.path(), server.port, "2s");
    let started = Instant::now();
    let run = sandbox(run_args(project.path())).await;
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&run.stderr);
    // Exit 1: configuration refused (no retry by the Job's pod failure policy).
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(10), "bounded by startupTimeout: {took:?}");
    let url = format!("http://127.0.0.1:{}/v1/models", server.port);
    assert!(stderr.contains("error [PolicyServerNotReady]"), "{stderr}");
    assert!(stderr.contains(&url), "{stderr}");
    assert!(stderr.contains("within 2s"), "{stderr}");
    assert!(stderr.contains("last status 503 Service Unavailable"), "{stderr}");
    assert_eq!(server.completions.load(Ordering::SeqCst), 0, "no episode ran");
    assert!(!project.path().join("out/summary.json").exists());

    // Server mode waits the same way, and refuses the same way.
    let serve = sandbox(
        [
            "serve",
            "--config",
            &project.path().join("task.yaml").display().to_string(),
            "--listen",
            "127.0.0.1:0",
            "--out",
            &project.path().join("serve").display().to_string(),
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert_eq!(serve.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&url) && stderr.contains("within 2s"), "{stderr}");
    assert!(!String::from_utf8_lossy(&serve.stdout).contains("serving the sandbox API"));
}
