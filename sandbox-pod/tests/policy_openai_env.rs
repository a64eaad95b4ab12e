//! The policy API key read from an environment variable, sent as `Bearer`
//! to a real server on 127.0.0.1, and absent from every `Debug` output.
//!
//! A test binary of its own with a single test: the variable is set before
//! any other thread exists, so `set_var` cannot race a reader.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use basecamp_sandbox::policy::{ApiKeySource, ChatMessage, OpenAiConfig, Policy, PolicyConfig, PolicyRequest};
use serde_json::json;

const VARIABLE: &str = "BASECAMP_POLICY_ENV_TEST_KEY";
const KEY: &str = "sk-env-test-9876543210";

#[test]
fn api_key_from_the_environment_is_sent_as_bearer_and_never_shown() {
    // SAFETY: this binary runs this one test, and no thread has been started yet.
    unsafe { std::env::set_var(VARIABLE, KEY) };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let app = Router::new()
            .route(
                "/v1/chat/completions",
                post(|State(seen): State<Arc<Mutex<Vec<Option<String>>>>>, headers: HeaderMap| async move {
                    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned);
                    seen.lock().expect("lock").push(auth);
                    axum::Json(json!({"choices": [{"message": {"content": "hello"}, "finish_reason": "stop"}]}))
                }),
            )
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });

        let mut config = OpenAiConfig::new(format!("http://{addr}/v1"), "m");
        config.api_key = ApiKeySource::Env(VARIABLE.into());
        config.request_timeout = Duration::from_secs(5);
        let policy = Policy::from_config(&PolicyConfig::OpenAi(Box::new(config))).expect("policy");
        let request = PolicyRequest::new("ep-1", 0, vec![ChatMessage::user("hi")], vec![]);

        let response = policy.respond(&request).await.expect("response");

        assert_eq!(response.content.as_deref(), Some("hello"));
        assert_eq!(seen.lock().expect("lock").as_slice(), &[Some(format!("Bearer {KEY}"))]);
        let debug = format!("{policy:?} {response:?}");
        assert!(!debug.contains(KEY), "Debug leaks the key: {debug}");
        assert!(debug.contains(VARIABLE), "Debug names where the key comes from: {debug}");
        assert!(!format!("{:?}", response.to_policy_turn()).contains(KEY));
        server.abort();
    });
}
