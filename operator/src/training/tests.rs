//! Tests of the training loop: the pure builders (trainer Job, evaluation
//! Jobs, the policy-server sidecar), checkpoint selection, the trainer's
//! state, the status interplay, and the reconcile step against a mocked
//! API server and a real S3 server (s3s-fs on loopback).

use std::collections::{BTreeMap, BTreeSet};

use basecamp_api::HarnessTask;
use basecamp_api::sandbox::SandboxConfigSpec;
use basecamp_api::task::{CheckpointEvaluation, TaskPhase, TrainingStatus};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::checkpoints::{
    Discovery, KnownSteps, MARKER_LOOKAHEAD, discover, ignored_note, marker_check_budget, merge, misnamed_dirs, newest,
    parse_steps, plan, root_changed_note, step_dirs,
};
use super::locations::Locations;
use super::*;
use crate::build::ResolvedVariant;
use crate::build::job::job_for;
use crate::controller::status::{self, Observed};
use crate::settings::Settings;

fn task_with(spec: Value) -> HarnessTask {
    serde_json::from_value(json!({
        "apiVersion": "basecamp.dev/v1alpha1",
        "kind": "HarnessTask",
        "metadata": {"name": "eval", "namespace": "team-a", "uid": "uid-1", "generation": 1},
        "spec": spec,
    }))
    .expect("task")
}

fn training_spec(bucket: &str) -> Value {
    json!({
        "taskDefinition": {"successCriteria": ["tool_call_accuracy >= 0.5"]},
        "dataPipeline": {"source": "s3://logs/shop/", "version": "v3", "preprocessor": "builtin:trajectory", "batchSize": 16},
        "trainingConfig": {
            "modelId": "shop-base",
            "resumeFrom": format!("s3://{bucket}/traces/checkpoints/team-a/eval/step-10/"),
            "image": "trainer:1",
            "command": ["python3", "trainer.py"],
            "gpus": 2,
            "maxConcurrentEvaluations": 1,
        },
        "evaluation": {"testSet": "s3://datasets/shop/tests.jsonl"},
        "policy": {"scripted": "s3://datasets/shop/policy.jsonl"},
        "sandboxRef": {"name": "shop"},
        "shards": 2,
        "traces": {"destination": format!("s3://{bucket}/traces")},
    })
}

fn sandbox(min_cc: Option<&str>) -> SandboxConfigSpec {
    let mut value = json!({"tools": {"track_order": {"http": {"url": "https://shop.example.com/orders/{order_id}"}}}});
    if let Some(cc) = min_cc {
        value["gpu"] = json!({"required": true, "minComputeCapability": cc});
    }
    serde_json::from_value(value).expect("sandbox")
}

fn variant(name: &str, min_cc: Option<&str>) -> ResolvedVariant {
    ResolvedVariant { name: name.into(), sandbox_name: "shop".into(), profile: None, spec: sandbox(min_cc) }
}

fn settings() -> Settings {
    Settings { s3_endpoint: Some("http://10.1.2.3:9000".into()), s3_secret: Some("s3".into()), ..Default::default() }
}

fn to_json(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("json")
}

fn env_of(container: &Value) -> BTreeMap<String, String> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
        .collect()
}

fn trainer_json(task: &HarnessTask, variants: Vec<ResolvedVariant>) -> Value {
    let settings = settings();
    let input = BuildInput::new(task, variants, &settings).expect("input");
    let locations = Locations::of(task, "team-a", "eval").expect("locations");
    to_json(&trainer::trainer_job(&input, &locations).expect("build").expect("a trainer"))
}

// --- locations -------------------------------------------------------------------------------

#[test]
fn the_checkpoint_root_defaults_under_the_trace_destination() {
    let task = task_with(training_spec("bkt"));
    let locations = Locations::of(&task, "team-a", "eval").expect("locations");
    assert_eq!(locations.checkpoints, "s3://bkt/traces/checkpoints/team-a/eval/");
    assert_eq!(locations.dataset.as_deref(), Some("s3://bkt/traces/checkpoints/team-a/eval/dataset/"));
    assert_eq!(
        locations.steps_file.map(|f| f.to_string()).as_deref(),
        Some("s3://bkt/traces/reports/team-a/eval/steps.json")
    );
    assert_eq!(locations.resumed_from_step, Some(10));

    let mut spec = training_spec("bkt");
    spec["trainingConfig"]["checkpoints"] = json!("s3://ckpt/runs/7");
    spec.as_object_mut().expect("spec").remove("dataPipeline");
    let locations = Locations::of(&task_with(spec), "team-a", "eval").expect("locations");
    assert_eq!(locations.checkpoints, "s3://ckpt/runs/7/", "always ending in /");
    assert_eq!(locations.dataset, None, "no dataPipeline, no dataset");
}

// --- the trainer Job ---------------------------------------------------------------------------

/// The trainer pod pulls the Basecamp image (inject-basecamp) with the
/// operator's pull secrets and policy; the trainer image keeps its policy.
#[test]
fn the_trainer_job_gets_the_image_pull_secrets_and_policy() {
    let task = task_with(training_spec("bkt"));
    let settings =
        Settings { image_pull_secrets: vec!["regcred".into()], image_pull_policy: Some("Never".into()), ..settings() };
    let input = BuildInput::new(&task, vec![variant("default", None)], &settings).expect("input");
    let locations = Locations::of(&task, "team-a", "eval").expect("locations");
    let job = to_json(&trainer::trainer_job(&input, &locations).expect("build").expect("a trainer"));
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(pod["initContainers"][0]["name"], "inject-basecamp");
    assert_eq!(pod["initContainers"][0]["imagePullPolicy"], "Never");
    assert!(pod["containers"][0].get("imagePullPolicy").is_none(), "the trainer image keeps its default");
    // Evaluation Jobs are the variants' Jobs: the same pod template.
    let under_test = CheckpointUnderTest { step: 20, location: "s3://bkt/c/step-20/".into() };
    let eval = to_json(&evaluation::evaluation_jobs(&input, &under_test).expect("jobs")[0]);
    assert_eq!(eval["spec"]["template"]["spec"]["imagePullSecrets"], json!([{"name": "regcred"}]));
}

/// The operator's S3 region reaches the trainer's containers as the endpoint does.
#[test]
fn the_trainer_job_gets_the_s3_region() {
    let task = task_with(training_spec("bkt"));
    let settings = Settings { s3_region: Some("eu-central-1".into()), ..settings() };
    let input = BuildInput::new(&task, vec![variant("default", None)], &settings).expect("input");
    let locations = Locations::of(&task, "team-a", "eval").expect("locations");
    let job = to_json(&trainer::trainer_job(&input, &locations).expect("build").expect("a trainer"));
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(env_of(&pod["containers"][0])["AWS_REGION"], "eu-central-1", "the trainer");
    assert_eq!(env_of(&pod["initContainers"][1])["AWS_REGION"], "eu-central-1", "the dataset preprocessor");
}

#[test]
fn the_trainer_job_injects_basecamp_preprocesses_and_trains_on_gpus() {
    let task = task_with(training_spec("bkt"));
    let job = trainer_json(&task, vec![variant("default", Some("8.6")), variant("b", Some("9.0"))]);
    assert_eq!(job["metadata"]["name"], "eval-train");
    assert_eq!(job["metadata"]["labels"]["basecamp.dev/task"], "eval");
    assert_eq!(job["metadata"]["labels"]["basecamp.dev/role"], "trainer");
    assert_eq!(job["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert!(job["metadata"]["annotations"]["basecamp.dev/template-hash"].is_string());
    assert_eq!(job["spec"]["backoffLimit"], 0);
    assert_eq!(job["spec"]["ttlSecondsAfterFinished"], 604_800);
    let pod = &job["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["basecamp.dev/role"], "trainer");
    assert_eq!(pod["metadata"]["labels"]["basecamp.dev/task"], "eval");
    let spec = &pod["spec"];
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(spec["automountServiceAccountToken"], false);
    let inits = spec["initContainers"].as_array().expect("init containers");
    assert_eq!(
        inits.iter().map(|c| c["name"].as_str().unwrap_or("")).collect::<Vec<_>>(),
        ["inject-basecamp", "dataset"]
    );
    assert_eq!(inits[0]["image"], "basecamp:dev");
    assert_eq!(
        inits[0]["args"],
        json!(["inject-sandbox", "--from", "/usr/local/bin/basecamp", "--to", "/basecamp/bin/basecamp"])
    );
    let dataset = &inits[1];
    assert_eq!(dataset["image"], "trainer:1", "the trainer image: a python preprocessor imports the user's code");
    assert_eq!(dataset["command"], json!(["/basecamp/bin/basecamp"]));
    assert_eq!(
        dataset["args"],
        json!([
            "data",
            "preprocess",
            "s3://logs/shop/",
            "--version",
            "v3",
            "--config",
            "/etc/basecamp/manifests.yaml",
            "--base-dir",
            ".",
            "--out",
            "s3://bkt/traces/checkpoints/team-a/eval/dataset/"
        ])
    );
    assert_eq!(dataset["terminationMessagePolicy"], "FallbackToLogsOnError");
    assert!(dataset.get("workingDir").is_none(), "the image's WORKDIR: a python preprocessor next to the trainer");
    assert!(dataset["volumeMounts"].as_array().expect("mounts").iter().any(|m| m["mountPath"] == "/etc/basecamp"));
    let trainer = &spec["containers"][0];
    assert_eq!(trainer["name"], "trainer");
    assert_eq!(trainer["image"], "trainer:1");
    assert_eq!(trainer["command"], json!(["python3", "trainer.py"]));
    assert_eq!(trainer["terminationMessagePolicy"], "FallbackToLogsOnError");
    assert_eq!(trainer["resources"]["limits"]["nvidia.com/gpu"], "2");
    assert_eq!(trainer["envFrom"][0]["secretRef"]["name"], "s3");
    assert!(trainer.get("workingDir").is_none(), "the image's working directory (where its code is)");
    let env = env_of(trainer);
    assert_eq!(env, env_of(dataset), "dataset and trainer see the same environment");
    assert_eq!(env["BASECAMP_TASK"], "eval");
    assert_eq!(env["BASECAMP_NAMESPACE"], "team-a");
    assert_eq!(env["BASECAMP_CHECKPOINTS"], "s3://bkt/traces/checkpoints/team-a/eval/");
    assert_eq!(env["BASECAMP_COMPLETION_MARKER"], "COMPLETE");
    assert_eq!(env["BASECAMP_RESUME_FROM"], "s3://bkt/traces/checkpoints/team-a/eval/step-10/");
    assert_eq!(env["BASECAMP_DATASET"], "s3://bkt/traces/checkpoints/team-a/eval/dataset/");
    assert_eq!(env["BASECAMP_DATASET_FORMAT"], "jsonl", "the default");
    assert_eq!(env["BASECAMP_MODEL_ID"], "shop-base");
    assert_eq!(env["BASECAMP_BATCH_SIZE"], "16");
    assert_eq!(env["AWS_ENDPOINT_URL_S3"], "http://10.1.2.3:9000");
    assert!(!env.contains_key("AWS_REGION"), "no region set, none passed");
    let config: Value = serde_json::from_str(&env["BASECAMP_TRAINING_CONFIG"]).expect("JSON");
    assert_eq!(config["modelId"], "shop-base");
    assert_eq!(config["gpus"], 2);
    // The first variant's compute capability (8.6), not the second's.
    let terms =
        &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    assert_eq!(
        terms[0]["matchExpressions"][0],
        json!({"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["8"]})
    );
    assert_eq!(
        terms[1]["matchExpressions"][1],
        json!({"key": "nvidia.com/gpu.compute.minor", "operator": "Gt", "values": ["5"]})
    );
    assert_eq!(spec["tolerations"][0]["key"], "nvidia.com/gpu");
}

#[test]
fn the_trainer_is_told_the_datasets_format() {
    let mut spec = training_spec("bkt");
    spec["dataPipeline"]["format"] = json!("parquet");
    let job = trainer_json(&task_with(spec), vec![variant("default", None)]);
    let env = env_of(&job["spec"]["template"]["spec"]["containers"][0]);
    assert_eq!(env["BASECAMP_DATASET_FORMAT"], "parquet");
}

#[test]
fn a_cpu_trainer_without_data_pipeline_has_no_dataset_step_and_no_gpu_placement() {
    let mut spec = training_spec("bkt");
    spec.as_object_mut().expect("spec").remove("dataPipeline");
    spec["trainingConfig"].as_object_mut().expect("training").remove("gpus");
    spec["trainingConfig"].as_object_mut().expect("training").remove("resumeFrom");
    spec["queueName"] = json!("gpu-queue");
    let job = trainer_json(&task_with(spec), vec![variant("default", Some("8.0"))]);
    assert_eq!(job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "gpu-queue", "admitted by Kueue");
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["initContainers"].as_array().map(Vec::len), Some(1), "inject-basecamp only");
    assert!(pod["affinity"].is_null() && pod["tolerations"].is_null());
    assert!(pod["containers"][0]["resources"].is_null());
    let env = env_of(&pod["containers"][0]);
    assert!(!env.contains_key("BASECAMP_DATASET") && !env.contains_key("BASECAMP_RESUME_FROM"), "{env:?}");
    assert!(!env.contains_key("BASECAMP_DATASET_FORMAT"), "{env:?}");

    let mut spec = training_spec("bkt");
    spec["trainingConfig"].as_object_mut().expect("training").remove("image");
    spec["trainingConfig"].as_object_mut().expect("training").remove("command");
    let task = task_with(spec);
    let settings = settings();
    let input = BuildInput::new(&task, vec![variant("default", None)], &settings).expect("input");
    assert!(!is_training(&input));
    let locations = Locations::of(&task, "team-a", "eval").expect("locations");
    assert!(trainer::trainer_job(&input, &locations).expect("build").is_none(), "no image, no trainer");
}

#[test]
fn the_network_policy_leaves_the_trainer_pod_alone() {
    let task = task_with(training_spec("bkt"));
    let settings = settings();
    let input = BuildInput::new(&task, vec![variant("default", None)], &settings).expect("input");
    let policy = to_json(&crate::build::network_policy::network_policy(&input));
    let trainer = trainer_json(&task, vec![variant("default", None)]);
    let labels = &trainer["spec"]["template"]["metadata"]["labels"];
    let expression = &policy["spec"]["podSelector"]["matchExpressions"][0];
    assert_eq!(expression["key"], "basecamp.dev/role");
    assert!(expression["values"].as_array().expect("values").contains(&labels["basecamp.dev/role"]));
}

// --- evaluation Jobs and the policy-server sidecar -------------------------------------------

fn server_spec() -> Value {
    let mut spec = training_spec("bkt");
    spec["policy"] = json!({
        "server": {"image": "vllm/vllm-openai:v0.11.0", "args": ["--model", "$(BASECAMP_CHECKPOINT)"], "gpus": 1, "startupTimeout": "5m"},
    });
    spec
}

#[test]
fn an_evaluation_job_is_the_variants_job_at_a_checkpoint() {
    let task = task_with(server_spec());
    let settings = settings();
    let variants = vec![variant("default", Some("8.0"))];
    let input = BuildInput::new(&task, variants.clone(), &settings).expect("input");
    let under_test =
        CheckpointUnderTest { step: 20, location: "s3://bkt/traces/checkpoints/team-a/eval/step-20/".into() };
    let jobs = evaluation::evaluation_jobs(&input, &under_test).expect("jobs");
    assert_eq!(jobs.len(), 1);
    let eval = to_json(&jobs[0]);
    let own = to_json(&job_for(&input, &variants[0], None).expect("job"));
    assert_eq!(eval["metadata"]["name"], "eval-s20-default");
    assert_eq!(own["metadata"]["name"], "eval-default");
    for labels in [&eval["metadata"]["labels"], &eval["spec"]["template"]["metadata"]["labels"]] {
        assert_eq!(labels["basecamp.dev/step"], "20");
        assert_eq!(labels["basecamp.dev/role"], "evaluation");
        assert_eq!(labels["basecamp.dev/task"], "eval");
        assert_eq!(labels["basecamp.dev/variant"], "default");
    }
    assert!(own["metadata"]["labels"].get("basecamp.dev/step").is_none());
    assert_eq!(eval["metadata"]["annotations"]["basecamp.dev/checkpoint"], under_test.location);
    assert_eq!(eval["spec"]["completions"], 2);
    assert_eq!(eval["spec"]["completionMode"], "Indexed");
    let pod = &eval["spec"]["template"]["spec"];
    let sandbox = &pod["containers"][0];
    let args: Vec<&str> = sandbox["args"].as_array().expect("args").iter().filter_map(Value::as_str).collect();
    assert_eq!(args[args.len() - 2..], ["--checkpoint-step", "20"]);
    assert!(args.contains(&"eval"), "--task stays the task: the sandbox names the run eval@step-20");
    let env = env_of(sandbox);
    assert_eq!(env["BASECAMP_CHECKPOINT"], under_test.location);
    assert_eq!(env["BASECAMP_STEP"], "20");
    let own_sandbox = &own["spec"]["template"]["spec"]["containers"][0];
    assert!(!own_sandbox["args"].as_array().expect("args").contains(&json!("--checkpoint-step")));
    assert!(!env_of(own_sandbox).contains_key("BASECAMP_STEP"));
    // The policy server serves the checkpoint under test; the variant's own Job, resumeFrom.
    let sidecar = |pod: &Value| {
        pod["initContainers"].as_array().expect("init").iter().find(|c| c["name"] == "policy-server").cloned()
    };
    let eval_server = sidecar(pod).expect("a sidecar in the evaluation pod");
    assert_eq!(eval_server["restartPolicy"], "Always");
    assert_eq!(eval_server["startupProbe"]["httpGet"]["path"], "/v1/models");
    assert_eq!(eval_server["startupProbe"]["httpGet"]["port"], 8000);
    assert_eq!(eval_server["startupProbe"]["failureThreshold"], 60, "5m at 5 s");
    assert_eq!(eval_server["resources"]["limits"]["nvidia.com/gpu"], "1");
    assert_eq!(env_of(&eval_server)["BASECAMP_CHECKPOINT"], under_test.location);
    assert_eq!(env_of(&eval_server)["BASECAMP_STEP"], "20");
    assert_eq!(env_of(&eval_server)["BASECAMP_POLICY_PORT"], "8000");
    let own_server = sidecar(&own["spec"]["template"]["spec"]).expect("a sidecar in the variant's pod");
    assert_eq!(env_of(&own_server)["BASECAMP_CHECKPOINT"], "s3://bkt/traces/checkpoints/team-a/eval/step-10/");
    assert_eq!(env_of(&own_server)["BASECAMP_STEP"], "10");
    assert_eq!(evaluation::selector("eval"), "basecamp.dev/task=eval,basecamp.dev/role=evaluation");
}

#[test]
fn without_resume_from_the_sidecar_serves_the_model_id_and_gpus_tolerate_gpu_nodes() {
    let mut spec = server_spec();
    spec["trainingConfig"].as_object_mut().expect("training").remove("resumeFrom");
    let task = task_with(spec);
    let settings = settings();
    let variants = vec![variant("default", None)];
    let input = BuildInput::new(&task, variants.clone(), &settings).expect("input");
    let own = to_json(&job_for(&input, &variants[0], None).expect("job"));
    let pod = &own["spec"]["template"]["spec"];
    let server = pod["initContainers"].as_array().expect("init").iter().find(|c| c["name"] == "policy-server").cloned();
    let env = env_of(&server.expect("sidecar"));
    assert_eq!(env["BASECAMP_CHECKPOINT"], "shop-base");
    assert_eq!(env["BASECAMP_STEP"], "0");
    assert_eq!(pod["tolerations"][0]["key"], "nvidia.com/gpu", "the sidecar's GPU needs a GPU node");
}

// --- checkpoint selection --------------------------------------------------------------------

#[test]
fn step_directories_are_the_step_n_children_of_the_root() {
    let names = [
        "dataset",
        "step-10",
        "step-20",
        "step-000030",
        "step-30",
        "step-x",
        "step-",
        "COMPLETE",
        "steps",
        // Above int64 (status could never hold it) and above u64.
        "step-9223372036854775808",
        "step-18446744073709551615",
        "step-99999999999999999999999",
        "step-9223372036854775807",
    ];
    let dirs = step_dirs(names);
    assert_eq!(
        dirs,
        BTreeMap::from([
            (10, vec!["step-10".to_string()]),
            (20, vec!["step-20".to_string()]),
            (30, vec!["step-000030".to_string(), "step-30".to_string()]),
            (i64::MAX as u64, vec!["step-9223372036854775807".to_string()]),
        ]),
        "every spelling of a step, in name order; nothing else is a checkpoint"
    );
}

#[test]
fn directories_named_like_a_step_that_are_not_one_are_named() {
    let names = [
        "dataset",
        "steps",
        "stepwise",
        "step-10",
        "step-000030",
        "step_25",
        "Step-40",
        "STEP-50",
        "step50",
        "step-1e3",
        "step-",
        "step",
        "step-9223372036854775808",
        "step_25",
    ];
    assert_eq!(
        misnamed_dirs(names, 10),
        ["STEP-50", "Step-40", "step", "step-", "step-1e3", "step-9223372036854775808", "step50", "step_25"],
        "sorted, once each; checkpoints, steps, stepwise and dataset are not named"
    );
    assert_eq!(misnamed_dirs(names, 2), ["STEP-50", "Step-40"], "at most the limit");
    let note = ignored_note("s3://b/c/", "step_25");
    assert!(note.starts_with("s3://b/c/step_25/ is not evaluated: ") && note.contains("step-<N>"), "{note}");
}

#[test]
fn a_changed_checkpoint_root_names_the_steps_not_evaluated_again() {
    let note = root_changed_note("s3://b/run1/", "s3://b/run2/", &steps(&[10, 20, 30, 40, 50, 60, 70]));
    assert!(note.starts_with("the checkpoint root changed from s3://b/run1/ to s3://b/run2/; "), "{note}");
    assert!(note.contains("steps 10, 20, 30, 40, 50 and 2 more were evaluated under the old root"), "{note}");
    assert!(note.ends_with("create a new HarnessTask"), "{note}");
}

#[test]
fn only_steps_that_could_start_have_their_marker_checked() {
    let dirs = step_dirs(["step-10", "step-20", "step-30", "step-40", "step-050", "step-50", "step-60", "step-70"]);
    let (evaluated, running, queued) = (steps(&[20]), steps(&[30]), steps(&[40, 50, 60]));
    let known = KnownSteps { evaluated: &evaluated, running: &running, queued_before: &queued };
    let Discovery { complete, unknown } = discover(&dirs, Some(10), known);
    assert_eq!(
        complete,
        BTreeMap::from([
            (20, "step-20".into()),
            (30, "step-30".into()),
            (40, "step-40".into()),
            (60, "step-60".into())
        ]),
        "evaluated, running and queued before: complete when last seen"
    );
    assert_eq!(unknown, [50, 70], "10 was resumed; 50 has two spellings, so its queue entry does not say which");
    let nothing = BTreeSet::new();
    let none = KnownSteps { evaluated: &nothing, running: &nothing, queued_before: &nothing };
    assert_eq!(discover(&dirs, None, none).unknown, [10, 20, 30, 40, 50, 60, 70], "oldest first");

    assert_eq!(marker_check_budget(1, 0), 1 + MARKER_LOOKAHEAD, "a free slot and the lookahead");
    assert_eq!(marker_check_budget(3, 1), 2 + MARKER_LOOKAHEAD);
    assert_eq!(marker_check_budget(1, 5), MARKER_LOOKAHEAD, "no free slot: the queue still fills");
}

fn steps(list: &[u64]) -> BTreeSet<u64> {
    list.iter().copied().collect()
}

fn complete(list: &[u64]) -> BTreeMap<u64, String> {
    list.iter().map(|s| (*s, format!("step-{s}"))).collect()
}

#[test]
fn the_plan_skips_resumed_and_evaluated_steps_and_starts_the_oldest_first() {
    let all = complete(&[10, 20, 30, 40, 50]);
    let p = plan(&all, Some(10), &steps(&[]), &steps(&[]), 1);
    assert_eq!((p.start, p.queued, p.found), (vec![20], vec![30, 40, 50], 4), "step 10 was the previous run's");
    let p = plan(&all, Some(10), &steps(&[20]), &steps(&[30]), 1);
    assert_eq!((p.start, p.queued), (vec![], vec![40, 50]), "a running step takes the only slot");
    let p = plan(&all, Some(10), &steps(&[20]), &steps(&[30]), 3);
    assert_eq!((p.start, p.queued), (vec![40, 50], vec![]));
    let p = plan(&all, None, &steps(&[10, 20, 30, 40, 50]), &steps(&[]), 2);
    assert!(p.start.is_empty() && p.queued.is_empty(), "already evaluated (steps.json) is never started again");
    let p = plan(&all, Some(50), &steps(&[]), &steps(&[]), 2);
    assert_eq!((p.start.len(), p.found), (0, 0));
    let p = plan(&all, None, &steps(&[]), &steps(&[10, 20, 30]), 2);
    assert_eq!((p.start, p.queued), (vec![], vec![40, 50]), "more running than slots starts nothing");
}

fn evaluated(step: u64, accuracy: f64) -> CheckpointEvaluation {
    CheckpointEvaluation {
        step,
        checkpoint: format!("s3://bkt/c/step-{step}/"),
        phase: TaskPhase::Succeeded,
        metrics: [("default".to_string(), [("tool_call_accuracy".to_string(), accuracy)].into())].into(),
        criteria_met: Some(true),
        report_url: None,
        finished_at: None,
    }
}

#[test]
fn history_keeps_one_evaluation_per_step_and_the_newest_twenty() {
    let recorded = vec![evaluated(20, 0.5), evaluated(10, 0.4)];
    let status = vec![evaluated(20, 0.9), evaluated(5, 0.1)];
    let merged = merge(&[&recorded, &status]);
    assert_eq!(merged.iter().map(|e| e.step).collect::<Vec<_>>(), [5, 10, 20]);
    assert_eq!(merged[2].metrics["default"]["tool_call_accuracy"], 0.5, "steps.json wins");
    let many: Vec<CheckpointEvaluation> = (1..=25).map(|s| evaluated(s, 0.5)).collect();
    let kept = newest(&many);
    assert_eq!(kept.len(), basecamp_api::task::TRAINING_HISTORY_LIMIT);
    assert_eq!((kept[0].step, kept[19].step), (6, 25));
    assert_eq!(parse_steps(b"  \n").expect("empty"), vec![]);
    assert!(parse_steps(b"{").is_err());
    let too_big = format!(
        r#"[{{"step": 18446744073709551615, "checkpoint": "s3://c/step-18446744073709551615/", "phase": "Succeeded"}}, {}]"#,
        serde_json::to_string(&merged[0]).expect("json")
    );
    assert_eq!(
        parse_steps(too_big.as_bytes()).expect("parse"),
        [merged[0].clone()],
        "a step status cannot hold is left out"
    );
    let round_trip = parse_steps(&serde_json::to_vec(&merged).expect("json")).expect("parse");
    assert_eq!(round_trip, merged);
    // Values read back from steps.json are the values written, to the last
    // bit (serde_json's `float_roundtrip`): without it these two came back
    // one unit in the last place off, and the status history written from
    // them disagreed with steps.json (found by the training e2e test).
    for value in [0.36284880794999996, 1.3033333333333335] {
        let exact = parse_steps(&serde_json::to_vec(&[evaluated(40, value)]).expect("json")).expect("parse");
        assert_eq!(exact[0].metrics["default"]["tool_call_accuracy"].to_bits(), f64::to_bits(value), "{value}");
    }
}

// --- the trainer's state -----------------------------------------------------------------------

fn job(status: Value) -> Job {
    serde_json::from_value(json!({"metadata": {"name": "eval-train"}, "status": status})).expect("job")
}

fn pod(status: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "eval-train-x"}, "status": status})).expect("pod")
}

#[test]
fn the_trainer_phase_and_message_come_from_its_job_and_pod() {
    let failed = job(
        json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True", "message": "Job has reached the specified backoff limit"}]}),
    );
    let broken = pod(json!({
        "phase": "Failed",
        "initContainerStatuses": [
            {"name": "inject-basecamp", "ready": false, "restartCount": 0, "image": "b", "imageID": "", "state": {"terminated": {"exitCode": 0}}},
            {"name": "dataset", "ready": false, "restartCount": 0, "image": "t", "imageID": "", "state": {"terminated": {"exitCode": 1, "reason": "Error",
                "message": "error: preprocessor python:no_such_module.fn: No module named 'no_such_module'\n"}}},
        ],
        "containerStatuses": [
            {"name": "trainer", "ready": false, "restartCount": 0, "image": "t", "imageID": "", "state": {"waiting": {"reason": "PodInitializing"}}},
        ],
    }));
    let (phase, message) = trainer::trainer_state(Some(&failed), &[broken], None);
    assert_eq!(phase, TaskPhase::Failed);
    assert_eq!(
        message.as_deref(),
        Some(
            "container dataset exited with code 1: error: preprocessor python:no_such_module.fn: No module named 'no_such_module'"
        )
    );
    let (_, message) = trainer::trainer_state(Some(&failed), &[], None);
    assert_eq!(message.as_deref(), Some("the trainer Job failed: Job has reached the specified backoff limit"));

    let done = job(json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}));
    assert_eq!(trainer::trainer_state(Some(&done), &[], None), (TaskPhase::Succeeded, None));
    let preprocessing = pod(json!({"phase": "Pending", "initContainerStatuses": [
        {"name": "dataset", "ready": false, "restartCount": 0, "image": "t", "imageID": "", "state": {"running": {}}},
    ]}));
    assert_eq!(trainer::trainer_state(Some(&job(json!({"active": 1}))), &[preprocessing], None).0, TaskPhase::Running);
    let pulling = pod(json!({"phase": "Pending", "initContainerStatuses": [
        {"name": "inject-basecamp", "ready": false, "restartCount": 0, "image": "b", "imageID": "", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}},
    ]}));
    let (phase, message) = trainer::trainer_state(Some(&job(json!({"active": 1}))), &[pulling], None);
    assert_eq!(phase, TaskPhase::Pending);
    assert!(message.is_some_and(|m| m.contains("ImagePullBackOff")));
    assert_eq!(trainer::trainer_state(None, &[], Some(TaskPhase::Succeeded)).0, TaskPhase::Succeeded, "TTL removed it");
    assert_eq!(trainer::trainer_state(None, &[], Some(TaskPhase::Running)).0, TaskPhase::Pending);
}

// --- status interplay ----------------------------------------------------------------------------

fn observed_status(task: &HarnessTask, shards_done: bool, training: TrainingStatus) -> basecamp_api::HarnessTaskStatus {
    use basecamp_api::task::{CriterionResult, ShardCounts};
    let counts = if shards_done {
        ShardCounts { total: 2, succeeded: 2, failed: 0, running: 0 }
    } else {
        ShardCounts { total: 2, succeeded: 0, failed: 0, running: 0 }
    };
    let aggregated = status::AggregatedStatus {
        criteria: vec![CriterionResult {
            variant: "default".into(),
            criterion: "c".into(),
            met: true,
            ..Default::default()
        }],
        complete: shards_done,
        ..Default::default()
    };
    status::compute(&Observed {
        task,
        shards: vec![("default".into(), counts)],
        job_templates: Default::default(),
        capacity_problem: None,
        suspended: false,
        warnings: vec![],
        aggregated,
        report_url: None,
        training: Some(status::TrainingObserved { status: training, problem: None }),
        shard_failure: None,
        now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
    })
}

fn condition<'a>(
    status: &'a basecamp_api::HarnessTaskStatus,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    status.conditions.iter().find(|c| c.type_ == type_).expect("condition")
}

#[test]
fn a_training_task_finishes_only_when_the_loop_does() {
    let task = task_with(training_spec("bkt"));
    let running = TrainingStatus { phase: Some(TaskPhase::Running), evaluating: vec![20], ..Default::default() };
    let st = observed_status(&task, true, running.clone());
    assert_eq!(st.phase, Some(TaskPhase::Running), "the variants finished, the trainer did not");
    assert_eq!(condition(&st, "Progressing").reason, "Training");
    assert!(
        condition(&st, "Progressing").message.contains("evaluating step 20"),
        "{:?}",
        condition(&st, "Progressing")
    );
    assert_eq!(st.training.as_ref(), Some(&running));

    let queued = TrainingStatus { phase: Some(TaskPhase::Succeeded), queued: vec![40], ..Default::default() };
    assert_eq!(observed_status(&task, true, queued).phase, Some(TaskPhase::Running), "a queued step is pending work");

    let pending = TrainingStatus { phase: Some(TaskPhase::Pending), ..Default::default() };
    assert_eq!(observed_status(&task, false, pending).phase, Some(TaskPhase::Pending));
    let training = TrainingStatus { phase: Some(TaskPhase::Running), ..Default::default() };
    assert_eq!(observed_status(&task, false, training).phase, Some(TaskPhase::Running), "the trainer runs");

    let done =
        TrainingStatus { phase: Some(TaskPhase::Succeeded), history: vec![evaluated(20, 0.7)], ..Default::default() };
    let st = observed_status(&task, true, done);
    assert_eq!(st.phase, Some(TaskPhase::Succeeded));
    assert_eq!(condition(&st, "Succeeded").status, "True");
}

#[test]
fn a_failed_trainer_fails_the_task_with_its_message() {
    let task = task_with(training_spec("bkt"));
    let failed = TrainingStatus {
        phase: Some(TaskPhase::Failed),
        message: Some("container dataset exited with code 1: No module named 'x'".into()),
        ..Default::default()
    };
    let st = observed_status(&task, false, failed);
    assert_eq!(st.phase, Some(TaskPhase::Failed));
    let failed = condition(&st, "Failed");
    assert_eq!((failed.status.as_str(), failed.reason.as_str()), ("True", "TrainerFailed"));
    assert!(failed.message.contains("No module named 'x'"));
    let events = status::transitions(&[], &st.conditions);
    let warning = events.iter().find(|e| e.reason == "TrainerFailed").expect("a TrainerFailed Event");
    assert!(warning.warning && warning.note.contains("No module named 'x'"), "{warning:?}");
}

#[test]
fn a_failed_trainer_whose_checkpoints_are_still_evaluated_is_still_progressing() {
    let task = task_with(training_spec("bkt"));
    let failed = TrainingStatus {
        phase: Some(TaskPhase::Failed),
        message: Some("container trainer exited with code 3: CUDA out of memory".into()),
        evaluating: vec![20],
        queued: vec![30],
        ..Default::default()
    };
    let st = observed_status(&task, false, failed);
    assert_eq!(st.phase, Some(TaskPhase::Failed), "a failed trainer fails the task at once");
    let progressing = condition(&st, "Progressing");
    assert_eq!((progressing.status.as_str(), progressing.reason.as_str()), ("True", "Training"), "{progressing:?}");
    assert!(progressing.message.contains("trainer Failed"), "{}", progressing.message);
    let poll = std::time::Duration::from_secs(10);
    assert_eq!(crate::controller::next_action(&st, poll), kube::runtime::controller::Action::requeue(poll));
}

#[test]
fn a_busy_loop_is_polled_every_checkpoint_poll() {
    use kube::runtime::controller::Action;
    let poll = std::time::Duration::from_secs(10);
    let mut st = basecamp_api::HarnessTaskStatus {
        phase: Some(TaskPhase::Running),
        training: Some(TrainingStatus { phase: Some(TaskPhase::Running), ..Default::default() }),
        ..Default::default()
    };
    assert_eq!(crate::controller::next_action(&st, poll), Action::requeue(poll));
    st.training = Some(TrainingStatus { phase: Some(TaskPhase::Succeeded), queued: vec![30], ..Default::default() });
    assert_eq!(crate::controller::next_action(&st, poll), Action::requeue(poll));
    st.training = Some(TrainingStatus { phase: Some(TaskPhase::Succeeded), ..Default::default() });
    st.phase = Some(TaskPhase::Succeeded);
    assert_eq!(crate::controller::next_action(&st, poll), Action::await_change());
}

#[test]
fn the_evaluated_event_names_the_step_and_its_accuracy() {
    let mut e = evaluated(30, 0.8125);
    e.report_url = Some("https://b.example.com/tasks/team-a/eval@step-30".into());
    assert_eq!(
        evaluation::evaluated_note(&e),
        "checkpoint step 30 evaluated (Succeeded): tool_call_accuracy default=0.812; criteria met; report https://b.example.com/tasks/team-a/eval@step-30"
    );
    // Episodes the policy's server failed are said: the accuracy rests on the others.
    e.metrics.get_mut("default").unwrap().insert("not_measured_episodes".into(), 3.0);
    assert!(
        evaluation::evaluated_note(&e).contains(
            "criteria met; 3 episode(s) NOT MEASURED (the policy or a service failed; left out of the accuracy); report"
        ),
        "{}",
        evaluation::evaluated_note(&e)
    );
}

// --- the reconcile step against a mocked API server and a real S3 server ---------------------

mod against_s3 {
    use std::sync::Arc;
    use std::time::Duration;

    use basecamp_sandbox::storage::{Destination, Storage};
    use http::{Request, Response};
    use kube::Client;
    use kube::client::Body;

    use super::*;
    use crate::metrics::Metrics;
    use crate::testing::{BUCKET, Call, Reply, S3Server, Seen, call, storage, verify};

    const JOBS: &str = "/apis/batch/v1/namespaces/team-a/jobs";
    const PODS: &str = "/api/v1/namespaces/team-a/pods";

    fn not_found() -> Reply {
        Reply::Json(
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
        )
    }

    fn list(kind: &str, items: Vec<Value>) -> Reply {
        Reply::Json(
            200,
            json!({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}),
        )
    }

    async fn put(storage: &Storage, key: &str, bytes: &[u8]) {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("f");
        std::fs::write(&path, bytes).expect("write");
        let to = Destination::parse(&format!("s3://{BUCKET}/{key}")).expect("key");
        storage.upload_file(&path, &to).await.into_result().expect("upload");
    }

    async fn get_json(storage: &Storage, key: &str) -> Value {
        let bytes =
            storage.fetch(&Destination::parse(&format!("s3://{BUCKET}/{key}")).expect("key")).await.expect("get");
        serde_json::from_slice(&bytes).expect("json")
    }

    const ROOT: &str = "traces/checkpoints/team-a/eval";

    /// step-10 (resumed), step-20 (in steps.json already), step-30 and
    /// step-40 complete, step-50 still being written.
    async fn seed(storage: &Storage) {
        for step in [10, 20, 30, 40, 50] {
            put(storage, &format!("{ROOT}/step-{step}/model.json"), b"{}").await;
        }
        for step in [10, 20, 30, 40] {
            put(storage, &format!("{ROOT}/step-{step}/COMPLETE"), b"").await;
        }
        put(storage, &format!("{ROOT}/dataset/dataset.json"), b"{}").await;
        let recorded = vec![evaluated(20, 0.5)];
        put(storage, "traces/reports/team-a/eval/steps.json", &serde_json::to_vec(&recorded).expect("json")).await;
    }

    async fn step(task: &HarnessTask, storage: Storage, script: Vec<Call>) -> (Option<Observation>, Vec<Seen>) {
        let (observation, seen, _) = step_counting(task, storage, script).await;
        (observation, seen)
    }

    /// S3 operations of one step, from its metrics: `list` (listings of the
    /// checkpoint root and of traces) and `get` (`steps.json`, summaries and
    /// marker checks).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct S3Calls {
        list: u64,
        get: u64,
    }

    fn s3_calls(metrics: &Metrics) -> S3Calls {
        let text = metrics.encode_prometheus_text();
        let count = |operation: &str| {
            let series = format!("basecamp_s3_operation_duration_seconds_count{{operation=\"{operation}\"}} ");
            text.lines().find_map(|l| l.strip_prefix(&series)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
        };
        S3Calls { list: count("list"), get: count("get") }
    }

    async fn step_counting(
        task: &HarnessTask,
        storage: Storage,
        script: Vec<Call>,
    ) -> (Option<Observation>, Vec<Seen>, S3Calls) {
        step_with_caches(task, storage, &Default::default(), script).await
    }

    async fn step_with_caches(
        task: &HarnessTask,
        storage: Storage,
        caches: &crate::controller::cache::Caches,
        script: Vec<Call>,
    ) -> (Option<Observation>, Vec<Seen>, S3Calls) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let verifier = tokio::spawn(verify(handle, script));
        let settings = Settings { report_base_url: Some("https://basecamp.example.com".into()), ..settings() };
        let input = BuildInput::new(task, vec![variant("default", None)], &settings).expect("input");
        let metrics = Arc::new(Metrics::new());
        let result =
            tokio::time::timeout(Duration::from_secs(30), reconcile(&client, caches, &storage, &metrics, &input))
                .await
                .expect("the training step did not finish within 30 s")
                .expect("the training step");
        let waited = tokio::time::timeout(Duration::from_secs(10), verifier).await;
        let seen = match waited.unwrap_or_else(|_| panic!("a scripted call never came; the step saw {result:#?}")) {
            Ok(seen) => seen,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("verifier: {e}"),
        };
        (result, seen, s3_calls(&metrics))
    }

    fn trainer_calls(running: bool) -> Vec<Call> {
        let status = if running { json!({"active": 1, "ready": 1}) } else { json!({}) };
        vec![
            call("GET", &format!("{JOBS}/eval-train"), not_found()),
            call("PATCH", &format!("{JOBS}/eval-train"), Reply::EchoWith(json!({"status": status}))),
            call("GET", PODS, list("PodList", vec![])),
        ]
    }

    #[tokio::test]
    async fn starts_the_oldest_unevaluated_complete_checkpoint_above_the_resumed_step() {
        let server = S3Server::start();
        let storage = storage(&server);
        seed(&storage).await;
        let task = task_with(training_spec(BUCKET));
        let mut script = trainer_calls(true);
        script.extend([
            call("GET", JOBS, list("JobList", vec![])),
            call("GET", &format!("{JOBS}/eval-s30-default"), not_found()),
            call("PATCH", &format!("{JOBS}/eval-s30-default"), Reply::Echo),
        ]);
        let (observation, seen, calls) = step_counting(&task, storage, script).await;
        assert_eq!(
            calls,
            S3Calls { list: 1, get: 4 },
            "one listing of C's step directories; steps.json and the markers of 30, 40 and 50 \
             (10 was resumed, 20 is in steps.json)"
        );
        let observation = observation.expect("a training task");
        let training = &observation.observed.status;
        assert_eq!(observation.observed.problem, None);
        assert_eq!(training.phase, Some(TaskPhase::Running));
        assert_eq!(training.job.as_deref(), Some("eval-train"));
        assert_eq!(training.resumed_from_step, Some(10));
        assert_eq!(training.checkpoints_found, Some(3), "20, 30, 40: step-50 has no marker, step-10 was resumed");
        assert_eq!(training.evaluating, [30], "20 is in steps.json");
        assert_eq!(training.queued, [40], "one evaluation at a time");
        assert_eq!(training.history.iter().map(|e| e.step).collect::<Vec<_>>(), [20]);
        assert_eq!(training.latest_step, Some(20));
        assert_eq!(
            observation.evaluated.iter().map(|e| e.step).collect::<Vec<_>>(),
            [20],
            "a step in steps.json that status never showed gets its Event"
        );
        assert!(seen[2].uri.contains("labelSelector=batch.kubernetes.io%2Fjob-name%3Deval-train"), "{}", seen[2].uri);
        assert!(seen[3].uri.contains("basecamp.dev%2Frole%3Devaluation"), "{}", seen[3].uri);
        let started = &seen[5].body;
        assert_eq!(started["metadata"]["labels"]["basecamp.dev/step"], "30");
        assert_eq!(
            started["metadata"]["annotations"]["basecamp.dev/checkpoint"],
            format!("s3://{BUCKET}/{ROOT}/step-30/")
        );
    }

    fn finished_job(step: u64, failed: bool) -> Value {
        let status = if failed {
            json!({"completedIndexes": "0", "failedIndexes": "1", "succeeded": 1, "failed": 1,
                   "conditions": [{"type": "Failed", "status": "True", "lastTransitionTime": "2026-11-30T08:00:00Z"}]})
        } else {
            json!({"completedIndexes": "0-1", "succeeded": 2, "completionTime": "2026-11-30T08:01:02Z",
                   "conditions": [{"type": "Complete", "status": "True"}]})
        };
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {
                "name": format!("eval-s{step}-default"), "namespace": "team-a",
                "labels": {"basecamp.dev/task": "eval", "basecamp.dev/variant": "default",
                           "basecamp.dev/step": step.to_string(), "basecamp.dev/role": "evaluation"},
                "annotations": {"basecamp.dev/checkpoint": format!("s3://{BUCKET}/{ROOT}/step-{step}/")},
            },
            "status": status,
        })
    }

    async fn put_summaries(storage: &Storage, run: &str, shards: &[u32], accuracy: f64) {
        let today = crate::controller::today();
        let metrics = basecamp_trace::metrics::EpisodeMetrics {
            tool_call_accuracy: accuracy,
            plan_step_f1: 1.0,
            resolution_time_s: 1.0,
            ..Default::default()
        };
        for shard in shards {
            let summary = json!({
                "variant": "default", "shard": shard, "started_unix_nanos": 1_000,
                "episodes": [{
                    "id": format!("ep-{shard}"), "outcome": "final_answer", "failure_class": "ok",
                    "trace_file": format!("ep-{shard}.trace"),
                    "metrics": metrics,
                }],
                "lost": [],
            });
            let key = format!(
                "traces/{:04}/{:02}/{:02}/team-a/{run}/default/{shard}/summary.json",
                today.year(),
                today.month(),
                today.day()
            );
            put(storage, &key, &serde_json::to_vec(&summary).expect("json")).await;
        }
    }

    #[tokio::test]
    async fn a_finished_step_is_aggregated_recorded_once_and_frees_its_slot() {
        let server = S3Server::start();
        let storage = storage(&server);
        seed(&storage).await;
        put_summaries(&storage, "eval@step-30", &[0, 1], 0.75).await;
        let task = task_with(training_spec(BUCKET));
        let mut script = trainer_calls(true);
        script.extend([
            call("GET", JOBS, list("JobList", vec![finished_job(30, false)])),
            call("GET", &format!("{JOBS}/eval-s40-default"), not_found()),
            call("PATCH", &format!("{JOBS}/eval-s40-default"), Reply::Echo),
        ]);
        let (observation, _) = step(&task, storage.clone(), script).await;
        let observation = observation.expect("a training task");
        assert_eq!(observation.observed.problem, None);
        let [_, evaluation] = observation.evaluated.as_slice() else { panic!("{:?}", observation.evaluated) };
        assert_eq!(evaluation.step, 30);
        assert_eq!(evaluation.phase, TaskPhase::Succeeded);
        assert_eq!(evaluation.checkpoint, format!("s3://{BUCKET}/{ROOT}/step-30/"));
        assert_eq!(evaluation.metrics["default"]["tool_call_accuracy"], 0.75);
        assert_eq!(evaluation.metrics["default"]["episodes"], 2.0);
        assert_eq!(evaluation.criteria_met, Some(true), "tool_call_accuracy >= 0.5");
        assert_eq!(evaluation.report_url.as_deref(), Some("https://basecamp.example.com/tasks/team-a/eval@step-30"));
        assert_eq!(evaluation.finished_at.as_deref(), Some("2026-11-30T08:01:02Z"));
        let training = &observation.observed.status;
        assert_eq!(training.evaluating, [40], "step 30's slot went to step 40");
        assert!(training.queued.is_empty());
        assert_eq!(training.history.iter().map(|e| e.step).collect::<Vec<_>>(), [20, 30]);
        assert_eq!(training.latest_step, Some(30));
        let recorded = get_json(&storage, "traces/reports/team-a/eval/steps.json").await;
        assert_eq!(
            recorded.as_array().map(|a| a.iter().map(|e| e["step"].clone()).collect::<Vec<_>>()),
            Some(vec![json!(20), json!(30)])
        );
        let index = get_json(&storage, "traces/reports/team-a/eval@step-30/index.json").await;
        assert_eq!(index.as_array().map(Vec::len), Some(2), "the run's own report");

        // The next reconcile (or a restarted operator) reads steps.json first:
        // step 30's finished Job is not aggregated again, and nothing restarts.
        let mut task = task;
        task.status = Some(basecamp_api::HarnessTaskStatus {
            training: Some(observation.observed.status.clone()),
            ..Default::default()
        });
        let mut script = trainer_calls(true);
        script.push(call("GET", JOBS, list("JobList", vec![finished_job(30, false), finished_job(40, false)])));
        put_summaries(&storage, "eval@step-40", &[0, 1], 1.0).await;
        let (observation, _) = step(&task, storage.clone(), script).await;
        let observation = observation.expect("a training task");
        assert_eq!(observation.evaluated.iter().map(|e| e.step).collect::<Vec<_>>(), [40]);
        let training = &observation.observed.status;
        assert!(training.evaluating.is_empty() && training.queued.is_empty(), "{training:?}");
        assert_eq!(training.history.iter().map(|e| e.step).collect::<Vec<_>>(), [20, 30, 40]);
        let recorded = get_json(&storage, "traces/reports/team-a/eval/steps.json").await;
        assert_eq!(recorded.as_array().map(Vec::len), Some(3));
    }

    #[tokio::test]
    async fn the_evaluation_jobs_come_from_the_listed_job_cache_without_a_list() {
        let server = S3Server::start();
        let storage = storage(&server);
        seed(&storage).await;
        put_summaries(&storage, "eval@step-30", &[0, 1], 0.75).await;
        let task = task_with(training_spec(BUCKET));
        let job = |value: Value| serde_json::from_value::<k8s_openapi::api::batch::v1::Job>(value).expect("job");
        // Another task's evaluation of step 40 and this task's own variant Job are not its evaluations.
        let mut other = finished_job(40, false);
        other["metadata"]["name"] = json!("other-s40-default");
        other["metadata"]["labels"]["basecamp.dev/task"] = json!("other");
        let mut own = finished_job(40, false);
        own["metadata"]["name"] = json!("eval-default");
        own["metadata"]["labels"]["basecamp.dev/role"] = json!("shards");
        let caches = crate::controller::cache::Caches::holding(
            vec![job(finished_job(30, false)), job(other), job(own)],
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        // The trainer is not in the listed cache either: created without a read.
        let script = vec![
            call("PATCH", &format!("{JOBS}/eval-train"), Reply::EchoWith(json!({"status": {"active": 1}}))),
            call("GET", PODS, list("PodList", vec![])),
            call("GET", &format!("{JOBS}/eval-s40-default"), not_found()),
            call("PATCH", &format!("{JOBS}/eval-s40-default"), Reply::Echo),
        ];
        let (observation, seen, _) = step_with_caches(&task, storage, &caches, script).await;
        assert_eq!(seen.len(), 4, "no list of Jobs: {:?}", seen.iter().map(|s| &s.uri).collect::<Vec<_>>());
        let observation = observation.expect("a training task");
        assert_eq!(observation.observed.problem, None);
        assert_eq!(observation.evaluated.iter().map(|e| e.step).collect::<Vec<_>>(), [20, 30]);
        let training = &observation.observed.status;
        assert_eq!(training.evaluating, [40], "step 40 started: the other task's step-40 Job is not this task's");
        assert_eq!(training.history.iter().map(|e| e.step).collect::<Vec<_>>(), [20, 30]);
    }

    #[tokio::test]
    async fn a_failed_shard_fails_the_step_and_s3_down_or_forbidden_pods_start_nothing() {
        let server = S3Server::start();
        let storage = storage(&server);
        seed(&storage).await;
        put_summaries(&storage, "eval@step-30", &[0], 0.25).await;
        let task = task_with(training_spec(BUCKET));
        let mut script = trainer_calls(true);
        script.extend([
            call("GET", JOBS, list("JobList", vec![finished_job(30, true)])),
            call("GET", &format!("{JOBS}/eval-s40-default"), not_found()),
            call("PATCH", &format!("{JOBS}/eval-s40-default"), Reply::Echo),
        ]);
        let (observation, _) = step(&task, storage, script).await;
        let observation = observation.expect("a training task");
        let [_, evaluation] = observation.evaluated.as_slice() else { panic!("{:?}", observation.evaluated) };
        assert_eq!(evaluation.phase, TaskPhase::Failed, "shard 1 failed");
        assert_eq!(evaluation.finished_at.as_deref(), Some("2026-11-30T08:00:00Z"));
        assert_eq!(evaluation.criteria_met, Some(false), "0.25 < 0.5");
        drop(server);

        let mut script = trainer_calls(true);
        script[2] = call(
            "GET",
            PODS,
            Reply::Json(
                403,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "pods is forbidden"}),
            ),
        );
        script.push(call("GET", JOBS, list("JobList", vec![])));
        let (observation, _) = step(&task, crate::testing::storage_down(), script).await;
        let observation = observation.expect("a training task");
        let (category, message) = observation.observed.problem.expect("a problem");
        assert_eq!(category, "S3Unavailable");
        assert!(message.contains("checkpoints"), "{message}");
        assert!(observation.observed.status.evaluating.is_empty(), "nothing started without steps.json");
        assert_eq!(
            observation.observed.status.phase,
            Some(TaskPhase::Running),
            "unreadable pods: the Job says Running"
        );
    }

    /// Objects written straight into s3s-fs's data directory (a key is a path).
    fn seed_files(server: &S3Server, keys: impl IntoIterator<Item = String>) {
        for key in keys {
            let path = server.data.join(BUCKET).join(&key);
            std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
            std::fs::write(path, b"x").expect("write an object");
        }
    }

    fn running_job(step: u64) -> Value {
        let mut job = finished_job(step, false);
        job["status"] = json!({"active": 2});
        job
    }

    /// The task as the next reconcile sees it: status written from `observation`.
    fn after(task: &HarnessTask, observation: &Observation) -> HarnessTask {
        let mut task = task.clone();
        task.status = Some(basecamp_api::HarnessTaskStatus {
            observed_generation: task.metadata.generation,
            training: Some(observation.observed.status.clone()),
            ..Default::default()
        });
        task
    }

    async fn record(storage: &Storage, steps: impl IntoIterator<Item = u64>) {
        let recorded: Vec<CheckpointEvaluation> = steps.into_iter().map(|s| evaluated(s, 0.5)).collect();
        put(storage, "traces/reports/team-a/eval/steps.json", &serde_json::to_vec(&recorded).expect("json")).await;
    }

    #[tokio::test]
    async fn a_checkpoint_without_its_marker_waits_and_evaluated_steps_cost_no_request() {
        let server = S3Server::start();
        let storage = storage(&server);
        // 20 steps evaluated already, each 50 shards and its marker; step-220
        // has 600 shards and no marker yet.
        for step in (10..=210).step_by(10) {
            seed_files(&server, (0..50).map(|i| format!("{ROOT}/step-{step}/shard-{i:03}.bin")));
            seed_files(&server, [format!("{ROOT}/step-{step}/COMPLETE")]);
        }
        seed_files(&server, (0..600).map(|i| format!("{ROOT}/step-220/shard-{i:03}.bin")));
        record(&storage, (20..=210).step_by(10)).await;
        let task = task_with(training_spec(BUCKET));

        let mut script = trainer_calls(true);
        script.push(call("GET", JOBS, list("JobList", vec![])));
        let (observation, _, calls) = step_counting(&task, storage.clone(), script).await;
        let observation = observation.expect("a training task");
        assert_eq!(observation.observed.problem, None);
        let training = &observation.observed.status;
        assert!(training.evaluating.is_empty() && training.queued.is_empty(), "no marker, no evaluation: {training:?}");
        assert_eq!(training.checkpoints_found, Some(20), "the evaluated ones");
        assert_eq!(
            calls,
            S3Calls { list: 1, get: 2 },
            "one listing, steps.json, and step-220's marker only: the 20 evaluated steps are not checked"
        );

        // The trainer writes the marker last: the next poll starts the step.
        seed_files(&server, [format!("{ROOT}/step-220/COMPLETE")]);
        let task = after(&task, &observation);
        let mut script = trainer_calls(true);
        script.extend([
            call("GET", JOBS, list("JobList", vec![])),
            call("GET", &format!("{JOBS}/eval-s220-default"), not_found()),
            call("PATCH", &format!("{JOBS}/eval-s220-default"), Reply::Echo),
        ]);
        let (observation, seen, calls) = step_counting(&task, storage.clone(), script).await;
        let observation = observation.expect("a training task");
        assert_eq!(observation.observed.status.evaluating, [220]);
        assert_eq!(observation.observed.status.checkpoints_found, Some(21));
        assert_eq!(calls, S3Calls { list: 1, get: 2 });
        assert_eq!(
            seen[5].body["metadata"]["annotations"]["basecamp.dev/checkpoint"],
            format!("s3://{BUCKET}/{ROOT}/step-220/")
        );

        // While it runs, its marker is not checked either.
        let task = after(&task, &observation);
        let mut script = trainer_calls(true);
        script.push(call("GET", JOBS, list("JobList", vec![running_job(220)])));
        let (observation, _, calls) = step_counting(&task, storage.clone(), script).await;
        let training = observation.expect("a training task").observed.status;
        assert_eq!((training.evaluating, training.checkpoints_found), (vec![220], Some(21)));
        assert_eq!(calls, S3Calls { list: 1, get: 1 }, "one listing and steps.json: nothing to check");
    }

    #[tokio::test]
    async fn a_backlog_of_checkpoints_is_checked_a_few_at_a_time() {
        let server = S3Server::start();
        let storage = storage(&server);
        for step in (10..=130).step_by(10) {
            seed_files(&server, [format!("{ROOT}/step-{step}/model.bin"), format!("{ROOT}/step-{step}/COMPLETE")]);
        }
        record(&storage, []).await;
        let task = task_with(training_spec(BUCKET));

        // One slot (maxConcurrentEvaluations 1) and the lookahead.
        let mut script = trainer_calls(true);
        script.extend([
            call("GET", JOBS, list("JobList", vec![])),
            call("GET", &format!("{JOBS}/eval-s20-default"), not_found()),
            call("PATCH", &format!("{JOBS}/eval-s20-default"), Reply::Echo),
        ]);
        let (observation, _, calls) = step_counting(&task, storage.clone(), script).await;
        let observation = observation.expect("a training task");
        let training = &observation.observed.status;
        assert_eq!(calls.get, 1 + 1 + MARKER_LOOKAHEAD as u64, "steps.json, then 20 to 60");
        assert_eq!((training.evaluating.clone(), training.queued.clone()), (vec![20], vec![30, 40, 50, 60]));
        assert_eq!(training.checkpoints_found, Some(5), "counted as they are found");

        // The queue is remembered: the next poll checks the next ones.
        let task = after(&task, &observation);
        let mut script = trainer_calls(true);
        script.push(call("GET", JOBS, list("JobList", vec![running_job(20)])));
        let (next, _, calls) = step_counting(&task, storage.clone(), script).await;
        let training = next.expect("a training task").observed.status;
        assert_eq!(calls.get, 1 + MARKER_LOOKAHEAD as u64, "no free slot: the lookahead, 70 to 100");
        assert_eq!(training.queued, [30, 40, 50, 60, 70, 80, 90, 100]);
        assert_eq!(training.checkpoints_found, Some(9));

        // Not after a spec change (another marker, another resumeFrom): checked again.
        let mut changed = after(&task, &observation);
        changed.metadata.generation = Some(2);
        let mut script = trainer_calls(true);
        script[1] = call("PATCH", &format!("{JOBS}/eval-train"), Reply::EchoWith(json!({"status": {"active": 1}})));
        script.push(call("GET", JOBS, list("JobList", vec![running_job(20)])));
        let (next, _, calls) = step_counting(&changed, storage, script).await;
        let training = next.expect("a training task").observed.status;
        assert_eq!(calls.get, 1 + MARKER_LOOKAHEAD as u64);
        assert_eq!(training.queued, [30, 40, 50, 60]);
    }
}
