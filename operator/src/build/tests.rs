//! Pure build tests: a spec in, the Job, ConfigMap, NetworkPolicy and
//! affinity out — for compute capability 7.0, 7.5, 8.0, 8.6, 9.0 and none.

use basecamp_api::HarnessTask;
use basecamp_api::sandbox::SandboxConfigSpec;
use serde_json::{Value, json};

use super::*;

fn task(spec: Value) -> HarnessTask {
    serde_json::from_value(json!({
        "apiVersion": "basecamp.dev/v1alpha1",
        "kind": "HarnessTask",
        "metadata": {"name": "eval", "namespace": "team-a", "uid": "uid-1", "generation": 1},
        "spec": spec,
    }))
    .expect("task")
}

fn base_spec() -> Value {
    json!({
        "taskDefinition": {"successCriteria": ["tool_call_accuracy >= 0.9"]},
        "evaluation": {"testSet": "s3://datasets/shop/tests.jsonl"},
        "policy": {"endpoint": "http://10.0.0.7:8000/v1", "model": "m", "apiKeySecret": {"name": "policy-key"}},
        "sandboxRef": {"name": "shop"},
        "shards": 4,
        "parallelism": 2,
        "traces": {"destination": "s3://traces/basecamp"},
        "suspend": true,
        "queueName": "gpu-queue",
    })
}

fn sandbox(value: Value) -> SandboxConfigSpec {
    serde_json::from_value(value).expect("sandbox spec")
}

fn variant(name: &str, spec: SandboxConfigSpec) -> ResolvedVariant {
    ResolvedVariant { name: name.into(), sandbox_name: "shop".into(), profile: None, spec }
}

fn gpu_sandbox(min_cc: Option<&str>) -> SandboxConfigSpec {
    let mut value = json!({
        "tools": {"track_order": {"http": {"url": "https://shop.example.com/orders/{order_id}"}}},
        "runtimeClassName": "gvisor",
    });
    if let Some(cc) = min_cc {
        value["gpu"] = json!({"required": true, "minComputeCapability": cc});
    }
    sandbox(value)
}

fn built(task: &HarnessTask, variants: Vec<ResolvedVariant>, settings: &Settings) -> Desired {
    build(&BuildInput::new(task, variants, settings).expect("input")).expect("build")
}

fn to_json(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("json")
}

#[test]
fn the_job_runs_one_indexed_pod_per_shard_with_the_failure_policy() {
    let task = task(base_spec());
    let settings = Settings {
        s3_endpoint: Some("http://10.1.2.3:9000".into()),
        s3_secret: Some("s3".into()),
        ..Default::default()
    };
    let desired = built(&task, vec![variant("default", gpu_sandbox(Some("8.0")))], &settings);
    assert_eq!(desired.jobs.len(), 1);
    let job = to_json(&desired.jobs[0]);
    assert_eq!(job["metadata"]["name"], "eval-default");
    assert_eq!(job["metadata"]["namespace"], "team-a");
    assert_eq!(job["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(job["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(job["metadata"]["labels"]["basecamp.dev/task"], "eval");
    assert_eq!(job["metadata"]["labels"]["basecamp.dev/variant"], "default");
    assert_eq!(job["metadata"]["labels"]["app.kubernetes.io/managed-by"], "basecamp-operator");
    assert_eq!(job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "gpu-queue");
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    assert_eq!(spec["completions"], 4);
    assert_eq!(spec["parallelism"], 2);
    assert_eq!(spec["suspend"], true);
    assert_eq!(spec["backoffLimitPerIndex"], 2);
    assert_eq!(spec["ttlSecondsAfterFinished"], 604_800);
    let rules = spec["podFailurePolicy"]["rules"].as_array().expect("rules");
    let action_for = |code: i64| {
        rules
            .iter()
            .find(|r| r["onExitCodes"]["values"].as_array().is_some_and(|v| v.contains(&json!(code))))
            .map(|r| r["action"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(action_for(1).as_deref(), Some("FailIndex"), "a config error is not retried");
    assert_eq!(action_for(3).as_deref(), Some("Count"), "a failed upload is retried");
    assert_eq!(action_for(2).as_deref(), Some("Count"));
    assert_eq!(action_for(130).as_deref(), Some("Count"), "a shard SIGTERM cut off is not done: retried");
    assert_eq!(action_for(4).as_deref(), Some("Count"), "an S3 outage before the first episode: retried");
    assert!(rules.iter().all(|r| r["onExitCodes"].is_null() || r["onExitCodes"]["containerName"] == "sandbox"));

    let pod = &spec["template"]["spec"];
    assert_eq!(spec["template"]["metadata"]["labels"]["basecamp.dev/variant"], "default");
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["runtimeClassName"], "gvisor");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let container = &pod["containers"][0];
    assert_eq!(container["name"], "sandbox");
    assert_eq!(container["terminationMessagePolicy"], "FallbackToLogsOnError");
    assert_eq!(container["image"], "basecamp:dev");
    assert_eq!(container["command"], json!(["/usr/local/bin/basecamp-sandbox"]));
    assert_eq!(
        container["args"],
        json!([
            "run",
            "--config",
            "/etc/basecamp/manifests.yaml",
            "--task",
            "eval",
            "--variant",
            "default",
            "--shard",
            "$(JOB_COMPLETION_INDEX)/4",
            "--out",
            "/basecamp/work/traces",
            "--base-dir",
            ".",
            "--listen",
            "0.0.0.0:9464",
            "--metrics-linger",
            "45s"
        ])
    );
    // The port the chart's PodMonitor scrapes by name.
    assert_eq!(container["ports"], json!([{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]));
    let env = container["env"].as_array().expect("env");
    let var = |name: &str| env.iter().find(|e| e["name"] == name).cloned().unwrap_or(Value::Null);
    assert_eq!(
        var("JOB_COMPLETION_INDEX")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    );
    assert_eq!(var("AWS_ENDPOINT_URL_S3")["value"], "http://10.1.2.3:9000");
    assert_eq!(
        var("BASECAMP_POLICY_API_KEY")["valueFrom"]["secretKeyRef"],
        json!({"name": "policy-key", "key": "apiKey", "optional": false})
    );
    assert_eq!(container["envFrom"][0]["secretRef"]["name"], "s3");
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(container["resources"]["requests"]["nvidia.com/gpu"], "1");
    assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], "1");
    assert_eq!(pod["tolerations"][0]["key"], "nvidia.com/gpu");
    assert!(pod["initContainers"].is_null(), "no tools image: the Basecamp image runs the sandbox");
    let mounts: Vec<&str> =
        container["volumeMounts"].as_array().expect("mounts").iter().filter_map(|m| m["mountPath"].as_str()).collect();
    assert_eq!(mounts, ["/etc/basecamp", "/basecamp/work", "/tmp"]);
    // The tools image's own WORKDIR, where its tools and services are: no
    // workingDir, and nothing mounted over a place an image keeps files.
    assert!(container["workingDir"].is_null(), "{}", container["workingDir"]);
    assert_eq!(pod["volumes"][0]["configMap"]["name"], "eval-sandbox");
}

fn affinity_terms(job: &Job) -> Value {
    to_json(job)["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .clone()
}

#[test]
fn affinity_for_compute_capability_7_0_7_5_8_0_8_6_9_0_and_none() {
    let term = |pairs: &[(&str, &str, &str)]| -> Value {
        json!({"matchExpressions": pairs.iter().map(|(k, op, v)| json!({"key": k, "operator": op, "values": [v]})).collect::<Vec<_>>()})
    };
    let (major, minor) = ("nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor");
    let cases = [
        ("7.0", json!([term(&[(major, "Gt", "7")]), term(&[(major, "In", "7")])])),
        ("7.5", json!([term(&[(major, "Gt", "7")]), term(&[(major, "In", "7"), (minor, "Gt", "4")])])),
        ("8.0", json!([term(&[(major, "Gt", "8")]), term(&[(major, "In", "8")])])),
        ("8.6", json!([term(&[(major, "Gt", "8")]), term(&[(major, "In", "8"), (minor, "Gt", "5")])])),
        ("9.0", json!([term(&[(major, "Gt", "9")]), term(&[(major, "In", "9")])])),
    ];
    let task = task(base_spec());
    let settings = Settings::default();
    for (cc, expected) in cases {
        let desired = built(&task, vec![variant("default", gpu_sandbox(Some(cc)))], &settings);
        assert_eq!(affinity_terms(&desired.jobs[0]), expected, "minComputeCapability {cc}");
        let pod = &to_json(&desired.jobs[0])["spec"]["template"]["spec"];
        assert_eq!(pod["tolerations"][0]["effect"], "NoSchedule", "{cc}");
    }
    let desired = built(&task, vec![variant("default", gpu_sandbox(None))], &settings);
    let pod = &to_json(&desired.jobs[0])["spec"]["template"]["spec"];
    assert!(pod["affinity"].is_null(), "no GPU requirement: no affinity");
    assert!(pod["tolerations"].is_null());
    assert!(pod["containers"][0]["resources"].is_null(), "no GPU requested");
}

#[test]
fn a_tools_image_gets_the_sandbox_binary_from_an_init_container() {
    let task = task(base_spec());
    let mut spec = gpu_sandbox(None);
    spec.image = Some("registry.example.com/shop-tools:1.2".into());
    let desired = built(&task, vec![variant("default", spec)], &Settings::default());
    let pod = &to_json(&desired.jobs[0])["spec"]["template"]["spec"];
    let init = &pod["initContainers"][0];
    assert_eq!(init["name"], "inject-sandbox");
    assert_eq!(init["image"], "basecamp:dev");
    assert_eq!(init["command"], json!(["/usr/local/bin/basecamp-operator"]));
    assert_eq!(
        init["args"],
        json!([
            "inject-sandbox",
            "--from",
            "/usr/local/bin/basecamp-sandbox",
            "--to",
            "/basecamp/bin/basecamp-sandbox"
        ])
    );
    assert_eq!(init["securityContext"]["readOnlyRootFilesystem"], true);
    let sandbox = &pod["containers"][0];
    assert_eq!(sandbox["image"], "registry.example.com/shop-tools:1.2");
    assert_eq!(sandbox["command"], json!(["/basecamp/bin/basecamp-sandbox"]));
    assert!(
        pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["name"] == "basecamp-bin" && v["emptyDir"].is_object())
    );
}

/// The pods run the operator's image by default: from a private registry
/// they need its pull secrets (pod-wide) and policy (containers of that
/// image only: a tools image keeps Kubernetes' default).
#[test]
fn the_pods_get_the_image_pull_secrets_and_the_basecamp_images_pull_policy() {
    let task = task(base_spec());
    let settings = Settings {
        image_pull_secrets: vec!["regcred".into(), "mirror".into()],
        image_pull_policy: Some("Always".into()),
        ..Default::default()
    };
    let desired = built(&task, vec![variant("default", gpu_sandbox(None))], &settings);
    let pod = &to_json(&desired.jobs[0])["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}, {"name": "mirror"}]));
    assert_eq!(pod["containers"][0]["imagePullPolicy"], "Always", "the sandbox runs the Basecamp image");

    let mut tools = gpu_sandbox(None);
    tools.image = Some("registry.example.com/shop-tools:1.2".into());
    let desired = built(&task, vec![variant("default", tools)], &settings);
    let pod = &to_json(&desired.jobs[0])["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}, {"name": "mirror"}]));
    assert_eq!(pod["initContainers"][0]["imagePullPolicy"], "Always", "inject-sandbox pulls the Basecamp image");
    assert!(pod["containers"][0].get("imagePullPolicy").is_none(), "the tools image keeps its default");

    // None set: the pods are built as before (and keep their template hash).
    let desired = built(&task, vec![variant("default", gpu_sandbox(None))], &Settings::default());
    let pod = &to_json(&desired.jobs[0])["spec"]["template"]["spec"];
    assert!(pod.get("imagePullSecrets").is_none() && pod["containers"][0].get("imagePullPolicy").is_none());
}

#[test]
fn the_template_hash_changes_with_the_pod_but_not_with_parallelism_or_suspend() {
    let settings = Settings::default();
    let hash = |spec: Value, sandbox: SandboxConfigSpec| {
        let desired = built(&task(spec), vec![variant("default", sandbox)], &settings);
        desired.jobs[0]
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::TEMPLATE_HASH_ANNOTATION))
            .cloned()
            .expect("hash")
    };
    let base = hash(base_spec(), gpu_sandbox(Some("8.0")));
    let mut resumed = base_spec();
    resumed["suspend"] = json!(false);
    resumed["parallelism"] = json!(4);
    assert_eq!(hash(resumed, gpu_sandbox(Some("8.0"))), base);
    assert_ne!(hash(base_spec(), gpu_sandbox(Some("8.6"))), base);
    let mut more_shards = base_spec();
    more_shards["shards"] = json!(8);
    assert_ne!(hash(more_shards, gpu_sandbox(Some("8.0"))), base);
}

#[test]
fn an_edit_only_the_config_map_carries_changes_the_template_hash_when_the_pods_read_it() {
    let settings = Settings::default();
    let hash = |spec: Value, sandbox: SandboxConfigSpec| {
        let desired = built(&task(spec), vec![variant("default", sandbox)], &settings);
        desired.jobs[0].metadata.annotations.as_ref().and_then(|a| a.get(names::TEMPLATE_HASH_ANNOTATION)).cloned()
    };
    let base = hash(base_spec(), gpu_sandbox(None));
    // Before: none of these reached the Job, so a finished Job stood for a
    // spec it did not run, and a running one mixed the two.
    let mut tool_moved = gpu_sandbox(None);
    tool_moved.tools.get_mut("track_order").expect("tool").http.as_mut().expect("http").url =
        "https://shop-v2.example.com/orders/{order_id}".into();
    assert_ne!(hash(base_spec(), tool_moved), base, "a tool's URL");
    for (field, value) in [
        ("/policy/model", json!("m2")),
        ("/evaluation/testSet", json!("s3://datasets/shop/tests-v2.jsonl")),
        ("/taskDefinition/description", json!("You are a shop assistant.")),
        ("/traces/destination", json!("s3://traces/other")),
    ] {
        let mut edited = base_spec();
        set(&mut edited, field, value);
        assert_ne!(hash(edited, gpu_sandbox(None)), base, "{field}");
    }
    // What the pods do not read replaces nothing.
    for (field, value) in [
        ("/taskDefinition/successCriteria", json!(["tool_call_accuracy >= 0.5"])),
        ("/traces/retention", json!("Delete")),
        ("/queueName", json!("other-queue")),
    ] {
        let mut edited = base_spec();
        set(&mut edited, field, value);
        assert_eq!(hash(edited, gpu_sandbox(None)), base, "{field}");
    }
}

/// Sets the field at the JSON pointer `path`, creating its last segment.
fn set(value: &mut Value, path: &str, new: Value) {
    let (parent, last) = path.rsplit_once('/').expect("a pointer");
    value.pointer_mut(parent).expect("the parent exists")[last] = new;
}

#[test]
fn the_manifests_in_the_config_map_load_and_validate_as_the_pod_reads_them() {
    let mut spec = base_spec();
    spec.as_object_mut().expect("object").remove("sandboxRef");
    spec["variants"] = json!([
        {"name": "baseline", "sandboxRef": {"name": "shop", "profile": "dev"}},
        {"name": "candidate", "sandboxRef": {"name": "shop", "profile": "prod"}},
    ]);
    let task = task(spec);
    let resolved = |profile: &str, steps: u32| ResolvedVariant {
        name: if profile == "dev" { "baseline".into() } else { "candidate".into() },
        sandbox_name: "shop".into(),
        profile: Some(profile.into()),
        spec: sandbox(
            json!({"maxSteps": steps, "tools": {"track_order": {"http": {"url": "https://shop.example.com/o"}}}}),
        ),
    };
    let desired = built(&task, vec![resolved("dev", 5), resolved("prod", 30)], &Settings::default());
    let data = desired.config_map.data.clone().expect("data");
    assert_eq!(data.keys().collect::<Vec<_>>(), ["manifests.yaml", "sandbox-baseline.yaml", "sandbox-candidate.yaml"]);
    assert!(data["sandbox-candidate.yaml"].contains("maxSteps: 30"), "{}", data["sandbox-candidate.yaml"]);
    let (manifests, load) = basecamp_api::Manifests::parse("/etc/basecamp/manifests.yaml", &data["manifests.yaml"]);
    assert!(!load.has_errors(), "{:?}", load.problems());
    assert_eq!(manifests.tasks.len(), 1);
    let names: Vec<&str> = manifests.sandboxes.iter().filter_map(|s| s.object.metadata.name.as_deref()).collect();
    assert_eq!(names, ["shop.dev", "shop.prod"]);
    let pod_task = &manifests.tasks[0].object;
    assert_eq!(pod_task.metadata.namespace.as_deref(), Some("team-a"));
    assert_eq!(
        pod_task.spec.variants[1].sandbox_ref,
        basecamp_api::task::SandboxRef { name: "shop.prod".into(), profile: None }
    );
    let report = manifests.validate();
    assert!(!report.has_errors(), "{:?}", report.problems());
    assert_eq!(desired.jobs.len(), 2);
    assert_eq!(desired.jobs[1].metadata.name.as_deref(), Some("eval-candidate"));
    assert_eq!(desired.config_map.metadata.owner_references.as_ref().map(Vec::len), Some(1));
}

/// The region travels as the endpoint does: the operator's (`AWS_REGION`)
/// to every sandbox pod; none set, none passed (the pod's own chain).
#[test]
fn the_s3_region_reaches_the_sandbox_pods() {
    let task = task(base_spec());
    let env_of = |settings: &Settings| {
        let desired = built(&task, vec![variant("default", gpu_sandbox(None))], settings);
        let job = to_json(&desired.jobs[0]);
        job["spec"]["template"]["spec"]["containers"][0]["env"].as_array().expect("env").clone()
    };
    let region = |env: &[Value]| env.iter().find(|e| e["name"] == "AWS_REGION").map(|e| e["value"].clone());
    let settings = Settings {
        s3_endpoint: Some("http://minio.storage:9000".into()),
        s3_region: Some("eu-central-1".into()),
        ..Default::default()
    };
    assert_eq!(region(&env_of(&settings)), Some(json!("eu-central-1")));
    assert_eq!(region(&env_of(&Settings::default())), None);
}

#[test]
fn the_network_policy_allows_dns_policy_tools_and_s3_only() {
    let task = task(base_spec());
    let settings = Settings { s3_endpoint: Some("http://minio.storage:9000".into()), ..Default::default() };
    let desired = built(&task, vec![variant("default", gpu_sandbox(None))], &settings);
    let policy = to_json(&desired.network_policy);
    assert_eq!(policy["metadata"]["name"], "eval-sandbox");
    assert_eq!(policy["spec"]["podSelector"]["matchLabels"], json!({"basecamp.dev/task": "eval"}));
    assert_eq!(
        policy["spec"]["podSelector"]["matchExpressions"],
        json!([{"key": "basecamp.dev/role", "operator": "NotIn", "values": ["trainer"]}]),
        "the trainer pod is not a sandbox"
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]), "Ingress listed: nothing may connect");
    assert!(policy["spec"].get("ingress").is_none(), "no --sandbox-metrics-from: no ingress at all");
    let egress = policy["spec"]["egress"].as_array().expect("egress");
    assert_eq!(egress[0]["ports"][0], json!({"port": 53, "protocol": "UDP"}));
    assert_eq!(egress[0]["to"][0]["podSelector"]["matchLabels"]["k8s-app"], "kube-dns");
    // The policy endpoint is an IP literal: that address and port only.
    assert!(egress.iter().any(|r| r["to"][0]["ipBlock"]["cidr"] == "10.0.0.7/32" && r["ports"][0]["port"] == 8000));
    // Host names (the tool on 443, MinIO on 9000) open their ports.
    let ports: Vec<i64> =
        egress.iter().filter(|r| r["to"].is_null()).filter_map(|r| r["ports"][0]["port"].as_i64()).collect();
    assert_eq!(ports, [443, 9000]);
    assert_eq!(egress.len(), 4);
}

#[test]
fn a_host_name_that_is_a_found_service_allows_its_pods_on_the_target_port_only() {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use network_policy::{ServiceRef, ServiceTarget, service_ref};

    let mut spec = base_spec();
    spec["policy"]["endpoint"] = json!("http://vllm.models.svc.cluster.local:8000/v1");
    let task = task(spec);
    // MinIO (port 9000) is a Service in the task's own namespace, named by its short name.
    let settings = Settings { s3_endpoint: Some("http://minio:9000".into()), ..Default::default() };
    let sandbox = sandbox(json!({"tools": {
        "track_order": {"http": {"url": "http://shop.team-a:8080/orders/{order_id}"}},
        "refund": {"http": {"url": "https://payments.example.com/refund"}},
    }}));
    let vllm = ServiceRef { namespace: "models".into(), name: "vllm".into() };
    let minio = ServiceRef { namespace: "team-a".into(), name: "minio".into() };
    let shop = ServiceRef { namespace: "team-a".into(), name: "shop".into() };
    assert_eq!(service_ref("vllm.models.svc.cluster.local", "team-a"), Some(vllm.clone()));
    assert_eq!(service_ref("minio", "team-a"), Some(minio.clone()));
    assert_eq!(service_ref("shop.team-a", "x"), Some(shop.clone()));
    assert_eq!(service_ref("payments.example.com", "team-a"), None, "not a cluster DNS name");
    assert_eq!(service_ref("10.0.0.7", "team-a"), None);
    assert_eq!(service_ref("Bad_Name.team-a", "team-a"), None);
    assert_eq!(service_ref("7up", "team-a"), None, "a Service name starts with a letter");

    let target = |selector: &[(&str, &str)], ports: Vec<(i32, IntOrString)>| ServiceTarget {
        selector: selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ports,
    };
    let egress_with = |services: Vec<(ServiceRef, ServiceTarget)>| {
        let mut input = BuildInput::new(&task, vec![variant("default", sandbox.clone())], &settings).expect("input");
        input.services = services.into_iter().collect();
        to_json(&network_policy::network_policy(&input))["spec"]["egress"].as_array().expect("egress").clone()
    };
    let open_ports = |egress: &[Value]| -> Vec<i64> {
        egress.iter().filter(|r| r["to"].is_null()).filter_map(|r| r["ports"][0]["port"].as_i64()).collect()
    };

    // No Service found (none exist, or the operator may not read them): every host name opens its port.
    let unresolved = egress_with(vec![]);
    assert_eq!(open_ports(&unresolved), [443, 8000, 8080, 9000]);

    let resolved = egress_with(vec![
        // Service port 8000 forwards to container port 8080: the rule names 8080, checked after translation.
        (vllm.clone(), target(&[("app", "vllm")], vec![(8000, IntOrString::Int(8080))])),
        // A named target port stays a name.
        (minio.clone(), target(&[("app", "minio")], vec![(9000, IntOrString::String("s3".into()))])),
        // A Service without a selector (Endpoints by hand) says nothing about pods.
        (shop.clone(), target(&[], vec![(8080, IntOrString::Int(8080))])),
    ]);
    let to_pods = |namespace: &str, app: &str, port: Value| {
        json!({
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "podSelector": {"matchLabels": {"app": app}}}],
            "ports": [{"port": port, "protocol": "TCP"}],
        })
    };
    assert!(resolved.contains(&to_pods("models", "vllm", json!(8080))), "{resolved:#?}");
    assert!(resolved.contains(&to_pods("team-a", "minio", json!("s3"))), "{resolved:#?}");
    assert_eq!(open_ports(&resolved), [443, 8080], "the external host and the selector-less Service stay open");

    // The URL's port is not one of the Service's: nothing narrower can be said.
    let wrong_port = egress_with(vec![(vllm, target(&[("app", "vllm")], vec![(80, IntOrString::Int(8080))]))]);
    assert_eq!(open_ports(&wrong_port), [443, 8000, 8080, 9000]);
}

#[test]
fn the_network_policy_admits_the_metrics_peers_to_port_9464_only() {
    let task = task(base_spec());
    let peers: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer> = serde_json::from_value(json!([
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
        {"ipBlock": {"cidr": "10.20.0.0/16"}},
    ]))
    .expect("peers");
    let policy_with = |peers: Vec<_>| {
        let settings = Settings { sandbox_metrics_from: peers, ..Default::default() };
        to_json(&built(&task, vec![variant("default", gpu_sandbox(None))], &settings).network_policy)
    };
    let without = policy_with(vec![]);
    let with = policy_with(peers.clone());
    assert_eq!(with["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        with["spec"]["ingress"],
        json!([{"from": to_json(&peers), "ports": [{"port": 9464, "protocol": "TCP"}]}]),
        "one rule: the metrics port, from exactly the configured peers"
    );
    assert_eq!(basecamp_api::task::SANDBOX_METRICS_PORT, 9464);
    assert_eq!(with["spec"]["egress"], without["spec"]["egress"], "egress does not change");
    assert_eq!(with["spec"]["podSelector"], without["spec"]["podSelector"], "the same pods, the trainer left out");
}

#[test]
fn a_task_without_uid_cannot_own_objects() {
    let mut task = task(base_spec());
    task.metadata.uid = None;
    let settings = Settings::default();
    let err = BuildInput::new(&task, vec![], &settings).expect_err("no uid");
    assert_eq!(err.category(), "MissingMetadata");
    assert!(err.to_string().contains("metadata.uid"));
}

#[test]
fn sandbox_pods_wait_for_a_final_scrape_as_long_as_the_operator_is_told() {
    let task = task(base_spec());
    let args_with = |linger: std::time::Duration| {
        let settings = Settings { sandbox_metrics_linger: linger, ..Default::default() };
        let desired = built(&task, vec![variant("default", gpu_sandbox(None))], &settings);
        let job = to_json(&desired.jobs[0]);
        let pod = job["spec"]["template"]["spec"].clone();
        assert!(
            pod.get("terminationGracePeriodSeconds").is_none(),
            "SIGTERM ends the wait at once: the default grace period does not cut it short"
        );
        let args: Vec<String> = pod["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        let at = args.iter().position(|a| a == "--metrics-linger").expect("--metrics-linger");
        args[at + 1].clone()
    };
    assert_eq!(args_with(crate::settings::DEFAULT_SANDBOX_METRICS_LINGER), "45s", "a 30 s interval plus margin");
    assert_eq!(args_with(std::time::Duration::from_secs(30)), "30s");
    assert_eq!(args_with(std::time::Duration::from_secs(90)), "90s");
    assert_eq!(args_with(std::time::Duration::ZERO), "0ms", "no PodMonitor: no wait");
}
