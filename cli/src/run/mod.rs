//! `basecamp run PATH`: a HarnessTask run on this machine, no cluster.
//!
//! load and validate the manifests (the same checks as the operator) ->
//! resolve every variant's SandboxConfig -> load the test set -> check each
//! variant's GPU, build its policy (a scripted policy's file is read) and
//! read the episodes, all before anything is written -> create the run
//! directory -> per variant, start its services and build its runner (a run
//! refused here removes the directories it created, unless a service's log
//! that the error names is in them) -> wait for the policy server
//! (`spec.policy.server`, when it names one) -> run every shard of every variant at once
//! (the driver the sandbox pod runs) with a progress bar -> summarise:
//! aggregates, success criteria, A/B deltas and root-cause hints read back
//! from the traces -> `run.json` and `report.html` in the run directory.
//!
//! A run into a directory that holds an earlier run of the same variants
//! replaces it: the earlier shards' traces and summaries are removed once
//! everything is set up, just before the first episode. A directory holding
//! a run of another task is refused before anything starts.
//!
//! Ctrl-C (or SIGTERM: `timeout`, a CI job cancelled) stops starting
//! episodes and cuts off the running ones; their traces stay readable, every
//! shard still writes its `summary.json`, the services are stopped, and the
//! summary table shows what finished.
//!
//! A shard that cannot write its traces or summary stops no other shard:
//! the run is summarised from the shards that finished, each failure is
//! named in the table, `run.json` (`failed_shards`) and on stderr, and the
//! exit status is 2, as for a lost episode's trace.
//!
//! A service that exits while the run uses it (not stopped by the run) is
//! named on stderr as soon as it is seen, with its exit status and log, and
//! then in the table, `run.json` (`service_exits`) and the report; the tool
//! calls to it fail from then on as `service_exited` errors naming it (not
//! the agent's failures), and the exit status is 3 (unless the variant's
//! criteria tolerate it, as below).
//!
//! Episodes that the policy's server or a service failed (`policy_error`,
//! `service_exited`) measured the infrastructure, not the agent: the table,
//! `run.json` (`not_measured`) and the report count them apart, the metrics
//! and criteria are over the other episodes, and the exit status is 3 —
//! unless a success criterion names `not_measured_episodes` or
//! `not_measured_rate` (e.g. `not_measured_rate <= 1%`): those criteria
//! are then the variant's tolerance, and only beyond it is the status 3.

pub(crate) mod analysis;
mod created_dirs;
mod report;
pub mod summary;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use basecamp_sandbox::config::{RunContext, build_policy, build_runner_with_policy};
use basecamp_sandbox::driver::{ShardSummary, StopSignal, run_shard};
use basecamp_sandbox::run::{
    check_gpu, episode_inputs, load_manifests, load_test_set, resolve_variants, run_namespace, select_task,
};
use basecamp_sandbox::services::RunningServices;
use created_dirs::CreatedDirs;
use indicatif::{ProgressBar, ProgressStyle};

pub use summary::RunSummary;

/// Run a HarnessTask locally: every variant and shard on this machine.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Manifest files or directories holding the HarnessTask and its SandboxConfig(s).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The HarnessTask to run, when the manifests hold several (NAME, or NAMESPACE/NAME when two namespaces have one of that name).
    #[arg(long)]
    pub task: Option<String>,
    /// Run only this variant (default: all of them).
    #[arg(long)]
    pub variant: Option<String>,
    /// Where traces, summaries and the report go (default: ./basecamp-runs/<task>/).
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Shards per variant, at least 1 (default: the task's `shards`).
    #[arg(long, value_parser = crate::at_least_one::<u32>)]
    pub shards: Option<u32>,
    /// Episodes at once in each shard (at least 1).
    #[arg(long, default_value_t = 8, value_parser = crate::at_least_one::<usize>)]
    pub concurrency: usize,
    /// Exit with status 1 when a variant misses a success criterion.
    #[arg(long)]
    pub fail_on_criteria: bool,
    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,
}

/// Exit statuses beyond 0 and 1: a trace not written (a lost episode's, a
/// failed shard's); episodes not measured (a service exited during the run,
/// the policy failed: they measure the broken infrastructure, not the
/// agent) beyond what the criteria tolerate; stopped by a signal.
const EXIT_TRACES_NOT_WRITTEN: u8 = 2;
const EXIT_NOT_MEASURED: u8 = 3;
const EXIT_INTERRUPTED: u8 = 130;

pub fn run(args: RunArgs) -> Result<ExitCode> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    let stop = StopSignal::new();
    let on_ctrl_c = stop.clone();
    // SIGTERM's default would end the process on the spot: no summaries,
    // and the services (in process groups of their own) left running.
    let signalled = {
        let _context = runtime.enter();
        basecamp_sandbox::driver::which_stop_signal()
    };
    runtime.spawn(async move {
        let signal = signalled.await;
        basecamp_sandbox::stderr_line!(
            "\nstopping on {signal}: no new episodes; traces so far stay readable (Ctrl-C or SIGTERM again quits at once)"
        );
        on_ctrl_c.cancel();
        basecamp_sandbox::driver::which_stop_signal().await;
        // Exiting skips the destructors that stop the services.
        basecamp_sandbox::services::kill_all_now();
        std::process::exit(i32::from(EXIT_INTERRUPTED));
    });
    let summary = runtime.block_on(run_task(&args, stop))?;
    write!(std::io::stdout(), "{}", summary.table())?;
    writeln!(std::io::stdout(), "\ntraces, summaries and report: {}", summary.out_dir.display())?;
    writeln!(std::io::stdout(), "report: {}", summary.out_dir.join(report::REPORT_FILE).display())?;
    for failed in &summary.failed_shards {
        basecamp_sandbox::stderr_line!(
            "error: variant {}, shard {}: {} (its episodes are missing from run.json and the report)",
            failed.variant,
            failed.shard,
            failed.error
        );
    }
    // A service's exit was said on stderr when it was seen; what it and
    // the policy's failures cost is said here.
    for v in summary.variants.iter().filter(|v| !v.kept_from_earlier_run) {
        if let Some(said) = v.not_measured_sentence() {
            let level = if v.not_measured_tolerated() { "warning" } else { "error" };
            basecamp_sandbox::stderr_line!("{level}: variant {}: {said}", v.name);
        }
    }
    Ok(if summary.stopped_early {
        ExitCode::from(EXIT_INTERRUPTED)
    } else if summary.lost_episodes() > 0 || !summary.failed_shards.is_empty() {
        ExitCode::from(EXIT_TRACES_NOT_WRITTEN)
    } else if summary.infrastructure_failed() {
        ExitCode::from(EXIT_NOT_MEASURED)
    } else if args.fail_on_criteria && !summary.criteria_met() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One shard of one variant, ready to run.
struct ShardJob {
    variant: usize,
    shard: u32,
    out_dir: PathBuf,
    runner: Arc<basecamp_sandbox::episode::EpisodeRunner>,
    inputs: Vec<basecamp_sandbox::episode::EpisodeInput>,
}

/// What every variant's setup shares.
struct VariantSetup<'a> {
    task: &'a basecamp_api::HarnessTaskSpec,
    task_name: &'a str,
    namespace: &'a str,
    base_dir: &'a Path,
}

impl VariantSetup<'_> {
    /// Starts each variant's services (their logs under its directory,
    /// noted in `created` when new) and builds its runner, with the policy
    /// built for it: the running services, and one job per shard.
    fn start(
        &self,
        variants: &[basecamp_sandbox::run::ResolvedVariant],
        policies: Vec<basecamp_sandbox::policy::Policy>,
        shard_inputs: &[Vec<basecamp_sandbox::episode::EpisodeInput>],
        out_root: &Path,
        created: &mut CreatedDirs,
        stop: &StopSignal,
    ) -> Result<(Vec<RunningServices>, Vec<ShardJob>)> {
        let shard_count = shard_inputs.len() as u32;
        let mut services = Vec::new();
        let mut jobs = Vec::new();
        for (v, (variant, policy)) in variants.iter().zip(policies).enumerate() {
            let variant_dir = out_root.join(&variant.name);
            let log_dir = variant_dir.join("services");
            created.note(&log_dir);
            let running = RunningServices::start(&variant.sandbox.services, self.base_dir, &log_dir, stop)
                .with_context(|| format!("variant {}", variant.name))?;
            let sandbox = running.expand(&variant.sandbox)?;
            let watch = running.watch(&variant.sandbox);
            services.push(running);
            // Built once per variant (a recorded fixture is read and parsed
            // once), then given to each shard with its own rate limits.
            let ctx = RunContext {
                base_dir: self.base_dir.to_path_buf(),
                namespace: self.namespace.to_string(),
                task: self.task_name.to_string(),
                variant: variant.name.clone(),
                shard: 0,
                shard_count,
                training_step: 0,
            };
            let mut first = build_runner_with_policy(self.task, &sandbox, &ctx, policy)
                .with_context(|| format!("variant {}", variant.name))?;
            first.executor.watch_services(watch);
            for (shard, inputs) in (0..shard_count).zip(shard_inputs) {
                jobs.push(ShardJob {
                    variant: v,
                    shard,
                    out_dir: variant_dir.join(format!("shard-{shard}")),
                    runner: Arc::new(first.for_shard(shard)),
                    inputs: inputs.clone(),
                });
            }
        }
        Ok((services, jobs))
    }
}

/// Whether `error` is a service's that names its log (it exited or never
/// got ready): the log explains it, so it stays.
fn names_a_service_log(error: &anyhow::Error) -> bool {
    use basecamp_sandbox::services::ServiceError;
    matches!(error.downcast_ref::<ServiceError>(), Some(ServiceError::Exited { .. } | ServiceError::NotReady { .. }))
}

/// Runs the task and writes `run.json` and `report.html`; the summary is
/// returned for the table (and for tests).
pub async fn run_task(args: &RunArgs, stop: StopSignal) -> Result<RunSummary> {
    let (manifests, warnings) = load_manifests(&args.paths).map_err(|e| anyhow::anyhow!("{e}"))?;
    for warning in &warnings {
        basecamp_sandbox::stderr_line!("{warning}");
    }
    let loaded = select_task(&manifests, args.task.as_deref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let task = &loaded.object;
    let task_name = task.metadata.name.clone().unwrap_or_default();
    let namespace = run_namespace(&manifests, task).map_err(|e| anyhow::anyhow!("{e}"))?;
    let base_dir = loaded.base_dir();
    let variants = resolve_variants(&manifests, task, args.variant.as_deref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let shard_count = args.shards.or(task.spec.shards).unwrap_or(1);
    if shard_count == 0 {
        // --shards is at least 1 by its parser; spec.shards by validation.
        bail!("spec.shards must be at least 1");
    }
    let out_root = args.out.clone().unwrap_or_else(|| Path::new("basecamp-runs").join(&task_name));
    check_no_other_task_in(&out_root, &task_name)?;
    check_fixed_ports_apart(&variants)?;

    let test_set =
        load_test_set(&task.spec.evaluation.test_set, &base_dir).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    check_shard_count(shard_count, args.shards.is_some(), test_set.episodes.len(), &task.spec.evaluation.test_set)?;
    // What can be refused without starting or writing anything is checked
    // first: a refused run leaves no directory behind (nor, in one that holds
    // an earlier run, services' logs in place of that run's).
    let probe = basecamp_gpu::probe::probe_gpus();
    let mut policies = Vec::new();
    for variant in &variants {
        if let Some(warning) = check_gpu(&variant.sandbox, &probe).map_err(|e| anyhow::anyhow!("{e}"))? {
            basecamp_sandbox::stderr_line!("warning: variant {}: {warning}", variant.name);
        }
        let policy = build_policy(&task.spec, &variant.sandbox, &base_dir)
            .with_context(|| format!("variant {}", variant.name))?;
        policies.push(policy);
    }
    let shard_inputs = (0..shard_count)
        .map(|shard| {
            let rows = test_set.shard(shard, shard_count).map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok(episode_inputs(rows, &task.spec.evaluation.compare_args, &task.spec.evaluation.test_set)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut created = CreatedDirs::create(&out_root)?;
    let setup = VariantSetup { task: &task.spec, task_name: &task_name, namespace: &namespace, base_dir: &base_dir };
    let (mut services, jobs) = match setup.start(&variants, policies, &shard_inputs, &out_root, &mut created, &stop) {
        Ok(started) => started,
        Err(error) => {
            // A service that did not get ready is explained by its log, which the error names.
            if !names_a_service_log(&error) {
                created.remove();
            }
            return Err(error);
        }
    };

    // Everything is set up: only now replace what an earlier run left in
    // these variants' directories, so its traces and shard summaries are not
    // read as part of this run (e.g. its shard-1 after a rerun with --shards 1).
    for variant in &variants {
        let removed = remove_previous_shards(&out_root.join(&variant.name))?;
        if removed > 0 {
            basecamp_sandbox::stderr_line!(
                "replacing an earlier run in {}: removed {removed} file(s) of its shards",
                out_root.join(&variant.name).display()
            );
        }
    }

    // Ctrl-C while waiting goes straight to the summaries: every episode not started.
    tokio::select! {
        ready = basecamp_sandbox::readiness::wait_for_policy_server(&task.spec.policy) => {
            // The error's advice is a pod's (its sidecar's logs): here nobody started the server.
            ready.map_err(|not_ready| anyhow::anyhow!(
                "{not_ready}\n`basecamp run` does not start the policy server (in a cluster the operator runs \
                 spec.policy.server as a sidecar of each pod): start it on this machine so that it answers at {}, \
                 or remove spec.policy.server to call spec.policy.endpoint without waiting",
                not_ready.url
            ))?;
        }
        _ = stop.cancelled() => {}
    }

    let total: usize = jobs.iter().map(|j| j.inputs.len()).sum();
    let progress = progress_bar(total as u64, args.no_progress);
    progress.set_message(format!("{task_name}: {} variant(s) x {shard_count} shard(s)", variants.len()));
    // The shards' lines (and this run's own) go above the bar.
    let bar = progress.clone();
    basecamp_sandbox::stderr::around_lines(Some(Box::new(move |write| bar.suspend(write))));
    let started = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    // Which shard each task runs: a task that panics returns nothing to say so.
    let mut shard_of_task = std::collections::HashMap::new();
    for job in jobs {
        let progress = progress.clone();
        let stop = stop.clone();
        let concurrency = args.concurrency;
        let out_dir = job.out_dir.clone();
        let episodes = job.inputs.len();
        let task = running.spawn(async move {
            run_shard(job.runner, job.inputs, &job.out_dir, concurrency, stop, |_| progress.inc(1)).await
        });
        shard_of_task.insert(task.id(), (job.variant, job.shard, episodes, out_dir));
    }
    // One shard failing stops none of the others (dropping the JoinSet
    // would abort them mid-episode): every shard is waited for, the run is
    // summarised from those that finished, and each failure is reported.
    let mut shards: Vec<Vec<ShardSummary>> = vec![Vec::new(); variants.len()];
    let mut failed_shards = Vec::new();
    // A service that exits is said on stderr when it happens, not at the
    // end of a long run: the calls to it fail from then on.
    let mut service_exits = Vec::new();
    let mut service_poll = tokio::time::interval(SERVICE_POLL);
    loop {
        let joined = tokio::select! {
            joined = running.join_next_with_id() => joined,
            _ = service_poll.tick() => {
                note_service_exits(&variants, &mut services, &mut service_exits);
                continue;
            }
        };
        let Some(joined) = joined else { break };
        let task = match &joined {
            Ok((id, _)) => *id,
            Err(failed) => failed.id(),
        };
        let (variant, shard, episodes, dir) =
            shard_of_task.remove(&task).expect("every shard task is recorded when spawned");
        let error = match joined {
            Ok((_, Ok(summary))) => {
                shards[variant].push(summary);
                continue;
            }
            Ok((_, Err(error))) => format!("cannot write the traces of {}: {error}", dir.display()),
            Err(failed) => format!("the task running {} failed: {failed}", dir.display()),
        };
        failed_shards.push(summary::FailedShard { variant: variants[variant].name.clone(), shard, episodes, error });
    }
    failed_shards.sort_by(|a, b| (&a.variant, a.shard).cmp(&(&b.variant, b.shard)));
    // Before they are stopped: a service gone now died during the run.
    note_service_exits(&variants, &mut services, &mut service_exits);
    progress.finish_and_clear();
    basecamp_sandbox::stderr::around_lines(None);
    drop(services);
    let wall_seconds = started.elapsed().as_secs_f64();

    let criteria = &task.spec.task_definition.success_criteria;
    let (variants, shards, kept) = if args.variant.is_some() {
        let all = resolve_variants(&manifests, task, None).map_err(|e| anyhow::anyhow!("{e}"))?;
        with_kept_variants(&out_root, all, variants, shards)
    } else {
        (variants, shards, Vec::new())
    };
    let mut summary = RunSummary::new(&task_name, &out_root, &variants, shards, failed_shards, criteria, wall_seconds);
    summary.mark_kept(&kept);
    summary.service_exits = service_exits;
    summary.manifests =
        args.paths.iter().map(|path| std::path::absolute(path).unwrap_or_else(|_| path.clone())).collect();
    summary.write(&out_root)?;
    report::write(&summary, &out_root)?;
    Ok(summary)
}

/// How often a run looks for services that exited.
const SERVICE_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Adds the services that exited since the last look to `exits`, each said
/// on stderr as a warning (above the progress bar, as every line of the run).
fn note_service_exits(
    variants: &[basecamp_sandbox::run::ResolvedVariant],
    services: &mut [RunningServices],
    exits: &mut Vec<summary::ServiceExited>,
) {
    for (variant, running) in variants.iter().zip(services) {
        for exit in running.exited() {
            basecamp_sandbox::stderr_line!("warning: variant {}: {exit}", variant.name);
            exits.push(summary::ServiceExited { variant: variant.name.clone(), exit });
        }
    }
}

/// Two variants whose services take the same fixed port cannot run side by
/// side on one machine (in a cluster each pod has its own): the second
/// would find the port taken. Said before anything starts, with the way
/// out: one variant at a time into the same directory, which keeps the
/// other's results.
fn check_fixed_ports_apart(variants: &[basecamp_sandbox::run::ResolvedVariant]) -> Result<()> {
    let mut taken: BTreeMap<u16, (&str, &str)> = BTreeMap::new();
    for variant in variants {
        for (service, spec) in &variant.sandbox.services {
            let Some(port) = spec.port.filter(|p| *p != 0) else { continue };
            match taken.get(&port) {
                Some((other, other_service)) if *other != variant.name => bail!(
                    "variants {other} and {} both give a service the fixed port {port} (service {other_service} of \
                     {other}, service {service} of {}), and `basecamp run` runs its variants side by side on this \
                     machine: run them one at a time into the same --out (`--variant {other}`, then `--variant {}`; \
                     the second run keeps the first's results), or set spec.services.{service}.port to 0 for a free port",
                    variant.name,
                    variant.name,
                    variant.name
                ),
                _ => {
                    taken.insert(port, (&variant.name, service));
                }
            }
        }
    }
    Ok(())
}

/// A run of some variants (`--variant b`) into a directory holding an
/// earlier run of the others: their shards stay on disk, so `run.json` and
/// the report include them too, from their shards' `summary.json` (as
/// `serve` and `ab compare` read the directory), in the task's variant
/// order. Before, they were dropped from both while still on disk.
fn with_kept_variants(
    out_root: &Path,
    all: Vec<basecamp_sandbox::run::ResolvedVariant>,
    ran: Vec<basecamp_sandbox::run::ResolvedVariant>,
    shards: Vec<Vec<ShardSummary>>,
) -> (Vec<basecamp_sandbox::run::ResolvedVariant>, Vec<Vec<ShardSummary>>, Vec<String>) {
    let mut ran: std::collections::HashMap<String, Vec<ShardSummary>> =
        ran.iter().map(|v| v.name.clone()).zip(shards).collect();
    let (mut variants, mut summaries, mut kept_names) = (Vec::new(), Vec::new(), Vec::new());
    for variant in all {
        let shards = match ran.remove(&variant.name) {
            Some(shards) => shards,
            None => {
                let kept = kept_shard_summaries(&out_root.join(&variant.name));
                if kept.is_empty() {
                    continue;
                }
                kept_names.push(variant.name.clone());
                kept
            }
        };
        variants.push(variant);
        summaries.push(shards);
    }
    (variants, summaries, kept_names)
}

/// The shard summaries under `variant_dir` (found as `ab compare` finds
/// them), by shard; one that cannot be read is left out, as `serve` leaves it out.
fn kept_shard_summaries(variant_dir: &Path) -> Vec<ShardSummary> {
    let mut summaries: Vec<ShardSummary> = crate::ab::summaries_under(variant_dir)
        .iter()
        .filter_map(|path| std::fs::read(path).ok())
        .filter_map(|bytes| serde_json::from_slice(&bytes).ok())
        .collect();
    summaries.sort_by_key(|s: &ShardSummary| s.shard);
    summaries
}

/// Every shard is set up (a runner, a task, a directory and a summary)
/// before the first episode, so the count is bounded by what can hold an
/// episode: a shard beyond the test set's size runs nothing, and
/// `--shards 4000000000` grew memory until the machine gave out.
fn check_shard_count(shards: u32, from_flag: bool, episodes: usize, test_set: &str) -> Result<()> {
    let most = episodes.max(1);
    if shards as usize <= most {
        return Ok(());
    }
    let held = format!("the test set {test_set} has {episodes} episodes, so at most {most} shards can hold one each");
    if from_flag {
        bail!("--shards {shards}: {held}; give --shards {most} or fewer");
    }
    bail!("spec.shards is {shards}: {held}; give --shards {most} or fewer to run it here");
}

/// A run replaces `run.json`, `report.html` and the shards of the variants
/// it runs: in a directory holding a run of another task that would lose
/// that run's report and mix the two tasks' traces (or remove the other's,
/// where variant names coincide), so it is refused before anything starts.
/// A directory whose `run.json` cannot be read as a run is not judged.
fn check_no_other_task_in(out_root: &Path, task_name: &str) -> Result<()> {
    let run_file = out_root.join(summary::RUN_FILE);
    let Ok(bytes) = std::fs::read(&run_file) else { return Ok(()) };
    let Ok(earlier) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return Ok(()) };
    match earlier["task"].as_str() {
        Some(other) if other != task_name => bail!(
            "{} holds a run of task {other:?} ({}), not of {task_name:?}: running into it would replace that run's \
             run.json and report and mix in this task's traces; give another --out (the default is basecamp-runs/{task_name})",
            out_root.display(),
            run_file.display()
        ),
        _ => Ok(()),
    }
}

/// Removes the files a run writes into `variant_dir/shard-<i>/` (traces,
/// rollback traces, `summary.json`), and each shard directory left empty;
/// anything else is left where it is. Returns how many files went.
fn remove_previous_shards(variant_dir: &Path) -> Result<usize> {
    let entries = match std::fs::read_dir(variant_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", variant_dir.display())),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", variant_dir.display()))?;
        let name = entry.file_name();
        let is_shard = name.to_str().and_then(|n| n.strip_prefix("shard-")).is_some_and(|i| i.parse::<u32>().is_ok());
        if !is_shard || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let shard_dir = entry.path();
        for file in std::fs::read_dir(&shard_dir).with_context(|| format!("cannot list {}", shard_dir.display()))? {
            let file = file.with_context(|| format!("cannot list {}", shard_dir.display()))?;
            let name = file.file_name();
            let written_by_a_run = name.to_str().is_some_and(|n| {
                n == basecamp_sandbox::driver::SUMMARY_FILE
                    || n.ends_with(".trace")
                    || n.ends_with(".rollback_trace.json")
            });
            if written_by_a_run && file.file_type().is_ok_and(|t| t.is_file()) {
                std::fs::remove_file(file.path())
                    .with_context(|| format!("cannot remove {} of an earlier run", file.path().display()))?;
                removed += 1;
            }
        }
        // Only succeeds when nothing else is in it.
        let _ = std::fs::remove_dir(&shard_dir);
    }
    Ok(removed)
}

fn progress_bar(total: u64, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg}\n[{elapsed_precise}] {wide_bar} {pos}/{len} episodes ({per_sec}, eta {eta})",
        )
        .expect("the template is valid"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}
