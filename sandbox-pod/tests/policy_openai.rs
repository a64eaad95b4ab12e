//! The OpenAI-compatible policy client against a real HTTP server on
//! 127.0.0.1: a scripted chat-completions fixture that answers configured
//! replies in order and records every request it got.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use basecamp_sandbox::policy::{
    ApiKeySource, ChatMessage, OpenAiConfig, OpenAiError, OpenAiPolicy, Policy, PolicyConfig, PolicyError,
    PolicyRequest, RetryPolicy, ToolArguments, ToolChoice, ToolSpec,
};
use serde_json::{Value, json};

// ---- the fixture -------------------------------------------------------------

/// What the fixture answers to one request.
enum Reply {
    /// Status, extra headers, body.
    Answer(u16, Vec<(&'static str, String)>, String),
    /// Answer 200 only after this long (longer than any client timeout used here).
    Stall(Duration),
}

impl Reply {
    fn ok(body: Value) -> Self {
        Self::Answer(200, vec![], body.to_string())
    }

    fn status(status: u16, body: &str) -> Self {
        Self::Answer(status, vec![], body.to_owned())
    }
}

struct Recorded {
    path: String,
    authorization: Option<String>,
    body: Value,
}

#[derive(Default)]
struct FixtureState {
    replies: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
}

/// A scripted OpenAI-compatible server on 127.0.0.1:0; stopped on drop.
struct Fixture {
    base_url: String,
    state: Arc<FixtureState>,
    task: tokio::task::JoinHandle<()>,
}

impl Fixture {
    async fn start(replies: Vec<Reply>) -> Self {
        let state = Arc::new(FixtureState { replies: Mutex::new(replies.into()), requests: Mutex::default() });
        let app = Router::new().route("/v1/chat/completions", post(answer)).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fixture server");
        });
        Self { base_url: format!("http://{addr}/v1"), state, task }
    }

    fn requests(&self) -> std::sync::MutexGuard<'_, Vec<Recorded>> {
        self.state.requests.lock().expect("fixture lock")
    }

    fn config(&self) -> OpenAiConfig {
        let mut config = OpenAiConfig::new(&self.base_url, "test-model");
        config.request_timeout = Duration::from_secs(5);
        config.retry = fast_retry(4);
        config
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State(state): State<Arc<FixtureState>>, headers: HeaderMap, body: String) -> Response {
    state.requests.lock().expect("fixture lock").push(Recorded {
        path: "/v1/chat/completions".into(),
        authorization: headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned),
        body: serde_json::from_str(&body).unwrap_or(Value::Null),
    });
    let reply = state.replies.lock().expect("fixture lock").pop_front();
    match reply {
        Some(Reply::Answer(status, extra, body)) => {
            let mut response = (StatusCode::from_u16(status).expect("valid status"), body).into_response();
            response.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
            for (name, value) in extra {
                response
                    .headers_mut()
                    .insert(HeaderName::from_static(name), HeaderValue::from_str(&value).expect("header value"));
            }
            response
        }
        Some(Reply::Stall(how_long)) => {
            tokio::time::sleep(how_long).await;
            (StatusCode::OK, "{}").into_response()
        }
        None => (StatusCode::INTERNAL_SERVER_ERROR, "fixture: no reply scripted for this request").into_response(),
    }
}

fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
        max_retry_after: Duration::from_secs(5),
    }
}

// ---- requests and answers ------------------------------------------------------

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec::new(
        "lookup_order",
        "Find an order by id",
        json!({"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}),
    )]
}

fn request() -> PolicyRequest<'static> {
    PolicyRequest::new(
        "ep-1",
        0,
        vec![ChatMessage::system("You are a support agent."), ChatMessage::user("Where is order A1?")],
        tools(),
    )
}

fn completion(tool_calls: Value, logprobs: Value) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "served-model",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": null, "tool_calls": tool_calls},
            "finish_reason": "tool_calls",
            "logprobs": logprobs
        }],
        "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49}
    })
}

fn tool_call(id: &str, name: &str, arguments: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

fn logprobs() -> Value {
    json!({"content": [
        {"token": "token_id:151657", "logprob": -0.0001, "top_logprobs": [
            {"token": "token_id:151657", "logprob": -0.0001},
            {"token": "token_id:40", "logprob": -9.5}
        ]},
        {"token": "token_id:5", "logprob": -0.75, "top_logprobs": [
            {"token": "token_id:5", "logprob": -0.75},
            {"token": "token_id:6", "logprob": -0.9}
        ]}
    ]})
}

fn ok_tool_turn() -> Reply {
    Reply::ok(completion(json!([tool_call("call_1", "lookup_order", r#"{"order_id": "A1"}"#)]), logprobs()))
}

// ---- tests -------------------------------------------------------------------

#[tokio::test]
async fn tool_call_turn_with_logprobs_becomes_trace_records() {
    let fixture = Fixture::start(vec![ok_tool_turn()]).await;
    let mut config = fixture.config();
    config.top_logprobs = 2;
    config.temperature = Some(0.0);
    config.max_tokens = Some(256);
    let policy = OpenAiPolicy::new(config).unwrap();
    let mut req = request();
    req.tool_choice = ToolChoice::Required;

    let response = policy.respond(&req).await.unwrap();

    assert_eq!(response.model, "served-model");
    assert_eq!(response.attempts, 1);
    assert_eq!(response.tool_calls.len(), 1);
    assert_eq!(response.tool_calls[0].id, "call_1");
    assert_eq!(response.tool_calls[0].name, "lookup_order");
    assert_eq!(response.tool_calls[0].arguments, ToolArguments::Parsed(json!({"order_id": "A1"})));

    let records = response.token_logits();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].position, 0);
    assert_eq!(records[0].token_id, 151657);
    assert_eq!(records[0].top_ids[..], [151657, 40]);
    assert_eq!(records[0].top_logprobs[..], [-0.0001, -9.5]);
    assert_eq!(records[1].position, 1);
    assert_eq!(records[1].logprob, -0.75);

    let turn = response.to_policy_turn();
    assert!(!turn.logprobs_missing);
    assert_eq!(turn.model, "served-model");
    assert_eq!(turn.finish_reason, "tool_calls");
    assert_eq!((turn.prompt_tokens, turn.completion_tokens), (42, 7));
    let calls: Value = serde_json::from_str(&turn.tool_calls_json).unwrap();
    assert_eq!(calls[0]["function"]["name"], "lookup_order");

    // What the server was sent.
    let requests = fixture.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.authorization, None);
    assert_eq!(sent.body["model"], "test-model");
    assert_eq!(sent.body["logprobs"], true);
    assert_eq!(sent.body["top_logprobs"], 2);
    assert_eq!(sent.body["temperature"], 0.0);
    assert_eq!(sent.body["max_tokens"], 256);
    assert_eq!(sent.body["tool_choice"], "required");
    assert_eq!(sent.body["messages"][1], json!({"role": "user", "content": "Where is order A1?"}));
    assert_eq!(sent.body["tools"][0]["type"], "function");
    assert_eq!(sent.body["tools"][0]["function"]["name"], "lookup_order");
    assert_eq!(sent.body["tools"][0]["function"]["parameters"]["required"], json!(["order_id"]));
}

#[tokio::test]
async fn invalid_json_arguments_are_a_recorded_policy_error_not_a_failure() {
    let fixture = Fixture::start(vec![Reply::ok(completion(
        json!([
            tool_call("call_ok", "lookup_order", r#"{"order_id": "A1"}"#),
            tool_call("call_bad", "lookup_order", r#"{"order_id": "A1""#),
            tool_call("call_list", "lookup_order", r#"["A1"]"#),
        ]),
        logprobs(),
    ))])
    .await;
    let policy = OpenAiPolicy::new(fixture.config()).unwrap();

    let response = policy.respond(&request()).await.expect("a bad tool call does not fail the turn");

    let invalid: Vec<_> = response.invalid_tool_calls().collect();
    assert_eq!(invalid.len(), 2);
    assert_eq!(invalid[0].0.id, "call_bad");
    assert_eq!(invalid[0].1.error_type, "invalid_json");
    assert_eq!(invalid[0].1.raw, r#"{"order_id": "A1""#);
    assert!(invalid[0].1.message.contains("not valid JSON"), "{}", invalid[0].1.message);
    assert_eq!(invalid[1].1.error_type, "invalid_arguments");
    // The valid call is still usable, and the trace keeps the raw text.
    assert!(response.tool_calls[0].arguments.as_value().is_some());
    let turn = response.to_policy_turn();
    let calls: Value = serde_json::from_str(&turn.tool_calls_json).unwrap();
    assert_eq!(calls[1]["function"]["arguments"], r#"{"order_id": "A1""#);
}

#[tokio::test]
async fn an_unknown_tool_name_is_passed_through() {
    let fixture = Fixture::start(vec![Reply::ok(completion(
        json!([tool_call("call_x", "delete_all_orders", "{}")]),
        logprobs(),
    ))])
    .await;
    let policy = OpenAiPolicy::new(fixture.config()).unwrap();

    let response = policy.respond(&request()).await.unwrap();

    assert_eq!(response.tool_calls[0].name, "delete_all_orders");
    assert_eq!(response.tool_calls[0].arguments, ToolArguments::Parsed(json!({})));
}

#[tokio::test]
async fn rate_limit_is_retried_honouring_retry_after() {
    let fixture = Fixture::start(vec![
        Reply::Answer(429, vec![("retry-after", "1".into())], r#"{"error": {"message": "slow down"}}"#.into()),
        ok_tool_turn(),
    ])
    .await;
    let policy = OpenAiPolicy::new(fixture.config()).unwrap();
    let started = Instant::now();

    let response = policy.respond(&request()).await.unwrap();

    let waited = started.elapsed();
    assert_eq!(response.attempts, 2);
    assert_eq!(fixture.requests().len(), 2);
    assert!(waited >= Duration::from_millis(950), "Retry-After: 1 not honoured: {waited:?}");
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    assert!(response.latency >= Duration::from_millis(950), "latency includes retries: {:?}", response.latency);
}

#[tokio::test]
async fn server_errors_give_up_after_bounded_attempts_with_a_clear_message() {
    let replies = (0..5).map(|_| Reply::status(500, "upstream model crashed")).collect();
    let fixture = Fixture::start(replies).await;
    let mut config = fixture.config();
    config.retry = fast_retry(3);
    let policy = OpenAiPolicy::new(config).unwrap();

    let err = policy.respond(&request()).await.unwrap_err();

    assert_eq!(fixture.requests().len(), 3, "exactly max_attempts requests");
    assert_eq!(err.category(), "PolicyServerError");
    assert_eq!(
        err.to_string(),
        format!("policy endpoint {} answered 500 after 3 attempts: upstream model crashed", fixture.base_url)
    );
}

#[tokio::test]
async fn a_retry_after_beyond_the_allowed_wait_is_reported_at_once() {
    let fixture =
        Fixture::start(vec![Reply::Answer(429, vec![("retry-after", "3600".into())], "quota exceeded".into())]).await;
    let policy = OpenAiPolicy::new(fixture.config()).unwrap();

    let err = policy.respond(&request()).await.unwrap_err();

    assert_eq!(fixture.requests().len(), 1);
    assert_eq!(err.category(), "PolicyRateLimited");
    let message = err.to_string();
    assert!(message.contains("answered 429 after 1 attempt (it asked to retry after 3600.0 s"), "{message}");
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let fixture = Fixture::start(vec![Reply::status(400, r#"{"error": "model `test-model` does not exist"}"#)]).await;
    let policy = OpenAiPolicy::new(fixture.config()).unwrap();

    let err = policy.respond(&request()).await.unwrap_err();

    assert_eq!(fixture.requests().len(), 1);
    assert_eq!(err.category(), "PolicyRequestRejected");
    assert!(err.to_string().contains("answered 400 after 1 attempt: "), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[tokio::test]
async fn a_server_that_never_answers_hits_the_request_timeout() {
    let fixture =
        Fixture::start(vec![Reply::Stall(Duration::from_secs(30)), Reply::Stall(Duration::from_secs(30))]).await;
    let mut config = fixture.config();
    config.request_timeout = Duration::from_millis(300);
    config.retry = fast_retry(2);
    let policy = OpenAiPolicy::new(config).unwrap();
    let started = Instant::now();

    let err = policy.respond(&request()).await.unwrap_err();

    let waited = started.elapsed();
    assert!(matches!(err, OpenAiError::Timeout { .. }), "{err:?}");
    assert_eq!(err.category(), "PolicyTimeout");
    assert_eq!(
        err.to_string(),
        format!(
            "policy endpoint {} did not answer within the 300 ms request timeout, after 2 attempts; check the server or raise spec.policy.requestTimeout",
            fixture.base_url
        )
    );
    assert!(waited >= Duration::from_millis(600) && waited < Duration::from_secs(5), "{waited:?}");
}

#[tokio::test]
async fn a_closed_port_is_unreachable_after_bounded_attempts() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut config = OpenAiConfig::new(format!("http://{addr}/v1"), "m");
    config.retry = fast_retry(3);
    let policy = OpenAiPolicy::new(config).unwrap();

    let err = policy.respond(&request()).await.unwrap_err();

    assert_eq!(err.category(), "PolicyUnreachable");
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("cannot reach policy endpoint http://{addr}/v1 after 3 attempts: ")),
        "{message}"
    );
    assert!(message.to_lowercase().contains("refused"), "the cause is named: {message}");
}

#[tokio::test]
async fn missing_logprobs_on_a_tool_turn_are_flagged() {
    let fixture = Fixture::start(vec![
        Reply::ok(completion(json!([tool_call("c", "lookup_order", r#"{"order_id": "A1"}"#)]), Value::Null)),
        Reply::ok(json!({"choices": [{"message": {"content": "It shipped."}, "finish_reason": "stop"}]})),
    ])
    .await;
    let policy = OpenAiPolicy::new(fixture.config()).unwrap();

    let tool_turn = policy.respond(&request()).await.unwrap();
    assert_eq!(tool_turn.logprobs, None);
    assert!(tool_turn.to_policy_turn().logprobs_missing);
    assert!(tool_turn.token_logits().is_empty());

    // A final answer without logprobs is not a tool turn: not flagged.
    let final_turn = policy.respond(&request()).await.unwrap();
    assert!(final_turn.is_final());
    assert!(!final_turn.to_policy_turn().logprobs_missing);
    assert_eq!(final_turn.model, "test-model", "falls back to the configured model");
}

#[tokio::test]
async fn a_200_that_is_not_a_completion_is_a_clear_error() {
    let fixture = Fixture::start(vec![Reply::ok(json!({"object": "list", "data": []}))]).await;
    let policy = OpenAiPolicy::new(fixture.config()).unwrap();

    let err = policy.respond(&request()).await.unwrap_err();

    assert_eq!(fixture.requests().len(), 1, "not retried");
    assert_eq!(err.category(), "PolicyMalformedResponse");
    assert!(err.to_string().contains("missing field `choices`"), "{err}");
}

#[tokio::test]
async fn api_key_from_a_file_is_sent_as_bearer_and_never_shown() {
    let key = "sk-test-file-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("api-key");
    std::fs::write(&key_path, format!("{key}\n")).unwrap();
    let fixture = Fixture::start(vec![
        ok_tool_turn(),
        // A server that echoes the key back in an error.
        Reply::status(401, &format!(r#"{{"error": "invalid key {key}"}}"#)),
    ])
    .await;
    let mut config = fixture.config();
    config.api_key = ApiKeySource::File(key_path.clone());
    let policy = Policy::from_config(&PolicyConfig::OpenAi(Box::new(config))).unwrap();

    policy.respond(&request()).await.unwrap();
    let err = policy.respond(&request()).await.unwrap_err();

    assert_eq!(fixture.requests()[0].authorization.as_deref(), Some(format!("Bearer {key}").as_str()));
    let debug = format!("{policy:?}");
    assert!(!debug.contains(key), "Debug leaks the key: {debug}");
    assert!(debug.contains("<redacted>"), "{debug}");
    assert!(!err.to_string().contains(key), "error leaks the key: {err}");
    assert!(!format!("{err:?}").contains(key));
    assert!(err.to_string().contains("<redacted>"), "{err}");
    assert!(matches!(err, PolicyError::OpenAi(OpenAiError::Status { status: 401, .. })));
}

#[tokio::test]
async fn missing_api_key_variable_fails_at_build_naming_it() {
    let mut config = OpenAiConfig::new("http://127.0.0.1:9/v1", "m");
    config.api_key = ApiKeySource::Env("BASECAMP_POLICY_TEST_KEY_THAT_IS_NOT_SET".into());

    let err = Policy::from_config(&PolicyConfig::OpenAi(Box::new(config))).unwrap_err();

    assert_eq!(err.category(), "PolicyApiKeyMissing");
    assert!(err.to_string().contains("BASECAMP_POLICY_TEST_KEY_THAT_IS_NOT_SET"), "{err}");
}

#[tokio::test]
async fn conversation_history_round_trips_through_the_server() {
    // The assistant turn (with an invalid call kept verbatim) and the tool
    // answers go back to the server in the OpenAI shape.
    let fixture = Fixture::start(vec![
        Reply::ok(completion(json!([tool_call("call_1", "lookup_order", "{oops")]), logprobs())),
        Reply::ok(json!({"choices": [{"message": {"content": "Sorry."}, "finish_reason": "stop"}]})),
    ])
    .await;
    let policy = OpenAiPolicy::new(fixture.config()).unwrap();
    let mut req = request();
    let first = policy.respond(&req).await.unwrap();
    req.messages.to_mut().push(first.to_assistant_message());
    req.messages.to_mut().push(ChatMessage::tool("call_1", r#"{"error": "invalid_json"}"#));
    req.turn = 1;

    let second = policy.respond(&req).await.unwrap();

    assert_eq!(second.content.as_deref(), Some("Sorry."));
    let requests = fixture.requests();
    let messages = &requests[1].body["messages"];
    assert_eq!(messages[2]["role"], "assistant");
    assert_eq!(messages[2]["tool_calls"][0]["function"]["arguments"], "{oops");
    assert_eq!(
        messages[3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "{\"error\": \"invalid_json\"}"})
    );
}

#[tokio::test]
async fn a_status_that_points_at_the_configuration_says_what_to_check() {
    let fixture = Fixture::start(vec![
        Reply::status(404, r#"{"detail": "Not Found"}"#),
        Reply::status(401, r#"{"error": {"message": "invalid api key"}}"#),
    ])
    .await;
    let policy = OpenAiPolicy::new(fixture.config()).unwrap();

    let not_found = policy.respond(&request()).await.unwrap_err().to_string();
    assert!(not_found.contains("answered 404 after 1 attempt: {\"detail\": \"Not Found\"}"), "{not_found}");
    assert!(not_found.contains("check spec.policy.endpoint (`/chat/completions` is appended to it"), "{not_found}");
    let unauthorized = policy.respond(&request()).await.unwrap_err().to_string();
    assert!(
        unauthorized.ends_with("}}; check the API key (spec.policy.apiKeyEnv, apiKeyFile or apiKeySecret)"),
        "{unauthorized}"
    );
}

#[tokio::test]
async fn alternatives_beyond_top_logprobs_are_cut_to_what_the_trace_header_promises() {
    // logprobs() has two alternatives per token; the trace header says top_k 1.
    let fixture = Fixture::start(vec![ok_tool_turn()]).await;
    let mut config = fixture.config();
    config.top_logprobs = 1;
    let policy = OpenAiPolicy::new(config).unwrap();

    let response = policy.respond(&request()).await.unwrap();

    let records = response.token_logits();
    assert_eq!(records.len(), 2);
    assert!(records.iter().all(|r| r.top_ids.len() == 1 && r.top_logprobs.len() == 1), "{records:?}");
    assert_eq!(records[0].top_ids[..], [151657], "the first (most likely) alternative is kept");
    assert_eq!(
        response.warnings,
        vec!["2 token(s) came with more alternatives than the 1 asked for (up to 2); the first 1 were kept"]
    );
}

/// A server that ignores `top_logprobs` sends each token without
/// alternatives: said, not written to the trace as empty top-k lists without
/// a word (before: no warning).
#[tokio::test]
async fn logprobs_without_any_alternative_are_flagged() {
    let bare =
        json!({"content": [{"token": "token_id:5", "logprob": -0.75}, {"token": "token_id:6", "logprob": -0.5}]});
    let fixture = Fixture::start(vec![
        Reply::ok(completion(json!([tool_call("call_1", "lookup_order", r#"{"order_id": "A1"}"#)]), bare)),
        ok_tool_turn(),
    ])
    .await;
    let policy = OpenAiPolicy::new(fixture.config()).unwrap();

    let response = policy.respond(&request()).await.unwrap();
    assert_eq!(response.token_logits().len(), 2, "the tokens are kept");
    assert_eq!(
        response.warnings,
        vec![
            "the logprobs came without alternatives for any of the 2 token(s), though top_logprobs 5 was asked for \
             (does the server honour top_logprobs?): the trace's top-k lists are empty"
        ]
    );
    let response = policy.respond(&request()).await.unwrap();
    assert!(response.warnings.is_empty(), "alternatives sent: {:?}", response.warnings);
}

#[tokio::test]
async fn non_finite_logprobs_as_python_writes_them_keep_the_turn() {
    // Python's json writes -inf and NaN bare; one such value must not cost the turn.
    let body = |value: &str| {
        completion(json!([tool_call("call_1", "lookup_order", r#"{"order_id": "A1"}"#)]), logprobs())
            .to_string()
            .replace("-9.5", value)
    };
    let fixture = Fixture::start(vec![
        Reply::Answer(200, vec![], body("-Infinity")),
        Reply::Answer(200, vec![], body("\"-Infinity\"")),
        Reply::Answer(200, vec![], body("NaN")),
    ])
    .await;
    let policy = OpenAiPolicy::new(fixture.config()).unwrap();

    for form in ["bare", "quoted"] {
        let response = policy.respond(&request()).await.unwrap();
        let records = response.token_logits();
        assert_eq!(records[0].top_logprobs[..], [-0.0001, f32::NEG_INFINITY], "{form}");
        assert!(response.warnings.is_empty(), "{form}: {:?}", response.warnings);
        assert_eq!(response.tool_calls[0].arguments, ToolArguments::Parsed(json!({"order_id": "A1"})));
    }

    let response = policy.respond(&request()).await.unwrap();
    assert_eq!(response.tool_calls.len(), 1, "the turn is kept");
    assert_eq!(response.logprobs, None, "a NaN is never written to the trace");
    assert!(response.to_policy_turn().logprobs_missing);
    assert_eq!(
        response.warnings,
        vec![
            "the logprobs block could not be used and was dropped: alternative 1 of the token at position 0 has \
             logprob NaN"
        ]
    );
}

/// A server on 127.0.0.1 that answers the n-th connection with the n-th
/// raw reply (bytes as they go on the wire), then closes it.
async fn raw_server(replies: Vec<Vec<u8>>) -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let task = tokio::spawn(async move {
        for reply in replies {
            let (mut stream, _) = listener.accept().await.expect("accept");
            // Read the whole request, so closing does not reset the connection.
            let mut request = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let n = stream.read(&mut chunk).await.expect("read request");
                request.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&request);
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text[..end]
                        .lines()
                        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(str::to_owned))
                        .and_then(|n| n.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if request.len() >= end + 4 + length {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            // A client may hang up before the end (an answer it stops reading).
            let _ = stream.write_all(&reply).await;
            let _ = stream.shutdown().await;
        }
    });
    (format!("http://{addr}/v1"), task)
}

fn http_200(body: &[u8], content_length: usize) -> Vec<u8> {
    let mut reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {content_length}\r\nconnection: close\r\n\r\n"
    )
    .into_bytes();
    reply.extend_from_slice(body);
    reply
}

#[tokio::test]
async fn an_answer_cut_off_midway_is_retried() {
    let whole =
        completion(json!([tool_call("call_1", "lookup_order", r#"{"order_id": "A1"}"#)]), logprobs()).to_string();
    let cut = http_200(&whole.as_bytes()[..40], whole.len());
    let (endpoint, server) = raw_server(vec![cut, http_200(whole.as_bytes(), whole.len())]).await;
    let mut config = OpenAiConfig::new(endpoint, "m");
    config.retry = fast_retry(3);
    let policy = OpenAiPolicy::new(config).unwrap();

    let response = policy.respond(&request()).await.unwrap();

    assert_eq!(response.attempts, 2);
    assert_eq!(response.tool_calls[0].name, "lookup_order");
    server.await.unwrap();
}

#[tokio::test]
async fn an_answer_that_is_not_utf8_is_read_and_flagged() {
    let body = b"{\"choices\": [{\"message\": {\"content\": \"caf\xe9\"}, \"finish_reason\": \"stop\"}]}";
    let (endpoint, server) = raw_server(vec![http_200(body, body.len())]).await;
    let policy = OpenAiPolicy::new(OpenAiConfig::new(endpoint, "m")).unwrap();

    let response = policy.respond(&request()).await.unwrap();

    assert_eq!(response.content.as_deref(), Some("caf\u{fffd}"));
    assert_eq!(
        response.warnings,
        vec![
            "the answer is not valid UTF-8 (first bad byte at offset 41); its invalid bytes were replaced with U+FFFD"
        ]
    );
    server.await.unwrap();
}

/// A server that fails every request (500) while the plan step's time runs
/// out ends the episode as the policy's failure, naming the last one: it
/// read `plan_step_timeout` ("the policy did not answer"), the agent's
/// class, so a broken server was counted as a slow agent.
#[tokio::test]
async fn a_plan_step_that_runs_out_while_a_failing_server_is_retried_is_a_policy_error() {
    use basecamp_sandbox::episode::{EpisodeInput, EpisodeRunner};
    use basecamp_sandbox::executor::{NullWrites, ToolExecutor};

    let fixture = Fixture::start(vec![]).await;
    let mut config = fixture.config();
    config.retry = RetryPolicy { max_attempts: 1000, ..fast_retry(1000) };
    let policy = Policy::OpenAi(Box::new(OpenAiPolicy::new(config).unwrap()));
    let runner = EpisodeRunner {
        plan_step_timeout: Duration::from_millis(500),
        ..EpisodeRunner::new(ToolExecutor::new(NullWrites::Warn), policy)
    };
    let input =
        EpisodeInput { id: "e".into(), messages: vec![ChatMessage::user("Where is A1?")], ..Default::default() };
    let dir = tempfile::tempdir().unwrap();
    let result = runner.run(&input, dir.path()).await.unwrap();
    let error = result.error.clone().unwrap_or_default();
    assert_eq!((result.failure_class.as_str(), result.outcome.as_str()), ("policy_error", "error"), "{error}");
    assert!(
        error.starts_with("policy failed: the plan-step timeout of 500ms ran out while its request was retried after"),
        "{error}"
    );
    assert!(error.contains("answered 500") && error.contains("no reply scripted"), "the server's words: {error}");
    assert!(fixture.requests().len() >= 2, "it was retried");
}

/// An answer beyond `max_answer_bytes` fails the turn with a clear error
/// instead of filling the sandbox's memory: said up front by its
/// Content-Length, or found while reading a body sent without one. Not
/// retried: the same request gets the same answer. Before, any answer was
/// read whole, however large.
#[tokio::test]
async fn an_answer_larger_than_the_limit_fails_the_turn_without_being_read_whole() {
    let whole =
        completion(json!([tool_call("call_1", "lookup_order", r#"{"order_id": "A1"}"#)]), logprobs()).to_string();
    let chunked = |body: &[u8]| {
        let mut reply =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for part in body.chunks(64) {
            reply.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
            reply.extend_from_slice(part);
            reply.extend_from_slice(b"\r\n");
        }
        reply.extend_from_slice(b"0\r\n\r\n");
        reply
    };
    let replies = vec![http_200(whole.as_bytes(), whole.len()), chunked(whole.as_bytes()), chunked(whole.as_bytes())];
    let (endpoint, server) = raw_server(replies).await;
    let mut config = OpenAiConfig::new(endpoint, "m");
    config.retry = fast_retry(3);
    config.max_answer_bytes = whole.len() as u64 - 1;
    let policy = OpenAiPolicy::new(config.clone()).unwrap();

    let err = policy.respond(&request()).await.unwrap_err();
    assert_eq!(err.category(), "PolicyAnswerTooLarge");
    let message = err.to_string();
    let limit = whole.len() - 1;
    assert!(message.contains(&format!("more than {limit} bytes (Content-Length: {})", whole.len())), "{message}");
    assert!(message.contains("raw_logits.path"), "{message}");

    // Without a Content-Length: found while reading.
    let err = policy.respond(&request()).await.unwrap_err();
    assert_eq!(err.category(), "PolicyAnswerTooLarge", "{err}");
    assert!(err.to_string().contains(&format!("more than {limit} bytes, the most")), "{err}");

    // Exactly the limit is fine.
    config.max_answer_bytes = whole.len() as u64;
    let response = OpenAiPolicy::new(config).unwrap().respond(&request()).await.unwrap();
    assert_eq!((response.attempts, response.tool_calls[0].name.as_str()), (1, "lookup_order"));
    server.await.unwrap();
}

/// An error answer's body is read only as far as its excerpt needs (64 KiB):
/// a 503 with a huge error page is still a 503, retried as one, and its
/// message says the body went on. Before the cap on answers, any body was
/// read whole; with it alone, such a page would have been "too large".
#[tokio::test]
async fn a_huge_error_page_is_read_in_part_and_its_status_still_decides() {
    let page = "<html>upstream overloaded</html>".repeat(8 * 1024);
    let error = |body: &str| {
        format!("HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
    };
    let whole =
        completion(json!([tool_call("call_1", "lookup_order", r#"{"order_id": "A1"}"#)]), logprobs()).to_string();
    let replies = vec![error(&page), http_200(whole.as_bytes(), whole.len()), error(&page)];
    let (endpoint, server) = raw_server(replies).await;
    let mut config = OpenAiConfig::new(endpoint, "m");
    config.retry = fast_retry(2);
    config.max_answer_bytes = 100_000;
    assert!(page.len() > 200_000, "the page is over the answer cap too");
    let policy = OpenAiPolicy::new(config.clone()).unwrap();
    let response = policy.respond(&request()).await.unwrap();
    assert_eq!(response.attempts, 2, "the 503 was retried");

    config.retry = fast_retry(1);
    let err = OpenAiPolicy::new(config).unwrap().respond(&request()).await.unwrap_err();
    assert_eq!(err.category(), "PolicyServerError", "{err}");
    let message = err.to_string();
    assert!(message.contains("answered 503") && message.contains("<html>upstream overloaded"), "{message}");
    assert!(message.contains("… (more than 65536 bytes)"), "{message}");
    server.await.unwrap();
}
