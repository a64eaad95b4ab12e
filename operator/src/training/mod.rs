//! The training loop (operator/TRAINING.md): for a task whose
//! `trainingConfig` names an `image`, run the trainer, watch its
//! checkpoints and evaluate each complete one in sandboxes.
//!
//! Pure parts first, then one reconcile step that the controller runs
//! after `apply` and before `update_status`:
//!
//! - [`locations`]: the checkpoint root `C`, the dataset, `steps.json`;
//! - [`trainer`]: the trainer Job, its phase and failure message;
//! - [`checkpoints`]: complete checkpoints, which to evaluate now, history;
//! - [`evaluation`]: the evaluation Jobs of a step and its result;
//! - [`reconcile`]: apply the trainer Job, read the evaluation Jobs, read
//!   `steps.json` (before anything is started, so a restart never repeats
//!   a step), aggregate the steps whose shards all finished, list the
//!   step directories of `C` and check the markers of the few that could
//!   start, start the next steps, and report `status.training`.
//!
//! API failures are errors of the reconcile (an Event and a backoff); S3
//! failures are a `problem` (a Degraded condition) and the loop goes on
//! with what it knows, starting nothing it cannot account for.

pub mod checkpoints;
pub mod evaluation;
pub mod locations;
pub mod trainer;

use std::collections::{BTreeMap, BTreeSet};

use basecamp_api::task::{
    CheckpointEvaluation, IGNORED_DIRECTORIES_LIMIT, TaskPhase, TrainingStatus, checkpoint_run_name,
};
use basecamp_sandbox::storage::{Destination, FailureKind, Storage, UtcDate};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::build::job::CheckpointUnderTest;
use crate::build::{BuildError, BuildInput};
use crate::controller::aggregate::{self, timed, write_json};
use crate::controller::apply::{ApplyError, apply_job};
use crate::controller::cache::{CachedJob, Caches};
use crate::controller::status::{AggregatedStatus, TrainingObserved};
use crate::controller::{CLOCK_SKEW_NANOS, api_error, today};
use crate::metrics::Metrics;
use checkpoints::{KnownSteps, Plan, merge, newest, parse_steps, plan};
use evaluation::FinishedStep;
use locations::{Locations, checkpoint_location};

/// Why the training step failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainingError {
    /// Applying a Job failed.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// Building a Job failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// Listing the training's Jobs or the trainer's pods failed.
    #[error("failed to list the {what} of HarnessTask {namespace}/{task}: {source}")]
    List {
        /// `evaluation Jobs` or `trainer pods`.
        what: &'static str,
        /// The task's namespace.
        namespace: String,
        /// The task.
        task: String,
        /// The cause.
        source: kube::Error,
    },
}

impl TrainingError {
    /// A fixed name for this kind of error.
    pub fn category(&self) -> &'static str {
        match self {
            TrainingError::Apply(e) => e.category(),
            TrainingError::Build(e) => e.category(),
            TrainingError::List { source, .. } => match api_error::category(source) {
                "Forbidden" => "ListForbidden",
                "ApiUnreachable" => "ApiUnreachable",
                _ => "ListFailed",
            },
        }
    }
}

/// What the training step saw and did.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// `status.training` and any S3 problem, for `update_status`.
    pub observed: TrainingObserved,
    /// Steps evaluated by this reconcile, and steps recorded in `steps.json`
    /// that status did not show yet (one `CheckpointEvaluated` Event each).
    pub evaluated: Vec<CheckpointEvaluation>,
    /// Whether this reconcile replaced the trainer's Job (its pod template
    /// changed with the spec): the trainer starts over.
    pub trainer_replaced: bool,
    /// Directories of `C` named like a step that are not one, which status
    /// did not list yet (one `CheckpointDirectoryIgnored` Warning each).
    pub newly_ignored: Vec<String>,
    /// The Warning that the checkpoint root `C` changed while steps were
    /// evaluated (`CheckpointRootChanged`), once: status then holds the new `C`.
    pub root_changed: Option<String>,
}

/// Whether the task trains: `trainingConfig.image` is set.
pub fn is_training(input: &BuildInput<'_>) -> bool {
    input.task.spec.training_config.as_ref().and_then(|t| t.image.as_deref()).is_some_and(|i| !i.trim().is_empty())
}

fn storage_problem(action: &str, error: &basecamp_sandbox::storage::StorageError) -> (&'static str, String) {
    let category = if error.is_retryable() { "S3Unavailable" } else { "S3Refused" };
    (category, format!("failed to {action}: {error}"))
}

/// Reads `steps.json` (absent: nothing evaluated yet).
async fn read_steps(
    storage: &Storage,
    metrics: &Metrics,
    file: &Destination,
) -> Result<Vec<CheckpointEvaluation>, (&'static str, String)> {
    match timed(metrics, "get", storage.fetch(file)).await {
        Ok(bytes) => parse_steps(&bytes).map_err(|e| {
            ("StepsFileCorrupt", format!("{file} is not a JSON array of checkpoint evaluations: {e}; fix or remove it"))
        }),
        Err(error) if error.kind() == Some(FailureKind::NotFound) => Ok(Vec::new()),
        Err(error) => Err(storage_problem("read the evaluated steps", &error)),
    }
}

/// Aggregates run `<task>@step-N` from its Jobs (the task's own aggregation code).
async fn aggregate_step(
    storage: &Storage,
    metrics: &Metrics,
    input: &BuildInput<'_>,
    traces: &Destination,
    step: u64,
    jobs: &BTreeMap<String, Job>,
    variants: &[String],
) -> AggregatedStatus {
    let run = checkpoint_run_name(input.name, step);
    let created = jobs.values().filter_map(|j| j.creation_timestamp()).map(|t| t.0).min();
    let first_day = created.and_then(|t| UtcDate::from_unix_seconds(t.as_second()).ok()).unwrap_or_else(today);
    let not_before_nanos = jobs
        .iter()
        .filter_map(|(variant, job)| {
            let created = job.creation_timestamp()?;
            let nanos = i64::try_from(created.0.as_nanosecond()).unwrap_or(i64::MAX);
            Some((variant.clone(), nanos.saturating_sub(CLOCK_SKEW_NANOS)))
        })
        .collect();
    let request = aggregate::Request {
        namespace: input.namespace,
        task: &run,
        destination: traces.clone(),
        days: (first_day, today()),
        variants: variants.to_vec(),
        completed: evaluation::completed_indexes(jobs),
        not_before_nanos,
        all_finished: true,
        criteria: &input.task.spec.task_definition.success_criteria,
    };
    aggregate::run(storage, metrics, &request, &AggregatedStatus::default()).await
}

/// Complete checkpoints found before something went wrong, and what did.
struct Unfinished {
    complete: BTreeMap<u64, String>,
    /// The misnamed directories, when `C` was listed.
    ignored: Option<Vec<String>>,
    problem: (&'static str, String),
}

/// The complete checkpoints of `C`, and its directories named like a step
/// that are not one ([`checkpoints::misnamed_dirs`]).
struct Found {
    complete: BTreeMap<u64, String>,
    ignored: Vec<String>,
}

/// The complete checkpoints of `C`: its step directories (one listing with
/// a delimiter, not of their files), those known complete without a
/// request ([`checkpoints::discover`]), and for the others, oldest first,
/// whether `C/step-N/<marker>` exists, at most `budget` checks.
async fn find_checkpoints(
    storage: &Storage,
    metrics: &Metrics,
    locations: &Locations,
    marker: &str,
    known: KnownSteps<'_>,
    budget: usize,
) -> Result<Found, Unfinished> {
    let root = &locations.checkpoints_destination;
    let names = timed(metrics, "list", storage.list_dirs(root)).await.map_err(|error| Unfinished {
        complete: BTreeMap::new(),
        ignored: None,
        problem: storage_problem(&format!("list the checkpoints under {}", locations.checkpoints), &error),
    })?;
    let ignored = checkpoints::misnamed_dirs(names.iter().map(String::as_str), IGNORED_DIRECTORIES_LIMIT);
    let dirs = checkpoints::step_dirs(names.iter().map(String::as_str));
    let found = checkpoints::discover(&dirs, locations.resumed_from_step, known);
    let mut complete = found.complete;
    let mut budget = budget;
    for step in found.unknown {
        for segment in dirs.get(&step).into_iter().flatten() {
            if budget == 0 {
                return Ok(Found { complete, ignored });
            }
            budget -= 1;
            let file = root.join(&format!("{segment}/{marker}")).map_err(|error| Unfinished {
                complete: complete.clone(),
                ignored: Some(ignored.clone()),
                problem: (
                    "InvalidCompletionMarker",
                    format!("spec.trainingConfig.completionMarker {marker:?} cannot name an object: {error}"),
                ),
            })?;
            match timed(metrics, "get", storage.exists(&file)).await {
                Ok(true) => {
                    // The first spelling with the marker is the checkpoint.
                    complete.insert(step, segment.clone());
                    break;
                }
                Ok(false) => {}
                Err(error) => {
                    let problem = storage_problem(&format!("check the checkpoint marker {file}"), &error);
                    return Err(Unfinished { complete, ignored: Some(ignored), problem });
                }
            }
        }
    }
    Ok(Found { complete, ignored })
}

/// The training step (see the module docs). `None` for a task that does not train.
pub async fn reconcile(
    client: &Client,
    caches: &Caches,
    storage: &Storage,
    metrics: &Metrics,
    input: &BuildInput<'_>,
) -> Result<Option<Observation>, TrainingError> {
    if !is_training(input) {
        return Ok(None);
    }
    let task = input.task;
    let namespace = input.namespace;
    let previous = task.status.as_ref().and_then(|s| s.training.clone()).unwrap_or_default();
    let locations = match Locations::of(task, namespace, input.name) {
        Ok(locations) => locations,
        Err(error) => {
            let observed = TrainingObserved {
                status: TrainingStatus { message: Some(error.to_string()), ..previous },
                problem: Some(("InvalidCheckpointLocation", error.to_string())),
            };
            return Ok(Some(Observation {
                observed,
                evaluated: Vec::new(),
                trainer_replaced: false,
                newly_ignored: Vec::new(),
                root_changed: None,
            }));
        }
    };
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let list_error = |what| {
        move |source| TrainingError::List {
            what,
            namespace: namespace.to_string(),
            task: input.name.to_string(),
            source,
        }
    };

    // The trainer.
    let trainer_name = trainer::trainer_job_name(input.name);
    let mut trainer_job = None;
    let mut trainer_replaced = false;
    let generation_seen = task.status.as_ref().and_then(|s| s.observed_generation) == task.metadata.generation;
    if let Some(want) = trainer::trainer_job(input, &locations)? {
        let finished_before =
            generation_seen && matches!(previous.phase, Some(TaskPhase::Succeeded | TaskPhase::Failed));
        (trainer_job, trainer_replaced) =
            apply_job(&jobs, metrics, namespace, &want, caches.job_state(namespace, &trainer_name), finished_before)
                .await?;
    }
    let trainer_done = trainer_job.as_ref().is_some_and(|job| {
        job.status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| c.type_ == "Complete" && c.status == "True")
    });
    let mut problem: Option<(&'static str, String)> = None;
    // The pods only add detail (the failure message, an image that cannot
    // be pulled): without the right to read them the loop goes on.
    let pods = if trainer_job.is_some() && !trainer_done {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let selector = format!("batch.kubernetes.io/job-name={trainer_name}");
        match pods.list(&ListParams::default().labels(&selector)).await.map_err(list_error("trainer pods")) {
            Ok(list) => list.items,
            Err(error) => {
                tracing::warn!(%error, "cannot read the trainer's pods; status.training.message stays empty");
                problem =
                    Some(("TrainerPodsUnreadable", format!("{error}; grant get/list on pods (operator/RBAC.md)")));
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    let (phase, mut message) = trainer::trainer_state(trainer_job.as_ref(), &pods, previous.phase);
    if trainer_job.is_none() && phase == TaskPhase::Failed {
        // The Job and its pods are gone (TTL): the message stays as it was read.
        message.clone_from(&previous.message);
    }

    // The evaluations: what runs, what was evaluated. From the Job cache
    // when it is listed: a Job it does not show yet (created moments ago)
    // is at worst applied again below, which leaves it as it is.
    let listed = match caches.jobs_where(namespace, |job| evaluation::is_evaluation_of(job, input.name)) {
        Some(cached) => cached,
        None => {
            jobs.list(&ListParams::default().labels(&evaluation::selector(input.name)))
                .await
                .map_err(list_error("evaluation Jobs"))?
                .items
        }
    };
    let by_step = evaluation::by_step(listed);
    let variants: Vec<String> = input.variants.iter().map(|v| v.name.clone()).collect();
    let shards = task.spec.shards();
    let recorded = match (&locations.steps_file, &locations.traces) {
        (Some(file), Some(_)) => match read_steps(storage, metrics, file).await {
            Ok(recorded) => Some(recorded),
            Err(found) => {
                problem = Some(found);
                None
            }
        },
        _ => {
            problem = Some((
                "NoTraceDestination",
                "checkpoint evaluations write traces and reports: set spec.traces.destination (s3://...)".to_string(),
            ));
            None
        }
    };
    let mut evaluated: BTreeSet<u64> = previous.history.iter().map(|e| e.step).collect();
    evaluated.extend(recorded.iter().flatten().map(|e| e.step));
    // Steps are the history's key, whatever checkpoint root they came from.
    let root_changed = previous
        .checkpoints
        .as_deref()
        .filter(|before| *before != locations.checkpoints && !evaluated.is_empty())
        .map(|before| checkpoints::root_changed_note(before, &locations.checkpoints, &evaluated));

    // Steps whose every shard finished: aggregate, then record.
    let mut new = Vec::new();
    if let (Some(recorded), Some(traces), Some(file)) = (&recorded, &locations.traces, &locations.steps_file) {
        for (step, step_jobs) in &by_step {
            if evaluated.contains(step) || !evaluation::step_finished(step_jobs, &variants, shards) {
                continue;
            }
            let aggregated = aggregate_step(storage, metrics, input, traces, *step, step_jobs, &variants).await;
            if let Some((category, message)) = &aggregated.error {
                problem = Some((category, format!("checkpoint step {step}: {message}")));
                continue;
            }
            let finished = FinishedStep {
                step: *step,
                checkpoint: evaluation::checkpoint_of(step_jobs).unwrap_or_default(),
                any_failed: evaluation::step_shards(step_jobs, shards).values().any(|c| c.failed > 0),
                finished_at: evaluation::finished_at(step_jobs),
            };
            new.push(evaluation::evaluation(
                &finished,
                &aggregated,
                input.settings.report_base_url.as_deref(),
                namespace,
                input.name,
            ));
        }
        if !new.is_empty() {
            let all = merge(&[recorded, &new]);
            match write_json(storage, metrics, file, &all).await {
                Ok(()) => evaluated.extend(new.iter().map(|e| e.step)),
                Err(error) => {
                    problem = Some((error.category(), format!("failed to record the evaluated steps: {error}")));
                    new.clear();
                }
            }
        }
    }

    // Complete checkpoints, and the next steps to evaluate.
    let marker = task
        .spec
        .training_config
        .as_ref()
        .map_or(basecamp_api::task::DEFAULT_COMPLETION_MARKER, |t| t.completion_marker());
    let running: BTreeSet<u64> = by_step.keys().copied().filter(|s| !evaluated.contains(s)).collect();
    let max = task.spec.training_config.as_ref().map_or(1, |t| t.max_concurrent_evaluations());
    // The previous queue was complete for this C and this spec (marker, resumeFrom).
    let queued_before: BTreeSet<u64> =
        if generation_seen && previous.checkpoints.as_deref() == Some(locations.checkpoints.as_str()) {
            previous.queued.iter().copied().collect()
        } else {
            BTreeSet::new()
        };
    let known = find_checkpoints(
        storage,
        metrics,
        &locations,
        marker,
        KnownSteps { evaluated: &evaluated, running: &running, queued_before: &queued_before },
        checkpoints::marker_check_budget(max, running.len()),
    )
    .await;
    let (complete, counted, ignored) = match known {
        Ok(Found { complete, ignored }) => (complete, true, Some(ignored)),
        Err(Unfinished { complete, ignored, problem: found }) => {
            problem = Some(found);
            (complete, false, ignored)
        }
    };
    let ignored = ignored.unwrap_or_else(|| previous.ignored_directories.clone());
    let newly_ignored: Vec<String> =
        ignored.iter().filter(|name| !previous.ignored_directories.contains(name)).cloned().collect();
    let mut next: Plan = plan(&complete, locations.resumed_from_step, &evaluated, &running, max);
    if recorded.is_none() {
        // Without steps.json nothing may start: it could be evaluated already.
        let mut waiting = std::mem::take(&mut next.start);
        waiting.append(&mut next.queued);
        next.queued = waiting;
    }
    let checkpoint = |step: u64, jobs: Option<&BTreeMap<String, Job>>| {
        let location = jobs
            .and_then(evaluation::checkpoint_of)
            .or_else(|| complete.get(&step).map(|segment| checkpoint_location(&locations.checkpoints, segment)))?;
        Some(CheckpointUnderTest { step, location })
    };
    for step in &next.start {
        let Some(under_test) = checkpoint(*step, None) else { continue };
        for job in evaluation::evaluation_jobs(input, &under_test)? {
            apply_job(&jobs, metrics, namespace, &job, CachedJob::Unknown, false).await?;
        }
    }
    // A step started by an operator that stopped half-way: its missing variants.
    for step in &running {
        let step_jobs = by_step.get(step);
        if variants.iter().all(|v| step_jobs.is_some_and(|j| j.contains_key(v))) || recorded.is_none() {
            continue;
        }
        let Some(under_test) = checkpoint(*step, step_jobs) else { continue };
        for job in evaluation::evaluation_jobs(input, &under_test)? {
            let variant = job.labels().get(crate::build::names::VARIANT_LABEL).cloned().unwrap_or_default();
            if step_jobs.is_some_and(|j| j.contains_key(&variant)) {
                continue;
            }
            apply_job(&jobs, metrics, namespace, &job, CachedJob::Unknown, false).await?;
        }
    }

    let mut evaluating: Vec<u64> = running.iter().copied().chain(next.start.iter().copied()).collect();
    evaluating.sort_unstable();
    evaluating.dedup();
    let history = newest(&merge(&[recorded.as_deref().unwrap_or_default(), &previous.history, &new]));
    // Steps in steps.json that status never showed (an operator stopped
    // between recording a step and writing status) get their Event now:
    // at least once, and only for steps the history keeps.
    let shown: BTreeSet<u64> = previous.history.iter().map(|e| e.step).chain(new.iter().map(|e| e.step)).collect();
    let mut announced = new;
    announced.extend(history.iter().filter(|e| !shown.contains(&e.step)).cloned());
    announced.sort_by_key(|e| e.step);
    let status = TrainingStatus {
        phase: Some(phase),
        job: Some(trainer_name),
        message,
        dataset: locations.dataset.clone(),
        checkpoints: Some(locations.checkpoints.clone()),
        resumed_from_step: locations.resumed_from_step,
        checkpoints_found: if counted { Some(next.found) } else { previous.checkpoints_found },
        latest_step: history.last().map(|e| e.step),
        evaluating,
        queued: next.queued,
        history,
        ignored_directories: ignored,
    };
    Ok(Some(Observation {
        observed: TrainingObserved { status, problem },
        evaluated: announced,
        trainer_replaced,
        newly_ignored,
        root_changed,
    }))
}

#[cfg(test)]
mod tests;
