//! The sandbox's HTTP endpoint on 127.0.0.1: `/metrics` fed by real executor
//! calls and a real episode (checked against the Prometheus naming rules, and
//! by `promtool check metrics` when it is installed), live injection landing
//! in an episode's trace, and bad injection bodies answered with 400.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use basecamp_sandbox::episode::{EpisodeInput, EpisodeRunner, LiveInjections};
use basecamp_sandbox::executor::{CallOutcome, Fallback, NullWrites, ToolCall, ToolDef, ToolExecutor};
use basecamp_sandbox::metrics::{OPENMETRICS_CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE, SandboxMetrics};
use basecamp_sandbox::policy::{ChatMessage, Policy, PolicyConfig, ScriptedConfig};
use basecamp_sandbox::server::{ServerState, serve};
use basecamp_sandbox::testing::post_repeated;
use basecamp_sandbox::tools::recorded::{RecordedTool, parse_fixture};
use basecamp_sandbox::tools::{Tool, ToolOutput};
use basecamp_trace::pb::{Header, InjectionTrigger, record::Body};
use basecamp_trace::{Memory, MemoryPatch, read_trace};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server on an ephemeral loopback port; dropping `stop` shuts it down.
struct TestServer {
    addr: SocketAddr,
    state: ServerState,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = ServerState::new(Arc::new(SandboxMetrics::new()), LiveInjections::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, state.clone(), async move {
            let _ = stopped.await;
        }));
        Self { addr, state, stop: Some(stop), task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn shut_down(mut self) {
        drop(self.stop.take());
        let result = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        result.expect("the server stops after the shutdown signal").unwrap().unwrap();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap()
}

async fn get(url: &str, accept: Option<&str>) -> (u16, String, String) {
    let mut request = client().get(url);
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type =
        response.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    (status, content_type, response.text().await.unwrap())
}

async fn post(url: &str, body: &str) -> (u16, Value) {
    let response =
        client().post(url).header("content-type", "application/json").body(body.to_string()).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("the answer is not JSON ({e}): {text}"));
    (status, value)
}

// ---- tool calls through a real executor -------------------------------------

fn executor() -> ToolExecutor {
    let mut ex = ToolExecutor::new(NullWrites::Warn);
    ex.add_tool(
        "lookup",
        ToolDef::new(
            Tool::Function(Arc::new(|args: &Value| Ok(ToolOutput::observation(json!({"found": args["q"]}))))),
            Duration::from_secs(1),
        ),
    );
    let slow =
        parse_fixture("slow.jsonl", r#"{"tool": "tracking", "response": {"status": "late"}, "latency_ms": 2000}"#)
            .unwrap();
    ex.add_tool(
        "tracking",
        ToolDef {
            fallback: Some(Fallback {
                observation: json!({"status": "pending"}),
                memory_patch: MemoryPatch::default(),
            }),
            ..ToolDef::new(Tool::Recorded(RecordedTool::new("tracking", slow)), Duration::from_millis(30))
        },
    );
    ex
}

async fn call(ex: &ToolExecutor, name: &str, args: &Value) -> CallOutcome {
    let mut memory = Memory::new();
    ex.call(ToolCall { step: 1, call_id: "c1", plan_label: "", name, arguments: Ok(args) }, &mut memory).await
}

// ---- Prometheus naming rules, checked in Rust --------------------------------

#[derive(Debug, Default)]
struct Family {
    help: bool,
    kind: String,
    unit: Option<String>,
}

/// One sample line: name, labels, value.
fn parse_sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("no value on sample line `{line}`"));
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key = String::new();
        loop {
            let (i, c) = chars.next().unwrap_or_else(|| panic!("unterminated labels on `{line}`"));
            match c {
                '}' => {
                    rest = &inner[i + 1..];
                    break;
                }
                ',' if key.is_empty() => {}
                '=' => {
                    assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "label value not quoted on `{line}`");
                    let mut value = String::new();
                    loop {
                        match chars.next().unwrap_or_else(|| panic!("unterminated label value on `{line}`")) {
                            (_, '\\') => value.push(chars.next().unwrap().1),
                            (_, '"') => break,
                            (_, c) => value.push(c),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                c => key.push(c),
            }
        }
    }
    let value = rest.split_whitespace().next().unwrap_or_else(|| panic!("no value on `{line}`"));
    let value = match value {
        "+Inf" => f64::INFINITY,
        v => v.parse().unwrap_or_else(|e| panic!("bad value `{v}` on `{line}`: {e}")),
    };
    (name, labels, value)
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The naming rules `promtool check metrics` and the Prometheus docs hold
/// exposition to, for both text formats. Returns the family names.
fn check_exposition(text: &str, openmetrics: bool) -> BTreeSet<String> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut samples: Vec<(String, BTreeMap<String, String>, f64)> = Vec::new();
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let keyword = parts.next().unwrap();
            if keyword == "EOF" {
                continue;
            }
            let name = parts.next().unwrap_or_else(|| panic!("`{line}` names no metric")).to_string();
            let rest = parts.next().unwrap_or_default().to_string();
            let family = families.entry(name).or_default();
            match keyword {
                "HELP" => family.help = !rest.trim().is_empty(),
                "TYPE" => family.kind = rest,
                "UNIT" => family.unit = Some(rest),
                other => panic!("unexpected comment `{other}` in `{line}`"),
            }
        } else if !line.is_empty() {
            samples.push(parse_sample(line));
        }
    }
    if openmetrics {
        assert!(text.ends_with("# EOF\n"), "OpenMetrics text must end with `# EOF`");
    } else {
        assert!(!text.contains("# EOF"), "the 0.0.4 text has no `# EOF`");
    }
    for (name, family) in &families {
        assert!(valid_name(name), "`{name}` is not snake case");
        assert!(name.starts_with("basecamp_sandbox_"), "`{name}` lacks the basecamp_sandbox_ prefix");
        assert!(family.help, "`{name}` has no HELP text");
        for bad_unit in ["_milliseconds", "_microseconds", "_ms", "_us", "_minutes", "_hours", "_kilobytes"] {
            assert!(!name.contains(bad_unit), "`{name}` uses a non-base unit ({bad_unit})");
        }
        match family.kind.as_str() {
            "counter" => {
                // 0.0.4 names counters with their `_total` sample name; OpenMetrics without it.
                assert_eq!(name.ends_with("_total"), !openmetrics, "counter `{name}`'s TYPE name");
            }
            "histogram" => {
                assert!(name.ends_with("_seconds"), "histogram `{name}` must carry its base unit");
                if openmetrics {
                    assert_eq!(family.unit.as_deref(), Some("seconds"), "histogram `{name}` declares its UNIT");
                }
            }
            "gauge" => assert!(!name.ends_with("_total"), "gauge `{name}` ends with _total"),
            other => panic!("`{name}` has unexpected type `{other}`"),
        }
        if family.kind != "counter" {
            assert!(!name.ends_with("_total"), "non-counter `{name}` ends with _total");
        }
    }
    for (sample, labels, value) in &samples {
        let family = families
            .iter()
            .find(|(name, f)| {
                let suffixes: &[&str] = match (f.kind.as_str(), openmetrics) {
                    ("counter", true) => &["_total", "_created"],
                    ("histogram", _) => &["_bucket", "_sum", "_count", "_created"],
                    _ => &[""],
                };
                suffixes.iter().any(|s| *sample == format!("{name}{s}"))
            })
            .unwrap_or_else(|| panic!("sample `{sample}` belongs to no declared family"));
        for key in labels.keys() {
            assert!(valid_name(key) && !key.starts_with("__"), "label `{key}` on `{sample}` is not a valid name");
        }
        assert!(value.is_finite() || labels.get("le").is_some_and(|le| le == "+Inf") || *value >= 0.0);
        if family.1.kind == "counter" {
            assert!(*value >= 0.0, "counter `{sample}` is negative");
        }
    }
    // Every histogram series has a +Inf bucket equal to its count, and cumulative buckets.
    for (name, _) in families.iter().filter(|(_, f)| f.kind == "histogram") {
        let series: BTreeSet<BTreeMap<String, String>> = samples
            .iter()
            .filter(|(s, ..)| *s == format!("{name}_count"))
            .map(|(_, labels, _)| labels.clone())
            .collect();
        for labels in series {
            let buckets: Vec<(f64, f64)> = samples
                .iter()
                .filter(|(s, l, _)| {
                    *s == format!("{name}_bucket") && l.iter().all(|(k, v)| k == "le" || labels.get(k) == Some(v))
                })
                .map(|(_, l, v)| {
                    let le = l["le"].as_str();
                    (if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() }, *v)
                })
                .collect();
            assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{name} {labels:?}: {buckets:?}");
            let count = samples.iter().find(|(s, l, _)| *s == format!("{name}_count") && *l == labels).unwrap().2;
            assert_eq!(buckets.last().map(|b| (b.0, b.1)), Some((f64::INFINITY, count)), "{name} {labels:?}");
            assert!(samples.iter().any(|(s, l, _)| *s == format!("{name}_sum") && *l == labels));
        }
    }
    families.into_keys().collect()
}

/// `promtool check metrics` on `text`, when Debian's `prometheus` package is installed.
fn promtool_check(text: &str, what: &str) {
    let promtool = Path::new("/usr/bin/promtool");
    if !promtool.exists() {
        eprintln!("SKIP promtool check of {what}: /usr/bin/promtool is not installed (Debian package `prometheus`)");
        return;
    }
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && report.trim().is_empty(), "promtool check metrics on {what}: {report}\n{text}");
    eprintln!("promtool check metrics: {what} is clean");
}

fn sample_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

const FAMILIES_0_0_4: [&str; 11] = [
    "basecamp_sandbox_episodes_total",
    "basecamp_sandbox_injections_total",
    "basecamp_sandbox_policy_errors_total",
    "basecamp_sandbox_policy_rate_limited_total",
    "basecamp_sandbox_policy_requests_at_once_limit",
    "basecamp_sandbox_rollbacks_total",
    "basecamp_sandbox_tool_call_duration_seconds",
    "basecamp_sandbox_tool_calls_total",
    "basecamp_sandbox_tool_fallbacks_total",
    "basecamp_sandbox_tool_timeouts_total",
    "basecamp_sandbox_waiting_for_policy",
];

#[tokio::test]
async fn metrics_serve_real_tool_calls_with_conventional_names_in_both_formats() {
    let server = TestServer::start().await;
    let metrics = &server.state.metrics;
    let ex = executor();
    for q in ["a", "b"] {
        let out = call(&ex, "lookup", &json!({"q": q})).await;
        metrics.observe_call(&out);
    }
    let timed_out = call(&ex, "tracking", &json!({"order": "A-1"})).await;
    assert!(timed_out.timed_out() && timed_out.plan_step.fallback_used, "{timed_out:?}");
    metrics.observe_call(&timed_out);
    metrics.observe_call(&call(&ex, "invented_by_the_model", &json!({})).await);
    metrics.observe_policy_error("PolicyTimeout");
    metrics.observe_injection(InjectionTrigger::AfterTool);
    let dir = tempfile::tempdir().unwrap();
    let episode = runner(dir.path(), LiveInjections::default(), None).run(&episode_input(), dir.path()).await.unwrap();
    metrics.observe_episode(&episode);
    let mut failed = episode.clone();
    failed.outcome = "error".into();
    failed.rollbacks = 2;
    metrics.observe_episode(&failed);

    let (status, content_type, text) = get(&server.url("/metrics"), None).await;
    assert_eq!(status, 200);
    assert_eq!(content_type, PROMETHEUS_TEXT_CONTENT_TYPE);
    let families = check_exposition(&text, false);
    assert_eq!(families, FAMILIES_0_0_4.iter().map(|s| s.to_string()).collect(), "{text}");
    for (series, value) in [
        (r#"basecamp_sandbox_tool_calls_total{tool="lookup",status="ok"}"#, 2.0),
        (r#"basecamp_sandbox_tool_calls_total{tool="tracking",status="fallback"}"#, 1.0),
        (r#"basecamp_sandbox_tool_calls_total{tool="unknown",status="refused"}"#, 1.0),
        (r#"basecamp_sandbox_tool_timeouts_total{tool="tracking"}"#, 1.0),
        (r#"basecamp_sandbox_tool_fallbacks_total{tool="tracking"}"#, 1.0),
        (r#"basecamp_sandbox_tool_call_duration_seconds_count{tool="lookup"}"#, 2.0),
        (r#"basecamp_sandbox_tool_call_duration_seconds_bucket{tool="tracking",le="+Inf"}"#, 1.0),
        // The tracking call waited out its 30 ms timeout: not in the 25 ms bucket, in the 50 ms one.
        (r#"basecamp_sandbox_tool_call_duration_seconds_bucket{tool="tracking",le="0.025"}"#, 0.0),
        (r#"basecamp_sandbox_tool_call_duration_seconds_bucket{tool="tracking",le="0.05"}"#, 1.0),
        (r#"basecamp_sandbox_policy_errors_total{category="PolicyTimeout"}"#, 1.0),
        (r#"basecamp_sandbox_injections_total{trigger="after_tool"}"#, 1.0),
        (r#"basecamp_sandbox_episodes_total{outcome="completed"}"#, 1.0),
        (r#"basecamp_sandbox_episodes_total{outcome="error"}"#, 1.0),
        ("basecamp_sandbox_rollbacks_total", 2.0),
    ] {
        assert_eq!(sample_value(&text, series), Some(value), "{series} in\n{text}");
    }
    assert!(!text.contains("invented_by_the_model"), "an undefined tool's name must not become a label");
    assert!(!text.contains("tool_timeouts_total{tool=\"lookup\"}"));
    promtool_check(&text, "the Prometheus text format 0.0.4");

    let (status, content_type, open) =
        get(&server.url("/metrics"), Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")).await;
    assert_eq!(status, 200);
    assert_eq!(content_type, OPENMETRICS_CONTENT_TYPE);
    let families = check_exposition(&open, true);
    let expected: BTreeSet<String> = FAMILIES_0_0_4.iter().map(|s| s.trim_end_matches("_total").to_string()).collect();
    assert_eq!(families, expected);
    assert_eq!(sample_value(&open, r#"basecamp_sandbox_tool_calls_total{tool="lookup",status="ok"}"#), Some(2.0));
    // promtool's `check metrics` reads only the 0.0.4 text format (it takes an
    // OpenMetrics counter family for an untyped `_total` metric), so the
    // OpenMetrics text is held to the rules by `check_exposition` alone.

    let (status, _, body) = get(&server.url("/healthz"), None).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let response = client().get(server.url("/nope")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 404);
    let body: Value = response.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("POST /v1/episodes/{id}/inject"), "{body}");
    server.shut_down().await;
}

// ---- live injection into a real episode --------------------------------------

const SCRIPT: &str = r#"{"episode": "order-7", "turns": [{"tool_calls": [{"name": "lookup", "arguments": {"q": "A-7"}}]}, {"content": "It ships tomorrow."}]}
"#;

/// A runner for episode `order-7`; `metrics` is where it counts calls and
/// delivered injections (the server's, to see them on `/metrics`).
fn runner(dir: &Path, live: LiveInjections, metrics: Option<Arc<SandboxMetrics>>) -> EpisodeRunner {
    let script = dir.join("policy.jsonl");
    std::fs::write(&script, SCRIPT).unwrap();
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    EpisodeRunner {
        max_steps: 4,
        plan_step_timeout: Duration::from_secs(5),
        snapshot_interval: 0,
        header: Header { task: "server-test".into(), ..Default::default() },
        live,
        metrics,
        ..EpisodeRunner::new(executor(), policy)
    }
}

fn episode_input() -> EpisodeInput {
    EpisodeInput {
        id: "order-7".into(),
        messages: vec![ChatMessage::user("Where is order A-7?")],
        ..Default::default()
    }
}

/// `(step, id, observation_json)` of every live injection in the episode's trace.
fn live_injections_in_trace(dir: &Path) -> Vec<(u32, String, String)> {
    let trace = read_trace(dir.join("order-7.trace")).unwrap();
    trace
        .records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::Injection(i)) if i.trigger == InjectionTrigger::Live as i32 => {
                Some((r.step, i.id.clone(), i.observation_json.clone()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_posted_injection_lands_in_the_episode_trace_as_live() {
    let server = TestServer::start().await;
    let url = server.url("/v1/episodes/order-7/inject");
    let (status, body) =
        post(&url, r#"{"observation": {"notice": "carrier strike"}, "at_step": 1, "id": "ops-1"}"#).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body, json!({"id": "ops-1", "episode": "order-7", "at_step": 1}));
    let (status, body) = post(&url, r#"{"observation": "customer called again", "at_step": 2}"#).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["id"], "live-1", "an injection without an id gets one");

    let dir = tempfile::tempdir().unwrap();
    let metrics = Some(server.state.metrics.clone());
    let result =
        runner(dir.path(), server.state.live.clone(), metrics).run(&episode_input(), dir.path()).await.unwrap();
    assert_eq!(result.outcome, "completed", "{result:?}");
    assert_eq!(
        live_injections_in_trace(dir.path()),
        vec![
            (1, "ops-1".to_string(), r#"{"notice":"carrier strike"}"#.to_string()),
            (2, "live-1".to_string(), r#""customer called again""#.to_string()),
        ]
    );

    // Counted by the runner when delivered, once each.
    let (_, _, text) = get(&server.url("/metrics"), None).await;
    assert_eq!(sample_value(&text, r#"basecamp_sandbox_injections_total{trigger="live"}"#), Some(2.0), "{text}");
    assert_eq!(sample_value(&text, r#"basecamp_sandbox_tool_calls_total{tool="lookup",status="ok"}"#), Some(1.0));
    check_exposition(&text, false);
    promtool_check(&text, "the metrics after an episode");
    server.shut_down().await;
}

#[tokio::test]
async fn an_injection_id_is_taken_once_an_episode() {
    let server = TestServer::start().await;
    let url = server.url("/v1/episodes/order-7/inject");
    let (status, _) = post(&url, r#"{"observation": "first", "id": "live-1"}"#).await;
    assert_eq!(status, 202);
    let (status, body) = post(&url, r#"{"observation": "again", "id": "live-1"}"#).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["category"], "InjectionExists", "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("\"live-1\"") && m.contains("order-7")));
    // A generated id skips the one a client chose.
    let (status, body) = post(&url, r#"{"observation": "generated"}"#).await;
    assert_eq!((status, body["id"].as_str()), (202, Some("live-2")), "{body}");
    // Ids are per episode.
    let (status, _) = post(&server.url("/v1/episodes/order-8/inject"), r#"{"observation": "x", "id": "live-1"}"#).await;
    assert_eq!(status, 202);

    let dir = tempfile::tempdir().unwrap();
    let result = runner(dir.path(), server.state.live.clone(), None).run(&episode_input(), dir.path()).await.unwrap();
    assert_eq!(result.outcome, "completed", "{result:?}");
    let delivered: Vec<String> = live_injections_in_trace(dir.path()).into_iter().map(|(_, id, _)| id).collect();
    assert_eq!(delivered, ["live-1", "live-2"], "the refused one was never queued");
    server.shut_down().await;
}

#[tokio::test]
async fn bad_injection_bodies_get_400_with_a_reason_and_queue_nothing() {
    let server = TestServer::start().await;
    let url = server.url("/v1/episodes/order-7/inject");
    for (body, expected) in [
        ("not json", "invalid injection body: expected ident at line 1 column 2"),
        (r#"{"at_step": 1}"#, "missing field `observation`"),
        (r#"{"observation": "x", "atStep": 1}"#, "unknown field `atStep`"),
        (r#"{"observation": "x", "at_step": -1}"#, "invalid value: integer `-1`"),
        (r#"{"observation": "x", "at_step": "two"}"#, "invalid type: string \"two\""),
        (r#"{"observation": null}"#, "`observation` is null"),
        // Before: taken as the next turn, while the CLI's --at-step refused 0.
        (r#"{"observation": "x", "at_step": 0}"#, "`at_step` is 0: steps are numbered from 1"),
        (r#"{"observation": "x", "id": " "}"#, "`id` is empty"),
        (r#"["observation"]"#, "the injection body is an array, not an object"),
        ("42", "the injection body is a number, not an object"),
        ("", "EOF while parsing"),
    ] {
        let (status, answer) = post(&url, body).await;
        assert_eq!(status, 400, "{body} -> {answer}");
        assert_eq!(answer["error"]["category"], "InvalidInjection", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_else(|| panic!("no error message: {answer}"));
        assert!(message.contains(expected), "{body} -> {message}");
    }
    let long_id = "x".repeat(300);
    let (status, answer) = post(&server.url(&format!("/v1/episodes/{long_id}/inject")), r#"{"observation": 1}"#).await;
    assert_eq!(status, 400);
    assert!(answer["error"]["message"].as_str().unwrap().contains("episode id is 300 bytes long"), "{answer}");

    let dir = tempfile::tempdir().unwrap();
    let metrics = Some(server.state.metrics.clone());
    let result =
        runner(dir.path(), server.state.live.clone(), metrics).run(&episode_input(), dir.path()).await.unwrap();
    assert_eq!(result.outcome, "completed");
    assert_eq!(live_injections_in_trace(dir.path()), vec![], "a refused body must not be injected");
    let (_, _, text) = get(&server.url("/metrics"), None).await;
    assert_eq!(sample_value(&text, r#"basecamp_sandbox_injections_total{trigger="live"}"#), Some(0.0), "{text}");
    server.shut_down().await;
}

#[tokio::test]
async fn an_injection_for_an_episode_that_will_not_run_or_has_finished_is_refused() {
    let server = TestServer::start().await;
    server.state.live.expect_episodes(["order-7".to_string()]);
    let (status, answer) = post(&server.url("/v1/episodes/order-8/inject"), r#"{"observation": 1}"#).await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(answer["error"]["category"], "UnknownEpisode");
    assert!(answer["error"]["message"].as_str().unwrap().contains("runs 1 episodes (order-7)"), "{answer}");
    let (status, _) =
        post(&server.url("/v1/episodes/order-7/inject"), r#"{"observation": 1, "at_step": 9, "id": "late"}"#).await;
    assert_eq!(status, 202);

    let dir = tempfile::tempdir().unwrap();
    let result = runner(dir.path(), server.state.live.clone(), None).run(&episode_input(), dir.path()).await.unwrap();
    assert!(
        result.warnings.iter().any(|w| w.contains("live injection late for step 9 was never delivered")),
        "{:?}",
        result.warnings
    );
    let (status, answer) = post(&server.url("/v1/episodes/order-7/inject"), r#"{"observation": 2}"#).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["category"], "EpisodeFinished");
    server.shut_down().await;
}

#[tokio::test]
async fn an_injection_body_is_read_up_to_the_server_modes_limit_and_refused_above_it_as_json() {
    let server = TestServer::start().await;
    let addr = server.addr;
    // 3 MB: over axum's 2 MB default, which answered a plain-text 413 here while server
    // mode read it.
    let big = serde_json::to_vec(&json!({"observation": "a".repeat(3 << 20), "id": "big"})).unwrap();
    let (status, answer) =
        tokio::task::spawn_blocking(move || post_repeated(addr, "/v1/episodes/order-7/inject", &big, 1)).await.unwrap();
    assert_eq!(status, 202, "{}", &answer[..answer.len().min(300)]);
    let accepted: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(accepted["id"], "big");

    // Over 256 MiB: the API's JSON error, as in server mode.
    let (status, answer) =
        tokio::task::spawn_blocking(move || post_repeated(addr, "/v1/episodes/order-7/inject", &[b' '; 1 << 20], 257))
            .await
            .unwrap();
    assert_eq!(status, 413, "{answer}");
    let error: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(error["error"]["category"], "RequestTooLarge", "{answer}");
    assert!(error["error"]["message"].as_str().unwrap().contains("over 256 MiB"), "{answer}");
    server.shut_down().await;
}
