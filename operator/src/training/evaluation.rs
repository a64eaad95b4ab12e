//! Checkpoint evaluations (TRAINING.md, "Checkpoint evaluations"): one
//! Indexed Job per (step, variant) — the variant's sandbox Job from
//! [`crate::build::job`] with the checkpoint under test — and, once every
//! shard of every variant of a step finished, the step's result.

use std::collections::{BTreeMap, BTreeSet};

use basecamp_api::task::{CheckpointEvaluation, ShardCounts, TaskPhase, checkpoint_run_name};
use basecamp_trace::metrics::NOT_MEASURED_EPISODES;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use crate::build::job::{CheckpointUnderTest, job_for};
use crate::build::names::{CHECKPOINT_ANNOTATION, ROLE_EVALUATION, ROLE_LABEL, STEP_LABEL, TASK_LABEL, VARIANT_LABEL};
use crate::build::{BuildError, BuildInput};
use crate::controller::status::{self, AggregatedStatus};

/// The label selector of a task's evaluation Jobs.
pub fn selector(task: &str) -> String {
    format!("{TASK_LABEL}={},{ROLE_LABEL}={ROLE_EVALUATION}", crate::build::names::label_value(task))
}

/// Whether `job` is one of `task`'s evaluation Jobs (what [`selector`] selects).
pub fn is_evaluation_of(job: &Job, task: &str) -> bool {
    let labels = job.labels();
    labels.get(ROLE_LABEL).is_some_and(|role| role == ROLE_EVALUATION)
        && labels.get(TASK_LABEL).is_some_and(|t| *t == crate::build::names::label_value(task))
}

/// The evaluation Jobs of one step, one per variant in variant order.
pub fn evaluation_jobs(input: &BuildInput<'_>, checkpoint: &CheckpointUnderTest) -> Result<Vec<Job>, BuildError> {
    input.variants.iter().map(|variant| job_for(input, variant, Some(checkpoint))).collect()
}

/// A task's evaluation Jobs by step, then by variant (from their labels).
pub fn by_step(jobs: Vec<Job>) -> BTreeMap<u64, BTreeMap<String, Job>> {
    let mut steps: BTreeMap<u64, BTreeMap<String, Job>> = BTreeMap::new();
    for job in jobs {
        let labels = job.labels();
        let (Some(step), Some(variant)) =
            (labels.get(STEP_LABEL).and_then(|s| s.parse::<u64>().ok()), labels.get(VARIANT_LABEL).cloned())
        else {
            continue;
        };
        steps.entry(step).or_default().insert(variant, job);
    }
    steps
}

fn has_condition(job: &Job, type_: &str) -> bool {
    job.status.iter().flat_map(|s| s.conditions.iter().flatten()).any(|c| c.type_ == type_ && c.status == "True")
}

/// Whether every shard of this Job finished (or the Job as a whole did).
pub fn finished(job: &Job, shards: u32) -> bool {
    has_condition(job, "Complete")
        || has_condition(job, "Failed")
        || status::shard_counts(job, shards).finished() >= shards.max(1)
}

/// Whether a step's evaluation finished: a Job for every variant, each finished.
pub fn step_finished(jobs: &BTreeMap<String, Job>, variants: &[String], shards: u32) -> bool {
    variants.iter().all(|v| jobs.get(v).is_some_and(|job| finished(job, shards)))
}

/// Shard counts of a step's Jobs by variant.
pub fn step_shards(jobs: &BTreeMap<String, Job>, shards: u32) -> BTreeMap<String, ShardCounts> {
    jobs.iter().map(|(v, job)| (v.clone(), status::shard_counts(job, shards))).collect()
}

/// Succeeded shard indexes by variant, for the aggregation.
pub fn completed_indexes(jobs: &BTreeMap<String, Job>) -> BTreeMap<String, BTreeSet<u32>> {
    jobs.iter()
        .map(|(v, job)| {
            let done = status::parse_indexes(job.status.as_ref().and_then(|s| s.completed_indexes.as_deref()));
            (v.clone(), done.into_iter().collect::<BTreeSet<u32>>())
        })
        .filter(|(_, indexes)| !indexes.is_empty())
        .collect()
}

/// When the step's last Job finished (RFC 3339).
pub fn finished_at(jobs: &BTreeMap<String, Job>) -> Option<String> {
    jobs.values()
        .filter_map(|job| {
            let status = job.status.as_ref()?;
            status.completion_time.as_ref().map(|t| t.0).or_else(|| {
                status
                    .conditions
                    .iter()
                    .flatten()
                    .find(|c| c.type_ == "Failed")
                    .and_then(|c| c.last_transition_time.as_ref())
                    .map(|t| t.0)
            })
        })
        .max()
        .map(|t| t.to_string())
}

/// The checkpoint a step's Jobs evaluate (their annotation).
pub fn checkpoint_of(jobs: &BTreeMap<String, Job>) -> Option<String> {
    jobs.values().find_map(|job| job.annotations().get(CHECKPOINT_ANNOTATION).cloned())
}

/// What is known of a finished step besides its aggregation.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedStep {
    /// The step.
    pub step: u64,
    /// `C/step-N/`.
    pub checkpoint: String,
    /// Whether any shard failed.
    pub any_failed: bool,
    /// When its last shard finished.
    pub finished_at: Option<String>,
}

/// The step's evaluation from its aggregation (which must be complete).
pub fn evaluation(
    finished: &FinishedStep,
    aggregated: &AggregatedStatus,
    report_base_url: Option<&str>,
    namespace: &str,
    task: &str,
) -> CheckpointEvaluation {
    let criteria_met = (!aggregated.criteria.is_empty()).then(|| aggregated.criteria.iter().all(|c| c.met));
    CheckpointEvaluation {
        step: finished.step,
        checkpoint: finished.checkpoint.clone(),
        phase: if finished.any_failed { TaskPhase::Failed } else { TaskPhase::Succeeded },
        metrics: aggregated.metrics.clone(),
        criteria_met,
        report_url: status::report_url(report_base_url, namespace, &checkpoint_run_name(task, finished.step)),
        finished_at: finished.finished_at.clone(),
    }
}

/// The Event's note: the step, its phase and tool_call_accuracy by variant.
pub fn evaluated_note(evaluation: &CheckpointEvaluation) -> String {
    let accuracy: Vec<String> = evaluation
        .metrics
        .iter()
        .filter_map(|(variant, m)| m.get("tool_call_accuracy").map(|a| format!("{variant}={a:.3}")))
        .collect();
    let accuracy = if accuracy.is_empty() { "no data".to_string() } else { accuracy.join(" ") };
    let mut note = format!(
        "checkpoint step {} evaluated ({}): tool_call_accuracy {accuracy}",
        evaluation.step,
        evaluation.phase.as_str()
    );
    if let Some(met) = evaluation.criteria_met {
        note.push_str(if met { "; criteria met" } else { "; criteria not met" });
    }
    // The accuracy rests on fewer episodes than ran: said, not hidden.
    let not_measured: f64 = evaluation.metrics.values().filter_map(|m| m.get(NOT_MEASURED_EPISODES)).sum();
    if not_measured > 0.0 {
        note.push_str(&format!(
            "; {not_measured} episode(s) NOT MEASURED (the policy or a service failed; left out of the accuracy)"
        ));
    }
    if let Some(url) = &evaluation.report_url {
        note.push_str(&format!("; report {url}"));
    }
    note
}
