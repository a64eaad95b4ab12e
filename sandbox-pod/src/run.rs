//! `basecamp-sandbox run`: from manifests to a finished shard.
//!
//! load and validate the manifests (the same checks as the operator and
//! `basecamp harness validate`) -> resolve the variant's SandboxConfig and
//! profile -> load the test set (local or `s3://`) and take this shard ->
//! build the runner -> run the episodes (optionally serving `/metrics` and
//! live injection) -> write `summary.json` -> upload to the task's trace
//! destination, keeping the local copy and reporting any file that failed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use basecamp_api::{Manifests, Report, TestSet, resolve_profile};

use crate::config::{RunContext, build_runner, episode_input};
use crate::driver::{ShardSummary, run_shard};
use crate::episode::LiveInjections;
use crate::metrics::SandboxMetrics;
use crate::server::{ServerState, serve};
use crate::storage::{Destination, ShardPartition, Storage, StorageConfig, UploadReport, UtcDate};

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
    pub concurrency: usize,
    /// Serve `/metrics`, `/healthz` and live injection here while running.
    pub listen: Option<std::net::SocketAddr>,
    /// Upload to the task's `traces.destination` when it names one.
    pub upload: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the manifests have problems:\n{0}")]
    Invalid(String),
    #[error("{0}")]
    Selection(String),
    #[error("test set {location}: {message}")]
    TestSet { location: String, message: String },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Gpu(#[from] basecamp_gpu::requirement::GpuRequirementError),
    #[error("cannot run the shard: {0}")]
    Io(#[from] std::io::Error),
}

impl RunError {
    pub fn category(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "InvalidSpec",
            Self::Selection(_) => "NoSuchTaskOrVariant",
            Self::TestSet { .. } => "TestSetUnavailable",
            Self::Config(e) => e.category(),
            Self::Gpu(e) => e.category(),
            Self::Io(_) => "TraceIo",
        }
    }
}

/// How a shard went.
#[derive(Debug)]
pub struct RunOutcome {
    pub summary: ShardSummary,
    pub out_dir: PathBuf,
    pub upload: Option<UploadReport>,
    pub warnings: Vec<String>,
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

pub async fn run(request: &RunRequest) -> Result<RunOutcome, RunError> {
    let (manifests, load_report) = Manifests::load(&request.manifests);
    let mut report = load_report;
    report.extend(manifests.validate());
    if report.has_errors() {
        return Err(RunError::Invalid(problems(&report, true)));
    }
    let mut warnings: Vec<String> = report.warnings().map(|p| p.to_string()).collect();

    let loaded = match &request.task {
        Some(name) => manifests.tasks.iter().find(|t| t.object.metadata.name.as_deref() == Some(name.as_str())),
        None if manifests.tasks.len() == 1 => manifests.tasks.first(),
        None => None,
    }
    .ok_or_else(|| {
        let names: Vec<&str> = manifests.tasks.iter().filter_map(|t| t.object.metadata.name.as_deref()).collect();
        RunError::Selection(format!(
            "choose a HarnessTask with --task; the manifests hold: {}",
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        ))
    })?;
    let task = &loaded.object;
    let task_name = task.metadata.name.clone().unwrap_or_default();
    let namespace = task.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let base_dir = loaded.base_dir();
    let variants = task.spec.effective_variants();
    let variant = match &request.variant {
        Some(name) => variants.iter().find(|v| v.name == *name),
        None => variants.first(),
    }
    .ok_or_else(|| {
        let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
        RunError::Selection(format!(
            "task {task_name} has no variant {:?}; it has: {}",
            request.variant,
            names.join(", ")
        ))
    })?;
    let sandbox = manifests.sandbox(&variant.sandbox_ref.name).ok_or_else(|| {
        RunError::Selection(format!(
            "SandboxConfig {} (variant {}) is not in the manifests",
            variant.sandbox_ref.name, variant.name
        ))
    })?;
    let resolved = resolve_profile(&sandbox.object.spec, variant.sandbox_ref.profile.as_deref())
        .map_err(|e| RunError::Selection(e.to_string()))?;

    if let Some(warning) = check_gpu(&resolved, &basecamp_gpu::probe::probe_gpus())? {
        warnings.push(warning);
    }

    let test_set = load_test_set(&task.spec.evaluation.test_set, &base_dir).await?;
    let rows = test_set.shard(request.shard, request.shard_count).map_err(|e| RunError::Selection(e.to_string()))?;
    let inputs = rows.iter().map(|row| episode_input(row, &task.spec.evaluation.compare_args)).collect();

    let ctx = RunContext {
        base_dir: base_dir.clone(),
        namespace: namespace.clone(),
        task: task_name.clone(),
        variant: variant.name.clone(),
        shard: request.shard,
        shard_count: request.shard_count,
        training_step: 0,
    };
    let mut runner = build_runner(&task.spec, &resolved, &ctx)?;
    let metrics = Arc::new(SandboxMetrics::new());
    runner.metrics = Some(metrics.clone());
    let live = LiveInjections::default();
    runner.live = live.clone();
    let runner = Arc::new(runner);

    let out_dir = request.out_dir.clone().unwrap_or_else(|| {
        Path::new("basecamp-runs").join(&task_name).join(&variant.name).join(format!("shard-{}", request.shard))
    });
    let (stop_server, server) = match request.listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let state = ServerState::new(metrics.clone(), live);
            let handle = tokio::spawn(serve(listener, state, async move {
                let _ = rx.await;
            }));
            (Some(tx), Some(handle))
        }
        None => (None, None),
    };
    let started = SystemTime::now();
    let metrics_for_episodes = metrics.clone();
    let summary = run_shard(runner, inputs, &out_dir, request.concurrency, move |result| {
        metrics_for_episodes.observe_episode(result)
    })
    .await?;
    if let (Some(tx), Some(handle)) = (stop_server, server) {
        let _ = tx.send(());
        let _ = handle.await;
    }

    let upload = match task.spec.traces.as_ref().and_then(|t| t.destination.as_deref()) {
        Some(dest) if request.upload => {
            let destination = Destination::parse(dest).map_err(|e| RunError::Selection(e.to_string()))?;
            let date = UtcDate::from_system_time(started).map_err(|e| RunError::Selection(e.to_string()))?;
            let partition = ShardPartition::new(date, &namespace, &task_name, &variant.name, request.shard)
                .map_err(|e| RunError::Selection(e.to_string()))?;
            let storage = Storage::new(StorageConfig::from_env());
            Some(storage.upload_dir(&out_dir, &destination.for_shard(&partition)).await)
        }
        _ => None,
    };
    Ok(RunOutcome { summary, out_dir, upload, warnings })
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

async fn load_test_set(location: &str, base_dir: &Path) -> Result<TestSet, RunError> {
    let err = |message: String| RunError::TestSet { location: location.to_string(), message };
    if location.starts_with("s3://") {
        let destination = Destination::parse(location).map_err(|e| err(e.to_string()))?;
        let storage = Storage::new(StorageConfig::from_env());
        let bytes = storage.fetch(&destination).await.map_err(|e| err(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|_| err("is not UTF-8 text".into()))?;
        return TestSet::parse(location, &text).map_err(|e| err(e.to_string()));
    }
    let path = if Path::new(location).is_absolute() { PathBuf::from(location) } else { base_dir.join(location) };
    TestSet::load(&path).map_err(|e| err(e.to_string()))
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
