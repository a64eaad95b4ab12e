//! `basecamp sandbox inject` against both sandbox modes on 127.0.0.1:
//! driver mode's endpoint (the runner then delivers the injection at its
//! step) and server mode (delivered at once, or at its step); and its
//! errors: an unknown episode, an unreachable endpoint, invalid JSON.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use basecamp_sandbox::episode::{EpisodeInput, EpisodeRunner, LiveInjections};
use basecamp_sandbox::executor::{NullWrites, ToolDef, ToolExecutor};
use basecamp_sandbox::gym::client::SandboxClient;
use basecamp_sandbox::gym::{Gym, GymConfig};
use basecamp_sandbox::metrics::SandboxMetrics;
use basecamp_sandbox::policy::{ChatMessage, Policy, PolicyConfig, ScriptedConfig};
use basecamp_sandbox::server::ServerState;
use basecamp_sandbox::tools::Tool;
use basecamp_sandbox::tools::recorded::{RecordedTool, parse_fixture};
use basecamp_trace::pb::{InjectionTrigger, record::Body};
use basecamp_trace::read_trace;
use serde_json::json;

const SCRIPT: &str = r#"{"episode": "order-7", "turns": [{"tool_calls": [{"name": "track", "arguments": {"order_id": "7"}}]}, {"content": "It ships tomorrow."}]}
"#;

fn runner(dir: &Path, live: LiveInjections) -> EpisodeRunner {
    let script = dir.join("policy.jsonl");
    std::fs::write(&script, SCRIPT).unwrap();
    let fixture = parse_fixture("f.jsonl", r#"{"tool": "track", "response": {"status": "late"}}"#).unwrap();
    let mut executor = ToolExecutor::new(NullWrites::Warn);
    executor
        .add_tool("track", ToolDef::new(Tool::Recorded(RecordedTool::new("track", fixture)), Duration::from_secs(1)));
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    EpisodeRunner {
        max_steps: 4,
        plan_step_timeout: Duration::from_secs(5),
        snapshot_interval: 0,
        live,
        ..EpisodeRunner::new(executor, policy)
    }
}

fn order_7() -> EpisodeInput {
    EpisodeInput { id: "order-7".into(), messages: vec![ChatMessage::user("Where is order 7?")], ..Default::default() }
}

/// Runs `basecamp ARGS`: (exit status, stdout, stderr).
async fn basecamp(args: &[&str]) -> (i32, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_basecamp")).args(args).output().await.unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

async fn inject(endpoint: &str, episode: &str, observation: &str, extra: &[&str]) -> (i32, String, String) {
    let mut args =
        vec!["sandbox", "inject", "--endpoint", endpoint, "--episode", episode, "--observation", observation];
    args.extend_from_slice(extra);
    basecamp(&args).await
}

async fn listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inject_reaches_a_driver_mode_episode_at_the_step_asked() {
    let (listener, endpoint) = listener().await;
    let live = LiveInjections::default();
    live.expect_episodes(["order-7".to_string()]);
    let state = ServerState::new(Arc::new(SandboxMetrics::new()), live.clone());
    tokio::spawn(basecamp_sandbox::server::serve(listener, state, std::future::pending()));

    let (code, stdout, stderr) =
        inject(&endpoint, "order-7", r#"{"notice": "carrier strike"}"#, &["--at-step", "2", "--id", "ops-1"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), "injected ops-1 into episode order-7: queued for step 2");

    let (code, _, stderr) = inject(&endpoint, "order-8", "1", &[]).await;
    assert_eq!(code, 1);
    let refused = format!("the sandbox at {endpoint}/v1/episodes/order-8/inject answered 404 UnknownEpisode");
    assert!(stderr.contains(&refused), "{stderr}");
    assert!(stderr.contains("no episode \"order-8\" runs here"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let result = runner(dir.path(), live).run(&order_7(), dir.path()).await.unwrap();
    assert_eq!(result.outcome, "completed");
    let trace = read_trace(dir.path().join("order-7.trace")).unwrap();
    let live_injections: Vec<(u32, String, String)> = trace
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::Injection(i)) if i.trigger == InjectionTrigger::Live as i32 => {
                Some((r.step, i.id.clone(), i.observation_json.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(live_injections, vec![(2, "ops-1".to_string(), r#"{"notice":"carrier strike"}"#.to_string())]);

    let (code, _, stderr) = inject(&endpoint, "order-7", "2", &[]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("answered 409 EpisodeFinished"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inject_reaches_a_serve_mode_episode_now_or_at_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let gym = Gym::new(GymConfig {
        runner: runner(dir.path(), LiveInjections::default()),
        rows: vec![order_7()],
        test_set_name: "tests.jsonl".into(),
        compare_args: Default::default(),
        out_dir: dir.path().join("traces"),
        max_episodes: 4,
        idle_timeout: Duration::from_secs(60),
        keep_closed: Duration::from_secs(60),
    })
    .unwrap();
    let (listener, endpoint) = listener().await;
    tokio::spawn(basecamp_sandbox::gym::serve(listener, gym, std::future::pending()));
    let client = SandboxClient::new(&endpoint, Duration::from_secs(10)).unwrap();
    let created = client.post_json("/v1/episodes", &json!({"row_id": "order-7", "episode_id": "ep"})).await.unwrap();
    assert_eq!(created["step"], 1);

    let (code, stdout, stderr) = inject(&endpoint, "ep", r#""the customer called""#, &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), "injected live-1 into episode ep: delivered at step 1");
    let (code, _, stderr) = inject(&endpoint, "a b/c", "1", &[]).await;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("/v1/episodes/a%20b%2Fc/inject answered 404 UnknownEpisode: no episode \"a b/c\""),
        "{stderr}"
    );
    let (code, stdout, stderr) = inject(&endpoint, "ep", "[1, 2]", &["--at-step", "2"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), "injected live-2 into episode ep: queued for step 2");

    let action = json!({"tool_calls": [{"name": "track", "arguments": {"order_id": "7"}}]});
    let stepped = client.post_json("/v1/episodes/ep/step", &action).await.unwrap();
    assert_eq!(stepped["info"]["injections"], json!(["live-2"]));
    assert_eq!(stepped["observation"]["messages"][1]["content"], "[injected observation live-2] [1,2]");

    let (code, _, stderr) = inject(&endpoint, "nope", "1", &[]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("answered 404 UnknownEpisode: no episode \"nope\" here"), "{stderr}");
}

#[tokio::test]
async fn inject_explains_an_unreachable_endpoint_and_invalid_json() {
    let (listener, endpoint) = listener().await;
    drop(listener);
    let (code, _, stderr) = inject(&endpoint, "ep", "1", &[]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains(&format!("cannot reach the sandbox at {endpoint}/v1/episodes/ep/inject")), "{stderr}");

    let (code, _, stderr) = inject(&endpoint, "ep", r#"{"a": }"#, &[]).await;
    assert_eq!(code, 1);
    // The position once (before: "at line 1 column 7 (line 1, column 7)").
    assert!(
        stderr.contains("--observation is not valid JSON: expected value at line 1 column 7; quote text"),
        "{stderr}"
    );
    let (code, _, stderr) = inject(&endpoint, "ep", "hello", &[]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("quote text as a JSON string"), "{stderr}");
    let (code, _, stderr) = inject("127.0.0.1:9", "ep", "1", &[]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("does not start with http://"), "{stderr}");
    let (code, _, stderr) = inject(&endpoint, "ep", "1", &["--at-step", "0"]).await;
    assert_eq!(code, 2, "clap refuses step 0: {stderr}");
}
