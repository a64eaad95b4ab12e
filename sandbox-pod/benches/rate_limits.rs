//! A shard against an endpoint that rate-limits it: how long the test set
//! takes and how many episodes its 429s cost, with the throttle
//! (`policy::throttle`) and with retries alone, beside a run that asks
//! exactly what the endpoint allows.
//!
//! The endpoint is an OpenAI-compatible server on loopback, in this
//! process, answering "done" after `RATE_BENCH_SERVICE_MS` (50 ms) and
//! answering 429 with `Retry-After: 1` beyond its limit, in one of two
//! shapes a hosted API has:
//!
//! - `at_once`: at most 3 requests in flight (a per-key concurrency limit);
//! - `per_second`: 40 requests a second from a token bucket refilled
//!   continuously, holding at most 10 (an RPM-style limit as OpenAI and
//!   Anthropic describe theirs; about 2 in flight at 50 ms each).
//!
//! Cases, each a fresh server and one shard of `RATE_BENCH_EPISODES` (200)
//! one-turn episodes, the default 4 attempts a request:
//!
//! - `adaptive`: 16 episodes at once (2 shards x 8 of `basecamp run`, one
//!   client), the throttle on (the default);
//! - `retries_only`: the same, `adapt_to_rate_limits: false` (what runs
//!   did before the throttle);
//! - `at_capacity` (`at_once` only): 3 episodes at once, which never meet
//!   429: a user who knew the limit and set `--concurrency` to it. For
//!   `per_second` the floor is computed: (episodes - the bucket's 10) / rate.
//!
//! Cases run round-robin (each round runs every case once) and ratios are
//! taken per round. Writes `bench/results/rate_limits.json`.
//! `RATE_BENCH_ROUNDS` (3), `RATE_BENCH_EPISODES` and `RATE_BENCH_SERVICE_MS`
//! change it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use basecamp_bench_support::{TempDir, env_or, git_commit, loadavg, machine, median, spread, utc_now, write_results};
use basecamp_sandbox::driver::{StopSignal, run_shard};
use basecamp_sandbox::episode::EpisodeRunner;
use basecamp_sandbox::executor::{NullWrites, ToolExecutor};
use basecamp_sandbox::policy::{OpenAiConfig, Policy, PolicyConfig};
use basecamp_sandbox::testing::one_question;
use serde_json::{Value, json};

const RESULTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/results/rate_limits.json");
/// Requests in flight `at_once` allows.
const AT_ONCE: usize = 3;
/// Requests per second `per_second` allows.
const PER_SECOND: usize = 40;
/// Episodes at once of the rate-limited cases (2 shards x 8).
const CROWD: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Limit {
    AtOnce(usize),
    PerSecond(usize),
}

/// The server's counts.
#[derive(Default)]
struct Counts {
    in_flight: AtomicUsize,
    most: AtomicUsize,
    served: AtomicUsize,
    answered_429: AtomicUsize,
    /// The token bucket of `per_second`: (tokens, when last refilled).
    bucket: std::sync::Mutex<Option<(f64, Instant)>>,
}

/// Serves the endpoint on a port of 127.0.0.1; returns its `.../v1` URL.
async fn serve(limit: Limit, service: Duration, counts: Arc<Counts>) -> String {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || async move {
            let now = counts.in_flight.fetch_add(1, SeqCst) + 1;
            let over = match limit {
                Limit::AtOnce(allowed) => now > allowed,
                Limit::PerSecond(rate) => {
                    let burst = rate as f64 / 4.0;
                    let mut bucket = counts.bucket.lock().expect("the bucket is never poisoned");
                    let (tokens, refilled) = bucket.get_or_insert((burst, Instant::now()));
                    *tokens = (*tokens + refilled.elapsed().as_secs_f64() * rate as f64).min(burst);
                    *refilled = Instant::now();
                    let over = *tokens < 1.0;
                    if !over {
                        *tokens -= 1.0;
                    }
                    over
                }
            };
            if over {
                counts.in_flight.fetch_sub(1, SeqCst);
                counts.answered_429.fetch_add(1, SeqCst);
                let busy = json!({"error": {"message": "Rate limit reached for requests"}});
                return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], axum::Json(busy)).into_response();
            }
            counts.most.fetch_max(now, SeqCst);
            tokio::time::sleep(service).await;
            counts.in_flight.fetch_sub(1, SeqCst);
            counts.served.fetch_add(1, SeqCst);
            axum::Json(json!({"choices": [{"message": {"content": "done"}, "finish_reason": "stop"}]})).into_response()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let endpoint = format!("http://{}/v1", listener.local_addr().expect("bound"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    endpoint
}

/// One case's run: seconds, episodes not measured, the server's counts.
struct Run {
    seconds: f64,
    not_measured: u32,
    answered_429: usize,
    most_at_once: usize,
}

async fn run(limit: Limit, service: Duration, episodes: usize, at_once: usize, adapt: bool) -> Run {
    let counts = Arc::new(Counts::default());
    let endpoint = serve(limit, service, counts.clone()).await;
    let mut config = OpenAiConfig::new(endpoint, "m");
    config.adapt_to_rate_limits = adapt;
    let policy = Policy::from_config(&PolicyConfig::OpenAi(Box::new(config))).expect("the policy builds");
    let runner = EpisodeRunner::new(ToolExecutor::new(NullWrites::Warn), policy);
    let inputs = (0..episodes).map(|i| one_question(&format!("e{i}"))).collect();
    let dir = TempDir::new("rate-limits");
    let started = Instant::now();
    let summary = run_shard(Arc::new(runner), inputs, dir.path(), at_once, StopSignal::new(), |_| {})
        .await
        .expect("the shard runs");
    Run {
        seconds: started.elapsed().as_secs_f64(),
        not_measured: summary.aggregate.not_measured,
        answered_429: counts.answered_429.load(SeqCst),
        most_at_once: counts.most.load(SeqCst),
    }
}

/// A case's runs over the rounds, as the result file has them.
fn case(runs: &[Run]) -> Value {
    let of = |f: fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<_>>();
    json!({
        "seconds": spread(&of(|r| r.seconds)),
        "not_measured": of(|r| f64::from(r.not_measured)),
        "answered_429": of(|r| r.answered_429 as f64),
        "most_at_once": of(|r| r.most_at_once as f64),
    })
}

fn main() {
    let rounds: usize = env_or("RATE_BENCH_ROUNDS", 3).max(1);
    let episodes: usize = env_or("RATE_BENCH_EPISODES", 200).max(1);
    let service = Duration::from_millis(env_or("RATE_BENCH_SERVICE_MS", 50));
    let loadavg_at_start = loadavg();
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    // Quiet: each lowering is a warning line on stderr.
    basecamp_sandbox::stderr::around_lines(Some(Box::new(|_| {})));

    let scenarios = [("at_once", Limit::AtOnce(AT_ONCE)), ("per_second", Limit::PerSecond(PER_SECOND))];
    let mut results = serde_json::Map::new();
    for (name, limit) in scenarios {
        let (mut adaptive, mut retries_only, mut at_capacity) = (Vec::new(), Vec::new(), Vec::new());
        runtime.block_on(async {
            for round in 0..rounds {
                adaptive.push(run(limit, service, episodes, CROWD, true).await);
                retries_only.push(run(limit, service, episodes, CROWD, false).await);
                if let Limit::AtOnce(allowed) = limit {
                    at_capacity.push(run(limit, service, episodes, allowed, true).await);
                }
                eprintln!("{name}: round {} of {rounds} done", round + 1);
            }
        });
        let per_round =
            |a: &[Run], b: &[Run]| -> Vec<f64> { a.iter().zip(b).map(|(a, b)| a.seconds / b.seconds).collect() };
        let floor_s = match limit {
            Limit::AtOnce(_) => None,
            // The first `burst` requests need no refill.
            Limit::PerSecond(rate) => Some((episodes as f64 - rate as f64 / 4.0) / rate as f64),
        };
        let mut doc = json!({
            "limit": match limit {
                Limit::AtOnce(n) => format!("{n} requests in flight"),
                Limit::PerSecond(n) => format!("{n} requests per second (token bucket of {})", n / 4),
            },
            "adaptive": case(&adaptive),
            "retries_only": case(&retries_only),
            "ratio_adaptive_over_retries_only_seconds": spread(&per_round(&adaptive, &retries_only)),
        });
        println!("{name} ({}), {episodes} episodes, {rounds} rounds:", doc["limit"].as_str().unwrap_or_default());
        let line = |label: &str, runs: &[Run]| {
            let seconds: Vec<f64> = runs.iter().map(|r| r.seconds).collect();
            let lost: Vec<u32> = runs.iter().map(|r| r.not_measured).collect();
            let answered: Vec<usize> = runs.iter().map(|r| r.answered_429).collect();
            println!("  {label:<13} median {:>6.2} s   not measured {lost:?}   429s {answered:?}", median(&seconds));
        };
        line("adaptive", &adaptive);
        line("retries_only", &retries_only);
        if !at_capacity.is_empty() {
            line("at_capacity", &at_capacity);
            doc["at_capacity"] = case(&at_capacity);
            doc["ratio_adaptive_over_at_capacity_seconds"] = spread(&per_round(&adaptive, &at_capacity));
        }
        if let Some(floor) = floor_s {
            let ratios: Vec<f64> = adaptive.iter().map(|r| r.seconds / floor).collect();
            println!("  floor         {floor:>6.2} s ((episodes - burst) / rate)");
            doc["floor_seconds"] = json!(floor);
            doc["ratio_adaptive_over_floor_seconds"] = spread(&ratios);
        }
        results.insert(name.to_string(), doc);
    }
    let doc = json!({
        "bench": "rate_limits",
        "command": "cargo bench -p basecamp-sandbox --bench rate_limits",
        "date_utc": utc_now(),
        "git_commit": git_commit(),
        "machine": machine(loadavg_at_start),
        "what": "one shard of one-turn episodes against a loopback OpenAI-compatible server that answers 429 \
                 (Retry-After: 1) beyond its limit: the throttle on (adaptive) and off (retries_only), 16 episodes \
                 at once, beside 3 at once against the at-once limit (at_capacity, never a 429)",
        "method": {"rounds": rounds, "episodes": episodes, "service_ms": service.as_millis() as u64,
                   "episodes_at_once": CROWD, "attempts_per_request": 4,
                   "order": "round-robin: each round runs every case once, each against a fresh server; ratios per round",
                   "elapsed_s": started.elapsed().as_secs_f64()},
        "scenarios": results,
    });
    write_results(RESULTS, &doc);
    println!("\nwrote {RESULTS}");
}
