//! The CPU logit-analytics benchmark: `cargo bench -p basecamp-gpu --bench logits`.
//!
//! Times the fused pass (top-5, log-sum-exp, entropy; and KL against a second
//! logit set) against the plain scalar loop (`reference::scalar_into`) on the
//! same input in the same run, round-robin, so that a noisy neighbour slows
//! both sides of a ratio alike. Each case is sampled `LOGITS_BENCH_REPS`
//! times (default 5); figures are medians with min/max and ratios are taken
//! per round. GB/s counts the logits read (each input once) at 10^9 bytes.
//!
//! Input: `[T, V] = [LOGITS_BENCH_ROWS (default 128), 129280]` Gaussian
//! logits (sigma 3) and q = p + 0.1 N(0, 1), in f32 and bf16; one set per
//! dtype, 66 MB (f32) each, larger than the last-level cache. Threads: all
//! (rayon's default) and one. Each kernel's deviation from the float64
//! oracle on the first rows is reported next to its speed. Output: a table
//! on stdout and `bench/results/logits_cpu.json`.

use std::hint::black_box;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use basecamp_bench_support::{cpu_model, env_or, git_commit, loadavg, median, spread, write_results};
use basecamp_gpu::logits::fused::{CpuKernel, analyze_into};
use basecamp_gpu::logits::reference::{reference, scalar_into};
use basecamp_gpu::logits::{LogitStats, LogitsView, bf16};
use basecamp_gpu::testdata::{Rng, deviation, gaussian_logits, perturbed, to_bf16};
use serde_json::json;

const RESULTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/results/logits_cpu.json");
const VOCAB: usize = 129_280;
const TOP_K: usize = 5;
const ORACLE_ROWS: usize = 4;

struct Case<'a> {
    name: String,
    dtype: &'static str,
    pair: bool,
    kernel: &'static str,
    threads: usize,
    p: LogitsView<'a>,
    q: Option<LogitsView<'a>>,
    out: LogitStats,
    seconds: Vec<f64>,
}

impl Case<'_> {
    fn bytes(&self) -> usize {
        self.p.bytes() + self.q.map_or(0, |q| q.bytes())
    }

    fn run(&mut self, pools: &[rayon::ThreadPool]) -> f64 {
        let pool = pools.iter().find(|p| p.current_num_threads() == self.threads).expect("a pool per thread count");
        let (p, q, out) = (self.p, self.q, &mut self.out);
        let kernel = self.kernel;
        let start = Instant::now();
        let result = pool.install(|| match kernel {
            "scalar" => scalar_into(p, q, TOP_K, out),
            "portable" => analyze_into(p, q, TOP_K, CpuKernel::Portable, out),
            _ => analyze_into(p, q, TOP_K, CpuKernel::Avx2Fma, out),
        });
        let elapsed = start.elapsed().as_secs_f64();
        result.expect("benchmark input is valid");
        black_box(&self.out);
        elapsed
    }
}

fn main() {
    let reps = env_or("LOGITS_BENCH_REPS", 5).max(1);
    let rows = env_or("LOGITS_BENCH_ROWS", 128).max(ORACLE_ROWS);
    let started = Instant::now();
    let all = rayon::current_num_threads();
    let mut thread_counts = vec![all];
    if all > 1 {
        thread_counts.push(1);
    }
    let pools: Vec<rayon::ThreadPool> = thread_counts
        .iter()
        .map(|&n| rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("a thread pool"))
        .collect();

    let mut rng = Rng::new(0x5eed);
    let p32 = gaussian_logits(&mut rng, rows, VOCAB, 3.0);
    let q32 = perturbed(&mut rng, &p32, 0.1);
    let (p16, q16): (Vec<bf16>, Vec<bf16>) = (to_bf16(&p32), to_bf16(&q32));

    let mut kernels = vec!["scalar", "portable"];
    if CpuKernel::Avx2Fma.resolve() == CpuKernel::Avx2Fma {
        kernels.push("avx2+fma");
    }
    let mut cases = Vec::new();
    for (dtype, p, q) in [
        ("f32", LogitsView::f32(&p32, rows, VOCAB), LogitsView::f32(&q32, rows, VOCAB)),
        ("bf16", LogitsView::bf16(&p16, rows, VOCAB), LogitsView::bf16(&q16, rows, VOCAB)),
    ] {
        let (p, q) = (p.expect("rows x vocab"), q.expect("rows x vocab"));
        for pair in [false, true] {
            for &threads in &thread_counts {
                for &kernel in &kernels {
                    if threads == 1 && kernel == "portable" {
                        continue;
                    }
                    let what = if pair { "top5+lse+entropy+kl" } else { "top5+lse+entropy" };
                    cases.push(Case {
                        name: format!("{dtype}.{what}.{kernel}.{threads}t"),
                        dtype,
                        pair,
                        kernel,
                        threads,
                        p,
                        q: pair.then_some(q),
                        out: LogitStats::poisoned(rows, VOCAB, TOP_K, pair),
                        seconds: Vec::new(),
                    });
                }
            }
        }
    }

    // One warm-up round, then `reps` timed rounds, every case once a round.
    for case in &mut cases {
        case.run(&pools);
    }
    for _ in 0..reps {
        for case in &mut cases {
            let t = case.run(&pools);
            case.seconds.push(t);
        }
    }

    // Accuracy against the float64 oracle on the first rows of each input.
    fn head<'a>(v: &LogitsView<'a>) -> LogitsView<'a> {
        v.slice_rows(0..ORACLE_ROWS).expect("enough rows")
    }

    let mut table = Vec::new();
    let mut json_cases = Vec::new();
    for case in &cases {
        let (hp, hq) = (head(&case.p), case.q.as_ref().map(head));
        let want = reference(hp, hq, TOP_K).expect("valid");
        let mut head_out = LogitStats::poisoned(ORACLE_ROWS, VOCAB, TOP_K, case.pair);
        match case.kernel {
            "scalar" => scalar_into(hp, hq, TOP_K, &mut head_out),
            "portable" => analyze_into(hp, hq, TOP_K, CpuKernel::Portable, &mut head_out),
            _ => analyze_into(hp, hq, TOP_K, CpuKernel::Avx2Fma, &mut head_out),
        }
        .expect("valid");
        let dev = deviation(&head_out, &want);
        let gbps: Vec<f64> = case.seconds.iter().map(|s| case.bytes() as f64 / s / 1e9).collect();
        let peer = cases
            .iter()
            .find(|c| c.kernel == "scalar" && c.dtype == case.dtype && c.pair == case.pair && c.threads == case.threads)
            .expect("a scalar peer per group");
        let ratios: Vec<f64> = peer.seconds.iter().zip(&case.seconds).map(|(peer, own)| peer / own).collect();
        table.push(format!(
            "| {:<44} | {:>6.2} [{:.2} .. {:.2}] | {:>5.2}x | {:.1e} |",
            case.name,
            median(&gbps),
            gbps.iter().copied().fold(f64::INFINITY, f64::min),
            gbps.iter().copied().fold(0.0, f64::max),
            median(&ratios),
            dev.worst(),
        ));
        json_cases.push(json!({
            "name": case.name,
            "dtype": case.dtype,
            "kl": case.pair,
            "kernel": case.kernel,
            "threads": case.threads,
            "rows": rows,
            "vocab": VOCAB,
            "top_k": TOP_K,
            "bytes_per_iter": case.bytes(),
            "seconds_per_iter": spread(&case.seconds),
            "gb_per_s": spread(&gbps),
            "speedup_vs_scalar_same_round": spread(&ratios),
            "relative_error_vs_f64": {
                "rows_checked": ORACLE_ROWS,
                "logsumexp": dev.lse, "entropy": dev.entropy, "kl": dev.kl, "top_logprobs": dev.top_logprobs,
                "exact_mismatch": dev.mismatch,
            },
        }));
    }

    println!("| case | GB/s median [min .. max] | vs scalar | rel. err vs f64 |");
    println!("|---|---|---|---|");
    for line in &table {
        println!("{line}");
    }
    let unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let doc = json!({
        "bench": "logits_cpu",
        "command": "cargo bench -p basecamp-gpu --bench logits",
        "what": "fused one-pass top-k/logsumexp/entropy(/KL) vs the plain scalar loop, same input, same run, round-robin",
        "gb_are": "10^9 bytes of logits read per second (p, plus q for KL)",
        "machine": {
            "nproc": all,
            "cpu": cpu_model(),
            "loadavg": loadavg(),
            "kernel_auto": CpuKernel::Auto.name(),
        },
        "commit": git_commit(),
        "unix_time": unix,
        "reps": reps,
        "wall_seconds": started.elapsed().as_secs_f64(),
        "cases": json_cases,
    });
    write_results(RESULTS, &doc);
    println!("wrote {RESULTS} in {:.0} s", started.elapsed().as_secs_f64());
}
