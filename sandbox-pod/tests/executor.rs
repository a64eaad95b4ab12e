//! The executor against real tools: subprocesses (python3, sh) and a real
//! HTTP server on 127.0.0.1.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use basecamp_sandbox::executor::{CallOutcome, Fallback, MemoryGuard, NullWrites, ToolCall, ToolDef, ToolExecutor};
use basecamp_sandbox::tools::exec::ExecTool;
use basecamp_sandbox::tools::http::{HttpTool, RateLimit};
use basecamp_sandbox::tools::{Tool, ToolError};
use basecamp_trace::pb::{MemorySource, StepStatus};
use basecamp_trace::{Memory, MemoryPatch, hash_json};
use serde_json::{Value, json};

fn exec(script: &str) -> Tool {
    Tool::Exec(ExecTool::new(vec!["python3".into(), "-c".into(), script.into()]))
}

fn def(tool: Tool, timeout_ms: u64) -> ToolDef {
    ToolDef { tool, timeout: Duration::from_millis(timeout_ms), fallback: None, memory_map: Vec::new() }
}

/// Serves `app` on a free loopback port for the rest of the test.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn call(ex: &ToolExecutor, name: &str, args: &Value, memory: &mut Memory) -> CallOutcome {
    ex.call(ToolCall { step: 1, call_id: "c1", plan_label: "lookup", name, arguments: Ok(args) }, memory).await
}

#[tokio::test]
async fn exec_tool_answers_and_patches_memory_with_a_full_record() {
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool(
        "tracking",
        def(
            exec(
                "import json,sys; a=json.load(sys.stdin); \
                 print(json.dumps({'observation': {'order': a['order_id'], 'status': 'in_transit'}, \
                 'memory': {'shipping_status': 'in_transit'}}))",
            ),
            5000,
        ),
    );
    let mut memory = Memory::new();
    let before = memory.hash();
    let args = json!({"order_id": "A-7", "verbose": true});
    let out = call(&ex, "tracking", &args, &mut memory).await;
    assert_eq!(out.status, StepStatus::Ok, "{:?}", out.error);
    assert_eq!(out.observation, json!({"order": "A-7", "status": "in_transit"}));
    assert_eq!(memory.get("shipping_status"), Some(&json!("in_transit")));
    assert_eq!(out.deltas.len(), 1);
    assert_eq!(out.deltas[0].source, MemorySource::Tool);
    let step = &out.plan_step;
    assert_eq!(step.input_hash, hash_json(&json!({"verbose": true, "order_id": "A-7"})).0.to_vec());
    assert_eq!(step.memory_hash_before, before.0.to_vec());
    assert_eq!(step.memory_hash_after, memory.hash().0.to_vec());
    assert_ne!(step.memory_hash_before, step.memory_hash_after);
    assert_eq!(step.result_hash, hash_json(&out.observation).0.to_vec());
    assert!(step.response_bytes > 0);
    assert!(step.latency_micros > 0);
    assert_eq!(step.plan_label, "lookup");
    assert_eq!(step.timeout_ms, 5000);
    assert_eq!(out.records().count(), 2);
}

fn alive(pid: i32) -> bool {
    // Signal 0 checks existence; a zombie is reaped by its parent (init) promptly.
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[tokio::test]
async fn a_hanging_tool_times_out_its_whole_process_group_dies_and_the_fallback_answers() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    // The tool starts a grandchild and then hangs: both must be killed.
    let script = format!("sleep 1000 & echo $$ $! > {}; wait", pids.display());
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool(
        "tracking_api",
        ToolDef {
            tool: Tool::Exec(ExecTool::new(vec!["sh".into(), "-c".into(), script])),
            timeout: Duration::from_millis(300),
            fallback: Some(Fallback {
                observation: json!({"status": "unknown"}),
                memory_patch: MemoryPatch::default().set("shipping_status", Value::Null),
            }),
            memory_map: Vec::new(),
        },
    );
    let mut memory = Memory::new();
    let out = call(&ex, "tracking_api", &json!({"order_id": "A-1"}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Fallback);
    assert!(out.timed_out());
    assert_eq!(out.plan_step.error_type, "timeout");
    assert!(out.plan_step.fallback_used);
    assert_eq!(out.observation, json!({"status": "unknown"}));
    assert_eq!(out.deltas[0].source, MemorySource::Fallback);
    assert!(out.deltas[0].writes_null());
    assert_eq!(out.warnings, vec!["the fallback of tracking_api wrote null into memory key(s) shipping_status"]);

    let text = std::fs::read_to_string(&pids).unwrap();
    let ids: Vec<i32> = text.split_whitespace().map(|p| p.parse().unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while ids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for pid in ids {
        assert!(!alive(pid), "process {pid} of the timed-out tool is still running");
    }
}

fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

async fn wait_until_gone(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    !alive(pid)
}

#[tokio::test]
async fn a_tool_that_exits_answers_even_when_processes_it_started_hold_its_pipes() {
    let dir = tempfile::tempdir().unwrap();
    let (in_group, escaped) = (dir.path().join("in_group"), dir.path().join("escaped"));
    let sh = |script: String| Tool::Exec(ExecTool::new(vec!["sh".into(), "-c".into(), script]));
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    // `helper &` inherits stdout and stderr: the answer used to wait for it until the timeout.
    let script = format!("sleep 1000 & echo $! > {}; echo '{{\"status\": \"shipped\"}}'", in_group.display());
    ex.add_tool("background", def(sh(script), 5000));
    // A helper in a session of its own outlives the group kill and still holds the pipes.
    let script = format!("setsid sleep 1000 & echo $! > {}; echo '{{\"status\": \"late\"}}'", escaped.display());
    ex.add_tool("escaped", def(sh(script), 5000));
    // An oversized answer while a helper holds stderr used to wait for the timeout too.
    let mut huge = ExecTool::new(vec!["sh".into(), "-c".into(), "sleep 1000 & head -c 10000000 /dev/zero".into()]);
    huge.max_response_bytes = 1 << 20;
    ex.add_tool("huge", def(Tool::Exec(huge), 5000));
    let mut memory = Memory::new();

    let out = call(&ex, "background", &json!({}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Ok, "{:?}", out.error);
    assert_eq!(out.observation, json!({"status": "shipped"}));
    assert!(out.plan_step.latency_micros < 2_000_000, "waited for the helper: {} us", out.plan_step.latency_micros);
    assert!(wait_until_gone(read_pid(&in_group)).await, "the helper outlived the call");

    let out = call(&ex, "escaped", &json!({}), &mut memory).await;
    let escaped_pid = read_pid(&escaped);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(escaped_pid), nix::sys::signal::Signal::SIGKILL);
    assert_eq!(out.status, StepStatus::Ok, "{:?}", out.error);
    assert_eq!(out.observation, json!({"status": "late"}));
    assert!(out.plan_step.latency_micros < 2_000_000, "waited for the helper: {} us", out.plan_step.latency_micros);

    let out = call(&ex, "huge", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "response_too_large", "{}", out.plan_step.error_message);
    assert!(out.plan_step.latency_micros < 2_000_000, "waited for the helper: {} us", out.plan_step.latency_micros);
}

/// On Linux the process spawned is the tool's keeper (group_keeper), which
/// ends as the tool did and stays when the tool signals its own group.
#[tokio::test]
async fn a_tool_ended_by_a_signal_is_reported_with_it_and_may_signal_its_own_group() {
    let sh = |script: &str| Tool::Exec(ExecTool::new(vec!["sh".into(), "-c".into(), script.into()]));
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("killed", def(sh("kill -TERM $$"), 5000));
    ex.add_tool("kills_its_group", def(sh("trap '' TERM; kill -TERM 0; echo '{\"status\": \"ok\"}'"), 5000));
    let mut memory = Memory::new();

    let out = call(&ex, "killed", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "exit_status");
    assert!(out.plan_step.error_message.contains("signal: 15"), "{}", out.plan_step.error_message);

    let out = call(&ex, "kills_its_group", &json!({}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Ok, "{:?}", out.error);
    assert_eq!(out.observation, json!({"status": "ok"}));
}

#[tokio::test]
async fn broken_tools_are_explained_not_fatal() {
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("non_json", def(exec("print('hello, not json')"), 5000));
    ex.add_tool("fails", def(exec("import sys; sys.stderr.write('db down'); sys.exit(3)"), 5000));
    ex.add_tool(
        "fails_with_answer",
        def(exec("import json,sys; print(json.dumps({'error': 'order A-9 not found'})); sys.exit(2)"), 5000),
    );
    let mut big = ExecTool::new(vec!["python3".into(), "-c".into(), "print('x' * (10 << 20))".into()]);
    big.max_response_bytes = 1 << 20;
    ex.add_tool("huge", def(Tool::Exec(big), 10_000));
    ex.add_tool("missing_binary", def(Tool::Exec(ExecTool::new(vec!["/nonexistent/tool".into()])), 5000));
    let mut memory = Memory::new();

    let out = call(&ex, "non_json", &json!({}), &mut memory).await;
    assert_eq!((out.status, out.plan_step.error_type.as_str()), (StepStatus::Error, "invalid_json"));
    assert!(out.plan_step.error_message.contains("hello, not json"), "{}", out.plan_step.error_message);

    let out = call(&ex, "fails", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "exit_status");
    assert!(out.plan_step.error_message.contains("exit status: 3"), "{}", out.plan_step.error_message);
    assert!(out.plan_step.error_message.contains("db down"), "{}", out.plan_step.error_message);

    // Printed as its answer, the reason used to be dropped: "exited with exit status: 2".
    let out = call(&ex, "fails_with_answer", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "exit_status");
    assert_eq!(
        out.plan_step.error_message,
        r#"tool fails_with_answer exited with exit status: 2; stdout: {"error": "order A-9 not found"}"#
    );

    let out = call(&ex, "huge", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "response_too_large");

    let out = call(&ex, "missing_binary", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "spawn");
    assert!(out.plan_step.error_message.contains("/nonexistent/tool"));
    assert!(memory.is_empty(), "failed calls without fallbacks change nothing");
}

#[tokio::test]
async fn a_failing_tool_s_error_quotes_the_end_of_its_stderr() {
    // Warnings first, the reason last: only the start of stderr used to be quoted.
    let script = "import sys\nfor i in range(300): print(f'warning: deprecated option {i}', file=sys.stderr)\n\
                  sys.exit(\"KeyError: 'order_id' (héllo)\")";
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("refund", def(exec(script), 5000));
    let out = call(&ex, "refund", &json!({}), &mut Memory::new()).await;
    let message = &out.plan_step.error_message;
    assert_eq!(out.plan_step.error_type, "exit_status");
    assert!(message.starts_with("tool refund exited with exit status: 1; stderr: …"), "{message}");
    assert!(message.ends_with("warning: deprecated option 299\nKeyError: 'order_id' (héllo)"), "{message}");
    assert!(!message.contains("option 0\n"), "{message}");
    assert!(message.len() < 2200, "{} bytes", message.len());
}

#[tokio::test]
async fn unknown_tools_and_invalid_arguments_are_refused() {
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("a", def(exec("print(1)"), 1000));
    ex.add_tool("b", def(exec("print(1)"), 1000));
    let mut memory = Memory::new();
    let out = call(&ex, "refund_everything", &json!({}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Refused);
    assert_eq!(out.plan_step.error_type, "unknown_tool");
    assert_eq!(out.observation["error"], json!("unknown tool \"refund_everything\"; this sandbox defines: a, b"));

    let out = ex
        .call(ToolCall { step: 2, call_id: "c", plan_label: "", name: "a", arguments: Err("{\"x\": ") }, &mut memory)
        .await;
    assert_eq!((out.status, out.plan_step.error_type.as_str()), (StepStatus::Refused, "invalid_arguments"));
    assert_eq!(out.plan_step.arguments_json, "{\"x\": ");
}

#[tokio::test]
async fn an_unknown_tool_lists_the_first_twenty_names_and_counts_the_rest() {
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    for i in 0..25 {
        ex.add_tool(format!("t{i:02}"), def(exec("print(1)"), 1000));
    }
    let mut memory = Memory::new();
    let out = call(&ex.for_episode(), "nope", &json!({}), &mut memory).await;
    let first: Vec<String> = (0..20).map(|i| format!("t{i:02}")).collect();
    let want = format!("unknown tool \"nope\"; this sandbox defines: {} and 5 more", first.join(", "));
    assert_eq!(out.observation["error"], json!(want));
}

#[tokio::test]
async fn arguments_that_are_json_but_not_an_object_are_refused_as_such_not_as_invalid_json() {
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("a", def(exec("print(1)"), 1000));
    let mut memory = Memory::new();
    let refuse = async |raw: &'static str, memory: &mut Memory| {
        let out =
            ex.call(ToolCall { step: 1, call_id: "c", plan_label: "", name: "a", arguments: Err(raw) }, memory).await;
        assert_eq!((out.status, out.plan_step.error_type.as_str()), (StepStatus::Refused, "invalid_arguments"));
        out.plan_step.error_message
    };
    // Before, each said "the arguments for a are not valid JSON: …".
    assert_eq!(refuse("[1]", &mut memory).await, "the arguments for a must be a JSON object, got an array: [1]");
    assert_eq!(refuse("\"x\"", &mut memory).await, "the arguments for a must be a JSON object, got a string: \"x\"");
    assert_eq!(refuse("3", &mut memory).await, "the arguments for a must be a JSON object, got a number: 3");
    assert_eq!(refuse("{\"x\": ", &mut memory).await, "the arguments for a are not valid JSON: {\"x\": ");

    // Recorded as `trace validate` checks a plan step: the canonical JSON and its hash (before:
    // the raw text hashed as a string, so every trace with such a call failed validation).
    let out = ex
        .call(ToolCall { step: 1, call_id: "c", plan_label: "", name: "a", arguments: Err("[1, 2]") }, &mut memory)
        .await;
    assert_eq!(out.plan_step.arguments_json, "[1,2]");
    assert_eq!(out.plan_step.input_hash, basecamp_trace::hash_json(&json!([1, 2])).0.to_vec());
}

#[tokio::test]
async fn null_writes_can_be_refused_and_types_enforced() {
    let null_patch = exec("import json; print(json.dumps({'observation': 1, 'memory': {'status': None, 'n': 'x'}}))");
    let mut ex = ToolExecutor::new(NullWrites::Error);
    ex.add_tool("t", def(null_patch, 5000));
    ex.require_memory_type("n", "integer");
    let mut memory = Memory::new();
    let out = call(&ex, "t", &json!({}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Refused);
    assert_eq!(out.plan_step.error_type, "null_write_refused");
    assert!(memory.is_empty(), "neither the null nor the mistyped value was written: {:?}", memory.to_value());
    // The plan step keeps what was refused (no delta does): replay writes it again.
    let refused: Vec<(&str, &str)> =
        out.plan_step.refused_memory_json.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(refused, [("n", "\"x\""), ("status", "null")]);
    assert!(out.deltas.is_empty());
}

#[tokio::test]
async fn an_integral_float_is_an_integer_and_a_fraction_is_not() {
    // Python's json.dumps writes 2.0 for a float; JSON Schema counts it as an integer.
    let patch = |n: &str| exec(&format!("print('{{\"observation\": 1, \"memory\": {{\"n\": {n}}}}}')"));
    let mut ex = ToolExecutor::new(NullWrites::Error);
    ex.add_tool("whole", def(patch("2.0"), 5000));
    ex.add_tool("fraction", def(patch("2.5"), 5000));
    ex.add_tool("huge", def(patch("1e300"), 5000));
    ex.require_memory_type("n", "integer");
    let mut memory = Memory::new();
    // Before: refused, "must hold integer, the patch from whole wrote a number".
    let out = call(&ex, "whole", &json!({}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Ok, "{:?}", out.error);
    let n = memory.to_value()["n"].clone();
    assert!(n.is_i64() && n == json!(2), "kept as the integer 2: {n}");
    for tool in ["fraction", "huge"] {
        let out = call(&ex, tool, &json!({}), &mut memory).await;
        assert_eq!(out.status, StepStatus::Refused, "{tool}");
        assert_eq!(out.plan_step.error_type, "memory_type", "{tool}");
    }
    assert_eq!(memory.to_value()["n"], json!(2), "the refused writes changed nothing");
}

#[tokio::test]
async fn a_patch_writing_the_empty_key_is_refused_and_its_other_writes_go_in() {
    let patch = exec("import json; print(json.dumps({'observation': 1, 'memory': {'': 'x', 'eta': 'friday'}}))");
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("t", def(patch, 5000));
    let mut memory = Memory::new();
    // Before: ok, and memory held a key named "".
    let out = call(&ex, "t", &json!({}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Refused);
    assert_eq!(out.plan_step.error_type, "memory_key");
    let message = out.error.as_ref().unwrap().to_string();
    assert!(message.contains("empty memory key \"\" (the patch from t)"), "{message}");
    assert_eq!(memory.to_value(), json!({"eta": "friday"}));
    assert_eq!(out.plan_step.refused_memory_json, [(String::new(), "\"x\"".to_string())].into());
}

#[tokio::test]
async fn the_guard_catches_changes_no_patch_explains() {
    let mut memory = Memory::from_object(json!({"a": 1}).as_object().unwrap());
    let mut guard = MemoryGuard::new(&mut memory);
    let known = memory.clone();
    assert!(guard.check(&mut memory, None).is_ok());
    memory.apply(&MemoryPatch::default().set("a", json!(2)), MemorySource::Policy, "sneaky");
    let err = guard.check(&mut memory, Some(&known)).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("MEMORY CORRUPTION diff_hash_mismatch expected="), "{msg}");
    assert!(msg.contains("(changed keys: a)"), "{msg}");
    guard.accept(&mut memory);
    assert!(guard.check(&mut memory, None).is_ok());
}

/// A tracking service: `/track/{id}` answers, `/slow` never does in time,
/// `/busy` is rate limited.
async fn tracking_server(hits: Arc<AtomicUsize>) -> SocketAddr {
    let app = Router::new()
        .route(
            "/track/{id}",
            get(move |axum::extract::Path(id): axum::extract::Path<String>| {
                let hits = hits.clone();
                async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    axum::Json(json!({"observation": {"order": id, "status": "delayed"},
                                      "memory": {"shipping_status": "delayed"}}))
                }
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        )
        .route("/busy", get(|| async { (StatusCode::TOO_MANY_REQUESTS, "slow down") }));
    serve(app).await
}

#[tokio::test]
async fn http_tools_against_a_real_server() {
    let hits = Arc::new(AtomicUsize::new(0));
    let addr = tracking_server(hits.clone()).await;
    let client = reqwest::Client::new();
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    let get_tool = |path: &str| HttpTool::new(client.clone(), reqwest::Method::GET, format!("http://{addr}{path}"));
    ex.add_tool("track", def(Tool::Http(get_tool("/track/{{order_id}}")), 2000));
    ex.add_tool("slow", def(Tool::Http(get_tool("/slow")), 200));
    ex.add_tool("busy", def(Tool::Http(get_tool("/busy")), 2000));
    let limited = get_tool("/track/{{order_id}}").with_rate_limit(RateLimit { requests_per_second: 10.0, burst: 1 });
    ex.add_tool("limited", def(Tool::Http(limited.unwrap()), 5000));
    let mut memory = Memory::new();

    let out = call(&ex, "track", &json!({"order_id": "A 1"}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Ok, "{:?}", out.error);
    assert_eq!(out.observation, json!({"order": "A 1", "status": "delayed"}));
    assert_eq!(memory.get("shipping_status"), Some(&json!("delayed")));

    let out = call(&ex, "slow", &json!({}), &mut memory).await;
    assert_eq!((out.status, out.plan_step.error_type.as_str()), (StepStatus::Timeout, "timeout"));
    assert!(matches!(
        out.error,
        Some(basecamp_sandbox::executor::CallError::Tool { source: ToolError::Timeout(200), .. })
    ));

    let out = call(&ex, "busy", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "rate_limited");
    assert!(out.plan_step.error_message.contains("slow down"));

    // 10 requests/s with a burst of 1: five calls need at least ~400 ms.
    let start = Instant::now();
    for i in 0..5 {
        let out = call(&ex, "limited", &json!({"order_id": i}), &mut memory).await;
        assert_eq!(out.status, StepStatus::Ok);
    }
    assert!(start.elapsed() >= Duration::from_millis(380), "rate limit not applied: {:?}", start.elapsed());
    assert_eq!(hits.load(Ordering::SeqCst), 6);
}

#[tokio::test]
async fn a_retry_that_could_not_start_before_the_timeout_fails_with_the_server_s_answer() {
    let flaky_hits = Arc::new(AtomicUsize::new(0));
    let hits = flaky_hits.clone();
    let app = Router::new()
        .route("/busy", get(|| async { (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "3600")], "slow down") }))
        .route("/down", get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "maintenance") }))
        .route(
            "/flaky",
            get(move || {
                let first = hits.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    match first {
                        true => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "0.2")], "wait a bit"),
                        false => (StatusCode::OK, [("retry-after", "0")], "fine"),
                    }
                }
            }),
        );
    let addr = serve(app).await;
    let retrying = |path: &str, retry: Value| {
        let mut tool = HttpTool::new(reqwest::Client::new(), reqwest::Method::GET, format!("http://{addr}{path}"));
        tool.retry = Some(serde_json::from_value(retry).unwrap());
        Tool::Http(tool)
    };
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("busy", def(retrying("/busy", json!({"attempts": 3})), 1000));
    ex.add_tool("down", def(retrying("/down", json!({"attempts": 3, "backoff": "5s"})), 1000));
    ex.add_tool("flaky", def(retrying("/flaky", json!({"attempts": 3})), 1000));
    let mut memory = Memory::new();

    // Both used to sleep into the timeout: error.type=timeout, the server's answer gone.
    let out = call(&ex, "busy", &json!({}), &mut memory).await;
    assert_eq!((out.status, out.plan_step.error_type.as_str()), (StepStatus::Error, "rate_limited"));
    assert_eq!(
        out.plan_step.error_message,
        "tool busy rate limited by the server (HTTP 429): slow down \
         (not retried: Retry-After: 3600 ends past the tool's timeout; attempt 1 of 3)"
    );
    assert!(out.plan_step.latency_micros < 500_000, "{} us", out.plan_step.latency_micros);

    let out = call(&ex, "down", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "http_status");
    assert!(
        out.plan_step.error_message.ends_with(
            "HTTP 503: maintenance (not retried: the backoff of 5000 ms ends past the tool's timeout; attempt 1 of 3)"
        ),
        "{}",
        out.plan_step.error_message
    );
    assert!(out.plan_step.latency_micros < 500_000, "{} us", out.plan_step.latency_micros);

    // A wait that fits is still made.
    let out = call(&ex, "flaky", &json!({}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Ok, "{:?}", out.error);
    assert_eq!(out.observation, json!("fine"));
    assert_eq!(flaky_hits.load(Ordering::SeqCst), 2);
    assert_eq!(out.plan_step.retries, 1);
    assert!(out.plan_step.latency_micros >= 200_000, "Retry-After: 0.2 not honoured");
}

#[tokio::test]
async fn a_closed_port_is_a_transport_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    let tool = HttpTool::new(reqwest::Client::new(), reqwest::Method::GET, format!("http://127.0.0.1:{port}/x"));
    ex.add_tool("down", def(Tool::Http(tool), 2000));
    let out = call(&ex, "down", &json!({}), &mut Memory::new()).await;
    assert_eq!(out.plan_step.error_type, "transport");
    assert!(out.plan_step.error_message.to_lowercase().contains("connect"), "{}", out.plan_step.error_message);
}

/// Used to become a string with U+FFFD where the bytes were, recorded and
/// shown to the policy as the tool's answer.
#[tokio::test]
async fn a_body_that_is_not_utf8_text_fails_naming_its_content_type() {
    const PNG: &[u8] = &[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d, b'I', b'H', b'D', b'R', 0xff];
    let app = Router::new()
        .route("/logo", get(|| async { ([("content-type", "image/png")], PNG) }))
        .route("/latin1", get(|| async { ([("content-type", "text/plain; charset=iso-8859-1")], &b"caf\xe9"[..]) }))
        .route("/utf8", get(|| async { ([("content-type", "text/plain; charset=utf-8")], "café") }));
    let addr = serve(app).await;
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    for path in ["logo", "latin1", "utf8"] {
        let tool = HttpTool::new(reqwest::Client::new(), reqwest::Method::GET, format!("http://{addr}/{path}"));
        ex.add_tool(path, def(Tool::Http(tool), 2000));
    }
    let mut memory = Memory::new();

    let out = call(&ex, "logo", &json!({}), &mut memory).await;
    assert_eq!((out.status, out.plan_step.error_type.as_str()), (StepStatus::Error, "invalid_output"));
    assert_eq!(
        out.plan_step.error_message,
        "tool logo returned an invalid answer: the response body is not UTF-8 text (Content-Type: image/png; \
         17 bytes, the first byte that is not UTF-8 at offset 0; it starts 89 50 4e 47 0d 0a 1a 0a 00 00 00 0d 49 48 \
         44 52 …); an HTTP tool's answer must be JSON or UTF-8 text"
    );
    assert!(!out.plan_step.observation_json.contains('\u{fffd}'), "{}", out.plan_step.observation_json);

    let out = call(&ex, "latin1", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "invalid_output");
    assert!(
        out.plan_step.error_message.contains(
            "(Content-Type: text/plain; charset=iso-8859-1; 4 bytes, the first byte \
             that is not UTF-8 at offset 3; it starts 63 61 66 e9)"
        ),
        "{}",
        out.plan_step.error_message
    );

    let out = call(&ex, "utf8", &json!({}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Ok, "{:?}", out.error);
    assert_eq!(out.observation, json!("café"));
}

/// A 5xx whose error page is over the tool's 4 MiB response limit used to
/// fail as response_too_large, and was not retried.
#[tokio::test]
async fn a_5xx_with_a_body_past_the_response_limit_is_retried_and_quoted_by_its_start() {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let error_page = || format!("maintenance {}", "x".repeat(5 << 20));
    let app = Router::new()
        .route(
            "/recovers",
            get(move || {
                let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    match first {
                        true => (StatusCode::SERVICE_UNAVAILABLE, error_page()),
                        false => (StatusCode::OK, r#"{"status": "shipped"}"#.to_string()),
                    }
                }
            }),
        )
        .route("/down", get(move || async move { (StatusCode::BAD_GATEWAY, error_page()) }));
    let addr = serve(app).await;
    let retrying = |path: &str| {
        let mut tool = HttpTool::new(reqwest::Client::new(), reqwest::Method::GET, format!("http://{addr}{path}"));
        tool.retry = Some(serde_json::from_value(json!({"attempts": 2, "backoff": "10ms"})).unwrap());
        Tool::Http(tool)
    };
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("recovers", def(retrying("/recovers"), 5000));
    ex.add_tool("down", def(retrying("/down"), 5000));
    let mut memory = Memory::new();

    let out = call(&ex, "recovers", &json!({}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Ok, "{:?}", out.error);
    assert_eq!(out.observation, json!({"status": "shipped"}));
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    // The trace says the answer came on the second request (before: a plain OK step).
    assert_eq!(out.plan_step.retries, 1);

    let out = call(&ex, "down", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "http_status");
    let quoted = format!("maintenance {}…", "x".repeat(200 - "maintenance ".len()));
    assert_eq!(out.plan_step.error_message, format!("tool down HTTP 502: {quoted} (gave up after 2 attempts)"));
    // Before: 0, the second request only in the message.
    assert_eq!(out.plan_step.retries, 1, "a failed call's requests sent again are counted too");
}

/// A call its timeout cuts off during its retries says how many requests it
/// sent again, in `retries` and its message; before, both said nothing.
#[tokio::test]
async fn a_call_timed_out_mid_retries_counts_the_requests_sent_again() {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    // Two quick 503s, then an answer that never comes in time.
    let app = Router::new().route(
        "/down",
        get(move || {
            let hit = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if hit >= 2 {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
                (StatusCode::SERVICE_UNAVAILABLE, "maintenance")
            }
        }),
    );
    let addr = serve(app).await;
    let mut tool = HttpTool::new(reqwest::Client::new(), reqwest::Method::GET, format!("http://{addr}/down"));
    tool.retry = Some(serde_json::from_value(json!({"attempts": 5, "backoff": "1ms"})).unwrap());
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("down", def(Tool::Http(tool), 500));
    let out = call(&ex, "down", &json!({}), &mut Memory::new()).await;
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    assert_eq!(out.plan_step.error_type, "timeout");
    assert_eq!(out.plan_step.retries, 2);
    assert_eq!(out.plan_step.error_message, "tool down timed out after 500 ms (after 2 request(s) sent again)");
}

/// A call retried after a 503 whose next answer fails otherwise (here JSON
/// that does not parse; a service gone would be a transport error) says it
/// was retried: before, the message was that of a first attempt.
#[tokio::test]
async fn a_retried_call_that_then_fails_otherwise_says_which_attempt_failed() {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = Router::new().route(
        "/garbled",
        get(move || {
            let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                match first {
                    true => (StatusCode::SERVICE_UNAVAILABLE, [("content-type", "text/plain")], "busy"),
                    false => (StatusCode::OK, [("content-type", "application/json")], "{not json"),
                }
            }
        }),
    );
    let addr = serve(app).await;
    let mut tool = HttpTool::new(reqwest::Client::new(), reqwest::Method::GET, format!("http://{addr}/garbled"));
    tool.retry = Some(serde_json::from_value(json!({"attempts": 3, "backoff": "10ms"})).unwrap());
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("garbled", def(Tool::Http(tool), 5000));
    let out = call(&ex, "garbled", &json!({}), &mut Memory::new()).await;
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    assert_eq!(out.plan_step.error_type, "invalid_json");
    assert!(out.plan_step.error_message.ends_with("(attempt 2 of 3)"), "{}", out.plan_step.error_message);
}

/// A service that answers `GET /ok` and exits with status 4 on `GET /crash`.
const CRASHABLE_SERVICE: &str = r#"import os
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == "/crash":
            print("asked to crash", flush=True); os._exit(4)
        body = b'"up"'
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
HTTPServer((os.environ["HOST"], int(os.environ["PORT"])), H).serve_forever()
"#;

/// [`CRASHABLE_SERVICE`] as a sandbox's service, ready once `/ok` answers.
fn crashable_service(port: Option<u16>) -> basecamp_api::service::ServiceSpec {
    basecamp_api::service::ServiceSpec {
        command: vec!["python3".into(), "-c".into(), CRASHABLE_SERVICE.into()],
        port,
        ready_path: Some("/ok".into()),
        ready_timeout: Some(Duration::from_secs(10).into()),
        ..Default::default()
    }
}

/// A call that fails after a service it calls has exited says so, naming
/// the service, its exit status and its log (`service_exited`); before, it
/// was a bare `transport` error ("connection refused"), blamed on the agent.
/// A tool that calls no service, and a failure the live service answered,
/// keep their own error types; a service the run stopped is no exit.
#[tokio::test]
async fn a_failed_call_to_a_service_that_exited_names_the_service() {
    use basecamp_api::{SandboxConfigSpec, ToolSpec, tool};
    use basecamp_sandbox::driver::StopSignal;
    use basecamp_sandbox::services::RunningServices;

    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let service = crashable_service(Some(port));
    let mut spec = SandboxConfigSpec::default();
    spec.services.insert("tracking".into(), service);
    let http = |url: &str| ToolSpec {
        http: Some(tool::HttpTool { url: url.into(), ..Default::default() }),
        ..Default::default()
    };
    // By reference, by its fixed address written out, and a tool of no service.
    spec.tools.insert("by_ref".into(), http("$(services.tracking.url)/{{path}}"));
    spec.tools.insert(
        "by_address".into(),
        ToolSpec {
            exec: Some(tool::ExecTool {
                command: vec![
                    "python3".into(),
                    "-c".into(),
                    "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())".into(),
                    format!("http://localhost:{port}/ok"),
                ],
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    let mut running = RunningServices::start(&spec.services, dir.path(), dir.path(), &StopSignal::new()).unwrap();
    let expanded = running.expand(&spec).unwrap();
    let url = expanded.tools["by_ref"].http.as_ref().unwrap().url.clone();
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("by_ref", def(Tool::Http(HttpTool::new(reqwest::Client::new(), reqwest::Method::GET, url)), 3000));
    let fetch = expanded.tools["by_address"].exec.as_ref().unwrap().command.clone();
    ex.add_tool("by_address", def(Tool::Exec(ExecTool::new(fetch)), 3000));
    ex.add_tool("elsewhere", def(exec("import sys; sys.exit(5)"), 3000));
    ex.watch_services(running.watch(&spec));
    let mut memory = Memory::new();

    // Alive: a failure of its own is no service's death.
    let out = call(&ex, "by_ref", &json!({"path": "ok"}), &mut memory).await;
    assert_eq!(out.status, StepStatus::Ok, "{:?}", out.error);
    let out = call(&ex, "elsewhere", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "exit_status");

    // The call that kills it, then the calls after.
    let log = dir.path().join("tracking.log").display().to_string();
    for (tool, args) in
        [("by_ref", json!({"path": "crash"})), ("by_ref", json!({"path": "ok"})), ("by_address", json!({}))]
    {
        let out = call(&ex, tool, &args, &mut memory).await;
        let message = &out.plan_step.error_message;
        assert_eq!(out.plan_step.error_type, "service_exited", "{tool} {args}: {message}");
        assert!(
            message.starts_with(&format!("tool {tool} failed because service tracking exited with exit status: 4")),
            "{message}"
        );
        assert!(message.contains(&log), "{message}");
    }
    let out = call(&ex, "elsewhere", &json!({}), &mut memory).await;
    assert_eq!(out.plan_step.error_type, "exit_status", "a tool of no service is not blamed on it");
    assert_eq!(running.exited().len(), 1);
    running.stop();
}

/// A service the run stopped did not die: calls after the stop keep their own error.
#[tokio::test]
async fn a_service_stopped_by_the_run_is_not_blamed_for_failed_calls() {
    use basecamp_api::{SandboxConfigSpec, ToolSpec, tool};
    use basecamp_sandbox::driver::StopSignal;
    use basecamp_sandbox::services::RunningServices;

    let dir = tempfile::tempdir().unwrap();
    let service = crashable_service(None);
    let mut spec = SandboxConfigSpec::default();
    spec.services.insert("tracking".into(), service);
    spec.tools.insert(
        "track".into(),
        ToolSpec {
            http: Some(tool::HttpTool { url: "$(services.tracking.url)/ok".into(), ..Default::default() }),
            ..Default::default()
        },
    );
    let mut running = RunningServices::start(&spec.services, dir.path(), dir.path(), &StopSignal::new()).unwrap();
    let url = running.expand(&spec).unwrap().tools["track"].http.as_ref().unwrap().url.clone();
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool("track", def(Tool::Http(HttpTool::new(reqwest::Client::new(), reqwest::Method::GET, url)), 3000));
    ex.watch_services(running.watch(&spec));
    running.stop();
    let out = call(&ex, "track", &json!({}), &mut Memory::new()).await;
    assert_eq!(out.plan_step.error_type, "transport", "{}", out.plan_step.error_message);
}
