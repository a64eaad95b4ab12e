//! The policy-server sidecar: with `policy.server`, every sandbox pod (the
//! variants' Jobs and the checkpoint evaluations) runs the server as a
//! native sidecar — an init container with `restartPolicy: Always`, so it
//! starts before the sandbox, keeps running beside it, and stops when the
//! sandbox exits without holding the Job open.
//!
//! Its startup probe asks `readinessPath` every
//! [`STARTUP_PROBE_PERIOD_SECONDS`] for as long as `startupTimeout` allows:
//! the sandbox container starts only once it answers, and a server that
//! never loads fails the pod. The kubelet probes the pod's IP, so the
//! server must listen on all addresses (`0.0.0.0`), not only loopback.

use std::collections::BTreeMap;

use basecamp_api::task::PolicyServer;
use k8s_openapi::api::core::v1::{Container, EnvVar, HTTPGetAction, Probe, ResourceRequirements, VolumeMount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::affinity::GPU_RESOURCE;
use super::security::container_security_context;

/// The sidecar's container name.
pub const POLICY_SERVER_CONTAINER: &str = "policy-server";
/// The checkpoint the server serves (`C/step-N/`; for the variants' own
/// Jobs `resumeFrom`, else the model id).
pub const CHECKPOINT_ENV: &str = "BASECAMP_CHECKPOINT";
/// The training step of that checkpoint.
pub const STEP_ENV: &str = "BASECAMP_STEP";
/// The port the server listens on.
pub const POLICY_PORT_ENV: &str = "BASECAMP_POLICY_PORT";
/// Seconds between two startup probes.
pub const STARTUP_PROBE_PERIOD_SECONDS: i32 = 5;

/// What the sidecar serves: `BASECAMP_CHECKPOINT` and `BASECAMP_STEP`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    /// The checkpoint's location (or a model id); `None`: not set.
    pub checkpoint: Option<String>,
    /// The training step; `None`: not set.
    pub step: Option<u64>,
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), value_from: None }
}

/// Probes that cover `timeout_seconds` at [`STARTUP_PROBE_PERIOD_SECONDS`] each (at least one).
pub fn startup_failure_threshold(timeout_seconds: f64) -> i32 {
    let period = f64::from(STARTUP_PROBE_PERIOD_SECONDS);
    let probes = (timeout_seconds.max(0.0) / period).ceil();
    if probes >= f64::from(i32::MAX) { i32::MAX } else { (probes as i32).max(1) }
}

/// The sidecar container for `server`, serving `served`. `tmp` is the
/// pod's writable `/tmp` volume (the root file system is read-only).
pub fn sidecar(server: &PolicyServer, served: &Served, tmp_volume: &str) -> Container {
    let mut vars = Vec::new();
    if let Some(checkpoint) = &served.checkpoint {
        vars.push(env(CHECKPOINT_ENV, checkpoint));
    }
    if let Some(step) = served.step {
        vars.push(env(STEP_ENV, &step.to_string()));
    }
    vars.push(env(POLICY_PORT_ENV, &server.port().to_string()));
    vars.push(env("HOME", "/tmp"));
    let ours: Vec<String> = vars.iter().map(|v| v.name.clone()).collect();
    // The operator's variables win: they say what is under test.
    vars.extend(server.env.iter().filter(|(name, _)| !ours.contains(name)).map(|(name, value)| env(name, value)));
    let gpus = server.gpus.unwrap_or(0);
    let resources = (gpus > 0).then(|| {
        let quantity = BTreeMap::from([(GPU_RESOURCE.to_string(), Quantity(gpus.to_string()))]);
        ResourceRequirements { requests: Some(quantity.clone()), limits: Some(quantity), ..Default::default() }
    });
    let timeout = server.startup_timeout().as_secs_f64();
    Container {
        name: POLICY_SERVER_CONTAINER.into(),
        image: Some(server.image.clone()),
        command: (!server.command.is_empty()).then(|| server.command.clone()),
        args: (!server.args.is_empty()).then(|| server.args.clone()),
        env: Some(vars),
        restart_policy: Some("Always".into()),
        startup_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some(server.readiness_path().to_string()),
                port: IntOrString::Int(i32::from(server.port())),
                ..Default::default()
            }),
            period_seconds: Some(STARTUP_PROBE_PERIOD_SECONDS),
            failure_threshold: Some(startup_failure_threshold(timeout)),
            ..Default::default()
        }),
        resources,
        security_context: Some(container_security_context()),
        volume_mounts: Some(vec![VolumeMount {
            name: tmp_volume.into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        }]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_startup_probe_covers_the_startup_timeout() {
        assert_eq!(startup_failure_threshold(600.0), 120);
        assert_eq!(startup_failure_threshold(7.0), 2, "rounded up");
        assert_eq!(startup_failure_threshold(0.0), 1);
    }

    #[test]
    fn the_sidecar_serves_the_checkpoint_and_keeps_the_users_env() {
        let server: PolicyServer = serde_json::from_value(serde_json::json!({
            "image": "vllm/vllm-openai:v0.11.0",
            "args": ["--model", "$(BASECAMP_CHECKPOINT)", "--port", "$(BASECAMP_POLICY_PORT)"],
            "port": 8001,
            "readinessPath": "/health",
            "startupTimeout": "90s",
            "gpus": 1,
            "env": {"VLLM_LOGGING_LEVEL": "DEBUG", "BASECAMP_STEP": "ignored"},
        }))
        .expect("server");
        let served = Served { checkpoint: Some("s3://ckpt/run/step-100/".into()), step: Some(100) };
        let c = serde_json::to_value(sidecar(&server, &served, "tmp")).expect("json");
        assert_eq!(c["name"], "policy-server");
        assert_eq!(c["restartPolicy"], "Always");
        assert!(c.get("command").is_none(), "the image's entrypoint");
        assert_eq!(c["startupProbe"]["httpGet"]["path"], "/health");
        assert_eq!(c["startupProbe"]["httpGet"]["port"], 8001);
        assert_eq!(c["startupProbe"]["failureThreshold"], 18);
        assert_eq!(c["startupProbe"]["periodSeconds"], 5);
        assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "1");
        let env: BTreeMap<String, String> = c["env"]
            .as_array()
            .expect("env")
            .iter()
            .map(|e| (e["name"].as_str().unwrap_or("").into(), e["value"].as_str().unwrap_or("").into()))
            .collect();
        assert_eq!(env["BASECAMP_CHECKPOINT"], "s3://ckpt/run/step-100/");
        assert_eq!(env["BASECAMP_STEP"], "100");
        assert_eq!(env["BASECAMP_POLICY_PORT"], "8001");
        assert_eq!(env["VLLM_LOGGING_LEVEL"], "DEBUG");
        assert_eq!(c["env"].as_array().expect("env").len(), 5, "no duplicate BASECAMP_STEP");
    }
}
