//! The finalizer `basecamp.dev/traces`: added to every task, so that on
//! deletion the operator applies `spec.traces.retention` before the task
//! disappears — `Retain` (the default) keeps the traces, `Delete` removes
//! every object under the task's date partitions (every day from its
//! creation to today) and its reports prefix, and for a task that trains
//! those of its checkpoint-evaluation runs `<task>@step-N` too (found by
//! listing the directories of each day's namespace partition and of the
//! namespace's reports).
//! If S3 cannot be reached the finalizer stays and deletion is retried
//! (with an Event saying why), so traces are never half-deleted silently.
//! Then the task's metric series are removed and the finalizer released.

use basecamp_api::HarnessTask;
use basecamp_api::task::Retention;
use basecamp_sandbox::storage::{Destination, Storage, StorageError, UtcDate};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

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
    /// Objects deleted.
    Deleted(u64, String),
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
    let destination = traces.destination.as_deref().and_then(|d| Destination::parse(d).ok()).filter(Destination::is_s3);
    let outcome = match (traces.retention.unwrap_or_default(), destination) {
        (Retention::Delete, Some(destination)) => {
            let created = task
                .creation_timestamp()
                .and_then(|t| UtcDate::from_unix_seconds(t.0.as_second()).ok())
                .unwrap_or(today);
            let mut prefixes = task_prefixes(&destination, &namespace, &name, created, today);
            let trains =
                task.spec.training_config.is_some() || task.status.as_ref().is_some_and(|s| s.training.is_some());
            let mut step_runs = 0;
            if trains {
                let (runs, count) =
                    step_run_prefixes(storage, metrics, &destination, &namespace, &name, created, today).await?;
                step_runs = count;
                prefixes.extend(runs);
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
            Cleanup::Deleted(
                deleted,
                format!("retention Delete: deleted {deleted} objects of the task under {destination}{included}"),
            )
        }
        (Retention::Delete, None) => {
            Cleanup::Retained("retention Delete, but the destination is not in S3: nothing to delete".into())
        }
        (Retention::Retain, _) => Cleanup::Retained(format!(
            "retention Retain: the traces stay in {}",
            traces.destination.as_deref().unwrap_or("the trace destination")
        )),
    };
    metrics.forget_task(&namespace, &name);
    let remaining: Vec<String> = task.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    set_finalizers(client, task, remaining, "remove").await?;
    Ok(Some(outcome))
}
