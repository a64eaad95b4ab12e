//! Test support (feature `test-support`): the real S3 test server, `s3s-fs`
//! on 127.0.0.1, for this crate's tests and those of the operator and the
//! CLI. The binary comes from `$BASECAMP_S3S_FS` or
//! `${BASECAMP_CACHE:-~/.cache/basecamp}/s3s-fs/bin/s3s-fs`; without it the
//! tests fail and say to run `scripts/s3-server.sh install`. Storage clients
//! stay with each test suite: their retry tuning is part of what they assert.
//! And [`RefusingDeleteServer`], a stand-in for the per-key refusals of
//! `DeleteObjects` that s3s-fs never gives; and the e-commerce example's
//! copies for the signal tests ([`example_copy`], [`never_ready`],
//! [`services_in`]); [`post_repeated`] for request bodies too large to build;
//! [`one_question`], the episode the driver's tests and benchmarks run.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The bucket every test server holds.
pub const BUCKET: &str = "basecamp-test";
/// The server's access key.
pub const ACCESS_KEY: &str = "basecamp-test-key";
/// The server's secret key.
pub const SECRET_KEY: &str = "basecamp-test-secret";

/// The s3s-fs binary, or a failure that says how to install it.
pub fn s3s_fs_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("BASECAMP_S3S_FS") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "BASECAMP_S3S_FS={} is not a file; run scripts/s3-server.sh install", path.display());
        return path;
    }
    let cache = std::env::var_os("BASECAMP_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/basecamp"));
    let path = cache.join("s3s-fs/bin/s3s-fs");
    assert!(
        path.is_file(),
        "the S3 test server s3s-fs is not installed at {}: run `scripts/s3-server.sh install` \
         (a few minutes, once) or set BASECAMP_S3S_FS to its path",
        path.display()
    );
    path
}

/// A port that was free a moment ago (and is closed now).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// A running s3s-fs; killed on drop.
pub struct S3Server {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its data directory (each subdirectory a bucket).
    pub data: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl S3Server {
    /// A server on a fresh port with a fresh data directory holding [`BUCKET`].
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = Self::start_on(free_port(), &dir.path().join("data"));
        server._dir = Some(dir);
        server
    }

    /// A server on `port` serving `data` (created, with [`BUCKET`] in it);
    /// its output goes to `data` with the extension `.log`.
    pub fn start_on(port: u16, data: &Path) -> Self {
        std::fs::create_dir_all(data.join(BUCKET)).expect("create the bucket directory");
        let log = data.with_extension("log");
        let log_file = std::fs::File::create(&log).expect("server log");
        let child = Command::new(s3s_fs_binary())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(data)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log handle"))
            .stderr(log_file)
            .spawn()
            .expect("start s3s-fs");
        let mut server = Self { child, port, data: data.to_path_buf(), _dir: None };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("s3s-fs exited during start-up with {status}:\n{text}");
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            assert!(Instant::now() < deadline, "s3s-fs did not listen on 127.0.0.1:{port} within 20 s");
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stand-in for S3, for what s3s-fs never does: refusing single keys in
/// the body of a 200 `DeleteObjects` answer. A key
/// containing `denied` is refused with `AccessDenied` every time; one
/// containing `flaky` with `InternalError` the first time it is asked for.
/// Every request's keys are recorded.
pub struct RefusingDeleteServer {
    pub port: u16,
    /// The keys of each `DeleteObjects` request, in order.
    pub requests: std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>>,
}

impl RefusingDeleteServer {
    /// Starts it on a free port of 127.0.0.1 (it lives as long as the test process).
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let requests: std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>> = Default::default();
        let seen = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let seen = seen.clone();
                std::thread::spawn(move || serve_deletes(stream, &seen));
            }
        });
        Self { port, requests }
    }
}

/// What [`RefusingDeleteServer`] lists under any prefix: objects last
/// modified on 2020-01-01, 10 bytes each.
pub const PREFIX_LISTING: [&str; 3] = ["runs/ep-1.trace", "runs/denied.trace", "runs/ep-2.trace"];

fn serve_deletes(stream: TcpStream, seen: &std::sync::Mutex<Vec<Vec<String>>>) {
    use std::io::{BufRead, Read, Write};
    let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone the stream"));
    let mut writer = stream;
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header == "\r\n" {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().expect("a content length");
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).expect("read the body");
        if line.starts_with("GET") {
            // A listing: the keys of PREFIX_LISTING, old enough for any cleanup.
            let contents: String = PREFIX_LISTING
                .iter()
                .map(|key| {
                    format!(
                        "<Contents><Key>{key}</Key><LastModified>2020-01-01T00:00:00.000Z</LastModified>\
                         <Size>10</Size></Contents>"
                    )
                })
                .collect();
            let answer = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>{BUCKET}</Name>\
                 <IsTruncated>false</IsTruncated>{contents}</ListBucketResult>"
            );
            let head =
                format!("HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n", answer.len());
            if writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(answer.as_bytes())).is_err() {
                return;
            }
            continue;
        }
        let body = String::from_utf8_lossy(&body);
        let keys: Vec<String> = body
            .split("<Key>")
            .skip(1)
            .filter_map(|rest| rest.split_once("</Key>").map(|(key, _)| key.to_string()))
            .collect();
        let mut all = seen.lock().expect("lock");
        let asked_before = |key: &str| all.iter().flatten().any(|k| k == key);
        let mut answer = String::from(r#"<?xml version="1.0" encoding="UTF-8"?><DeleteResult>"#);
        for key in &keys {
            let code = if key.contains("denied") {
                Some(("AccessDenied", "Access Denied"))
            } else if key.contains("flaky") && !asked_before(key) {
                Some(("InternalError", "We encountered an internal error. Please try again."))
            } else {
                None
            };
            if let Some((code, message)) = code {
                answer.push_str(&format!(
                    "<Error><Key>{key}</Key><Code>{code}</Code><Message>{message}</Message></Error>"
                ));
            }
        }
        answer.push_str("</DeleteResult>");
        all.push(keys);
        drop(all);
        let head =
            format!("HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n", answer.len());
        if writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(answer.as_bytes())).is_err() {
            return;
        }
    }
}

/// `examples/ecommerce` copied into `dir` (canonical path returned): its
/// services are then the only processes working in that directory.
pub fn example_copy(dir: &Path) -> PathBuf {
    fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("a directory for the copy");
        for entry in std::fs::read_dir(from).expect("the example").flatten() {
            let target = to.join(entry.file_name());
            if entry.file_type().expect("a file type").is_dir() {
                copy_tree(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).expect("a copy");
            }
        }
    }
    let project = dir.canonicalize().expect("a directory");
    copy_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ecommerce"), &project);
    project
}

/// Makes a copied example's tracking service one that never becomes ready, allowed 60 s.
pub fn never_ready(project: &Path) {
    std::fs::write(project.join("services/tracking.py"), "import time\ntime.sleep(600)\n").expect("a service");
    for sandbox in ["sandbox-a.yaml", "sandbox-b.yaml"] {
        let path = project.join(sandbox);
        let text = std::fs::read_to_string(&path).expect("a sandbox");
        let text = text.replace("readyPath: /healthz", "readyPath: /healthz\n      readyTimeout: 60s");
        std::fs::write(path, text).expect("a sandbox");
    }
}

/// Waits until a tracking service runs in `project` (see [`services_in`]).
pub fn wait_for_services(project: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while services_in(project).is_empty() {
        assert!(Instant::now() < deadline, "no service started within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until no tracking service runs in `project` any more.
pub fn wait_for_no_services(project: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !services_in(project).is_empty() {
        assert!(Instant::now() < deadline, "services still running after {timeout:?}: {:?}", services_in(project));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The live `python3 services/tracking.py` processes working in `dir`.
pub fn services_in(dir: &Path) -> Vec<u32> {
    let pids =
        std::fs::read_dir("/proc").expect("/proc").flatten().filter_map(|e| e.file_name().to_str()?.parse().ok());
    let tracking = |pid: &u32| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.ends_with(b"services/tracking.py\0"))
            && std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir)
    };
    pids.filter(tracking).collect()
}

/// `POST path` with `body` sent `times` times over a plain connection; the
/// status and the body of the answer. A server that answers before the whole
/// body is sent may close the connection: the rest is not sent, and the
/// answer still read.
pub fn post_repeated(
    addr: impl ToSocketAddrs + std::fmt::Display,
    path: &str,
    body: &[u8],
    times: usize,
) -> (u16, String) {
    let mut stream = TcpStream::connect(&addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("a read timeout");
    let length = body.len() * times;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).expect("the request head");
    for _ in 0..times {
        if stream.write_all(body).is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
}

/// An episode `id` that asks "Where is my order?" and expects nothing: what
/// a test of the driver runs when only how episodes end matters.
pub fn one_question(id: &str) -> crate::episode::EpisodeInput {
    crate::episode::EpisodeInput {
        id: id.into(),
        messages: vec![crate::policy::ChatMessage::user("Where is my order?")],
        initial_memory: Default::default(),
        expected_calls: Vec::new(),
        expected_memory: None,
        expected_memory_hash: None,
        row_id: Some(id.into()),
    }
}
