//! The HarnessTask controller. Each reconcile is a short pipeline:
//!
//! ```text
//! dereference -> validate -> build -> apply -> aggregate -> update_status
//! ```
//!
//! - [`dereference`]: read the SandboxConfigs (and nodes) the task refers to;
//! - [`cache`]: the watched objects' copies, so that a reconcile with
//!   nothing to change reads and writes nothing;
//! - [`validate`]: the shared checks plus the cluster's (pure);
//! - [`crate::build`]: the desired ConfigMap, Jobs, NetworkPolicy (pure);
//! - [`apply`]: server-side apply (field manager `basecamp-operator`);
//! - [`capacity`]: does any node satisfy the GPU requirement (pure);
//! - [`aggregate`]: finished shards' summaries from S3 into metrics,
//!   criteria, deltas, `index.json` and `comparison.json`;
//! - [`status`]: phase and conditions (pure), written by SSA on `/status`;
//! - [`crate::training`]: for a task that trains, the trainer Job and the
//!   checkpoint evaluations (after `apply`, before `update_status`);
//! - [`finalizer`]: trace retention on deletion.
//!
//! Every failure is an error value with a bounded `category()`: it becomes
//! an Event (reason = category), a metric label, and a requeue with backoff.
//! An invalid spec is not an error of the operator: it becomes a Ready=False
//! condition and an Event saying what to fix, and the task waits for a change.
//! So does a Job name that another owner's Job holds (`JobNameTaken`), and an
//! object of the task that the API server refuses as invalid (`ApplyInvalid`). A task
//! that finished keeps its results when a SandboxConfig it names is deleted.

pub mod aggregate;
pub mod api_error;
pub mod apply;
pub mod cache;
pub mod capacity;
pub mod dereference;
pub mod finalizer;
pub mod status;
pub mod validate;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use basecamp_api::task::{HarnessTaskStatus, ShardCounts};
use basecamp_api::{HarnessTask, SandboxConfig};
use basecamp_sandbox::storage::{Destination, Storage, UtcDate};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};

use crate::build::network_policy::{self, ServiceRef};
use crate::build::{self, BuildError, BuildInput, ResolvedVariant};
use crate::metrics::Metrics;
use crate::settings::Settings;
use apply::AppliedJob;
use status::{AggregatedStatus, Observed};
use validate::Verdict;

/// Why a reconcile failed; each step's error, with its category.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading references failed.
    #[error(transparent)]
    Dereference(#[from] dereference::DereferenceError),
    /// Building the desired state failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// Applying failed.
    #[error(transparent)]
    Apply(#[from] apply::ApplyError),
    /// Writing status failed.
    #[error(transparent)]
    Status(#[from] status::StatusError),
    /// The finalizer failed.
    #[error(transparent)]
    Finalizer(#[from] finalizer::FinalizerError),
    /// The training loop failed.
    #[error(transparent)]
    Training(#[from] crate::training::TrainingError),
}

impl Error {
    /// The bounded category: Event reason and metric label.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Dereference(e) => e.category(),
            Error::Build(e) => e.category(),
            Error::Apply(e) => e.category(),
            Error::Status(e) => e.category(),
            Error::Finalizer(e) => e.category(),
            Error::Training(e) => e.category(),
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Publishes Events.
    pub recorder: Recorder,
    /// The operator's metrics.
    pub metrics: Arc<Metrics>,
    /// Settings that shape the built objects.
    pub settings: Settings,
    /// The trace destination's storage (S3).
    pub storage: Storage,
    /// A cache of the cluster's nodes (for the GPU capacity check); without
    /// it, nodes are listed when a sandbox constrains GPUs.
    pub node_cache: Option<Store<Node>>,
    /// Copies of the watched objects, so that a reconcile with nothing to
    /// change makes no API call (empty: every read goes to the API).
    pub caches: cache::Caches,
    /// Consecutive failures per task, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The status this process last wrote, by task uid: see [`Context::freshest`].
    written: Mutex<HashMap<String, (Instant, HarnessTaskStatus)>>,
    /// When this process added the finalizer, by task uid: see [`Context::freshest`].
    finalizer_added: Mutex<HashMap<String, Instant>>,
    /// The Services each task's endpoints may name (found or not), as its
    /// last reconcile saw them: a Service's change wakes these tasks.
    service_users: Mutex<HashMap<ObjectRef<HarnessTask>, BTreeSet<ServiceRef>>>,
}

/// How long a status or finalizer this process wrote stands in for the
/// task's cached copy (the watch delivers the write well within it, even
/// under load).
const WRITTEN_STATUS_STANDS_FOR: Duration = Duration::from_secs(30);

impl Context {
    /// A context; Events are reported as `basecamp-operator` (and `instance`).
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        settings: Settings,
        storage: Storage,
        instance: Option<String>,
    ) -> Self {
        let reporter = Reporter { controller: crate::FIELD_MANAGER.into(), instance };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            settings,
            storage,
            node_cache: None,
            caches: cache::Caches::default(),
            failures: Mutex::default(),
            written: Mutex::default(),
            finalizer_added: Mutex::default(),
            service_users: Mutex::default(),
        }
    }

    /// Publishes an Event in the background: Events are best-effort (one
    /// that cannot be written is logged), and a reconcile does not wait for
    /// them, so its slot goes to the next task at once.
    fn publish(&self, task: &HarnessTask, warning: bool, reason: &str, note: &str, action: &str) {
        let mut note = note.to_string();
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.to_string(),
            note: Some(note),
            action: action.to_string(),
            secondary: None,
        };
        let recorder = self.recorder.clone();
        let reference = task.object_ref(&());
        tokio::spawn(async move {
            if let Err(error) = recorder.publish(&event, &reference).await {
                tracing::warn!(%error, reason = %event.reason, "cannot publish an Event");
            }
        });
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn written(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, HarnessTaskStatus)>> {
        self.written.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The task with what this process wrote in the last
    /// [`WRITTEN_STATUS_STANDS_FOR`] and the cached copy does not show yet:
    /// its status, its finalizer. A reconcile woken by another event (its
    /// Job appearing) can come before the watch delivers those writes, and
    /// would otherwise write the same status again and publish its Events
    /// twice, or add the finalizer again with the older resourceVersion,
    /// which the API server refuses (409): a `FinalizerConflict` Warning
    /// and a retry 5 s later, on a task with nothing wrong.
    fn freshest(&self, task: &HarnessTask) -> Option<HarnessTask> {
        let uid = task.uid()?;
        let status = self
            .written()
            .get(&uid)
            .filter(|(at, status)| at.elapsed() < WRITTEN_STATUS_STANDS_FOR && task.status.as_ref() != Some(status))
            .map(|(_, status)| status.clone());
        let finalizer = !finalizer::has_finalizer(task)
            && self.finalizer_added().get(&uid).is_some_and(|at| at.elapsed() < WRITTEN_STATUS_STANDS_FOR);
        if status.is_none() && !finalizer {
            return None;
        }
        let mut fresh = task.clone();
        if status.is_some() {
            fresh.status = status;
        }
        if finalizer {
            fresh.metadata.finalizers.get_or_insert_with(Vec::new).push(finalizer::FINALIZER.to_string());
        }
        Some(fresh)
    }

    fn finalizer_added(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.finalizer_added.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn remember_finalizer(&self, task: &HarnessTask) {
        let Some(uid) = task.uid() else { return };
        let mut added = self.finalizer_added();
        added.retain(|_, at| at.elapsed() < WRITTEN_STATUS_STANDS_FOR);
        added.insert(uid, Instant::now());
    }

    fn service_users(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<HarnessTask>, BTreeSet<ServiceRef>>> {
        self.service_users.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the Services `task`'s endpoints may name (none: forgets the task).
    fn note_services(&self, task: &HarnessTask, services: &BTreeSet<ServiceRef>) {
        let mut users = self.service_users();
        let task = ObjectRef::from_obj(task);
        if services.is_empty() {
            users.remove(&task);
        } else if users.get(&task) != Some(services) {
            users.insert(task, services.clone());
        }
    }

    /// The tasks whose last reconcile looked for `service` (the controller's
    /// trigger for a Service that was created, changed or deleted).
    pub fn tasks_using(&self, service: &k8s_openapi::api::core::v1::Service) -> Vec<ObjectRef<HarnessTask>> {
        let wanted = ServiceRef { namespace: service.namespace().unwrap_or_default(), name: service.name_any() };
        self.service_users()
            .iter()
            .filter(|(_, services)| services.contains(&wanted))
            .map(|(task, _)| task.clone())
            .collect()
    }

    fn remember_written(&self, task: &HarnessTask, status: &HarnessTaskStatus) {
        let Some(uid) = task.uid() else { return };
        let mut written = self.written();
        written.retain(|_, (at, _)| at.elapsed() < WRITTEN_STATUS_STANDS_FOR);
        written.insert(uid, (Instant::now(), status.clone()));
    }
}

fn key(task: &HarnessTask) -> String {
    format!("{}/{}", task.namespace().unwrap_or_default(), task.name_any())
}

fn now() -> Time {
    Time(jiff::Timestamp::now())
}

pub(crate) fn today() -> UtcDate {
    UtcDate::from_system_time(std::time::SystemTime::now())
        .unwrap_or_else(|_| UtcDate::new(1970, 1, 1).expect("a real date"))
}

/// Reconciles one task (the function given to the Controller).
pub async fn reconcile(task: Arc<HarnessTask>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = pipeline(&task, &ctx).await;
    match &result {
        Ok(_) => {
            ctx.failures().remove(&key(&task));
        }
        Err(error) => {
            tracing::warn!(task = %key(&task), category = error.category(), %error, "reconcile failed");
            ctx.publish(&task, true, error.category(), &error.to_string(), "Reconcile");
        }
    }
    ctx.metrics.observe_reconcile(started.elapsed(), result.as_ref().err().map(Error::category));
    result
}

/// The requeue after a failure: 5 s, doubling per consecutive failure, at most 5 minutes.
pub fn error_policy(task: Arc<HarnessTask>, _error: &Error, ctx: Arc<Context>) -> Action {
    let mut failures = ctx.failures();
    let count = failures.entry(key(&task)).or_insert(0);
    *count = count.saturating_add(1);
    Action::requeue(backoff(*count))
}

/// The backoff after `failures` consecutive failures.
pub fn backoff(failures: u32) -> Duration {
    let seconds = 5u64.saturating_mul(1u64 << failures.saturating_sub(1).min(10));
    Duration::from_secs(seconds.min(300))
}

impl Error {
    /// An object the task's spec makes that the API server refuses as
    /// invalid (a name, a label value, a size it will not take): a problem
    /// of the spec, which retrying cannot fix.
    fn refused_as_invalid(&self) -> bool {
        let apply = match self {
            Error::Apply(apply) | Error::Training(crate::training::TrainingError::Apply(apply)) => apply,
            _ => return false,
        };
        apply.category() == "ApplyInvalid"
    }

    /// The Job name held by another owner, if that is what stopped the reconcile.
    fn job_name_taken(&self) -> Option<&apply::ApplyError> {
        match self {
            Error::Apply(taken @ apply::ApplyError::JobNameTaken { .. })
            | Error::Training(crate::training::TrainingError::Apply(taken @ apply::ApplyError::JobNameTaken { .. })) => {
                Some(taken)
            }
            _ => None,
        }
    }
}

async fn pipeline(task: &HarnessTask, ctx: &Context) -> Result<Action, Error> {
    if task.metadata.deletion_timestamp.is_some() {
        return finalize(task, ctx).await;
    }
    let freshest = ctx.freshest(task);
    let task = freshest.as_ref().unwrap_or(task);
    match run(task, ctx).await {
        Err(error) if error.job_name_taken().is_some() => name_taken(task, ctx, &error).await,
        Err(error) if error.refused_as_invalid() => refused(task, ctx, &error).await,
        result => result,
    }
}

/// An object of the task that the API server refuses as invalid: a Ready=False
/// condition with the server's message (and its Event), looked at again every
/// 5 minutes; an edit of the spec wakes it at once. It was an error retried
/// with backoff, the task with no status at all.
async fn refused(task: &HarnessTask, ctx: &Context, error: &Error) -> Result<Action, Error> {
    let consequence = "the API server refuses an object this spec makes; change the spec so it takes it";
    let status = status::blocked(task, error.category(), &error.to_string(), consequence, &now());
    update_status(task, ctx, &status).await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// A Job name held by another owner: a condition and an Event saying which
/// object holds it and what to rename; looked at again every 5 minutes (the
/// holder going away wakes nothing of this task).
async fn name_taken(task: &HarnessTask, ctx: &Context, error: &Error) -> Result<Action, Error> {
    let consequence = "rename this task or the variant; the task cannot finish until the Job name is free";
    let status = status::blocked(task, error.category(), &error.to_string(), consequence, &now());
    update_status(task, ctx, &status).await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// The pipeline of a task that is not being deleted.
async fn run(task: &HarnessTask, ctx: &Context) -> Result<Action, Error> {
    let world = dereference::dereference(&ctx.client, &ctx.caches, task, ctx.node_cache.as_ref()).await?;
    let (variants, warnings) = match validate::check(task, &world) {
        Verdict::Valid { variants, warnings } => (variants, warnings),
        Verdict::Invalid(report) => return reject(task, ctx, &report).await,
    };
    let capacity_problem = capacity_problem(&world, &variants);
    let mut input = BuildInput::new(task, variants, &ctx.settings)?;
    let candidates: BTreeSet<ServiceRef> = network_policy::endpoints(&input)
        .iter()
        .filter_map(|endpoint| network_policy::service_ref(&endpoint.host, input.namespace))
        .collect();
    ctx.note_services(task, &candidates);
    input.services = dereference::services(&ctx.client, &ctx.caches, candidates).await;
    let desired = build::build(&input)?;
    let namespace = task.namespace().unwrap_or_default();
    // The finalizer is added in the same round trip as the first applies:
    // a new task's Jobs exist one API round trip sooner. Should the patch
    // fail, the reconcile fails and is retried; the objects applied meanwhile
    // are owned by the task, so nothing outlives it.
    // Both run to the end, so that a finalizer added beside a failed apply
    // is remembered (the next reconcile must not add it again).
    let (finalizer_added, applied) = futures::join!(
        finalizer::ensure(&ctx.client, task),
        apply::apply(
            &ctx.client,
            &ctx.caches,
            &ctx.metrics,
            &namespace,
            &desired,
            task.status.as_ref(),
            task.metadata.generation,
        )
    );
    if finalizer_added? {
        ctx.remember_finalizer(task);
    }
    let applied = applied?;
    // Read before this reconcile publishes its Events (sent in the
    // background), so that its API calls come in one order.
    let shards = shard_states(task, &applied);
    let shard_failure = if shards.iter().any(|(_, counts)| counts.failed > 0) {
        last_shard_failure(&ctx.client, &namespace, task).await
    } else {
        None
    };
    let task_uid = task.uid().unwrap_or_default();
    for variant in apply::delete_dropped_variants(&ctx.client, &ctx.caches, &namespace, &task_uid, &desired).await? {
        let note = format!("variant {variant} is no longer in the spec; its Job was deleted");
        ctx.publish(task, false, "JobDeleted", &note, &format!("DeleteJob {variant}"));
    }
    for replaced in applied.iter().filter(|a| a.replaced) {
        let note =
            format!("the spec changed; the Job of variant {} was replaced and its shards run again", replaced.variant);
        // One series per variant: the recorder folds Events of one (type,
        // reason, action) and keeps the first note, so a second variant's
        // replacement read as the first's.
        ctx.publish(task, false, "JobReplaced", &note, &format!("ReplaceJob {}", replaced.variant));
    }
    let aggregated = aggregate_step(task, ctx, &applied, &shards).await;
    let training = crate::training::reconcile(&ctx.client, &ctx.caches, &ctx.storage, &ctx.metrics, &input).await?;
    if training.as_ref().is_some_and(|t| t.trainer_replaced) {
        let note = "the spec changed the trainer's pod (trainingConfig or what it is given); its Job was replaced and \
                    the trainer starts over (from resumeFrom, if set)";
        ctx.publish(task, true, "TrainerReplaced", note, "ReplaceJob trainer");
    }
    if let Some(training) = &training {
        let root = training.observed.status.checkpoints.as_deref().unwrap_or_default();
        if let Some(note) = &training.root_changed {
            ctx.publish(task, true, "CheckpointRootChanged", note, &event_action("ChangeCheckpointRoot", root));
        }
        for name in &training.newly_ignored {
            let note = crate::training::checkpoints::ignored_note(root, name);
            // One series per name (see EvaluateStep below).
            ctx.publish(task, true, "CheckpointDirectoryIgnored", &note, &event_action("ListCheckpoints", name));
        }
    }
    for evaluation in training.iter().flat_map(|t| t.evaluated.iter()) {
        let note = crate::training::evaluation::evaluated_note(evaluation);
        // The recorder folds Events of one (type, reason, action) into a
        // series keeping the first note: the step in the action keeps each
        // step's Event (and its accuracy) visible.
        let action = format!("EvaluateStep{}", evaluation.step);
        // An evaluation whose shards failed is a Warning of its own reason:
        // it says nothing about the checkpoint, and the task's phase does
        // not show it.
        let failed = evaluation.phase == basecamp_api::task::TaskPhase::Failed;
        let reason = if failed { "CheckpointEvaluationFailed" } else { "CheckpointEvaluated" };
        ctx.publish(task, failed, reason, &note, &action);
    }
    let observed = Observed {
        task,
        shards,
        job_templates: apply::job_templates(&applied, task.status.as_ref()),
        capacity_problem,
        suspended: applied
            .iter()
            .filter_map(|a| a.job.as_ref())
            .any(|j| j.spec.as_ref().and_then(|s| s.suspend) == Some(true)),
        warnings: warnings.iter().map(ToString::to_string).collect(),
        aggregated,
        report_url: status::report_url(ctx.settings.report_base_url.as_deref(), &namespace, &task.name_any()),
        training: training.map(|t| t.observed),
        shard_failure,
        now: now(),
    };
    let status = status::compute(&observed);
    update_status(task, ctx, &status).await?;
    Ok(next_action(&status, Duration::from_secs(ctx.settings.checkpoint_poll_seconds.max(1))))
}

/// An Event's action: `verb object`, cut to the 128 bytes the API allows.
fn event_action(verb: &str, object: &str) -> String {
    let mut action = format!("{verb} {object}");
    let mut cut = action.len().min(128);
    while !action.is_char_boundary(cut) {
        cut -= 1;
    }
    action.truncate(cut);
    action
}

/// An invalid spec: a condition and an Event saying what to fix; no objects.
/// A task that finished for its current generation keeps its results and
/// status: what became invalid since (a SandboxConfig deleted after the
/// run) matters only to a next generation, which validation will report.
async fn reject(task: &HarnessTask, ctx: &Context, report: &basecamp_api::Report) -> Result<Action, Error> {
    // Before the status write: both change the task, and the finalizer's
    // patch is a compare-and-swap on its resourceVersion.
    if finalizer::ensure(&ctx.client, task).await? {
        ctx.remember_finalizer(task);
    }
    if status::finished_run(task) {
        return Ok(Action::await_change());
    }
    let reason = validate::reason(report);
    let message = validate::summarize(report, 4000);
    let status = status::invalid(task, reason, &message, &now());
    update_status(task, ctx, &status).await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn capacity_problem(world: &dereference::World, variants: &[ResolvedVariant]) -> Option<String> {
    let nodes = world.nodes.as_ref()?;
    let problems: Vec<String> = variants
        .iter()
        .filter_map(|v| {
            let gpu = v.spec.gpu.as_ref()?;
            let assessment = capacity::assess(nodes, gpu, gpu.min_compute_capability().ok().flatten())?;
            assessment.is_unsatisfiable().then(|| format!("variant {}: {}", v.name, assessment.message()))
        })
        .collect();
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// Shard counts by variant: from the Job, or from status when the Job
/// finished and its TTL removed it.
/// What the last of the task's sandbox pods that failed said as it exited
/// ([`status::shard_failure`]). Its pods only add detail to the
/// ShardFailed condition: a list that fails (no right to read pods) leaves
/// the condition as it was before this detail existed.
async fn last_shard_failure(client: &Client, namespace: &str, task: &HarnessTask) -> Option<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    // The variants' own pods: those of the trainer and of checkpoint
    // evaluations carry a role.
    let selector = format!(
        "{}={},!{}",
        crate::build::names::TASK_LABEL,
        crate::build::names::label_value(&task.name_any()),
        crate::build::names::ROLE_LABEL
    );
    match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => status::shard_failure(&list.items),
        Err(error) => {
            tracing::warn!(%error, "cannot read the task's sandbox pods; the ShardFailed condition names no exit");
            None
        }
    }
}

fn shard_states(task: &HarnessTask, applied: &[AppliedJob]) -> Vec<(String, ShardCounts)> {
    let total = task.spec.shards();
    applied
        .iter()
        .map(|a| {
            let counts = match &a.job {
                Some(job) => status::shard_counts(job, total),
                None => task
                    .status
                    .as_ref()
                    .and_then(|s| s.shards.get(&a.variant).copied())
                    .unwrap_or(ShardCounts { total, ..Default::default() }),
            };
            (a.variant.clone(), counts)
        })
        .collect()
}

fn previous_aggregation(status: Option<&HarnessTaskStatus>) -> AggregatedStatus {
    let Some(status) = status else { return AggregatedStatus::default() };
    AggregatedStatus {
        metrics: status.metrics.clone(),
        criteria: status.criteria.clone(),
        deltas: status.deltas.clone(),
        aggregated_shards: status.aggregated_shards.clone(),
        trace_location: status.trace_location.clone(),
        error: None,
        complete: status.trace_location.is_some(),
    }
}

/// Summaries older than the Job (with 10 minutes for clock skew) belong to a replaced Job.
pub(crate) const CLOCK_SKEW_NANOS: i64 = 600 * 1_000_000_000;

async fn aggregate_step(
    task: &HarnessTask,
    ctx: &Context,
    applied: &[AppliedJob],
    shards: &[(String, ShardCounts)],
) -> AggregatedStatus {
    let previous = previous_aggregation(task.status.as_ref());
    let mut completed: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    let mut not_before_nanos = BTreeMap::new();
    for a in applied {
        let indexes: BTreeSet<u32> = match &a.job {
            Some(job) => status::parse_indexes(job.status.as_ref().and_then(|s| s.completed_indexes.as_deref()))
                .into_iter()
                .collect(),
            None => previous.aggregated_shards.get(&a.variant).map(|s| s.iter().copied().collect()).unwrap_or_default(),
        };
        if let Some(created) = a.job.as_ref().and_then(|j| j.creation_timestamp()) {
            let nanos = i64::try_from(created.0.as_nanosecond()).unwrap_or(i64::MAX);
            not_before_nanos.insert(a.variant.clone(), nanos.saturating_sub(CLOCK_SKEW_NANOS));
        }
        if !indexes.is_empty() {
            completed.insert(a.variant.clone(), indexes);
        }
    }
    let all_finished = !shards.is_empty() && shards.iter().all(|(_, c)| c.total > 0 && c.finished() >= c.total);
    let counted: BTreeMap<String, Vec<u32>> =
        completed.iter().map(|(v, s)| (v.clone(), s.iter().copied().collect())).collect();
    if completed.is_empty() {
        return AggregatedStatus::default();
    }
    if counted == previous.aggregated_shards && (!all_finished || previous.complete) {
        let mut previous = previous;
        if all_finished {
            // Judged again on the same metrics: an edit of successCriteria
            // reruns no shard, and the status it claims to have observed
            // kept the criteria of the generation before.
            let variants: Vec<String> = shards.iter().map(|(v, _)| v.clone()).collect();
            previous.criteria =
                aggregate::evaluate_criteria(&task.spec.task_definition.success_criteria, &previous.metrics, &variants);
        }
        return previous;
    }
    let Some(destination) =
        task.spec.traces.as_ref().and_then(|t| t.destination.as_deref()).and_then(|d| Destination::parse(d).ok())
    else {
        return AggregatedStatus::default();
    };
    let created =
        task.creation_timestamp().and_then(|t| UtcDate::from_unix_seconds(t.0.as_second()).ok()).unwrap_or_else(today);
    let namespace = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let request = aggregate::Request {
        namespace: &namespace,
        task: &name,
        destination,
        days: (created, today()),
        variants: shards.iter().map(|(v, _)| v.clone()).collect(),
        completed,
        not_before_nanos,
        all_finished,
        criteria: &task.spec.task_definition.success_criteria,
    };
    aggregate::run(&ctx.storage, &ctx.metrics, &request, &previous).await
}

async fn update_status(task: &HarnessTask, ctx: &Context, new: &HarnessTaskStatus) -> Result<(), Error> {
    let old = task.status.clone().unwrap_or_default();
    let changed = &old != new;
    if changed {
        status::write(&ctx.client, task, new).await?;
        ctx.remember_written(task, new);
    }
    ctx.metrics.count_apply("HarnessTaskStatus", changed);
    for transition in status::transitions(&old.conditions, &new.conditions) {
        // The recorder folds Events of one (type, reason, action) into a
        // series keeping the first note: a generation's own action keeps a
        // later spec's `ShardsRunning 0/6` from reading as the earlier `0/4`.
        let action = format!("UpdateStatus generation {}", task.metadata.generation.unwrap_or_default());
        ctx.publish(task, transition.warning, &transition.reason, &transition.note, &action);
    }
    for (variant, event) in status::rate_limited(&old.metrics, &new.metrics) {
        ctx.publish(task, event.warning, &event.reason, &event.note, &format!("Aggregate {variant}"));
    }
    ctx.metrics.record_task(&task.namespace().unwrap_or_default(), &task.name_any(), new);
    Ok(())
}

/// When to look again. Job changes wake the task anyway (the controller
/// owns its Jobs), so a healthy running task is only re-checked every five
/// minutes; a degraded one (S3 down, summaries missing) every 30 seconds;
/// a training task whose trainer runs or whose checkpoint evaluations are
/// pending every `checkpoint_poll` (new checkpoints wake nothing). A
/// finished task waits for a change, unless an error a retry may clear
/// keeps its results from being written (a task failed by a shard whose
/// other shards' summaries S3 could not serve): a failed shard stays failed.
pub fn next_action(status: &HarnessTaskStatus, checkpoint_poll: Duration) -> Action {
    use basecamp_api::task::TaskPhase;
    let degraded = status
        .conditions
        .iter()
        .any(|c| c.type_ == basecamp_api::task::condition_types::DEGRADED && c.status == "True");
    let training = status.training.as_ref().is_some_and(status::training_busy);
    let finished = matches!(status.phase, Some(TaskPhase::Succeeded | TaskPhase::Failed));
    if training {
        Action::requeue(checkpoint_poll.min(Duration::from_secs(30)))
    } else if finished && !status::degraded_by_a_retryable_error(status) {
        Action::await_change()
    } else if degraded {
        Action::requeue(Duration::from_secs(30))
    } else {
        Action::requeue(Duration::from_secs(300))
    }
}

async fn finalize(task: &HarnessTask, ctx: &Context) -> Result<Action, Error> {
    ctx.note_services(task, &BTreeSet::new());
    if let Some(outcome) = finalizer::cleanup(&ctx.client, &ctx.storage, &ctx.metrics, task, today()).await? {
        let (reason, note) = match outcome {
            finalizer::Cleanup::Retained(note) => ("TracesRetained", note),
            finalizer::Cleanup::Waiting(note) => {
                ctx.publish(task, false, "WaitingForPods", &note, "Finalize");
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
            finalizer::Cleanup::Deleted(_, note) => ("TracesDeleted", note),
        };
        ctx.publish(task, false, reason, &note, "Finalize");
    }
    Ok(Action::await_change())
}

/// What of a task wakes its reconcile (the predicate of the HarnessTask
/// watch): its generation (the spec; deletion raises it too), deletion
/// timestamp, finalizers, labels and annotations. Not its status, which only
/// the operator writes: each status write woke the task again for a
/// reconcile with nothing to do (`make bench-operator`: about 600 of 3,100
/// reconciles for 1,000 new tasks, the rest coalesced with other wake-ups).
/// Nor `resourceVersion` or `managedFields`, which every write changes.
pub fn task_trigger(task: &HarnessTask) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    task.metadata.generation.hash(&mut hasher);
    task.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    task.finalizers().hash(&mut hasher);
    task.labels().hash(&mut hasher);
    task.annotations().hash(&mut hasher);
    Some(hasher.finish())
}

/// The tasks that reference a SandboxConfig (the Controller's mapper for
/// SandboxConfig changes).
pub fn tasks_referencing(tasks: &[Arc<HarnessTask>], sandbox: &SandboxConfig) -> Vec<ObjectRef<HarnessTask>> {
    let name = sandbox.name_any();
    let namespace = sandbox.namespace();
    tasks
        .iter()
        .filter(|t| {
            t.namespace() == namespace && t.spec.effective_variants().iter().any(|v| v.sandbox_ref.name == name)
        })
        .map(|t| ObjectRef::from_obj(t.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests;
