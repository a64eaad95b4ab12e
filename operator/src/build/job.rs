//! One Indexed Job per variant: `completions` = shards, each index one pod
//! running `basecamp-sandbox run ... --shard $(JOB_COMPLETION_INDEX)/N`
//! (the kubelet expands `$(VAR)` in args from the container's environment,
//! so no shell is needed).
//!
//! Exit codes of `basecamp-sandbox run` drive the pod failure policy:
//! 1 (the configuration or the node's GPU is refused) fails that index at
//! once — a retry would fail the same way, and a per-index failure keeps one
//! lying node from failing the whole Job; 2 (episodes lost), 3 (upload
//! failed), 4 (the S3 test set or scripted policy unreachable after every
//! retry: a later attempt can succeed)
//! and 130 (stopped early by SIGTERM: its summary lists episodes
//! interrupted or never started, so the shard is not done) are retried up
//! to `backoffLimitPerIndex`; a pod evicted by a disruption (preempted,
//! drained: SIGTERM, so 130) is retried without counting.
//!
//! When the SandboxConfig names a tools image, an init container copies the
//! sandbox binary from the Basecamp image into an emptyDir (as Argo and
//! Tekton inject their entrypoints), and the sandbox container runs it from
//! there inside the user's image.
//!
//! The same builder makes a checkpoint evaluation's Job (see
//! [`CheckpointUnderTest`] and `crate::training`): the variant's pod with
//! `--checkpoint-step N`, `BASECAMP_CHECKPOINT` and `BASECAMP_STEP`, named
//! `<task>-s<N>-<variant>` and labelled with the step. With
//! `policy.server`, every such pod also runs the policy-server sidecar
//! ([`super::policy_server`]).

use std::collections::BTreeMap;

use basecamp_api::task::SANDBOX_METRICS_PORT;
use basecamp_sandbox::run::exit_code;
use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyOnPodConditionsPattern,
    PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvFromSource, EnvVar, EnvVarSource,
    ObjectFieldSelector, PodSpec, PodTemplateSpec, ResourceRequirements, SecretEnvSource, SecretKeySelector, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;

use super::affinity::{GPU_RESOURCE, gpu_affinity, gpu_tolerations};
use super::configmap::MANIFESTS_KEY;
use super::names::{
    CHECKPOINT_ANNOTATION, KUEUE_QUEUE_LABEL, ROLE_EVALUATION, ROLE_LABEL, STEP_LABEL, TEMPLATE_HASH_ANNOTATION,
    config_map_name, indexed_job_name, labels, stable_hash,
};
use super::policy_server::{self, CHECKPOINT_ENV, STEP_ENV, Served};
use super::security::{container_security_context, pod_security_context};
use super::{BuildError, BuildInput, ResolvedVariant};
use crate::settings::{OPERATOR_BINARY_IN_IMAGE, SANDBOX_BINARY_IN_IMAGE, Settings};

/// The sandbox container's name (the pod failure policy matches on it).
pub const SANDBOX_CONTAINER: &str = "sandbox";
/// The init container that copies the sandbox binary.
pub const INJECT_CONTAINER: &str = "inject-sandbox";
/// Where the manifests are mounted.
pub const CONFIG_DIR: &str = "/etc/basecamp";
/// The writable directory (an emptyDir) traces are written under. Not the
/// working directory: the sandbox runs in the tools image's own `WORKDIR`
/// (`--base-dir .`), where its tools and services are, and an emptyDir
/// mounted there would hide them.
pub const WORK_DIR: &str = "/basecamp/work";
/// Where the injected binary lives in a tools image.
pub const INJECTED_BIN_DIR: &str = "/basecamp/bin";
/// Env var holding the pod's index; the kubelet expands it in args.
pub const INDEX_ENV: &str = "JOB_COMPLETION_INDEX";
/// Exit code of `basecamp-sandbox run`: configuration (or GPU) refused.
pub const EXIT_CONFIG_ERROR: i32 = exit_code::CONFIG_ERROR as i32;
/// Exit code: episodes lost (their traces could not be written).
pub const EXIT_LOST_EPISODES: i32 = exit_code::LOST_EPISODES as i32;
/// Exit code: the upload failed (local copies kept).
pub const EXIT_UPLOAD_FAILED: i32 = exit_code::UPLOAD_FAILED as i32;
/// Exit code: SIGTERM cut the shard off before all its episodes ended.
pub const EXIT_STOPPED_EARLY: i32 = exit_code::STOPPED_EARLY as i32;
/// Exit code: something needed before the first episode was unavailable for a while.
pub const EXIT_UNAVAILABLE: i32 = exit_code::UNAVAILABLE as i32;

/// A checkpoint whose evaluation a Job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointUnderTest {
    /// The training step.
    pub step: u64,
    /// Where the checkpoint is, `C/step-N/`.
    pub location: String,
}

impl CheckpointUnderTest {
    /// The Job of `variant`'s evaluation of this checkpoint:
    /// `<task>-s<N>-<variant>` ([`indexed_job_name`]).
    pub fn job_name(&self, task: &str, variant: &str, completions: i32) -> String {
        indexed_job_name(&format!("{task}-s{}-{variant}", self.step), completions)
    }

    fn labels(&self) -> [(String, String); 2] {
        [(STEP_LABEL.to_string(), self.step.to_string()), (ROLE_LABEL.to_string(), ROLE_EVALUATION.to_string())]
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount { name: name.into(), mount_path: path.into(), read_only: Some(read_only), ..Default::default() }
}

fn empty_dir(name: &str) -> Volume {
    Volume { name: name.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() }
}

/// The sandbox container's port that the chart's PodMonitor scrapes.
pub const METRICS_PORT_NAME: &str = "metrics";

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), value_from: None }
}

/// The sandbox's arguments: `run --config ... --shard $(JOB_COMPLETION_INDEX)/N
/// --listen 0.0.0.0:9464` (`/metrics` for the chart's PodMonitor, `/healthz`,
/// live injection through `kubectl port-forward`), `--metrics-linger D`
/// (before the first episode, wait for a first scrape of the series at
/// zero; after the shard, serve `/metrics` until a scrape saw the final
/// counts; each at most `D`: a short pod may otherwise never be scraped, or
/// scraped once, which `rate()` cannot see), and
/// `--checkpoint-step N` when it evaluates a checkpoint.
///
/// The wait needs no longer `terminationGracePeriodSeconds`: it happens
/// only when the shard ended by itself, and SIGTERM ends it at once.
pub fn sandbox_args(
    task: &str,
    variant: &str,
    shards: u32,
    step: Option<u64>,
    metrics_linger: std::time::Duration,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "run",
        "--config",
        &format!("{CONFIG_DIR}/{MANIFESTS_KEY}"),
        "--task",
        task,
        "--variant",
        variant,
        "--shard",
        &format!("$({INDEX_ENV})/{shards}"),
        "--out",
        &format!("{WORK_DIR}/traces"),
        "--base-dir",
        ".",
        "--listen",
        &format!("0.0.0.0:{SANDBOX_METRICS_PORT}"),
        "--metrics-linger",
        &basecamp_api::Duration::from(metrics_linger).to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(step) = step {
        args.extend(["--checkpoint-step".to_string(), step.to_string()]);
    }
    args
}

/// An init container that copies a binary of the Basecamp image
/// (`settings.sandbox_image`, pulled with its pull policy) from `from` into
/// the `basecamp-bin` emptyDir (`to`), so that another image can run it.
pub fn inject_container(name: &str, settings: &Settings, from: &str, to: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(settings.sandbox_image.clone()),
        image_pull_policy: settings.image_pull_policy.clone(),
        command: Some(vec![OPERATOR_BINARY_IN_IMAGE.into()]),
        args: Some(vec!["inject-sandbox".into(), "--from".into(), from.into(), "--to".into(), to.into()]),
        volume_mounts: Some(vec![mount("basecamp-bin", INJECTED_BIN_DIR, false)]),
        security_context: Some(container_security_context()),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), Quantity("10m".into())),
                ("memory".into(), Quantity("32Mi".into())),
            ])),
            limits: Some(BTreeMap::from([("memory".into(), Quantity("64Mi".into()))])),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn resources(variant: &ResolvedVariant) -> Option<ResourceRequirements> {
    let mut resources = variant.spec.resources.clone().unwrap_or_default();
    let gpus = variant.spec.gpu.as_ref().map_or(0, |g| g.gpu_count());
    if gpus > 0 {
        let quantity = Quantity(gpus.to_string());
        resources.requests.get_or_insert_with(BTreeMap::new).insert(GPU_RESOURCE.into(), quantity.clone());
        resources.limits.get_or_insert_with(BTreeMap::new).insert(GPU_RESOURCE.into(), quantity);
    }
    (resources != ResourceRequirements::default()).then_some(resources)
}

fn sandbox_env(input: &BuildInput<'_>, checkpoint: Option<&CheckpointUnderTest>) -> Vec<EnvVar> {
    let mut vars = vec![
        EnvVar {
            name: INDEX_ENV.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.annotations['batch.kubernetes.io/job-completion-index']".into(),
                    api_version: None,
                }),
                ..Default::default()
            }),
        },
        env("HOME", "/tmp"),
    ];
    if let Some(checkpoint) = checkpoint {
        vars.push(env(CHECKPOINT_ENV, &checkpoint.location));
        vars.push(env(STEP_ENV, &checkpoint.step.to_string()));
    }
    if let Some(endpoint) = &input.settings.s3_endpoint {
        vars.push(env("AWS_ENDPOINT_URL_S3", endpoint));
    }
    // Without it the pods' SDK falls back to us-east-1, and a bucket in
    // another region (or a store that checks the signing region) refuses
    // the uploads the operator's own reads succeed with.
    if let Some(region) = &input.settings.s3_region {
        vars.push(env("AWS_REGION", region));
    }
    if let Some(secret) = &input.task.spec.policy.api_key_secret {
        vars.push(EnvVar {
            name: basecamp_sandbox::config::API_KEY_ENV.into(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.name.clone(),
                    key: secret.key.clone().unwrap_or_else(|| "apiKey".into()),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
        });
    }
    vars
}

/// What the policy-server sidecar serves in the variants' own Jobs: the
/// checkpoint training resumes from, else the model id (the trainer's,
/// else the policy's), at the resumed step (0 without one).
pub fn served_by_default(input: &BuildInput<'_>) -> Served {
    let spec = &input.task.spec;
    let training = spec.training_config.as_ref();
    let resume_from = training.and_then(|t| t.resume_from.clone());
    let step = resume_from.as_deref().and_then(basecamp_api::task::parse_checkpoint_step).unwrap_or(0);
    let checkpoint =
        resume_from.or_else(|| training.and_then(|t| t.model_id.clone())).or_else(|| spec.policy.model.clone());
    Served { checkpoint, step: Some(step) }
}

/// The pod template of one variant (evaluating `checkpoint` when given).
pub fn pod_template(
    input: &BuildInput<'_>,
    variant: &ResolvedVariant,
    checkpoint: Option<&CheckpointUnderTest>,
) -> Result<PodTemplateSpec, BuildError> {
    let shards = input.task.spec.shards();
    let gpu = variant.spec.gpu.clone().unwrap_or_default();
    let min_cc = gpu
        .min_compute_capability()
        .map_err(|source| BuildError::InvalidComputeCapability { variant: variant.name.clone(), source })?;
    let tools_image = variant.spec.image.clone().filter(|i| !i.trim().is_empty());
    let mut volumes = vec![
        Volume {
            name: "manifests".into(),
            config_map: Some(ConfigMapVolumeSource { name: config_map_name(input.name), ..Default::default() }),
            ..Default::default()
        },
        empty_dir("work"),
        empty_dir("tmp"),
    ];
    let mut mounts =
        vec![mount("manifests", CONFIG_DIR, true), mount("work", WORK_DIR, false), mount("tmp", "/tmp", false)];
    let mut init_containers = Vec::new();
    let (image, command) = match &tools_image {
        Some(image) => {
            volumes.push(empty_dir("basecamp-bin"));
            mounts.push(mount("basecamp-bin", INJECTED_BIN_DIR, true));
            let injected = format!("{INJECTED_BIN_DIR}/basecamp-sandbox");
            init_containers.push(inject_container(
                INJECT_CONTAINER,
                input.settings,
                SANDBOX_BINARY_IN_IMAGE,
                &injected,
            ));
            (image.clone(), injected)
        }
        None => (input.settings.sandbox_image.clone(), SANDBOX_BINARY_IN_IMAGE.to_string()),
    };
    // The pull policy is the Basecamp image's: a tools image keeps its own.
    let image_pull_policy = tools_image.is_none().then(|| input.settings.image_pull_policy.clone()).flatten();
    let sandbox = Container {
        name: SANDBOX_CONTAINER.into(),
        image: Some(image),
        image_pull_policy,
        command: Some(vec![command]),
        args: Some(sandbox_args(
            input.name,
            &variant.name,
            shards,
            checkpoint.map(|c| c.step),
            input.settings.sandbox_metrics_linger,
        )),
        env: Some(sandbox_env(input, checkpoint)),
        env_from: input.settings.s3_secret.as_ref().map(|name| {
            vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource { name: name.clone(), optional: Some(true) }),
                ..Default::default()
            }]
        }),
        resources: resources(variant),
        ports: Some(vec![ContainerPort {
            name: Some(METRICS_PORT_NAME.into()),
            container_port: i32::from(SANDBOX_METRICS_PORT),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        security_context: Some(container_security_context()),
        volume_mounts: Some(mounts),
        // `kubectl describe pod` then shows the sandbox's last error line
        // (e.g. "GPU arch not supported ...") without reading logs.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let server = input.task.spec.policy.server.as_ref();
    if let Some(server) = server {
        let served = match checkpoint {
            Some(c) => Served { checkpoint: Some(c.location.clone()), step: Some(c.step) },
            None => served_by_default(input),
        };
        // After `inject-sandbox`: init containers start in order, and the
        // sandbox starts once the sidecar's startup probe passed.
        init_containers.push(policy_server::sidecar(server, &served, "tmp"));
    }
    let needs_gpu = gpu.gpu_count() > 0 || server.and_then(|s| s.gpus).unwrap_or(0) > 0;
    let mut pod_labels = labels(input.name, Some(&variant.name));
    pod_labels.extend(checkpoint.iter().flat_map(|c| c.labels()));
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some(pod_labels), ..Default::default() }),
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            runtime_class_name: variant.spec.runtime_class_name.clone(),
            // By default the pods run the operator's image: from a private
            // registry they need its pull secrets too.
            image_pull_secrets: input.settings.pod_image_pull_secrets(),
            security_context: Some(pod_security_context()),
            affinity: gpu_affinity(&gpu, min_cc),
            tolerations: needs_gpu.then(gpu_tolerations),
            init_containers: (!init_containers.is_empty()).then_some(init_containers),
            containers: vec![sandbox],
            volumes: Some(volumes),
            ..Default::default()
        }),
    })
}

/// The pod failure policy (see the module docs).
pub fn pod_failure_policy() -> PodFailurePolicy {
    let exit_codes = |operator: &str, values: Vec<i32>| PodFailurePolicyOnExitCodesRequirement {
        container_name: Some(SANDBOX_CONTAINER.into()),
        operator: operator.into(),
        values,
    };
    PodFailurePolicy {
        rules: vec![
            PodFailurePolicyRule {
                action: "FailIndex".into(),
                on_exit_codes: Some(exit_codes("In", vec![EXIT_CONFIG_ERROR])),
                on_pod_conditions: None,
            },
            PodFailurePolicyRule {
                action: "Ignore".into(),
                on_exit_codes: None,
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".into(),
                    status: Some("True".into()),
                }]),
            },
            PodFailurePolicyRule {
                action: "Count".into(),
                on_exit_codes: Some(exit_codes(
                    "In",
                    vec![EXIT_LOST_EPISODES, EXIT_UPLOAD_FAILED, EXIT_UNAVAILABLE, EXIT_STOPPED_EARLY],
                )),
                on_pod_conditions: None,
            },
        ],
    }
}

/// What a variant's pods read of `manifests.yaml` (the ConfigMap, not the
/// pod template): the task's description (the system prompt), evaluation,
/// policy and trace destination, and the variant's resolved SandboxConfig.
/// Part of the template hash, so an edit that only reaches the ConfigMap (a
/// tool's URL, the policy's model, the test set) replaces the Job and runs
/// its shards again, instead of leaving a finished Job's results standing
/// for a spec they did not run; fields the pods do not read (`suspend`,
/// `queueName`, `parallelism`, `successCriteria`, retention, training, the
/// other variants' sandboxes) replace nothing.
fn pod_inputs(input: &BuildInput<'_>, variant: &ResolvedVariant) -> serde_json::Value {
    let spec = &input.task.spec;
    serde_json::json!({
        "description": spec.task_definition.description,
        "evaluation": spec.evaluation,
        "policy": spec.policy,
        "destination": spec.traces.as_ref().and_then(|t| t.destination.as_deref()),
        "sandbox": variant.spec,
    })
}

/// The Job of one variant.
pub fn job(input: &BuildInput<'_>, variant: &ResolvedVariant) -> Result<Job, BuildError> {
    job_for(input, variant, None)
}

/// The Job of one variant, or of its evaluation of `checkpoint`.
pub fn job_for(
    input: &BuildInput<'_>,
    variant: &ResolvedVariant,
    checkpoint: Option<&CheckpointUnderTest>,
) -> Result<Job, BuildError> {
    let shards = input.task.spec.shards();
    let completions = i32::try_from(shards).unwrap_or(i32::MAX);
    let parallelism =
        input.task.spec.parallelism.map_or(completions, |p| i32::try_from(p).unwrap_or(i32::MAX).min(completions));
    let template = pod_template(input, variant, checkpoint)?;
    let immutable = serde_json::json!({
        "template": &template,
        "completions": completions,
        "podFailurePolicy": pod_failure_policy(),
        "backoffLimitPerIndex": input.settings.backoff_limit_per_index,
        "manifests": pod_inputs(input, variant),
    });
    let hash = stable_hash(immutable.to_string().as_bytes());
    let mut job_labels = labels(input.name, Some(&variant.name));
    job_labels.extend(checkpoint.iter().flat_map(|c| c.labels()));
    if let Some(queue) = input.task.spec.queue_name.as_deref().filter(|q| !q.is_empty()) {
        job_labels.insert(KUEUE_QUEUE_LABEL.into(), queue.into());
    }
    let mut annotations = BTreeMap::from([(TEMPLATE_HASH_ANNOTATION.to_string(), hash)]);
    if let Some(checkpoint) = checkpoint {
        annotations.insert(CHECKPOINT_ANNOTATION.to_string(), checkpoint.location.clone());
    }
    let name = match checkpoint {
        Some(checkpoint) => checkpoint.job_name(input.name, &variant.name, completions),
        None => indexed_job_name(&format!("{}-{}", input.name, variant.name), completions),
    };
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(input.namespace.to_string()),
            labels: Some(job_labels),
            annotations: Some(annotations),
            owner_references: Some(vec![input.owner.clone()]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(completions),
            parallelism: Some(parallelism),
            backoff_limit_per_index: Some(input.settings.backoff_limit_per_index),
            pod_failure_policy: Some(pod_failure_policy()),
            ttl_seconds_after_finished: Some(input.settings.job_ttl_seconds),
            suspend: Some(input.task.spec.suspend),
            template,
            ..Default::default()
        }),
        status: None,
    })
}
