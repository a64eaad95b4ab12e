//! `basecamp-sandbox`: the runtime inside each sandbox pod (and behind
//! `basecamp run` locally). `run` executes one shard of a HarnessTask's test
//! set and writes one `.trace` per episode plus the shard's `summary.json`;
//! `serve` offers the sandbox to an external trainer over HTTP (server mode).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use basecamp_sandbox::driver::StopSignal;
use basecamp_sandbox::run::{RunRequest, exit_code, run};
use basecamp_sandbox::server::{LingerEnd, RunningServer};
use basecamp_sandbox::stderr_line;
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
    /// Serve the sandbox as a gym-like HTTP environment for an external trainer (server mode).
    Serve(ServeArgs),
    /// Upload a shard's output directory again, after `run` exited 3 (its upload failed).
    Upload(UploadArgs),
}

#[derive(clap::Args)]
struct UploadArgs {
    /// The shard's output directory (`run --out`), holding its summary.json.
    dir: PathBuf,
    /// Where to: the task's `spec.traces.destination` (`s3://bucket/prefix` or a local
    /// directory); the files go under the same date/namespace/task/variant/shard partition
    /// as `run` uploads them, the day being the one the shard started.
    to: String,
}

/// `--base-dir`, the same for `run` and `serve`.
#[derive(clap::Args)]
struct BaseDir {
    /// Resolve relative paths in the manifests (services, exec tools, fixtures, a local test
    /// set or scripted policy) against DIR instead of the manifest file's directory. The
    /// operator passes `.`: the tools image's working directory.
    #[arg(long = "base-dir", value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Manifest files or directories holding the HarnessTask and its SandboxConfig(s).
    #[arg(long = "config", required = true)]
    config: Vec<PathBuf>,
    /// The HarnessTask to serve, when the manifests hold several.
    #[arg(long)]
    task: Option<String>,
    /// The variant to serve (default: the first).
    #[arg(long)]
    variant: Option<String>,
    /// The address to serve the API on, e.g. 127.0.0.1:8090.
    #[arg(long, env = "BASECAMP_SANDBOX_LISTEN")]
    listen: SocketAddr,
    /// Where traces go (default: basecamp-runs/<task>/<variant>/serve).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    base_dir: BaseDir,
    /// Episodes open at once; creating one more answers 429.
    #[arg(long, default_value_t = basecamp_sandbox::gym::DEFAULT_MAX_EPISODES, value_parser = at_least_one())]
    max_episodes: usize,
    /// Close an episode after this long without a request: 90s, 10m, 500ms.
    /// A closed episode is held as long again, then forgotten (its trace stays).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    idle_timeout: std::time::Duration,
}

/// A count flag that 0 would silently turn into 1.
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let d: basecamp_api::Duration = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    d.to_std().filter(|d| !d.is_zero()).ok_or_else(|| format!("{s:?}: give a positive duration such as 90s or 10m"))
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
    #[command(flatten)]
    base_dir: BaseDir,
    /// Episodes run at the same time.
    #[arg(long, default_value_t = 4, value_parser = at_least_one())]
    concurrency: usize,
    /// Serve /metrics, /healthz and live injection on this address while running.
    #[arg(long, env = "BASECAMP_SANDBOX_LISTEN")]
    listen: Option<SocketAddr>,
    /// With --listen, for a pod Prometheus scrapes: before the first episode, wait for a first
    /// scrape (every series is there at zero, so a shard shorter than a scrape interval still
    /// shows in rate()); once the episodes ended and the traces were uploaded, keep serving
    /// /metrics until a scrape has seen the final counts. Each wait at most this long (45s, 2m;
    /// 0s: no waits). SIGTERM or Ctrl-C ends a wait; the exit code and summary do not change.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = basecamp_api::Duration::parse_flag, requires = "listen")]
    metrics_linger: std::time::Duration,
    /// Keep traces local even when the task names an S3 destination.
    #[arg(long)]
    no_upload: bool,
    /// Evaluate training checkpoint step-N: traces and summary.json go under the run name
    /// `<task>@step-N` and reward weights are those of training step N.
    #[arg(long, value_name = "N")]
    checkpoint_step: Option<u64>,
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
    // The runtime's own warnings (an upload or a policy call retried, a GPU
    // run fallen back to the CPU) on stderr; RUST_LOG chooses more.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("basecamp_sandbox=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Run(args) => run_command(args).await,
        Command::Serve(args) => serve_command(args).await,
        Command::Upload(args) => upload_command(args).await,
    }
}

async fn upload_command(args: UploadArgs) -> ExitCode {
    match basecamp_sandbox::run::upload_again(&args.dir, &args.to).await {
        Err(e) => {
            stderr_line!("error: {e}");
            ExitCode::from(exit_code::CONFIG_ERROR)
        }
        Ok(report) if report.is_complete() => {
            let mut stdout = Stdout::default();
            stdout.line(format_args!("uploaded {} files to {}", report.files.len(), report.destination));
            match stdout.failed {
                Some(e) => {
                    stderr_line!("error [Stdout]: cannot write the outcome to stdout: {e}; the upload is complete");
                    ExitCode::FAILURE
                }
                None => ExitCode::SUCCESS,
            }
        }
        Ok(report) => {
            stderr_line!("{report}");
            stderr_line!("the local copies are kept in {}", args.dir.display());
            ExitCode::from(exit_code::UPLOAD_FAILED)
        }
    }
}

async fn serve_command(args: ServeArgs) -> ExitCode {
    use basecamp_sandbox::gym::{Gym, serve, setup};
    // Listening from the start: SIGTERM's default while the services start
    // would end the process on the spot and leave them running.
    let stop = StopSignal::new();
    let on_signal = stop.clone();
    let signalled = basecamp_sandbox::driver::ctrl_c_or_sigterm();
    tokio::spawn(async move {
        signalled.await;
        on_signal.cancel();
    });
    let request = setup::ServeRequest {
        manifests: args.config,
        task: args.task,
        variant: args.variant,
        out_dir: args.out,
        base_dir: args.base_dir.dir,
        max_episodes: args.max_episodes,
        idle_timeout: args.idle_timeout,
        stop: stop.clone(),
    };
    let prepared = match setup::load(&request).await {
        Ok(prepared) => prepared,
        Err(e) => {
            stderr_line!("error [{}]: {e}", e.category());
            return ExitCode::FAILURE;
        }
    };
    for w in &prepared.warnings {
        stderr_line!("{w}");
    }
    // The helper services live as long as this binding: until the server stops.
    let _services = prepared.services;
    if stop.is_cancelled() {
        stderr_line!("stopping: SIGTERM or Ctrl-C before the API was served; the services are stopped");
        return ExitCode::SUCCESS;
    }
    let gym = match Gym::new(prepared.config) {
        Ok(gym) => gym,
        Err(e) => {
            stderr_line!("error [TraceIo]: cannot create the trace directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            stderr_line!("error [Listen]: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener.local_addr().map_or_else(|_| args.listen.to_string(), |a| a.to_string());
    let serving = format!("serving the sandbox API on http://{addr} (traces in {})", gym.out_dir().display());
    if let Err(e) = writeln!(std::io::stdout(), "{serving}") {
        // A supervisor that closed stdout still gets a server, and its address here.
        stderr_line!("warning: cannot write to stdout ({e}); {serving}");
    }
    let shutdown = async move {
        stop.cancelled().await;
        stderr_line!("stopping: closing open episodes so their traces are complete");
    };
    match serve(listener, gym, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            stderr_line!("error [Serve]: {e}");
            ExitCode::FAILURE
        }
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
        base_dir: args.base_dir.dir,
        concurrency: args.concurrency,
        listen: args.listen,
        first_scrape_wait: args.metrics_linger,
        upload: !args.no_upload,
        checkpoint_step: args.checkpoint_step,
        stop: StopSignal::new(),
    };
    // SIGTERM (a pod being evicted) or Ctrl-C: stop starting episodes, flush
    // the running ones' traces, and still write (and upload) the summary.
    // After the shard, the same stop ends the wait for a final scrape.
    let stop = request.stop.clone();
    let shard_done = Arc::new(AtomicBool::new(false));
    let shard_done_for_signal = shard_done.clone();
    let signalled = basecamp_sandbox::driver::ctrl_c_or_sigterm();
    tokio::spawn(async move {
        signalled.await;
        if !shard_done_for_signal.load(Ordering::SeqCst) {
            stderr_line!("stopping: no new episodes; the summary lists what was cut off");
        }
        stop.cancel();
    });
    let mut stdout = Stdout::default();
    let mut outcome = match run(&request).await {
        Ok(o) => o,
        Err(e) => {
            stderr_line!("error [{}]: {e}", e.category());
            if e.is_transient() {
                stderr_line!("(unavailable for now: exit {}, a later attempt can succeed)", exit_code::UNAVAILABLE);
            }
            return ExitCode::from(e.exit_code());
        }
    };
    for w in &outcome.warnings {
        stderr_line!("{w}");
    }
    let s = &outcome.summary;
    let agg = &s.aggregate;
    let mean = |k: &str| agg.means.get(k).map_or("-".to_string(), |v| format!("{v:.3}"));
    // Nothing measured: no latency, not 0.
    let seconds = |k: &str| agg.value_of(k).map_or("-".to_string(), |v| format!("{v:.2}s"));
    stdout.line(format_args!(
        "{}/{} shard {}/{}: {} episodes in {:.1}s  tool_call_accuracy {}  plan_step_f1 {}  memory_consistency {}  error_rate {}  p50 {}  p95 {}",
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
        seconds("resolution_time_p50_s"),
        seconds("resolution_time_p95_s"),
    ));
    if agg.not_measured > 0 {
        // The pod's exit code stays 0: the shard ran and its summary says why.
        stderr_line!(
            "warning: {} of {} episodes NOT MEASURED (failure class policy_error or service_exited: the policy or a \
             service failed, not the agent); the metrics above are over the other {}",
            agg.not_measured,
            agg.episodes,
            agg.measured()
        );
    }
    if let Some(rate_limits) = &s.rate_limits {
        stderr_line!("warning: {}", rate_limits.sentence());
    }
    stdout.line(format_args!("traces and summary.json: {}", outcome.out_dir.display()));
    let mut code = ExitCode::SUCCESS;
    for lost in &s.lost {
        stderr_line!("error: episode {} lost: {}", lost.id, lost.error);
        code = ExitCode::from(exit_code::LOST_EPISODES);
    }
    if let Some(report) = &outcome.upload {
        if report.is_complete() {
            stdout.line(format_args!("uploaded {} files to {}", report.files.len(), report.destination));
        } else {
            stderr_line!("{report}");
            stderr_line!("the local copies are kept in {}", outcome.out_dir.display());
            if let Some(to) = &outcome.upload_to {
                stderr_line!("upload them again with: basecamp-sandbox upload {} {to}", outcome.out_dir.display());
            }
            code = ExitCode::from(exit_code::UPLOAD_FAILED);
        }
    }
    if let Some(gave_up) = &s.gave_up {
        // Not done: a later attempt (a new pod, its policy server started
        // afresh) runs the shard again.
        stderr_line!(
            "error: gave up: {}; {} episodes not started (summary.json's gave_up lists them); exit {}",
            gave_up.reason,
            gave_up.not_started.len(),
            exit_code::UNAVAILABLE
        );
        if code == ExitCode::SUCCESS {
            code = ExitCode::from(exit_code::UNAVAILABLE);
        }
    }
    if s.stopped_early && code == ExitCode::SUCCESS {
        // Not done: a Job must not count this pod's shard as complete.
        stderr_line!(
            "stopped early: {} episodes interrupted, {} not started (summary.json lists them); exit {}",
            s.interrupted.len(),
            s.not_started.len(),
            exit_code::STOPPED_EARLY
        );
        code = ExitCode::from(exit_code::STOPPED_EARLY);
    }
    if let Some(e) = stdout.failed {
        stderr_line!(
            "error [Stdout]: cannot write the outcome to stdout: {e}; the traces and summary.json are written"
        );
        // A lost episode (2), a failed upload (3) or a stop (130) says more.
        if code == ExitCode::SUCCESS {
            code = ExitCode::FAILURE;
        }
    }
    shard_done.store(true, Ordering::SeqCst);
    if let Some(server) = outcome.server.take() {
        wait_for_final_scrape(&server, args.metrics_linger, &request.stop).await;
        if let Err(e) = server.stop().await {
            stderr_line!("warning: the metrics server did not stop cleanly: {e}");
        }
    }
    code
}

/// The outcome lines of `run`: a reader gone (`| head`) must not panic the
/// process after the shard, so the first failed write is kept and reported
/// once, after everything else is done.
#[derive(Default)]
struct Stdout {
    failed: Option<std::io::Error>,
}

impl Stdout {
    fn line(&mut self, text: std::fmt::Arguments) {
        if self.failed.is_none()
            && let Err(e) = writeln!(std::io::stdout(), "{text}")
        {
            self.failed = Some(e);
        }
    }
}

/// `--metrics-linger`: Prometheus has only what it scraped, and the counts
/// since its last scrape (the last episodes, the upload) would leave with
/// the process. The outcome is already printed; this only delays the exit.
async fn wait_for_final_scrape(server: &RunningServer, linger: Duration, stop: &StopSignal) {
    if linger.is_zero() {
        return;
    }
    let shown = basecamp_api::Duration::from(linger);
    stderr_line!(
        "waiting for a final scrape of http://{}/metrics (at most {shown}, --metrics-linger) so that the last counts reach Prometheus",
        server.addr()
    );
    let line = match server.linger(linger, stop.cancelled()).await {
        LingerEnd::Scraped(after) => format!("final scrape served after {:.1}s; exiting", after.as_secs_f64()),
        LingerEnd::Elapsed => format!(
            "no scrape within {shown} (--metrics-linger); exiting: counts since the last scrape are not in Prometheus"
        ),
        LingerEnd::Stopped => "stopped waiting for a final scrape (SIGTERM or Ctrl-C); exiting".to_string(),
        LingerEnd::ServerDown => "not waiting for a final scrape: the metrics server has stopped; exiting".to_string(),
    };
    stderr_line!("{line}");
}
