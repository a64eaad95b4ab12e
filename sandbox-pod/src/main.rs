//! `basecamp-sandbox`: the runtime inside each sandbox pod (and behind
//! `basecamp run` locally). `run` executes one shard of a HarnessTask's test
//! set and writes one `.trace` per episode plus the shard's `summary.json`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use basecamp_sandbox::run::{RunRequest, run};
use clap::{Parser, Subcommand};

/// Runs an agent's episodes in a sandbox and writes one .trace per episode.
#[derive(Parser)]
#[command(name = "basecamp-sandbox", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one shard of a HarnessTask (driver mode).
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Manifest files or directories holding the HarnessTask and its SandboxConfig(s).
    #[arg(long = "config", required = true)]
    config: Vec<PathBuf>,
    /// The HarnessTask to run, when the manifests hold several.
    #[arg(long)]
    task: Option<String>,
    /// The variant to run (default: the first).
    #[arg(long)]
    variant: Option<String>,
    /// This shard as INDEX/COUNT, 0-based: `--shard 2/4`.
    #[arg(long, default_value = "0/1", value_parser = parse_shard)]
    shard: (u32, u32),
    /// Where traces and summary.json go (default: basecamp-runs/<task>/<variant>/shard-<i>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Episodes run at the same time.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Serve /metrics, /healthz and live injection on this address while running.
    #[arg(long, env = "BASECAMP_SANDBOX_LISTEN")]
    listen: Option<SocketAddr>,
    /// Keep traces local even when the task names an S3 destination.
    #[arg(long)]
    no_upload: bool,
}

fn parse_shard(s: &str) -> Result<(u32, u32), String> {
    let (i, n) = s.split_once('/').ok_or_else(|| format!("{s:?}: write the shard as INDEX/COUNT, e.g. 0/4"))?;
    let i: u32 = i.trim().parse().map_err(|_| format!("{s:?}: the shard index is not a number"))?;
    let n: u32 = n.trim().parse().map_err(|_| format!("{s:?}: the shard count is not a number"))?;
    if n == 0 || i >= n {
        return Err(format!("{s:?}: the index must be below the count (0-based), and the count above 0"));
    }
    Ok((i, n))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run_command(args).await,
    }
}

async fn run_command(args: RunArgs) -> ExitCode {
    let request = RunRequest {
        manifests: args.config,
        task: args.task,
        variant: args.variant,
        shard: args.shard.0,
        shard_count: args.shard.1,
        out_dir: args.out,
        concurrency: args.concurrency,
        listen: args.listen,
        upload: !args.no_upload,
        stop: basecamp_sandbox::driver::StopSignal::new(),
    };
    // SIGTERM (a pod being evicted) or Ctrl-C: stop starting episodes, flush
    // the running ones' traces, and still write (and upload) the summary.
    let stop = request.stop.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let terminated = async {
            match term.as_mut() {
                Some(term) => term.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = terminated => {},
        }
        eprintln!("stopping: no new episodes; the summary lists what was cut off");
        stop.cancel();
    });
    let outcome = match run(&request).await {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error [{}]: {e}", e.category());
            return ExitCode::FAILURE;
        }
    };
    for w in &outcome.warnings {
        eprintln!("{w}");
    }
    let s = &outcome.summary;
    let agg = &s.aggregate;
    let mean = |k: &str| agg.means.get(k).map_or("-".to_string(), |v| format!("{v:.3}"));
    println!(
        "{}/{} shard {}/{}: {} episodes in {:.1}s  tool_call_accuracy {}  plan_step_f1 {}  memory_consistency {}  error_rate {}  p50 {:.2}s  p95 {:.2}s",
        s.task,
        s.variant,
        s.shard,
        s.shard_count,
        agg.episodes,
        s.wall_seconds,
        mean("tool_call_accuracy"),
        mean("plan_step_f1"),
        mean("memory_consistency"),
        mean("error_rate"),
        agg.resolution_time_p50_s,
        agg.resolution_time_p95_s,
    );
    println!("traces and summary.json: {}", outcome.out_dir.display());
    let mut code = ExitCode::SUCCESS;
    for lost in &s.lost {
        eprintln!("error: episode {} lost: {}", lost.id, lost.error);
        code = ExitCode::from(2);
    }
    if let Some(report) = &outcome.upload {
        if report.is_complete() {
            println!("uploaded {} files to {}", report.files.len(), report.destination);
        } else {
            eprintln!("{report}");
            eprintln!("the local copies are kept in {}", outcome.out_dir.display());
            code = ExitCode::from(3);
        }
    }
    code
}
