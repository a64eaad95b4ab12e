//! Test helpers: a real S3 server (`s3s-fs` on 127.0.0.1, a fresh port and
//! data directory per test, killed on drop) and storage clients with quick
//! retries. The binary comes from `$BASECAMP_S3S_FS` or
//! `${BASECAMP_CACHE:-~/.cache/basecamp}/s3s-fs/bin/s3s-fs`; without it the
//! tests fail and say to run `scripts/s3-server.sh install`.
//!
//! And a mocked API server in the style of controller-rs's
//! ApiServerVerifier: [`verify`] answers a script of expected calls.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use basecamp_sandbox::storage::{RetryPolicy, StaticCredentials, Storage, StorageConfig};
use http::{Request, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::Value;

/// The bucket every test server holds.
pub const BUCKET: &str = "basecamp-test";
const ACCESS_KEY: &str = "basecamp-test-key";
const SECRET_KEY: &str = "basecamp-test-secret";

fn s3s_fs_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("BASECAMP_S3S_FS") {
        return PathBuf::from(path);
    }
    let cache = std::env::var_os("BASECAMP_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/basecamp"));
    let path = cache.join("s3s-fs/bin/s3s-fs");
    assert!(
        path.is_file(),
        "the S3 test server s3s-fs is not installed at {}: run `scripts/s3-server.sh install` (once) or set BASECAMP_S3S_FS",
        path.display()
    );
    path
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// A running s3s-fs; killed on drop.
pub struct S3Server {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its data directory (each subdirectory a bucket).
    pub data: PathBuf,
    _dir: tempfile::TempDir,
}

impl S3Server {
    /// A fresh server holding an empty [`BUCKET`].
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join(BUCKET)).expect("bucket dir");
        let port = free_port();
        let log = dir.path().join("s3s-fs.log");
        let log_file = std::fs::File::create(&log).expect("log");
        let child = Command::new(s3s_fs_binary())
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--access-key",
                ACCESS_KEY,
                "--secret-key",
                SECRET_KEY,
            ])
            .arg(&data)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file)
            .spawn()
            .expect("start s3s-fs");
        let mut server = Self { child, port, data, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "s3s-fs exited during start-up with {status}:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            assert!(Instant::now() < deadline, "s3s-fs did not listen within 20 s");
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// A storage client for this server.
    pub fn storage(&self) -> Storage {
        storage_at(&format!("http://127.0.0.1:{}", self.port), 2)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
