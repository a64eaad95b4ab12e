//! `basecamp-sandbox run`: from manifests to a finished shard.
//!
//! load and validate the manifests (the same checks as the operator and
//! `basecamp harness validate`) -> resolve the variant's SandboxConfig and
//! profile -> load the test set (local or `s3://`) and take this shard ->
//! build the policy -> start the sandbox's services (a refused policy has
//! started none) -> build the runner -> wait for the policy
//! server (`spec.policy.server`) -> run the episodes (optionally serving
//! `/metrics` and live injection) -> write `summary.json` -> upload what
//! this run wrote (the traces and summary, the services' logs; not what an
//! earlier run left in the output directory) to the task's trace
//! destination, keeping the local copy and reporting any file that failed
//! -> declare the metrics final. With `listen`, the server is
//! still running in [`RunOutcome::server`]: the caller may
//! [`RunningServer::linger`] for a final scrape before stopping it.
//!
//! With `checkpoint_step: Some(N)` (the operator's evaluation of checkpoint
//! `step-N`, operator/TRAINING.md) the shard runs as the run
//! `<task>@step-N`: that name is the task in the traces' headers and in
//! `summary.json`, and the partition the files are uploaded under; the
//! reward weights and the headers' `training_step` are N's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use basecamp_api::{HarnessTask, Loaded, Manifests, Report, SandboxConfigSpec, TestSet, resolve_profile};

use crate::config::{RunContext, build_policy, build_runner_with_policy, episode_input};
use crate::driver::StopSignal;
use crate::driver::{SUMMARY_FILE, ShardSummary, run_shard};
use crate::episode::LiveInjections;
use crate::metrics::SandboxMetrics;
use crate::server::{LingerEnd, RunningServer, ServerState};
use crate::services::{RunningServices, ServiceError};
use crate::storage::{Destination, ShardPartition, Storage, StorageConfig, UploadReport, UtcDate};

/// Exit codes of `basecamp-sandbox run`. The operator's pod failure policy
/// matches on them (`basecamp_operator::build::job`), so a pod's exit says
/// whether its shard is done, worth retrying, or refused for good.
pub mod exit_code {
    /// The configuration (or the node's GPU) is refused: a retry fails the same way.
    pub const CONFIG_ERROR: u8 = 1;
    /// Something the shard needs before its first episode was unavailable
    /// for a while (the S3 test set or scripted policy after every retry:
    /// unreachable, timed out, throttled, 5xx): a later attempt can succeed
    /// ([`crate::run::RunError::is_transient`]). A policy server that never got ready
    /// within its `startupTimeout` stays a configuration error (1): the
    /// same model on the same kind of node would not get ready either.
    /// Also a shard that gave up midway ([`crate::driver::GaveUp`]): its
    /// policy's server or a service failed episode after episode.
    pub const UNAVAILABLE: u8 = 4;
    /// Episodes lost: their traces could not be written.
    pub const LOST_EPISODES: u8 = 2;
    /// The upload failed (the local copies are kept).
    pub const UPLOAD_FAILED: u8 = 3;
    /// SIGTERM or Ctrl-C cut the shard off: episodes were interrupted or
    /// never started (`summary.json` says `stopped_early` and lists them),
    /// so the shard is not done, though every trace written is whole. As a
    /// shell reports a process ended by SIGINT, and as `basecamp run` exits.
    pub const STOPPED_EARLY: u8 = 130;
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub manifests: Vec<PathBuf>,
    /// The HarnessTask's name; needed only when the manifests hold several.
    pub task: Option<String>,
    /// The variant; the first when absent.
    pub variant: Option<String>,
    pub shard: u32,
    pub shard_count: u32,
    pub out_dir: Option<PathBuf>,
    /// What relative paths in the manifests (services, exec tools,
    /// fixtures, a local test set or scripted policy) are resolved against;
    /// `None`: each manifest's own directory. In a pod the operator passes
    /// `.`, the tools image's working directory, since the manifests come
    /// from a ConfigMap mount that holds nothing else.
    pub base_dir: Option<PathBuf>,
    pub concurrency: usize,
    /// Serve `/metrics`, `/healthz` and live injection here while running
    /// (and after, until the caller stops [`RunOutcome::server`]).
    pub listen: Option<std::net::SocketAddr>,
    /// With `listen`: before the first episode, wait at most this long for
    /// a first scrape, so that Prometheus holds every series at zero and a
    /// shard shorter than a scrape interval still shows in `rate()`
    /// (`--metrics-linger`; zero: start at once).
    pub first_scrape_wait: Duration,
    /// Upload to the task's `traces.destination` when it names one.
    pub upload: bool,
    /// Evaluate training checkpoint `step-N`: run as `<task>@step-N` at training step N.
    pub checkpoint_step: Option<u64>,
    /// Set to stop early (Ctrl-C): no new episodes start, running ones are
    /// cut off with their traces flushed, and the summary says so.
    pub stop: StopSignal,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the manifests have problems:\n{0}")]
    Invalid(String),
    #[error("{0}")]
    Selection(String),
    /// `transient`: the S3 fetch failed in a way a retry can fix.
    #[error("test set {location}: {message}")]
    TestSet { location: String, message: String, transient: bool },
    #[error("scripted policy {location}: {message}")]
    ScriptedPolicy { location: String, message: String, transient: bool },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error(transparent)]
    Gpu(#[from] basecamp_gpu::requirement::GpuRequirementError),
    #[error(transparent)]
    PolicyServer(#[from] crate::readiness::NotReady),
    #[error("cannot create the output directory {}: {source}; give another with --out", dir.display())]
    OutDir { dir: PathBuf, source: std::io::Error },
    #[error("cannot listen on {addr} (--listen): {source}")]
    Listen { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("cannot run the shard: {0}")]
    Io(#[from] std::io::Error),
}

impl RunError {
    /// Whether a later attempt can succeed where this one failed before its
    /// first episode: exit [`exit_code::UNAVAILABLE`], which the operator's
    /// Job retries, rather than [`exit_code::CONFIG_ERROR`], which fails the
    /// shard for good.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::TestSet { transient, .. } | Self::ScriptedPolicy { transient, .. } => *transient,
            _ => false,
        }
    }

    /// The process's exit code for this error.
    pub fn exit_code(&self) -> u8 {
        if self.is_transient() { exit_code::UNAVAILABLE } else { exit_code::CONFIG_ERROR }
    }

    pub fn category(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "InvalidSpec",
            Self::Selection(_) => "NoSuchTaskOrVariant",
            Self::TestSet { .. } => "TestSetUnavailable",
            Self::ScriptedPolicy { .. } => "PolicyUnavailable",
            Self::Config(e) => e.category(),
            Self::Service(e) => e.category(),
            Self::Gpu(e) => e.category(),
            Self::PolicyServer(e) => e.category(),
            Self::OutDir { .. } | Self::Io(_) => "TraceIo",
            Self::Listen { .. } => "Listen",
        }
    }
}

/// How a shard went.
#[derive(Debug)]
pub struct RunOutcome {
    pub summary: ShardSummary,
    pub out_dir: PathBuf,
    pub upload: Option<UploadReport>,
    /// Where the upload went: the task's `spec.traces.destination` (for
    /// [`upload_again`] after a failed one).
    pub upload_to: Option<String>,
    pub warnings: Vec<String>,
    /// The `listen` server, still serving; its metrics are final (nothing
    /// of this run updates them any more). Dropping it stops it.
    pub server: Option<RunningServer>,
}

fn problems(report: &Report, errors_only: bool) -> String {
    report
        .problems()
        .iter()
        .filter(|p| !errors_only || p.severity == basecamp_api::Severity::Error)
        .map(|p| format!("  {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Loads `paths` and runs every check (the same as the operator's and
/// `basecamp harness validate`'s); the warnings come back as lines.
pub fn load_manifests(paths: &[PathBuf]) -> Result<(Manifests, Vec<String>), RunError> {
    load_manifests_in(paths, None)
}

/// [`load_manifests`], with local files resolved against `base_dir` when
/// given instead of each manifest's directory.
pub fn load_manifests_in(paths: &[PathBuf], base_dir: Option<&Path>) -> Result<(Manifests, Vec<String>), RunError> {
    let (manifests, load_report) = Manifests::load(paths);
    let mut report = load_report;
    report.extend(manifests.validate_in(base_dir));
    if report.has_errors() {
        return Err(RunError::Invalid(problems(&report, true)));
    }
    let warnings = report.warnings().map(|p| p.to_string()).collect();
    Ok((manifests, warnings))
}

/// The HarnessTask named `name` (`NAME` or `NAMESPACE/NAME`), or the only
/// one. A task without a namespace matches any namespace (as `kubectl
/// apply -n`), and runs in the one `NAMESPACE/NAME` named: the copy
/// returned has it in its metadata, so its traces, upload partition and
/// SandboxConfig lookup say where it ran.
pub fn select_task(manifests: &Manifests, name: Option<&str>) -> Result<Loaded<HarnessTask>, RunError> {
    let (namespace, found) = find_task(manifests, name)?;
    let mut task = found.clone();
    if task.object.metadata.namespace.is_none() {
        task.object.metadata.namespace = namespace.map(str::to_string);
    }
    Ok(task)
}

/// The task [`select_task`] chooses, and the namespace `name` gave.
fn find_task<'m, 'n>(
    manifests: &'m Manifests,
    name: Option<&'n str>,
) -> Result<(Option<&'n str>, &'m Loaded<HarnessTask>), RunError> {
    let qualified = |t: &Loaded<HarnessTask>| {
        let meta = &t.object.metadata;
        match &meta.namespace {
            Some(namespace) => format!("{namespace}/{}", meta.name.as_deref().unwrap_or_default()),
            None => meta.name.clone().unwrap_or_default(),
        }
    };
    let names = || {
        let names: Vec<String> = manifests.tasks.iter().map(qualified).collect();
        if names.is_empty() { "none".to_string() } else { names.join(", ") }
    };
    let Some(wanted) = name else {
        return match manifests.tasks.as_slice() {
            [only] => Ok((None, only)),
            [] => Err(RunError::Selection(
                "the manifests hold no HarnessTask; give the file or directory that defines one".into(),
            )),
            _ => Err(RunError::Selection(format!("choose a HarnessTask with --task; the manifests hold: {}", names()))),
        };
    };
    // NAMESPACE/NAME, or NAME; a task without a namespace is in any (as `kubectl apply -n`).
    let (namespace, task_name) = match wanted.split_once('/') {
        Some((namespace, task_name)) => (Some(namespace), task_name),
        None => (None, wanted),
    };
    let found: Vec<&Loaded<HarnessTask>> = manifests
        .tasks
        .iter()
        .filter(|t| t.object.metadata.name.as_deref() == Some(task_name))
        .filter(|t| namespace.is_none_or(|ns| t.object.metadata.namespace.as_deref().is_none_or(|own| own == ns)))
        .collect();
    match found.as_slice() {
        [one] => Ok((namespace, one)),
        [] => Err(RunError::Selection(format!("no HarnessTask {wanted:?} in the manifests; they hold: {}", names()))),
        several => {
            let places: Vec<String> = several.iter().map(|t| qualified(t)).collect();
            Err(RunError::Selection(format!(
                "HarnessTask {task_name:?} is in several namespaces ({}); choose one with --task NAMESPACE/{task_name}",
                places.join(", ")
            )))
        }
    }
}

/// The namespace a task runs in, which its traces' headers and upload
/// partition name: its own; for a task without one, that of the
/// SandboxConfigs its variants use (`kubectl apply -n` would put both in
/// one); else `default`.
pub fn run_namespace(manifests: &Manifests, task: &HarnessTask) -> Result<String, RunError> {
    if let Some(namespace) = &task.metadata.namespace {
        return Ok(namespace.clone());
    }
    let variants = task.spec.effective_variants();
    let mut namespaces: Vec<&str> = variants
        .iter()
        .filter_map(|v| manifests.referenced_sandbox(None, &v.sandbox_ref.name).ok())
        .filter_map(|s| s.object.metadata.namespace.as_deref())
        .collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    match namespaces.as_slice() {
        [] => Ok("default".into()),
        [one] => Ok(one.to_string()),
        several => Err(RunError::Selection(format!(
            "HarnessTask {:?} has no metadata.namespace and its variants use SandboxConfigs of namespaces {}; \
             a task runs in one namespace: set its metadata.namespace (or run it with --task NAMESPACE/NAME)",
            task.metadata.name.as_deref().unwrap_or_default(),
            several.join(", ")
        ))),
    }
}

/// One variant of a task, its SandboxConfig resolved (profile applied).
#[derive(Debug, Clone)]
pub struct ResolvedVariant {
    pub name: String,
    pub sandbox_name: String,
    pub sandbox: SandboxConfigSpec,
}

/// The task's variants (all, or only `only`), each with its resolved
/// sandbox: the SandboxConfig of the task's namespace (or one without a
/// namespace), never another namespace's of the same name.
pub fn resolve_variants(
    manifests: &Manifests,
    task: &HarnessTask,
    only: Option<&str>,
) -> Result<Vec<ResolvedVariant>, RunError> {
    let task_name = task.metadata.name.clone().unwrap_or_default();
    let variants = task.spec.effective_variants();
    let chosen: Vec<_> = variants.iter().filter(|v| only.is_none_or(|name| v.name == name)).collect();
    if chosen.is_empty() {
        let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
        return Err(RunError::Selection(format!(
            "task {task_name} has no variant {:?}; it has: {}",
            only.unwrap_or_default(),
            names.join(", ")
        )));
    }
    chosen
        .into_iter()
        .map(|variant| {
            // In the task's namespace, as the operator resolves `sandboxRef`.
            let sandbox = manifests
                .referenced_sandbox(task.metadata.namespace.as_deref(), &variant.sandbox_ref.name)
                .map_err(|e| RunError::Selection(format!("variant {}: {e}", variant.name)))?;
            let resolved = resolve_profile(&sandbox.object.spec, variant.sandbox_ref.profile.as_deref())
                .map_err(|e| RunError::Selection(e.to_string()))?;
            Ok(ResolvedVariant {
                name: variant.name.clone(),
                sandbox_name: variant.sandbox_ref.name.clone(),
                sandbox: resolved,
            })
        })
        .collect()
}

/// Creates the directory traces (and the services' logs) go to, first: a
/// path that cannot be one (a file, say) is named as the output directory,
/// not reported later as a service that cannot start.
pub(crate) fn create_out_dir(dir: &Path) -> Result<(), RunError> {
    std::fs::create_dir_all(dir).map_err(|source| RunError::OutDir { dir: dir.to_path_buf(), source })
}

pub async fn run(request: &RunRequest) -> Result<RunOutcome, RunError> {
    let base_dir_flag = request.base_dir.as_deref().map(absolute_dir).transpose()?;
    let (manifests, mut warnings) = load_manifests_in(&request.manifests, base_dir_flag.as_deref())?;
    let loaded = select_task(&manifests, request.task.as_deref())?;
    let task = &loaded.object;
    let task_name = task.metadata.name.clone().unwrap_or_default();
    // The name traces, summary and upload partition carry: the task, or the checkpoint's run.
    let run_name = match request.checkpoint_step {
        Some(step) => basecamp_api::task::checkpoint_run_name(&task_name, step),
        None => task_name.clone(),
    };
    let namespace = run_namespace(&manifests, task)?;
    let base_dir = base_dir_flag.unwrap_or_else(|| loaded.base_dir());
    let variant = resolve_variants(&manifests, task, request.variant.as_deref())?.remove(0);

    if let Some(warning) = check_gpu(&variant.sandbox, &basecamp_gpu::probe::probe_gpus())? {
        warnings.push(warning);
    }

    let test_set = load_test_set(&task.spec.evaluation.test_set, &base_dir).await?;
    let rows = test_set.shard(request.shard, request.shard_count).map_err(|e| RunError::Selection(e.to_string()))?;
    let inputs = episode_inputs(rows, &task.spec.evaluation.compare_args, &task.spec.evaluation.test_set)?;

    let out_dir = request.out_dir.clone().unwrap_or_else(|| {
        Path::new("basecamp-runs").join(&run_name).join(&variant.name).join(format!("shard-{}", request.shard))
    });
    create_out_dir(&out_dir)?;
    // In a cluster the operator requires `policy.scripted` on S3 (pods have
    // no local copy): fetch it next to the shard's output, outside what is uploaded.
    let mut spec = task.spec.clone();
    if let Some(location) = spec.policy.scripted.clone().filter(|s| s.starts_with("s3://")) {
        spec.policy.scripted = Some(fetch_scripted_policy(&location, &out_dir).await?.display().to_string());
    }
    // Before any service starts (as `basecamp run` does): a policy refused
    // then has started nothing and written no service's log.
    let policy = build_policy(&spec, &variant.sandbox, &base_dir)?;
    let mut services =
        RunningServices::start(&variant.sandbox.services, &base_dir, &out_dir.join("services"), &request.stop)?;
    let sandbox = services.expand(&variant.sandbox)?;

    let ctx = RunContext {
        base_dir: base_dir.clone(),
        namespace: namespace.clone(),
        task: run_name.clone(),
        variant: variant.name.clone(),
        shard: request.shard,
        shard_count: request.shard_count,
        training_step: request.checkpoint_step.unwrap_or(0),
    };
    let mut runner = build_runner_with_policy(&spec, &sandbox, &ctx, policy)?;
    runner.executor.watch_services(services.watch(&variant.sandbox));
    let metrics = Arc::new(SandboxMetrics::new());
    metrics.declare_tools(sandbox.tools.keys().map(String::as_str));
    metrics.declare_policy_errors(runner.policy.turn_error_categories());
    runner.metrics = Some(metrics.clone());
    let live = LiveInjections::default();
    // Live injection for an id this shard does not run is a 404, not a silent no-op.
    live.expect_episodes(inputs.iter().map(|i| i.id.clone()));
    // An id in a trace names one injection: a live one may not take a scheduled one's.
    live.reserve_scheduled(&runner.injections);
    runner.live = live.clone();
    let runner = Arc::new(runner);

    let server = match request.listen {
        Some(addr) => {
            let listener =
                tokio::net::TcpListener::bind(addr).await.map_err(|source| RunError::Listen { addr, source })?;
            let server = RunningServer::start(listener, ServerState::new(metrics.clone(), live))?;
            // With port 0 this line is the only way to learn the port.
            crate::stderr_line!("serving /metrics, /healthz and live injection on http://{}", server.addr());
            Some(server)
        }
        None => None,
    };
    // A stop while waiting goes straight to the summary: every episode not started.
    let first_scrape = wait_for_first_scrape(server.as_ref(), request.first_scrape_wait, &request.stop);
    tokio::select! {
        (ready, ()) = async { tokio::join!(crate::readiness::wait_for_policy_server(&spec.policy), first_scrape) } => { ready?; }
        _ = request.stop.cancelled() => {}
    }

    let metrics_for_episodes = metrics.clone();
    let mut summary = run_shard(runner, inputs, &out_dir, request.concurrency, request.stop.clone(), move |result| {
        metrics_for_episodes.observe_episode(result)
    })
    .await?;
    // Before they are stopped: a service gone now died while the episodes used
    // it, and their calls to it failed as `service_exited` errors from then on.
    let service_exits = services.exited();
    drop(services);
    if !service_exits.is_empty() {
        warnings.extend(service_exits.iter().map(|exit| format!("warning: {exit}")));
        // In the summary too (uploaded with the service's log), not only on the pod's stderr.
        summary.service_exits = service_exits;
        crate::driver::write_summary(&summary, &out_dir)?;
    }

    let upload_to = task.spec.traces.as_ref().and_then(|t| t.destination.clone()).filter(|_| request.upload);
    let upload = match upload_to.as_deref() {
        Some(dest) => {
            let logs = variant.sandbox.services.keys().map(|name| format!("services/{name}.log")).collect();
            Some(upload_shard(&summary, &out_dir, dest, logs).await?)
        }
        None => None,
    };
    // Every episode and the upload are recorded: a scrape from now on sees it all.
    metrics.scrapes().mark_final();
    Ok(RunOutcome { summary, out_dir, upload, upload_to, warnings, server })
}

/// [`RunRequest::first_scrape_wait`]: a pod's every count reaches `rate()`
/// only if Prometheus saw its series at zero before them.
async fn wait_for_first_scrape(server: Option<&RunningServer>, limit: Duration, stop: &StopSignal) {
    let Some(server) = server.filter(|_| !limit.is_zero()) else { return };
    let shown = basecamp_api::Duration::from(limit);
    let line = match server.first_scrape(limit, stop.cancelled()).await {
        LingerEnd::Scraped(after) if after < Duration::from_millis(100) => return,
        LingerEnd::Scraped(after) => format!("first scrape of /metrics served after {:.1}s", after.as_secs_f64()),
        LingerEnd::Elapsed => format!(
            "no scrape of http://{}/metrics within {shown} (--metrics-linger); starting anyway: counts before the first scrape may not show in rate()",
            server.addr()
        ),
        LingerEnd::Stopped | LingerEnd::ServerDown => return,
    };
    crate::stderr_line!("{line}");
}

/// The sandbox's GPU requirement against what this machine has: an error
/// when a required GPU is missing or too old, a warning when the sandbox
/// falls back to the CPU.
pub fn check_gpu(
    sandbox: &basecamp_api::SandboxConfigSpec,
    probe: &basecamp_gpu::probe::GpuProbe,
) -> Result<Option<String>, RunError> {
    use basecamp_gpu::requirement::{GpuDecision, check_gpu_requirement};
    let Some(gpu) = &sandbox.gpu else { return Ok(None) };
    let min_cc =
        gpu.min_compute_capability().map_err(|e| RunError::Selection(e.to_string()))?.map(|cc| (cc.major, cc.minor));
    match check_gpu_requirement(probe, gpu.required, min_cc) {
        GpuDecision::Gpu(_) => Ok(None),
        GpuDecision::Cpu { warning } => Ok(warning),
        GpuDecision::Refuse(e) => Err(e.into()),
    }
}

/// `--base-dir`'s directory as an absolute path (relative: against the
/// working directory), or why it cannot be one.
pub fn absolute_dir(dir: &Path) -> Result<PathBuf, RunError> {
    let refused = |why: String| RunError::Selection(format!("--base-dir {}: {why}", dir.display()));
    let absolute = std::path::absolute(dir).map_err(|e| refused(e.to_string()))?;
    match std::fs::metadata(&absolute) {
        Ok(meta) if meta.is_dir() => Ok(absolute),
        Ok(_) => Err(refused("not a directory".into())),
        Err(e) => Err(refused(e.to_string())),
    }
}

/// The test set at `location`: a path relative to `base_dir`, or `s3://`.
pub async fn load_test_set(location: &str, base_dir: &Path) -> Result<TestSet, RunError> {
    let err = |message: String| RunError::TestSet { location: location.to_string(), message, transient: false };
    if location.starts_with("s3://") {
        let destination = Destination::parse(location).map_err(|e| err(e.to_string()))?;
        let storage = Storage::new(StorageConfig::from_env());
        let bytes = storage.fetch(&destination).await.map_err(|e| RunError::TestSet {
            location: location.to_string(),
            message: e.to_string(),
            transient: e.is_retryable(),
        })?;
        return TestSet::parse_bytes(location, &bytes).map_err(|e| err(e.to_string()));
    }
    let path = if Path::new(location).is_absolute() { PathBuf::from(location) } else { base_dir.join(location) };
    TestSet::load(&path).map_err(|e| err(e.to_string()))
}

/// Downloads an `s3://` scripted policy to `<out_dir>.policy.jsonl` (beside
/// the output directory, so it is not uploaded with the traces).
async fn fetch_scripted_policy(location: &str, out_dir: &Path) -> Result<PathBuf, RunError> {
    let err = |message: String| RunError::ScriptedPolicy { location: location.to_string(), message, transient: false };
    let destination = Destination::parse(location).map_err(|e| err(e.to_string()))?;
    let bytes = Storage::new(StorageConfig::from_env()).fetch(&destination).await.map_err(|e| {
        RunError::ScriptedPolicy { location: location.to_string(), message: e.to_string(), transient: e.is_retryable() }
    })?;
    let mut name = out_dir.file_name().unwrap_or_default().to_os_string();
    name.push(".policy.jsonl");
    let path = out_dir.with_file_name(name);
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| err(format!("cannot create {}: {e}", parent.display())))?;
    }
    std::fs::write(&path, bytes).map_err(|e| err(format!("cannot write {}: {e}", path.display())))?;
    Ok(std::path::absolute(&path).unwrap_or(path))
}

/// The rows as the runner needs them ([`episode_input`]); a row the runner
/// cannot use is the test set's error, named by its row.
pub fn episode_inputs(
    rows: &[basecamp_api::testset::Episode],
    compare_args: &std::collections::BTreeMap<String, Vec<String>>,
    test_set: &str,
) -> Result<Vec<crate::episode::EpisodeInput>, RunError> {
    rows.iter()
        .map(|row| {
            episode_input(row, compare_args).map_err(|message| RunError::TestSet {
                location: test_set.to_string(),
                message: format!("row {:?}: {message}", row.id),
                transient: false,
            })
        })
        .collect()
}

/// Uploads a shard's output directory again, as [`run`] does after its
/// episodes: the files its `summary.json` lists (traces, rollback traces,
/// the summary last) and the services' logs, under the partition of the
/// day the shard started, so a second try lands where the first would have.
/// For a shard whose upload failed (exit 3 keeps the local copies).
pub async fn upload_again(out_dir: &Path, destination: &str) -> Result<UploadReport, RunError> {
    let summary_path = out_dir.join(SUMMARY_FILE);
    let text = std::fs::read(&summary_path).map_err(|e| {
        RunError::Selection(format!(
            "cannot read {}: {e}; give the output directory of a `basecamp-sandbox run`",
            summary_path.display()
        ))
    })?;
    let summary: ShardSummary = serde_json::from_slice(&text)
        .map_err(|e| RunError::Selection(format!("{} is not a shard summary: {e}", summary_path.display())))?;
    // The services' logs the directory holds (the manifests are not read here).
    let mut logs: Vec<String> = std::fs::read_dir(out_dir.join("services"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.ends_with(".log"))
        .map(|name| format!("services/{name}"))
        .collect();
    logs.sort();
    upload_shard(&summary, out_dir, destination, logs).await
}

/// Uploads a shard's files to `destination` under its partition: those its
/// summary lists (this run's only: `--out` may hold an earlier run's traces,
/// which the summary does not count) and `service_logs`, the summary last.
async fn upload_shard(
    summary: &ShardSummary,
    out_dir: &Path,
    destination: &str,
    service_logs: Vec<String>,
) -> Result<UploadReport, RunError> {
    let destination = Destination::parse(destination).map_err(|e| RunError::Selection(e.to_string()))?;
    let partition = shard_partition(summary).map_err(|e| RunError::Selection(e.to_string()))?;
    let mut files = summary.files_written();
    files.extend(service_logs);
    let storage = Storage::new(StorageConfig::from_env());
    Ok(upload_summary_last(&storage, out_dir, files, &destination.for_shard(&partition)).await)
}

/// Where a shard's files go under the destination: the day it started
/// (UTC), its namespace, run name (the task, or `<task>@step-N`), variant
/// and shard, all as its summary says.
fn shard_partition(summary: &ShardSummary) -> Result<ShardPartition, crate::storage::StorageError> {
    let since_epoch = Duration::from_nanos(u64::try_from(summary.started_unix_nanos).unwrap_or_default());
    let date = UtcDate::from_system_time(std::time::UNIX_EPOCH + since_epoch)?;
    ShardPartition::new(date, &summary.namespace, &summary.task, &summary.variant, summary.shard)
}

/// Uploads the shard's files, `summary.json` last and only when every
/// other one went up: a summary on S3 says its traces are there (the
/// operator aggregates from it, `serve` lists its episodes), so one whose
/// traces failed stays local, reported as not uploaded, like them.
async fn upload_summary_last(
    storage: &Storage,
    out_dir: &Path,
    files: Vec<String>,
    to: &crate::storage::Destination,
) -> crate::storage::UploadReport {
    let (summary, others): (Vec<String>, Vec<String>) = files.into_iter().partition(|f| f == SUMMARY_FILE);
    let mut report = storage.upload_files(out_dir, &others, to).await;
    if summary.is_empty() {
        return report;
    }
    if report.is_complete() {
        let last = storage.upload_files(out_dir, &summary, to).await;
        report.files.extend(last.files);
    } else {
        let failed = report.files.iter().filter(|f| !f.is_uploaded()).count();
        let local = out_dir.join(SUMMARY_FILE);
        let target = to.join(SUMMARY_FILE).unwrap_or_else(|_| to.clone());
        let bytes = std::fs::metadata(&local).map(|m| m.len()).unwrap_or(0);
        report.files.push(crate::storage::FileUpload::not_attempted(
            local,
            target,
            bytes,
            format!(
                "not uploaded: {failed} of the shard's other files failed, and the summary goes up only with all of them"
            ),
        ));
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use basecamp_api::GpuRequirement;
    use basecamp_gpu::probe::{GpuDevice, GpuProbe};

    fn sandbox(required: bool, min_cc: &str) -> basecamp_api::SandboxConfigSpec {
        basecamp_api::SandboxConfigSpec {
            gpu: Some(GpuRequirement {
                required,
                min_compute_capability: Some(min_cc.into()),
                count: Some(1),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn v100() -> GpuProbe {
        GpuProbe::Devices(vec![GpuDevice {
            ordinal: 0,
            name: "Tesla V100".into(),
            compute_capability: (7, 0),
            total_memory_bytes: 16 << 30,
        }])
    }

    #[test]
    fn a_required_gpu_below_the_minimum_refuses_with_the_documented_words() {
        let err = check_gpu(&sandbox(true, "8.0"), &v100()).unwrap_err();
        assert_eq!(err.to_string(), "GPU arch not supported for sandbox acceleration: found 7.0, need >= 8.0");
        assert_eq!(err.category(), "GpuArchNotSupported");
    }

    #[test]
    fn an_optional_gpu_falls_back_to_the_cpu_with_a_warning() {
        let warning = check_gpu(&sandbox(false, "8.0"), &v100()).unwrap();
        assert!(warning.is_some_and(|w| w.contains("7.0")), "the warning names what was found");
        assert_eq!(check_gpu(&sandbox(true, "7.0"), &v100()).unwrap(), None);
        assert!(check_gpu(&sandbox(true, "8.0"), &GpuProbe::NoDriver).is_err());
        assert_eq!(check_gpu(&basecamp_api::SandboxConfigSpec::default(), &GpuProbe::NoDriver).unwrap(), None);
    }
}
