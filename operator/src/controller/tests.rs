//! Mocked-API scenarios in the style of controller-rs's ApiServerVerifier:
//! the Client talks to a tower-test mock; each scenario scripts the calls
//! the operator must make, in order, answers each one, fails on any other
//! call, and a timeout catches a call that never comes. S3 is real (s3s-fs
//! on loopback) or down (a closed port).

use std::sync::Arc;
use std::time::Duration;

use basecamp_api::HarnessTask;
use basecamp_sandbox::storage::{Storage, UtcDate};
use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::*;
use crate::build::{BuildInput, ResolvedVariant};
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::testing::{BUCKET, Call, Reply, S3Server, Seen, call, merge, storage, storage_down, verify};

const TASK: &str = "/apis/basecamp.dev/v1alpha1/namespaces/team-a/harnesstasks/eval";
const SANDBOX: &str = "/apis/basecamp.dev/v1alpha1/namespaces/team-a/sandboxconfigs/shop";
const CONFIG_MAP: &str = "/api/v1/namespaces/team-a/configmaps/eval-sandbox";
const NETWORK_POLICY: &str = "/apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies/eval-sandbox";
const JOB: &str = "/apis/batch/v1/namespaces/team-a/jobs/eval-default";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events";

fn not_found() -> Reply {
    Reply::Json(
        404,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

struct Outcome {
    result: Result<Action, Error>,
    seen: Vec<Seen>,
    ctx: Arc<Context>,
}

async fn scenario(task: &Value, storage: Storage, script: Vec<Call>) -> Outcome {
    scenario_with_caches(task, storage, cache::Caches::default(), script).await
}

/// Reconciles `task` while its SandboxConfig is missing: the status is
/// written and a Warning Event recorded.
async fn without_its_sandbox_config(task: &Value) -> Outcome {
    let script = vec![
        call("GET", SANDBOX, not_found()),
        call("PATCH", &format!("{TASK}/status"), Reply::Json(200, task.clone())),
        event(),
    ];
    scenario(task, storage_down(), script).await
}

async fn scenario_with_caches(task: &Value, storage: Storage, caches: cache::Caches, script: Vec<Call>) -> Outcome {
    let task: HarnessTask = serde_json::from_value(task.clone()).expect("task fixture");
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let mut ctx = Context::new(client, Arc::new(Metrics::new()), Settings::default(), storage, None);
    ctx.caches = caches;
    let ctx = Arc::new(ctx);
    let verifier = tokio::spawn(verify(handle, script));
    let result = tokio::time::timeout(Duration::from_secs(30), reconcile(Arc::new(task), ctx.clone()))
        .await
        .expect("reconcile did not finish within 30 s");
    let seen =
        match tokio::time::timeout(Duration::from_secs(10), verifier).await.expect("a scripted API call never came") {
            Ok(seen) => seen,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("verifier: {e}"),
        };
    Outcome { result, seen, ctx }
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now().to_string()
}

fn spec() -> Value {
    json!({
        "taskDefinition": {"successCriteria": ["tool_call_accuracy >= 0.9"]},
        "evaluation": {"testSet": "s3://datasets/shop/tests.jsonl"},
        "policy": {"endpoint": "http://10.0.0.7:8000/v1", "model": "m"},
        "sandboxRef": {"name": "shop"},
        "shards": 2,
        "traces": {"destination": format!("s3://{BUCKET}/traces")},
    })
}

fn task(spec: Value, finalizer: bool) -> Value {
    json!({
        "apiVersion": "basecamp.dev/v1alpha1",
        "kind": "HarnessTask",
        "metadata": {
            "name": "eval", "namespace": "team-a", "uid": "uid-1", "generation": 1, "resourceVersion": "7",
            "creationTimestamp": now_rfc3339(),
            "finalizers": if finalizer { json!(["basecamp.dev/traces"]) } else { json!([]) },
        },
        "spec": spec,
    })
}

fn sandbox() -> Value {
    json!({
        "apiVersion": "basecamp.dev/v1alpha1", "kind": "SandboxConfig",
        "metadata": {"name": "shop", "namespace": "team-a"},
        "spec": {"tools": {"track_order": {"http": {"url": "https://shop.example.com/orders/{order_id}"}}}},
    })
}

/// The Job the operator builds for `task` (to answer GETs of an existing Job).
fn built_job(task: &Value) -> Value {
    let task: HarnessTask = serde_json::from_value(task.clone()).expect("task");
    let sandbox: basecamp_api::SandboxConfig = serde_json::from_value(sandbox()).expect("sandbox");
    let variants = vec![ResolvedVariant {
        name: "default".into(),
        sandbox_name: "shop".into(),
        profile: None,
        spec: sandbox.spec,
    }];
    let settings = Settings::default();
    let desired = crate::build::build(&BuildInput::new(&task, variants, &settings).expect("input")).expect("build");
    serde_json::to_value(&desired.jobs[0]).expect("json")
}

fn event_reasons(seen: &[Seen]) -> Vec<(String, String)> {
    seen.iter()
        .filter(|s| s.uri.starts_with(EVENTS))
        .map(|s| {
            (s.body["type"].as_str().unwrap_or("").to_string(), s.body["reason"].as_str().unwrap_or("").to_string())
        })
        .collect()
}

fn status_patch(seen: &[Seen]) -> Value {
    seen.iter()
        .find(|s| s.uri.starts_with(&format!("{TASK}/status")))
        .map(|s| s.body["status"].clone())
        .expect("a status patch")
}

fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == type_)).cloned().unwrap_or(Value::Null)
}

fn event() -> Call {
    call("POST", EVENTS, Reply::Echo)
}

/// The calls of a valid task up to and including the Job's apply.
fn apply_calls(job_get: Reply, job_status: Value) -> Vec<Call> {
    vec![
        call("GET", SANDBOX, Reply::Json(200, sandbox())),
        call("PATCH", CONFIG_MAP, Reply::Echo),
        call("PATCH", NETWORK_POLICY, Reply::Echo),
        call("GET", JOB, job_get),
        call(
            "PATCH",
            JOB,
            Reply::EchoWith(json!({"metadata": {"creationTimestamp": now_rfc3339()}, "status": job_status})),
        ),
    ]
}

#[tokio::test]
async fn create_adds_the_finalizer_applies_the_objects_and_reports_pending() {
    let fresh = task(spec(), false);
    let with_finalizer = task(spec(), true);
    // The finalizer patch goes out with the applies, in the same round trip.
    let mut script = apply_calls(not_found(), json!({}));
    script.insert(1, call("PATCH", TASK, Reply::Json(200, with_finalizer.clone())));
    script.extend([call("PATCH", &format!("{TASK}/status"), Reply::Json(200, with_finalizer)), event(), event()]);
    let out = scenario(&fresh, storage_down(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    let seen = &out.seen;
    assert_eq!(seen[1].body["metadata"]["finalizers"], json!(["basecamp.dev/traces"]));
    assert_eq!(seen[1].body["metadata"]["resourceVersion"], "7", "the finalizer patch is a compare-and-swap");
    assert!(
        seen[2].uri.contains("fieldManager=basecamp-operator") && seen[2].uri.contains("force=true"),
        "{}",
        seen[2].uri
    );
    assert!(seen[2].body["data"]["manifests.yaml"].as_str().is_some_and(|m| m.contains("kind: SandboxConfig")));
    assert_eq!(seen[3].body["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(seen[5].body["spec"]["completions"], 2);
    assert_eq!(seen[5].body["spec"]["completionMode"], "Indexed");
    let status = status_patch(seen);
    assert_eq!(status["phase"], "Pending");
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(status["shardsSummary"], "0/2");
    assert_eq!(status["shards"]["default"], json!({"total": 2, "succeeded": 0, "failed": 0, "running": 0}));
    assert_eq!(condition(&status, "Ready")["status"], "True");
    assert_eq!(condition(&status, "Progressing")["reason"], "ShardsPending");
    assert_eq!(event_reasons(seen), [("Normal".into(), "Resolved".into()), ("Normal".into(), "ShardsPending".into())]);
    assert!(out.ctx.metrics.encode().contains(r#"basecamp_tasks{phase="Pending"} 1"#));
}

/// What the API server keeps of an applied object: the body sent, with its uid.
fn stored<K: serde::de::DeserializeOwned>(seen: &Seen) -> K {
    serde_json::from_value(merge(seen.body.clone(), &json!({"metadata": {"uid": "uid-9", "resourceVersion": "11"}})))
        .expect("an applied object")
}

fn applies(metrics: &Metrics) -> Vec<String> {
    metrics.encode().lines().filter(|l| l.starts_with("basecamp_applies_total")).map(str::to_string).collect()
}

#[tokio::test]
async fn a_reconcile_whose_caches_are_up_to_date_makes_no_api_call_and_a_drifted_object_is_applied_alone() {
    // A first reconcile, without caches, creates everything.
    let current = task(spec(), true);
    let mut script = apply_calls(not_found(), json!({}));
    script.extend([call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())), event(), event()]);
    let first = scenario(&current, storage_down(), script).await;
    assert!(first.result.is_ok(), "{:?}", first.result.err());
    let body = |uri: &str| first.seen.iter().find(|s| s.uri.starts_with(uri) && !s.body.is_null()).expect(uri);
    let config_map: k8s_openapi::api::core::v1::ConfigMap = stored(body(CONFIG_MAP));
    let policy: k8s_openapi::api::networking::v1::NetworkPolicy = stored(body(NETWORK_POLICY));
    let job: k8s_openapi::api::batch::v1::Job = stored(body(JOB));
    let sandbox: basecamp_api::SandboxConfig = serde_json::from_value(sandbox()).expect("sandbox");
    for applied in [CONFIG_MAP, NETWORK_POLICY, JOB] {
        assert!(
            body(applied).body["metadata"]["annotations"][cache::APPLIED_DIGEST_ANNOTATION].is_string(),
            "{applied} carries its digest"
        );
    }
    // The watches have seen what it applied and its status: the next
    // reconcile (woken by those events) has nothing to read or write.
    let settled = merge(current.clone(), &json!({"status": status_patch(&first.seen)}));
    let caches = || {
        cache::Caches::holding(vec![job.clone()], vec![config_map.clone()], vec![policy.clone()], vec![sandbox.clone()])
    };
    let quiet = scenario_with_caches(&settled, storage_down(), caches(), Vec::new()).await;
    assert!(quiet.result.is_ok(), "{:?}", quiet.result.err());
    assert!(quiet.seen.is_empty(), "{:?}", quiet.seen.iter().map(|s| &s.uri).collect::<Vec<_>>());
    let mut counted = applies(&quiet.ctx.metrics);
    counted.sort();
    assert_eq!(
        counted,
        [
            r#"basecamp_applies_total{kind="ConfigMap",result="unchanged"} 1"#,
            r#"basecamp_applies_total{kind="HarnessTaskStatus",result="unchanged"} 1"#,
            r#"basecamp_applies_total{kind="Job",result="unchanged"} 1"#,
            r#"basecamp_applies_total{kind="NetworkPolicy",result="unchanged"} 1"#,
        ]
    );

    // A variant removed from the spec: its Job (here `eval-b`) is deleted, and
    // no other. Before: it ran on, its pods refused by the sandbox.
    let mut dropped = job.clone();
    dropped.metadata.name = Some("eval-b".into());
    dropped.metadata.labels.get_or_insert_default().insert("basecamp.dev/variant".into(), "b".into());
    let mut foreign = dropped.clone();
    foreign.metadata.name = Some("other-b".into());
    foreign.metadata.owner_references.get_or_insert_default().iter_mut().for_each(|o| o.uid = "uid-2".into());
    let with_dropped = cache::Caches::holding(
        vec![job.clone(), dropped, foreign],
        vec![config_map.clone()],
        vec![policy.clone()],
        vec![sandbox.clone()],
    );
    let script = vec![call("DELETE", "/apis/batch/v1/namespaces/team-a/jobs/eval-b", Reply::Echo), event()];
    let cleaned = scenario_with_caches(&settled, storage_down(), with_dropped, script).await;
    assert!(cleaned.result.is_ok(), "{:?}", cleaned.result.err());
    assert_eq!(event_reasons(&cleaned.seen), [("Normal".into(), "JobDeleted".into())]);

    // The ConfigMap edited by hand and the Job gone from the listed cache:
    // those two are applied (the Job without a read: it was not there), the
    // NetworkPolicy is not.
    let mut edited = config_map.clone();
    edited.data.get_or_insert_default().insert("manifests.yaml".into(), "edited: by hand".into());
    let drifted = cache::Caches::holding(Vec::new(), vec![edited], vec![policy.clone()], vec![sandbox.clone()]);
    let script = vec![call("PATCH", CONFIG_MAP, Reply::Echo), call("PATCH", JOB, Reply::Echo)];
    let repaired = scenario_with_caches(&settled, storage_down(), drifted, script).await;
    assert!(repaired.result.is_ok(), "{:?}", repaired.result.err());
    assert_eq!(repaired.seen.len(), 2, "only the scripted calls");
    assert!(
        repaired.seen[0].body["data"]["manifests.yaml"].as_str().is_some_and(|m| m.contains("kind: SandboxConfig"))
    );
}

fn vllm_service(namespace: &str) -> k8s_openapi::api::core::v1::Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "vllm", "namespace": namespace, "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
        "spec": {"selector": {"app": "vllm"}, "ports": [{"port": 8000, "targetPort": 8080, "protocol": "TCP"}]},
    }))
    .expect("service")
}

#[tokio::test]
async fn a_service_an_endpoint_names_comes_from_the_cache_and_its_change_wakes_the_task() {
    let mut spec = spec();
    spec["policy"]["endpoint"] = json!("http://vllm:8000/v1");
    let current = task(spec, true);
    let sandbox: basecamp_api::SandboxConfig = serde_json::from_value(sandbox()).expect("sandbox");
    let holding = |services: Vec<k8s_openapi::api::core::v1::Service>| {
        cache::Caches::holding(Vec::new(), Vec::new(), Vec::new(), vec![sandbox.clone()])
            .with_services(Some("team-a"), services)
    };
    let script = || {
        vec![
            call("PATCH", CONFIG_MAP, Reply::Echo),
            call("PATCH", NETWORK_POLICY, Reply::Echo),
            call("PATCH", JOB, Reply::Echo),
            call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())),
            event(),
            event(),
        ]
    };
    let to_vllm = json!({
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}},
                "podSelector": {"matchLabels": {"app": "vllm"}}}],
        "ports": [{"port": 8080, "protocol": "TCP"}],
    });
    let open_8000 = json!({"ports": [{"port": 8000, "protocol": "TCP"}]});
    let egress = |seen: &[Seen]| {
        seen.iter().find(|s| s.uri.starts_with(NETWORK_POLICY)).expect("the policy").body["spec"]["egress"].clone()
    };

    // The Service in the listed cache: no read of it, and the policy allows its pods on the target port.
    let found = scenario_with_caches(&current, storage_down(), holding(vec![vllm_service("team-a")]), script()).await;
    assert!(found.result.is_ok(), "{:?}", found.result.err());
    let rules = egress(&found.seen);
    assert!(rules.as_array().is_some_and(|r| r.contains(&to_vllm) && !r.contains(&open_8000)), "{rules}");
    // Its change (or deletion) wakes this task, and only for that Service.
    let woken = found.ctx.tasks_using(&vllm_service("team-a"));
    assert_eq!(woken, [kube::runtime::reflector::ObjectRef::new("eval").within("team-a")]);
    assert!(found.ctx.tasks_using(&vllm_service("team-b")).is_empty());

    // Not in the listed cache: it does not exist (no read either), and the port stays open.
    let missing = scenario_with_caches(&current, storage_down(), holding(Vec::new()), script()).await;
    assert!(missing.result.is_ok(), "{:?}", missing.result.err());
    let rules = egress(&missing.seen);
    assert!(rules.as_array().is_some_and(|r| r.contains(&open_8000) && !r.contains(&to_vllm)), "{rules}");
    assert_eq!(missing.ctx.tasks_using(&vllm_service("team-a")).len(), 1, "a Service created later wakes it too");

    // No Service cache (the operator may not watch Services): read from the API.
    let caches = cache::Caches::holding(Vec::new(), Vec::new(), Vec::new(), vec![sandbox.clone()]);
    let mut read = script();
    let stored = serde_json::to_value(vllm_service("team-a")).expect("json");
    read.insert(0, call("GET", "/api/v1/namespaces/team-a/services/vllm", Reply::Json(200, stored)));
    let uncached = scenario_with_caches(&current, storage_down(), caches, read).await;
    assert!(uncached.result.is_ok(), "{:?}", uncached.result.err());
    assert!(egress(&uncached.seen).as_array().is_some_and(|r| r.contains(&to_vllm)));
}

#[tokio::test]
async fn a_reconcile_before_the_watch_delivers_the_status_write_neither_writes_it_again_nor_repeats_its_events() {
    // Caches holding what a first reconcile applied, and a task whose cached
    // copy does not show the status written yet.
    let current = task(spec(), true);
    let sandbox: basecamp_api::SandboxConfig = serde_json::from_value(sandbox()).expect("sandbox");
    let desired = |task: &Value| {
        let task: HarnessTask = serde_json::from_value(task.clone()).expect("task");
        let variants = vec![ResolvedVariant {
            name: "default".into(),
            sandbox_name: "shop".into(),
            profile: None,
            spec: sandbox.spec.clone(),
        }];
        let settings = Settings::default();
        crate::build::build(&BuildInput::new(&task, variants, &settings).expect("input")).expect("build")
    };
    let built = desired(&current);
    let caches = cache::Caches::holding(
        vec![cache::stamp(&built.jobs[0])],
        vec![cache::stamp(&built.config_map)],
        vec![cache::stamp(&built.network_policy)],
        vec![sandbox.clone()],
    );
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut ctx = Context::new(
        Client::new(service, "default"),
        Arc::new(Metrics::new()),
        Settings::default(),
        storage_down(),
        None,
    );
    ctx.caches = caches;
    let ctx = Arc::new(ctx);
    let script = vec![call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())), event(), event()];
    let verifier = tokio::spawn(verify(handle, script));
    let stale: HarnessTask = serde_json::from_value(current.clone()).expect("task");
    for _ in 0..3 {
        let result = reconcile(Arc::new(stale.clone()), ctx.clone()).await;
        assert!(result.is_ok(), "{:?}", result.err());
    }
    let seen =
        tokio::time::timeout(Duration::from_secs(10), verifier).await.expect("the scripted calls").expect("verifier");
    assert_eq!(seen.len(), 3, "one status write and its two Events, for three reconciles");
    let counted = ctx.metrics.encode();
    assert!(counted.contains(r#"basecamp_applies_total{kind="HarnessTaskStatus",result="applied"} 1"#), "{counted}");
    assert!(counted.contains(r#"basecamp_applies_total{kind="HarnessTaskStatus",result="unchanged"} 2"#), "{counted}");
}

#[tokio::test]
async fn a_spec_change_replaces_the_job_and_keeps_transition_times() {
    let old = task(spec(), true);
    let mut new_spec = spec();
    new_spec["shards"] = json!(4);
    let mut new = task(new_spec, true);
    new["metadata"]["generation"] = json!(2);
    new["status"] = json!({
        "phase": "Running", "observedGeneration": 1,
        "shards": {"default": {"total": 2, "succeeded": 0, "failed": 0, "running": 2}},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Resolved", "message": "", "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 1},
            {"type": "Progressing", "status": "True", "reason": "ShardsRunning", "message": "", "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 1},
        ],
    });
    let old_job = merge(built_job(&old), &json!({"status": {"active": 2}}));
    let mut script = apply_calls(Reply::Json(200, old_job), json!({}));
    script.insert(
        4,
        call(
            "DELETE",
            JOB,
            Reply::Json(200, json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200})),
        ),
    );
    // Events are published in the background: after the status.
    script.extend([call("PATCH", &format!("{TASK}/status"), Reply::Json(200, new.clone())), event(), event()]);
    let out = scenario(&new, storage_down(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    let seen = &out.seen;
    assert_eq!(seen[4].body["propagationPolicy"], "Background");
    assert_eq!(seen[5].body["spec"]["completions"], 4);
    assert!(
        seen[1].body["data"]["manifests.yaml"].as_str().is_some_and(|m| m.contains("shards: 4")),
        "{}",
        seen[1].body
    );
    let status = status_patch(seen);
    assert_eq!(status["observedGeneration"], 2);
    assert_eq!(status["shardsSummary"], "0/4");
    assert_eq!(
        condition(&status, "Ready")["lastTransitionTime"],
        "2026-01-02T03:04:05Z",
        "unchanged status keeps its time"
    );
    assert_eq!(condition(&status, "Ready")["observedGeneration"], 2);
    assert_ne!(condition(&status, "Progressing")["reason"], "ShardsRunning");
    assert_eq!(
        event_reasons(seen),
        [("Normal".into(), "JobReplaced".into()), ("Normal".into(), "ShardsPending".into())]
    );
    // One Event series per variant's replacement and per generation's
    // transitions: the recorder keeps a series' first note.
    let actions: Vec<&str> =
        seen.iter().filter(|s| s.uri.starts_with(EVENTS)).filter_map(|s| s.body["action"].as_str()).collect();
    assert_eq!(actions.len(), 2, "{actions:?}");
    assert!(actions.contains(&"ReplaceJob default") && actions.contains(&"UpdateStatus generation 2"), "{actions:?}");
}

#[tokio::test]
async fn a_failed_shard_degrades_the_task_with_a_warning() {
    let current = task(spec(), true);
    let job = built_job(&current);
    let status = json!({"active": 1, "ready": 1, "failed": 3, "failedIndexes": "1"});
    let mut script = apply_calls(Reply::Json(200, merge(job, &json!({"status": status}))), status.clone());
    // The failed shard's pod: its sandbox gave up (the termination message
    // is the end of its log, FallbackToLogsOnError).
    let pods = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [{
        "metadata": {"name": "eval-default-1-x", "labels": {"basecamp.dev/variant": "default"},
                     "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
        "status": {"phase": "Failed", "containerStatuses": [{
            "name": "sandbox", "ready": false, "restartCount": 0, "image": "", "imageID": "",
            "state": {"terminated": {"exitCode": 4, "reason": "Error", "finishedAt": "2026-01-02T03:04:05Z",
                                     "message": "error: gave up: 16 episodes in a row were ended by the policy's server"}}}]}}]});
    script.extend([
        call("GET", "/api/v1/namespaces/team-a/pods", Reply::Json(200, pods)),
        call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())),
        event(),
        event(),
        event(),
    ]);
    let out = scenario(&current, storage_down(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    let listed = out.seen.iter().find(|s| s.uri.starts_with("/api/v1/namespaces/team-a/pods")).expect("pods listed");
    assert!(listed.uri.contains("labelSelector=basecamp.dev%2Ftask%3Deval%2C%21basecamp.dev%2Frole"), "{}", listed.uri);
    let status = status_patch(&out.seen);
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["shards"]["default"], json!({"total": 2, "succeeded": 0, "failed": 1, "running": 1}));
    assert_eq!(condition(&status, "Degraded")["reason"], "ShardFailed");
    assert_eq!(
        condition(&status, "Degraded")["message"],
        "1 of 2 shards failed after their retries; the last: variant default, shard 1: the sandbox exited with code \
         4: error: gave up: 16 episodes in a row were ended by the policy's server"
    );
    assert_eq!(event_reasons(&out.seen)[2], ("Warning".into(), "ShardFailed".into()));
    let metrics = out.ctx.metrics.encode();
    assert!(
        metrics.contains(r#"basecamp_shards{namespace="team-a",task="eval",variant="default",state="failed"} 1"#),
        "{metrics}"
    );
}

fn finished_job_status() -> Value {
    json!({"succeeded": 1, "completedIndexes": "0", "conditions": [{"type": "Complete", "status": "True"}]})
}

#[tokio::test]
async fn s3_down_during_aggregation_is_a_degraded_condition_and_a_warning() {
    let mut one_shard = spec();
    one_shard["shards"] = json!(1);
    let current = task(one_shard, true);
    let job = merge(built_job(&current), &json!({"status": finished_job_status()}));
    let mut script = apply_calls(Reply::Json(200, job), finished_job_status());
    script.extend([
        call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())),
        event(),
        event(),
        event(),
    ]);
    let out = scenario(&current, storage_down(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    let status = status_patch(&out.seen);
    assert_eq!(status["phase"], "Running", "not finished until the summaries are read");
    assert_eq!(condition(&status, "Progressing")["reason"], "Aggregating");
    let degraded = condition(&status, "Degraded");
    assert_eq!(degraded["reason"], "S3Unavailable");
    assert!(
        degraded["message"].as_str().is_some_and(|m| m.contains("failed to list the shard summaries")),
        "{degraded}"
    );
    assert_eq!(event_reasons(&out.seen)[2], ("Warning".into(), "S3Unavailable".into()));
    assert!(out.ctx.metrics.encode().contains(r#"basecamp_s3_operation_errors_total{operation="list"} 1"#));
    assert_eq!(out.result.ok(), Some(Action::requeue(Duration::from_secs(30))), "retried");
}

#[tokio::test]
async fn finished_shards_are_aggregated_into_status_and_the_task_succeeds() {
    let server = S3Server::start();
    let storage = storage(&server);
    let mut one_shard = spec();
    one_shard["shards"] = json!(1);
    let current = task(one_shard, true);
    let today = UtcDate::from_system_time(std::time::SystemTime::now()).expect("today");
    let summary = json!({
        "namespace": "team-a", "task": "eval", "variant": "default", "shard": 0, "shard_count": 1,
        "started_unix_nanos": i64::try_from(jiff::Timestamp::now().as_nanosecond()).expect("nanos"), "wall_seconds": 1.0,
        "aggregate": {"episodes": 1, "means": {}, "resolution_time_p50_s": 1.0, "resolution_time_p95_s": 1.0, "outcomes": {}},
        "episodes": [{"id": "e1", "outcome": "final_answer", "failure_class": "ok", "trace_file": "e1.trace", "rollbacks": 0, "warnings": [],
                      "metrics": {"tool_call_accuracy": 1.0, "tool_call_accuracy_lenient": 1.0, "plan_step_f1": 1.0, "error_rate": 0.0,
                                  "resolution_time_s": 1.5, "tool_calls": 1, "steps": 2}}],
        "lost": [],
    });
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("summary.json"), summary.to_string()).expect("write");
    let key = format!(
        "traces/{:04}/{:02}/{:02}/team-a/eval/default/0/summary.json",
        today.year(),
        today.month(),
        today.day()
    );
    let to = basecamp_sandbox::storage::Destination::parse(&format!("s3://{BUCKET}/{key}")).expect("dest");
    storage.upload_file(&dir.path().join("summary.json"), &to).await.into_result().expect("upload");

    let job = merge(built_job(&current), &json!({"status": finished_job_status()}));
    let mut script = apply_calls(Reply::Json(200, job), finished_job_status());
    script.extend([
        call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())),
        event(),
        event(),
        event(),
    ]);
    let out = scenario(&current, storage.clone(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    let status = status_patch(&out.seen);
    assert_eq!(status["phase"], "Succeeded", "{status}");
    assert_eq!(status["metrics"]["default"]["tool_call_accuracy"], 1.0);
    assert_eq!(status["accuracy"], "1.000");
    assert_eq!(status["criteria"][0]["met"], true);
    assert_eq!(status["aggregatedShards"]["default"], json!([0]));
    assert_eq!(status["traceLocation"], format!("s3://{BUCKET}/traces/reports/team-a/eval/"));
    assert_eq!(condition(&status, "Succeeded")["reason"], "CriteriaMet");
    assert_eq!(
        event_reasons(&out.seen),
        [
            ("Normal".into(), "Resolved".into()),
            ("Normal".into(), "Finished".into()),
            ("Normal".into(), "CriteriaMet".into())
        ]
    );
    let metrics = out.ctx.metrics.encode();
    assert!(
        metrics.contains(r#"basecamp_task_tool_call_accuracy{namespace="team-a",task="eval",variant="default"} 1.0"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"basecamp_task_criteria_met{namespace="team-a",task="eval",variant="default"} 1"#),
        "{metrics}"
    );
    let index = storage
        .fetch(
            &basecamp_sandbox::storage::Destination::parse(&format!(
                "s3://{BUCKET}/traces/reports/team-a/eval/index.json"
            ))
            .expect("d"),
        )
        .await
        .expect("index.json written");
    assert!(String::from_utf8_lossy(&index).contains("e1.trace"));

    // The criteria edited after the end (generation 2): judged again on the
    // same metrics, no shard run again. Before: the old criteria's results
    // under the new observedGeneration.
    let mut edited = merge(current.clone(), &json!({"status": status}));
    edited["metadata"]["generation"] = json!(2);
    edited["spec"]["taskDefinition"]["successCriteria"] = json!(["tool_call_accuracy > 1.5"]);
    let job = merge(built_job(&edited), &json!({"status": finished_job_status()}));
    let mut script = apply_calls(Reply::Json(200, job), finished_job_status());
    script.extend([call("PATCH", &format!("{TASK}/status"), Reply::Json(200, edited.clone())), event()]);
    let again = scenario(&edited, storage.clone(), script).await;
    assert!(again.result.is_ok(), "{:?}", again.result.err());
    let status = status_patch(&again.seen);
    assert_eq!(status["observedGeneration"], 2);
    assert_eq!(status["criteria"][0]["criterion"], "tool_call_accuracy > 1.5", "{status}");
    assert_eq!(status["criteria"][0]["met"], false, "{status}");
    assert_eq!(status["phase"], "Failed", "{status}");
}

#[tokio::test]
async fn an_unknown_sandbox_config_is_a_condition_and_a_warning() {
    let current = task(spec(), true);
    let out = without_its_sandbox_config(&current).await;
    assert_eq!(out.result.ok(), Some(Action::requeue(Duration::from_secs(300))));
    let status = status_patch(&out.seen);
    assert_eq!(status["phase"], "Failed");
    let ready = condition(&status, "Ready");
    assert_eq!((ready["status"].as_str(), ready["reason"].as_str()), (Some("False"), Some("UnknownSandbox")));
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.sandboxRef.name") && m.contains("\"shop\" not found")),
        "{ready}"
    );
    assert_eq!(
        event_reasons(&out.seen),
        [("Warning".into(), "UnknownSandbox".into())],
        "one Event for Ready=False and Failed=True"
    );
    let note = out.seen.iter().find(|s| s.uri.starts_with(EVENTS)).map(|s| s.body["note"].clone()).expect("event");
    assert!(note.as_str().is_some_and(|n| n.contains("not found")), "{note}");
}

#[tokio::test]
async fn an_invalid_spec_is_a_condition_naming_the_field() {
    let mut local = spec();
    local["evaluation"]["testSet"] = json!("tests/shop.jsonl");
    local["shards"] = json!(0);
    let current = task(local, true);
    let script = vec![
        call("GET", SANDBOX, Reply::Json(200, sandbox())),
        call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())),
        event(),
    ];
    let out = scenario(&current, storage_down(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    let ready = condition(&status_patch(&out.seen), "Ready");
    assert_eq!(ready["status"], "False");
    let message = ready["message"].as_str().unwrap_or("");
    assert!(message.contains("spec.shards"), "{message}");
    assert!(message.contains("spec.evaluation.testSet") && message.contains("s3://"), "{message}");
    assert_eq!(event_reasons(&out.seen)[0].0, "Warning");
}

fn deleting(retention: &str) -> Value {
    let mut with_retention = spec();
    with_retention["traces"]["retention"] = json!(retention);
    let mut task = task(with_retention, true);
    task["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
    task["metadata"]["finalizers"] = json!(["basecamp.dev/traces", "example.com/keep"]);
    task
}

#[tokio::test]
async fn deletion_with_retain_keeps_the_traces_and_releases_the_finalizer() {
    let current = deleting("Retain");
    let out =
        scenario(&current, storage_down(), vec![call("PATCH", TASK, Reply::Json(200, current.clone())), event()]).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    assert_eq!(
        out.seen[0].body["metadata"]["finalizers"],
        json!(["example.com/keep"]),
        "only our finalizer is removed"
    );
    assert_eq!(event_reasons(&out.seen), [("Normal".into(), "TracesRetained".into())]);
}

const JOBS: &str = "/apis/batch/v1/namespaces/team-a/jobs";
const PODS: &str = "/api/v1/namespaces/team-a/pods";

fn list(kind: &str, items: Vec<Value>) -> Reply {
    Reply::Json(200, json!({"apiVersion": "v1", "kind": kind, "metadata": {}, "items": items}))
}

/// The calls with which retention Delete finds the task's Jobs (none) and
/// pods (`pods`) before it deletes anything in S3.
fn stop_calls(pods: Vec<Value>) -> Vec<Call> {
    vec![call("GET", JOBS, list("JobList", vec![])), call("GET", PODS, list("PodList", pods))]
}

fn pod(name: &str, phase: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "team-a", "labels": {"basecamp.dev/task": "eval"}},
           "spec": {"containers": [], "terminationGracePeriodSeconds": 30}, "status": {"phase": phase}})
}

async fn upload(storage: &Storage, keys: &[String]) {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("f"), b"x").expect("write");
    for key in keys {
        let to = basecamp_sandbox::storage::Destination::parse(&format!("s3://{BUCKET}/{key}")).expect("dest");
        storage.upload_file(&dir.path().join("f"), &to).await.into_result().expect("upload");
    }
}

async fn keys_under(storage: &Storage, prefix: &str) -> Vec<String> {
    let left = storage
        .list(&basecamp_sandbox::storage::Destination::parse(&format!("s3://{BUCKET}/{prefix}")).expect("d"))
        .await
        .expect("list");
    left.iter().map(|o| format!("{prefix}/{}", o.relative)).collect()
}

fn today_path() -> String {
    let today = UtcDate::from_system_time(std::time::SystemTime::now()).expect("today");
    format!("{:04}/{:02}/{:02}", today.year(), today.month(), today.day())
}

#[tokio::test]
async fn deletion_with_delete_stops_the_running_pods_and_waits_for_them() {
    let server = S3Server::start();
    let storage = storage(&server);
    let day = today_path();
    upload(&storage, &[format!("traces/{day}/team-a/eval/default/0/e1.trace")]).await;
    let current = deleting("Delete");
    let job = merge(
        built_job(&current),
        &json!({"metadata": {"ownerReferences": [{"apiVersion": "basecamp.dev/v1alpha1", "kind": "HarnessTask",
            "name": "eval", "uid": "uid-1", "controller": true}]}}),
    );
    let script = vec![
        call("GET", JOBS, list("JobList", vec![job])),
        call("DELETE", JOB, Reply::Json(200, json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}))),
        call("GET", PODS, list("PodList", vec![pod("eval-default-0", "Running"), pod("eval-default-1", "Succeeded")])),
        event(),
    ];
    let out = scenario(&current, storage.clone(), script).await;
    assert_eq!(out.result.ok(), Some(Action::requeue(Duration::from_secs(5))), "checked again soon");
    assert_eq!(out.seen[1].body["propagationPolicy"], "Background");
    assert_eq!(event_reasons(&out.seen), [("Normal".into(), "WaitingForPods".into())]);
    let note = out.seen[3].body["note"].as_str().unwrap_or("").to_string();
    assert!(note.contains("waiting for 1 pods of the task to stop (eval-default-0)"), "{note}");
    assert_eq!(keys_under(&storage, "traces").await.len(), 1, "nothing deleted while a pod may still upload");
}

#[tokio::test]
async fn deletion_with_delete_does_not_wait_past_the_grace_period() {
    let server = S3Server::start();
    let storage = storage(&server);
    let day = today_path();
    upload(&storage, &[format!("traces/{day}/team-a/eval/default/0/e1.trace")]).await;
    let mut current = deleting("Delete");
    let long_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(600);
    current["metadata"]["deletionTimestamp"] = json!(long_ago.to_string());
    let mut script = stop_calls(vec![pod("eval-default-0", "Running")]);
    script.extend([call("PATCH", TASK, Reply::Json(200, current.clone())), event()]);
    let out = scenario(&current, storage.clone(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    assert_eq!(event_reasons(&out.seen), [("Normal".into(), "TracesDeleted".into())]);
    let note = out.seen[3].body["note"].as_str().unwrap_or("").to_string();
    assert!(note.contains("deleted 1 objects") && note.contains("1 pods had still not stopped"), "{note}");
}

#[tokio::test]
async fn deletion_with_delete_removes_the_traces_under_every_destination_the_task_had() {
    let server = S3Server::start();
    let storage = storage(&server);
    let day = today_path();
    upload(
        &storage,
        &[
            format!("old/{day}/team-a/eval/default/0/e1.trace"),
            format!("traces/{day}/team-a/eval/default/0/e1.trace"),
            format!("old/{day}/team-a/other/default/0/e1.trace"),
        ],
    )
    .await;
    let mut current = deleting("Delete");
    current["status"] = json!({"traceDestinations": [format!("s3://{BUCKET}/old"), format!("s3://{BUCKET}/traces")]});
    let mut script = stop_calls(vec![]);
    script.extend([call("PATCH", TASK, Reply::Json(200, current.clone())), event()]);
    let out = scenario(&current, storage.clone(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    let note = out.seen[3].body["note"].as_str().unwrap_or("").to_string();
    assert!(note.contains("deleted 2 objects"), "{note}");
    assert_eq!(keys_under(&storage, "old").await, [format!("old/{day}/team-a/other/default/0/e1.trace")]);
    assert_eq!(keys_under(&storage, "traces").await, Vec::<String>::new());
}

#[tokio::test]
async fn deletion_with_delete_removes_the_task_prefix_only() {
    let server = S3Server::start();
    let storage = storage(&server);
    let today = UtcDate::from_system_time(std::time::SystemTime::now()).expect("today");
    let day = format!("{:04}/{:02}/{:02}", today.year(), today.month(), today.day());
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("f"), b"x").expect("write");
    for key in [
        format!("traces/{day}/team-a/eval/default/0/summary.json"),
        format!("traces/{day}/team-a/eval/default/0/e1.trace"),
        "traces/reports/team-a/eval/index.json".to_string(),
        format!("traces/{day}/team-a/eval-2/default/0/e1.trace"),
    ] {
        let to = basecamp_sandbox::storage::Destination::parse(&format!("s3://{BUCKET}/{key}")).expect("dest");
        storage.upload_file(&dir.path().join("f"), &to).await.into_result().expect("upload");
    }
    let current = deleting("Delete");
    let mut script = stop_calls(vec![pod("eval-default-0", "Succeeded")]);
    script.extend([call("PATCH", TASK, Reply::Json(200, current.clone())), event()]);
    let out = scenario(&current, storage.clone(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    assert_eq!(event_reasons(&out.seen), [("Normal".into(), "TracesDeleted".into())]);
    let note = out.seen[3].body["note"].as_str().unwrap_or("").to_string();
    assert!(note.contains("deleted 3 objects"), "{note}");
    let left = storage
        .list(&basecamp_sandbox::storage::Destination::parse(&format!("s3://{BUCKET}/traces")).expect("d"))
        .await
        .expect("list");
    let left: Vec<&str> = left.iter().map(|o| o.relative.as_str()).collect();
    assert_eq!(left, [format!("{day}/team-a/eval-2/default/0/e1.trace")], "another task's traces stay");
}

#[tokio::test]
async fn deletion_with_delete_and_s3_down_keeps_the_finalizer_and_retries() {
    let current = deleting("Delete");
    let mut script = stop_calls(vec![]);
    script.push(event());
    let out = scenario(&current, storage_down(), script).await;
    let error = out.result.expect_err("the deletion must be retried");
    assert_eq!(error.category(), "S3Unavailable");
    assert!(error.to_string().contains("the task is kept until they are deleted"), "{error}");
    assert_eq!(event_reasons(&out.seen), [("Warning".into(), "S3Unavailable".into())]);
    assert!(out.ctx.metrics.encode().contains(r#"basecamp_reconcile_errors_total{category="S3Unavailable"} 1"#));
}

#[tokio::test]
async fn a_suspended_task_waits_in_phase_suspended() {
    let mut suspended = spec();
    suspended["suspend"] = json!(true);
    let current = task(suspended, true);
    let mut script = apply_calls(not_found(), json!({}));
    script.extend([call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())), event(), event()]);
    let out = scenario(&current, storage_down(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    assert_eq!(out.seen[4].body["spec"]["suspend"], true);
    let status = status_patch(&out.seen);
    assert_eq!(status["phase"], "Suspended");
    assert_eq!(condition(&status, "Progressing")["reason"], "Suspended");
    assert_eq!(event_reasons(&out.seen)[1], ("Normal".into(), "Suspended".into()));
}

#[tokio::test]
async fn no_node_satisfying_the_gpu_requirement_is_a_degraded_condition_naming_what_was_found() {
    let current = task(spec(), true);
    let mut gpu_sandbox = sandbox();
    gpu_sandbox["spec"]["gpu"] = json!({"required": true, "minComputeCapability": "9.0"});
    let node = |name: &str, product: &str, major: &str, minor: &str| {
        json!({"metadata": {"name": name, "labels": {
            "nvidia.com/gpu.product": product, "nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    };
    let nodes = json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": [
        node("v100-0", "Tesla-V100", "7", "0"), node("a100-0", "A100", "8", "0"), node("a100-1", "A100", "8", "0"),
        {"metadata": {"name": "cpu-0", "labels": {}}},
    ]});
    let mut script = apply_calls(not_found(), json!({}));
    script[0] = call("GET", SANDBOX, Reply::Json(200, gpu_sandbox));
    script.insert(1, call("GET", "/api/v1/nodes", Reply::Json(200, nodes)));
    script.extend([
        call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())),
        event(),
        event(),
        event(),
    ]);
    let out = scenario(&current, storage_down(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    let job = &out.seen[5].body;
    assert_eq!(
        job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["values"],
        json!(["9"])
    );
    let degraded = condition(&status_patch(&out.seen), "Degraded");
    assert_eq!(degraded["reason"], "InsufficientGpuCapacity");
    assert_eq!(
        degraded["message"],
        "variant default: 0 of 3 GPU nodes satisfy compute capability >= 9.0; found A100 (8.0) x2, Tesla-V100 (7.0) x1"
    );
    assert_eq!(event_reasons(&out.seen)[2], ("Warning".into(), "InsufficientGpuCapacity".into()));
    assert_eq!(out.result.ok(), Some(Action::requeue(Duration::from_secs(30))), "checked again soon");
}

#[test]
fn sandbox_changes_map_to_the_tasks_that_reference_them() {
    let a: HarnessTask = serde_json::from_value(task(spec(), true)).expect("task");
    let mut other_spec = spec();
    other_spec["sandboxRef"] = json!({"name": "other"});
    let mut b_value = task(other_spec, true);
    b_value["metadata"]["name"] = json!("unrelated");
    let b: HarnessTask = serde_json::from_value(b_value).expect("task");
    let sandbox: basecamp_api::SandboxConfig = serde_json::from_value(sandbox()).expect("sandbox");
    let refs = tasks_referencing(&[Arc::new(a), Arc::new(b)], &sandbox);
    assert_eq!(refs.len(), 1);
    assert_eq!(refs[0].name, "eval");
}

#[test]
fn backoff_doubles_up_to_five_minutes() {
    let waits: Vec<u64> = [1, 2, 3, 7, 20].iter().map(|n| backoff(*n).as_secs()).collect();
    assert_eq!(waits, [5, 10, 20, 300, 300]);
}

/// A training task through the whole pipeline: the variant's Job, then the
/// trainer, the evaluation of a finished step (an Event naming the step),
/// the next step started, and a status that keeps the task Running.
#[tokio::test]
async fn a_training_task_evaluates_a_finished_checkpoint_and_keeps_running() {
    let server = S3Server::start();
    let storage = storage(&server);
    let upload = |key: String, bytes: Vec<u8>| {
        let storage = storage.clone();
        async move {
            let dir = tempfile::tempdir().expect("tmp");
            std::fs::write(dir.path().join("f"), bytes).expect("write");
            let to = basecamp_sandbox::storage::Destination::parse(&format!("s3://{BUCKET}/{key}")).expect("dest");
            storage.upload_file(&dir.path().join("f"), &to).await.into_result().expect("upload");
        }
    };
    let root = "traces/checkpoints/team-a/eval";
    for step in [20, 30] {
        upload(format!("{root}/step-{step}/COMPLETE"), vec![]).await;
    }
    let today = UtcDate::from_system_time(std::time::SystemTime::now()).expect("today");
    let summary = json!({
        "variant": "default", "shard": 0, "started_unix_nanos": 1_000, "lost": [],
        "episodes": [{"id": "e1", "outcome": "final_answer", "failure_class": "ok", "trace_file": "e1.trace",
                      "metrics": {"tool_call_accuracy": 0.75, "tool_call_accuracy_lenient": 1.0, "plan_step_f1": 1.0, "error_rate": 0.0,
                                  "resolution_time_s": 1.5, "tool_calls": 1, "steps": 2}}],
    });
    let day = format!("{:04}/{:02}/{:02}", today.year(), today.month(), today.day());
    upload(format!("traces/{day}/team-a/eval@step-20/default/0/summary.json"), summary.to_string().into_bytes()).await;

    let mut training = spec();
    training["shards"] = json!(1);
    training["trainingConfig"] = json!({"image": "trainer:1", "command": ["python3", "train.py"]});
    let current = task(training, true);
    let jobs = "/apis/batch/v1/namespaces/team-a/jobs";
    let step_20 = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "eval-s20-default", "namespace": "team-a",
                     "labels": {"basecamp.dev/task": "eval", "basecamp.dev/variant": "default", "basecamp.dev/step": "20", "basecamp.dev/role": "evaluation"}},
        "status": {"completedIndexes": "0", "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]},
    });
    let mut script = apply_calls(not_found(), json!({"active": 1}));
    script.extend([
        call("GET", &format!("{jobs}/eval-train"), not_found()),
        call("PATCH", &format!("{jobs}/eval-train"), Reply::EchoWith(json!({"status": {"active": 1, "ready": 1}}))),
        call(
            "GET",
            "/api/v1/namespaces/team-a/pods",
            Reply::Json(200, json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []})),
        ),
        call(
            "GET",
            jobs,
            Reply::Json(200, json!({"kind": "JobList", "apiVersion": "batch/v1", "metadata": {}, "items": [step_20]})),
        ),
        call("GET", &format!("{jobs}/eval-s30-default"), not_found()),
        call("PATCH", &format!("{jobs}/eval-s30-default"), Reply::Echo),
        // Events are published in the background: after the status.
        call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())),
        event(),
        event(),
        event(),
    ]);
    let out = scenario(&current, storage, script).await;
    let action = out.result.expect("reconciled");
    assert_eq!(action, Action::requeue(Duration::from_secs(10)), "polled while the trainer runs");
    let evaluated = out.seen.iter().find(|s| s.body["reason"] == "CheckpointEvaluated").expect("an Event");
    assert_eq!(evaluated.body["action"], "EvaluateStep20", "one Event series per step");
    assert!(evaluated.body["note"].as_str().is_some_and(|n| n.contains("step 20") && n.contains("default=0.750")));
    let status = status_patch(&out.seen);
    assert_eq!(status["phase"], "Running", "{status}");
    assert_eq!(condition(&status, "Progressing")["reason"], "Training");
    let training = &status["training"];
    assert_eq!(training["phase"], "Running");
    assert_eq!(training["job"], "eval-train");
    assert_eq!(training["evaluating"], json!([30]));
    assert_eq!(training["latestStep"], 20);
    assert_eq!(training["history"][0]["metrics"]["default"]["tool_call_accuracy"], 0.75);
    let text = out.ctx.metrics.encode();
    assert!(text.contains(r#"basecamp_checkpoint_step{namespace="team-a",task="eval"} 20"#), "{text}");
}

#[tokio::test]
async fn a_reconcile_before_the_watch_delivers_the_finalizer_does_not_add_it_again() {
    // A first reconcile adds the finalizer (with the applies) and writes the
    // status; a second, woken before the watch delivered either write, sees
    // the task without them: it sends nothing, where it used to patch the
    // finalizer with the older resourceVersion and fail with a 409.
    let fresh = task(spec(), false);
    let with_finalizer = task(spec(), true);
    let mut script = apply_calls(not_found(), json!({}));
    script.insert(1, call("PATCH", TASK, Reply::Json(200, with_finalizer.clone())));
    script.extend([call("PATCH", &format!("{TASK}/status"), Reply::Json(200, with_finalizer)), event(), event()]);
    let first = scenario(&fresh, storage_down(), script).await;
    assert!(first.result.is_ok(), "{:?}", first.result.err());
    let sandbox: basecamp_api::SandboxConfig = serde_json::from_value(sandbox()).expect("sandbox");
    let applied =
        |uri: &str| first.seen.iter().find(|s| s.uri.starts_with(uri) && !s.body.is_null()).expect(uri).body.clone();
    let ctx = Arc::try_unwrap(first.ctx).unwrap_or_else(|_| panic!("the context is no longer shared"));
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut ctx = Context { client: Client::new(service, "default"), ..ctx };
    ctx.caches = cache::Caches::holding(
        vec![serde_json::from_value(applied(JOB)).expect("job")],
        vec![serde_json::from_value(applied(CONFIG_MAP)).expect("config map")],
        vec![serde_json::from_value(applied(NETWORK_POLICY)).expect("network policy")],
        vec![sandbox],
    );
    let verifier = tokio::spawn(verify(handle, Vec::new()));
    let stale: HarnessTask = serde_json::from_value(fresh).expect("task");
    let second = reconcile(Arc::new(stale), Arc::new(ctx)).await;
    assert!(second.is_ok(), "{:?}", second.err());
    let seen = tokio::time::timeout(Duration::from_secs(10), verifier).await.expect("the verifier").expect("verifier");
    assert!(seen.is_empty(), "no call: {:?}", seen.iter().map(|s| &s.uri).collect::<Vec<_>>());
}

#[test]
fn the_operators_status_writes_do_not_wake_the_task_but_other_changes_do() {
    let base: HarnessTask = serde_json::from_value(task(spec(), true)).expect("task");
    let trigger = |t: &HarnessTask| task_trigger(t).expect("every task has a trigger hash");
    let mut written = base.clone();
    written.status = Some(basecamp_api::HarnessTaskStatus { observed_generation: Some(1), ..Default::default() });
    written.metadata.resource_version = Some("8".into());
    assert_eq!(trigger(&written), trigger(&base), "a status write (and its new resourceVersion) wakes nothing");
    let changed = |edit: &dyn Fn(&mut HarnessTask)| {
        let mut t = base.clone();
        edit(&mut t);
        trigger(&t)
    };
    for (what, hash) in [
        ("the spec (generation)", changed(&|t| t.metadata.generation = Some(2))),
        ("an annotation", changed(&|t| t.annotations_mut().insert("poke".into(), "1".into()).map(drop).unwrap_or(()))),
        ("a label", changed(&|t| t.labels_mut().insert("team".into(), "a".into()).map(drop).unwrap_or(()))),
        ("the finalizer removed", changed(&|t| t.finalizers_mut().clear())),
        ("deletion", changed(&|t| t.metadata.deletion_timestamp = Some(now()))),
    ] {
        assert_ne!(hash, trigger(&base), "{what} wakes the task");
    }
}

/// The status a blocked task wrote (and its Ready condition): Ready=False
/// for `reason`, looked at again in 5 minutes.
fn blocked(out: &Outcome, reason: &str) -> (Value, Value) {
    assert_eq!(out.result.as_ref().ok(), Some(&Action::requeue(Duration::from_secs(300))), "looked at again later");
    let status = status_patch(&out.seen);
    let ready = condition(&status, "Ready");
    assert_eq!((ready["status"].as_str(), ready["reason"].as_str()), (Some("False"), Some(reason)));
    (status, ready)
}

/// Task `eval` variant `v2-baseline` and task `eval-v2` variant `baseline`
/// both want the Job `eval-v2-baseline`: the one that does not hold it
/// leaves the holder's Job alone (no DELETE, no apply over it) and says on
/// its status which object holds the name and what to rename.
#[tokio::test]
async fn a_job_name_held_by_another_task_is_left_alone_and_reported() {
    let mut variants = spec();
    variants["variants"] = json!([{"name": "v2-baseline", "sandboxRef": {"name": "shop"}}]);
    variants.as_object_mut().expect("a spec object").remove("sandboxRef");
    let current = task(variants, true);
    let job = "/apis/batch/v1/namespaces/team-a/jobs/eval-v2-baseline";
    let holders = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": "eval-v2-baseline", "namespace": "team-a", "uid": "job-uid",
            "annotations": {"basecamp.dev/template-hash": "another-tasks-template"},
            "ownerReferences": [{"apiVersion": "basecamp.dev/v1alpha1", "kind": "HarnessTask", "name": "eval-v2",
                                 "uid": "uid-2", "controller": true, "blockOwnerDeletion": true}],
        },
        "status": {"active": 1},
    });
    let script = vec![
        call("GET", SANDBOX, Reply::Json(200, sandbox())),
        call("PATCH", CONFIG_MAP, Reply::Echo),
        call("PATCH", NETWORK_POLICY, Reply::Echo),
        call("GET", job, Reply::Json(200, holders)),
        // No DELETE and no PATCH of the Job: the status, and its Event.
        call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())),
        event(),
    ];
    let out = scenario(&current, storage_down(), script).await;
    let (_, ready) = blocked(&out, "JobNameTaken");
    let message = ready["message"].as_str().unwrap_or("");
    assert!(
        message.contains("team-a/eval-v2-baseline")
            && message.contains("HarnessTask eval-v2 (uid uid-2)")
            && message.contains("rename this task or the variant"),
        "{message}"
    );
    assert_eq!(event_reasons(&out.seen), [("Warning".into(), "JobNameTaken".into())]);
    let note = out.seen.iter().find(|s| s.uri.starts_with(EVENTS)).map(|s| s.body["note"].clone()).expect("event");
    assert!(note.as_str().is_some_and(|n| n.contains("HarnessTask eval-v2")), "{note}");
}

/// A Job the API server refuses (a name or a label it will not take): the
/// task says so on its status, with the server's message, and waits for an
/// edit. Before: an error retried with backoff forever, and no status at all.
#[tokio::test]
async fn a_job_the_api_server_refuses_is_a_condition_not_an_endless_retry() {
    let current = task(spec(), true);
    let invalid = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
        "message": "Job.batch \"eval-default\" is invalid: metadata.name: Invalid value: \"eval-default\": will not able to create pod with invalid DNS label",
    });
    let mut script = apply_calls(not_found(), json!({}));
    script.pop();
    script.extend([
        call("PATCH", JOB, Reply::Json(422, invalid)),
        // The status, and its Event.
        call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())),
        event(),
    ]);
    let out = scenario(&current, storage_down(), script).await;
    let (status, ready) = blocked(&out, "ApplyInvalid");
    assert!(ready["message"].as_str().is_some_and(|m| m.contains("invalid DNS label")), "{ready}");
    assert_eq!(status["phase"], "Failed");
    assert_eq!(event_reasons(&out.seen), [("Warning".into(), "ApplyInvalid".into())]);
}

/// A Job whose name another owner took after this task's own Job finished
/// and was removed: nothing to apply, nothing to report.
#[tokio::test]
async fn a_finished_variants_job_name_taken_since_is_not_an_error() {
    let want: k8s_openapi::api::batch::v1::Job =
        serde_json::from_value(built_job(&task(spec(), true))).expect("the built Job");
    let mut holders = want.clone();
    holders.metadata.owner_references.get_or_insert_default()[0].uid = "uid-2".into();
    assert!(apply::foreign_holder(&want, &want).is_none(), "its own Job");
    assert_eq!(
        apply::foreign_holder(&want, &holders).as_deref(),
        Some("HarnessTask eval (uid uid-2)"),
        "the same name, another task (a deleted task's Job, or a name collision)"
    );
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let jobs: kube::Api<k8s_openapi::api::batch::v1::Job> =
        kube::Api::namespaced(Client::new(service, "default"), "team-a");
    let read = || call("GET", JOB, Reply::Json(200, serde_json::to_value(&holders).expect("json")));
    // Each reads the live Job, and neither deletes nor applies it.
    let verifier = tokio::spawn(verify(handle, vec![read(), read()]));
    let metrics = Metrics::new();
    let finished = apply::apply_job(&jobs, &metrics, "team-a", &want, cache::CachedJob::Unknown, true).await;
    assert_eq!(finished.expect("no error"), (None, false));
    let cached = cache::CachedJob::Present(Arc::new(holders.clone()));
    let running =
        apply::apply_job(&jobs, &metrics, "team-a", &want, cached, false).await.expect_err("the name is taken");
    assert_eq!(running.category(), "JobNameTaken");
    verifier.await.expect("verifier");
}

/// A task whose shards failed while no node satisfies its GPU requirement:
/// finished, it needs no GPU, so it is not Degraded for capacity, and it
/// waits for a change instead of being polled every 30 s forever.
#[tokio::test]
async fn a_failed_task_is_not_degraded_for_capacity_and_waits_for_a_change() {
    let current = task(spec(), true);
    let mut gpu_sandbox = sandbox();
    gpu_sandbox["spec"]["gpu"] = json!({"required": true, "minComputeCapability": "9.0"});
    let nodes = json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": []});
    let failed = json!({"failed": 2, "failedIndexes": "0-1", "conditions": [{"type": "Failed", "status": "True"}]});
    let mut script = apply_calls(Reply::Json(200, merge(built_job(&current), &json!({"status": failed}))), failed);
    script[0] = call("GET", SANDBOX, Reply::Json(200, gpu_sandbox));
    script.insert(1, call("GET", "/api/v1/nodes", Reply::Json(200, nodes)));
    // The GPU sandbox changes the template: the Job is replaced.
    script.insert(5, call("DELETE", JOB, Reply::Json(200, json!({"kind": "Status", "status": "Success"}))));
    // Without the right to read pods, the condition names no exit, and the reconcile goes on.
    let forbidden = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                           "message": "pods is forbidden"});
    script.extend([
        call("GET", "/api/v1/namespaces/team-a/pods", Reply::Json(403, forbidden)),
        call("PATCH", &format!("{TASK}/status"), Reply::Json(200, current.clone())),
    ]);
    script.extend(std::iter::repeat_with(event).take(5));
    let out = scenario(&current, storage_down(), script).await;
    assert!(out.result.is_ok(), "{:?}", out.result.as_ref().err());
    let status = status_patch(&out.seen);
    assert_eq!(status["phase"], "Failed", "{status}");
    assert_eq!(condition(&status, "Degraded")["reason"], "ShardFailed");
    assert_eq!(condition(&status, "Degraded")["message"], "2 of 2 shards failed after their retries");
    assert_eq!(out.result.ok(), Some(Action::await_change()), "a failed shard stays failed: nothing to poll");
}

fn status_with(phase: &str, degraded: Option<&str>) -> basecamp_api::HarnessTaskStatus {
    let condition = |status: &str, reason: &str| {
        json!({"type": "Degraded", "status": status, "reason": reason, "message": "",
               "lastTransitionTime": "2026-01-02T03:04:05Z"})
    };
    let degraded = degraded.map_or_else(|| condition("False", "AsExpected"), |reason| condition("True", reason));
    serde_json::from_value(json!({"phase": phase, "conditions": [degraded]})).expect("status")
}

#[test]
fn a_finished_task_waits_for_a_change_unless_a_retry_can_clear_its_degraded_condition() {
    let poll = Duration::from_secs(10);
    let soon = Action::requeue(Duration::from_secs(30));
    for (phase, degraded, expected) in [
        ("Failed", Some("ShardFailed"), Action::await_change()),
        ("Succeeded", Some("InsufficientGpuCapacity"), Action::await_change()),
        ("Succeeded", None, Action::await_change()),
        // Failed by a shard, the others' summaries not read yet: a retry writes the report.
        ("Failed", Some("S3Unavailable"), soon.clone()),
        ("Failed", Some("SummaryMissing"), soon.clone()),
        ("Running", Some("ShardFailed"), soon.clone()),
        ("Running", Some("InsufficientGpuCapacity"), soon.clone()),
        ("Running", None, Action::requeue(Duration::from_secs(300))),
    ] {
        assert_eq!(next_action(&status_with(phase, degraded), poll), expected, "{phase} {degraded:?}");
    }
}

fn finished_or_running(phase: &str) -> Value {
    let mut current = task(spec(), true);
    current["status"] = json!({
        "phase": phase, "observedGeneration": 1, "shardsSummary": "2/2",
        "shards": {"default": {"total": 2, "succeeded": 2, "failed": 0, "running": 0}},
        "metrics": {"default": {"tool_call_accuracy": 0.95}},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Resolved", "message": "", "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 1},
            {"type": "Progressing", "status": "True", "reason": "ShardsRunning", "message": "1/2 shards finished, 1 running", "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 1},
        ],
    });
    current
}

#[tokio::test]
async fn a_finished_task_keeps_its_results_when_its_sandbox_config_is_deleted() {
    let current = finished_or_running("Succeeded");
    let out = scenario(&current, storage_down(), vec![call("GET", SANDBOX, not_found())]).await;
    assert_eq!(out.result.ok(), Some(Action::await_change()), "no status write, no Event: nothing else is called");
    // A new generation is validated again: it cannot run.
    let mut edited = current.clone();
    edited["metadata"]["generation"] = json!(2);
    let out = without_its_sandbox_config(&edited).await;
    assert!(out.result.is_ok(), "{:?}", out.result.err());
    assert_eq!(status_patch(&out.seen)["phase"], "Failed");
}

#[tokio::test]
async fn a_running_task_whose_sandbox_config_is_deleted_is_not_ready_but_not_failed() {
    let current = finished_or_running("Running");
    let out = without_its_sandbox_config(&current).await;
    assert_eq!(out.result.ok(), Some(Action::requeue(Duration::from_secs(300))));
    let status = status_patch(&out.seen);
    assert_eq!(status["phase"], "Running", "its Jobs run on: {status}");
    assert_eq!(status["metrics"]["default"]["tool_call_accuracy"], 0.95);
    let ready = condition(&status, "Ready");
    assert_eq!((ready["status"].as_str(), ready["reason"].as_str()), (Some("False"), Some("UnknownSandbox")));
    assert!(ready["message"].as_str().is_some_and(|m| m.contains("run on")), "{ready}");
    assert_eq!(condition(&status, "Progressing")["reason"], "ShardsRunning", "kept");
    assert_eq!(condition(&status, "Failed"), Value::Null, "not failed");
    assert_eq!(event_reasons(&out.seen), [("Warning".into(), "UnknownSandbox".into())]);
    // Reconciled again while still invalid: the same status, nothing written.
    let settled = merge(current.clone(), &json!({"status": status}));
    let again = scenario(&settled, storage_down(), vec![call("GET", SANDBOX, not_found())]).await;
    assert!(again.result.is_ok(), "{:?}", again.result.err());
}
