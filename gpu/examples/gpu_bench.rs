//! The GPU device check and benchmark, for a session that is lent a GPU:
//! `gpu/bench/run_device.sh` runs it (`gpu_bench check`, then
//! `gpu_bench bench OUT.json`). Without a GPU it exits 1 with the reason.
//!
//! `check`: the kernels against the float64 oracle on fresh random logits
//! (full-vocabulary rows of every shape, odd vocabularies that misalign
//! rows, both dtypes, single and pair), outputs poisoned before each run and
//! checked fully written; exits 1 on any miss.
//!
//! `bench`: the device-to-device copy ceiling (bytes read + written), then
//! for T in {256, 4096, 16384}, V = 129,280, bf16 and f32, p = 3 N(0,1) and
//! q = p + 0.1 N(0,1) (the PyTorch peer's data): the kernel for top-5 +
//! log-sum-exp + entropy of p ("single") and with KL(p || q) ("pair"),
//! timed with CUDA events around each launch after warm-up, median of 20.
//! Each size is spot-checked against the oracle (first and last rows).

use std::process::ExitCode;
use std::time::Instant;

use basecamp_gpu::cuda::{DeviceLogits, GpuLogits};
use basecamp_gpu::logits::reference::reference;
use basecamp_gpu::logits::{LogitStats, LogitsView, bf16};
use basecamp_gpu::testdata::{Rng, deviation, fresh_seed, mixed_logits, perturbed};
use cudarc::driver::sys::CUevent_flags;
use rayon::prelude::*;
use serde_json::{Value, json};

const VOCAB: usize = 129_280;
const TOP_K: usize = 5;
const LIMIT: f64 = 1e-4;
const KL_FLOOR: f64 = 1e-6;
const REPS: usize = 20;
const WARMUP: usize = 3;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("check", String::as_str);
    let gpu = match GpuLogits::first() {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("error: no GPU to check or time: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("device: {}", gpu.device());
    let result = match mode {
        "check" => check(&gpu),
        "bench" => bench(&gpu, args.get(2).map_or("gpu_kernel.json", String::as_str)),
        other => Err(format!("unknown mode {other:?}: use check or bench")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

enum Host {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
}

impl Host {
    fn from(values: Vec<f32>, bf: bool) -> Host {
        if bf { Host::Bf16(values.par_iter().map(|&v| bf16::from_f32(v)).collect()) } else { Host::F32(values) }
    }

    fn view(&self, rows: usize, vocab: usize) -> LogitsView<'_> {
        match self {
            Host::F32(v) => LogitsView::f32(v, rows, vocab),
            Host::Bf16(v) => LogitsView::bf16(v, rows, vocab),
        }
        .expect("rows x vocab")
    }
}

fn check(gpu: &GpuLogits) -> Result<(), String> {
    let seed = fresh_seed();
    println!("check: seed {seed} (BASECAMP_TEST_SEED={seed} replays it)");
    let mut failures = Vec::new();
    for (i, &(rows, vocab, k)) in [(256, VOCAB, 5), (64, VOCAB, 20), (96, 32_003, 20), (33, 7, 3)].iter().enumerate() {
        let mut rng = Rng::new(seed.wrapping_add(i as u64));
        let p = mixed_logits(&mut rng, rows, vocab);
        let q = perturbed(&mut rng, &p, 0.1);
        for (p_bf, q_bf) in [(true, Some(true)), (false, Some(false)), (true, None), (false, None), (false, Some(true))]
        {
            let ph = Host::from(p.clone(), p_bf);
            let qh = q_bf.map(|b| Host::from(q.clone(), b));
            let (pv, qv) = (ph.view(rows, vocab), qh.as_ref().map(|h| h.view(rows, vocab)));
            let mut out = LogitStats::poisoned(rows, vocab, k, qv.is_some());
            let name = format!("rows {rows} vocab {vocab} k {k} p bf16 {p_bf} q {q_bf:?}");
            if let Err(e) = gpu.analyze_into(pv, qv, k, &mut out) {
                failures.push(format!("{name}: {e}"));
                continue;
            }
            let dev = deviation(&out, &reference(pv, qv, k).map_err(|e| e.to_string())?);
            let ok = dev.within(LIMIT, KL_FLOOR);
            println!("{} {name}: {dev:?}", if ok { "ok  " } else { "FAIL" });
            if !ok {
                failures.push(format!("{name}: {dev:?}"));
            }
        }
    }
    if failures.is_empty() {
        println!("check: all passed");
        Ok(())
    } else {
        Err(format!("{} check(s) failed (seed {seed}): {}", failures.len(), failures.join("; ")))
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Milliseconds per call of `f`, timed with events around each call.
fn time_ms(gpu: &GpuLogits, mut f: impl FnMut() -> Result<(), String>) -> Result<Vec<f64>, String> {
    let stream = gpu.stream();
    for _ in 0..WARMUP {
        f()?;
    }
    stream.synchronize().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for _ in 0..REPS {
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| e.to_string())?;
        f()?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| e.to_string())?;
        out.push(f64::from(start.elapsed_ms(&end).map_err(|e| e.to_string())?));
    }
    Ok(out)
}

fn copy_ceiling(gpu: &GpuLogits) -> Result<f64, String> {
    let n = 2usize << 30 >> 2; // 2 GiB of f32
    let stream = gpu.stream();
    let src = stream.alloc_zeros::<f32>(n).map_err(|e| e.to_string())?;
    let mut dst = stream.alloc_zeros::<f32>(n).map_err(|e| e.to_string())?;
    let mut ms = time_ms(gpu, || stream.memcpy_dtod(&src, &mut dst).map_err(|e| e.to_string()))?;
    let gbps = 2.0 * (n * 4) as f64 / median(&mut ms) / 1e6;
    println!("copy ceiling: {gbps:.0} GB/s (2 GiB device-to-device, read + written, median of {REPS})");
    Ok(gbps)
}

/// `rows x VOCAB` of `sigma * N(0,1)` (and `p + 0.1 N(0,1)`), rows in parallel.
fn generate(seed: u64, rows: usize) -> (Vec<f32>, Vec<f32>) {
    let mut p = vec![0.0f32; rows * VOCAB];
    let mut q = vec![0.0f32; rows * VOCAB];
    p.par_chunks_mut(VOCAB).zip(q.par_chunks_mut(VOCAB)).enumerate().for_each(|(r, (pr, qr))| {
        let mut rng = Rng::new(seed ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        for (x, y) in pr.iter_mut().zip(qr.iter_mut()) {
            *x = (3.0 * rng.normal()) as f32;
            *y = (f64::from(*x) + 0.1 * rng.normal()) as f32;
        }
    });
    (p, q)
}

fn bench(gpu: &GpuLogits, out_path: &str) -> Result<(), String> {
    let started = Instant::now();
    let copy_gbps = copy_ceiling(gpu)?;
    let seed = fresh_seed();
    let mut rows_json = Vec::new();
    println!("| dtype | T | mode | ms median [min .. max] | GB/s | of copy | spot check (rel. err) |");
    println!("|---|---|---|---|---|---|---|");
    for bf in [true, false] {
        for t in [256usize, 4096, 16384] {
            let (p, q) = generate(seed.wrapping_add(t as u64), t);
            let (ph, qh) = (Host::from(p, bf), Host::from(q, bf));
            let (pv, qv) = (ph.view(t, VOCAB), qh.view(t, VOCAB));
            let dp: DeviceLogits = gpu.upload(pv).map_err(|e| e.to_string())?;
            let dq: DeviceLogits = gpu.upload(qv).map_err(|e| e.to_string())?;
            for pair in [false, true] {
                let mut stats = gpu.alloc_stats(t, VOCAB, TOP_K, pair).map_err(|e| e.to_string())?;
                let q_dev = pair.then_some(&dq);
                // Spot check on this very data: poison, run, every output written,
                // first and last rows against the oracle.
                gpu.poison(&mut stats).map_err(|e| e.to_string())?;
                gpu.launch(&dp, q_dev, TOP_K, &mut stats).map_err(|e| e.to_string())?;
                let mut host = LogitStats::poisoned(t, VOCAB, TOP_K, pair);
                let status = gpu.download(&stats, &mut host).map_err(|e| e.to_string())?;
                if let Some(row) = status.iter().position(|&s| s != 0) {
                    return Err(format!("row {row} came back with status {}", status[row]));
                }
                host.check_written().map_err(|e| e.to_string())?;
                let mut worst = 0.0f64;
                for range in [0..4, t - 4..t] {
                    let (sp, sq) = (rows_of(&pv, &range), rows_of(&qv, &range));
                    let want = reference(sp, pair.then_some(sq), TOP_K).map_err(|e| e.to_string())?;
                    let got = slice_stats(&host, range.clone());
                    let dev = deviation(&got, &want);
                    if !dev.within(LIMIT, KL_FLOOR) {
                        return Err(format!("T {t} bf16 {bf} pair {pair} rows {range:?}: {dev:?}"));
                    }
                    worst = worst.max(dev.worst());
                }
                let mut ms = time_ms(gpu, || gpu.launch(&dp, q_dev, TOP_K, &mut stats).map_err(|e| e.to_string()))?;
                let (min, max) =
                    (ms.iter().copied().fold(f64::INFINITY, f64::min), ms.iter().copied().fold(0.0, f64::max));
                let med = median(&mut ms);
                let bytes = dp.bytes() + if pair { dq.bytes() } else { 0 };
                let gbps = bytes as f64 / med / 1e6;
                let dtype = if bf { "bf16" } else { "f32" };
                let mode = if pair { "top5+lse+entropy+kl" } else { "top5+lse+entropy" };
                println!(
                    "| {dtype} | {t} | {mode} | {med:.3} [{min:.3} .. {max:.3}] | {gbps:.0} | {:.0}% | {worst:.1e} |",
                    100.0 * gbps / copy_gbps
                );
                rows_json.push(json!({
                    "dtype": dtype, "T": t, "V": VOCAB, "top_k": TOP_K, "mode": mode, "kl": pair,
                    "input_bytes": bytes, "ms": { "median": med, "min": min, "max": max, "reps": REPS },
                    "GBps": gbps, "fraction_of_copy": gbps / copy_gbps, "spot_check_worst_rel_err": worst,
                }));
            }
        }
    }
    let doc: Value = json!({
        "device": gpu.device().to_string(),
        "copy_GBps": copy_gbps,
        "seed": seed,
        "rows": rows_json,
        "wall_seconds": started.elapsed().as_secs_f64(),
    });
    std::fs::write(out_path, serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n")
        .map_err(|e| format!("cannot write {out_path}: {e}"))?;
    println!("wrote {out_path}");
    Ok(())
}

fn rows_of<'a>(v: &LogitsView<'a>, range: &std::ops::Range<usize>) -> LogitsView<'a> {
    v.slice_rows(range.clone()).expect("rows in range")
}

/// Rows `range` of `stats` as their own outputs.
fn slice_stats(stats: &LogitStats, range: std::ops::Range<usize>) -> LogitStats {
    let k = stats.k();
    let tokens: Vec<_> = range.clone().map(|r| stats.token(r)).collect();
    let mut ids = Vec::new();
    let mut logprobs = Vec::new();
    for t in &tokens {
        for slot in 0..k {
            ids.push(t.top_ids.get(slot).map_or(-1, |&id| id as i32));
            logprobs.push(t.top_logprobs.get(slot).copied().unwrap_or(f32::NEG_INFINITY));
        }
    }
    LogitStats::from_parts(
        tokens.len(),
        stats.vocab(),
        k,
        stats.logsumexp()[range.clone()].to_vec(),
        stats.entropy()[range.clone()].to_vec(),
        stats.kl().map(|kl| kl[range].to_vec()),
        tokens.iter().map(|t| t.top_ids.len() as i32).collect(),
        ids,
        logprobs,
    )
    .expect("same layout")
}
