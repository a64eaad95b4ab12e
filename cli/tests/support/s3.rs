//! The real S3 test server (s3s-fs, installed by `scripts/s3-server.sh
//! install`) on a free loopback port, and the `basecamp` binary pointed at it.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BUCKET: &str = "basecamp-test";
pub const ACCESS_KEY: &str = "basecamp-test-key";
pub const SECRET_KEY: &str = "basecamp-test-secret";

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
        "the S3 test server s3s-fs is not installed at {}: run `scripts/s3-server.sh install` or set BASECAMP_S3S_FS",
        path.display()
    );
    path
}

/// A running s3s-fs serving `data` (each directory a bucket; [`BUCKET`]
/// is created); killed on drop.
pub struct S3Server {
    child: Child,
    pub port: u16,
}

impl S3Server {
    pub fn start(data: &Path) -> Self {
        std::fs::create_dir_all(data.join(BUCKET)).unwrap();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(s3s_fs_binary())
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", ACCESS_KEY])
            .args(["--secret-key", SECRET_KEY])
            .arg(data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start s3s-fs");
        let mut server = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(server.child.try_wait().unwrap().is_none(), "s3s-fs exited during start-up");
            assert!(Instant::now() < deadline, "s3s-fs did not listen within 20 s");
            std::thread::sleep(Duration::from_millis(25));
        }
        server
    }

    /// The environment that points a `basecamp` process at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL_S3", format!("http://127.0.0.1:{}", self.port)),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// `basecamp ARGS` in `dir` against this server.
    pub fn basecamp(&self, args: &[&str], dir: &Path) -> Output {
        basecamp_with_s3(self.port, args, dir)
    }
}

/// `basecamp ARGS` in `dir` with the S3 endpoint at 127.0.0.1:`port`
/// (a closed port for failure tests).
pub fn basecamp_with_s3(port: u16, args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(args)
        .current_dir(dir)
        .env("AWS_ENDPOINT_URL_S3", format!("http://127.0.0.1:{port}"))
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_PROFILE")
        .output()
        .expect("the basecamp binary runs")
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
