//! The serve benchmark: `cargo bench -p basecamp-cli --bench serve` (`make bench-serve`).
//!
//! Writes `SERVE_BENCH_TRACES` (default 2,000) traces with the real trace
//! writer (`synthetic::generate`, 10 steps of 20 tokens x top-5 each) in
//! the operator's upload layout, 100 episodes a shard, each shard with its
//! `summary.json`, and starts two `basecamp serve` processes (the release
//! binary) on that directory:
//!
//! - `cached`: as shipped; a request walks the directory and reads only
//!   what changed since the last one;
//! - `rescan` (the peer): `--rescan-every-request`, how serve worked
//!   before: `Catalog::scan` on every request, then every trace again for
//!   the task page.
//!
//! Every round GETs the task page (all variants) and the task list from
//! both, in turn, over HTTP on 127.0.0.1; ratios are taken per round. The
//! pages must be byte-identical. Reported apart: the cached server's first
//! request (which reads everything), and its task page when one new trace
//! (without a summary) has landed before each request, as in a run still
//! writing. `SERVE_BENCH_ROUNDS` (default 11) sets the rounds. Writes a
//! table and `bench/results/serve.json`.

#[path = "../tests/support/http.rs"]
mod http;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use basecamp_bench_support::{TempDir, env_or, git_commit, loadavg, machine, median, utc_now, write_results};
use basecamp_trace::synthetic::{EpisodeShape, generate};
use serde_json::{Value, json};

const RESULTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/results/serve.json");
const NAMESPACE: &str = "evals";
const TASK: &str = "shipping-delay";
const PER_SHARD: usize = 100;
/// The cache's settle time (`serve::cache::SETTLE`) and a margin: files
/// older than this are trusted by their metadata.
const SETTLED_AFTER: Duration = Duration::from_millis(2500);

fn main() {
    let started = Instant::now();
    let loadavg_at_start = loadavg();
    let traces: usize = env_or("SERVE_BENCH_TRACES", 2000).max(1);
    let rounds: usize = env_or("SERVE_BENCH_ROUNDS", 11).max(1);
    let dir = TempDir::new("serve");
    let (shards, bytes) = write_traces(dir.path(), traces);
    println!("{traces} traces in {shards} shards, {:.1} MB on disk", bytes as f64 / 1e6);
    std::thread::sleep(SETTLED_AFTER);

    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", dir.path().to_str().expect("a UTF-8 temp dir"), "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        http::Server::start_with(&args, &[])
    };
    let cached = serve(&[]);
    let rescan = serve(&["--rescan-every-request"]);
    let task_page = format!("/tasks/{NAMESPACE}/{TASK}");
    let timed = |server: &http::Server, path: &str| {
        let at = Instant::now();
        let response = http::get(&server.addr, path);
        let seconds = at.elapsed().as_secs_f64();
        assert_eq!(response.status, 200, "{path}: {}", response.text());
        (seconds, response.body)
    };

    let (cold_task, first_page) = timed(&cached, &task_page);
    assert!(
        String::from_utf8_lossy(&first_page).contains(&format!("<td>{}</td>", traces / 2)),
        "the task page counts every episode"
    );
    let (cold_index, _) = timed(&cached, "/");
    let mut task = Samples::default();
    let mut index = Samples::default();
    for _ in 0..rounds {
        for (path, samples) in [(task_page.as_str(), &mut task), ("/", &mut index)] {
            let (peer, peer_page) = timed(&rescan, path);
            let (warm, warm_page) = timed(&cached, path);
            assert!(peer_page == warm_page, "{path}: the cached page differs from the full scan's");
            samples.rescan.push(peer);
            samples.cached.push(warm);
        }
    }
    let (task_ratio, index_ratio) = (task.ratios(), index.ratios());
    // A run still writing: one new trace lands before each request.
    let live = dir.path().join("2026/11/30").join(NAMESPACE).join(TASK).join("a/shard-live");
    fs::create_dir_all(&live).expect("create the live shard");
    let mut after_a_new_trace = Vec::new();
    for k in 0..rounds.min(5) {
        let mut episode = generate(&shape(traces as u64 + k as u64 + 1));
        episode.header.namespace = NAMESPACE.into();
        episode.header.task = TASK.into();
        episode.header.episode_id = format!("ep-live-{k}");
        fs::write(live.join(format!("ep-live-{k}.trace")), episode.write_to(Vec::new(), 3).expect("encodes"))
            .expect("write a trace");
        let (seconds, page) = timed(&cached, &task_page);
        assert!(String::from_utf8_lossy(&page).contains(&format!("<td>{}</td>", traces.div_ceil(2) + k + 1)));
        after_a_new_trace.push(seconds);
    }

    println!("\nmedian [min .. max] over {rounds} rounds, seconds per request:\n");
    println!("| page | rescan (peer) | cached, warm | rescan / cached |");
    println!("|---|---|---|---|");
    for (name, s, r) in [("task page", &task, &task_ratio), ("task list", &index, &index_ratio)] {
        println!("| {name} | {} | {} | {} |", spread(&s.rescan, 3), spread(&s.cached, 4), spread(r, 1));
    }
    println!(
        "\ncached server, first request (reads everything): task page {cold_task:.3} s, then task list {cold_index:.4} s"
    );
    println!(
        "cached server, task page with one new trace landed before each request: {} s",
        spread(&after_a_new_trace, 3)
    );

    let report = json!({
        "benchmark": "serve",
        "command": "cargo bench -p basecamp-cli --bench serve",
        "date_utc": utc_now(),
        "commit": git_commit(),
        "machine": machine(loadavg_at_start),
        "input": {
            "traces": traces,
            "shards": shards,
            "episodes_per_shard": PER_SHARD,
            "variants": 2,
            "summaries": "one summary.json per shard, naming every trace in it",
            "episode_shape": "synthetic::generate: 10 steps, 10 memory keys, 20 tokens x top-5 per step",
            "on_disk_bytes": bytes,
        },
        "rounds": rounds,
        "seconds": {
            "task_page": task.json(),
            "task_list": index.json(),
            "cached_first_request": {"task_page": cold_task, "task_list_after_it": cold_index},
            "cached_task_page_after_a_new_trace": stats(&after_a_new_trace),
        },
        "ratios": {
            "task_page_rescan_over_cached": stats(&task_ratio),
            "task_list_rescan_over_cached": stats(&index_ratio),
        },
        "pages_identical": true,
        "wall_seconds": started.elapsed().as_secs_f64(),
    });
    write_results(RESULTS, &report);
    let path = Path::new(RESULTS);
    println!("\nwrote {} in {:.1} s", path.display(), started.elapsed().as_secs_f64());
}

/// One page's request times from both servers, round by round.
#[derive(Default)]
struct Samples {
    rescan: Vec<f64>,
    cached: Vec<f64>,
}

impl Samples {
    fn ratios(&self) -> Vec<f64> {
        self.rescan.iter().zip(&self.cached).map(|(peer, warm)| peer / warm).collect()
    }

    fn json(&self) -> Value {
        json!({"rescan": stats(&self.rescan), "cached_warm": stats(&self.cached)})
    }
}

fn stats(v: &[f64]) -> Value {
    json!({"median": median(v), "min": min(v), "max": max(v), "all": v})
}

fn spread(v: &[f64], decimals: usize) -> String {
    format!("{:.d$} [{:.d$} .. {:.d$}]", median(v), min(v), max(v), d = decimals)
}

/// The operator's layout: `<date>/<namespace>/<task>/<variant>/shard-<k>/`,
/// each shard's traces and summary. Returns (shards, bytes written).
fn write_traces(root: &Path, traces: usize) -> (usize, u64) {
    let mut bytes = 0;
    let mut shards = 0;
    for (variant, count) in [("a", traces.div_ceil(2)), ("b", traces / 2)] {
        for (shard, first) in (0..count).step_by(PER_SHARD).enumerate() {
            let dir = root.join("2026/11/30").join(NAMESPACE).join(TASK).join(variant).join(format!("shard-{shard}"));
            fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("failed to create {}: {e}", dir.display()));
            let mut episodes = Vec::new();
            for i in first..(first + PER_SHARD).min(count) {
                let seed = i as u64 + 1;
                let mut episode = generate(&shape(seed));
                let id = format!("ep-{i:05}");
                episode.header.namespace = NAMESPACE.into();
                episode.header.task = TASK.into();
                episode.header.variant = variant.into();
                episode.header.shard = shard as u32;
                episode.header.episode_id = id.clone();
                let file = format!("{id}.trace");
                let encoded = episode.write_to(Vec::new(), 3).expect("a synthetic episode encodes");
                bytes += encoded.len() as u64;
                fs::write(dir.join(&file), encoded).expect("write a trace");
                let accuracy = if i % 7 == 0 { 0.5 } else { 1.0 };
                episodes.push(json!({
                    "id": id, "outcome": "completed", "failure_class": if i % 7 == 0 { "timeout" } else { "ok" },
                    "trace_file": file, "rollbacks": 0, "warnings": [],
                    "metrics": {
                        "tool_call_accuracy": accuracy, "tool_call_accuracy_lenient": accuracy,
                        "plan_step_f1": accuracy, "memory_consistency": 1.0 - (i % 5) as f64 * 0.1,
                        "error_rate": 1.0 - accuracy, "resolution_time_s": 1.0 + (i % 13) as f64 * 0.1,
                        "reward": accuracy, "tool_calls": 10, "steps": 10
                    }
                }));
            }
            let summary = json!({
                "namespace": NAMESPACE, "task": TASK, "variant": variant, "shard": shard, "shard_count": count.div_ceil(PER_SHARD),
                "started_unix_nanos": 1_796_000_000_000_000_000_i64, "wall_seconds": 60.0,
                "aggregate": {"episodes": episodes.len(), "means": {}, "resolution_time_p50_s": 1.5,
                              "resolution_time_p95_s": 2.0, "outcomes": {}},
                "episodes": episodes, "lost": []
            });
            let text = serde_json::to_vec(&summary).expect("a JSON value always serializes");
            bytes += text.len() as u64;
            fs::write(dir.join("summary.json"), text).expect("write a summary");
            shards += 1;
        }
    }
    (shards, bytes)
}

/// The benchmark's episode: 10 steps, 10 memory keys, 20 tokens x top-5 per step.
fn shape(seed: u64) -> EpisodeShape {
    EpisodeShape { seed, steps: 10, memory_keys: 10, tokens_per_step: 20, ..Default::default() }
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}
