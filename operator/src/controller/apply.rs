//! `apply`: make the cluster hold the desired objects, by server-side apply
//! with the field manager `basecamp-operator` (forced: the operator owns
//! these fields). A Job's pod template is immutable, so a Job whose
//! template hash differs from the desired one (the spec changed) is deleted
//! and created anew. A Job that finished and was removed by its TTL is not
//! recreated: the task's status already holds its result.
//!
//! Job names are `<task>-<variant>`, so two tasks can want the same name
//! (task `eval` variant `v2-baseline`, task `eval-v2` variant `baseline`).
//! A Job whose controller is not this task is never deleted nor applied
//! over: that is [`ApplyError::JobNameTaken`], which the controller reports
//! on the task's status (the holder keeps its Job).

use std::collections::BTreeMap;

use basecamp_api::HarnessTaskStatus;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::{Client, ResourceExt};

use super::cache::{self, CachedJob, Caches};
use crate::FIELD_MANAGER;
use crate::build::Desired;
use crate::build::names::{KUEUE_QUEUE_LABEL, ROLE_LABEL, TEMPLATE_HASH_ANNOTATION, VARIANT_LABEL};
use crate::metrics::Metrics;

/// Why applying failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The API refused or did not answer.
    #[error("failed to {action} {kind} {namespace}/{name}: {source}")]
    Api {
        /// `apply`, `read` or `delete`.
        action: &'static str,
        /// The object's kind.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The cause.
        source: kube::Error,
    },
    /// The Job's name is held by a Job this task does not control.
    #[error(
        "the Job {namespace}/{name} that this task needs is held by {holder}, and the operator never deletes \
         another owner's Job; Job names are <task>-<variant>, so rename this task or the variant (or delete {holder})"
    )]
    JobNameTaken {
        /// The Job's namespace.
        namespace: String,
        /// The Job's name.
        name: String,
        /// Who holds it, for people: `HarnessTask eval (uid ...)`, or that no controller owns it.
        holder: String,
    },
}

impl ApplyError {
    /// A fixed name for this kind of error.
    pub fn category(&self) -> &'static str {
        match self {
            ApplyError::Api { source, .. } => match super::api_error::category(source) {
                "Forbidden" => "ApplyForbidden",
                "Conflict" => "ApplyConflict",
                "Invalid" => "ApplyInvalid",
                "ApiUnreachable" => "ApiUnreachable",
                _ => "ApplyFailed",
            },
            ApplyError::JobNameTaken { .. } => "JobNameTaken",
        }
    }
}

/// One variant's Job as it is now (`None`: finished earlier and removed).
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedJob {
    /// The variant.
    pub variant: String,
    /// The Job as the API returned it (with its status).
    pub job: Option<Job>,
    /// Whether this reconcile replaced an outdated Job.
    pub replaced: bool,
}

fn params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// The controller owner of `job`: its `ownerReferences` entry with `controller: true`.
fn controller_of(job: &Job) -> Option<&OwnerReference> {
    job.owner_references().iter().find(|owner| owner.controller == Some(true))
}

/// Who holds `job` when its controller is not the one `want` names: `None`
/// when both have the same controller (the task's own Job).
pub fn foreign_holder(want: &Job, job: &Job) -> Option<String> {
    let holder = controller_of(job);
    if holder.map(|o| &o.uid) == controller_of(want).map(|o| &o.uid) {
        return None;
    }
    Some(match holder {
        Some(owner) => format!("{} {} (uid {})", owner.kind, owner.name, owner.uid),
        None => "a Job no controller owns (created by hand?)".to_string(),
    })
}

fn variant_of(job: &Job) -> String {
    job.labels().get(VARIANT_LABEL).cloned().unwrap_or_default()
}

/// Whether a variant's Job finished with the template `want` has (so its
/// absence is expected: its TTL removed it, and the status holds its
/// result). An edit that leaves this variant's template as it was (success
/// criteria, another variant) reruns nothing; one that changes it reruns the
/// variant. A status written before template hashes were kept falls back to
/// the generation.
pub fn finished_before(status: Option<&HarnessTaskStatus>, generation: Option<i64>, want: &Job) -> bool {
    let variant = variant_of(want);
    status.is_some_and(|s| {
        let same_template = match s.job_templates.get(&variant) {
            Some(hash) => want.annotations().get(TEMPLATE_HASH_ANNOTATION) == Some(hash),
            None => s.observed_generation == generation,
        };
        same_template && s.shards.get(&variant).is_some_and(|c| c.total > 0 && c.finished() >= c.total)
    })
}

/// The template hash of each variant's Job: from the Job, or, for one that
/// finished and is gone, from the status that counted it.
pub fn job_templates(applied: &[AppliedJob], status: Option<&HarnessTaskStatus>) -> BTreeMap<String, String> {
    applied
        .iter()
        .filter_map(|a| {
            let hash = match &a.job {
                Some(job) => job.annotations().get(TEMPLATE_HASH_ANNOTATION).cloned(),
                None => status.and_then(|s| s.job_templates.get(&a.variant).cloned()),
            };
            Some((a.variant.clone(), hash?))
        })
        .collect()
}

/// The Job to apply, given the one that exists. With a Kueue queue, Kueue
/// owns `suspend` once the Job exists (it unsuspends on admission and may
/// suspend on preemption): a Job queued through Kueue is created suspended
/// and its live `suspend` is kept, so a forced apply never suspends an
/// admitted workload. Without a queue, `spec.suspend` drives it directly.
pub fn with_live_suspend(want: &Job, existing: Option<&Job>) -> Job {
    let mut want = want.clone();
    let queued = want.labels().contains_key(KUEUE_QUEUE_LABEL);
    if let Some(spec) = want.spec.as_mut()
        && queued
    {
        spec.suspend = match existing {
            Some(live) => live.spec.as_ref().and_then(|s| s.suspend),
            None => Some(true),
        };
    }
    want
}

/// Applies one object by server-side apply, unless its cached copy is
/// already what the apply would make it (`cache::up_to_date`).
async fn apply_object<K>(
    api: &Api<K>,
    metrics: &Metrics,
    namespace: &str,
    kind: &'static str,
    desired: &K,
    cached: Option<std::sync::Arc<K>>,
) -> Result<(), ApplyError>
where
    K: kube::Resource<DynamicType = ()>
        + cache::Slim
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let want = cache::stamp(desired);
    if cached.is_some_and(|live| cache::up_to_date(&want, &live)) {
        metrics.count_apply(kind, false);
        return Ok(());
    }
    let name = want.name_any();
    api.patch(&name, &params(), &Patch::Apply(&want)).await.map_err(|source| ApplyError::Api {
        action: "apply",
        kind,
        namespace: namespace.to_string(),
        name: name.clone(),
        source,
    })?;
    metrics.count_apply(kind, true);
    Ok(())
}

/// Applies the ConfigMap, the NetworkPolicy and the Jobs (concurrently: the
/// Jobs' pods wait for the ConfigMap volume, not the Job for the ConfigMap).
/// An object whose cached copy is up to date is not sent.
pub async fn apply(
    client: &Client,
    caches: &Caches,
    metrics: &Metrics,
    namespace: &str,
    desired: &Desired,
    status: Option<&HarnessTaskStatus>,
    generation: Option<i64>,
) -> Result<Vec<AppliedJob>, ApplyError> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let config_map = apply_object(
        &config_maps,
        metrics,
        namespace,
        "ConfigMap",
        &desired.config_map,
        caches.config_map(namespace, &desired.config_map.name_any()),
    );
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), namespace);
    let network_policy = apply_object(
        &policies,
        metrics,
        namespace,
        "NetworkPolicy",
        &desired.network_policy,
        caches.network_policy(namespace, &desired.network_policy.name_any()),
    );
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let applied_jobs = futures::future::try_join_all(desired.jobs.iter().map(|want| {
        let variant = variant_of(want);
        let finished = finished_before(status, generation, want);
        let cached = caches.job_state(namespace, &want.name_any());
        let jobs = &jobs;
        async move {
            let (job, replaced) = apply_job(jobs, metrics, namespace, want, cached, finished).await?;
            Ok::<_, ApplyError>(AppliedJob { variant, job, replaced })
        }
    }));
    let ((), (), applied) = futures::try_join!(config_map, network_policy, applied_jobs)?;
    Ok(applied)
}

/// Deletes the Jobs this task controls that its spec no longer makes: a
/// variant removed or renamed (its pods ran on, refused by the sandbox as a
/// variant the task does not have). The trainer's and the evaluations'
/// Jobs (with a role label) are the training loop's. Returns the variants
/// whose Jobs were deleted; nothing before the cache's first listing.
pub async fn delete_dropped_variants(
    client: &Client,
    caches: &Caches,
    namespace: &str,
    task_uid: &str,
    desired: &Desired,
) -> Result<Vec<String>, ApplyError> {
    let wanted: Vec<String> = desired.jobs.iter().map(ResourceExt::name_any).collect();
    let dropped = caches.jobs_where(namespace, |job| {
        // One already being deleted is not deleted (nor announced) again.
        job.metadata.deletion_timestamp.is_none()
            && !wanted.contains(&job.name_any())
            && !job.labels().contains_key(ROLE_LABEL)
            && job.owner_references().iter().any(|o| o.controller == Some(true) && o.uid == task_uid)
    });
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let background = DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
    let mut variants = Vec::new();
    for job in dropped.unwrap_or_default() {
        let name = job.name_any();
        match jobs.delete(&name, &background).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(ApplyError::Api {
                    action: "delete",
                    kind: "Job",
                    namespace: namespace.into(),
                    name,
                    source,
                });
            }
        }
        variants.push(job.labels().get(VARIANT_LABEL).cloned().unwrap_or(name));
    }
    Ok(variants)
}

/// Applies one Job: an outdated one (its template hash differs) is deleted
/// and created anew; a missing one is not recreated when `finished_before`
/// (its TTL removed it after it finished). Returns the Job as the API has
/// it (`None`: finished and gone; a cached copy has no pod template) and
/// whether it was replaced.
///
/// A Job of that name that another controller owns is left alone: an error
/// ([`ApplyError::JobNameTaken`]), or, when `finished_before`, `None` (this
/// task's Job finished and was removed; the name went to someone else since).
///
/// A cached copy that is up to date is returned as it is. Otherwise the Job
/// is read from the API first, so that a replacement or Kueue's `suspend`
/// is decided on the live object, never on a stale copy — except when the
/// listed cache does not have it and no queue owns `suspend`: then it is
/// created without the read (had a stale cache missed it, the apply keeps
/// it, or is refused for its immutable template and the next reconcile,
/// with the Job in the cache, replaces it).
pub async fn apply_job(
    jobs: &Api<Job>,
    metrics: &Metrics,
    namespace: &str,
    want: &Job,
    cached: CachedJob,
    finished_before: bool,
) -> Result<(Option<Job>, bool), ApplyError> {
    let want = cache::stamp(want);
    let name = want.name_any();
    let err = |action| {
        let namespace = namespace.to_string();
        let name = name.clone();
        move |source| ApplyError::Api { action, kind: "Job", namespace, name, source }
    };
    let queued = want.labels().contains_key(KUEUE_QUEUE_LABEL);
    let existing = match cached {
        CachedJob::Present(live) if cache::up_to_date(&with_live_suspend(&want, Some(&live)), &live) => {
            metrics.count_apply("Job", false);
            return Ok((Some(live.as_ref().clone()), false));
        }
        CachedJob::Absent if finished_before => return Ok((None, false)),
        CachedJob::Absent if !queued => None,
        _ => jobs.get_opt(&name).await.map_err(err("read"))?,
    };
    let want_hash = want.annotations().get(TEMPLATE_HASH_ANNOTATION);
    let mut replaced = false;
    if let Some(holder) = existing.as_ref().and_then(|job| foreign_holder(&want, job)) {
        if finished_before {
            return Ok((None, false));
        }
        return Err(ApplyError::JobNameTaken { namespace: namespace.to_string(), name, holder });
    }
    match &existing {
        None if finished_before => return Ok((None, false)),
        Some(job) if job.annotations().get(TEMPLATE_HASH_ANNOTATION) != want_hash => {
            let background =
                DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
            jobs.delete(&name, &background).await.map_err(err("delete"))?;
            replaced = true;
        }
        _ => {}
    }
    let want = with_live_suspend(&want, existing.as_ref().filter(|_| !replaced));
    let job = jobs.patch(&name, &params(), &Patch::Apply(&want)).await.map_err(err("apply"))?;
    metrics.count_apply("Job", true);
    Ok((Some(job), replaced))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::JobSpec;
    use kube::api::ObjectMeta;

    fn job(queue: bool, suspend: bool) -> Job {
        let labels =
            if queue { [(KUEUE_QUEUE_LABEL.to_string(), "gpu".to_string())].into() } else { Default::default() };
        Job {
            metadata: ObjectMeta { labels: Some(labels), ..Default::default() },
            spec: Some(JobSpec { suspend: Some(suspend), ..Default::default() }),
            status: None,
        }
    }

    fn suspend(job: &Job) -> Option<bool> {
        job.spec.as_ref().and_then(|s| s.suspend)
    }

    fn variant_job(variant: &str, hash: &str) -> Job {
        Job {
            metadata: ObjectMeta {
                labels: Some([(VARIANT_LABEL.to_string(), variant.to_string())].into()),
                annotations: Some([(TEMPLATE_HASH_ANNOTATION.to_string(), hash.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn finished_status(generation: i64, templates: &[(&str, &str)]) -> HarnessTaskStatus {
        let done = basecamp_api::task::ShardCounts { total: 2, succeeded: 1, failed: 1, running: 0 };
        HarnessTaskStatus {
            observed_generation: Some(generation),
            shards: [("a".to_string(), done), ("b".to_string(), done)].into(),
            job_templates: templates.iter().map(|(v, h)| (v.to_string(), h.to_string())).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_gone_finished_job_reruns_only_when_its_template_changed() {
        let status = finished_status(3, &[("a", "h1"), ("b", "h2")]);
        // Generation 4: criteria edited (a's template is the same), b's template changed.
        assert!(finished_before(Some(&status), Some(4), &variant_job("a", "h1")), "same template: not rerun");
        assert!(!finished_before(Some(&status), Some(4), &variant_job("b", "h3")), "changed template: rerun");
        assert!(!finished_before(Some(&status), Some(4), &variant_job("c", "h1")), "a new variant runs");
        let running = HarnessTaskStatus {
            shards: [(
                "a".to_string(),
                basecamp_api::task::ShardCounts { total: 2, succeeded: 1, ..Default::default() },
            )]
            .into(),
            ..status.clone()
        };
        assert!(!finished_before(Some(&running), Some(3), &variant_job("a", "h1")), "unfinished: its Job is wanted");
        // A status from before the hashes were kept: the generation decides.
        let old = finished_status(3, &[]);
        assert!(finished_before(Some(&old), Some(3), &variant_job("a", "h9")));
        assert!(!finished_before(Some(&old), Some(4), &variant_job("a", "h1")));
        assert!(!finished_before(None, Some(1), &variant_job("a", "h1")));
    }

    #[test]
    fn job_templates_keep_the_hash_of_a_gone_job() {
        let status = finished_status(3, &[("a", "h1"), ("b", "h2")]);
        let applied = [
            AppliedJob { variant: "a".into(), job: None, replaced: false },
            AppliedJob { variant: "b".into(), job: Some(variant_job("b", "h3")), replaced: true },
            AppliedJob { variant: "c".into(), job: None, replaced: false },
        ];
        let templates = job_templates(&applied, Some(&status));
        assert_eq!(templates, BTreeMap::from([("a".into(), "h1".into()), ("b".into(), "h3".into())]));
    }

    #[test]
    fn kueue_owns_suspend_once_the_job_exists() {
        assert_eq!(suspend(&with_live_suspend(&job(true, false), None)), Some(true), "created suspended for admission");
        let admitted = job(true, false);
        assert_eq!(
            suspend(&with_live_suspend(&job(true, true), Some(&admitted))),
            Some(false),
            "never re-suspends an admitted Job"
        );
        assert_eq!(
            suspend(&with_live_suspend(&job(false, false), Some(&job(false, true)))),
            Some(false),
            "no queue: the spec decides"
        );
    }
}
