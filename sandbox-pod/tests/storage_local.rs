//! The storage module with a local-directory destination: the layout,
//! atomic copies, listing, fetching and deleting, and failures that keep
//! the source files.

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use basecamp_sandbox::storage::{Destination, RetryPolicy, ShardPartition, Storage, StorageConfig, UtcDate};

fn storage() -> Storage {
    Storage::new(StorageConfig::default().with_retry(RetryPolicy {
        max_attempts: 2,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(10),
    }))
}

fn partition() -> ShardPartition {
    // An episode that started 2026-03-01T00:00:00.5Z.
    let start = UNIX_EPOCH + Duration::from_millis(1_772_323_200_500);
    let date = UtcDate::from_system_time(start).expect("in range");
    ShardPartition::new(date, "ns", "task", "candidate", 0).expect("valid")
}

fn write(dir: &Path, relative: &str, bytes: &[u8]) {
    let path = dir.join(relative);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, bytes).expect("write");
}

fn all_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(dir).expect("below").display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn copies_a_shard_directory_into_the_date_partitioned_layout() {
    let source = tempfile::tempdir().expect("temp dir");
    let target = tempfile::tempdir().expect("temp dir");
    write(source.path(), "ep-1.trace", b"one");
    write(source.path(), "summary.json", b"{}");
    write(source.path(), "ep-1/rollback_trace.json", b"[]");
    let dest = Destination::parse(target.path().join("traces").to_str().expect("utf-8")).expect("local");
    assert!(!dest.is_s3());

    let report = storage().upload_dir(source.path(), &dest.for_shard(&partition())).await;
    assert!(report.is_complete(), "{report}");
    assert_eq!(report.files.len(), 3);
    assert_eq!(
        all_files(target.path()),
        [
            "traces/2026/03/01/ns/task/candidate/0/ep-1.trace",
            "traces/2026/03/01/ns/task/candidate/0/ep-1/rollback_trace.json",
            "traces/2026/03/01/ns/task/candidate/0/summary.json",
        ],
        "no temporary files are left behind"
    );
    let copied = target.path().join("traces/2026/03/01/ns/task/candidate/0/ep-1.trace");
    assert_eq!(std::fs::read(copied).expect("copied"), b"one");
    assert_eq!(all_files(source.path()).len(), 3, "the source is untouched");

    // A second upload overwrites in place (atomically), still without leftovers.
    write(source.path(), "ep-1.trace", b"one, rewritten");
    assert!(storage().upload_dir(source.path(), &dest.for_shard(&partition())).await.is_complete());
    assert_eq!(all_files(target.path()).len(), 3);
}

#[tokio::test]
async fn lists_fetches_and_deletes_locally() {
    let root = tempfile::tempdir().expect("temp dir");
    write(root.path(), "p/a.trace", b"a");
    write(root.path(), "p/sub/b.trace", b"bb");
    write(root.path(), "q/c.trace", b"c");
    let storage = storage();
    let prefix = Destination::Local(root.path().join("p"));

    let listed = storage.list(&prefix).await.expect("list");
    let got: Vec<(&str, u64)> = listed.iter().map(|o| (o.relative.as_str(), o.size)).collect();
    assert_eq!(got, [("a.trace", 1), ("sub/b.trace", 2)]);
    assert_eq!(storage.fetch(&listed[1].location).await.expect("fetch"), b"bb");
    let out = root.path().join("out/b.copy");
    assert_eq!(storage.fetch_to_file(&listed[1].location, &out).await.expect("fetch to file"), 2);
    assert_eq!(std::fs::read(&out).expect("copied"), b"bb");
    assert!(storage.list(&Destination::Local(root.path().join("missing"))).await.expect("list").is_empty());

    assert_eq!(storage.delete_prefix(&prefix).await.expect("delete"), 2);
    assert!(!root.path().join("p").exists());
    assert!(root.path().join("q/c.trace").exists(), "only the prefix is deleted");
    let err = storage.delete_prefix(&Destination::Local("/".into())).await.expect_err("root");
    assert_eq!(err.category(), "StorageRequestRefused");
}

#[tokio::test]
async fn an_unwritable_destination_reports_every_file_and_keeps_the_sources() {
    let source = tempfile::tempdir().expect("temp dir");
    let target = tempfile::tempdir().expect("temp dir");
    write(source.path(), "ep-1.trace", b"one");
    write(source.path(), "ep-2.trace", b"two");
    // A file where a directory should be: the copy cannot create its parent.
    std::fs::write(target.path().join("blocked"), b"").expect("write");
    let dest = Destination::Local(target.path().join("blocked/traces"));

    let report = storage().upload_dir(source.path(), &dest).await;
    assert_eq!(report.failed().count(), 2, "{report}");
    for (file, err) in report.failed() {
        assert_eq!(err.category(), "LocalIo", "{err}");
        assert_eq!(file.attempts, 1, "a local write error is not retried");
        assert!(err.to_string().starts_with(&format!("failed to upload {} to ", file.local.display())), "{err}");
    }
    assert_eq!(std::fs::read(source.path().join("ep-1.trace")).expect("kept"), b"one");
    assert_eq!(std::fs::read(source.path().join("ep-2.trace")).expect("kept"), b"two");
}

#[tokio::test]
async fn a_missing_source_directory_is_reported_not_ignored() {
    let root = tempfile::tempdir().expect("temp dir");
    let missing = root.path().join("never-written");
    let report = storage().upload_dir(&missing, &Destination::Local(root.path().join("out"))).await;
    assert_eq!(report.files.len(), 1, "{report}");
    let (file, err) = report.failed().next().expect("one failure");
    assert_eq!(file.local, missing);
    assert!(err.to_string().contains("no such file or directory"), "{err}");

    let upload = storage().upload_file(&missing, &Destination::Local(root.path().join("x"))).await;
    assert_eq!(upload.error().map(|e| e.category()), Some("ObjectNotFound"));
}

#[test]
fn keys_use_the_utc_date_passed_in() {
    let late = UtcDate::from_system_time(UNIX_EPOCH + Duration::from_secs(1_767_657_599)).expect("in range");
    let partition = ShardPartition::new(late, "ns", "t", "v", 12).expect("valid");
    assert_eq!(partition.object_key("logs", "ep.trace").expect("valid"), "logs/2026/01/05/ns/t/v/12/ep.trace");
    let dest = Destination::parse("s3://ds-logs/ecommerce-v3").expect("valid");
    assert_eq!(
        dest.for_shard_file(&partition, "summary.json").expect("valid").to_string(),
        "s3://ds-logs/ecommerce-v3/2026/01/05/ns/t/v/12/summary.json"
    );
    assert!(dest.for_shard_file(&partition, "../escape").is_err());
}

#[tokio::test]
async fn list_dirs_names_the_directories_and_exists_checks_one_file() {
    let root = tempfile::tempdir().expect("temp dir");
    write(root.path(), "ckpt/step-10/COMPLETE", b"");
    write(root.path(), "ckpt/step-10/shard-0.bin", b"x");
    write(root.path(), "ckpt/step-20/shard-0.bin", b"x");
    write(root.path(), "ckpt/step-000030/sub/deeper.bin", b"x");
    write(root.path(), "ckpt/README", b"not a directory");
    std::os::unix::fs::symlink(root.path().join("ckpt/step-10"), root.path().join("ckpt/step-40")).expect("symlink");
    let ckpt = Destination::parse(root.path().join("ckpt").to_str().expect("utf-8")).expect("local");
    let at = |relative: &str| ckpt.join(relative).expect("valid");

    let names = storage().list_dirs(&ckpt).await.expect("list dirs");
    assert_eq!(names, ["step-000030", "step-10", "step-20"], "directories only (no file, no link), sorted");
    assert!(storage().list_dirs(&at("step-10")).await.expect("list dirs").is_empty());
    let missing = Destination::parse(root.path().join("nothing").to_str().expect("utf-8")).expect("local");
    assert!(storage().list_dirs(&missing).await.expect("a missing directory has none").is_empty());
    let err = storage().list_dirs(&at("README")).await.expect_err("a file is not a directory");
    assert_eq!(err.category(), "LocalIo", "{err}");
    assert!(err.to_string().starts_with("failed to list "), "{err}");

    assert!(storage().exists(&at("step-10/COMPLETE")).await.expect("stat"));
    assert!(storage().exists(&at("step-40/COMPLETE")).await.expect("stat"), "through a link");
    assert!(!storage().exists(&at("step-20/COMPLETE")).await.expect("stat"));
    assert!(!storage().exists(&at("step-10")).await.expect("stat"), "a directory is not an object");
    assert!(!storage().exists(&at("README/COMPLETE")).await.expect("stat"), "below a file: nothing");
}

#[tokio::test]
async fn exists_reports_a_file_that_cannot_be_checked_as_an_error() {
    // A link loop (a permission problem would do too, except for root).
    let root = tempfile::tempdir().expect("temp dir");
    let ckpt = root.path().join("ckpt");
    std::fs::create_dir_all(&ckpt).expect("mkdir");
    std::os::unix::fs::symlink(ckpt.join("step-10"), ckpt.join("step-10")).expect("a link to itself");
    let marker = Destination::Local(ckpt.join("step-10/COMPLETE"));
    let err = storage().exists(&marker).await.expect_err("a loop is not 'absent'");
    assert_eq!((err.category(), err.attempts()), ("LocalIo", 1), "{err}");
    assert!(err.to_string().starts_with(&format!("failed to fetch {}: cannot stat the file: ", marker)), "{err}");
    assert!(
        storage().list_dirs(&Destination::Local(ckpt)).await.expect("list dirs").is_empty(),
        "a link is no directory"
    );
}
