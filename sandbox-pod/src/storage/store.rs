//! [`Storage`]: the one entry point for moving traces and test sets between
//! the local disk and a [`Destination`], with whole-operation retries.
//!
//! Uploads go in rounds: every pending file is tried once (a few at a time),
//! the ones that failed for a retryable reason wait one backoff and go again,
//! up to `retry.max_attempts` rounds. So an S3 outage costs one backoff per
//! round rather than per file, and every loop is bounded. Nothing is deleted
//! on the local side, whatever happens; the [`UploadReport`] says what
//! arrived and what did not.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::OnceCell;
use tokio::task::JoinSet;

use super::config::StorageConfig;
use super::destination::{Destination, S3Location};
use super::error::{AttemptError, FailureKind, Operation, StorageError};
use super::local;
use super::partition::validate_segment;
use super::report::{FileUpload, UploadReport, UploadStatus};
use super::s3::{DELETE_BATCH, ObjectInfo, S3Backend};

/// Uploads, fetches, lists (recursively or one level of "directories"),
/// checks for and deletes objects, on S3 or a local directory.
///
/// Cheap to clone (shared state). The S3 client is built on first use, so a
/// purely local run never reads AWS configuration.
#[derive(Debug, Clone)]
pub struct Storage {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: StorageConfig,
    s3: OnceCell<S3Backend>,
}

/// One file to put somewhere.
#[derive(Debug, Clone)]
struct Job {
    index: usize,
    path: PathBuf,
    target: Destination,
    size: u64,
}

impl Storage {
    /// A storage client with this configuration.
    pub fn new(config: StorageConfig) -> Self {
        Self { inner: Arc::new(Inner { config, s3: OnceCell::new() }) }
    }

    /// The configuration in use.
    pub fn config(&self) -> &StorageConfig {
        &self.inner.config
    }

    async fn s3(&self) -> &S3Backend {
        self.inner.s3.get_or_init(|| S3Backend::connect(&self.inner.config)).await
    }

    /// Copies one local file to `to` (the full object key or file path),
    /// retrying as configured. The local file is never touched.
    pub async fn upload_file(&self, local: &Path, to: &Destination) -> FileUpload {
        let size = tokio::fs::metadata(local).await.map(|m| m.len()).unwrap_or(0);
        let job = Job { index: 0, path: local.to_path_buf(), target: to.clone(), size };
        let mut done = self.upload_jobs(vec![job]).await;
        done.pop().unwrap_or_else(|| {
            FileUpload::not_attempted(local.to_path_buf(), to.clone(), size, "the upload produced no result")
        })
    }

    /// Copies every file under `dir` (recursively, keeping relative paths)
    /// to the directory `to`, e.g. `dest.for_shard(&partition)`. Every file
    /// is reported, uploaded or failed; unreadable entries are reported as
    /// failed too. Local files are never deleted.
    pub async fn upload_dir(&self, dir: &Path, to: &Destination) -> UploadReport {
        let (found, problems) = local::walk_files(dir).await;
        self.upload_found(found, problems, to).await
    }

    /// Copies the files `relative` (`/`-separated paths under `dir`) to the
    /// directory `to`, keeping their relative paths: what one run wrote into
    /// a directory that may hold more. Every file is reported, uploaded or
    /// failed (one that is missing too). Local files are never deleted.
    pub async fn upload_files(&self, dir: &Path, relative: &[String], to: &Destination) -> UploadReport {
        let (found, problems) = local::stat_files(dir, relative).await;
        self.upload_found(found, problems, to).await
    }

    async fn upload_found(
        &self,
        found: Vec<local::FoundFile>,
        problems: Vec<local::WalkProblem>,
        to: &Destination,
    ) -> UploadReport {
        let mut files: Vec<FileUpload> = Vec::new();
        let mut jobs = Vec::new();
        for file in found {
            let segments: Vec<&str> = file.relative.split('/').collect();
            match segments.iter().try_for_each(|s| validate_segment("file", s)) {
                Ok(()) => jobs.push(Job {
                    index: jobs.len(),
                    target: to.join_validated(&segments),
                    path: file.path,
                    size: file.size,
                }),
                Err(err) => files.push(FileUpload {
                    local: file.path,
                    target: to.clone(),
                    bytes: file.size,
                    attempts: 0,
                    status: UploadStatus::Failed(err),
                }),
            }
        }
        for problem in problems {
            let target = if problem.relative.is_empty() {
                to.clone()
            } else {
                to.join(&problem.relative).unwrap_or_else(|_| to.clone())
            };
            let operation = Operation::Upload { from: problem.path.clone(), to: target.to_string() };
            files.push(FileUpload {
                local: problem.path,
                target,
                bytes: 0,
                attempts: 1,
                status: UploadStatus::Failed(problem.error.into_error(operation, 1)),
            });
        }
        files.extend(self.upload_jobs(jobs).await);
        files.sort_by(|a, b| a.local.cmp(&b.local));
        UploadReport { destination: to.clone(), files }
    }

    /// Runs upload rounds until every job succeeded, failed for good, or
    /// used its attempts. Results come back in job order.
    async fn upload_jobs(&self, jobs: Vec<Job>) -> Vec<FileUpload> {
        let policy = self.inner.config.retry;
        let total = jobs.len();
        let mut results: Vec<Option<FileUpload>> = vec![None; total];
        let mut pending = jobs;
        for attempt in 1..=policy.attempts() {
            if pending.is_empty() {
                break;
            }
            let outcomes = self.run_round(pending).await;
            pending = Vec::new();
            for (job, outcome) in outcomes {
                let operation = Operation::Upload { from: job.path.clone(), to: job.target.to_string() };
                let status = match outcome {
                    Ok(()) => UploadStatus::Uploaded,
                    Err(err) if err.kind.is_retryable() && attempt < policy.attempts() => {
                        tracing::warn!(
                            file = %job.path.display(), target = %job.target, attempt, error = %err.reason,
                            "upload failed; will retry"
                        );
                        pending.push(job);
                        continue;
                    }
                    Err(err) => UploadStatus::Failed(err.into_error(operation, attempt)),
                };
                let slot = results.get_mut(job.index);
                if let Some(slot) = slot {
                    *slot = Some(FileUpload {
                        local: job.path,
                        target: job.target,
                        bytes: job.size,
                        attempts: attempt,
                        status,
                    });
                }
            }
            if !pending.is_empty() && attempt < policy.attempts() {
                tokio::time::sleep(policy.backoff_after(attempt)).await;
            }
        }
        results.into_iter().flatten().collect()
    }

    /// One attempt of each job, at most `concurrency` at a time.
    async fn run_round(&self, jobs: Vec<Job>) -> Vec<(Job, Result<(), AttemptError>)> {
        let limit = self.inner.config.concurrency.max(1);
        let mut queue = jobs.into_iter();
        let mut running: HashMap<tokio::task::Id, Job> = HashMap::new();
        let mut set = JoinSet::new();
        let mut out = Vec::new();
        // Each pass either starts a job or collects one; both sets are finite.
        loop {
            while set.len() < limit {
                let Some(job) = queue.next() else { break };
                let storage = self.clone();
                let spawned = job.clone();
                let handle = set.spawn(async move { storage.put_once(&spawned).await });
                running.insert(handle.id(), job);
            }
            let Some(joined) = set.join_next_with_id().await else { break };
            let (id, result) = match joined {
                Ok((id, result)) => (id, result),
                Err(err) => {
                    (err.id(), Err(AttemptError::new(FailureKind::Other, format!("the upload task failed: {err}"))))
                }
            };
            if let Some(job) = running.remove(&id) {
                out.push((job, result));
            }
        }
        out
    }

    /// One attempt at one file, sized afresh (it may have grown since the walk).
    async fn put_once(&self, job: &Job) -> Result<(), AttemptError> {
        let size =
            tokio::fs::metadata(&job.path).await.map_err(|err| AttemptError::io("cannot read the file", &err))?.len();
        match &job.target {
            Destination::S3(location) => self.s3().await.put_file(&job.path, size, location).await,
            Destination::Local(path) => local::copy_file(&job.path, path).await.map(|_| ()),
        }
    }

    /// Reads one object (or local file) into memory.
    pub async fn fetch(&self, from: &Destination) -> Result<Vec<u8>, StorageError> {
        let operation = Operation::Fetch { from: from.to_string(), to: None };
        refuse_bucket_root(from, &operation)?;
        self.with_retries(operation, || async {
            match from {
                Destination::S3(location) => self.s3().await.get_bytes(location).await,
                Destination::Local(path) => local::read(path).await,
            }
        })
        .await
    }

    /// Copies one object (or local file) to the local file `to`, atomically;
    /// returns the number of bytes.
    pub async fn fetch_to_file(&self, from: &Destination, to: &Path) -> Result<u64, StorageError> {
        let operation = Operation::Fetch { from: from.to_string(), to: Some(to.to_path_buf()) };
        refuse_bucket_root(from, &operation)?;
        self.with_retries(operation, || async {
            match from {
                Destination::S3(location) => self.s3().await.get_to_file(location, to).await,
                Destination::Local(path) => local::copy_file(path, to).await,
            }
        })
        .await
    }

    /// Every object under the prefix, taken as a directory (`s3://b/logs`
    /// lists `logs/...`, not `logs2/...`), in key order. A local directory
    /// that does not exist lists as empty.
    pub async fn list(&self, prefix: &Destination) -> Result<Vec<ObjectInfo>, StorageError> {
        self.with_retries(Operation::List { of: prefix.to_string() }, || async {
            match prefix {
                Destination::S3(location) => self.s3().await.list(location).await,
                Destination::Local(path) => local::list(path).await,
            }
        })
        .await
    }

    /// The names of the "sub-directories" directly under the prefix, taken
    /// as a directory (`s3://b/ckpt` with `ckpt/step-10/a`, `ckpt/step-20/b`
    /// gives `step-10`, `step-20`), in name order, without listing what is
    /// inside them: on S3 a listing with delimiter `/` (its common prefixes,
    /// 1,000 a request), locally the directories in the directory. A local
    /// directory that does not exist has none. Retried like [`Self::list`].
    pub async fn list_dirs(&self, prefix: &Destination) -> Result<Vec<String>, StorageError> {
        self.with_retries(Operation::List { of: prefix.to_string() }, || async {
            match prefix {
                Destination::S3(location) => self.s3().await.list_dirs(location).await,
                Destination::Local(path) => local::list_dirs(path).await,
            }
        })
        .await
    }

    /// One object's (or local file's) size and modification time, without
    /// reading it: on S3 one `HeadObject`. `None` when there is no such
    /// object; `relative` is its name (the last segment of the key). Retried
    /// like [`Self::fetch`].
    pub async fn stat(&self, object: &Destination) -> Result<Option<ObjectInfo>, StorageError> {
        let operation = Operation::Fetch { from: object.to_string(), to: None };
        refuse_bucket_root(object, &operation)?;
        self.with_retries(operation, || async {
            match object {
                Destination::S3(location) => self.s3().await.head(location).await,
                Destination::Local(path) => local::head(path).await,
            }
        })
        .await
    }

    /// Whether the object (or local file) exists, without reading it: on S3
    /// one `HeadObject`, where not found is `false` and any other answer an
    /// error (retried like [`Self::fetch`]); locally, whether it is a file.
    pub async fn exists(&self, object: &Destination) -> Result<bool, StorageError> {
        Ok(self.stat(object).await?.is_some())
    }

    /// Deletes every object under the prefix (taken as a directory) and
    /// returns how many there were. Refuses a whole bucket or `/`. On S3 it
    /// deletes what it listed through [`Self::delete_objects`]; when some
    /// objects stay, the error counts them and names the first.
    pub async fn delete_prefix(&self, prefix: &Destination) -> Result<u64, StorageError> {
        let operation = Operation::DeletePrefix { of: prefix.to_string() };
        match prefix {
            Destination::S3(location) => {
                if location.key.is_empty() {
                    return Err(StorageError::Refused {
                        operation,
                        reason: "the prefix is the whole bucket; name a prefix such as s3://BUCKET/traces/2026".into(),
                    });
                }
                let objects: Vec<Destination> = self.list(prefix).await?.into_iter().map(|o| o.location).collect();
                let deletions = self.delete_objects(&objects).await;
                let failed: Vec<&StorageError> = deletions.iter().filter_map(|d| d.result.as_ref().err()).collect();
                let Some(first) = failed.first() else { return Ok(deletions.len() as u64) };
                let first_reason = match first {
                    StorageError::Failed { operation, reason, .. } => format!("{operation}: {reason}"),
                    other => other.to_string(),
                };
                Err(StorageError::Failed {
                    operation,
                    kind: first.kind().unwrap_or(FailureKind::Other),
                    reason: format!(
                        "{} of {} objects were not deleted, first: {first_reason}",
                        failed.len(),
                        deletions.len()
                    ),
                    attempts: first.attempts(),
                })
            }
            Destination::Local(path) => {
                if path.as_os_str().is_empty() || path.parent().is_none() {
                    return Err(StorageError::Refused {
                        operation,
                        reason: "the path is empty or a file-system root; name the directory to delete".into(),
                    });
                }
                self.with_retries(operation, || local::delete_dir(path)).await
            }
        }
    }

    /// Deletes these objects (or local files), each on its own account, and
    /// says what became of each, in the order given. On S3: one
    /// `DeleteObjects` request per 1,000 keys of a bucket; a request that
    /// fails as a whole is retried as configured, and so is each key that
    /// the answer refuses for a retryable reason (`InternalError`,
    /// `SlowDown`); a key refused for good (`AccessDenied`) fails alone and
    /// the others still go. When a request still fails after its attempts,
    /// the bucket's remaining keys fail with the same error without being
    /// tried (the endpoint or bucket is unusable). An object that is already
    /// gone counts as deleted; a bucket root is refused.
    pub async fn delete_objects(&self, objects: &[Destination]) -> Vec<ObjectDeletion> {
        let mut results: Vec<Option<Result<(), StorageError>>> = vec![None; objects.len()];
        // Keys by bucket, buckets in the order first named.
        let mut buckets: Vec<(String, Vec<(usize, String)>)> = Vec::new();
        for (index, object) in objects.iter().enumerate() {
            let operation = Operation::Delete { object: object.to_string() };
            match object {
                Destination::S3(location) if location.key.is_empty() => {
                    results[index] = Some(Err(StorageError::Refused {
                        operation,
                        reason: "it names a bucket, not an object; write s3://BUCKET/KEY".into(),
                    }));
                }
                Destination::S3(location) => {
                    let key = (index, location.key.clone());
                    match buckets.iter_mut().find(|(bucket, _)| *bucket == location.bucket) {
                        Some((_, keys)) => keys.push(key),
                        None => buckets.push((location.bucket.clone(), vec![key])),
                    }
                }
                Destination::Local(path) => {
                    results[index] = Some(self.with_retries(operation, || local::delete_file(path)).await);
                }
            }
        }
        for (bucket, keys) in &buckets {
            let mut batches = keys.chunks(DELETE_BATCH);
            while let Some(batch) = batches.next() {
                let (done, broken) = self.delete_batch(bucket, batch).await;
                for (index, result) in done {
                    results[index] = Some(result);
                }
                if let Some((err, attempts)) = broken {
                    let undecided = batch.iter().filter(|(index, _)| results[*index].is_none()).collect::<Vec<_>>();
                    for (index, key) in undecided.into_iter().chain(batches.by_ref().flatten()) {
                        let operation = Operation::Delete { object: s3_url(bucket, key) };
                        results[*index] = Some(Err(err.clone().into_error(operation, attempts)));
                    }
                    break;
                }
            }
        }
        objects
            .iter()
            .zip(results)
            .map(|(object, result)| ObjectDeletion {
                object: object.clone(),
                result: result.unwrap_or_else(|| {
                    Err(StorageError::Failed {
                        operation: Operation::Delete { object: object.to_string() },
                        kind: FailureKind::Other,
                        reason: "the deletion produced no result".into(),
                        attempts: 0,
                    })
                }),
            })
            .collect()
    }

    /// Rounds of one `DeleteObjects` batch until every key is deleted or
    /// failed for good: the keys' results, and the error (with its attempt
    /// count) when the request itself failed for good, which leaves the
    /// batch's undecided keys without a result.
    async fn delete_batch(
        &self,
        bucket: &str,
        batch: &[(usize, String)],
    ) -> (Vec<(usize, Result<(), StorageError>)>, Option<(AttemptError, u32)>) {
        let policy = self.inner.config.retry;
        let mut done = Vec::with_capacity(batch.len());
        let mut pending: Vec<&(usize, String)> = batch.iter().collect();
        for attempt in 1..=policy.attempts() {
            let last = attempt == policy.attempts();
            let keys: Vec<String> = pending.iter().map(|(_, key)| key.clone()).collect();
            match self.s3().await.delete_batch(bucket, &keys).await {
                Err(err) if err.kind.is_retryable() && !last => {
                    tracing::warn!(bucket, keys = keys.len(), attempt, error = %err.reason, "DeleteObjects failed; will retry");
                }
                Err(err) => return (done, Some((err, attempt))),
                Ok(refused) => {
                    let refused: HashMap<String, AttemptError> = refused.into_iter().collect();
                    let mut again = Vec::new();
                    for entry in pending {
                        let (index, key) = entry;
                        match refused.get(key) {
                            None => done.push((*index, Ok(()))),
                            Some(err) if err.kind.is_retryable() && !last => again.push(entry),
                            Some(err) => {
                                let operation = Operation::Delete { object: s3_url(bucket, key) };
                                done.push((*index, Err(err.clone().into_error(operation, attempt))));
                            }
                        }
                    }
                    if again.is_empty() {
                        return (done, None);
                    }
                    tracing::warn!(
                        bucket,
                        keys = again.len(),
                        attempt,
                        "DeleteObjects refused some keys; will retry them"
                    );
                    pending = again;
                }
            }
            tokio::time::sleep(policy.backoff_after(attempt)).await;
        }
        (done, None)
    }

    /// Runs `attempt` until it succeeds, fails for good, or used the
    /// configured attempts, with exponential backoff in between.
    async fn with_retries<T, F, Fut>(&self, operation: Operation, mut attempt: F) -> Result<T, StorageError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, AttemptError>>,
    {
        let policy = self.inner.config.retry;
        let mut tried = 0;
        loop {
            tried += 1;
            match attempt().await {
                Ok(value) => return Ok(value),
                Err(err) if err.kind.is_retryable() && tried < policy.attempts() => {
                    tracing::warn!(operation = %operation, attempt = tried, error = %err.reason, "storage operation failed; will retry");
                    tokio::time::sleep(policy.backoff_after(tried)).await;
                }
                Err(err) => return Err(err.into_error(operation, tried)),
            }
        }
    }
}

/// What became of one object given to [`Storage::delete_objects`].
#[derive(Debug, Clone)]
pub struct ObjectDeletion {
    /// The object (or local file).
    pub object: Destination,
    /// Deleted (or already gone), or why it is still there.
    pub result: Result<(), StorageError>,
}

fn s3_url(bucket: &str, key: &str) -> String {
    Destination::S3(S3Location { bucket: bucket.to_string(), key: key.to_string() }).to_string()
}

fn refuse_bucket_root(from: &Destination, operation: &Operation) -> Result<(), StorageError> {
    match from {
        Destination::S3(location) if location.key.is_empty() => Err(StorageError::Refused {
            operation: operation.clone(),
            reason: "it names a bucket, not an object; write s3://BUCKET/KEY".into(),
        }),
        _ => Ok(()),
    }
}
