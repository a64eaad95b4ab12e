//! `openapi/sandbox.yaml` against the sandbox's real routers: every
//! documented operation is served and every served one documented (checked
//! over HTTP, not only against the route table), every example validates
//! against its schema, and the answers of a real episode validate against
//! the schema documented for their status.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use basecamp_sandbox::episode::{EpisodeInput, EpisodeRunner, LiveInjections};
use basecamp_sandbox::executor::{NullWrites, ToolDef, ToolExecutor};
use basecamp_sandbox::gym::{Gym, GymConfig, routes};
use basecamp_sandbox::metrics::SandboxMetrics;
use basecamp_sandbox::policy::{ChatMessage, Policy, PolicyConfig, ScriptedConfig, ToolSpec};
use basecamp_sandbox::server::ServerState;
use basecamp_sandbox::tools::Tool;
use basecamp_sandbox::tools::recorded::{RecordedTool, parse_fixture};
use serde_json::{Value, json};

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

fn spec() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/sandbox.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let spec: Value = serde_saphyr::from_str(&text).unwrap();
    assert!(spec["openapi"].as_str().unwrap().starts_with("3.1."), "OpenAPI 3.1");
    spec
}

/// `(METHOD, path)` of every operation in the document.
fn documented(spec: &Value) -> BTreeSet<(String, String)> {
    let mut operations = BTreeSet::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for method in METHODS {
            if item.get(method).is_some() {
                operations.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    operations
}

/// Follows `$ref`s within the document.
fn resolve<'a>(spec: &'a Value, node: &'a Value) -> &'a Value {
    match node.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let pointer = reference.strip_prefix('#').unwrap_or_else(|| panic!("external $ref {reference}"));
            resolve(spec, spec.pointer(pointer).unwrap_or_else(|| panic!("dangling $ref {reference}")))
        }
        None => node,
    }
}

/// The subset of JSON Schema 2020-12 the document uses. Any other keyword
/// fails the check, so a schema can never pass by being misunderstood.
fn validate(spec: &Value, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    let schema = resolve(spec, schema);
    let Value::Object(keywords) = schema else { return errors.push(format!("{at}: the schema is not an object")) };
    for (keyword, rule) in keywords {
        match keyword.as_str() {
            "description" | "title" | "contentMediaType" | "examples" | "$ref" => {}
            "type" => {
                let types: Vec<&str> = match rule {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                    _ => return errors.push(format!("{at}: bad `type` {rule}")),
                };
                let matches = |t: &str| match t {
                    "object" => value.is_object(),
                    "array" => value.is_array(),
                    "string" => value.is_string(),
                    "boolean" => value.is_boolean(),
                    "null" => value.is_null(),
                    "number" => value.is_number(),
                    "integer" => value.is_i64() || value.is_u64(),
                    other => panic!("{at}: unknown type {other}"),
                };
                if !types.iter().any(|t| matches(t)) {
                    errors.push(format!("{at}: {value} is not of type {rule}"));
                }
            }
            "const" if value != rule => errors.push(format!("{at}: {value} is not {rule}")),
            "enum" if !rule.as_array().unwrap().contains(value) => errors.push(format!("{at}: {value} not in {rule}")),
            "const" | "enum" => {}
            "required" => {
                for field in rule.as_array().unwrap() {
                    let field = field.as_str().unwrap();
                    if value.is_object() && value.get(field).is_none() {
                        errors.push(format!("{at}: `{field}` is missing"));
                    }
                }
            }
            "properties" => {
                if let Value::Object(fields) = value {
                    for (name, field_schema) in rule.as_object().unwrap() {
                        if let Some(field) = fields.get(name) {
                            validate(spec, field_schema, field, &format!("{at}.{name}"), errors);
                        }
                    }
                }
            }
            "additionalProperties" => {
                if let Value::Object(fields) = value {
                    let known = keywords.get("properties").and_then(Value::as_object);
                    for (name, field) in fields {
                        if known.is_some_and(|k| k.contains_key(name)) {
                            continue;
                        }
                        match rule {
                            Value::Bool(false) => errors.push(format!("{at}: `{name}` is not documented")),
                            Value::Bool(true) => {}
                            other => validate(spec, other, field, &format!("{at}.{name}"), errors),
                        }
                    }
                }
            }
            "items" => {
                for (i, item) in value.as_array().into_iter().flatten().enumerate() {
                    validate(spec, rule, item, &format!("{at}[{i}]"), errors);
                }
            }
            "allOf" => {
                for part in rule.as_array().unwrap() {
                    validate(spec, part, value, at, errors);
                }
            }
            "minimum" => {
                if value.as_f64().is_some_and(|v| v < rule.as_f64().unwrap()) {
                    errors.push(format!("{at}: {value} is below {rule}"));
                }
            }
            "minLength" | "maxLength" => {
                if let Some(text) = value.as_str() {
                    let (len, bound) = (text.chars().count() as u64, rule.as_u64().unwrap());
                    if (keyword == "minLength" && len < bound) || (keyword == "maxLength" && len > bound) {
                        errors.push(format!("{at}: length {len} breaks {keyword} {bound}"));
                    }
                }
            }
            other => errors.push(format!("{at}: the checker does not know the keyword `{other}`")),
        }
    }
}

fn assert_valid(spec: &Value, schema: &Value, value: &Value, what: &str) {
    let mut errors = Vec::new();
    validate(spec, schema, value, "$", &mut errors);
    assert!(errors.is_empty(), "{what}: {errors:#?}\n{value:#}");
}

/// The JSON schema documented for `status` of `method path`.
fn response_schema<'a>(spec: &'a Value, method: &str, path: &str, status: u16) -> &'a Value {
    let operation = &spec["paths"][path][method.to_lowercase()];
    assert!(operation.is_object(), "{method} {path} is not documented");
    let response = operation["responses"]
        .get(status.to_string())
        .unwrap_or_else(|| panic!("{method} {path} answered {status}, which the document does not list"));
    let schema = &resolve(spec, response)["content"]["application/json"]["schema"];
    assert!(schema.is_object(), "{method} {path} {status} documents no JSON body");
    schema
}

fn runner(dir: &std::path::Path) -> EpisodeRunner {
    let script = dir.join("policy.jsonl");
    std::fs::write(&script, r#"{"content": "unused: the trainer is the policy"}"#).unwrap();
    let fixture = parse_fixture(
        "fixture.jsonl",
        r#"{"tool": "track", "arguments": {"order_id": "1"}, "response": {"observation": {"status": "late"}, "memory": {"status": "late"}}}"#,
    )
    .unwrap();
    let mut executor = ToolExecutor::new(NullWrites::Warn);
    executor
        .add_tool("track", ToolDef::new(Tool::Recorded(RecordedTool::new("track", fixture)), Duration::from_secs(1)));
    let policy = Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: script })).unwrap();
    EpisodeRunner {
        tools: vec![ToolSpec::new("track", "Track an order.", json!({"type": "object"}))],
        system_prompt: Some("Be brief.".into()),
        max_steps: 3,
        plan_step_timeout: Duration::from_secs(5),
        snapshot_interval: 0,
        ..EpisodeRunner::new(executor, policy)
    }
}

async fn start_gym(dir: &std::path::Path, max_episodes: usize) -> SocketAddr {
    let gym = Gym::new(GymConfig {
        runner: runner(dir),
        rows: vec![EpisodeInput {
            id: "row-1".into(),
            messages: vec![ChatMessage::user("Where is order 1?")],
            ..Default::default()
        }],
        test_set_name: "tests.jsonl".into(),
        compare_args: Default::default(),
        out_dir: dir.join("traces"),
        max_episodes,
        idle_timeout: Duration::from_secs(60),
        keep_closed: Duration::from_secs(60),
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(basecamp_sandbox::gym::serve(listener, gym, std::future::pending()));
    addr
}

async fn start_driver() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = ServerState::new(Arc::new(SandboxMetrics::new()), LiveInjections::default());
    tokio::spawn(basecamp_sandbox::server::serve(listener, state, std::future::pending()));
    addr
}

async fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String, Value) {
    let url = format!("http://{addr}{path}");
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let response = reqwest::Client::new().request(method, url).body(body.to_string()).send().await.unwrap();
    let status = response.status().as_u16();
    let content_type =
        response.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let bytes = response.bytes().await.unwrap();
    (status, content_type, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn every_documented_operation_is_served_and_every_served_one_documented() {
    let spec = spec();
    let operations = documented(&spec);
    let served: BTreeSet<(String, String)> =
        routes().into_iter().map(|(method, path)| (method.to_string(), path.to_string())).collect();
    assert_eq!(operations, served, "the document and server mode's route table");

    let dir = tempfile::tempdir().unwrap();
    let gym = start_gym(dir.path(), 4).await;
    let driver = start_driver().await;
    let driver_routes = [("GET", "/metrics"), ("GET", "/healthz"), ("POST", "/v1/episodes/{episode_id}/inject")];
    let mut probed = 0;
    for (addr, mode) in [(gym, "server"), (driver, "driver")] {
        for (path, item) in spec["paths"].as_object().unwrap() {
            let concrete = path.replace("{episode_id}", "probe");
            for method in METHODS {
                let upper = method.to_uppercase();
                let served_here = match mode {
                    "server" => item.get(method).is_some(),
                    _ => driver_routes.contains(&(upper.as_str(), path.as_str())),
                };
                let (status, _, body) = call(addr, &upper, &concrete, "{}").await;
                let category = body["error"]["category"].as_str().unwrap_or_default().to_string();
                if served_here {
                    assert!(
                        status != 405 && category != "NoSuchEndpoint" && category != "MethodNotAllowed",
                        "{mode} mode does not serve documented {upper} {path}: {status} {body}"
                    );
                    probed += 1;
                } else {
                    assert!(
                        (status == 405 && category == "MethodNotAllowed")
                            || (status == 404 && category == "NoSuchEndpoint"),
                        "{mode} mode serves undocumented {upper} {path}: {status} {body}"
                    );
                }
            }
        }
    }
    assert_eq!(probed, operations.len() + driver_routes.len());
}

#[test]
fn every_example_validates_against_its_schema() {
    let spec = spec();
    let mut checked = 0;
    let mut check_content = |content: &Value, what: &str| {
        for (media, body) in content.as_object().into_iter().flatten() {
            for (name, example) in body["examples"].as_object().into_iter().flatten() {
                assert_valid(
                    &spec,
                    &body["schema"],
                    &resolve(&spec, example)["value"],
                    &format!("{what} {media} example {name}"),
                );
                checked += 1;
            }
        }
    };
    for (path, item) in spec["paths"].as_object().unwrap() {
        for method in METHODS {
            let Some(operation) = item.get(method) else { continue };
            let what = format!("{method} {path}");
            check_content(&resolve(&spec, &operation["requestBody"])["content"], &format!("{what} request"));
            for (status, response) in operation["responses"].as_object().unwrap() {
                check_content(&resolve(&spec, response)["content"], &format!("{what} {status}"));
            }
        }
    }
    assert!(checked >= 15, "only {checked} examples were checked");

    // The checker itself refuses what it should.
    let error = &spec["components"]["schemas"]["Error"];
    let mut errors = Vec::new();
    validate(&spec, error, &json!({"error": {"category": "Nope", "message": 1}, "extra": true}), "$", &mut errors);
    assert_eq!(errors.len(), 3, "{errors:?}");
}

#[tokio::test]
async fn the_answers_of_a_real_episode_match_the_documented_schemas() {
    let spec = spec();
    let dir = tempfile::tempdir().unwrap();
    let addr = start_gym(dir.path(), 2).await;
    let check = |method: &'static str, path: &'static str, concrete: String, body: &'static str| {
        let spec = &spec;
        async move {
            let (status, content_type, answer) = call(addr, method, &concrete, body).await;
            assert!(content_type.starts_with("application/json"), "{method} {concrete}: {content_type}");
            assert_valid(
                spec,
                response_schema(spec, method, path, status),
                &answer,
                &format!("{method} {concrete} {status}"),
            );
            (status, answer)
        }
    };
    let (status, created) = check("POST", "/v1/episodes", "/v1/episodes".into(), r#"{"row_id": "row-1"}"#).await;
    assert_eq!(status, 201);
    let id = created["episode_id"].as_str().unwrap().to_string();
    let at = |suffix: &str| format!("/v1/episodes/{id}{suffix}");
    let inline = r#"{"instruction": "hi", "episode_id": "inline", "initial_memory": {"k": 1}}"#;
    assert_eq!(check("POST", "/v1/episodes", "/v1/episodes".into(), inline).await.0, 201);
    assert_eq!(check("POST", "/v1/episodes", "/v1/episodes".into(), r#"{"row_id": "row-1"}"#).await.0, 429);
    assert_eq!(check("POST", "/v1/episodes", "/v1/episodes".into(), r#"{"row_id": 7}"#).await.0, 400);
    assert_eq!(
        check("POST", "/v1/episodes/{episode_id}/inject", at("/inject"), r#"{"observation": "now"}"#).await.0,
        202
    );
    let later = r#"{"observation": "later", "at_step": 3}"#;
    assert_eq!(check("POST", "/v1/episodes/{episode_id}/inject", at("/inject"), later).await.0, 202);
    assert_eq!(check("POST", "/v1/episodes/{episode_id}/inject", at("/inject"), "[]").await.0, 400);
    let once = r#"{"observation": "once", "id": "ops-1"}"#;
    assert_eq!(check("POST", "/v1/episodes/{episode_id}/inject", at("/inject"), once).await.0, 202);
    assert_eq!(check("POST", "/v1/episodes/{episode_id}/inject", at("/inject"), once).await.0, 409);
    let action = r#"{"tool_calls": [{"name": "track", "arguments": {"order_id": "1"}}, {"name": "nope"}]}"#;
    let (status, stepped) = check("POST", "/v1/episodes/{episode_id}/step", at("/step"), action).await;
    assert_eq!((status, stepped["info"]["status"].as_str()), (200, Some("refused")));
    assert_eq!(check("POST", "/v1/episodes/{episode_id}/step", at("/step"), r#"{"tool_calls": 1}"#).await.0, 400);
    assert_eq!(check("GET", "/v1/episodes/{episode_id}", at(""), "").await.0, 200);
    assert_eq!(check("GET", "/v1/episodes", "/v1/episodes".into(), "").await.0, 200);
    let (status, last) = check("POST", "/v1/episodes/{episode_id}/step", at("/step"), r#"{"content": "late"}"#).await;
    assert_eq!((status, last["done"].as_bool()), (200, Some(true)));
    assert_eq!(check("POST", "/v1/episodes/{episode_id}/step", at("/step"), r#"{"content": "x"}"#).await.0, 409);
    assert_eq!(check("POST", "/v1/episodes/{episode_id}/inject", at("/inject"), r#"{"observation": 1}"#).await.0, 409);
    assert_eq!(check("GET", "/v1/episodes/{episode_id}", at(""), "").await.0, 200);
    assert_eq!(check("POST", "/v1/episodes/{episode_id}/close", at("/close"), "").await.0, 200);
    assert_eq!(check("POST", "/v1/episodes/{episode_id}/close", "/v1/episodes/inline/close".into(), "").await.0, 200);
    assert_eq!(
        check("POST", "/v1/episodes", "/v1/episodes".into(), r#"{"row_id": "row-1", "episode_id": "inline"}"#).await.0,
        409
    );
    for (method, path) in [
        ("POST", "/v1/episodes/{episode_id}/step"),
        ("POST", "/v1/episodes/{episode_id}/close"),
        ("GET", "/v1/episodes/{episode_id}/trace"),
        ("GET", "/v1/episodes/{episode_id}"),
    ] {
        assert_eq!(check(method, path, path.replace("{episode_id}", "missing"), "{}").await.0, 404);
        // An id that is not UTF-8 names no episode either (before: 400 in plain text, no JSON error).
        let (status, error) = check(method, path, path.replace("{episode_id}", "%FF"), "{}").await;
        assert_eq!((status, error["error"]["category"].as_str()), (404, Some("UnknownEpisode")), "{error}");
    }

    let (status, content_type, _) = call(addr, "GET", &at("/trace"), "").await;
    assert_eq!(status, 200);
    let documented = &spec["paths"]["/v1/episodes/{episode_id}/trace"]["get"]["responses"]["200"]["content"];
    assert!(documented.get(&content_type).is_some(), "{content_type} is not documented for the trace");
    let (status, content_type, _) = call(addr, "GET", "/healthz", "").await;
    assert_eq!(status, 200);
    assert!(
        spec["paths"]["/healthz"]["get"]["responses"]["200"]["content"]
            .get(content_type.split(';').next().unwrap())
            .is_some()
    );
}
