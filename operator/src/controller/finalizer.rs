//! The finalizer `basecamp.dev/traces`: added to every task, so that on
//! deletion the operator applies `spec.traces.retention` before the task
//! disappears — `Retain` (the default) keeps the traces, `Delete` removes
//! every object under the task's date partitions (every day from its
//! creation to today) and its reports prefix, and for a task that trains
//! those of its checkpoint-evaluation runs `<task>@step-N` too (found by
//! listing the directories of each day's namespace partition and of the
//! namespace's reports).
//! `Delete` first stops the task's pods (deletes its Jobs) and waits for
//! them to end: a pod stopped by SIGTERM uploads its partial trace, and an
//! upload after the deletion would be left behind. A pod still not gone a
//! minute past its grace period is not waited for any longer (the Event says
//! so). The prefixes are removed under every S3 destination the task's Jobs
//! were given (`status.traceDestinations`: an edit of `traces.destination`
//! leaves the earlier traces where they were written).
//! If S3 cannot be reached the finalizer stays and deletion is retried
//! (with an Event saying why), so traces are never half-deleted silently.
//! Then the task's metric series are removed and the finalizer released.

use basecamp_api::HarnessTask;
use basecamp_api::task::Retention;
use basecamp_sandbox::storage::{Destination, Storage, StorageError, UtcDate};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PropagationPolicy};
use kube::{Client, ResourceExt};

use crate::build::names::{TASK_LABEL, label_value};
use crate::metrics::Metrics;

/// The finalizer's name.
pub const FINALIZER: &str = "basecamp.dev/traces";

/// Why the finalizer could not be added or run.
#[derive(Debug, thiserror::Error)]
pub enum FinalizerError {
    /// Patching the task's finalizers failed.
    #[error("failed to {action} the finalizer {FINALIZER} on HarnessTask {namespace}/{name}: {source}")]
    Patch {
        /// `add` or `remove`.
        action: &'static str,
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The cause.
        source: kube::Error,
    },
    /// Stopping the task's pods before its traces are deleted failed.
    #[error(
        "retention Delete: failed to {action} of HarnessTask {namespace}/{name} before deleting its traces: {source}; \
         the task is kept until they are deleted"
    )]
    StopPods {
        /// What failed, e.g. `list the pods`.
        action: &'static str,
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The cause.
        source: kube::Error,
    },
    /// Deleting the traces failed; the task stays until it succeeds.
    #[error(
        "retention Delete: failed to delete the traces under {prefix}: {source}; the task is kept until they are deleted"
    )]
    DeleteTraces {
        /// The prefix.
        prefix: String,
        /// The cause.
        source: StorageError,
    },
}

impl FinalizerError {
    /// A fixed name for this kind of error.
    pub fn category(&self) -> &'static str {
        match self {
            FinalizerError::Patch { source, .. } => match super::api_error::category(source) {
                "Conflict" => "FinalizerConflict",
                "ApiUnreachable" => "ApiUnreachable",
                _ => "FinalizerPatchFailed",
            },
            FinalizerError::StopPods { source, .. } => match super::api_error::category(source) {
                "ApiUnreachable" => "ApiUnreachable",
                _ => "StopPodsFailed",
            },
            FinalizerError::DeleteTraces { source, .. } if source.is_retryable() => "S3Unavailable",
            FinalizerError::DeleteTraces { .. } => "TraceDeletionFailed",
        }
    }
}

/// Whether the task carries the finalizer.
pub fn has_finalizer(task: &HarnessTask) -> bool {
    task.finalizers().iter().any(|f| f == FINALIZER)
}

async fn set_finalizers(
    client: &Client,
    task: &HarnessTask,
    finalizers: Vec<String>,
    action: &'static str,
) -> Result<(), FinalizerError> {
    let namespace = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let api: Api<HarnessTask> = Api::namespaced(client.clone(), &namespace);
    // The resourceVersion makes this a compare-and-swap: a concurrent change
    // of the list answers 409 and the reconcile retries with fresh data.
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": task.resource_version()}
    });
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| FinalizerError::Patch { action, namespace, name, source })
}

/// Adds the finalizer when it is missing.
pub async fn ensure(client: &Client, task: &HarnessTask) -> Result<bool, FinalizerError> {
    if has_finalizer(task) {
        return Ok(false);
    }
    let mut finalizers = task.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    set_finalizers(client, task, finalizers, "add").await?;
    Ok(true)
}

/// The prefixes `Delete` removes of the run named `task`: every day from
/// the task's creation to `today` (all of them, not the aggregation's
/// window: the oldest days hold the first runs' traces) and the reports prefix.
pub fn task_prefixes(
    destination: &Destination,
    namespace: &str,
    task: &str,
    created: UtcDate,
    today: UtcDate,
) -> Vec<Destination> {
    let mut prefixes: Vec<Destination> =
        super::aggregate::namespace_day_prefixes(destination, namespace, (created, today))
            .into_iter()
            .filter_map(|day| day.join(task).ok())
            .collect();
    prefixes.extend(super::aggregate::reports_prefix(destination, namespace, task).ok());
    prefixes
}

/// Whether the directory `name` is a checkpoint-evaluation run of `task` (`<task>@step-N`).
fn is_step_run(name: &str, task: &str) -> bool {
    name.strip_prefix(task)
        .and_then(|rest| rest.strip_prefix('@'))
        .is_some_and(|step| basecamp_api::task::parse_checkpoint_step(step).is_some())
}

/// The prefixes of `task`'s checkpoint-evaluation runs: the `<task>@step-N`
/// directories of each day's namespace partition and of the namespace's
/// reports (one listing with delimiter `/` each), and how many runs they hold.
async fn step_run_prefixes(
    storage: &Storage,
    metrics: &Metrics,
    destination: &Destination,
    namespace: &str,
    task: &str,
    created: UtcDate,
    today: UtcDate,
) -> Result<(Vec<Destination>, usize), FinalizerError> {
    let mut parents = super::aggregate::namespace_day_prefixes(destination, namespace, (created, today));
    parents.extend(super::aggregate::namespace_reports_prefix(destination, namespace).ok());
    let mut prefixes = Vec::new();
    let mut runs = std::collections::BTreeSet::new();
    for parent in parents {
        let listed = super::aggregate::timed(metrics, "list", storage.list_dirs(&parent))
            .await
            .map_err(|source| FinalizerError::DeleteTraces { prefix: parent.to_string(), source })?;
        for name in listed.into_iter().filter(|name| is_step_run(name, task)) {
            prefixes.extend(parent.join(&name).ok());
            runs.insert(name);
        }
    }
    Ok((prefixes, runs.len()))
}

/// What the clean-up did, for the Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cleanup {
    /// Retention Retain (or nothing in S3 to delete).
    Retained(String),
    /// The task's pods are stopping; the traces are deleted once they are gone.
    Waiting(String),
    /// Objects deleted.
    Deleted(u64, String),
}

/// How long past their grace period the pods are waited for.
const STOP_MARGIN_SECONDS: i64 = 60;

/// Where stopping the task's pods stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stopping {
    /// No pod of the task runs.
    Stopped,
    /// Some still run (message for the Event).
    Waiting(String),
    /// Some still run past the deadline, or cannot be read: go on (what to add to the note).
    GaveUp(String),
}

/// Whether a pod has not ended (its phase is not Succeeded or Failed).
fn is_running(pod: &Pod) -> bool {
    !matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Until when the running `pods` are waited for: the task's deletion plus
/// the longest grace period among them (Kubernetes' default 30 s) and a minute.
fn stop_deadline(deleted_at_seconds: i64, pods: &[&Pod]) -> i64 {
    let grace = pods
        .iter()
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
        .max()
        .unwrap_or(30);
    deleted_at_seconds.saturating_add(grace).saturating_add(STOP_MARGIN_SECONDS)
}

/// What to do about the task's `pods` that still run, at `now` (seconds).
fn stopping(pods: &[Pod], deleted_at_seconds: i64, now: i64) -> Stopping {
    let running: Vec<&Pod> = pods.iter().filter(|p| is_running(p)).collect();
    if running.is_empty() {
        return Stopping::Stopped;
    }
    let deadline = stop_deadline(deleted_at_seconds, &running);
    let names = running.iter().take(5).map(|p| p.name_any()).collect::<Vec<_>>().join(", ");
    let more = if running.len() > 5 { format!(" and {} more", running.len() - 5) } else { String::new() };
    if now < deadline {
        Stopping::Waiting(format!(
            "retention Delete: waiting for {} pods of the task to stop ({names}{more}): a pod stopping uploads its \
             partial trace, so the traces are deleted once they are gone (at the latest {}s from now)",
            running.len(),
            deadline - now
        ))
    } else {
        Stopping::GaveUp(format!(
            "; {} pods had still not stopped {}s past their grace period ({names}{more}): a trace they upload after \
             this is not deleted",
            running.len(),
            STOP_MARGIN_SECONDS
        ))
    }
}

/// Deletes the task's sandbox Jobs (their pods get SIGTERM and upload what
/// they have) and says whether its pods have stopped.
async fn stop_pods(client: &Client, task: &HarnessTask, now: i64) -> Result<Stopping, FinalizerError> {
    let namespace = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let err = |action| {
        let (namespace, name) = (namespace.clone(), name.clone());
        move |source| FinalizerError::StopPods { action, namespace, name, source }
    };
    let selector = format!("{TASK_LABEL}={}", label_value(&name));
    let uid = task.uid().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    let listed = jobs.list(&ListParams::default().labels(&selector)).await.map_err(err("list the Jobs"))?;
    let background = DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
    for job in listed.items.iter().filter(|job| {
        job.metadata.deletion_timestamp.is_none()
            && job.owner_references().iter().any(|o| o.controller == Some(true) && o.uid == uid)
    }) {
        match jobs.delete(&job.name_any(), &background).await {
            Ok(_) => {}
            Err(error) if super::api_error::is_not_found(&error) => {}
            Err(error) => return Err(err("delete the Jobs")(error)),
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let pods = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(status)) if status.is_forbidden() => {
            return Ok(Stopping::GaveUp(
                "; the operator may not list pods, so it did not wait for the task's pods to stop (grant get/list \
                 on pods: operator/RBAC.md)"
                    .into(),
            ));
        }
        Err(error) => return Err(err("list the pods")(error)),
    };
    let deleted_at = task.metadata.deletion_timestamp.as_ref().map_or(now, |t| t.0.as_second());
    Ok(stopping(&pods, deleted_at, now))
}

/// The S3 destinations the task's traces went to: each one its Jobs were
/// given (`status.traceDestinations`) and the spec's.
pub fn trace_destinations(task: &HarnessTask) -> Vec<Destination> {
    let spec = task.spec.traces.as_ref().and_then(|t| t.destination.as_deref());
    let earlier = task.status.iter().flat_map(|s| s.trace_destinations.iter().map(String::as_str));
    let mut destinations: Vec<Destination> = Vec::new();
    for destination in earlier.chain(spec).filter_map(|d| Destination::parse(d).ok()).filter(Destination::is_s3) {
        if !destinations.contains(&destination) {
            destinations.push(destination);
        }
    }
    destinations
}

/// Applies the retention policy, forgets the task's metrics and releases the finalizer.
pub async fn cleanup(
    client: &Client,
    storage: &Storage,
    metrics: &Metrics,
    task: &HarnessTask,
    today: UtcDate,
) -> Result<Option<Cleanup>, FinalizerError> {
    if !has_finalizer(task) {
        return Ok(None);
    }
    let namespace = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let traces = task.spec.traces.clone().unwrap_or_default();
    let destinations = trace_destinations(task);
    let outcome = match traces.retention.unwrap_or_default() {
        Retention::Delete if !destinations.is_empty() => {
            let now = jiff::Timestamp::now().as_second();
            let gave_up = match stop_pods(client, task, now).await? {
                Stopping::Waiting(note) => return Ok(Some(Cleanup::Waiting(note))),
                Stopping::GaveUp(note) => note,
                Stopping::Stopped => String::new(),
            };
            let created = task
                .creation_timestamp()
                .and_then(|t| UtcDate::from_unix_seconds(t.0.as_second()).ok())
                .unwrap_or(today);
            let trains =
                task.spec.training_config.is_some() || task.status.as_ref().is_some_and(|s| s.training.is_some());
            let mut prefixes = Vec::new();
            let mut step_runs = 0;
            for destination in &destinations {
                prefixes.extend(task_prefixes(destination, &namespace, &name, created, today));
                if trains {
                    let (runs, count) =
                        step_run_prefixes(storage, metrics, destination, &namespace, &name, created, today).await?;
                    step_runs += count;
                    prefixes.extend(runs);
                }
            }
            let mut deleted = 0;
            for prefix in prefixes {
                let started = std::time::Instant::now();
                let result = storage.delete_prefix(&prefix).await;
                metrics.observe_s3("delete", started.elapsed(), result.is_err());
                deleted +=
                    result.map_err(|source| FinalizerError::DeleteTraces { prefix: prefix.to_string(), source })?;
            }
            let included = if step_runs == 0 {
                String::new()
            } else {
                format!(", {step_runs} checkpoint-evaluation runs (<task>@step-N) included")
            };
            let under = destinations.iter().map(ToString::to_string).collect::<Vec<_>>().join(" and ");
            Cleanup::Deleted(
                deleted,
                format!("retention Delete: deleted {deleted} objects of the task under {under}{included}{gave_up}"),
            )
        }
        Retention::Delete => {
            Cleanup::Retained("retention Delete, but the destination is not in S3: nothing to delete".into())
        }
        Retention::Retain => Cleanup::Retained(format!(
            "retention Retain: the traces stay in {}",
            traces.destination.as_deref().unwrap_or("the trace destination")
        )),
    };
    metrics.forget_task(&namespace, &name);
    let remaining: Vec<String> = task.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    set_finalizers(client, task, remaining, "remove").await?;
    Ok(Some(outcome))
}
