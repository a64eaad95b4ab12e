//! `update_status`: the task's observed state, computed purely from what
//! the previous steps saw, then written by server-side apply on the status
//! subresource. Conditions follow `metav1.Condition`: a bounded reason, a
//! message for people, `observedGeneration`, and a `lastTransitionTime`
//! that only moves when the condition's status changes. Each change of a
//! condition becomes an Event (see [`transitions`]).
//!
//! A training task (see `crate::training`) is not finished while its
//! trainer runs or checkpoint evaluations are queued or running, and a
//! failed trainer fails it (reason `TrainerFailed`, with the pod's message).

use std::collections::BTreeMap;

use basecamp_api::HarnessTask;
use basecamp_api::criteria::{Criterion, NOT_MEASURED_METRICS, not_measured_tolerated};
use basecamp_api::task::{CriterionResult, HarnessTaskStatus, ShardCounts, TaskPhase, TrainingStatus, condition_types};
use basecamp_trace::metrics::NOT_MEASURED_EPISODES;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use super::aggregate::POLICY_ANSWERS_429;
use crate::FIELD_MANAGER;

/// Why the status could not be written.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The status patch failed.
    #[error("failed to update the status of HarnessTask {namespace}/{name}: {source}")]
    Patch {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The cause.
        source: kube::Error,
    },
}

impl StatusError {
    /// A fixed name for this kind of error.
    pub fn category(&self) -> &'static str {
        match self {
            StatusError::Patch { source, .. } => match super::api_error::category(source) {
                "ApiUnreachable" => "ApiUnreachable",
                _ => "StatusUpdateFailed",
            },
        }
    }
}

/// Degraded reason: no node satisfies a variant's GPU requirement.
pub const INSUFFICIENT_GPU_CAPACITY: &str = "InsufficientGpuCapacity";
/// Degraded reason: shards failed after their retries.
pub const SHARD_FAILED: &str = "ShardFailed";
/// Degraded reason: episodes that the policy's server or a sandbox service
/// failed (`policy_error`, `service_exited`): they measured the
/// infrastructure, and the metrics are over the other episodes.
pub const EPISODES_NOT_MEASURED: &str = "EpisodesNotMeasured";

/// Whether the task is Degraded by an error a later reconcile may clear (S3
/// unreachable, a summary not uploaded yet, ...), as opposed to a fact of
/// the run (failed shards) or of the cluster (GPU capacity, whose change
/// no retry of this task brings about).
pub fn degraded_by_a_retryable_error(status: &HarnessTaskStatus) -> bool {
    status.conditions.iter().any(|c| {
        c.type_ == condition_types::DEGRADED
            && c.status == "True"
            && ![SHARD_FAILED, INSUFFICIENT_GPU_CAPACITY, EPISODES_NOT_MEASURED].contains(&c.reason.as_str())
    })
}

/// What the Degraded condition says of the variants whose episodes the
/// policy's server or a service failed beyond what their criteria tolerate
/// ([`not_measured_tolerated`]); `None` when every episode counted or the
/// criteria tolerate those that did not.
fn not_measured(metrics: &BTreeMap<String, BTreeMap<String, f64>>, criteria: &[CriterionResult]) -> Option<String> {
    let said: Vec<String> = metrics
        .iter()
        .filter_map(|(variant, m)| {
            let not_measured = m.get(NOT_MEASURED_EPISODES).copied().filter(|n| *n > 0.0)?;
            let episodes = m.get("episodes").copied().unwrap_or(not_measured);
            let tolerance: Vec<(String, &CriterionResult)> = criteria
                .iter()
                .filter(|c| c.variant == *variant)
                .filter_map(|c| Some((c.criterion.parse::<Criterion>().ok()?.metric, c)))
                .filter(|(metric, _)| NOT_MEASURED_METRICS.contains(&metric.as_str()))
                .collect();
            if not_measured_tolerated(tolerance.iter().map(|(metric, c)| (metric.as_str(), c.met))) {
                return None;
            }
            let unmet: Vec<String> =
                tolerance.iter().filter(|(_, c)| !c.met).map(|(_, c)| format!("`{}`", c.criterion)).collect();
            let beyond =
                if unmet.is_empty() { String::new() } else { format!(" (more than {} allows)", unmet.join(" and ")) };
            Some(format!("variant {variant}: {not_measured} of {episodes} episodes{beyond}"))
        })
        .collect();
    (!said.is_empty()).then(|| {
        format!(
            "{} not measured: the policy or a sandbox service failed, not the agent (failure classes policy_error, \
             service_exited in index.json); the metrics and criteria are over the other episodes; a criterion on \
             not_measured_rate or not_measured_episodes sets a tolerance",
            said.join(", ")
        )
    })
}

/// A condition as the pipeline decides it (time and generation are added here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The condition type.
    pub type_: &'static str,
    /// True or false.
    pub status: bool,
    /// A bounded PascalCase reason.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

impl Decided {
    /// A condition.
    pub fn new(type_: &'static str, status: bool, reason: &'static str, message: impl Into<String>) -> Self {
        Self { type_, status, reason, message: message.into() }
    }
}

/// The condition list: each decided condition, keeping the previous
/// `lastTransitionTime` when its status did not change.
pub fn conditions(previous: &[Condition], decided: &[Decided], generation: Option<i64>, now: &Time) -> Vec<Condition> {
    decided
        .iter()
        .map(|d| {
            let status = if d.status { "True" } else { "False" };
            let since = previous
                .iter()
                .find(|c| c.type_ == d.type_ && c.status == status)
                .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
            Condition {
                type_: d.type_.to_string(),
                status: status.to_string(),
                reason: d.reason.to_string(),
                message: d.message.clone(),
                observed_generation: generation,
                last_transition_time: since,
            }
        })
        .collect()
}

/// Parses a Job's `completedIndexes`/`failedIndexes` ("1,3-5") into indexes.
pub fn parse_indexes(text: Option<&str>) -> Vec<u32> {
    let mut indexes = Vec::new();
    for part in text.unwrap_or("").split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    indexes.extend(a..=b.min(a.saturating_add(100_000)));
                }
            }
            None => indexes.extend(part.parse::<u32>().ok()),
        }
    }
    indexes
}

/// Shard counts of one variant from its Job.
pub fn shard_counts(job: &Job, total: u32) -> ShardCounts {
    let status = job.status.clone().unwrap_or_default();
    let succeeded = u32::try_from(parse_indexes(status.completed_indexes.as_deref()).len()).unwrap_or(u32::MAX);
    let failed = u32::try_from(parse_indexes(status.failed_indexes.as_deref()).len()).unwrap_or(u32::MAX);
    let job_failed = status.conditions.iter().flatten().any(|c| c.type_ == "Failed" && c.status == "True");
    // A Job that failed as a whole (e.g. deadline) leaves the rest unfinished: count them failed.
    let failed = if job_failed { total.saturating_sub(succeeded).max(failed) } else { failed };
    // Running = pods Ready; `active` also counts pods still waiting for a node.
    let running = status.ready.or(status.active).unwrap_or(0).max(0);
    let running = if job_failed { 0 } else { u32::try_from(running).unwrap_or(0) };
    ShardCounts { total, succeeded: succeeded.min(total), failed: failed.min(total), running: running.min(total) }
}

/// What the aggregation step contributes to status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AggregatedStatus {
    /// Metrics by variant.
    pub metrics: BTreeMap<String, BTreeMap<String, f64>>,
    /// Criteria results (empty until every shard finished).
    pub criteria: Vec<CriterionResult>,
    /// A/B deltas.
    pub deltas: BTreeMap<String, f64>,
    /// Shard indexes counted, by variant.
    pub aggregated_shards: BTreeMap<String, Vec<u32>>,
    /// Where index.json and comparison.json are.
    pub trace_location: Option<String>,
    /// The error that stopped aggregation this time (category, message).
    pub error: Option<(&'static str, String)>,
    /// Whether index.json and comparison.json are written for the final results.
    pub complete: bool,
}

/// What the training step contributes to status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainingObserved {
    /// `status.training`.
    pub status: TrainingStatus,
    /// An S3 problem that held the loop back this time (category, message).
    pub problem: Option<(&'static str, String)>,
}

impl TrainingObserved {
    /// Whether the trainer failed, and why.
    pub fn trainer_failure(&self) -> Option<String> {
        (self.status.phase == Some(TaskPhase::Failed))
            .then(|| self.status.message.clone().unwrap_or_else(|| "the trainer failed".to_string()))
    }
}

/// Whether a training loop still has work: the trainer has not finished,
/// or checkpoint evaluations are running or queued.
pub fn training_busy(training: &TrainingStatus) -> bool {
    matches!(training.phase, Some(TaskPhase::Pending | TaskPhase::Running))
        || !training.evaluating.is_empty()
        || !training.queued.is_empty()
}

fn training_summary(training: &TrainingStatus) -> String {
    let phase = training.phase.map_or("Pending", TaskPhase::as_str);
    let steps = |steps: &[u64]| steps.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    let mut text = format!("trainer {phase}");
    if !training.evaluating.is_empty() {
        text.push_str(&format!("; evaluating step {}", steps(&training.evaluating)));
    }
    if !training.queued.is_empty() {
        text.push_str(&format!("; queued step {}", steps(&training.queued)));
    }
    if let Some(step) = training.latest_step {
        text.push_str(&format!("; latest evaluated step {step}"));
    }
    text
}

/// Everything the status is computed from.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The task.
    pub task: &'a HarnessTask,
    /// Shard counts by variant, in variant order.
    pub shards: Vec<(String, ShardCounts)>,
    /// The template hash of each variant's Job that `shards` counts.
    pub job_templates: BTreeMap<String, String>,
    /// `Some(message)` when no node satisfies a GPU requirement.
    pub capacity_problem: Option<String>,
    /// Whether the Jobs are suspended now (spec.suspend, or waiting for Kueue admission).
    pub suspended: bool,
    /// Validation warnings, one line each.
    pub warnings: Vec<String>,
    /// Aggregation results.
    pub aggregated: AggregatedStatus,
    /// The task's page on `basecamp serve`, when the operator knows where it runs.
    pub report_url: Option<String>,
    /// The training loop, for a task that trains.
    pub training: Option<TrainingObserved>,
    /// What the last sandbox that failed said as it exited ([`shard_failure`]),
    /// read from its pod while any shard has failed.
    pub shard_failure: Option<String>,
    /// Now.
    pub now: Time,
}

/// The annotation (and label) a Job puts on each pod: its completion index, the shard.
const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// The longest part of a termination message a condition quotes.
const MAX_QUOTED: usize = 600;

/// What the newest sandbox pod (of `pods`, a task's variant pods) whose
/// sandbox container exited non-zero said: "variant b, shard 1: the
/// sandbox exited with code 4: error: gave up: ...". The line quoted is the
/// last of its termination message (FallbackToLogsOnError: the end of its
/// log) that starts with `error`, else its last line, else the kubelet's
/// reason. `None` when no such pod is left.
pub fn shard_failure(pods: &[Pod]) -> Option<String> {
    let (pod, terminated) = pods
        .iter()
        .filter_map(|pod| {
            let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
            let sandbox = statuses.iter().find(|c| c.name == crate::build::job::SANDBOX_CONTAINER)?;
            let terminated = sandbox.state.as_ref()?.terminated.as_ref()?;
            (terminated.exit_code != 0).then_some((pod, terminated))
        })
        .max_by_key(|(_, terminated)| terminated.finished_at.clone())?;
    let message = terminated.message.as_deref().unwrap_or_default();
    let lines = || message.lines().map(str::trim).filter(|l| !l.is_empty());
    let said = lines()
        .rev()
        .find(|l| l.to_ascii_lowercase().starts_with("error"))
        .or_else(|| lines().next_back())
        .or(terminated.reason.as_deref())
        .unwrap_or("no message");
    let said = match said.char_indices().nth(MAX_QUOTED) {
        Some((end, _)) => format!("{}...", &said[..end]),
        None => said.to_string(),
    };
    let label = |key: &str| pod.labels().get(key).cloned().unwrap_or_else(|| "?".into());
    let shard = pod.annotations().get(COMPLETION_INDEX).cloned().unwrap_or_else(|| label(COMPLETION_INDEX));
    Some(format!(
        "variant {}, shard {shard}: the sandbox exited with code {}: {said}",
        label(crate::build::names::VARIANT_LABEL),
        terminated.exit_code
    ))
}

/// The task's page on `basecamp serve` at `base` (`<base>/tasks/<namespace>/<task>`).
pub fn report_url(base: Option<&str>, namespace: &str, task: &str) -> Option<String> {
    let base = base?.trim().trim_end_matches('/');
    (!base.is_empty()).then(|| format!("{base}/tasks/{namespace}/{task}"))
}

fn accuracy_text(metrics: &BTreeMap<String, BTreeMap<String, f64>>, variants: &[String]) -> Option<String> {
    let values: Vec<(String, f64)> = variants
        .iter()
        .filter_map(|v| metrics.get(v).and_then(|m| m.get("tool_call_accuracy")).map(|a| (v.clone(), *a)))
        .collect();
    match values.as_slice() {
        [] => None,
        [(_, a)] if variants.len() == 1 => Some(format!("{a:.3}")),
        _ => Some(values.iter().map(|(v, a)| format!("{v}={a:.3}")).collect::<Vec<_>>().join(" ")),
    }
}

/// The S3 trace destinations the task's Jobs were given: the earlier ones
/// and the spec's (a directory is not kept: retention deletes only in S3).
fn trace_destinations(previous: &[String], task: &HarnessTask) -> Vec<String> {
    let mut destinations = previous.to_vec();
    let spec = task.spec.traces.as_ref().and_then(|t| t.destination.as_deref());
    if let Some(destination) = spec.filter(|d| d.starts_with("s3://"))
        && !destinations.iter().any(|d| d == destination)
    {
        destinations.push(destination.to_string());
    }
    destinations
}

/// The status of a runnable task.
pub fn compute(observed: &Observed<'_>) -> HarnessTaskStatus {
    use condition_types::*;
    let task = observed.task;
    let previous = task.status.clone().unwrap_or_default();
    let variants: Vec<String> = observed.shards.iter().map(|(v, _)| v.clone()).collect();
    let total: u32 = observed.shards.iter().map(|(_, c)| c.total).sum();
    let finished: u32 = observed.shards.iter().map(|(_, c)| c.finished()).sum();
    let failed: u32 = observed.shards.iter().map(|(_, c)| c.failed).sum();
    let running: u32 = observed.shards.iter().map(|(_, c)| c.running).sum();
    let all_finished = total > 0 && finished >= total;
    let aggregated = &observed.aggregated;
    let criteria_met = aggregated.criteria.iter().all(|c| c.met);
    let done = all_finished && aggregated.complete;
    // Criteria met over the episodes that measured the agent pass no run
    // whose policy server or services failed the others.
    let not_measured = not_measured(&aggregated.metrics, &aggregated.criteria);

    let phase = if failed > 0 && all_finished {
        TaskPhase::Failed
    } else if done {
        if criteria_met && not_measured.is_none() { TaskPhase::Succeeded } else { TaskPhase::Failed }
    } else if observed.suspended && running == 0 {
        TaskPhase::Suspended
    } else if running > 0 || finished > 0 {
        TaskPhase::Running
    } else {
        TaskPhase::Pending
    };
    let training = observed.training.as_ref();
    let trainer_failure = training.and_then(TrainingObserved::trainer_failure);
    let training_busy = training.is_some_and(|t| training_busy(&t.status));
    // The training loop comes on top of the variants' Jobs: a failed
    // trainer fails the task; a busy loop keeps it from finishing.
    let phase = match (phase, training) {
        _ if trainer_failure.is_some() => TaskPhase::Failed,
        (TaskPhase::Suspended, _) => TaskPhase::Suspended,
        (TaskPhase::Pending, Some(t))
            if t.status.phase == Some(TaskPhase::Pending) && t.status.evaluating.is_empty() =>
        {
            TaskPhase::Pending
        }
        (_, Some(_)) if training_busy => TaskPhase::Running,
        (phase, _) => phase,
    };

    let warnings = if observed.warnings.is_empty() {
        String::new()
    } else {
        format!("; warnings: {}", observed.warnings.join("; "))
    };
    let training_text = training.filter(|_| training_busy).map(|t| training_summary(&t.status));
    let mut decided =
        vec![Decided::new(READY, true, "Resolved", format!("sandboxes resolved, objects applied{warnings}"))];
    decided.push(match phase {
        TaskPhase::Suspended => {
            Decided::new(PROGRESSING, false, "Suspended", "the Jobs are suspended (spec.suspend or Kueue admission)")
        }
        // A failed trainer fails the task at once, but the checkpoints it
        // left are still evaluated: that is progress, not "Finished".
        TaskPhase::Pending | TaskPhase::Running | TaskPhase::Failed if training_text.is_some() => Decided::new(
            PROGRESSING,
            true,
            "Training",
            format!("{}; {finished}/{total} shards finished", training_text.clone().unwrap_or_default()),
        ),
        TaskPhase::Pending => Decided::new(PROGRESSING, true, "ShardsPending", format!("0 of {total} shards started")),
        TaskPhase::Running if all_finished => {
            Decided::new(PROGRESSING, true, "Aggregating", "every shard finished; aggregating their summaries")
        }
        TaskPhase::Running => Decided::new(
            PROGRESSING,
            true,
            "ShardsRunning",
            format!("{finished}/{total} shards finished, {running} running"),
        ),
        _ => Decided::new(PROGRESSING, false, "Finished", format!("{finished}/{total} shards finished")),
    });
    let degraded = if let Some((reason, message)) = &aggregated.error {
        Decided::new(DEGRADED, true, reason, message.clone())
    } else if let Some((reason, message)) = training.and_then(|t| t.problem.as_ref()) {
        Decided::new(DEGRADED, true, reason, message.clone())
    } else if let Some(message) = observed.capacity_problem.as_ref().filter(|_| !all_finished || training_busy) {
        // A task whose shards (and checkpoint evaluations) all finished
        // needs no GPU any more: a pool scaled to zero is not its problem.
        Decided::new(DEGRADED, true, INSUFFICIENT_GPU_CAPACITY, message.clone())
    } else if failed > 0 {
        let last = observed.shard_failure.as_ref().map(|f| format!("; the last: {f}")).unwrap_or_default();
        Decided::new(
            DEGRADED,
            true,
            SHARD_FAILED,
            format!("{failed} of {total} shards failed after their retries{last}"),
        )
    } else if let Some(message) = &not_measured {
        Decided::new(DEGRADED, true, EPISODES_NOT_MEASURED, message.clone())
    } else {
        Decided::new(DEGRADED, false, "AsExpected", "")
    };
    decided.push(degraded);
    let unmet: Vec<String> = aggregated
        .criteria
        .iter()
        .filter(|c| !c.met)
        .map(|c| format!("{} {}", c.variant, c.message.clone().unwrap_or_else(|| c.criterion.clone())))
        .collect();
    match phase {
        TaskPhase::Succeeded => {
            decided.push(Decided::new(
                SUCCEEDED,
                true,
                "CriteriaMet",
                format!("every shard finished and all {} criteria are met", aggregated.criteria.len()),
            ));
            decided.push(Decided::new(FAILED, false, "AsExpected", ""));
        }
        TaskPhase::Failed if trainer_failure.is_some() => {
            decided.push(Decided::new(SUCCEEDED, false, "TrainerFailed", ""));
            decided.push(Decided::new(FAILED, true, "TrainerFailed", trainer_failure.clone().unwrap_or_default()));
        }
        TaskPhase::Failed if failed > 0 => {
            decided.push(Decided::new(SUCCEEDED, false, "ShardsFailed", ""));
            decided.push(Decided::new(
                FAILED,
                true,
                "ShardsFailed",
                match &observed.shard_failure {
                    Some(last) => format!("{failed} of {total} shards failed; the last: {last}"),
                    None => format!("{failed} of {total} shards failed; see the Jobs' pods and the traces"),
                },
            ));
        }
        TaskPhase::Failed if criteria_met && not_measured.is_some() => {
            decided.push(Decided::new(SUCCEEDED, false, EPISODES_NOT_MEASURED, ""));
            decided.push(Decided::new(
                FAILED,
                true,
                EPISODES_NOT_MEASURED,
                format!(
                    "the criteria are met over the measured episodes, but {}",
                    not_measured.clone().unwrap_or_default()
                ),
            ));
        }
        TaskPhase::Failed => {
            decided.push(Decided::new(SUCCEEDED, false, "CriteriaNotMet", ""));
            decided.push(Decided::new(FAILED, true, "CriteriaNotMet", unmet.join("; ")));
        }
        _ => {
            decided.push(Decided::new(SUCCEEDED, false, "NotFinished", ""));
            decided.push(Decided::new(FAILED, false, "AsExpected", ""));
        }
    }
    let generation = task.metadata.generation;
    HarnessTaskStatus {
        phase: Some(phase),
        conditions: conditions(&previous.conditions, &decided, generation, &observed.now),
        observed_generation: generation,
        shards: observed.shards.iter().cloned().collect(),
        job_templates: observed.job_templates.clone(),
        shards_summary: Some(format!("{finished}/{total}")),
        variants_summary: Some(variants.join(",")),
        accuracy: accuracy_text(&aggregated.metrics, &variants),
        metrics: aggregated.metrics.clone(),
        criteria: aggregated.criteria.clone(),
        aggregated_shards: aggregated.aggregated_shards.clone(),
        deltas: aggregated.deltas.clone(),
        trace_destinations: trace_destinations(&previous.trace_destinations, task),
        trace_location: aggregated.trace_location.clone(),
        report_url: observed.report_url.clone(),
        training: match training {
            Some(t) => Some(t.status.clone()),
            None => previous.training.clone(),
        },
    }
}

/// The status of a task that cannot run: its spec is invalid (reason from
/// validation), or a Job name it needs is taken (`JobNameTaken`).
/// `consequence` is the Progressing message: what does and does not run.
///
/// A task whose Jobs were applied for its current generation and that has
/// not finished (a SandboxConfig it names was deleted under it) keeps its
/// phase and results: its Jobs run on, so it is not Failed; only Ready says
/// what is wrong. A finished task is not given this status at all (see
/// [`finished_run`]).
pub fn blocked(
    task: &HarnessTask,
    reason: &'static str,
    message: &str,
    consequence: &str,
    now: &Time,
) -> HarnessTaskStatus {
    use condition_types::*;
    let previous = task.status.clone().unwrap_or_default();
    let generation = task.metadata.generation;
    if applied_and_unfinished(task) {
        let message = format!(
            "{message}; the Jobs applied for generation {} run on, but this status is not updated until it is fixed",
            generation.unwrap_or_default()
        );
        let ready = conditions(&previous.conditions, &[Decided::new(READY, false, reason, message)], generation, now);
        let mut kept: Vec<Condition> = previous.conditions.iter().filter(|c| c.type_ != READY).cloned().collect();
        kept.splice(0..0, ready);
        return HarnessTaskStatus { conditions: kept, ..previous };
    }
    let decided = [
        Decided::new(READY, false, reason, message),
        Decided::new(PROGRESSING, false, reason, consequence),
        Decided::new(DEGRADED, false, "AsExpected", ""),
        Decided::new(SUCCEEDED, false, reason, ""),
        Decided::new(FAILED, true, reason, message),
    ];
    HarnessTaskStatus {
        phase: Some(TaskPhase::Failed),
        conditions: conditions(&previous.conditions, &decided, generation, now),
        observed_generation: generation,
        ..previous
    }
}

/// The status of a task whose spec is invalid (see [`blocked`]).
pub fn invalid(task: &HarnessTask, reason: &'static str, message: &str, now: &Time) -> HarnessTaskStatus {
    blocked(task, reason, message, "fix the spec; nothing new is applied until it is valid", now)
}

fn ready(status: &HarnessTaskStatus) -> bool {
    status.conditions.iter().any(|c| c.type_ == condition_types::READY && c.status == "True")
}

/// Whether the status holds the results of a finished run of the task's
/// current generation (Succeeded or Failed after its Jobs ran, not because
/// it could not run): they stand even if a SandboxConfig it names is
/// deleted afterwards.
pub fn finished_run(task: &HarnessTask) -> bool {
    task.status.as_ref().is_some_and(|s| {
        s.observed_generation == task.metadata.generation
            && matches!(s.phase, Some(TaskPhase::Succeeded | TaskPhase::Failed))
            && ready(s)
    })
}

/// Whether the task's Jobs were applied for its current generation and it
/// has not finished: only [`compute`] writes these phases, after the apply.
fn applied_and_unfinished(task: &HarnessTask) -> bool {
    task.status.as_ref().is_some_and(|s| {
        s.observed_generation == task.metadata.generation
            && matches!(s.phase, Some(TaskPhase::Pending | TaskPhase::Running | TaskPhase::Suspended))
    })
}

/// A condition change worth an Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// Warning (something went wrong) or Normal.
    pub warning: bool,
    /// The condition's reason.
    pub reason: String,
    /// `Type=Status: message`.
    pub note: String,
}

fn is_bad(condition: &Condition) -> bool {
    let truthy = condition.status == "True";
    match condition.type_.as_str() {
        condition_types::DEGRADED | condition_types::FAILED => truthy,
        condition_types::READY => !truthy,
        _ => false,
    }
}

/// Reasons of conditions that say "nothing to report".
const QUIET_REASONS: [&str; 2] = ["AsExpected", "NotFinished"];

/// The conditions that changed status or reason, as Events.
pub fn transitions(previous: &[Condition], current: &[Condition]) -> Vec<Transition> {
    let all: Vec<Transition> = current
        .iter()
        .filter(|c| !previous.iter().any(|p| p.type_ == c.type_ && p.status == c.status && p.reason == c.reason))
        // A quiet condition (Degraded=False AsExpected, ...) is news only when its status flipped.
        .filter(|c| {
            !QUIET_REASONS.contains(&c.reason.as_str())
                || previous.iter().any(|p| p.type_ == c.type_ && p.status != c.status)
        })
        .map(|c| Transition {
            warning: is_bad(c),
            reason: c.reason.clone(),
            note: if c.message.is_empty() {
                format!("{}={}", c.type_, c.status)
            } else {
                format!("{}={}: {}", c.type_, c.status, c.message)
            },
        })
        .collect();
    // Conditions sharing a reason (Ready=False and Failed=True of an invalid
    // spec, Succeeded=False and Failed=True of failed shards) make one Event:
    // the warning, if one of them is.
    let mut events: Vec<Transition> = Vec::new();
    for transition in &all {
        if events.iter().any(|e| e.reason == transition.reason) {
            continue;
        }
        let chosen = all.iter().filter(|t| t.reason == transition.reason).find(|t| t.warning).unwrap_or(transition);
        events.push(chosen.clone());
    }
    events
}

/// Event reason: a variant's policy endpoint answered 429 (too many requests).
pub const POLICY_RATE_LIMITED: &str = "PolicyRateLimited";

/// A Normal Event for each variant whose status metrics show 429s from its
/// policy endpoint for the first time (`policy_answers_429`, summed over
/// its pods' summaries as they are aggregated). Nothing was lost to them —
/// each sandbox sent fewer requests at once and started no episode while
/// one waited — but the waits are in the episodes' `resolution_time`, and
/// the usual cause is asking more of the endpoint than it allows: said once
/// a variant, where `kubectl describe` shows it; the count stays in the
/// status metrics.
pub fn rate_limited(
    previous: &BTreeMap<String, BTreeMap<String, f64>>,
    current: &BTreeMap<String, BTreeMap<String, f64>>,
) -> Vec<(String, Transition)> {
    current
        .iter()
        .filter(|(variant, _)| !previous.get(*variant).is_some_and(|m| m.contains_key(POLICY_ANSWERS_429)))
        .filter_map(|(variant, metrics)| {
            let answers = metrics.get(POLICY_ANSWERS_429).copied().filter(|n| *n > 0.0)?;
            let note = format!(
                "variant {variant}: the policy endpoint answered 429 (too many requests) {answers} times; its \
                 sandboxes sent fewer requests at once and started no episode while one waited, so no episode was \
                 lost to it, but the waits are in the episodes' resolution_time: fewer shards at once \
                 (spec.parallelism) or a higher limit at the provider keeps them out"
            );
            Some((variant.clone(), Transition { warning: false, reason: POLICY_RATE_LIMITED.into(), note }))
        })
        .collect()
}

/// Writes the status by server-side apply on the status subresource.
pub async fn write(client: &Client, task: &HarnessTask, status: &HarnessTaskStatus) -> Result<(), StatusError> {
    let namespace = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let api: Api<HarnessTask> = Api::namespaced(client.clone(), &namespace);
    let patch = serde_json::json!({
        "apiVersion": basecamp_api::API_VERSION,
        "kind": "HarnessTask",
        "status": status,
    });
    api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await
        .map(|_| ())
        .map_err(|source| StatusError::Patch { namespace, name, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::JobStatus;

    fn time(seconds: i64) -> Time {
        Time(jiff::Timestamp::from_second(seconds).expect("time"))
    }

    #[test]
    fn last_transition_time_moves_only_when_the_status_changes() {
        let first = conditions(&[], &[Decided::new("Ready", true, "Resolved", "ok")], Some(1), &time(100));
        let same = conditions(&first, &[Decided::new("Ready", true, "Resolved", "still ok")], Some(2), &time(200));
        assert_eq!(same[0].last_transition_time, time(100));
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = conditions(&same, &[Decided::new("Ready", false, "UnknownSandbox", "x")], Some(2), &time(300));
        assert_eq!(flipped[0].last_transition_time, time(300));
    }

    #[test]
    fn trace_destinations_keep_every_s3_destination_the_task_had() {
        let mut task: HarnessTask = serde_json::from_value(serde_json::json!({
            "apiVersion": "basecamp.dev/v1alpha1", "kind": "HarnessTask", "metadata": {"name": "t"},
            "spec": {"traces": {"destination": "s3://b/new"}, "taskDefinition": {"successCriteria": []},
                     "evaluation": {"testSet": "s3://b/tests.jsonl"}, "sandboxRef": {"name": "s"},
                     "policy": {"endpoint": "http://p:8000/v1", "model": "m"}},
        }))
        .expect("task");
        let old = vec!["s3://b/old".to_string()];
        assert_eq!(trace_destinations(&old, &task), ["s3://b/old", "s3://b/new"]);
        let both = vec!["s3://b/old".to_string(), "s3://b/new".to_string()];
        assert_eq!(trace_destinations(&both, &task), both, "each once");
        task.spec.traces.as_mut().expect("traces").destination = Some("/var/traces".into());
        assert_eq!(trace_destinations(&old, &task), old, "a directory is not deleted by retention");
    }

    /// Episodes the policy's server failed make the finished task Degraded
    /// (a fact of the run: no retry is due), naming the variant and the
    /// count, and Failed though its criteria are met over the measured
    /// episodes (a gate on Succeeded passed a run whose server was down).
    #[test]
    fn episodes_not_measured_degrade_a_finished_task_for_good() {
        let task: HarnessTask = serde_json::from_value(serde_json::json!({
            "apiVersion": "basecamp.dev/v1alpha1", "kind": "HarnessTask", "metadata": {"name": "t", "generation": 1},
            "spec": {"taskDefinition": {"successCriteria": []}, "evaluation": {"testSet": "s3://b/tests.jsonl"},
                     "sandboxRef": {"name": "s"}, "policy": {"endpoint": "http://p:8000/v1", "model": "m"}},
        }))
        .expect("task");
        let metrics = |not_measured: f64| {
            let variant: BTreeMap<String, f64> =
                [("episodes".to_string(), 60.0), (NOT_MEASURED_EPISODES.to_string(), not_measured)].into();
            BTreeMap::from([("default".to_string(), variant)])
        };
        let observed = |not_measured| Observed {
            task: &task,
            shards: vec![("default".into(), ShardCounts { total: 1, succeeded: 1, failed: 0, running: 0 })],
            job_templates: BTreeMap::new(),
            capacity_problem: None,
            suspended: false,
            warnings: Vec::new(),
            aggregated: AggregatedStatus { metrics: metrics(not_measured), complete: true, ..Default::default() },
            report_url: None,
            training: None,
            shard_failure: None,
            now: time(1),
        };
        let status = compute(&observed(12.0));
        let degraded = status.conditions.iter().find(|c| c.type_ == condition_types::DEGRADED).expect("Degraded");
        assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", EPISODES_NOT_MEASURED));
        assert!(
            degraded.message.starts_with("variant default: 12 of 60 episodes not measured"),
            "{}",
            degraded.message
        );
        assert!(!degraded_by_a_retryable_error(&status), "the run's fact, not an error a retry clears");
        // No criterion, so all are met: over the measured episodes; that passes no run whose server failed.
        assert_eq!(status.phase, Some(TaskPhase::Failed));
        let failed = status.conditions.iter().find(|c| c.type_ == condition_types::FAILED).expect("Failed");
        assert_eq!((failed.status.as_str(), failed.reason.as_str()), ("True", EPISODES_NOT_MEASURED));
        assert!(failed.message.starts_with("the criteria are met over the measured episodes, but variant default: 12"));

        let clean = compute(&observed(0.0));
        let degraded = clean.conditions.iter().find(|c| c.type_ == condition_types::DEGRADED).expect("Degraded");
        assert_eq!(degraded.status, "False");
        assert_eq!(clean.phase, Some(TaskPhase::Succeeded));

        // A criterion on not_measured_rate is the tolerance: within it the
        // criteria decide; beyond it the task is Degraded as before.
        let with_tolerance = |met: bool| {
            let mut o = observed(12.0);
            o.aggregated.criteria = vec![
                CriterionResult {
                    variant: "default".into(),
                    criterion: "tool_call_accuracy >= 0.9".into(),
                    met: true,
                    observed: Some(0.95),
                    message: None,
                },
                CriterionResult {
                    variant: "default".into(),
                    criterion: "not_measured_rate <= 25%".into(),
                    met,
                    observed: Some(0.2),
                    message: None,
                },
            ];
            compute(&o)
        };
        let tolerated = with_tolerance(true);
        assert_eq!(tolerated.phase, Some(TaskPhase::Succeeded), "{:?}", tolerated.conditions);
        let degraded = tolerated.conditions.iter().find(|c| c.type_ == condition_types::DEGRADED).expect("Degraded");
        assert_eq!(degraded.status, "False", "within the tolerance the user wrote: {}", degraded.message);
        let beyond = with_tolerance(false);
        assert_eq!(beyond.phase, Some(TaskPhase::Failed));
        let degraded = beyond.conditions.iter().find(|c| c.type_ == condition_types::DEGRADED).expect("Degraded");
        assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", EPISODES_NOT_MEASURED));
        assert!(
            degraded.message.starts_with(
                "variant default: 12 of 60 episodes (more than `not_measured_rate <= 25%` allows) not measured"
            ),
            "{}",
            degraded.message
        );
    }

    fn sandbox_pod(variant: &str, shard: u32, exit: i32, finished: &str, message: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("t-{variant}-{shard}-{finished}"),
                         "labels": {"basecamp.dev/variant": variant},
                         "annotations": {"batch.kubernetes.io/job-completion-index": shard.to_string()}},
            "status": {
                "phase": if exit == 0 { "Succeeded" } else { "Failed" },
                "initContainerStatuses": [{"name": "policy-server", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                    "state": {"terminated": {"exitCode": 143, "reason": "Error", "finishedAt": "2026-12-07T10:59:00Z"}}}],
                "containerStatuses": [{"name": "sandbox", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                    "state": {"terminated": {"exitCode": exit, "reason": "Error", "finishedAt": finished, "message": message}}}],
            },
        }))
        .expect("a pod")
    }

    /// The ShardFailed condition quotes what the last failed sandbox said
    /// (its last `error` line), not a sidecar stopped at the pod's end;
    /// before, it said "see the Jobs' pods" and a user had to find them.
    #[test]
    fn a_failed_shard_is_named_with_what_its_sandbox_said() {
        let gave_up = "episode ship-001: ok\nerror: gave up: 16 episodes in a row were ended by the policy's server or \
                       a service; 14 episodes not started (summary.json's gave_up lists them); exit 4\nuploaded 24 files";
        let pods = [
            sandbox_pod("a", 0, 0, "2026-12-07T11:00:00Z", None),
            sandbox_pod("b", 0, 1, "2026-12-07T10:00:00Z", Some("error: GPU arch not supported")),
            sandbox_pod("b", 1, 4, "2026-12-07T10:30:00Z", Some(gave_up)),
        ];
        let said = shard_failure(&pods).expect("a failure");
        assert_eq!(
            said,
            "variant b, shard 1: the sandbox exited with code 4: error: gave up: 16 episodes in a row were ended by \
             the policy's server or a service; 14 episodes not started (summary.json's gave_up lists them); exit 4"
        );
        assert_eq!(
            shard_failure(&[sandbox_pod("a", 2, 137, "2026-12-07T10:00:00Z", None)]).as_deref(),
            Some("variant a, shard 2: the sandbox exited with code 137: Error"),
            "no message: the kubelet's reason"
        );
        assert_eq!(shard_failure(&pods[..1]), None, "the sidecar's 143 is not the shard's failure");
        let long = "x".repeat(2_000);
        let quoted = shard_failure(&[sandbox_pod("a", 0, 1, "2026-12-07T10:00:00Z", Some(&long))]).unwrap();
        assert!(quoted.ends_with("...") && quoted.len() < 700, "{}", quoted.len());
    }

    #[test]
    fn indexes_and_shard_counts_come_from_the_job() {
        assert_eq!(parse_indexes(Some("0,2-4,7")), [0, 2, 3, 4, 7]);
        assert_eq!(parse_indexes(None), Vec::<u32>::new());
        let job = Job {
            status: Some(JobStatus {
                completed_indexes: Some("0-1".into()),
                failed_indexes: Some("3".into()),
                active: Some(1),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(shard_counts(&job, 4), ShardCounts { total: 4, succeeded: 2, failed: 1, running: 1 });
    }

    #[test]
    fn a_fixed_spec_reports_failed_cleared_but_not_a_quiet_reason_change() {
        let now = time(1);
        let invalid = conditions(
            &[],
            &[
                Decided::new("Succeeded", false, "UnknownSandbox", ""),
                Decided::new("Failed", true, "UnknownSandbox", "x"),
            ],
            None,
            &now,
        );
        let fixed = conditions(
            &invalid,
            &[Decided::new("Succeeded", false, "NotFinished", ""), Decided::new("Failed", false, "AsExpected", "")],
            None,
            &now,
        );
        let events = transitions(&invalid, &fixed);
        assert_eq!(events, [Transition { warning: false, reason: "AsExpected".into(), note: "Failed=False".into() }]);
    }

    #[test]
    fn conditions_sharing_a_reason_make_one_warning_event() {
        let now = time(1);
        let failed = conditions(
            &[],
            &[
                Decided::new("Succeeded", false, "ShardsFailed", ""),
                Decided::new("Failed", true, "ShardsFailed", "1 of 1 shards failed"),
            ],
            None,
            &now,
        );
        let events = transitions(&[], &failed);
        assert_eq!(
            events,
            [Transition {
                warning: true,
                reason: "ShardsFailed".into(),
                note: "Failed=True: 1 of 1 shards failed".into()
            }]
        );
    }

    #[test]
    fn the_report_url_points_at_basecamp_serve() {
        assert_eq!(
            report_url(Some("https://basecamp.example.com/"), "team-a", "eval").as_deref(),
            Some("https://basecamp.example.com/tasks/team-a/eval")
        );
        assert_eq!(report_url(None, "team-a", "eval"), None);
        assert_eq!(report_url(Some(" "), "team-a", "eval"), None);
    }

    #[test]
    fn running_shards_are_ready_pods_not_pods_waiting_for_a_node() {
        let job = Job {
            status: Some(JobStatus { active: Some(2), ready: Some(0), ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(shard_counts(&job, 2), ShardCounts { total: 2, succeeded: 0, failed: 0, running: 0 });
    }

    #[test]
    fn a_variant_s_first_429s_make_one_normal_event() {
        let metrics = |pairs: &[(&str, Option<f64>)]| -> BTreeMap<String, BTreeMap<String, f64>> {
            pairs
                .iter()
                .map(|(variant, answers)| {
                    let mut m = BTreeMap::from([("episodes".to_string(), 10.0)]);
                    if let Some(n) = answers {
                        m.insert(POLICY_ANSWERS_429.into(), *n);
                    }
                    (variant.to_string(), m)
                })
                .collect()
        };
        let before = metrics(&[("a", None), ("b", None)]);
        let after = metrics(&[("a", None), ("b", Some(17.0))]);
        let events = rate_limited(&before, &after);
        assert_eq!(events.len(), 1, "{events:?}");
        let (variant, event) = &events[0];
        assert_eq!((variant.as_str(), event.reason.as_str(), event.warning), ("b", POLICY_RATE_LIMITED, false));
        assert!(event.note.contains("variant b: the policy endpoint answered 429 (too many requests) 17 times"));
        assert!(event.note.contains("spec.parallelism"), "{}", event.note);
        // Once a variant: more 429s later are in the metric, not a new Event.
        assert!(rate_limited(&after, &metrics(&[("a", None), ("b", Some(40.0))])).is_empty());
        assert!(rate_limited(&BTreeMap::new(), &before).is_empty(), "no 429s, no Event");
    }

    #[test]
    fn transitions_report_changes_and_skip_quiet_initial_conditions() {
        let now = time(1);
        let first = conditions(
            &[],
            &[Decided::new("Ready", true, "Resolved", ""), Decided::new("Degraded", false, "AsExpected", "")],
            None,
            &now,
        );
        let events = transitions(&[], &first);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, "Resolved");
        assert!(!events[0].warning);
        let later = conditions(
            &first,
            &[Decided::new("Ready", true, "Resolved", ""), Decided::new("Degraded", true, "S3Unavailable", "down")],
            None,
            &now,
        );
        let events = transitions(&first, &later);
        assert_eq!(
            events,
            [Transition { warning: true, reason: "S3Unavailable".into(), note: "Degraded=True: down".into() }]
        );
        assert!(transitions(&later, &later).is_empty());
    }
}
