//! The storage module against a real S3 server: `s3s-fs` (crates.io) on
//! 127.0.0.1, a fresh port and data directory per test, killed when the test
//! ends (a Drop guard).
//!
//! The server is `basecamp_sandbox::testing::S3Server` (feature
//! `test-support`), shared with the operator's and the CLI's tests. s3s-fs serves
//! each directory of its data directory as a bucket, so a test creates its
//! bucket with `mkdir`.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use basecamp_sandbox::storage::{
    Destination, RetryPolicy, ShardPartition, StaticCredentials, Storage, StorageConfig, UtcDate,
};

use basecamp_sandbox::testing::{
    ACCESS_KEY, BUCKET, PREFIX_LISTING, RefusingDeleteServer, S3Server, SECRET_KEY, free_port,
};

fn endpoint(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// Fast retries so failure tests stay short.
fn quick_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy { max_attempts, initial_backoff: Duration::from_millis(50), max_backoff: Duration::from_millis(200) }
}

fn config(port: u16, access_key: &str, secret: &str) -> StorageConfig {
    StorageConfig {
        sdk_max_attempts: 2,
        sdk_initial_backoff: Duration::from_millis(20),
        connect_timeout: Duration::from_secs(2),
        ..StorageConfig::default()
            .with_endpoint(endpoint(port))
            .with_credentials(StaticCredentials::new(access_key, secret))
            .with_retry(quick_retry(3))
    }
}

fn storage_for(port: u16) -> Storage {
    Storage::new(config(port, ACCESS_KEY, SECRET_KEY))
}

/// Deterministic bytes that do not compress (xorshift).
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn partition() -> ShardPartition {
    // 2026-01-05T12:00:00Z, the start of the episode.
    let date = UtcDate::from_unix_seconds(1_767_614_400).expect("valid time");
    ShardPartition::new(date, "team-a", "ecommerce-eval", "baseline", 3).expect("valid partition")
}

fn dest(prefix: &str) -> Destination {
    Destination::parse(&format!("s3://{BUCKET}/{prefix}")).expect("valid destination")
}

/// A shard's output directory: traces, a summary, a nested file, one big trace.
fn write_shard_dir(dir: &Path, big_len: usize) -> Vec<(String, Vec<u8>)> {
    let files = vec![
        ("ep-1.trace".to_string(), pseudo_random(10_000, 1)),
        ("ep-2.trace".to_string(), pseudo_random(1, 2)),
        ("empty.trace".to_string(), Vec::new()),
        ("summary.json".to_string(), br#"{"episodes":2}"#.to_vec()),
        ("ep-2/rollback_trace.json".to_string(), b"{}".to_vec()),
        ("ep-big.trace".to_string(), pseudo_random(big_len, 3)),
    ];
    for (relative, bytes) in &files {
        let path = dir.join(relative);
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write a local file");
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_a_shard_directory_then_lists_fetches_and_deletes_it() {
    let server = S3Server::start();
    let storage = storage_for(server.port);
    let local = tempfile::tempdir().expect("temp dir");
    // 20 MiB: three parts of 8 MiB, 8 MiB and 4 MiB.
    let big_len = 20 * 1024 * 1024 + 123;
    let files = write_shard_dir(local.path(), big_len);
    let shard_dest = dest("traces").for_shard(&partition());
    assert_eq!(shard_dest.to_string(), "s3://basecamp-test/traces/2026/01/05/team-a/ecommerce-eval/baseline/3");

    let started = Instant::now();
    let report = storage.upload_dir(local.path(), &shard_dest).await;
    let upload_time = started.elapsed();
    assert!(report.is_complete(), "{report}");
    assert_eq!(report.files.len(), files.len(), "{report}");
    assert!(report.files.iter().all(|f| f.attempts == 1), "{report}");
    let json = report.to_json();
    assert_eq!(json["uploaded"], files.len());
    assert_eq!(json["failed"], 0);

    // The objects are where DESIGN.md says, byte for byte (s3s-fs stores keys as paths).
    for (relative, bytes) in &files {
        let on_server =
            server.data.join(BUCKET).join("traces/2026/01/05/team-a/ecommerce-eval/baseline/3").join(relative);
        assert_eq!(&std::fs::read(&on_server).expect("object stored"), bytes, "{relative}");
    }

    // The big one went up in three parts: a multipart ETag ends in "-3".
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::new()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(aws_sdk_s3::config::Region::new("us-east-1"))
            .endpoint_url(server.endpoint())
            .force_path_style(true)
            .credentials_provider(aws_sdk_s3::config::Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test"))
            .build(),
    );
    let big_key = format!("traces/{}/ep-big.trace", partition().relative_path());
    let head = s3.head_object().bucket(BUCKET).key(&big_key).send().await.expect("head the big object");
    let etag = head.e_tag().unwrap_or_default().trim_matches('"').to_string();
    assert!(etag.ends_with("-3"), "expected a 3-part multipart ETag, got {etag:?}");
    assert_eq!(head.content_length(), Some(big_len as i64));

    // list: every file, with relative keys and sizes, in key order.
    let listed = storage.list(&dest("traces")).await.expect("list");
    let mut expected: Vec<(String, u64)> =
        files.iter().map(|(r, b)| (format!("{}/{r}", partition().relative_path()), b.len() as u64)).collect();
    expected.sort();
    let got: Vec<(String, u64)> = listed.iter().map(|o| (o.relative.clone(), o.size)).collect();
    assert_eq!(got, expected);
    // A prefix is a directory: "trace" does not list "traces/...".
    assert!(storage.list(&dest("trace")).await.expect("list").is_empty());

    // fetch: to memory and to a file, byte for byte.
    for object in &listed {
        let bytes = storage.fetch(&object.location).await.expect("fetch");
        let (_, original) = files.iter().find(|(r, _)| object.relative.ends_with(r.as_str())).expect("known file");
        assert_eq!(&bytes, original, "{}", object.relative);
    }
    let fetched = local.path().join("fetched/big.trace");
    let big_dest = dest(&big_key);
    let copied = storage.fetch_to_file(&big_dest, &fetched).await.expect("fetch to file");
    assert_eq!(copied, big_len as u64);
    assert_eq!(std::fs::read(&fetched).expect("fetched file"), files[5].1);

    // delete_prefix removes exactly the shard's objects; local files stay.
    let other = local.path().join("fetched/other.json");
    std::fs::write(&other, b"{}").expect("write");
    let kept = storage.upload_file(&other, &dest("other/summary.json")).await;
    assert!(kept.is_uploaded(), "{:?}", kept.error());
    let deleted = storage.delete_prefix(&dest("traces")).await.expect("delete");
    assert_eq!(deleted, files.len() as u64);
    assert!(storage.list(&dest("traces")).await.expect("list").is_empty());
    assert_eq!(storage.list(&dest("other")).await.expect("list").len(), 1);
    for (relative, bytes) in &files {
        assert_eq!(&std::fs::read(local.path().join(relative)).expect("local copy kept"), bytes);
    }
    eprintln!("uploaded {} files ({} bytes) in {upload_time:?}", files.len(), big_len + 10_000 + 1 + 14 + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_run_name_with_an_at_sign_uploads_lists_and_fetches() {
    // operator/TRAINING.md: the evaluation of step N is the run `<task>@step-N`.
    let server = S3Server::start();
    let storage = storage_for(server.port);
    let local = tempfile::tempdir().expect("temp dir");
    std::fs::write(local.path().join("summary.json"), br#"{"task":"ecommerce-eval@step-30"}"#).expect("write");
    std::fs::write(local.path().join("ep-1.trace"), pseudo_random(1000, 7)).expect("write");
    let date = UtcDate::from_unix_seconds(1_767_614_400).expect("valid time");
    let partition = ShardPartition::new(date, "team-a", "ecommerce-eval@step-30", "baseline", 0).expect("valid");
    let shard_dest = dest("traces").for_shard(&partition);
    assert_eq!(shard_dest.to_string(), "s3://basecamp-test/traces/2026/01/05/team-a/ecommerce-eval@step-30/baseline/0");

    let report = storage.upload_dir(local.path(), &shard_dest).await;
    assert!(report.is_complete(), "{report}");
    let on_server = server.data.join(BUCKET).join("traces/2026/01/05/team-a/ecommerce-eval@step-30/baseline/0");
    assert!(on_server.join("summary.json").is_file(), "stored under the literal name");
    let listed = storage.list(&dest("traces/2026/01/05/team-a/ecommerce-eval@step-30")).await.expect("list");
    let names: Vec<&str> = listed.iter().map(|o| o.relative.as_str()).collect();
    assert_eq!(names, ["baseline/0/ep-1.trace", "baseline/0/summary.json"]);
    let summary = storage.fetch(&listed[1].location).await.expect("fetch");
    assert_eq!(summary, br#"{"task":"ecommerce-eval@step-30"}"#);
    // The task's own prefix does not hold the run's objects.
    assert!(storage.list(&dest("traces/2026/01/05/team-a/ecommerce-eval")).await.expect("list").is_empty());
}

#[tokio::test]
async fn refuses_to_delete_a_whole_bucket() {
    // Refused before any request: no server needed.
    let storage = storage_for(free_port());
    let err = storage.delete_prefix(&dest("")).await.expect_err("whole bucket");
    assert_eq!(err.category(), "StorageRequestRefused");
    assert!(err.to_string().contains("whole bucket"), "{err}");
}

#[tokio::test]
async fn wrong_credentials_fail_at_once_with_a_clear_error() {
    let server = S3Server::start();
    let local = tempfile::tempdir().expect("temp dir");
    let file = local.path().join("ep-1.trace");
    std::fs::write(&file, b"trace bytes").expect("write");
    let target = dest("traces/ep-1.trace");

    for (key, secret) in [(ACCESS_KEY, "not-the-secret"), ("no-such-key", SECRET_KEY)] {
        let storage = Storage::new(config(server.port, key, secret));
        let started = Instant::now();
        let upload = storage.upload_file(&file, &target).await;
        let err = upload.error().expect("refused").clone();
        assert_eq!(err.category(), "S3AccessDenied", "{err}");
        // s3s-fs answers 403 before reading the body and closes the
        // connection, so the client often sees "broken pipe" rather than
        // the 403; the storage module asks again without a body, and does
        // not retry.
        assert_eq!(upload.attempts, 1, "credentials errors are not retried: {err}");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("failed to upload {} to s3://basecamp-test/traces/ep-1.trace: ", file.display())),
            "{text}"
        );
        assert!(text.contains("HTTP 403") && text.contains("(after 1 attempt)"), "{text}");
        assert!(text.contains("check the S3 credentials"), "{text}");
        eprintln!("{text}");
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
        assert!(file.exists(), "the local file is kept");

        // A request without a body meets the 403 on its first attempt, and stops there.
        let err = storage.list(&dest("traces")).await.expect_err("refused");
        assert_eq!(err.category(), "S3AccessDenied", "{err}");
        assert!(err.to_string().contains("(after 1 attempt)"), "{err}");
        let err = storage.fetch(&dest("traces/ep-1.trace")).await.expect_err("refused");
        assert_eq!((err.category(), err.attempts()), ("S3AccessDenied", 1), "{err}");
    }
    // Nothing was written on the server.
    assert_eq!(std::fs::read_dir(server.data.join(BUCKET)).expect("bucket dir").count(), 0);
}

#[tokio::test]
async fn missing_objects_and_buckets_are_named() {
    let server = S3Server::start();
    let storage = storage_for(server.port);
    let err = storage.fetch(&dest("no/such.trace")).await.expect_err("missing key");
    assert_eq!(err.category(), "ObjectNotFound", "{err}");
    assert_eq!(err.attempts(), 1);
    assert!(err.to_string().starts_with("failed to fetch s3://basecamp-test/no/such.trace: "), "{err}");

    let err = storage.list(&Destination::parse("s3://no-such-bucket/x").expect("valid")).await.expect_err("bucket");
    assert_eq!(err.category(), "S3NoSuchBucket", "{err}");
    assert!(err.to_string().contains("create the bucket"), "{err}");
    eprintln!("{err}");
}

#[tokio::test]
async fn endpoint_down_reports_every_file_failed_and_keeps_the_local_copies() {
    let port = free_port(); // nothing listens there
    let storage = storage_for(port);
    let local = tempfile::tempdir().expect("temp dir");
    let files = write_shard_dir(local.path(), 9 * 1024 * 1024);
    let shard_dest = dest("traces").for_shard(&partition());

    let started = Instant::now();
    let report = storage.upload_dir(local.path(), &shard_dest).await;
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(30), "bounded time, took {elapsed:?}");
    assert!(!report.is_complete());
    assert_eq!(report.failed().count(), files.len(), "{report}");
    for (file, err) in report.failed() {
        assert_eq!(err.category(), "S3Unreachable", "{err}");
        assert_eq!(file.attempts, 3);
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("failed to upload {} to s3://basecamp-test/traces/", file.local.display())),
            "{text}"
        );
        assert!(text.ends_with("connection refused (after 3 attempts)"), "{text}");
    }
    eprintln!("{report}");
    let json = report.to_json();
    assert_eq!(json["failed"], files.len());
    assert_eq!(json["files"][0]["category"], "S3Unreachable");
    // Nothing lost: every local file is still there, unchanged.
    for (relative, bytes) in &files {
        assert_eq!(&std::fs::read(local.path().join(relative)).expect("local copy kept"), bytes, "{relative}");
    }
    assert!(report.to_string().contains("their local copies are kept"), "{report}");

    let err = storage.fetch(&dest("x")).await.expect_err("down");
    assert_eq!((err.category(), err.attempts()), ("S3Unreachable", 3), "{err}");
    eprintln!("endpoint down: {} files reported failed in {elapsed:?}", files.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_succeeds_once_the_server_is_up() {
    let port = free_port();
    let mut cfg = config(port, ACCESS_KEY, SECRET_KEY);
    cfg.retry = RetryPolicy {
        max_attempts: 6,
        initial_backoff: Duration::from_millis(1500),
        max_backoff: Duration::from_secs(3),
    };
    let storage = Storage::new(cfg);
    let local = tempfile::tempdir().expect("temp dir");
    let files = write_shard_dir(local.path(), 1000);
    let shard_dest = dest("traces").for_shard(&partition());

    let upload = tokio::spawn({
        let storage = storage.clone();
        let dir = local.path().to_path_buf();
        async move { storage.upload_dir(&dir, &shard_dest).await }
    });
    // The first round hits a closed port at once; start the server during its backoff.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let data = local.path().join("server-data");
    let server = tokio::task::spawn_blocking(move || S3Server::start_on(port, &data)).await.expect("server thread");

    let report = tokio::time::timeout(Duration::from_secs(60), upload).await.expect("bounded").expect("joined");
    assert!(report.is_complete(), "{report}");
    assert!(report.files.iter().all(|f| f.attempts >= 2), "the first attempt failed: {:?}", report.files);
    let stored = server.data.join(BUCKET).join("traces").join(partition().relative_path()).join("summary.json");
    assert_eq!(std::fs::read(stored).expect("stored"), br#"{"episodes":2}"#);
    assert_eq!(files.len(), report.files.len());
}

/// A TCP proxy in front of a server that counts the HTTP requests sent
/// through it (request lines) and the bytes that came back, so a test can
/// say what a storage call costs on the wire.
struct CountingProxy {
    port: u16,
    requests: Arc<AtomicUsize>,
    bytes_back: Arc<AtomicU64>,
}

impl CountingProxy {
    async fn start(upstream: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let requests = Arc::new(AtomicUsize::new(0));
        let bytes_back = Arc::new(AtomicU64::new(0));
        let (counted, returned) = (requests.clone(), bytes_back.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { continue };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    // The tail of the previous chunk: a request line may straddle two reads.
                    let mut carry: Vec<u8> = Vec::new();
                    loop {
                        let n = match client_read.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let mut window = std::mem::take(&mut carry);
                        window.extend_from_slice(&buf[..n]);
                        let needle = b" HTTP/1.1\r\n";
                        counted
                            .fetch_add(window.windows(needle.len()).filter(|w| w == needle).count(), Ordering::SeqCst);
                        carry = window[window.len().saturating_sub(needle.len() - 1)..].to_vec();
                        if server_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                let returned = returned.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match server_read.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        returned.fetch_add(n as u64, Ordering::SeqCst);
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self { port, requests, bytes_back }
    }

    /// Requests and bytes since the last call.
    fn take(&self) -> (usize, u64) {
        (self.requests.swap(0, Ordering::SeqCst), self.bytes_back.swap(0, Ordering::SeqCst))
    }
}

/// Writes objects straight into s3s-fs's data directory (it stores a key
/// as a path), much faster than uploading thousands of them.
fn seed_objects(server: &S3Server, keys: impl IntoIterator<Item = String>) {
    for key in keys {
        let path = server.data.join(BUCKET).join(&key);
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
        std::fs::write(path, b"x").expect("write an object");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_dirs_names_the_step_directories_without_listing_their_files() {
    let server = S3Server::start();
    let proxy = CountingProxy::start(server.port).await;
    let storage = storage_for(proxy.port);
    // 1,200 shards in step-10 (more than one listing page), a few elsewhere,
    // a file directly under the root, a deeper-only directory, a sibling prefix.
    seed_objects(&server, (0..1200).map(|i| format!("ckpt/step-10/shard-{i:05}.bin")));
    seed_objects(
        &server,
        [
            "ckpt/step-10/COMPLETE",
            "ckpt/step-20/shard-00000.bin",
            "ckpt/step-000030/sub/deeper.bin",
            "ckpt/dataset/dataset.json",
            "ckpt/README",
            "ckpt2/step-99/shard-00000.bin",
        ]
        .map(String::from),
    );
    proxy.take();

    let names = storage.list_dirs(&dest("ckpt")).await.expect("list dirs");
    assert_eq!(names, ["dataset", "step-000030", "step-10", "step-20"], "children only, in name order");
    let (requests, _) = proxy.take();
    assert_eq!(requests, 1, "four names fit one page however many files they hold");
    // A trailing slash changes nothing; a prefix is a directory ("ckpt" is not "ckpt2").
    assert_eq!(storage.list_dirs(&dest("ckpt/")).await.expect("list dirs"), names);
    assert_eq!(storage.list_dirs(&dest("ckpt/step-10")).await.expect("list dirs"), Vec::<String>::new());
    assert_eq!(storage.list_dirs(&dest("ckpt/step-000030")).await.expect("list dirs"), ["sub"]);
    assert!(storage.list_dirs(&dest("nothing-here")).await.expect("list dirs").is_empty());
    // The whole bucket's top level.
    assert_eq!(storage.list_dirs(&dest("")).await.expect("list dirs"), ["ckpt", "ckpt2"]);
    // The recursive listing of the same root pages through every file.
    proxy.take();
    assert_eq!(storage.list(&dest("ckpt")).await.expect("list").len(), 1205);
    assert_eq!(proxy.take().0, 2, "1,205 keys: two pages of at most 1,000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_dirs_pages_through_more_than_a_thousand_common_prefixes() {
    let server = S3Server::start();
    let proxy = CountingProxy::start(server.port).await;
    let storage = storage_for(proxy.port);
    seed_objects(&server, (0..2345).map(|i| format!("ckpt/step-{i}/COMPLETE")));
    proxy.take();
    let names = storage.list_dirs(&dest("ckpt")).await.expect("list dirs");
    let mut expected: Vec<String> = (0..2345).map(|i| format!("step-{i}")).collect();
    expected.sort();
    assert_eq!(names, expected);
    // s3s-fs counts common prefixes against max-keys (1,000 a page) and
    // continues after the last one, as S3 does.
    assert_eq!(proxy.take().0, 3, "2,345 prefixes: three pages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_checkpoint_poll_costs_before_and_after() {
    // operator/TRAINING.md: a root C with 3 checkpoints of 500 shards each.
    let server = S3Server::start();
    let proxy = CountingProxy::start(server.port).await;
    let storage = storage_for(proxy.port);
    for step in [10, 20, 30] {
        seed_objects(&server, (0..500).map(|i| format!("ckpt/step-{step}/shard-{i:05}.safetensors")));
        seed_objects(&server, [format!("ckpt/step-{step}/COMPLETE")]);
    }
    proxy.take();

    // Before: the whole root, every poll.
    let all = storage.list(&dest("ckpt")).await.expect("list");
    assert_eq!(all.len(), 1503);
    let (before_requests, before_bytes) = proxy.take();

    // After: one delimiter listing, and a HEAD for each step not yet evaluated.
    let dirs = storage.list_dirs(&dest("ckpt")).await.expect("list dirs");
    assert_eq!(dirs, ["step-10", "step-20", "step-30"]);
    let (idle_requests, idle_bytes) = proxy.take();
    for dir in &dirs {
        assert!(storage.exists(&dest(&format!("ckpt/{dir}/COMPLETE"))).await.expect("head"));
    }
    let (head_requests, head_bytes) = proxy.take();

    assert_eq!(before_requests, 2, "1,503 keys: two list pages");
    assert_eq!(idle_requests, 1, "every step evaluated already: one listing");
    assert_eq!(head_requests, 3, "one HEAD per checked marker");
    assert!(idle_bytes * 50 < before_bytes, "{idle_bytes} vs {before_bytes} bytes");
    eprintln!(
        "one poll of 3 x 500 files: before {before_requests} requests / {before_bytes} bytes back; \
         after {idle_requests} request / {idle_bytes} bytes (all evaluated), \
         {} requests / {} bytes (all three new)",
        idle_requests + head_requests,
        idle_bytes + head_bytes
    );
}

#[tokio::test]
async fn exists_is_a_head_request_and_only_not_found_is_false() {
    let server = S3Server::start();
    let storage = storage_for(server.port);
    seed_objects(&server, ["ckpt/step-10/COMPLETE".to_string(), "ckpt/step-10/model.bin".to_string()]);
    assert!(storage.exists(&dest("ckpt/step-10/COMPLETE")).await.expect("head"));
    assert!(!storage.exists(&dest("ckpt/step-20/COMPLETE")).await.expect("head"));
    assert!(!storage.exists(&dest("ckpt/step-10/COMPLET")).await.expect("head"));

    // A missing bucket: s3s-fs answers NoSuchBucket, but a HEAD answer has
    // no body to say so, and the SDK sees a bare 404 (as with AWS).
    assert!(!storage.exists(&Destination::parse("s3://no-such-bucket/x").expect("valid")).await.expect("head"));
    let err = storage.exists(&dest("")).await.expect_err("a bucket is not an object");
    assert_eq!(err.category(), "StorageRequestRefused", "{err}");

    // Wrong credentials: an error at once, not "absent".
    let denied = Storage::new(config(server.port, ACCESS_KEY, "not-the-secret"));
    let err = denied.exists(&dest("ckpt/step-10/COMPLETE")).await.expect_err("refused");
    assert_eq!((err.category(), err.attempts()), ("S3AccessDenied", 1), "{err}");
    assert!(err.to_string().starts_with("failed to fetch s3://basecamp-test/ckpt/step-10/COMPLETE: "), "{err}");
    let err = denied.list_dirs(&dest("ckpt")).await.expect_err("refused");
    assert_eq!((err.category(), err.attempts()), ("S3AccessDenied", 1), "{err}");

    // The endpoint down: retried, then an error.
    let down = storage_for(free_port());
    let err = down.exists(&dest("ckpt/step-10/COMPLETE")).await.expect_err("down");
    assert_eq!((err.category(), err.attempts()), ("S3Unreachable", 3), "{err}");
    let err = down.list_dirs(&dest("ckpt")).await.expect_err("down");
    assert_eq!((err.category(), err.attempts()), ("S3Unreachable", 3), "{err}");
    assert!(err.to_string().starts_with("failed to list s3://basecamp-test/ckpt: "), "{err}");
}

/// Runs only inside the child process started by
/// `the_standard_credential_chain_reads_env_and_profile`, where the
/// environment holds the credentials (env vars are process-wide, so the
/// parent test does not touch its own).
#[tokio::test]
async fn credential_chain_child() {
    let Ok(expect) = std::env::var("BASECAMP_TEST_CHAIN_EXPECT") else { return };
    let storage =
        Storage::new(StorageConfig { sdk_max_attempts: 1, retry: quick_retry(1), ..StorageConfig::from_env() });
    let result = storage.list(&dest("")).await;
    match expect.as_str() {
        "ok" => {
            result.expect("credentials from the chain are accepted");
        }
        "none" => {
            let err = result.expect_err("no credentials anywhere");
            assert_eq!(err.category(), "S3AccessDenied", "{err}");
            assert!(err.to_string().contains("no usable credentials"), "{err}");
        }
        _ => {
            let err = result.expect_err("wrong credentials from the chain are refused");
            assert_eq!(err.category(), "S3AccessDenied", "{err}");
        }
    }
}

#[test]
fn the_standard_credential_chain_reads_env_and_profile() {
    let server = S3Server::start();
    let home = tempfile::tempdir().expect("temp dir");
    let credentials = home.path().join("credentials");
    std::fs::write(
        &credentials,
        format!(
            "[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n\
             [basecamp]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
        ),
    )
    .expect("write credentials file");
    let config_file = home.path().join("config");
    std::fs::write(&config_file, "").expect("write config file");

    let run_child = |env: &[(&str, &str)], expect: &str| {
        let mut command = Command::new(std::env::current_exe().expect("test binary"));
        command.args(["--exact", "credential_chain_child", "--nocapture"]);
        for name in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_ROLE_ARN",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
        ] {
            command.env_remove(name);
        }
        command
            .env("AWS_ENDPOINT_URL", server.endpoint())
            .env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .env("AWS_CONFIG_FILE", &config_file)
            // No instance metadata service here: fail fast instead of probing it.
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("HOME", home.path())
            .env("BASECAMP_TEST_CHAIN_EXPECT", expect);
        for (name, value) in env {
            command.env(name, value);
        }
        let out = command.output().expect("run the child test");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "child with {env:?} expecting {expect}:\n{text}");
        assert!(text.contains("1 passed"), "the child test ran:\n{text}");
    };
    // Environment variables win over the profile file.
    run_child(&[("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY)], "ok");
    run_child(&[("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", "wrong")], "denied");
    // Without them, the named profile, then the default one.
    run_child(&[("AWS_PROFILE", "basecamp")], "ok");
    run_child(&[], "denied");
    // Nothing anywhere: a clear error, not a hang on the metadata service.
    let empty = home.path().join("empty");
    std::fs::write(&empty, "").expect("write empty credentials file");
    run_child(&[("AWS_SHARED_CREDENTIALS_FILE", empty.to_str().expect("utf-8"))], "none");
}

/// Puts an object straight into s3s-fs's data directory with this age:
/// s3s-fs gives the backing file's modification time as `LastModified`.
fn seed_aged(server: &S3Server, key: &str, bytes: &[u8], age: Duration) -> std::time::SystemTime {
    let path = server.data.join(BUCKET).join(key);
    std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
    std::fs::write(&path, bytes).expect("write an object");
    let when = std::time::SystemTime::now() - age;
    std::fs::File::options().write(true).open(&path).expect("open").set_modified(when).expect("set the mtime");
    when
}

fn seconds_apart(a: std::time::SystemTime, b: std::time::SystemTime) -> f64 {
    a.duration_since(b).unwrap_or_else(|e| e.duration()).as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_carry_last_modified_and_delete_objects_goes_object_by_object() {
    let server = S3Server::start();
    let storage = storage_for(server.port);
    let day = Duration::from_secs(86_400);
    let old = seed_aged(&server, "runs/a/ep-1.trace", &[1; 100], 30 * day);
    let new = seed_aged(&server, "runs/a/ep-2.trace", &[2; 50], Duration::ZERO);
    seed_aged(&server, "runs/a/summary.json", b"{}", 30 * day);

    let listed = storage.list(&dest("runs")).await.expect("list");
    let got: Vec<(&str, u64)> = listed.iter().map(|o| (o.relative.as_str(), o.size)).collect();
    assert_eq!(got, [("a/ep-1.trace", 100), ("a/ep-2.trace", 50), ("a/summary.json", 2)]);
    // S3 timestamps have millisecond (AWS: second) precision.
    let modified = listed[0].last_modified.expect("LastModified listed");
    assert!(seconds_apart(modified, old) < 1.0, "{modified:?} vs {old:?}");
    assert!(seconds_apart(listed[1].last_modified.expect("LastModified listed"), new) < 1.0);

    // stat: one HEAD, the same size and time; a missing key is None.
    let one = storage.stat(&dest("runs/a/ep-1.trace")).await.expect("head").expect("exists");
    assert_eq!((one.relative.as_str(), one.size), ("ep-1.trace", 100));
    assert!(seconds_apart(one.last_modified.expect("LastModified"), old) < 1.0);
    assert!(storage.stat(&dest("runs/a/ep-9.trace")).await.expect("head").is_none());

    // A local listing carries modification times too.
    let local = tempfile::tempdir().expect("temp dir");
    std::fs::write(local.path().join("x.trace"), b"x").expect("write");
    let listed_here = storage.list(&Destination::Local(local.path().to_path_buf())).await.expect("list");
    assert!(seconds_apart(listed_here[0].last_modified.expect("mtime"), std::time::SystemTime::now()) < 60.0);

    // delete_objects: each object its own result, in order; a key already
    // gone counts as deleted; a bucket root is refused; local files go too.
    let targets = [
        dest("runs/a/ep-1.trace"),
        dest("runs/a/never-there.trace"),
        dest(""),
        Destination::Local(local.path().join("x.trace")),
    ];
    let deletions = storage.delete_objects(&targets).await;
    assert_eq!(deletions.len(), 4);
    for (deletion, target) in deletions.iter().zip(&targets) {
        assert_eq!(&deletion.object, target);
    }
    assert!(deletions[0].result.is_ok(), "{:?}", deletions[0].result);
    assert!(deletions[1].result.is_ok(), "{:?}", deletions[1].result);
    let refused = deletions[2].result.as_ref().expect_err("a bucket is not an object");
    assert_eq!(refused.category(), "StorageRequestRefused", "{refused}");
    assert!(deletions[3].result.is_ok(), "{:?}", deletions[3].result);
    assert!(!local.path().join("x.trace").exists());
    let left: Vec<String> = storage.list(&dest("runs")).await.expect("list").into_iter().map(|o| o.relative).collect();
    assert_eq!(left, ["a/ep-2.trace", "a/summary.json"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_objects_sends_at_most_a_thousand_keys_a_request() {
    let server = S3Server::start();
    let proxy = CountingProxy::start(server.port).await;
    let storage = storage_for(proxy.port);
    seed_objects(&server, (0..2345).map(|i| format!("many/ep-{i:05}.trace")));
    seed_objects(&server, ["other/keep.trace".to_string()]);
    let targets: Vec<Destination> = (0..2345).map(|i| dest(&format!("many/ep-{i:05}.trace"))).collect();
    proxy.take();
    let deletions = storage.delete_objects(&targets).await;
    assert_eq!(proxy.take().0, 3, "2,345 keys: three DeleteObjects requests");
    assert!(deletions.iter().all(|d| d.result.is_ok()));
    assert!(storage.list(&dest("many")).await.expect("list").is_empty());
    assert_eq!(storage.list(&dest("other")).await.expect("list").len(), 1);
}

#[tokio::test]
async fn delete_objects_with_the_endpoint_down_fails_every_key_by_name() {
    let storage = storage_for(free_port());
    let targets = [dest("runs/ep-1.trace"), dest("runs/ep-2.trace")];
    let deletions = storage.delete_objects(&targets).await;
    for (deletion, key) in deletions.iter().zip(["runs/ep-1.trace", "runs/ep-2.trace"]) {
        let err = deletion.result.as_ref().expect_err("the endpoint is down");
        assert_eq!((err.category(), err.attempts()), ("S3Unreachable", 3), "{err}");
        assert!(err.to_string().starts_with(&format!("failed to delete s3://{BUCKET}/{key}: ")), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_refused_in_a_delete_answer_fail_alone_and_retryable_ones_go_again() {
    let server = RefusingDeleteServer::start();
    let storage = storage_for(server.port);
    let keys = ["runs/ep-1.trace", "runs/denied.trace", "runs/flaky.trace", "runs/ep-2.trace"];
    let targets: Vec<Destination> = keys.iter().map(|k| dest(k)).collect();
    let deletions = storage.delete_objects(&targets).await;

    let requests = server.requests.lock().expect("lock").clone();
    assert_eq!(requests, [keys.to_vec(), vec!["runs/flaky.trace"]], "only the retryable refusal went again");
    for index in [0, 2, 3] {
        assert!(deletions[index].result.is_ok(), "{}: {:?}", keys[index], deletions[index].result);
    }
    let err = deletions[1].result.as_ref().expect_err("refused");
    assert_eq!((err.category(), err.attempts()), ("S3AccessDenied", 1), "{err}");
    assert!(
        err.to_string().starts_with(&format!(
            "failed to delete s3://{BUCKET}/runs/denied.trace: AccessDenied: Access Denied (after 1 attempt)"
        )),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_prefix_counts_the_keys_refused_in_the_answer_and_names_the_first() {
    // The operator's retention Delete: a policy that protects one key must
    // not read as success.
    let server = RefusingDeleteServer::start();
    let storage = storage_for(server.port);
    let err = storage.delete_prefix(&dest("runs")).await.expect_err("one key refused");
    assert_eq!((err.category(), err.attempts()), ("S3AccessDenied", 1), "{err}");
    assert!(
        err.to_string().starts_with(&format!(
            "failed to delete everything under s3://{BUCKET}/runs: 1 of 3 objects were not deleted, \
             first: delete s3://{BUCKET}/runs/denied.trace: AccessDenied: Access Denied (after 1 attempt)"
        )),
        "{err}"
    );
    assert_eq!(server.requests.lock().expect("lock").clone(), [PREFIX_LISTING.to_vec()]);
}
