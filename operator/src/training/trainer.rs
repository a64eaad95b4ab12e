//! The trainer Job (TRAINING.md, "The trainer Job"): `inject-basecamp`
//! copies the `basecamp` CLI into an emptyDir; `dataset` (with
//! `dataPipeline`, in the trainer image, so a `python:module.function`
//! preprocessor imports the user's code) runs `basecamp data preprocess`
//! into `C/dataset/`; `trainer` runs the user's command with GPUs placed
//! like the first variant's sandbox. `backoffLimit: 0`: a trainer that
//! fails is reported, not restarted from scratch.
//!
//! And the trainer's state as status shows it: its phase from the Job, and
//! why it failed from its pod's termination message.

use std::collections::BTreeMap;

use basecamp_api::task::TaskPhase;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerStatus, EmptyDirVolumeSource, EnvFromSource, EnvVar, Pod, PodSpec,
    PodTemplateSpec, ResourceRequirements, SecretEnvSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;

use super::locations::Locations;
use crate::build::affinity::{GPU_RESOURCE, gpu_affinity, gpu_tolerations};
use crate::build::configmap::MANIFESTS_KEY;
use crate::build::job::{CONFIG_DIR, INJECTED_BIN_DIR, WORK_DIR, inject_container};
use crate::build::names::{
    KUEUE_QUEUE_LABEL, ROLE_LABEL, ROLE_TRAINER, TEMPLATE_HASH_ANNOTATION, config_map_name, job_name, labels,
    stable_hash,
};
use crate::build::security::{container_security_context, pod_security_context};
use crate::build::{BuildError, BuildInput};
use crate::settings::CLI_BINARY_IN_IMAGE;

/// The init container that copies the `basecamp` CLI.
pub const INJECT_CONTAINER: &str = "inject-basecamp";
/// The init container that preprocesses the dataset.
pub const DATASET_CONTAINER: &str = "dataset";
/// The trainer's container.
pub const TRAINER_CONTAINER: &str = "trainer";
/// What `job_name(task, ...)` is given for the trainer Job.
pub const TRAINER_JOB_SUFFIX: &str = "train";

/// The trainer Job's name: `<task>-train`.
pub fn trainer_job_name(task: &str) -> String {
    job_name(task, TRAINER_JOB_SUFFIX)
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), value_from: None }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount { name: name.into(), mount_path: path.into(), read_only: Some(read_only), ..Default::default() }
}

fn empty_dir(name: &str, medium: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource { medium: medium.map(Into::into), ..Default::default() }),
        ..Default::default()
    }
}

/// The environment of `dataset` and `trainer` (TRAINING.md's table).
pub fn trainer_env(input: &BuildInput<'_>, locations: &Locations) -> Result<Vec<EnvVar>, BuildError> {
    let spec = &input.task.spec;
    let training = spec.training_config.clone().unwrap_or_default();
    let mut vars = vec![
        env("BASECAMP_TASK", input.name),
        env("BASECAMP_NAMESPACE", input.namespace),
        env("BASECAMP_CHECKPOINTS", &locations.checkpoints),
        env("BASECAMP_COMPLETION_MARKER", training.completion_marker()),
    ];
    if let Some(resume_from) = &training.resume_from {
        vars.push(env("BASECAMP_RESUME_FROM", resume_from));
    }
    if let Some(dataset) = &locations.dataset {
        vars.push(env("BASECAMP_DATASET", dataset));
        let format = spec.data_pipeline.as_ref().and_then(|d| d.format).unwrap_or_default();
        vars.push(env("BASECAMP_DATASET_FORMAT", format.name()));
    }
    if let Some(model_id) = &training.model_id {
        vars.push(env("BASECAMP_MODEL_ID", model_id));
    }
    if let Some(batch_size) = spec.data_pipeline.as_ref().and_then(|d| d.batch_size) {
        vars.push(env("BASECAMP_BATCH_SIZE", &batch_size.to_string()));
    }
    let config = serde_json::to_string(&training)
        .map_err(|e| BuildError::Render { what: "trainingConfig as JSON".into(), message: e.to_string() })?;
    vars.push(env("BASECAMP_TRAINING_CONFIG", &config));
    if let Some(endpoint) = &input.settings.s3_endpoint {
        vars.push(env("AWS_ENDPOINT_URL_S3", endpoint));
    }
    if let Some(region) = &input.settings.s3_region {
        vars.push(env("AWS_REGION", region));
    }
    vars.push(env("HOME", "/tmp"));
    Ok(vars)
}

fn s3_secret(input: &BuildInput<'_>) -> Option<Vec<EnvFromSource>> {
    input.settings.s3_secret.as_ref().map(|name| {
        vec![EnvFromSource {
            secret_ref: Some(SecretEnvSource { name: name.clone(), optional: Some(true) }),
            ..Default::default()
        }]
    })
}

/// `basecamp data preprocess <source> [--version V] --config ... --base-dir . --out C/dataset/`.
pub fn preprocess_args(source: &str, version: Option<&str>, dataset: &str) -> Vec<String> {
    let mut args = vec!["data".to_string(), "preprocess".to_string(), source.to_string()];
    if let Some(version) = version {
        args.extend(["--version".to_string(), version.to_string()]);
    }
    args.extend([
        "--config".to_string(),
        format!("{CONFIG_DIR}/{MANIFESTS_KEY}"),
        // The image's working directory, where the user's preprocessor is (as for sandbox pods).
        "--base-dir".to_string(),
        ".".to_string(),
        "--out".to_string(),
        dataset.to_string(),
    ]);
    args
}

/// The trainer Job of a task with `trainingConfig.image` (`None` without one).
pub fn trainer_job(input: &BuildInput<'_>, locations: &Locations) -> Result<Option<Job>, BuildError> {
    let spec = &input.task.spec;
    let Some(training) = spec.training_config.as_ref() else { return Ok(None) };
    let Some(image) = training.image.as_deref().filter(|i| !i.trim().is_empty()) else { return Ok(None) };
    let vars = trainer_env(input, locations)?;
    let injected = format!("{INJECTED_BIN_DIR}/basecamp");
    let shared_mounts = || {
        vec![
            mount("manifests", CONFIG_DIR, true),
            mount("basecamp-bin", INJECTED_BIN_DIR, true),
            mount("work", WORK_DIR, false),
            mount("tmp", "/tmp", false),
        ]
    };
    let mut init_containers = vec![inject_container(INJECT_CONTAINER, input.settings, CLI_BINARY_IN_IMAGE, &injected)];
    if let (Some(pipeline), Some(dataset)) = (&spec.data_pipeline, &locations.dataset) {
        init_containers.push(Container {
            name: DATASET_CONTAINER.into(),
            image: Some(image.to_string()),
            command: Some(vec![injected.clone()]),
            args: Some(preprocess_args(&pipeline.source, pipeline.version.as_deref(), dataset)),
            // The image's own working directory: `basecamp data preprocess`
            // keeps it on a `python:module.function` preprocessor's path.
            env: Some(vars.clone()),
            env_from: s3_secret(input),
            security_context: Some(container_security_context()),
            volume_mounts: Some(shared_mounts()),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Default::default()
        });
    }
    let gpus = training.gpus.unwrap_or(0);
    let gpu_requirement = input.variants.first().and_then(|v| v.spec.gpu.clone()).unwrap_or_default();
    let (affinity, tolerations) = if gpus > 0 {
        let min_cc =
            gpu_requirement.min_compute_capability().map_err(|source| BuildError::InvalidComputeCapability {
                variant: input.variants.first().map(|v| v.name.clone()).unwrap_or_default(),
                source,
            })?;
        (gpu_affinity(&gpu_requirement, min_cc), Some(gpu_tolerations()))
    } else {
        (None, None)
    };
    let resources = (gpus > 0).then(|| {
        let quantity = BTreeMap::from([(GPU_RESOURCE.to_string(), Quantity(gpus.to_string()))]);
        ResourceRequirements { requests: Some(quantity.clone()), limits: Some(quantity), ..Default::default() }
    });
    let mut trainer_mounts = shared_mounts();
    // PyTorch data loaders share tensors through /dev/shm, which a
    // container runtime caps at 64 MiB.
    trainer_mounts.push(mount("dshm", "/dev/shm", false));
    let trainer = Container {
        name: TRAINER_CONTAINER.into(),
        image: Some(image.to_string()),
        command: (!training.command.is_empty()).then(|| training.command.clone()),
        env: Some(vars),
        env_from: s3_secret(input),
        resources,
        security_context: Some(container_security_context()),
        volume_mounts: Some(trainer_mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let mut pod_labels = labels(input.name, None);
    pod_labels.insert("app.kubernetes.io/component".into(), ROLE_TRAINER.into());
    pod_labels.insert(ROLE_LABEL.into(), ROLE_TRAINER.into());
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some(pod_labels.clone()), ..Default::default() }),
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            security_context: Some(pod_security_context()),
            // inject-basecamp pulls the Basecamp image (and the trainer
            // image may be in the same private registry).
            image_pull_secrets: input.settings.pod_image_pull_secrets(),
            affinity,
            tolerations,
            init_containers: Some(init_containers),
            containers: vec![trainer],
            volumes: Some(vec![
                Volume {
                    name: "manifests".into(),
                    config_map: Some(ConfigMapVolumeSource { name: config_map_name(input.name), ..Default::default() }),
                    ..Default::default()
                },
                empty_dir("basecamp-bin", None),
                empty_dir("work", None),
                empty_dir("tmp", None),
                empty_dir("dshm", Some("Memory")),
            ]),
            ..Default::default()
        }),
    };
    let hash = stable_hash(serde_json::json!({"template": &template, "backoffLimit": 0}).to_string().as_bytes());
    // Through Kueue like the sandbox Jobs: created suspended, admitted by Kueue.
    let mut job_labels = pod_labels;
    if let Some(queue) = spec.queue_name.as_deref().filter(|q| !q.is_empty()) {
        job_labels.insert(KUEUE_QUEUE_LABEL.into(), queue.into());
    }
    Ok(Some(Job {
        metadata: ObjectMeta {
            name: Some(trainer_job_name(input.name)),
            namespace: Some(input.namespace.to_string()),
            labels: Some(job_labels),
            annotations: Some(BTreeMap::from([(TEMPLATE_HASH_ANNOTATION.to_string(), hash)])),
            owner_references: Some(vec![input.owner.clone()]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            completions: Some(1),
            parallelism: Some(1),
            ttl_seconds_after_finished: Some(input.settings.job_ttl_seconds),
            suspend: Some(spec.suspend),
            template,
            ..Default::default()
        }),
        status: None,
    }))
}

fn job_condition(job: &Job, type_: &str) -> Option<String> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| c.message.clone().unwrap_or_default())
}

/// Image and configuration problems that keep a container waiting forever.
const STUCK_REASONS: [&str; 5] =
    ["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"];

fn statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    let status = pod.status.as_ref();
    let init = status.and_then(|s| s.init_container_statuses.as_deref()).unwrap_or_default();
    let main = status.and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
    init.iter().chain(main.iter())
}

/// Why a trainer pod failed: the first container (in start order) that
/// exited non-zero, with its termination message (FallbackToLogsOnError:
/// the last lines of its log).
pub fn failure_message(pods: &[Pod]) -> Option<String> {
    pods.iter().flat_map(statuses).find_map(|status| {
        let terminated = status.state.as_ref()?.terminated.as_ref()?;
        (terminated.exit_code != 0).then(|| {
            let detail = terminated
                .message
                .as_deref()
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .or(terminated.reason.as_deref())
                .unwrap_or("no message");
            format!("container {} exited with code {}: {detail}", status.name, terminated.exit_code)
        })
    })
}

/// Why a trainer pod cannot start (an image that cannot be pulled, a missing Secret).
pub fn stuck_message(pods: &[Pod]) -> Option<String> {
    pods.iter().flat_map(statuses).find_map(|status| {
        let waiting = status.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        STUCK_REASONS.contains(&reason).then(|| {
            format!("container {} is waiting: {reason}: {}", status.name, waiting.message.as_deref().unwrap_or(""))
        })
    })
}

fn started(pod: &Pod) -> bool {
    statuses(pod).any(|s| s.state.as_ref().is_some_and(|st| st.running.is_some() || st.terminated.is_some()))
}

/// The trainer's phase and message, from its Job and pods. A Job that is
/// gone (its TTL removed it) keeps the previous phase once finished.
pub fn trainer_state(job: Option<&Job>, pods: &[Pod], previous: Option<TaskPhase>) -> (TaskPhase, Option<String>) {
    let Some(job) = job else {
        return match previous {
            Some(phase @ (TaskPhase::Succeeded | TaskPhase::Failed)) => (phase, None),
            _ => (TaskPhase::Pending, None),
        };
    };
    if job_condition(job, "Complete").is_some() {
        return (TaskPhase::Succeeded, None);
    }
    if let Some(condition) = job_condition(job, "Failed") {
        let message = failure_message(pods)
            .or_else(|| (!condition.is_empty()).then(|| format!("the trainer Job failed: {condition}")))
            .unwrap_or_else(|| "the trainer Job failed".to_string());
        return (TaskPhase::Failed, Some(message));
    }
    let ready = job.status.as_ref().and_then(|s| s.ready).unwrap_or(0) > 0;
    if ready || pods.iter().any(started) {
        (TaskPhase::Running, None)
    } else {
        (TaskPhase::Pending, stuck_message(pods))
    }
}
