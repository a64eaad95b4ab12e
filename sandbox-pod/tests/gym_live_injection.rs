//! Live injection into the real binaries, through the client that
//! `basecamp sandbox inject` uses: `basecamp-sandbox run --listen` (driver
//! mode, the injection reaches the episode while its policy thinks) and
//! `basecamp-sandbox serve` (server mode, the same request).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use basecamp_sandbox::gym::client::{ClientError, SandboxClient};
use basecamp_trace::pb::{InjectionTrigger, record::Body};
use basecamp_trace::read_trace;
use serde_json::{Value, json};

const MANIFEST: &str = r#"
apiVersion: basecamp.dev/v1alpha1
kind: SandboxConfig
metadata:
  name: tools
spec:
  tools:
    track_order:
      description: Look up an order.
      parameters: {type: object, properties: {order_id: {type: string}}}
      recorded:
        fixture: fixture.jsonl
  maxSteps: 4
  planStepTimeout: 20s
---
apiVersion: basecamp.dev/v1alpha1
kind: HarnessTask
metadata:
  name: shipping
spec:
  taskDefinition:
    description: You are a support agent.
    successCriteria: ["tool_call_accuracy >= 0.5"]
  evaluation:
    metrics: [tool_call_accuracy]
    testSet: tests.jsonl
  policy:
    scripted: policy.jsonl
  sandboxRef: {name: tools}
"#;

const FIXTURE: &str = r#"{"tool": "track_order", "observation": {"status": "in_transit"}}
"#;

const TESTS: &str = r#"{"id": "ep-1", "instruction": "Where is order 1?", "expected_tool_calls": [{"name": "track_order", "arguments": {"order_id": "1"}}]}
"#;

/// The policy thinks 3 s over its first turn: time to inject while it does.
const POLICY: &str = r#"{"episode": "ep-1", "turns": [{"tool_calls": [{"name": "track_order", "arguments": {"order_id": "1"}}], "delay_ms": 3000}, {"content": "In transit."}]}
"#;

fn project(dir: &Path) {
    std::fs::write(dir.join("task.yaml"), MANIFEST).unwrap();
    std::fs::write(dir.join("fixture.jsonl"), FIXTURE).unwrap();
    std::fs::write(dir.join("tests.jsonl"), TESTS).unwrap();
    std::fs::write(dir.join("policy.jsonl"), POLICY).unwrap();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Injects, retrying while the sandbox is still starting up.
async fn inject_when_up(
    client: &SandboxClient,
    episode: &str,
    observation: Value,
    at_step: Option<u32>,
    id: &str,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.inject(episode, observation.clone(), at_step, Some(id)).await {
            Ok(answer) => return answer,
            Err(ClientError::Unreachable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn a_driver_mode_run_takes_a_live_injection_while_its_policy_thinks() {
    let dir = tempfile::tempdir().unwrap();
    project(dir.path());
    let out = dir.path().join("out");
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(["run", "--no-upload", "--config"])
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = SandboxClient::new(&format!("http://127.0.0.1:{port}"), Duration::from_secs(5)).unwrap();
    let answer = inject_when_up(&client, "ep-1", json!({"notice": "carrier strike"}), Some(2), "ops-1").await;
    assert_eq!(answer, json!({"id": "ops-1", "episode": "ep-1", "at_step": 2}));
    // Half a second into the policy's 3 s first turn: step 1 has begun, so "next step" is step 2.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answer = inject_when_up(&client, "ep-1", json!("call back"), None, "ops-2").await;
    assert_eq!(answer["at_step"], Value::Null);

    let output = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let trace = read_trace(out.join("ep-1.trace")).unwrap();
    let live: Vec<(u32, String)> = trace
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::Injection(i)) if i.trigger == InjectionTrigger::Live as i32 => Some((r.step, i.id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(live, vec![(2, "ops-1".to_string()), (2, "ops-2".to_string())], "both before the policy's second turn");
}

#[tokio::test]
async fn a_serve_mode_episode_takes_the_same_injection_request() {
    let dir = tempfile::tempdir().unwrap();
    project(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp-sandbox"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.path())
        .arg("--out")
        .arg(dir.path().join("out"))
        .env_remove("BASECAMP_SANDBOX_LISTEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let endpoint = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap_or_else(|| panic!("{line}"));
    let client = SandboxClient::new(endpoint, Duration::from_secs(5)).unwrap();
    client.post_json("/v1/episodes", &json!({"row_id": "ep-1", "episode_id": "ep-1"})).await.unwrap();
    let answer = client.inject("ep-1", json!({"notice": "carrier strike"}), Some(2), Some("ops-1")).await.unwrap();
    assert_eq!(answer["delivered_at_step"], Value::Null);
    let now = client.inject("ep-1", json!("call back"), None, Some("ops-2")).await.unwrap();
    assert_eq!(now["delivered_at_step"], 1);
    let err = client.inject("ep-2", json!(1), None, None).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Refused { status: 404, category, .. } if category == "UnknownEpisode"),
        "{err}"
    );
    let action = json!({"tool_calls": [{"name": "track_order", "arguments": {"order_id": "1"}}]});
    let stepped = client.post_json("/v1/episodes/ep-1/step", &action).await.unwrap();
    assert_eq!(stepped["info"]["injections"], json!(["ops-1"]));
    child.kill().unwrap();
    child.wait().unwrap();
}
