//! What an exec tool call costs over starting the same program directly.
//!
//! An exec tool call (`ExecTool::call`) forks a keeper process that leads
//! the tool's process group and forks the tool (tools/group_keeper.rs: a
//! runner killed with SIGKILL takes its tools' whole groups with it), writes
//! the arguments to the tool's stdin and reads its JSON answer. The peer, in
//! the same process and the same rounds: `tokio::process::Command` running
//! the same program with the same pipes, the arguments written and the
//! output read, in a process group of its own but without a keeper. Both
//! run `/bin/echo '"ok"'` (a program that does next to nothing), so the
//! ratio is the keeper's and the executor's share of a call at its
//! cheapest; any real tool's own run time dilutes it.
//!
//! Cases run round-robin (each round times every case once) and ratios are
//! taken per round. Writes `bench/results/exec.json`.
//! `EXEC_BENCH_ROUNDS` and `EXEC_BENCH_CALLS` (calls per case per round)
//! change the sampling.

use std::process::Stdio;
use std::time::Instant;

use basecamp_bench_support::{env_or, git_commit, loadavg, machine, median, spread, utc_now, write_results};
use basecamp_sandbox::tools::exec::ExecTool;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

const RESULTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/results/exec.json");
const PROGRAM: &str = "/bin/echo";
const ANSWER: &str = "\"ok\"";

/// The peer: the same program, pipes and process group, no keeper.
async fn bare_spawn(arguments: &Value) -> f64 {
    let started = Instant::now();
    let mut child = tokio::process::Command::new(PROGRAM)
        .arg(ANSWER)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("/bin/echo starts");
    let input = serde_json::to_vec(arguments).expect("a Value serializes");
    if let Some(mut stdin) = child.stdin.take() {
        // echo does not read its stdin: a closed pipe is expected.
        let _ = stdin.write_all(&input).await;
    }
    let output = child.wait_with_output().await.expect("echo ends");
    assert!(output.status.success());
    let answer: Value = serde_json::from_slice(&output.stdout).expect("echo printed JSON");
    assert_eq!(answer, json!("ok"));
    started.elapsed().as_secs_f64()
}

async fn exec_tool(tool: &ExecTool, arguments: &Value) -> f64 {
    let started = Instant::now();
    let output = tool.call(arguments).await.expect("the exec tool answers");
    assert_eq!(output.observation, json!("ok"));
    started.elapsed().as_secs_f64()
}

fn main() {
    let rounds: usize = env_or("EXEC_BENCH_ROUNDS", 9).max(1);
    let calls: usize = env_or("EXEC_BENCH_CALLS", 40).max(1);
    let loadavg_at_start = loadavg();
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    let tool = ExecTool::new(vec![PROGRAM.to_string(), ANSWER.to_string()]);
    let arguments = json!({"order_id": "ORD-1000", "carrier": "DHL"});

    // Per round: the mean seconds per call of each case.
    let (mut keeper, mut bare, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    runtime.block_on(async {
        // Warm up both paths (page cache, the runtime's blocking pool).
        for _ in 0..5 {
            exec_tool(&tool, &arguments).await;
            bare_spawn(&arguments).await;
        }
        for _ in 0..rounds {
            let mut k = 0.0;
            for _ in 0..calls {
                k += exec_tool(&tool, &arguments).await;
            }
            let mut b = 0.0;
            for _ in 0..calls {
                b += bare_spawn(&arguments).await;
            }
            keeper.push(k / calls as f64);
            bare.push(b / calls as f64);
            ratio.push(k / b);
        }
    });
    let micros = |v: &[f64]| v.iter().map(|s| s * 1e6).collect::<Vec<_>>();
    let (keeper_us, bare_us) = (micros(&keeper), micros(&bare));
    let overhead_us: Vec<f64> = keeper_us.iter().zip(&bare_us).map(|(k, b)| k - b).collect();
    println!("exec tool call vs bare spawn of {PROGRAM} {ANSWER}, {rounds} rounds x {calls} calls each, µs per call");
    println!("  ExecTool::call (keeper)     median {:>8.0}", median(&keeper_us));
    println!("  tokio Command (no keeper)   median {:>8.0}", median(&bare_us));
    println!("  overhead per call           median {:>8.0}", median(&overhead_us));
    println!("  ratio (per round)           median {:>8.2}x", median(&ratio));
    let doc = json!({
        "bench": "exec",
        "command": "cargo bench -p basecamp-sandbox --bench exec",
        "date_utc": utc_now(),
        "git_commit": git_commit(),
        "machine": machine(loadavg_at_start),
        "what": "an exec tool call (ExecTool::call: keeper fork + tool fork/exec, arguments on stdin, JSON answer \
                 read) against tokio::process::Command running the same program with the same pipes and its own \
                 process group, no keeper; the program is /bin/echo '\"ok\"'",
        "method": {"rounds": rounds, "calls_per_case_per_round": calls,
                   "order": "round-robin: each round times every case; ratios per round",
                   "elapsed_s": started.elapsed().as_secs_f64()},
        "exec_tool_us_per_call": spread(&keeper_us),
        "bare_spawn_us_per_call": spread(&bare_us),
        "overhead_us_per_call": spread(&overhead_us),
        "ratio_exec_tool_over_bare_spawn": spread(&ratio),
    });
    write_results(RESULTS, &doc);
    println!("\nwrote {RESULTS}");
}
