//! A shard's summary names every trace file the shard wrote — the cut-off
//! and lost episodes' too — so that what is uploaded is exactly this run's
//! files, whatever the files' times say.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use basecamp_sandbox::driver::{ShardSummary, StopSignal, run_shard};
use basecamp_sandbox::episode::{EpisodeInput, EpisodeRunner};
use basecamp_sandbox::executor::{NullWrites, ToolDef, ToolExecutor};
use basecamp_sandbox::policy::{Policy, PolicyConfig, ScriptedConfig};
use basecamp_sandbox::testing::one_question as input;
use basecamp_sandbox::tools::exec::ExecTool;
use basecamp_sandbox::tools::{Tool, ToolError, ToolOutput};
use serde_json::json;

/// A summary as `summary.json` holds it: `hangs` were cut off by a stop,
/// the first with a trace of this run's, the second before it wrote one;
/// `lost` likewise.
fn summary_of_a_stopped_shard() -> ShardSummary {
    let started = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos() as i64;
    serde_json::from_value(json!({
        "namespace": "default", "task": "t", "variant": "a", "shard": 0, "shard_count": 1,
        "started_unix_nanos": started, "wall_seconds": 1.0,
        "aggregate": {"episodes": 0, "means": {}, "resolution_time_p50_s": 0.0, "resolution_time_p95_s": 0.0, "outcomes": {}},
        "episodes": [],
        "lost": [
            {"id": "lost-traced", "error": "cannot write the trace: disk full", "trace_file": "lost-traced.trace"},
            {"id": "lost-untraced", "error": "cannot write the trace: permission denied"}
        ],
        "stopped_early": true,
        "interrupted": ["cut-traced", "cut-untraced"],
        "interrupted_traces": ["cut-traced.trace"]
    }))
    .expect("a summary")
}

#[test]
fn the_traces_of_cut_off_and_lost_episodes_are_those_the_summary_names() {
    // Before: guessed from the directory by file time (a second of slack),
    // so an earlier run's trace of an episode cut off before its start went
    // up as this shard's when it was written just before, and this run's
    // trace did not when the file system's clock lagged (NFS, FUSE).
    assert_eq!(summary_of_a_stopped_shard().files_written(), ["summary.json", "cut-traced.trace", "lost-traced.trace"]);
}

#[test]
fn a_summary_written_before_the_trace_names_were_recorded_still_reads() {
    let mut old = serde_json::to_value(summary_of_a_stopped_shard()).unwrap();
    old.as_object_mut().unwrap().remove("interrupted_traces");
    for lost in old["lost"].as_array_mut().unwrap() {
        lost.as_object_mut().unwrap().remove("trace_file");
    }
    let summary: ShardSummary = serde_json::from_value(old).expect("an older summary.json parses");
    assert!(summary.interrupted_traces.is_empty() && summary.lost.iter().all(|l| l.trace_file.is_none()));
    let written = serde_json::to_value(summary_of_a_stopped_shard()).unwrap();
    assert_eq!(written["interrupted_traces"], json!(["cut-traced.trace"]));
    assert_eq!(written["lost"][0]["trace_file"], "lost-traced.trace");
    assert!(written["lost"][1].get("trace_file").is_none(), "no trace, no key: {written}");
}

#[tokio::test]
async fn a_stopped_shard_records_the_trace_of_each_episode_it_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("policy.jsonl");
    let turns = r#"[{"tool_calls": [{"name": "hang", "arguments": {}}]}, {"content": "done"}]"#;
    std::fs::write(
        &script,
        format!("{{\"episode\": \"e1\", \"turns\": {turns}}}\n{{\"episode\": \"e2\", \"turns\": {turns}}}\n"),
    )
    .unwrap();
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    let mut executor = ToolExecutor::new(NullWrites::Warn);
    let hang = Tool::Exec(ExecTool::new(vec!["sleep".into(), "60".into()]));
    executor.add_tool(
        "hang",
        ToolDef { tool: hang, timeout: Duration::from_secs(30), fallback: None, memory_map: Vec::new() },
    );
    let runner =
        Arc::new(EpisodeRunner { plan_step_timeout: Duration::from_secs(30), ..EpisodeRunner::new(executor, policy) });
    let out = dir.path().join("out");
    let stop = StopSignal::new();
    let stopper = stop.clone();
    let trace = out.join("e1.trace");
    tokio::spawn(async move {
        while !trace.is_file() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        stopper.cancel();
    });
    // One at a time: e1 starts and hangs in its tool; e2 never starts.
    let summary = tokio::time::timeout(
        Duration::from_secs(20),
        run_shard(runner, vec![input("e1"), input("e2")], &out, 1, stop, |_| {}),
    )
    .await
    .expect("the stop ends the shard")
    .unwrap();
    assert_eq!(
        (summary.interrupted.as_slice(), summary.not_started.as_slice()),
        (&["e1".to_string()][..], &["e2".to_string()][..])
    );
    assert_eq!(summary.interrupted_traces, ["e1.trace"]);
    assert_eq!(summary.files_written(), ["summary.json", "e1.trace"]);
    let on_disk: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(on_disk["interrupted_traces"], json!(["e1.trace"]));
}

#[tokio::test]
/// A tool that panics ends its episode in error there, its trace complete;
/// the shard plays on. Before: the episode was lost with its task
/// (`"the episode panicked: the tool broke"`) and its trace cut off with no
/// episode end and no index.
async fn an_episode_whose_step_panicked_ends_in_error_with_a_complete_trace() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("policy.jsonl");
    let calls =
        |tool: &str| format!(r#"[{{"tool_calls": [{{"name": "{tool}", "arguments": {{}}}}]}}, {{"content": "done"}}]"#);
    std::fs::write(
        &script,
        format!(
            "{{\"episode\": \"ok\", \"turns\": {}}}\n{{\"episode\": \"broken\", \"turns\": {}}}\n",
            calls("fine"),
            calls("boom")
        ),
    )
    .unwrap();
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    let mut executor = ToolExecutor::new(NullWrites::Warn);
    let function =
        |tool: Tool| ToolDef { tool, timeout: Duration::from_secs(5), fallback: None, memory_map: Vec::new() };
    let fine = |_: &serde_json::Value| Ok(ToolOutput::observation(json!({"status": "shipped"})));
    let boom = |_: &serde_json::Value| -> Result<ToolOutput, ToolError> { panic!("the tool broke") };
    executor.add_tool("fine", function(Tool::Function(Arc::new(fine))));
    executor.add_tool("boom", function(Tool::Function(Arc::new(boom))));
    let runner = Arc::new(EpisodeRunner::new(executor, policy));
    let out = dir.path().join("out");
    let summary =
        run_shard(runner, vec![input("ok"), input("broken")], &out, 2, StopSignal::new(), |_| {}).await.unwrap();
    let ids: Vec<&str> = summary.episodes.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["ok", "broken"], "{:?}", summary.lost);
    assert!(summary.lost.is_empty(), "{:?}", summary.lost);
    let broken = &summary.episodes[1];
    assert_eq!((broken.outcome.as_str(), broken.failure_class.as_str()), ("error", "panic"));
    assert_eq!(broken.error.as_deref(), Some("the step panicked: the tool broke"));
    let trace = basecamp_trace::read_trace(out.join("broken.trace")).unwrap();
    assert!(matches!(trace.tail, basecamp_trace::Tail::Complete), "{:?}", trace.tail);
    assert!(trace.records.iter().any(|r| matches!(&r.body,
        Some(basecamp_trace::pb::record::Body::ErrorContext(e))
            if e.error_type == "panic" && e.message == "the step panicked: the tool broke")));
    assert_eq!(summary.files_written(), ["summary.json", "ok.trace", "broken.trace"]);
}

#[tokio::test]
async fn an_episode_whose_start_failed_after_creating_its_trace_is_lost_with_that_trace() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("policy.jsonl");
    let done = r#"[{"content": "done"}]"#;
    std::fs::write(
        &script,
        format!("{{\"episode\": \"ok\", \"turns\": {done}}}\n{{\"episode\": \"huge\", \"turns\": {done}}}\n"),
    )
    .unwrap();
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    let runner = Arc::new(EpisodeRunner::new(ToolExecutor::new(NullWrites::Warn), policy));
    // An initial memory too large for one trace frame: the start creates the
    // trace and writes its header, then fails writing the initial memory.
    let frame_limit = basecamp_trace::format::MAX_RAW_FRAME.min(basecamp_trace::format::MAX_COMPRESSED_FRAME);
    let mut huge = input("huge");
    huge.initial_memory.insert("document".into(), json!("x".repeat(frame_limit as usize + 1)));
    let out = dir.path().join("out");
    let summary = run_shard(runner, vec![input("ok"), huge], &out, 2, StopSignal::new(), |_| {}).await.unwrap();
    assert_eq!(summary.episodes.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["ok"]);
    assert_eq!(summary.lost.len(), 1, "{:?}", summary.lost);
    let lost = &summary.lost[0];
    let expected = format!("cannot write the trace {}: a trace record of step 0", out.join("huge.trace").display());
    assert!(lost.error.starts_with(&expected), "{}", lost.error);
    // Before: no trace_file, so the trace (its header, a readable prefix)
    // stayed on disk and was not uploaded.
    assert_eq!((lost.id.as_str(), lost.trace_file.as_deref()), ("huge", Some("huge.trace")));
    let trace = basecamp_trace::reader::read_trace(out.join("huge.trace")).expect("the header is readable");
    assert_eq!(trace.header.episode_id, "huge");
    assert_eq!(summary.files_written(), ["summary.json", "ok.trace", "huge.trace"]);
}

#[tokio::test]
async fn an_episode_whose_trace_cannot_be_created_is_lost_with_the_path_it_tried() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("policy.jsonl");
    std::fs::write(&script, r#"{"episode": "blocked", "turns": [{"content": "done"}]}"#).unwrap();
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    let runner = Arc::new(EpisodeRunner::new(ToolExecutor::new(NullWrites::Warn), policy));
    // A directory where the trace should go: its creation fails even for
    // root, whom a read-only directory does not stop.
    let out = dir.path().join("out");
    let blocked = out.join("blocked.trace");
    std::fs::create_dir_all(&blocked).unwrap();
    let summary = run_shard(runner, vec![input("blocked")], &out, 1, StopSignal::new(), |_| {}).await.unwrap();
    assert_eq!(summary.lost.len(), 1, "{:?}", summary.lost);
    let lost = &summary.lost[0];
    // Before: "cannot write the trace: Is a directory (os error 21)", no file named.
    let expected = format!("cannot write the trace {}: ", blocked.display());
    assert!(lost.error.starts_with(&expected), "{}", lost.error);
    assert_eq!(lost.trace_file, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_test_set_has_a_task_only_for_the_episodes_in_flight() {
    // Before: a task per row from the start, ~7 KB each (135 MB of tasks
    // for a 20,000-row test set), waiting on a semaphore.
    const EPISODES: usize = 300;
    const CONCURRENCY: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("policy.jsonl");
    let lines: String =
        (0..EPISODES).map(|i| format!("{{\"episode\": \"e{i}\", \"turns\": [{{\"content\": \"done\"}}]}}\n")).collect();
    std::fs::write(&script, lines).unwrap();
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    let runner = Arc::new(EpisodeRunner::new(ToolExecutor::new(NullWrites::Warn), policy));
    let inputs: Vec<EpisodeInput> = (0..EPISODES).map(|i| input(&format!("e{i}"))).collect();
    let most_alive = std::sync::atomic::AtomicUsize::new(0);
    let out = dir.path().join("out");
    let summary = run_shard(runner, inputs, &out, CONCURRENCY, StopSignal::new(), |_| {
        let alive = tokio::runtime::Handle::current().metrics().num_alive_tasks();
        most_alive.fetch_max(alive, std::sync::atomic::Ordering::Relaxed);
    })
    .await
    .unwrap();
    assert_eq!(summary.episodes.len(), EPISODES);
    let ids: Vec<&str> = summary.episodes.iter().map(|e| e.id.as_str()).collect();
    let expected: Vec<String> = (0..EPISODES).map(|i| format!("e{i}")).collect();
    assert_eq!(ids, expected.iter().map(String::as_str).collect::<Vec<_>>(), "in test-set order");
    // The runtime counts a finished task until its last reference is gone
    // (seen: 4 for 3 in flight on a busy machine); a task per row was ~EPISODES.
    let most_alive = most_alive.into_inner();
    assert!(most_alive <= 2 * CONCURRENCY, "{most_alive} tasks alive at once for {CONCURRENCY} episodes in flight");
}

/// A scripted policy of `n` episodes `e0`.. that answer at once, those for
/// which `fails(i)` with an error (as a server answering 503 after its
/// retries): each ends `policy_error`, the others `ok`.
fn runner_of(dir: &std::path::Path, n: usize, fails: impl Fn(usize) -> bool) -> (EpisodeRunner, Vec<EpisodeInput>) {
    let script = dir.join("policy.jsonl");
    let lines: String = (0..n)
        .map(|i| {
            let turn =
                if fails(i) { json!({"error": "upstream connect error (503)"}) } else { json!({"content": "done"}) };
            format!("{}\n", json!({"episode": format!("e{i}"), "turns": [turn]}))
        })
        .collect();
    std::fs::write(&script, lines).unwrap();
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    let runner = EpisodeRunner::new(ToolExecutor::new(NullWrites::Warn), policy);
    (runner, (0..n).map(|i| input(&format!("e{i}"))).collect())
}

fn ids(summary: &ShardSummary) -> Vec<&str> {
    summary.episodes.iter().map(|e| e.id.as_str()).collect()
}

/// A policy that fails every episode makes the shard give up after
/// `outage_threshold` of them in a row (5 at one in flight), the rest not
/// started and named. Before, a dead model server turned the whole test
/// set into traces of the outage, each after its retries.
#[tokio::test]
async fn a_shard_gives_up_when_the_policy_fails_episode_after_episode() {
    let dir = tempfile::tempdir().unwrap();
    let (runner, inputs) = runner_of(dir.path(), 12, |_| true);
    assert_eq!(basecamp_sandbox::driver::outage_threshold(1), 5);
    let out = dir.path().join("out");
    let summary = run_shard(Arc::new(runner), inputs, &out, 1, StopSignal::new(), |_| {}).await.unwrap();
    assert_eq!(ids(&summary), ["e0", "e1", "e2", "e3", "e4"]);
    assert_eq!(summary.aggregate.not_measured, 5);
    let gave_up = summary.gave_up.as_ref().expect("gave up");
    assert_eq!(gave_up.not_started, ["e5", "e6", "e7", "e8", "e9", "e10", "e11"]);
    assert!(
        gave_up.reason.starts_with(
            "5 episodes in a row were ended by the policy's server or a service (the last, e4, policy_error: "
        ),
        "{}",
        gave_up.reason
    );
    assert!(gave_up.reason.contains("upstream connect error (503)"), "{}", gave_up.reason);
    assert!(
        gave_up.reason.contains("nothing tells when the policy is back (a script"),
        "why not waited: {}",
        gave_up.reason
    );
    assert!(!summary.stopped_early && summary.not_started.is_empty(), "no stop: {summary:?}");
    let on_disk: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(on_disk["gave_up"]["not_started"].as_array().map(Vec::len), Some(7));
}

/// Failures that a measured episode interrupts are an unreliable server,
/// not a dead one: the count starts again and every episode runs.
#[tokio::test]
async fn a_measured_episode_between_failures_starts_the_count_again() {
    let dir = tempfile::tempdir().unwrap();
    let (runner, inputs) = runner_of(dir.path(), 15, |i| i % 5 != 4);
    let summary =
        run_shard(Arc::new(runner), inputs, &dir.path().join("out"), 1, StopSignal::new(), |_| {}).await.unwrap();
    assert_eq!(summary.episodes.len(), 15, "{:?}", summary.gave_up);
    assert_eq!((summary.aggregate.not_measured, summary.gave_up), (12, None));
}

/// With a policy server (`spec.policy.server`), the shard waits for its
/// readiness URL as before the first episode: ready again, it goes on;
/// still down after `startupTimeout`, it gives up saying so.
#[tokio::test]
async fn a_shard_waits_for_a_policy_server_to_be_ready_again() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ready_url = format!("http://{}/health", listener.local_addr().unwrap());
    let polled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = polled.clone();
    let app = axum::Router::new().route(
        "/health",
        axum::routing::get(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { "ok" }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });

    let summary = every_episode_failing_with_a_server(8, &ready_url, 5_000).await;
    assert_eq!(summary.episodes.len(), 8, "ready again after 5, so the shard went on: {:?}", summary.gave_up);
    assert_eq!(polled.load(std::sync::atomic::Ordering::SeqCst), 1, "asked once, after the 5th");

    // Ready, yet failing every episode again: a broken server, not a restart. The shard gives up.
    let summary = every_episode_failing_with_a_server(12, &ready_url, 5_000).await;
    assert_eq!(summary.episodes.len(), 10, "5, the wait, 5 more: {:?}", summary.gave_up);
    let gave_up = summary.gave_up.expect("gave up");
    assert!(gave_up.reason.contains("the policy answered at http://127.0.0.1:"), "{}", gave_up.reason);
    assert!(gave_up.reason.contains("yet no episode since was measured"), "{}", gave_up.reason);
    assert_eq!(gave_up.not_started, ["e10", "e11"]);

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let summary = every_episode_failing_with_a_server(8, &format!("http://127.0.0.1:{closed}/health"), 600).await;
    assert_eq!(ids(&summary), ["e0", "e1", "e2", "e3", "e4"]);
    let gave_up = summary.gave_up.expect("still down");
    assert!(gave_up.reason.contains("the policy server did not answer 200 at http://127.0.0.1:"), "{}", gave_up.reason);
    assert!(gave_up.reason.contains("within 600ms"), "{}", gave_up.reason);
    assert_eq!(gave_up.not_started, ["e5", "e6", "e7"]);
}

/// A shard of `episodes` that all fail, one at a time, whose policy server
/// says it is ready at `url` (waited for at most `timeout_ms`).
async fn every_episode_failing_with_a_server(episodes: usize, url: &str, timeout_ms: i64) -> ShardSummary {
    let dir = tempfile::tempdir().unwrap();
    let (runner, inputs) = runner_of(dir.path(), episodes, |_| true);
    let readiness = basecamp_sandbox::readiness::Readiness::server(
        url.to_string(),
        basecamp_api::Duration::from_millis(timeout_ms),
    );
    let runner = EpisodeRunner { policy_readiness: Some(readiness), ..runner };
    run_shard(Arc::new(runner), inputs, &dir.path().join("out"), 1, StopSignal::new(), |_| {}).await.unwrap()
}

/// A hosted OpenAI-compatible endpoint the test takes down and brings back:
/// chat completions answer "done" while it is up and 503 while it is down;
/// it goes down at chat request `down_at`, and `/v1/models` (503 while
/// down) brings it back when polled for the `back_at`-th time (0: never).
struct Hosted {
    up: std::sync::atomic::AtomicBool,
    chats: std::sync::atomic::AtomicUsize,
    polls: std::sync::atomic::AtomicUsize,
    down_at: usize,
    back_at: usize,
    /// The `Authorization` header of each poll.
    authorizations: std::sync::Mutex<Vec<String>>,
    /// The shard's metrics, and the `waiting_for_policy` line they had at each poll.
    metrics: Arc<basecamp_sandbox::metrics::SandboxMetrics>,
    waiting_at_polls: std::sync::Mutex<Vec<String>>,
}

/// The `waiting_for_policy` gauge's line in `metrics`.
fn waiting_line(metrics: &basecamp_sandbox::metrics::SandboxMetrics) -> String {
    let text = metrics.encode();
    text.lines().find(|l| l.starts_with("basecamp_sandbox_waiting_for_policy ")).unwrap_or_default().to_string()
}

impl Hosted {
    /// Serves it on a port of 127.0.0.1; returns its endpoint (`.../v1`).
    async fn start(hosted: Arc<Self>) -> String {
        use axum::http::{HeaderMap, StatusCode};
        use axum::response::IntoResponse;
        use std::sync::atomic::Ordering::SeqCst;
        let status = |up: bool| if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
        let chat = hosted.clone();
        let models = hosted.clone();
        let app = axum::Router::new()
            .route(
                "/v1/chat/completions",
                axum::routing::post(move || async move {
                    if chat.chats.fetch_add(1, SeqCst) == chat.down_at {
                        chat.up.store(false, SeqCst);
                    }
                    let up = chat.up.load(SeqCst);
                    let done = json!({"choices": [{"message": {"content": "done"}, "finish_reason": "stop"}]});
                    (status(up), axum::Json(done)).into_response()
                }),
            )
            .route(
                "/v1/models",
                axum::routing::get(move |headers: HeaderMap| async move {
                    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
                    models.authorizations.lock().unwrap().push(auth.to_string());
                    models.waiting_at_polls.lock().unwrap().push(waiting_line(&models.metrics));
                    if models.polls.fetch_add(1, SeqCst) + 1 == models.back_at {
                        models.up.store(true, SeqCst);
                    }
                    status(models.up.load(SeqCst)).into_response()
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        endpoint
    }
}

/// A shard of `episodes` (one at a time) against `hosted`, whose policy is
/// `spec.policy.endpoint` with an API key, one attempt per request, and
/// `outageTimeout: outage_ms`.
async fn a_shard_against(hosted: &Arc<Hosted>, episodes: usize, outage_ms: i64) -> ShardSummary {
    use basecamp_sandbox::policy::{ApiKeySource, OpenAiConfig, RetryPolicy};
    let endpoint = Hosted::start(hosted.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, "sk-test\n").unwrap();
    let mut config = OpenAiConfig::new(endpoint.clone(), "m");
    config.api_key = ApiKeySource::File(key);
    config.retry = RetryPolicy { max_attempts: 1, ..RetryPolicy::default() };
    let policy = Policy::from_config(&PolicyConfig::OpenAi(Box::new(config))).unwrap();
    let spec = basecamp_api::task::PolicySpec {
        endpoint: Some(endpoint),
        model: Some("m".into()),
        outage_timeout: Some(basecamp_api::Duration::from_millis(outage_ms)),
        ..Default::default()
    };
    let readiness = basecamp_sandbox::readiness::Readiness::after_an_outage(&spec, &policy);
    let runner = EpisodeRunner {
        policy_readiness: readiness,
        metrics: Some(hosted.metrics.clone()),
        ..EpisodeRunner::new(ToolExecutor::new(NullWrites::Warn), policy)
    };
    let inputs = (0..episodes).map(|i| input(&format!("e{i}"))).collect();
    run_shard(Arc::new(runner), inputs, &dir.path().join("out"), 1, StopSignal::new(), |_| {}).await.unwrap()
}

fn hosted(down_at: usize, back_at: usize) -> Arc<Hosted> {
    Arc::new(Hosted {
        up: true.into(),
        chats: 0.into(),
        polls: 0.into(),
        down_at,
        back_at,
        authorizations: Default::default(),
        metrics: Default::default(),
        waiting_at_polls: Default::default(),
    })
}

/// A hosted endpoint that went down after serving episodes is waited for
/// (`GET /v1/models` with the key) and the shard goes on when it is back.
/// Before, nothing said when a hosted endpoint was back: the shard gave up
/// at the first outage, failing a long evaluation on a provider's blip.
#[tokio::test]
async fn a_shard_waits_for_a_hosted_endpoint_that_went_down_and_goes_on() {
    let endpoint = hosted(3, 2);
    let summary = a_shard_against(&endpoint, 12, 5_000).await;
    assert_eq!(summary.gave_up, None);
    assert_eq!(summary.episodes.len(), 12, "every episode ran");
    assert_eq!(summary.aggregate.not_measured, 5, "e3..e7, then the wait");
    let failed: Vec<&str> =
        summary.episodes.iter().filter(|e| e.failure_class == "policy_error").map(|e| e.id.as_str()).collect();
    assert_eq!(failed, ["e3", "e4", "e5", "e6", "e7"]);
    // Polled until it answered (503, then 200), with the API key.
    assert_eq!(*endpoint.authorizations.lock().unwrap(), ["Bearer sk-test", "Bearer sk-test"]);
    // `/metrics` said the shard was waiting while it was, and not after.
    let waiting = "basecamp_sandbox_waiting_for_policy 1";
    assert_eq!(*endpoint.waiting_at_polls.lock().unwrap(), [waiting, waiting]);
    assert_eq!(waiting_line(&endpoint.metrics), "basecamp_sandbox_waiting_for_policy 0");
}

/// An endpoint that never served an episode is not down but wrong (URL,
/// model, key): the shard gives up without waiting, and says what to check.
#[tokio::test]
async fn an_endpoint_that_never_worked_is_not_waited_for() {
    let endpoint = hosted(0, 1);
    let summary = a_shard_against(&endpoint, 8, 5_000).await;
    assert_eq!(ids(&summary), ["e0", "e1", "e2", "e3", "e4"]);
    let gave_up = summary.gave_up.expect("gave up");
    assert!(
        gave_up.reason.contains("an endpoint that never answered one is taken for a wrong URL, model or key"),
        "{}",
        gave_up.reason
    );
    assert!(gave_up.reason.contains("check spec.policy.endpoint, model and the API key"), "{}", gave_up.reason);
    assert_eq!(endpoint.polls.load(std::sync::atomic::Ordering::SeqCst), 0, "not polled");
}

/// Still down when `outageTimeout` has passed: the shard gives up, naming
/// the URL polled, the bound and the last answer.
#[tokio::test]
async fn a_hosted_endpoint_down_beyond_its_outage_timeout_is_given_up() {
    let endpoint = hosted(2, 0);
    let summary = a_shard_against(&endpoint, 10, 1_200).await;
    assert_eq!(summary.episodes.len(), 7, "2 measured, 5 failed, then the wait");
    let gave_up = summary.gave_up.expect("gave up");
    assert!(gave_up.reason.contains("the policy endpoint was still down at http://127.0.0.1:"), "{}", gave_up.reason);
    assert!(gave_up.reason.contains("/v1/models after 1200ms (spec.policy.outageTimeout: "), "{}", gave_up.reason);
    assert!(gave_up.reason.contains("last status 503"), "{}", gave_up.reason);
    assert_eq!(gave_up.not_started, ["e7", "e8", "e9"]);
    assert!(endpoint.polls.load(std::sync::atomic::Ordering::SeqCst) >= 2, "polled every 500ms until the bound");
}
