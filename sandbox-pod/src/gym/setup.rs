//! `basecamp-sandbox serve`: from manifests to a [`GymConfig`].
//!
//! The same steps as driver mode's `run` (and its functions): load and
//! validate the manifests -> pick the task and variant -> resolve the
//! SandboxConfig and profile -> check the GPU -> load the whole test set ->
//! build the policy -> start the helper services -> build the runner ->
//! wait for the policy server. The trainer is the policy here, so the
//! task's policy is never called: its API key is not loaded (a trainer
//! needs no credentials of the model under test). A `policy.server`
//! sidecar is still waited for, as in driver mode, so the API is served
//! only once the pod's model is loaded (a trainer may query it) and a
//! server that never starts fails the pod.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::GymConfig;
use crate::config::{RunContext, build_policy, build_runner_with_policy};
use crate::driver::StopSignal;
use crate::run::{
    RunError, absolute_dir, check_gpu, create_out_dir, episode_inputs, load_manifests_in, load_test_set,
    resolve_variants, run_namespace, select_task,
};
use crate::services::RunningServices;

/// What to serve.
#[derive(Debug, Clone)]
pub struct ServeRequest {
    pub manifests: Vec<PathBuf>,
    /// The HarnessTask's name; needed only when the manifests hold several.
    pub task: Option<String>,
    /// The variant; the first when absent.
    pub variant: Option<String>,
    /// Where traces go (default: `basecamp-runs/<task>/<variant>/serve`).
    pub out_dir: Option<PathBuf>,
    /// What relative paths in the manifests resolve against (`None`: each
    /// manifest's directory), as [`crate::run::RunRequest::base_dir`].
    pub base_dir: Option<PathBuf>,
    pub max_episodes: usize,
    pub idle_timeout: Duration,
    /// Fired by SIGTERM or Ctrl-C: ends the wait for the services at once.
    pub stop: StopSignal,
}

/// What [`load`] prepared: the config, the helper services the tools talk
/// to (running until dropped: keep them for as long as the server serves),
/// and the warnings found on the way.
#[derive(Debug)]
pub struct Prepared {
    pub config: GymConfig,
    pub services: RunningServices,
    pub warnings: Vec<String>,
}

/// Loads the manifests and prepares everything a [`super::Gym`] needs.
pub async fn load(request: &ServeRequest) -> Result<Prepared, RunError> {
    let base_dir_flag = request.base_dir.as_deref().map(absolute_dir).transpose()?;
    let (manifests, mut warnings) = load_manifests_in(&request.manifests, base_dir_flag.as_deref())?;
    let loaded = select_task(&manifests, request.task.as_deref())?;
    let task = &loaded.object;
    let task_name = task.metadata.name.clone().unwrap_or_default();
    let base_dir = base_dir_flag.unwrap_or_else(|| loaded.base_dir());
    let variant = resolve_variants(&manifests, task, request.variant.as_deref())?.remove(0);
    if let Some(warning) = check_gpu(&variant.sandbox, &basecamp_gpu::probe::probe_gpus())? {
        warnings.push(warning);
    }
    let test_set = load_test_set(&task.spec.evaluation.test_set, &base_dir).await?;
    let compare_args = task.spec.evaluation.compare_args.clone();
    let rows = episode_inputs(&test_set.episodes, &compare_args, &task.spec.evaluation.test_set)?;
    let out_dir = request
        .out_dir
        .clone()
        .unwrap_or_else(|| Path::new("basecamp-runs").join(&task_name).join(&variant.name).join("serve"));
    create_out_dir(&out_dir)?;
    let mut spec = task.spec.clone();
    spec.policy.api_key_env = None;
    spec.policy.api_key_file = None;
    spec.policy.api_key_secret = None;
    // Before any service starts, as in driver mode: a policy refused then
    // has started nothing and written no service's log.
    let policy = build_policy(&spec, &variant.sandbox, &base_dir)?;
    let services =
        RunningServices::start(&variant.sandbox.services, &base_dir, &out_dir.join("services"), &request.stop)?;
    let sandbox = services.expand(&variant.sandbox)?;
    let ctx = RunContext {
        base_dir,
        namespace: run_namespace(&manifests, task)?,
        task: task_name,
        variant: variant.name.clone(),
        shard: 0,
        shard_count: 1,
        training_step: 0,
    };
    let mut runner = build_runner_with_policy(&spec, &sandbox, &ctx, policy)?;
    runner.executor.watch_services(services.watch(&variant.sandbox));
    // A stop while waiting: the caller sees it and serves nothing.
    tokio::select! {
        ready = crate::readiness::wait_for_policy_server(&spec.policy) => { ready?; }
        _ = request.stop.cancelled() => {}
    }
    let config = GymConfig {
        runner,
        rows,
        test_set_name: test_set.name.clone(),
        compare_args,
        out_dir,
        max_episodes: request.max_episodes,
        idle_timeout: request.idle_timeout,
        keep_closed: request.idle_timeout,
    };
    Ok(Prepared { config, services, warnings })
}
