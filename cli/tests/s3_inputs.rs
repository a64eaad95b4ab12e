//! The trace commands on `s3://` prefixes, against a real S3 server
//! (`s3s-fs` from crates.io on 127.0.0.1, installed by `scripts/s3-server.sh
//! install`; `make test` does that first). s3s-fs serves a directory, so
//! the test puts traces in place as files and reads them back over S3.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use basecamp_trace::synthetic::{EpisodeShape, generate};

const BUCKET: &str = "basecamp-test";
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
        "the S3 test server s3s-fs is not installed at {}: run `scripts/s3-server.sh install` or set BASECAMP_S3S_FS",
        path.display()
    );
    path
}

/// A running s3s-fs serving `data`; killed on drop.
struct S3Server {
    child: Child,
    port: u16,
}

impl S3Server {
    fn start(data: &Path) -> Self {
        std::fs::create_dir_all(data.join(BUCKET)).unwrap();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
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

    fn basecamp(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(args)
            .env("AWS_ENDPOINT_URL_S3", format!("http://127.0.0.1:{}", self.port))
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env_remove("AWS_PROFILE")
            .output()
            .expect("the basecamp binary runs")
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn search_validate_export_and_archive_read_s3_prefixes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let local = dir.path().join("local");
    let run = data.join(BUCKET).join("runs/2026/shard-0");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    for seed in 1..=3 {
        let bytes = generate(&EpisodeShape { seed, steps: 30, tokens_per_step: 2, ..Default::default() })
            .write_to(Vec::new(), 3)
            .unwrap();
        std::fs::write(run.join(format!("ep-{seed}.trace")), &bytes).unwrap();
        std::fs::write(local.join(format!("ep-{seed}.trace")), &bytes).unwrap();
    }
    std::fs::write(run.join("summary.json"), "{}").unwrap();
    let server = S3Server::start(&data);
    let prefix = format!("s3://{BUCKET}/runs/2026");
    let query = "exists(error_context)";

    // The same matches as the local copies, named by their s3:// URLs.
    let remote = server.basecamp(&["trace", "search", query, &prefix]);
    assert_eq!(remote.status.code(), Some(0), "{}", text(&remote.stderr));
    let here = server.basecamp(&["trace", "search", query, &local.display().to_string()]);
    let local_prefix = format!("{}/", local.display());
    let remote_prefix = format!("s3://{BUCKET}/runs/2026/shard-0/");
    assert!(!here.stdout.is_empty());
    assert_eq!(text(&remote.stdout), text(&here.stdout).replace(&local_prefix, &remote_prefix));

    let out = server.basecamp(&["trace", "validate", &prefix]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(text(&out.stderr), "3 traces checked: all valid\n");

    let out = server.basecamp(&["trace", "export", "--otlp", &format!("{prefix}/shard-0/ep-2.trace")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), 1);

    let archive = dir.path().join("runs.tar.zst");
    let out = server.basecamp(&["trace", "archive", &prefix, "-o", &archive.display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = server.basecamp(&["trace", "archive", "list", &archive.display().to_string()]);
    assert_eq!(text(&out.stdout).lines().count(), 4);

    let out = server.basecamp(&["trace", "search", query, &format!("s3://{BUCKET}/nothing-here")]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), format!("error: s3://{BUCKET}/nothing-here: no .trace objects under this prefix\n"));
}
