//! A shard against an endpoint that allows fewer requests at once than the
//! shard runs episodes: its 429s lower the requests at once (and no episode
//! starts while one waits), and every episode is measured instead of
//! failing its turn after its retries.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use basecamp_sandbox::driver::{ShardSummary, StopSignal, run_shard};
use basecamp_sandbox::episode::EpisodeRunner;
use basecamp_sandbox::executor::{NullWrites, ToolExecutor};
use basecamp_sandbox::metrics::SandboxMetrics;
use basecamp_sandbox::policy::{OpenAiConfig, Policy, PolicyConfig};
use basecamp_sandbox::testing::one_question as input;
use serde_json::json;

/// An OpenAI-compatible endpoint that serves `allowed` chat requests at
/// once, each answered "done" after `answer_ms`, and answers any request
/// beyond them at once with 429 and `retry-after-ms: 20` (as a hosted
/// API's per-key concurrency limit does).
struct Limited {
    allowed: usize,
    answer_ms: u64,
    in_flight: AtomicUsize,
    /// The most requests it served at once.
    most: AtomicUsize,
    answered_429: AtomicUsize,
}

impl Limited {
    /// Serves it on a port of 127.0.0.1; returns its endpoint (`.../v1`).
    async fn start(limited: Arc<Self>) -> String {
        use axum::http::StatusCode;
        use axum::response::IntoResponse;
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move || async move {
                let now = limited.in_flight.fetch_add(1, SeqCst) + 1;
                if now > limited.allowed {
                    limited.in_flight.fetch_sub(1, SeqCst);
                    limited.answered_429.fetch_add(1, SeqCst);
                    let busy = json!({"error": {"message": "Rate limit reached: too many requests at once"}});
                    return (StatusCode::TOO_MANY_REQUESTS, [("retry-after-ms", "20")], axum::Json(busy))
                        .into_response();
                }
                limited.most.fetch_max(now, SeqCst);
                tokio::time::sleep(Duration::from_millis(limited.answer_ms)).await;
                limited.in_flight.fetch_sub(1, SeqCst);
                let done = json!({"choices": [{"message": {"content": "done"}, "finish_reason": "stop"}]});
                axum::Json(done).into_response()
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        endpoint
    }
}

/// `episodes` episodes, `concurrency` at a time, against `limited` with
/// the default retries (4 attempts); the shard's summary and its metrics.
async fn a_shard_against(
    limited: &Arc<Limited>,
    episodes: usize,
    concurrency: usize,
) -> (ShardSummary, Arc<SandboxMetrics>) {
    let endpoint = Limited::start(limited.clone()).await;
    let policy = Policy::from_config(&PolicyConfig::OpenAi(Box::new(OpenAiConfig::new(endpoint, "m")))).unwrap();
    let metrics = Arc::new(SandboxMetrics::new());
    let runner = EpisodeRunner {
        metrics: Some(metrics.clone()),
        ..EpisodeRunner::new(ToolExecutor::new(NullWrites::Warn), policy)
    };
    let dir = tempfile::tempdir().unwrap();
    let inputs = (0..episodes).map(|i| input(&format!("e{i}"))).collect();
    let out = dir.path().join("out");
    let summary = run_shard(Arc::new(runner), inputs, &out, concurrency, StopSignal::new(), |_| {}).await.unwrap();
    (summary, metrics)
}

/// The value of `series` (no labels) in `metrics`.
fn metric(metrics: &SandboxMetrics, series: &str) -> Option<u64> {
    metrics.encode().lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// 8 episodes at once against an endpoint that serves 2: before, the shard
/// kept 8 requests in flight, 6 of each crowd met 429, retried together
/// after its `Retry-After` and met it again; a request that lost four times
/// failed its turn (`policy_error`), and the run was measured on the
/// episodes that happened to win. Now the first 429 halves the requests at
/// once, the rest wait for their place, and every episode is measured.
#[tokio::test]
async fn an_endpoint_s_429s_lower_the_requests_at_once_and_every_episode_is_measured() {
    let limited = Arc::new(Limited {
        allowed: 2,
        answer_ms: 30,
        in_flight: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
        answered_429: AtomicUsize::new(0),
    });
    let (summary, metrics) = a_shard_against(&limited, 40, 8).await;
    let failed: Vec<(&str, &str)> = summary
        .episodes
        .iter()
        .filter(|e| e.failure_class != "ok")
        .map(|e| (e.id.as_str(), e.error.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(failed, [] as [(&str, &str); 0], "every episode measured");
    assert_eq!(summary.episodes.len(), 40);
    assert_eq!(summary.gave_up, None);
    let rate_limits = summary.rate_limits.expect("the 429s are in the summary");
    assert_eq!(rate_limits.answers_429 as usize, limited.answered_429.load(SeqCst));
    assert!(rate_limits.answers_429 > 0);
    assert!(rate_limits.lowest_requests_at_once <= 4, "halved at least once from 8: {rate_limits:?}");
    assert!(rate_limits.lowest_requests_at_once >= 1);
    assert_eq!(limited.most.load(SeqCst), 2);
    // And `/metrics` says so.
    assert_eq!(metric(&metrics, "basecamp_sandbox_policy_rate_limited_total"), Some(rate_limits.answers_429));
    let limit = rate_limits.requests_at_once_at_end as u64;
    assert_eq!(metric(&metrics, "basecamp_sandbox_policy_requests_at_once_limit"), Some(limit));
}

/// An endpoint that never answers 429 is never throttled: the summary has
/// no rate limits, and the shard ran its episodes as many at once as asked.
#[tokio::test]
async fn without_429s_nothing_is_throttled() {
    let limited = Arc::new(Limited {
        allowed: usize::MAX,
        answer_ms: 50,
        in_flight: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
        answered_429: AtomicUsize::new(0),
    });
    let (summary, metrics) = a_shard_against(&limited, 16, 8).await;
    assert_eq!(summary.aggregate.not_measured, 0);
    assert_eq!(summary.rate_limits, None);
    assert_eq!(metric(&metrics, "basecamp_sandbox_policy_rate_limited_total"), Some(0));
    assert_eq!(metric(&metrics, "basecamp_sandbox_policy_requests_at_once_limit"), Some(0));
    assert_eq!(limited.most.load(SeqCst), 8, "8 requests at once");
}

/// A plan step whose request was still waiting for its place among the
/// requests at once when the step's time ran out is the endpoint's rate
/// limit, not the agent: `policy_error` (not measured), category
/// `PolicyRateLimited`. Before, it read `plan_step_timeout`, the agent's.
#[tokio::test]
async fn a_plan_step_that_ran_out_waiting_for_its_place_is_the_rate_limit_not_the_agent() {
    // Nothing listens there: the request must never be sent.
    let policy =
        Policy::from_config(&PolicyConfig::OpenAi(Box::new(OpenAiConfig::new("http://127.0.0.1:9/v1", "m")))).unwrap();
    // One request of another episode holds the only place a 429 left.
    let throttle = policy.throttle().expect("an endpoint adapts to 429s").clone();
    let holding = throttle.request().await;
    holding.rate_limited(None);
    let metrics = Arc::new(SandboxMetrics::new());
    let runner = EpisodeRunner {
        plan_step_timeout: Duration::from_millis(200),
        metrics: Some(metrics.clone()),
        ..EpisodeRunner::new(ToolExecutor::new(NullWrites::Warn), policy)
    };
    let dir = tempfile::tempdir().unwrap();
    let summary =
        run_shard(Arc::new(runner), vec![input("e0")], dir.path(), 1, StopSignal::new(), |_| {}).await.unwrap();
    let episode = &summary.episodes[0];
    assert_eq!(episode.failure_class, "policy_error", "{episode:?}");
    let error = episode.error.as_deref().unwrap_or_default();
    assert!(error.contains("ran out while its request waited for its place among the requests at once"), "{error}");
    assert_eq!(summary.aggregate.not_measured, 1);
    let counted = r#"basecamp_sandbox_policy_errors_total{category="PolicyRateLimited"} 1"#;
    assert!(metrics.encode().lines().any(|l| l == counted), "{}", metrics.encode());
    drop(holding);
}
