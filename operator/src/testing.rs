//! Test helpers: a real S3 server (`s3s-fs` on 127.0.0.1, a fresh port and
//! data directory per test, killed on drop) and storage clients with quick
//! retries. The binary comes from `$BASECAMP_S3S_FS` or
//! `${BASECAMP_CACHE:-~/.cache/basecamp}/s3s-fs/bin/s3s-fs`; without it the
//! tests fail and say to run `scripts/s3-server.sh install`.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use basecamp_sandbox::storage::{RetryPolicy, StaticCredentials, Storage, StorageConfig};

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
