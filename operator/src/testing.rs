//! Test helpers: the real S3 server (`basecamp_sandbox::testing::S3Server`,
//! s3s-fs on 127.0.0.1, a fresh port and data directory per test, killed on
//! drop) and storage clients with quick retries.
//!
//! And a mocked API server in the style of controller-rs's
//! ApiServerVerifier: [`verify`] answers a script of expected calls.

use std::time::Duration;

use basecamp_sandbox::storage::{RetryPolicy, StaticCredentials, Storage, StorageConfig};
use http::{Request, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::Value;

pub use basecamp_sandbox::testing::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY, free_port};

/// A storage client for `server` with quick retries.
pub fn storage(server: &S3Server) -> Storage {
    storage_at(&server.endpoint(), 2)
}

/// A storage client for `endpoint` with quick retries.
pub fn storage_at(endpoint: &str, attempts: u32) -> Storage {
    Storage::new(StorageConfig {
        sdk_max_attempts: 1,
        sdk_initial_backoff: Duration::from_millis(10),
        connect_timeout: Duration::from_secs(1),
        attempt_timeout: Duration::from_secs(5),
        ..StorageConfig::default()
            .with_endpoint(endpoint)
            .with_region("us-east-1")
            .with_credentials(StaticCredentials::new(ACCESS_KEY, SECRET_KEY))
            .with_retry(RetryPolicy {
                max_attempts: attempts,
                initial_backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(50),
            })
    })
}

/// A storage client for a port nothing listens on: S3 is down.
pub fn storage_down() -> Storage {
    storage_at(&format!("http://127.0.0.1:{}", free_port()), 1)
}

/// The test side of a mocked API server.
pub type Mock = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// How a scripted call is answered.
pub enum Reply {
    /// This status and body.
    Json(u16, Value),
    /// The request's body back (server-side apply of a whole object).
    Echo,
    /// The request's body with these fields merged in (status, timestamps).
    EchoWith(Value),
}

/// One expected API call and its answer.
pub struct Call {
    method: &'static str,
    path: String,
    reply: Reply,
}

/// An expected call: method, path (without query), answer.
pub fn call(method: &'static str, path: &str, reply: Reply) -> Call {
    Call { method, path: path.to_string(), reply }
}

/// A call as it was made.
#[derive(Debug)]
pub struct Seen {
    /// Path and query.
    pub uri: String,
    /// The JSON body (null when empty).
    pub body: Value,
}

/// `base` with a JSON merge patch applied.
pub fn merge(mut base: Value, extra: &Value) -> Value {
    basecamp_api::profile::merge_patch(&mut base, extra);
    base
}

/// Answers the scripted calls in order; panics on any other call, and on
/// an extra call within 200 ms after the script.
pub async fn verify(mut handle: Mock, script: Vec<Call>) -> Vec<Seen> {
    let mut seen = Vec::new();
    for expected in script {
        let Some((request, send)) = handle.next_request().await else {
            panic!("the operator stopped calling the API; expected {} {}", expected.method, expected.path);
        };
        let method = request.method().to_string();
        let uri = request.uri().to_string();
        let path = request.uri().path().to_string();
        let bytes = request.into_body().collect().await.expect("request body").to_bytes();
        let body: Value =
            if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap_or(Value::Null) };
        assert_eq!(
            (method.as_str(), path.as_str()),
            (expected.method, expected.path.as_str()),
            "unexpected call {method} {uri}\nbody: {body}"
        );
        let (status, reply) = match &expected.reply {
            Reply::Json(status, value) => (*status, value.clone()),
            Reply::Echo => (200, body.clone()),
            Reply::EchoWith(extra) => (200, merge(body.clone(), extra)),
        };
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&reply).expect("json")))
            .expect("response");
        send.send_response(response);
        seen.push(Seen { uri, body });
    }
    if let Ok(Some((request, _))) = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await {
        panic!("an unexpected extra call: {} {}", request.method(), request.uri());
    }
    seen
}
