//! The search benchmark: `cargo bench -p basecamp-trace --bench search` (`make bench-search`).
//!
//! Generates realistic synthetic episodes (`synthetic::generate`, 50 steps
//! of 200 tokens x top-5 logits each, about 1 MB of records) into a temp dir
//! until they hold `SEARCH_BENCH_BYTES` (default 10^9) uncompressed record
//! bytes, then times, on the same files and the same number of workers:
//!
//! - `search`: `Query::search_file` over every file (the path of `basecamp
//!   trace search`), a selective condition;
//! - `scan` (the floor): every record read with `next_raw` and nothing
//!   evaluated: what checksums and zstd alone cost when every frame is
//!   decompressed (search, which skips the token_logit frames its query
//!   does not need, can run below it);
//! - `jq` (the baseline): the same traces exported to JSON Lines (one
//!   record per line in the proto3 JSON mapping, as `basecamp trace parse
//!   --output json` shows them, plus the episode id), filtered by
//!   `/usr/bin/jq -c` for the same condition, one jq process per worker.
//!
//! Both sides read files already in the page cache (each is read once
//! before timing). The (episode, step) sets found by search and jq must be
//! equal, or the benchmark fails. Search and scan are timed `REPS` times
//! (median reported), jq once (it is the slow side). Writes a table and
//! `bench/results/search.json`. GB = 10^9 bytes.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use basecamp_bench_support::{TempDir, env_or, git_commit, machine, median, utc_now, write_results};
use basecamp_trace::format::{FRAME_HEADER_LEN, FrameHeader, FrameKind, PREAMBLE_LEN};
use basecamp_trace::inputs::for_each_ordered;
use basecamp_trace::json::record_to_json;
use basecamp_trace::query::Query;
use basecamp_trace::synthetic::{self, EpisodeShape};
use basecamp_trace::{TraceReader, read_trace};
use serde_json::{Value, json};

const RESULTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/results/search.json");
const QUERY: &str = r#"plan_execution.tool == "tracking_api" and plan_execution.latency_ms >= 800"#;
const JQ: &str = "/usr/bin/jq";
const JQ_FILTER: &str = r#"select(.planStep != null and .planStep.tool == "tracking_api" and ((.planStep.latencyMicros // "0") | tonumber) >= 800000) | "\(.episode) \(.step // 0)""#;
const TARGET_GB_PER_S_PER_CORE: f64 = 1.0;
const TARGET_RATIO_VS_JQ: f64 = 10.0;

fn main() {
    let started = Instant::now();
    let target_bytes: u64 = env_or("SEARCH_BENCH_BYTES", 1_000_000_000);
    let reps: usize = env_or("SEARCH_BENCH_REPS", 3).max(1);
    let jobs: usize = env_or("SEARCH_BENCH_JOBS", basecamp_trace::inputs::default_jobs()).max(1);
    let dir = TempDir::new("search");
    let query = Query::parse(QUERY).expect("the benchmark query compiles");

    // ---- input: traces until `target_bytes` uncompressed ----
    let per_episode = {
        let probe =
            synthetic::generate(&EpisodeShape { seed: 1, ..Default::default() }).write_to(Vec::new(), 3).unwrap();
        raw_bytes(&probe)
    };
    let episodes = target_bytes.div_ceil(per_episode).max(1);
    println!(
        "generating {episodes} episodes (~{:.2} GB uncompressed) in {} ...",
        (episodes * per_episode) as f64 / 1e9,
        dir.path().display()
    );
    let seeds: Vec<u64> = (1..=episodes).collect();
    let paths: Vec<PathBuf> = seeds.iter().map(|s| dir.path().join(format!("traces/ep-{s:05}.trace"))).collect();
    fs::create_dir_all(dir.path().join("traces")).unwrap();
    fs::create_dir_all(dir.path().join("jsonl")).unwrap();
    let raw_total = AtomicU64::new(0);
    let disk_total = AtomicU64::new(0);
    let json_total = AtomicU64::new(0);
    let token_logit_total = AtomicU64::new(0);
    let gen_started = Instant::now();
    for_each_ordered(
        &seeds,
        jobs,
        |&seed| {
            let episode = synthetic::generate(&EpisodeShape { seed, ..Default::default() });
            let bytes = episode.write_to(Vec::new(), 3).expect("writing into a Vec cannot fail");
            raw_total.fetch_add(raw_bytes(&bytes), Ordering::Relaxed);
            disk_total.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            let path = dir.path().join(format!("traces/ep-{seed:05}.trace"));
            fs::write(&path, &bytes).unwrap_or_else(|e| panic!("failed to write {}: {e}", path.display()));
            json_total.fetch_add(export_jsonl(&path, &jsonl_path(dir.path(), seed)), Ordering::Relaxed);
            token_logit_total.fetch_add(token_logit_bytes(&bytes), Ordering::Relaxed);
        },
        |_, ()| {},
    );
    let (raw_total, disk_total, json_total) =
        (raw_total.into_inner(), disk_total.into_inner(), json_total.into_inner());
    let token_logit_share = token_logit_total.into_inner() as f64 / raw_total as f64;
    println!(
        "  {:.2} GB uncompressed, {:.2} GB on disk, {:.2} GB of JSON Lines, in {:.1} s",
        raw_total as f64 / 1e9,
        disk_total as f64 / 1e9,
        json_total as f64 / 1e9,
        gen_started.elapsed().as_secs_f64()
    );
    // Warm the page cache for both sides.
    for path in paths.iter().cloned().chain(seeds.iter().map(|&s| jsonl_path(dir.path(), s))) {
        let mut sink = Vec::new();
        File::open(&path).and_then(|mut f| f.read_to_end(&mut sink)).expect("read back a generated file");
    }

    // ---- timed: search and scan, round-robin; jq once ----
    let mut search_s = Vec::new();
    let mut search_cpu = Vec::new();
    let mut scan_s = Vec::new();
    let mut scan_cpu = Vec::new();
    let mut search_found = BTreeSet::new();
    for _ in 0..reps {
        let (t, cpu) = (Instant::now(), cpu_seconds().0);
        let mut found = BTreeSet::new();
        for_each_ordered(
            &paths,
            jobs,
            |p| query.search_file(p),
            |_, r| {
                assert!(r.error.is_none(), "search failed: {:?}", r.error);
                found.extend(r.matches.into_iter().map(|m| (m.episode, m.step)));
            },
        );
        search_s.push(t.elapsed().as_secs_f64());
        search_cpu.push(cpu_seconds().0 - cpu);
        search_found = found;

        let (t, cpu) = (Instant::now(), cpu_seconds().0);
        let mut records = 0u64;
        for_each_ordered(&paths, jobs, |p| scan(p), |_, n| records += n);
        scan_s.push(t.elapsed().as_secs_f64());
        scan_cpu.push(cpu_seconds().0 - cpu);
        assert!(records > 0);
    }
    let (t, cpu) = (Instant::now(), cpu_seconds().1);
    let jq_found = run_jq(dir.path(), &seeds, jobs);
    let jq_s = t.elapsed().as_secs_f64();
    let jq_cpu = cpu_seconds().1 - cpu;
    assert_eq!(search_found.len(), jq_found.len(), "search and jq disagree on the number of matches");
    assert_eq!(search_found, jq_found, "search and jq found different steps");

    let search = median(&search_s);
    let scan_floor = median(&scan_s);
    let (search_cpu, scan_cpu) = (median(&search_cpu), median(&scan_cpu));
    let gbps_core = raw_total as f64 / 1e9 / search / jobs as f64;
    let gbps_cpu = raw_total as f64 / 1e9 / search_cpu;
    let ratio = jq_s / search;
    let ratio_cpu = jq_cpu / search_cpu;
    println!("\nquery: {QUERY}");
    println!("jq:    {JQ} -r '{JQ_FILTER}'");
    println!(
        "{jobs} workers, {} files, {:.2} GB uncompressed, {} matches\n",
        paths.len(),
        raw_total as f64 / 1e9,
        search_found.len()
    );
    println!("| case | wall s | GB/s | GB/s per core (wall / workers) | CPU s | GB per CPU-second |");
    println!("|---|---|---|---|---|---|");
    for (name, s, cpu) in [
        ("search", search, search_cpu),
        ("scan floor (checksums + zstd, no query)", scan_floor, scan_cpu),
        ("jq over JSON Lines", jq_s, jq_cpu),
    ] {
        let gbps = raw_total as f64 / 1e9 / s;
        println!(
            "| {name} | {s:.2} | {gbps:.3} | {:.3} | {cpu:.2} | {:.3} |",
            gbps / jobs as f64,
            raw_total as f64 / 1e9 / cpu
        );
    }
    println!("\nsearch / jq speedup: {ratio:.1}x wall, {ratio_cpu:.1}x CPU time (target >= {TARGET_RATIO_VS_JQ}x)");
    println!(
        "search per core: {gbps_core:.3} GB/s wall / workers, {gbps_cpu:.3} GB per CPU-second (target >= {TARGET_GB_PER_S_PER_CORE})"
    );
    println!("search / scan floor: {:.2}x the floor's time", search / scan_floor);
    println!("token_logit records: {:.1}% of the uncompressed bytes", token_logit_share * 100.0);

    let report = json!({
        "benchmark": "search",
        "command": "cargo bench -p basecamp-trace --bench search",
        "date_utc": utc_now(),
        "commit": git_commit(),
        "machine": machine(None),
        "workers": jobs,
        "query": QUERY,
        "jq_filter": JQ_FILTER,
        "jq_version": Command::new(JQ).arg("--version").output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()),
        "input": {
            "files": paths.len(),
            "episode_shape": "synthetic::EpisodeShape::default() (50 steps, 20 memory keys, 200 tokens x top-5)",
            "uncompressed_bytes": raw_total,
            "on_disk_bytes": disk_total,
            "jsonl_bytes": json_total,
            "token_logit_share_of_uncompressed": token_logit_share,
        },
        "matches": {"search": search_found.len(), "jq": jq_found.len(), "equal": search_found == jq_found},
        "seconds": {
            "search_median": search, "search_all": search_s,
            "scan_floor_median": scan_floor, "scan_floor_all": scan_s,
            "jq": jq_s,
        },
        "cpu_seconds": {"search_median": search_cpu, "scan_floor_median": scan_cpu, "jq": jq_cpu},
        "gb_per_s": {
            "search": raw_total as f64 / 1e9 / search,
            "search_per_core": gbps_core,
            "search_per_cpu_second": gbps_cpu,
            "scan_floor_per_core": raw_total as f64 / 1e9 / scan_floor / jobs as f64,
            "jq_per_core_uncompressed": raw_total as f64 / 1e9 / jq_s / jobs as f64,
            "jq_per_core_of_json": json_total as f64 / 1e9 / jq_s / jobs as f64,
        },
        "ratios": {"jq_over_search": ratio, "jq_over_search_cpu_time": ratio_cpu, "search_over_scan_floor": search / scan_floor},
        "targets": [
            {"name": "search GB/s per core (uncompressed; wall time / workers)", "target": TARGET_GB_PER_S_PER_CORE, "measured": gbps_core, "met": gbps_core >= TARGET_GB_PER_S_PER_CORE},
            {"name": "search GB per CPU-second (uncompressed; process CPU time)", "target": TARGET_GB_PER_S_PER_CORE, "measured": gbps_cpu, "met": gbps_cpu >= TARGET_GB_PER_S_PER_CORE},
            {"name": "search speedup over jq", "target": TARGET_RATIO_VS_JQ, "measured": ratio, "met": ratio >= TARGET_RATIO_VS_JQ},
        ],
        "wall_seconds": started.elapsed().as_secs_f64(),
    });
    write_results(RESULTS, &report);
    let path = Path::new(RESULTS);
    println!("\nwrote {} in {:.1} s", path.display(), started.elapsed().as_secs_f64());
}

/// Sum of the decompressed sizes of a trace's record frames.
fn raw_bytes(trace: &[u8]) -> u64 {
    let mut at = PREAMBLE_LEN;
    let mut total = 0u64;
    while at + FRAME_HEADER_LEN <= trace.len() {
        let header: [u8; FRAME_HEADER_LEN] = trace[at..at + FRAME_HEADER_LEN].try_into().expect("20 bytes");
        let Ok(h) = FrameHeader::decode(&header) else { break };
        if h.kind == FrameKind::Records {
            total += u64::from(h.raw_len);
        }
        at += FRAME_HEADER_LEN + h.compressed_len as usize;
    }
    total
}

fn jsonl_path(dir: &Path, seed: u64) -> PathBuf {
    dir.join(format!("jsonl/ep-{seed:05}.jsonl"))
}

/// One JSON object per record (proto3 JSON mapping, plus "episode");
/// returns the bytes written.
fn export_jsonl(trace: &Path, out: &Path) -> u64 {
    let contents = read_trace(trace).expect("a generated trace reads back");
    let mut w = BufWriter::new(File::create(out).expect("create the JSON Lines file"));
    let mut n = 0u64;
    for record in &contents.records {
        let mut value = record_to_json(record);
        value["episode"] = Value::String(contents.header.episode_id.clone());
        let line = value.to_string();
        n += line.len() as u64 + 1;
        w.write_all(line.as_bytes()).and_then(|()| w.write_all(b"\n")).expect("write JSON Lines");
    }
    w.flush().expect("flush JSON Lines");
    n
}

/// Encoded bytes of the token_logit records (what the frame-level kind
/// mask of format version 2 lets a search that does not name token_logit
/// skip without decompressing).
fn token_logit_bytes(trace: &[u8]) -> u64 {
    let mut reader = TraceReader::new(trace, "t").expect("a generated trace");
    let mut n = 0;
    while let Some(r) = reader.next_raw() {
        let r = r.expect("a generated trace is intact");
        if r.kind == basecamp_trace::RecordKind::TokenLogit {
            n += (r.bytes.len() + prost::encoding::encoded_len_varint(r.bytes.len() as u64)) as u64;
        }
    }
    n
}

/// Every record of a trace read and verified, nothing evaluated.
fn scan(path: &Path) -> u64 {
    let mut reader = TraceReader::open(path).expect("open a generated trace");
    let mut n = 0;
    while let Some(r) = reader.next_raw() {
        r.expect("a generated trace is intact");
        n += 1;
    }
    n
}

/// Runs one jq per worker over its share of the JSON Lines files.
fn run_jq(dir: &Path, seeds: &[u64], jobs: usize) -> BTreeSet<(String, u32)> {
    let chunk = seeds.len().div_ceil(jobs);
    let children: Vec<_> = seeds
        .chunks(chunk)
        .map(|part| {
            Command::new(JQ)
                .arg("-r")
                .arg(JQ_FILTER)
                .args(part.iter().map(|&s| jsonl_path(dir, s)))
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("failed to start {JQ}: {e}"))
        })
        .collect();
    let mut found = BTreeSet::new();
    for child in children {
        let out = child.wait_with_output().expect("jq runs");
        assert!(out.status.success(), "jq failed: {}", out.status);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let (episode, step) = line.rsplit_once(' ').expect("jq prints 'episode step'");
            found.insert((episode.to_string(), step.parse().expect("a step number")));
        }
    }
    found
}

/// (this process's CPU seconds, its waited-for children's), from /proc/self/stat.
fn cpu_seconds() -> (f64, f64) {
    let stat = fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<f64> = after_comm.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    let tick = clock_ticks_per_second();
    let at = |i: usize| f.get(i).copied().unwrap_or(0.0) / tick;
    // Fields 14-17 of proc(5) (utime, stime, cutime, cstime), counted from field 3 here.
    (at(11) + at(12), at(13) + at(14))
}

fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}
