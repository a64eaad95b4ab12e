//! The sandbox benchmark: `cargo bench -p basecamp-sandbox --bench sandbox`.
//!
//! Three measurements in one run, each against a peer timed in the same run:
//!
//! 1. **Executor overhead per tool call**, trace write included: per call,
//!    `ToolExecutor::call` + appending `CallOutcome::records()` to a
//!    `TraceWriter` + `end_step()` + dropping the outcome, minus calling the
//!    same in-process `Tool::Function` directly. Each group times the direct
//!    call, the executor with the trace in a `Vec<u8>`, the executor with the
//!    trace in a file, and (a candidate fix, not judged) the `Vec` case with
//!    the writer at zstd level -1, one after the other, order rotated; the
//!    overhead is the difference within a group. Memory holds 20 keys; each
//!    call's tool output patches 2 of them; a new trace every 20 calls.
//! 2. **Timeout precision**: how late the executor returns a timed-out call
//!    (elapsed - configured timeout) for a recorded tool that never answers,
//!    timeouts of 1-20 ms, 1,000 calls one after another, each started at a
//!    random point of tokio's 1 ms timer tick; peers: `tokio::time::sleep`
//!    and `std::thread::sleep` (the OS floor) for the same durations. Then
//!    the same calls 50 at a time, all started together.
//! 3. **Episodes per second**: `EpisodeRunner::run` on a 20-step episode
//!    (19 tool-call turns from a scripted policy, then a final answer) with a
//!    zero-latency recorded tool, traces written to a temp dir; 1, 2 and 4
//!    concurrent tasks, round-robin, each followed by a CPU-bound peer in the
//!    same number of tasks, whose speedup shows how many cores were free.
//!
//! Everything runs on a multi-threaded tokio runtime with one worker per CPU,
//! as the sandbox binary would, and measured code runs in spawned tasks.
//! Targets are judged on percentiles of all samples pooled; the per-round
//! spread is printed next to them. Output: a table on stdout and
//! `bench/results/sandbox.json`. `SANDBOX_BENCH_CALLS`,
//! `SANDBOX_BENCH_TIMEOUT_CALLS`, `SANDBOX_BENCH_ROUNDS` and
//! `SANDBOX_BENCH_EPISODE_MS` change the sampling; a filter argument
//! (`... --bench sandbox -- overhead`, `timeout`, `episodes`) runs only that
//! part, for profiling, and writes no file.

use std::collections::BTreeMap;
use std::fs;
use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use basecamp_bench_support::{env_or, git_commit, loadavg, machine, utc_now, write_results};
use basecamp_sandbox::episode::{EpisodeInput, EpisodeRunner, LiveInjections};
use basecamp_sandbox::executor::{NullWrites, ToolCall, ToolDef, ToolExecutor};
use basecamp_sandbox::metrics::SandboxMetrics;
use basecamp_sandbox::policy::{ChatMessage, Policy, PolicyConfig, ScriptedConfig, ToolSpec};
use basecamp_sandbox::tools::recorded::{RecordedTool, Recording};
use basecamp_sandbox::tools::{Tool, ToolFn, ToolOutput};
use basecamp_trace::pb::{EpisodeEnd, Header, Outcome, StepKind, StepStatus, record::Body};
use basecamp_trace::writer::DEFAULT_ZSTD_LEVEL;
use basecamp_trace::{Memory, MemoryPatch, TraceWriter, hash_json, read_trace};
use serde_json::{Map, Value, json};

const RESULTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/results/sandbox.json");
const COMMAND: &str = "cargo bench -p basecamp-sandbox --bench sandbox";

const TARGET_OVERHEAD_P50_US: f64 = 20.0;
const TARGET_OVERHEAD_P99_US: f64 = 100.0;
const TARGET_LATENESS_P99_MS: f64 = 2.0;

/// Calls per trace file in the overhead measurement: one episode's worth.
const CALLS_PER_TRACE: u32 = 20;
/// The zstd level of the candidate-fix case: a negative level skips Huffman-coding the literals,
/// which is most of the cost of compressing a frame of a few hundred bytes.
const FAST_ZSTD_LEVEL: i32 = -1;
const MEMORY_KEYS: usize = 20;
const TIMEOUTS_MS: [u64; 5] = [1, 2, 5, 10, 20];
/// Concurrent calls per batch in the batched timeout variant.
const TIMEOUT_BATCH: usize = 50;
/// A recorded tool this slow never answers within any timeout measured here.
const NEVER_MS: u64 = 3_600_000;
/// Consecutive chunks the sequential lateness samples are split into for the per-round spread.
const LATENESS_ROUNDS: usize = 5;
const EPISODE_STEPS: u32 = 20;
const EPISODE_CONCURRENCY: [usize; 3] = [1, 2, 4];

fn main() {
    let settings = Settings::from_env();
    let started = Instant::now();
    let loadavg_at_start = loadavg();
    let filter = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let runs = |part: &str| filter.as_deref().is_none_or(|f| part.contains(f));
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a tokio runtime builds");
    let tmp = tempfile::Builder::new().prefix("basecamp-sandbox-bench-").tempdir().expect("create a temp dir");

    let overhead = runs("overhead").then(|| runtime.block_on(measure_overhead(&settings, tmp.path())));
    if let Some(o) = &overhead {
        o.print();
    }
    let timeouts = runs("timeout").then(|| runtime.block_on(measure_timeouts(&settings)));
    if let Some(t) = &timeouts {
        t.print();
    }
    let episodes = runs("episodes").then(|| runtime.block_on(measure_episodes(&settings, tmp.path())));
    if let Some(e) = &episodes {
        e.print(overhead.as_ref());
    }
    let fixtures = runs("fixture").then(|| runtime.block_on(measure_fixtures(&settings)));
    if let Some(f) = &fixtures {
        f.print();
    }
    let (Some(overhead), Some(timeouts), Some(episodes), Some(fixtures)) = (overhead, timeouts, episodes, fixtures)
    else {
        println!("\nfiltered run: no file written");
        return;
    };

    let targets = targets(&overhead, &timeouts);
    print_targets(&targets);
    let elapsed_s = started.elapsed().as_secs_f64();
    let json = json!({
        "bench": "sandbox",
        "command": COMMAND,
        "date_utc": utc_now(),
        "git_commit": git_commit(),
        "machine": machine(loadavg_at_start.clone()),
        "runtime": {
            "tokio": "multi_thread runtime, enable_all",
            "worker_threads": workers,
            "where": "every measured loop runs in a task spawned on the runtime, as episodes do",
        },
        "method": {
            "settings": settings.to_json(),
            "percentiles": "nearest rank over the samples named; 'per_round' gives the median [min, max] of \
                            the per-round figure",
            "elapsed_s": elapsed_s,
        },
        "executor_overhead": overhead.to_json(),
        "timeout_precision": timeouts.to_json(),
        "episodes": episodes.to_json(),
        "recorded_fixture_lookup": fixtures.to_json(),
        "targets": targets.iter().map(Target::to_json).collect::<Vec<_>>(),
    });
    write_results(RESULTS, &json);
    let path = Path::new(RESULTS);
    println!(
        "\nwrote {} in {elapsed_s:.1} s; load average at start {}, at end {}",
        path.display(),
        loadavg_at_start.as_deref().unwrap_or("?"),
        loadavg().as_deref().unwrap_or("?"),
    );
}

// ---- settings -------------------------------------------------------------------

struct Settings {
    /// Measured calls per case in the overhead measurement (after warm-up).
    calls: usize,
    warmup_calls: usize,
    rounds: usize,
    timeout_calls: usize,
    /// Per case and round in the episode measurement.
    episode_window: Duration,
}

impl Settings {
    fn from_env() -> Self {
        let rounds = env_or("SANDBOX_BENCH_ROUNDS", 5usize).max(1);
        Self {
            calls: env_or("SANDBOX_BENCH_CALLS", 20_000usize).max(rounds * 100),
            warmup_calls: 2_000,
            rounds,
            timeout_calls: env_or("SANDBOX_BENCH_TIMEOUT_CALLS", 1_000usize).max(TIMEOUTS_MS.len()),
            episode_window: Duration::from_millis(env_or("SANDBOX_BENCH_EPISODE_MS", 400u64).max(10)),
        }
    }

    fn to_json(&self) -> Value {
        json!({"overhead_calls": self.calls, "overhead_warmup_calls": self.warmup_calls, "rounds": self.rounds,
               "timeout_calls": self.timeout_calls, "episode_window_ms": self.episode_window.as_millis() as u64})
    }
}

// ---- statistics -----------------------------------------------------------------

/// Percentiles of a set of samples, in the samples' unit (ns here).
#[derive(Debug, Clone, Copy)]
struct Dist {
    n: usize,
    min: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
    mean: f64,
}

impl Dist {
    fn of(samples: &[i64]) -> Self {
        let mut s = samples.to_vec();
        s.sort_unstable();
        let at = |q: f64| {
            let rank = (q * s.len() as f64).ceil() as usize;
            s[rank.clamp(1, s.len()) - 1] as f64
        };
        Self {
            n: s.len(),
            min: s[0] as f64,
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            p999: at(0.999),
            max: s[s.len() - 1] as f64,
            mean: s.iter().map(|&v| v as f64).sum::<f64>() / s.len() as f64,
        }
    }

    /// In `1/scale` ns units (1e3: µs, 1e6: ms).
    fn to_json(self, scale: f64) -> Value {
        let r = |v: f64| round3(v / scale);
        json!({"n": self.n, "min": r(self.min), "p50": r(self.p50), "p90": r(self.p90), "p99": r(self.p99),
               "p99_9": r(self.p999), "max": r(self.max), "mean": r(self.mean)})
    }
}

/// Median, min and max of a per-round figure.
#[derive(Debug, Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        Self { median: v[v.len() / 2], min: v[0], max: v[v.len() - 1] }
    }

    fn to_json(self, scale: f64) -> Value {
        json!({"median": round3(self.median / scale), "min": round3(self.min / scale), "max": round3(self.max / scale)})
    }

    fn show(self, scale: f64, decimals: usize) -> String {
        format!("{:.d$} [{:.d$} .. {:.d$}]", self.median / scale, self.min / scale, self.max / scale, d = decimals)
    }
}

/// Per-round p50 and p99 of `samples` split into `rounds` consecutive chunks.
fn per_round(samples: &[i64], rounds: usize) -> (Spread, Spread) {
    let chunk = samples.len().div_ceil(rounds);
    let dists: Vec<Dist> = samples.chunks(chunk).map(Dist::of).collect();
    (
        Spread::of(&dists.iter().map(|d| d.p50).collect::<Vec<_>>()),
        Spread::of(&dists.iter().map(|d| d.p99).collect::<Vec<_>>()),
    )
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn nanos(d: Duration) -> i64 {
    d.as_nanos() as i64
}

// ---- 1. executor overhead ---------------------------------------------------------

/// The in-process tool: an order lookup whose answer patches two memory keys.
fn lookup_tool() -> ToolFn {
    Arc::new(|args: &Value| {
        let n = args.get("n").and_then(Value::as_u64).unwrap_or(0);
        let status = if n.is_multiple_of(2) { "in_transit" } else { "delayed" };
        Ok(ToolOutput {
            observation: json!({"order_id": args["order_id"].clone(), "status": status, "eta_days": n % 5,
                                "carrier": "DHL", "last_scan": "Leipzig hub"}),
            memory_patch: MemoryPatch::default().set("shipping_status", json!(status)).set("last_lookup", json!(n)),
            response_bytes: 0,
        })
    })
}

/// 20 keys of customer-support context; `shipping_status` and `last_lookup` are the ones the tool patches.
fn initial_memory() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("shipping_status".into(), json!("unknown"));
    m.insert("last_lookup".into(), json!(0));
    for i in 0..MEMORY_KEYS - 2 {
        let value =
            if i % 3 == 0 { json!(i * 17) } else { json!(format!("context value {i} for the customer's open ticket")) };
        m.insert(format!("key_{i:02}"), value);
    }
    m
}

fn header(task: &str) -> Header {
    Header { task: task.into(), variant: "a".into(), ..Default::default() }
}

fn episode_end(steps: u32) -> EpisodeEnd {
    EpisodeEnd { outcome: Outcome::Completed as i32, steps, ..Default::default() }
}

/// One executor with its own memory and trace, as one episode would hold them.
struct Traced<W: Write> {
    memory: Memory,
    writer: Option<TraceWriter<W>>,
    step: u32,
    records: u64,
    trace_bytes: u64,
    not_ok: usize,
    metrics: SandboxMetrics,
}

/// Times of one traced call, ns.
#[derive(Clone, Copy, Default)]
struct CallTimes {
    call: i64,
    append: i64,
    end_step: i64,
    /// Dropping the outcome (the direct call's time includes dropping its output too).
    drop: i64,
    /// `SandboxMetrics::observe_call`, which the episode runner adds per call; not in `total`.
    metrics: i64,
}

impl CallTimes {
    fn total(self) -> i64 {
        self.call + self.append + self.end_step + self.drop
    }
}

impl<W: Write> Traced<W> {
    fn new(writer: TraceWriter<W>) -> Self {
        Self {
            memory: Memory::from_object(&initial_memory()),
            writer: Some(writer),
            step: 0,
            records: 0,
            trace_bytes: 0,
            not_ok: 0,
            metrics: SandboxMetrics::new(),
        }
    }

    /// The timed part: the executor's call, appending its records, closing the step.
    async fn call(&mut self, executor: &ToolExecutor, args: &Value) -> CallTimes {
        self.step += 1;
        let step = self.step;
        let writer = self.writer.as_mut().expect("a writer is open between rotations");
        let call =
            ToolCall { step, call_id: "call_1", plan_label: "lookup", name: "lookup_order", arguments: Ok(args) };
        let t0 = Instant::now();
        let outcome = executor.call(call, &mut self.memory).await;
        let t1 = Instant::now();
        let mut records = 0;
        for body in outcome.records() {
            writer.append(step, body).expect("appending to the bench trace");
            records += 1;
        }
        let t2 = Instant::now();
        writer.end_step().expect("closing a step of the bench trace");
        let t3 = Instant::now();
        self.metrics.observe_call(&outcome);
        let ok = outcome.status == StepStatus::Ok;
        let t4 = Instant::now();
        drop(outcome);
        let t5 = Instant::now();
        self.records += records;
        self.not_ok += usize::from(!ok);
        CallTimes {
            call: nanos(t1 - t0),
            append: nanos(t2 - t1),
            end_step: nanos(t3 - t2),
            drop: nanos(t5 - t4),
            metrics: nanos(t4 - t3),
        }
    }

    /// After an episode's worth of calls: finishes the trace (untimed) and returns its output.
    fn rotate(&mut self, next: TraceWriter<W>) -> W {
        let old = self.writer.replace(next).expect("a writer is open between rotations");
        self.trace_bytes += old.bytes_written();
        let steps = std::mem::take(&mut self.step);
        old.finish(episode_end(steps)).expect("finishing the bench trace")
    }
}

struct Overhead {
    samples: usize,
    warmup: usize,
    rounds: usize,
    direct: Vec<i64>,
    vec: Vec<CallTimes>,
    file: Vec<CallTimes>,
    /// The Vec case with the trace writer at `FAST_ZSTD_LEVEL`: a candidate fix, not a target.
    fast: Vec<CallTimes>,
    records_per_call: f64,
    trace_bytes_per_call: f64,
    fast_trace_bytes_per_call: f64,
    not_ok: usize,
}

async fn measure_overhead(settings: &Settings, tmp: &Path) -> Overhead {
    let (calls, warmup, rounds) = (settings.calls, settings.warmup_calls, settings.rounds);
    let dir = tmp.join("overhead");
    fs::create_dir_all(&dir).expect("create the overhead trace dir");
    let task = tokio::spawn(async move {
        let tool = lookup_tool();
        let mut executor = ToolExecutor::new(NullWrites::Warn);
        executor.add_tool("lookup_order", ToolDef::new(Tool::Function(tool.clone()), Duration::from_millis(800)));
        let vec_writer =
            |level: i32| TraceWriter::new(Vec::with_capacity(64 << 10), header("overhead"), level).expect("vec writer");
        let file_path = |n: u64| dir.join(format!("calls-{n}.trace"));
        // As `EpisodeRunner::run` opens its trace: `TraceWriter::create`, the writer's default level.
        let file_writer = |n: u64| TraceWriter::create(file_path(n), header("overhead")).expect("file writer");
        let mut file_no = 0u64;
        let mut in_vec = Traced::new(vec_writer(DEFAULT_ZSTD_LEVEL));
        let mut in_file = Traced::new(file_writer(file_no));
        let mut in_fast = Traced::new(vec_writer(FAST_ZSTD_LEVEL));
        let mut direct = Vec::with_capacity(calls);
        let mut vec = Vec::with_capacity(calls);
        let mut file = Vec::with_capacity(calls);
        let mut fast = Vec::with_capacity(calls);
        for i in 0..warmup + calls {
            let args = json!({"order_id": "A-1042", "include_history": false, "n": i});
            let (mut d, mut v, mut f, mut q) = (0, CallTimes::default(), CallTimes::default(), CallTimes::default());
            for case in 0..4 {
                match (i + case) % 4 {
                    0 => {
                        let t0 = Instant::now();
                        drop(black_box(tool(black_box(&args))));
                        d = nanos(t0.elapsed());
                    }
                    1 => v = in_vec.call(&executor, &args).await,
                    2 => f = in_file.call(&executor, &args).await,
                    _ => q = in_fast.call(&executor, &args).await,
                }
            }
            if i >= warmup {
                direct.push(d);
                vec.push(v);
                file.push(f);
                fast.push(q);
            }
            if in_vec.step >= CALLS_PER_TRACE {
                in_vec.rotate(vec_writer(DEFAULT_ZSTD_LEVEL));
                in_fast.rotate(vec_writer(FAST_ZSTD_LEVEL));
            }
            if in_file.step >= CALLS_PER_TRACE {
                in_file.rotate(file_writer(file_no + 1));
                fs::remove_file(file_path(file_no)).expect("remove a finished bench trace");
                file_no += 1;
            }
        }
        let traced_calls = (warmup + calls) as f64;
        let finished_calls = traced_calls - f64::from(in_vec.step);
        Overhead {
            samples: calls,
            warmup,
            rounds,
            direct,
            vec,
            file,
            fast,
            records_per_call: in_vec.records as f64 / traced_calls,
            trace_bytes_per_call: in_vec.trace_bytes as f64 / finished_calls,
            fast_trace_bytes_per_call: in_fast.trace_bytes as f64 / finished_calls,
            not_ok: in_vec.not_ok + in_file.not_ok + in_fast.not_ok,
        }
    });
    let overhead = task.await.expect("the overhead task completes");
    assert_eq!(overhead.not_ok, 0, "every bench tool call should succeed");
    overhead
}

impl Overhead {
    fn diff(&self, traced: &[CallTimes]) -> Vec<i64> {
        traced.iter().zip(&self.direct).map(|(t, d)| t.total() - d).collect()
    }

    fn print(&self) {
        println!("\n1. executor overhead per tool call (trace write included), µs");
        println!(
            "   {} calls per case after {} warm-up, interleaved; memory {MEMORY_KEYS} keys, 2 patched per call",
            self.samples, self.warmup
        );
        println!(
            "   {:<44} {:>8} {:>8} {:>8} {:>8}   per-round p50 / p99 median [min .. max]",
            "case", "p50", "p90", "p99", "max"
        );
        let row = |name: &str, samples: &[i64]| {
            let d = Dist::of(samples);
            let (p50, p99) = per_round(samples, self.rounds);
            println!(
                "   {name:<44} {:>8.2} {:>8.2} {:>8.2} {:>8.1}   {} / {}",
                d.p50 / 1e3,
                d.p90 / 1e3,
                d.p99 / 1e3,
                d.max / 1e3,
                p50.show(1e3, 2),
                p99.show(1e3, 1)
            );
        };
        let totals = |t: &[CallTimes]| t.iter().map(|c| c.total()).collect::<Vec<_>>();
        row("peer: the same Tool::Function, called directly", &self.direct);
        row("executor + trace into a Vec<u8>", &totals(&self.vec));
        row("executor + trace into a file", &totals(&self.file));
        row("overhead, Vec trace (per call: executor - peer)", &self.diff(&self.vec));
        row("overhead, file trace", &self.diff(&self.file));
        row("  of which executor.call alone", &self.vec.iter().map(|c| c.call).collect::<Vec<_>>());
        row("  of which appending the records", &self.vec.iter().map(|c| c.append).collect::<Vec<_>>());
        row("  of which end_step (zstd frame, Vec)", &self.vec.iter().map(|c| c.end_step).collect::<Vec<_>>());
        row("  of which end_step (zstd frame, file)", &self.file.iter().map(|c| c.end_step).collect::<Vec<_>>());
        row("  of which dropping the outcome", &self.vec.iter().map(|c| c.drop).collect::<Vec<_>>());
        row("not included: SandboxMetrics::observe_call", &self.vec.iter().map(|c| c.metrics).collect::<Vec<_>>());
        row(&format!("candidate fix: overhead, Vec trace, zstd {FAST_ZSTD_LEVEL}"), &self.diff(&self.fast));
        row("  of which end_step", &self.fast.iter().map(|c| c.end_step).collect::<Vec<_>>());
        println!(
            "   {:.1} records and {:.0} trace bytes per call ({:.0} at zstd {FAST_ZSTD_LEVEL}); \
             executor+Vec / peer at p50: {:.1}x",
            self.records_per_call,
            self.trace_bytes_per_call,
            self.fast_trace_bytes_per_call,
            Dist::of(&totals(&self.vec)).p50 / Dist::of(&self.direct).p50
        );
    }

    fn to_json(&self) -> Value {
        let part = |f: fn(&CallTimes) -> i64, t: &[CallTimes]| Dist::of(&t.iter().map(f).collect::<Vec<_>>());
        let with_rounds = |samples: &[i64]| {
            let (p50, p99) = per_round(samples, self.rounds);
            json!({"pooled": Dist::of(samples).to_json(1e3), "per_round_p50": p50.to_json(1e3),
                   "per_round_p99": p99.to_json(1e3)})
        };
        let totals = |t: &[CallTimes]| t.iter().map(|c| c.total()).collect::<Vec<_>>();
        json!({
            "unit": "µs",
            "what": "per call: ToolExecutor::call + appending CallOutcome::records() + TraceWriter::end_step() + \
                     dropping the outcome, \
                     against calling the same Tool::Function directly; overhead = (executor case - direct call) \
                     within each interleaved group, then percentiles",
            "calls_per_case": self.samples,
            "warmup_calls": self.warmup,
            "rounds": self.rounds,
            "order": "each group times the direct call, the executor with a Vec trace, the executor with a \
                      file trace and the executor with a Vec trace at the candidate zstd level, one after the \
                      other, the order rotated per group",
            "zstd_level": DEFAULT_ZSTD_LEVEL,
            "file_trace": "TraceWriter::create in a temp dir, as EpisodeRunner::run opens traces",
            "tool": "Tool::Function: a 5-field JSON observation and a 2-key memory patch",
            "memory_keys": MEMORY_KEYS,
            "calls_per_trace_file": CALLS_PER_TRACE,
            "trace_rotation": "a new TraceWriter every 20 calls (an episode); creating and finishing it is not timed",
            "records_per_call": self.records_per_call,
            "trace_bytes_per_call": round3(self.trace_bytes_per_call),
            "peer_direct_call": with_rounds(&self.direct),
            "executor_with_vec_trace": with_rounds(&totals(&self.vec)),
            "executor_with_file_trace": with_rounds(&totals(&self.file)),
            "overhead_vec_trace": with_rounds(&self.diff(&self.vec)),
            "overhead_file_trace": with_rounds(&self.diff(&self.file)),
            "breakdown_vec_trace": {
                "executor_call": part(|c| c.call, &self.vec).to_json(1e3),
                "append_records": part(|c| c.append, &self.vec).to_json(1e3),
                "end_step": part(|c| c.end_step, &self.vec).to_json(1e3),
                "drop_outcome": part(|c| c.drop, &self.vec).to_json(1e3),
            },
            "not_included_sandbox_metrics_observe_call": part(|c| c.metrics, &self.vec).to_json(1e3),
            "breakdown_file_trace": {
                "executor_call": part(|c| c.call, &self.file).to_json(1e3),
                "append_records": part(|c| c.append, &self.file).to_json(1e3),
                "end_step": part(|c| c.end_step, &self.file).to_json(1e3),
                "drop_outcome": part(|c| c.drop, &self.file).to_json(1e3),
            },
            "candidate_fix_zstd_level": {
                "what": "the Vec case with TraceWriter::new(.., level) at a negative zstd level, which skips \
                         Huffman-coding literals; reported for the suggested fix, not judged",
                "zstd_level": FAST_ZSTD_LEVEL,
                "trace_bytes_per_call": round3(self.fast_trace_bytes_per_call),
                "overhead": with_rounds(&self.diff(&self.fast)),
                "end_step": part(|c| c.end_step, &self.fast).to_json(1e3),
            },
            "ratio_executor_vec_over_direct_p50":
                round3(Dist::of(&totals(&self.vec)).p50 / Dist::of(&self.direct).p50),
        })
    }
}

// ---- 2. timeout precision ---------------------------------------------------------

struct Timeouts {
    /// (timeout ms, executor lateness ns, lateness as the trace records it ns) per call.
    sequential: Vec<(u64, i64, i64)>,
    tokio_sleep: Vec<(u64, i64)>,
    thread_sleep: Vec<(u64, i64)>,
    batched: Vec<(u64, i64)>,
    batched_sleep: Vec<(u64, i64)>,
    not_timed_out: usize,
    wall_s: f64,
}

fn hanging_executor() -> ToolExecutor {
    let mut executor = ToolExecutor::new(NullWrites::Warn);
    for ms in TIMEOUTS_MS {
        let never = Recording {
            tool: "hang".into(),
            arguments: None,
            response: json!({"status": "too late"}),
            latency: Duration::from_millis(NEVER_MS),
            timeout: false,
            error: None,
            error_type: None,
        };
        let tool = Tool::Recorded(RecordedTool::new("hang", [never]).cycling());
        executor.add_tool(hang_name(ms), ToolDef::new(tool, Duration::from_millis(ms)));
    }
    executor
}

fn hang_name(ms: u64) -> String {
    format!("hang_{ms}ms")
}

/// A random point in tokio's 1 ms timer tick, so calls do not all start just after a tick fired.
fn random_phase(rng: &mut fastrand::Rng) {
    std::thread::sleep(Duration::from_micros(rng.u64(0..1000)));
}

async fn measure_timeouts(settings: &Settings) -> Timeouts {
    let n = settings.timeout_calls;
    let started = Instant::now();
    let executor = Arc::new(hanging_executor());
    let mut rng = fastrand::Rng::with_seed(20);
    let mut durations: Vec<u64> = (0..n).map(|i| TIMEOUTS_MS[i % TIMEOUTS_MS.len()]).collect();
    rng.shuffle(&mut durations);

    let sequential_task = {
        let executor = executor.clone();
        let durations = durations.clone();
        tokio::spawn(async move {
            let names: Vec<String> = TIMEOUTS_MS.iter().map(|&ms| hang_name(ms)).collect();
            let mut memory = Memory::from_object(&initial_memory());
            let (mut sequential, mut tokio_sleep, mut thread_sleep) = (Vec::new(), Vec::new(), Vec::new());
            let mut not_timed_out = 0;
            for (i, &ms) in durations.iter().enumerate() {
                let d = Duration::from_millis(ms);
                let name = &names[TIMEOUTS_MS.iter().position(|&t| t == ms).expect("a configured timeout")];
                let args = json!({"order_id": "A-1042", "n": i});
                random_phase(&mut rng);
                let call = ToolCall { step: 1, call_id: "call_1", plan_label: "", name, arguments: Ok(&args) };
                let t0 = Instant::now();
                let outcome = executor.call(call, &mut memory).await;
                let late = nanos(t0.elapsed()) - nanos(d);
                not_timed_out += usize::from(!outcome.timed_out());
                let recorded = outcome.plan_step.latency_micros as i64 * 1000 - nanos(d);
                sequential.push((ms, late, recorded));

                random_phase(&mut rng);
                let t0 = Instant::now();
                tokio::time::sleep(d).await;
                tokio_sleep.push((ms, nanos(t0.elapsed()) - nanos(d)));

                if i % 2 == 0 {
                    let t0 = Instant::now();
                    std::thread::sleep(d);
                    thread_sleep.push((ms, nanos(t0.elapsed()) - nanos(d)));
                }
            }
            (sequential, tokio_sleep, thread_sleep, not_timed_out)
        })
    };
    let (sequential, tokio_sleep, thread_sleep, mut not_timed_out) =
        sequential_task.await.expect("the sequential timeout task completes");

    // The same calls, TIMEOUT_BATCH at a time, spawned together right after the previous batch's timers fired.
    let (mut batched, mut batched_sleep) = (Vec::new(), Vec::new());
    for batch in durations.chunks(TIMEOUT_BATCH) {
        let calls: Vec<_> = batch
            .iter()
            .enumerate()
            .map(|(i, &ms)| {
                let executor = executor.clone();
                tokio::spawn(async move {
                    let mut memory = Memory::from_object(&initial_memory());
                    let args = json!({"order_id": "A-1042", "n": i});
                    let name = hang_name(ms);
                    let call =
                        ToolCall { step: 1, call_id: "call_1", plan_label: "", name: &name, arguments: Ok(&args) };
                    let t0 = Instant::now();
                    let outcome = executor.call(call, &mut memory).await;
                    (ms, nanos(t0.elapsed()) - nanos(Duration::from_millis(ms)), outcome.timed_out())
                })
            })
            .collect();
        for call in calls {
            let (ms, late, timed_out) = call.await.expect("a batched timeout task completes");
            not_timed_out += usize::from(!timed_out);
            batched.push((ms, late));
        }
        let sleeps: Vec<_> = batch
            .iter()
            .map(|&ms| {
                tokio::spawn(async move {
                    let d = Duration::from_millis(ms);
                    let t0 = Instant::now();
                    tokio::time::sleep(d).await;
                    (ms, nanos(t0.elapsed()) - nanos(d))
                })
            })
            .collect();
        for sleep in sleeps {
            batched_sleep.push(sleep.await.expect("a batched sleep task completes"));
        }
    }
    assert_eq!(not_timed_out, 0, "every call to the hanging tool should time out");
    Timeouts {
        sequential,
        tokio_sleep,
        thread_sleep,
        batched,
        batched_sleep,
        not_timed_out,
        wall_s: started.elapsed().as_secs_f64(),
    }
}

fn lateness(samples: &[(u64, i64)]) -> Vec<i64> {
    samples.iter().map(|s| s.1).collect()
}

impl Timeouts {
    fn executor(&self) -> Vec<i64> {
        self.sequential.iter().map(|s| s.1).collect()
    }

    fn recorded(&self) -> Vec<i64> {
        self.sequential.iter().map(|s| s.2).collect()
    }

    fn executor_at(&self, ms: u64) -> Vec<i64> {
        self.sequential.iter().filter(|s| s.0 == ms).map(|s| s.1).collect()
    }

    fn print(&self) {
        println!("\n2. timeout precision: lateness = elapsed - configured timeout, ms");
        println!(
            "   {} calls to a recorded tool that never answers, timeouts {TIMEOUTS_MS:?} ms shuffled; sequential, \
             each call started at a random point of tokio's 1 ms tick",
            self.sequential.len()
        );
        println!("   {:<50} {:>7} {:>7} {:>7} {:>7} {:>7}", "case", "n", "p50", "p90", "p99", "max");
        let row = |name: &str, samples: &[i64]| {
            let d = Dist::of(samples);
            println!(
                "   {name:<50} {:>7} {:>7.3} {:>7.3} {:>7.3} {:>7.3}",
                d.n,
                d.p50 / 1e6,
                d.p90 / 1e6,
                d.p99 / 1e6,
                d.max / 1e6
            );
        };
        row("executor timeout (sequential)", &self.executor());
        row("  as recorded in the trace (latency_micros)", &self.recorded());
        for ms in TIMEOUTS_MS {
            row(&format!("  timeout {ms} ms"), &self.executor_at(ms));
        }
        row("peer: tokio::time::sleep (sequential)", &lateness(&self.tokio_sleep));
        row("peer: std::thread::sleep (every 2nd)", &lateness(&self.thread_sleep));
        row(&format!("executor timeout, {TIMEOUT_BATCH} concurrent, tick-aligned"), &lateness(&self.batched));
        row(&format!("peer: tokio::time::sleep, {TIMEOUT_BATCH} concurrent"), &lateness(&self.batched_sleep));
        println!("   ({:.1} s)", self.wall_s);
    }

    fn to_json(&self) -> Value {
        let by_timeout: Map<String, Value> =
            TIMEOUTS_MS.iter().map(|&ms| (format!("{ms}ms"), Dist::of(&self.executor_at(ms)).to_json(1e6))).collect();
        json!({
            "unit": "ms",
            "what": "lateness = time from just before ToolExecutor::call to its return with error.type=timeout, \
                     minus the tool's configured timeout; the tool is a Tool::Recorded with latency_ms = 1 h",
            "timeouts_ms": TIMEOUTS_MS,
            "calls": self.sequential.len(),
            "mode": "sequential in one spawned task, timeouts shuffled (equal counts); before each measured call \
                     and each tokio sleep, a std::thread::sleep of a random 0-1000 µs puts its start at a random \
                     point of tokio's 1 ms timer tick, as a call that follows a policy's HTTP answer would start",
            "executor": Dist::of(&self.executor()).to_json(1e6),
            "executor_per_round": {
                "p50": per_round(&self.executor(), LATENESS_ROUNDS).0.to_json(1e6),
                "p99": per_round(&self.executor(), LATENESS_ROUNDS).1.to_json(1e6),
            },
            "executor_as_recorded_latency_micros": Dist::of(&self.recorded()).to_json(1e6),
            "executor_by_timeout": by_timeout,
            "peer_tokio_sleep": Dist::of(&lateness(&self.tokio_sleep)).to_json(1e6),
            "peer_thread_sleep": Dist::of(&lateness(&self.thread_sleep)).to_json(1e6),
            "peer_thread_sleep_note": "std::thread::sleep for every 2nd duration, on the same worker: the OS floor",
            "batched": {
                "mode": format!("the same {} calls in batches of {TIMEOUT_BATCH} tasks spawned together, each batch \
                                 started right after the previous one's timers fired (all at the same phase \
                                 of the tick), then the same batches of tokio sleeps", self.batched.len()),
                "executor": Dist::of(&lateness(&self.batched)).to_json(1e6),
                "peer_tokio_sleep": Dist::of(&lateness(&self.batched_sleep)).to_json(1e6),
            },
            "calls_not_timed_out": self.not_timed_out,
            "wall_s": round3(self.wall_s),
        })
    }
}

// ---- 3. episodes per second -------------------------------------------------------

/// A tool-call turn's logprobs: 8 tokens, top-5 each, as a server would send them.
fn turn_logprobs(turn: u32) -> Value {
    let tokens = ["{\"", "order", "_id", "\":", " \"", "A", "-1042", "\"}"];
    Value::Array(
        tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let top: Vec<Value> = (0..5)
                    .map(|k| json!({"token": format!("{t}{k}"), "logprob": -0.1 * f64::from(k) - 0.01 * i as f64}))
                    .collect();
                json!({"token": t, "logprob": -0.01 * f64::from(turn % 7), "top_logprobs": top})
            })
            .collect(),
    )
}

fn episode_runner(dir: &Path) -> EpisodeRunner {
    let script_path = dir.join("policy.jsonl");
    let mut script = String::new();
    for turn in 0..EPISODE_STEPS - 1 {
        let line = json!({"tool_calls": [{"name": "lookup_order", "arguments": {"order_id": "A-1042", "turn": turn}}],
                          "logprobs": turn_logprobs(turn), "usage": {"prompt_tokens": 200 + 40 * turn, "completion_tokens": 8}});
        script.push_str(&line.to_string());
        script.push('\n');
    }
    script.push_str(&json!({"content": "Your order A-1042 is in transit and should arrive in 2 days."}).to_string());
    script.push('\n');
    fs::write(&script_path, script).expect("write the bench policy script");
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script_path }))
        .expect("the bench policy script loads");

    let recordings = ["in_transit", "delayed"].map(|status| Recording {
        tool: "lookup_order".into(),
        arguments: None,
        response: json!({"observation": {"status": status, "eta_days": 2, "carrier": "DHL"},
                         "memory": {"shipping_status": status}}),
        latency: Duration::ZERO,
        timeout: false,
        error: None,
        error_type: None,
    });
    let mut executor = ToolExecutor::new(NullWrites::Warn);
    executor.add_tool(
        "lookup_order",
        ToolDef::new(
            Tool::Recorded(RecordedTool::new("lookup_order", recordings).cycling()),
            Duration::from_millis(800),
        ),
    );
    EpisodeRunner {
        executor,
        policy,
        tools: vec![ToolSpec::new(
            "lookup_order",
            "Looks up an order's shipping status",
            json!({"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}),
        )],
        system_prompt: Some("You are a support agent.".into()),
        max_steps: EPISODE_STEPS,
        plan_step_timeout: Duration::from_secs(3),
        rollback_enabled: true,
        checkpoint_every: 1,
        snapshot_interval: 10,
        error_context: true,
        injections: Vec::new(),
        rewards: None,
        reward_sources: BTreeMap::new(),
        training_step: 0,
        header: header("episodes"),
        live: LiveInjections::default(),
        // As `basecamp-sandbox run` does: every call and episode is counted for /metrics.
        metrics: Some(Arc::new(SandboxMetrics::new())),
        logits: Default::default(),
        policy_readiness: None,
    }
}

fn episode_input(id: String) -> EpisodeInput {
    EpisodeInput {
        id,
        messages: vec![ChatMessage::user("Where is my order A-1042?")],
        initial_memory: initial_memory(),
        ..Default::default()
    }
}

/// One case of one round: `tasks` tasks running episodes back to back for `window`.
#[derive(Debug, Clone, Copy)]
struct EpisodeSample {
    episodes: u64,
    wall_s: f64,
}

impl EpisodeSample {
    fn per_s(self) -> f64 {
        self.episodes as f64 / self.wall_s
    }
}

struct Episodes {
    window: Duration,
    /// Per concurrency, one sample per round.
    samples: Vec<(usize, Vec<EpisodeSample>)>,
    /// The CPU-bound peer, same layout: work units instead of episodes.
    cpu: Vec<(usize, Vec<EpisodeSample>)>,
    trace_bytes: u64,
    trace_records: usize,
}

async fn run_case(runner: &Arc<EpisodeRunner>, dir: &Path, tasks: usize, window: Duration) -> EpisodeSample {
    let case_dir = dir.join(format!("n{tasks}"));
    fs::create_dir_all(&case_dir).expect("create the episode trace dir");
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let runner = runner.clone();
            let case_dir = case_dir.clone();
            tokio::spawn(async move {
                let mut done = 0u64;
                while started.elapsed() < window {
                    let input = episode_input(format!("ep-{task}-{done}"));
                    let result = runner.run(&input, &case_dir).await.expect("an episode's trace is writable");
                    assert_eq!(result.outcome, "completed", "bench episode ended early: {:?}", result.error);
                    assert_eq!(result.metrics.steps, EPISODE_STEPS);
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut episodes = 0;
    for handle in handles {
        episodes += handle.await.expect("an episode task completes");
    }
    let wall_s = started.elapsed().as_secs_f64();
    fs::remove_dir_all(&case_dir).expect("remove the episode traces");
    EpisodeSample { episodes, wall_s }
}

/// The peer for scaling: `tasks` tasks doing pure CPU work (sha256 of a 32 kB JSON string, no I/O, no
/// allocation) for the same window, so a speedup below N shows how many cores the machine actually lent.
async fn run_cpu_peer(tasks: usize, window: Duration) -> EpisodeSample {
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            tokio::spawn(async move {
                let text = Value::String(format!("{task}").repeat(32 << 10));
                let mut done = 0u64;
                while started.elapsed() < window {
                    black_box(hash_json(black_box(&text)));
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut units = 0;
    for handle in handles {
        units += handle.await.expect("a CPU peer task completes");
    }
    EpisodeSample { episodes: units, wall_s: started.elapsed().as_secs_f64() }
}

async fn measure_episodes(settings: &Settings, tmp: &Path) -> Episodes {
    let dir = tmp.join("episodes");
    fs::create_dir_all(&dir).expect("create the episode dir");
    let runner = Arc::new(episode_runner(&dir));

    // One episode checked end to end: 19 successful tool calls and a final answer in a readable trace.
    let check = dir.join("check");
    fs::create_dir_all(&check).expect("create the check dir");
    runner.run(&episode_input("check".into()), &check).await.expect("the check episode runs");
    let trace = check.join("check.trace");
    let contents = read_trace(&trace).expect("the check episode's trace reads back");
    let tool_calls_ok = contents
        .records
        .iter()
        .filter(|r| {
            matches!(&r.body, Some(Body::PlanStep(p)) if p.kind == StepKind::ToolCall as i32 && p.status == StepStatus::Ok as i32)
        })
        .count();
    assert_eq!(tool_calls_ok, EPISODE_STEPS as usize - 1, "the bench episode's tool calls all succeed");
    assert!(contents.damage().is_none(), "the bench episode's trace is complete");
    let trace_bytes = fs::metadata(&trace).expect("the check trace exists").len();
    let trace_records = contents.records.len();

    let window = settings.episode_window;
    let _warmup = run_case(&runner, &dir, 2, window / 2).await;
    let mut samples: Vec<(usize, Vec<EpisodeSample>)> = EPISODE_CONCURRENCY.iter().map(|&n| (n, Vec::new())).collect();
    let mut cpu = samples.clone();
    for round in 0..settings.rounds {
        for k in 0..samples.len() {
            // Rotate the order so no concurrency always runs first in a round.
            let idx = (k + round) % samples.len();
            let tasks = samples[idx].0;
            let sample = run_case(&runner, &dir, tasks, window).await;
            samples[idx].1.push(sample);
            let sample = run_cpu_peer(tasks, window).await;
            cpu[idx].1.push(sample);
        }
    }
    Episodes { window, samples, cpu, trace_bytes, trace_records }
}

impl Episodes {
    fn spread(&self, tasks: usize) -> Spread {
        let (_, s) = self.samples.iter().find(|(n, _)| *n == tasks).expect("a measured concurrency");
        Spread::of(&s.iter().map(|s| s.per_s()).collect::<Vec<_>>())
    }

    /// Per round: episodes/s at `tasks` over episodes/s with one task.
    fn speedup(&self, tasks: usize) -> Spread {
        speedup(&self.samples, tasks)
    }

    /// The same for the CPU-bound peer.
    fn cpu_speedup(&self, tasks: usize) -> Spread {
        speedup(&self.cpu, tasks)
    }

    fn print(&self, overhead: Option<&Overhead>) {
        println!(
            "\n3. episodes: {EPISODE_STEPS} steps (19 tool calls to a zero-latency recorded tool + a final answer), \
             scripted policy, traces to a temp dir"
        );
        println!(
            "   {:.0} ms per case per round, {} rounds round-robin; median [min .. max]",
            self.window.as_secs_f64() * 1e3,
            self.samples[0].1.len()
        );
        println!(
            "   {:<6} {:>22} {:>24} {:>22} {:>26}",
            "tasks", "episodes/s", "steps/s", "speedup over 1 task", "peer: CPU-bound speedup"
        );
        for &(tasks, _) in &self.samples {
            let s = self.spread(tasks);
            let k = f64::from(EPISODE_STEPS);
            let steps = Spread { median: s.median * k, min: s.min * k, max: s.max * k };
            println!(
                "   {tasks:<6} {:>22} {:>24} {:>22} {:>26}",
                s.show(1.0, 0),
                steps.show(1.0, 0),
                self.speedup(tasks).show(1.0, 2),
                self.cpu_speedup(tasks).show(1.0, 2)
            );
        }
        let one = self.spread(1).median;
        let per_step_us = 1e6 / (one * f64::from(EPISODE_STEPS));
        print!(
            "   one task: {:.0} µs per episode, {per_step_us:.1} µs per step; trace {} bytes, {} records",
            1e6 / one,
            self.trace_bytes,
            self.trace_records
        );
        if let Some(o) = overhead {
            let call_us = Dist::of(&o.vec.iter().map(|c| c.total()).collect::<Vec<_>>()).p50 / 1e3;
            print!(" (one executor call + trace write: {call_us:.1} µs at p50)");
        }
        println!();
    }

    fn to_json(&self) -> Value {
        let cases: Vec<Value> = self
            .samples
            .iter()
            .map(|(tasks, s)| {
                let eps = self.spread(*tasks);
                json!({
                    "tasks": tasks,
                    "episodes_per_s": eps.to_json(1.0),
                    "steps_per_s": eps.to_json(1.0 / f64::from(EPISODE_STEPS)),
                    "speedup_over_1_task": self.speedup(*tasks).to_json(1.0),
                    "peer_cpu_bound_speedup_over_1_task": self.cpu_speedup(*tasks).to_json(1.0),
                    "rounds": s.iter().map(|s| json!({"episodes": s.episodes, "wall_s": round3(s.wall_s)})).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "what": "EpisodeRunner::run, back to back in each of N spawned tasks for a fixed window per case; \
                     episodes/s = episodes finished / wall time until the last task finished",
            "episode": {
                "steps": EPISODE_STEPS,
                "tool_calls": EPISODE_STEPS - 1,
                "policy": "scripted (JSONL, one script for every episode): 19 tool-call turns, each with 8 tokens \
                           x top-5 logprobs and usage, then a final answer",
                "tool": "Tool::Recorded, latency_ms 0, two wildcard lines alternating (each call changes memory)",
                "memory_keys": MEMORY_KEYS,
                "snapshot_interval": 10,
                "error_context": true,
                "rollback_enabled": true,
                "trace_file_bytes": self.trace_bytes,
                "trace_records": self.trace_records,
            },
            "window_ms": self.window.as_millis() as u64,
            "order": "round-robin over concurrencies, the order rotated per round; traces of a case are deleted \
                      after it (untimed)",
            "cases": cases,
            "peer": "per case and round, right after the episodes: the same N tasks hashing a 32 kB JSON string \
                     (sha256, no I/O) for the same window; its speedup over 1 task is what the machine's free \
                     cores allow at that moment",
        })
    }
}

/// Per round: throughput at `tasks` over throughput with one task.
fn speedup(samples: &[(usize, Vec<EpisodeSample>)], tasks: usize) -> Spread {
    let one = &samples.iter().find(|(n, _)| *n == 1).expect("one task measured").1;
    let many = &samples.iter().find(|(n, _)| *n == tasks).expect("a measured concurrency").1;
    Spread::of(&many.iter().zip(one).map(|(m, o)| m.per_s() / o.per_s()).collect::<Vec<_>>())
}

// ---- 4. recorded fixtures: a call's line by its arguments ------------------------------

/// Fixture lengths measured: a recorded task's fixture has a line per test-set row.
const FIXTURE_LINES: [usize; 3] = [1_000, 10_000, 100_000];
/// Calls timed per fixture length and round.
const FIXTURE_CALLS: usize = 2_000;

/// Per fixture length: calls/s through `RecordedTool::call` (the line found
/// in a hash map by the arguments' canonical hash) and through the scan it
/// replaced (3144200: the same hash, compared with every line's in turn),
/// in the same rounds, and their ratio per round.
struct Fixtures {
    cases: Vec<(usize, Spread, Spread, Spread)>,
}

async fn measure_fixtures(settings: &Settings) -> Fixtures {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut cases = Vec::new();
    for lines in FIXTURE_LINES {
        let recordings: Vec<Recording> = (0..lines)
            .map(|i| Recording {
                tool: "track_order".into(),
                arguments: Some(json!({"order_id": format!("ORD-{i}"), "region": "eu"})),
                response: json!({"status": "in_transit", "line": i}),
                latency: Duration::ZERO,
                timeout: false,
                error: None,
                error_type: None,
            })
            .collect();
        // The scan's table: each line's argument hash, in file order.
        let hashes: Vec<_> = recordings.iter().map(|r| hash_json(r.arguments.as_ref().expect("arguments"))).collect();
        let tool = RecordedTool::new("track_order", recordings.clone());
        let (mut map_rates, mut scan_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..settings.rounds {
            let calls: Vec<Value> = (0..FIXTURE_CALLS)
                .map(|_| json!({"region": "eu", "order_id": format!("ORD-{}", rng.usize(..lines))}))
                .collect();
            let started = Instant::now();
            for arguments in &calls {
                black_box(tool.call("track_order", arguments).await.expect("a recorded line answers"));
            }
            let map = started.elapsed().as_secs_f64();
            let started = Instant::now();
            for arguments in &calls {
                let hash = hash_json(arguments);
                let line = hashes.iter().position(|h| *h == hash).expect("a recorded line answers");
                let response = &recordings[line].response;
                black_box(ToolOutput::from_json(response.clone(), 0).expect("an observation"));
            }
            let scan = started.elapsed().as_secs_f64();
            map_rates.push(FIXTURE_CALLS as f64 / map);
            scan_rates.push(FIXTURE_CALLS as f64 / scan);
            ratios.push(scan / map);
        }
        cases.push((lines, Spread::of(&map_rates), Spread::of(&scan_rates), Spread::of(&ratios)));
    }
    Fixtures { cases }
}

impl Fixtures {
    fn print(&self) {
        println!(
            "\nrecorded fixture lookup by arguments ({FIXTURE_CALLS} calls a round, median [min .. max] over rounds)"
        );
        println!(
            "   {:>8}  {:>28}  {:>28}  {:>24}",
            "lines", "hash map calls/s", "scan calls/s (before)", "scan time / map time"
        );
        for (lines, map, scan, ratio) in &self.cases {
            println!("   {lines:>8}  {:>28}  {:>28}  {:>24}", map.show(1.0, 0), scan.show(1.0, 0), ratio.show(1.0, 2));
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "what": "RecordedTool::call of a fixture line by its arguments (json! arguments, canonical hash), against \
                     the scan it replaced in 3144200 (the same hash compared with every line's in turn, then the \
                     observation built), the same calls in the same round",
            "calls_per_round": FIXTURE_CALLS,
            "cases": self.cases.iter().map(|(lines, map, scan, ratio)| json!({
                "fixture_lines": lines,
                "hash_map_calls_per_s": map.to_json(1.0),
                "scan_calls_per_s": scan.to_json(1.0),
                "scan_time_over_map_time": ratio.to_json(1.0),
            })).collect::<Vec<_>>(),
        })
    }
}

// ---- targets ----------------------------------------------------------------------

struct Target {
    name: &'static str,
    measure: String,
    value: f64,
    threshold: f64,
    unit: &'static str,
}

impl Target {
    fn met(&self) -> bool {
        self.value <= self.threshold
    }

    fn to_json(&self) -> Value {
        json!({"name": self.name, "measure": self.measure, "value": round3(self.value), "kind": "max",
               "threshold": self.threshold, "unit": self.unit, "met": self.met()})
    }
}

fn targets(o: &Overhead, t: &Timeouts) -> Vec<Target> {
    let vec = Dist::of(&o.diff(&o.vec));
    let file = Dist::of(&o.diff(&o.file));
    let late = Dist::of(&t.executor());
    vec![
        Target {
            name: "executor overhead p50 (trace in a Vec)",
            measure: format!("p50 over {} calls of executor + trace - direct call", o.samples),
            value: vec.p50 / 1e3,
            threshold: TARGET_OVERHEAD_P50_US,
            unit: "µs",
        },
        Target {
            name: "executor overhead p99 (trace in a Vec)",
            measure: format!("p99 over {} calls of executor + trace - direct call", o.samples),
            value: vec.p99 / 1e3,
            threshold: TARGET_OVERHEAD_P99_US,
            unit: "µs",
        },
        Target {
            name: "executor overhead p50 (trace in a file)",
            measure: format!("p50 over {} calls of executor + trace - direct call", o.samples),
            value: file.p50 / 1e3,
            threshold: TARGET_OVERHEAD_P50_US,
            unit: "µs",
        },
        Target {
            name: "executor overhead p99 (trace in a file)",
            measure: format!("p99 over {} calls of executor + trace - direct call", o.samples),
            value: file.p99 / 1e3,
            threshold: TARGET_OVERHEAD_P99_US,
            unit: "µs",
        },
        Target {
            name: "timeout lateness p99",
            measure: format!("p99 over {} sequential timed-out calls, timeouts 1-20 ms", t.sequential.len()),
            value: late.p99 / 1e6,
            threshold: TARGET_LATENESS_P99_MS,
            unit: "ms",
        },
    ]
}

fn print_targets(targets: &[Target]) {
    println!("\ntargets");
    for t in targets {
        println!(
            "   {:<42} {:>9.3} {:<3} <= {:<6} {}",
            t.name,
            t.value,
            t.unit,
            t.threshold,
            if t.met() { "met" } else { "NOT MET" }
        );
    }
}

// ---- machine and date ------------------------------------------------------
