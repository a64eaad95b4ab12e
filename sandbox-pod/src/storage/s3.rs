//! The S3 side: one attempt of each operation through `aws-sdk-s3`, and the
//! translation of SDK errors into a bounded [`FailureKind`] with a short
//! reason ("connection refused", "InvalidAccessKeyId: ... (HTTP 403)").
//!
//! Retrying whole operations is the caller's job ([`super::Storage`]); the
//! SDK's own standard retry mode still retries single requests underneath.
//! Files above the multipart threshold go up in parts read one at a time,
//! so memory stays at one part whatever the file size.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::environment::EnvironmentVariableRegionProvider;
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::ProfileFileRegionProvider;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_s3::Client;
use aws_sdk_s3::config::Credentials;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::list_objects_v2::ListObjectsV2Output;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier};
use tokio::io::AsyncReadExt;

use super::config::StorageConfig;
use super::destination::{Destination, S3Location};
use super::error::{AttemptError, FailureKind, io_reason};
use super::local;

/// S3 allows at most this many parts in one multipart upload.
const MAX_PARTS: u64 = 10_000;
/// A listing stops with an error after this many pages (1,000 keys each).
const MAX_LIST_PAGES: usize = 10_000;
/// `DeleteObjects` takes at most this many keys.
pub(crate) const DELETE_BATCH: usize = 1000;

/// One object found by a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Where it is: give it to `fetch` as is.
    pub location: Destination,
    /// Its key relative to the listed prefix, `/`-separated (`ep-1.trace`, `3/summary.json`).
    pub relative: String,
    /// Size in bytes.
    pub size: u64,
    /// When it was last written: S3's `LastModified`, a local file's
    /// modification time; `None` when the server or file system gave none.
    pub last_modified: Option<SystemTime>,
}

/// An S3 client configured once from a [`StorageConfig`].
#[derive(Debug, Clone)]
pub(crate) struct S3Backend {
    client: Client,
    multipart_threshold: u64,
    part_size: u64,
}

impl S3Backend {
    /// Builds the client: region from the config, the environment, the
    /// profile, then `us-east-1` (never the instance metadata service, which
    /// would stall a laptop for seconds); credentials explicit or from the
    /// standard chain; the SDK's standard retries and timeouts.
    pub async fn connect(config: &StorageConfig) -> Self {
        let region = match &config.region {
            Some(region) => RegionProviderChain::first_try(Region::new(region.clone())),
            None => RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
                .or_else(ProfileFileRegionProvider::new())
                .or_else(Region::from_static("us-east-1")),
        };
        let retry = RetryConfig::standard()
            .with_max_attempts(config.sdk_max_attempts.max(1))
            .with_initial_backoff(config.sdk_initial_backoff);
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .operation_attempt_timeout(config.attempt_timeout)
            .build();
        let mut loader =
            aws_config::defaults(BehaviorVersion::latest()).region(region).retry_config(retry).timeout_config(timeouts);
        if let Some(creds) = &config.credentials {
            loader = loader.credentials_provider(Credentials::new(
                creds.access_key_id.clone(),
                creds.secret_access_key.clone(),
                creds.session_token.clone(),
                None,
                "basecamp-static",
            ));
        }
        if let Some(url) = &config.endpoint_url {
            loader = loader.endpoint_url(url.clone());
        }
        let sdk_config = loader.load().await;
        let s3_config =
            aws_sdk_s3::config::Builder::from(&sdk_config).force_path_style(config.force_path_style).build();
        Self {
            client: Client::from_conf(s3_config),
            multipart_threshold: config.multipart_threshold,
            part_size: config.effective_part_size(),
        }
    }

    /// Uploads one local file of `size` bytes, in one request or in parts.
    pub async fn put_file(&self, path: &Path, size: u64, to: &S3Location) -> Result<(), AttemptError> {
        if size > self.multipart_threshold {
            return self.put_multipart(path, size, to).await;
        }
        let body = ByteStream::from_path(path)
            .await
            .map_err(|err| AttemptError::new(FailureKind::LocalIo, format!("cannot read {}: {err}", path.display())))?;
        match self.client.put_object().bucket(&to.bucket).key(&to.key).body(body).send().await {
            Ok(_) => Ok(()),
            Err(err) => Err(self.explain_broken_write(&err, to).await),
        }
    }

    /// A server that refuses a request (bad signature, unknown key, no such
    /// bucket) may answer before reading the body and close the connection;
    /// the client then sees "broken pipe" instead of the answer, which would
    /// pass for a network fault and be retried in vain. After such a break,
    /// a bodiless request (a one-key listing) asks the question again; only
    /// answers that cannot come from missing permissions (credentials that
    /// do not exist or do not sign, a missing bucket) replace the error.
    async fn explain_broken_write<E>(&self, err: &SdkError<E, HttpResponse>, to: &S3Location) -> AttemptError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let attempt = classify(err);
        if !broke_mid_request(err) {
            return attempt;
        }
        let probe = self.client.list_objects_v2().bucket(&to.bucket).prefix(&to.key).max_keys(1).send().await;
        let Err(SdkError::ServiceError(service)) = probe else { return attempt };
        let code = service.err().code();
        let answer = classify_service(service.raw().status().as_u16(), code, service.err().message());
        let conclusive = answer.kind == FailureKind::NoSuchBucket
            || (answer.kind == FailureKind::AccessDenied && code.is_some_and(|c| c != "AccessDenied"));
        if conclusive { answer } else { attempt }
    }

    async fn put_multipart(&self, path: &Path, size: u64, to: &S3Location) -> Result<(), AttemptError> {
        // Keep within S3's 10,000 parts by growing the part size if needed.
        let part_size = self.part_size.max(size.div_ceil(MAX_PARTS));
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&to.bucket)
            .key(&to.key)
            .checksum_algorithm(ChecksumAlgorithm::Crc32)
            .send()
            .await
            .map_err(|err| classify(&err))?;
        let upload_id = created
            .upload_id()
            .ok_or_else(|| {
                AttemptError::new(FailureKind::Other, "the server started a multipart upload without an id")
            })?
            .to_string();
        let result = self.send_parts(path, size, part_size, to, &upload_id).await;
        if result.is_err() {
            // Best effort: a failed abort leaves parts that the bucket's
            // lifecycle rule (or the next successful attempt) cleans up.
            let abort =
                self.client.abort_multipart_upload().bucket(&to.bucket).key(&to.key).upload_id(&upload_id).send().await;
            if let Err(err) = abort {
                tracing::warn!(key = %to, error = %classify(&err).reason, "could not abort a failed multipart upload");
            }
        }
        result
    }

    async fn send_parts(
        &self,
        path: &Path,
        size: u64,
        part_size: u64,
        to: &S3Location,
        upload_id: &str,
    ) -> Result<(), AttemptError> {
        let mut file =
            tokio::fs::File::open(path).await.map_err(|err| AttemptError::io("cannot open the file", &err))?;
        let part_count = size.div_ceil(part_size);
        let mut parts = Vec::new();
        for index in 0..part_count {
            let offset = index * part_size;
            let len = part_size.min(size - offset);
            let mut buf = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
            file.read_exact(&mut buf).await.map_err(|err| {
                AttemptError::new(
                    FailureKind::LocalIo,
                    format!("cannot read part {} of the file: {}", index + 1, io_reason(&err)),
                )
            })?;
            // part_count <= MAX_PARTS, so the number fits.
            let number = i32::try_from(index + 1).unwrap_or(i32::MAX);
            let out = self
                .client
                .upload_part()
                .bucket(&to.bucket)
                .key(&to.key)
                .upload_id(upload_id)
                .part_number(number)
                .checksum_algorithm(ChecksumAlgorithm::Crc32)
                .body(ByteStream::from(buf))
                .send()
                .await;
            let out = match out {
                Ok(out) => out,
                Err(err) => return Err(self.explain_broken_write(&err, to).await),
            };
            parts.push(
                CompletedPart::builder()
                    .part_number(number)
                    .set_e_tag(out.e_tag().map(str::to_string))
                    .set_checksum_crc32(out.checksum_crc32().map(str::to_string))
                    .build(),
            );
        }
        self.client
            .complete_multipart_upload()
            .bucket(&to.bucket)
            .key(&to.key)
            .upload_id(upload_id)
            .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
            .send()
            .await
            .map_err(|err| classify(&err))?;
        Ok(())
    }

    /// Reads a whole object into memory.
    pub async fn get_bytes(&self, from: &S3Location) -> Result<Vec<u8>, AttemptError> {
        let out =
            self.client.get_object().bucket(&from.bucket).key(&from.key).send().await.map_err(|err| classify(&err))?;
        let data = out.body.collect().await.map_err(|err| {
            AttemptError::new(FailureKind::Unreachable, format!("the transfer broke off: {}", error_chain(&err)))
        })?;
        Ok(data.into_bytes().to_vec())
    }

    /// Streams an object into a local file (a temporary name, then renamed).
    pub async fn get_to_file(&self, from: &S3Location, to: &Path) -> Result<u64, AttemptError> {
        let out =
            self.client.get_object().bucket(&from.bucket).key(&from.key).send().await.map_err(|err| classify(&err))?;
        let mut reader = out.body.into_async_read();
        local::write_atomically(to, |file| async move {
            let mut file = file;
            let copied = tokio::io::copy(&mut reader, &mut file).await;
            (file, copied)
        })
        .await
    }

    /// Every page of a ListObjectsV2 of `prefix`'s directory (`key/`),
    /// optionally with a delimiter, handed to `each` in order; an error past
    /// [`MAX_LIST_PAGES`] pages.
    async fn list_pages(
        &self,
        prefix: &S3Location,
        delimiter: Option<&str>,
        mut each: impl FnMut(&ListObjectsV2Output),
    ) -> Result<(), AttemptError> {
        let mut token: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&prefix.bucket)
                .prefix(prefix.dir_prefix())
                .set_delimiter(delimiter.map(str::to_string))
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|err| classify(&err))?;
            each(&page);
            match page.next_continuation_token() {
                Some(next) if page.is_truncated() == Some(true) => token = Some(next.to_string()),
                _ => return Ok(()),
            }
        }
        Err(AttemptError::new(
            FailureKind::Other,
            format!("the listing did not end after {MAX_LIST_PAGES} pages; list a narrower prefix"),
        ))
    }

    /// Every object under `prefix`'s directory (`key/`), in key order.
    pub async fn list(&self, prefix: &S3Location) -> Result<Vec<ObjectInfo>, AttemptError> {
        let dir = prefix.dir_prefix();
        let mut objects = Vec::new();
        self.list_pages(prefix, None, |page| {
            for object in page.contents() {
                if let Some(key) = object.key() {
                    let size = object.size().and_then(|s| u64::try_from(s).ok()).unwrap_or(0);
                    let relative = key.strip_prefix(&dir).unwrap_or(key).to_string();
                    let location = Destination::S3(S3Location { bucket: prefix.bucket.clone(), key: key.to_string() });
                    let last_modified = object.last_modified().and_then(to_system_time);
                    objects.push(ObjectInfo { location, relative, size, last_modified });
                }
            }
        })
        .await?;
        Ok(objects)
    }

    /// The names of the "sub-directories" directly under `prefix`'s
    /// directory (`key/`): the common prefixes of a listing with delimiter
    /// `/`, without `key/` and the trailing `/` (`step-10`, `step-20`), in
    /// key order. One request per 1,000 names, whatever the number of
    /// objects below them; objects directly under `key/` are not returned.
    pub async fn list_dirs(&self, prefix: &S3Location) -> Result<Vec<String>, AttemptError> {
        let dir = prefix.dir_prefix();
        let mut names = Vec::new();
        self.list_pages(prefix, Some("/"), |page| {
            for common in page.common_prefixes() {
                let Some(full) = common.prefix() else { continue };
                let name = full.strip_prefix(&dir).unwrap_or(full);
                let name = name.strip_suffix('/').unwrap_or(name);
                // `key//x` makes an empty "directory"; no Destination can name it.
                if !name.is_empty() {
                    names.push(name.to_string());
                }
            }
        })
        .await?;
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// The object's size and age: one `HeadObject`, nothing transferred.
    /// Not found is `None`; every other answer is an error. A HEAD answer
    /// has no body, so a missing bucket usually reads as a missing object.
    pub async fn head(&self, object: &S3Location) -> Result<Option<ObjectInfo>, AttemptError> {
        match self.client.head_object().bucket(&object.bucket).key(&object.key).send().await {
            Ok(out) => Ok(Some(ObjectInfo {
                location: Destination::S3(object.clone()),
                relative: object.key.rsplit('/').next().unwrap_or(&object.key).to_string(),
                size: out.content_length().and_then(|s| u64::try_from(s).ok()).unwrap_or(0),
                last_modified: out.last_modified().and_then(to_system_time),
            })),
            Err(err) => {
                let attempt = classify(&err);
                if attempt.kind == FailureKind::NotFound { Ok(None) } else { Err(attempt) }
            }
        }
    }

    /// One `DeleteObjects` request for at most [`DELETE_BATCH`] keys of
    /// `bucket`. `Err` when the request as a whole failed (nothing can be
    /// said of any key); otherwise the keys the server refused in the body
    /// of its answer, each with its own error (the others are gone).
    pub async fn delete_batch(
        &self,
        bucket: &str,
        keys: &[String],
    ) -> Result<Vec<(String, AttemptError)>, AttemptError> {
        if keys.len() > DELETE_BATCH {
            return Err(AttemptError::new(
                FailureKind::Other,
                format!("{} keys in one DeleteObjects request; S3 takes at most {DELETE_BATCH}", keys.len()),
            ));
        }
        let objects = keys
            .iter()
            .map(|key| ObjectIdentifier::builder().key(key).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| AttemptError::new(FailureKind::Other, format!("cannot build the request: {err}")))?;
        // Quiet: the answer lists only the keys that were not deleted.
        let delete = Delete::builder()
            .set_objects(Some(objects))
            .quiet(true)
            .build()
            .map_err(|err| AttemptError::new(FailureKind::Other, format!("cannot build the request: {err}")))?;
        let out =
            self.client.delete_objects().bucket(bucket).delete(delete).send().await.map_err(|err| classify(&err))?;
        Ok(out
            .errors()
            .iter()
            .map(|error| {
                let key = error.key().unwrap_or_default().to_string();
                (key, classify_key_error(error.code(), error.message()))
            })
            .collect())
    }
}

/// An S3 timestamp as a `SystemTime`; `None` if it does not fit.
fn to_system_time(time: &aws_sdk_s3::primitives::DateTime) -> Option<SystemTime> {
    let seconds = time.secs();
    let nanos = Duration::from_nanos(u64::from(time.subsec_nanos()));
    if seconds >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(seconds.unsigned_abs()) + nanos)
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(seconds.unsigned_abs()))?.checked_add(nanos)
    }
}

/// Kind and reason of one key's error in a `DeleteObjects` answer, which
/// carries a code and a message but no HTTP status of its own.
fn classify_key_error(code: Option<&str>, message: Option<&str>) -> AttemptError {
    let kind = match code {
        Some("InternalError") => FailureKind::ServerError,
        _ => classify_service(200, code, message).kind,
    };
    let reason = match (code, message) {
        (Some(code), Some(message)) if !message.is_empty() => format!("{code}: {message}"),
        (Some(code), _) => code.to_string(),
        (None, Some(message)) if !message.is_empty() => message.to_string(),
        (None, _) => "the server did not say why".to_string(),
    };
    AttemptError::new(kind, reason)
}

/// Turns an SDK error into a failure kind and a short reason.
pub(crate) fn classify<E>(err: &SdkError<E, HttpResponse>) -> AttemptError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match err {
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let meta = service.err();
            classify_service(status, meta.code(), meta.message())
        }
        SdkError::TimeoutError(_) => AttemptError::new(FailureKind::Timeout, "timed out"),
        SdkError::DispatchFailure(failure) => {
            if failure.is_timeout() {
                AttemptError::new(FailureKind::Timeout, format!("timed out: {}", innermost_reason(err)))
            } else if failure.is_io() {
                AttemptError::new(FailureKind::Unreachable, innermost_reason(err))
            } else {
                let chain = error_chain(err);
                // Identity resolution fails in the dispatch phase too.
                if chain.contains("credential") {
                    AttemptError::new(FailureKind::AccessDenied, format!("no usable credentials: {chain}"))
                } else {
                    AttemptError::new(FailureKind::Unreachable, chain)
                }
            }
        }
        SdkError::ResponseError(response) => {
            let status = response.raw().status().as_u16();
            AttemptError::new(
                FailureKind::ServerError,
                format!("unreadable response (HTTP {status}): {}", error_chain(err)),
            )
        }
        SdkError::ConstructionFailure(_) => {
            AttemptError::new(FailureKind::Other, format!("cannot build the request: {}", error_chain(err)))
        }
        _ => AttemptError::new(FailureKind::Other, error_chain(err)),
    }
}

/// True when the connection broke while the request was being sent
/// (reset, broken pipe), as opposed to never being made.
fn broke_mid_request(err: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind as K;
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    for _ in 0..32 {
        let Some(e) = current else { break };
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(io.kind(), K::BrokenPipe | K::ConnectionReset | K::ConnectionAborted)
        {
            return true;
        }
        current = e.source();
    }
    false
}

/// Kind and reason of an error answer from the server.
fn classify_service(status: u16, code: Option<&str>, message: Option<&str>) -> AttemptError {
    let kind = match code {
        Some(
            "InvalidAccessKeyId"
            | "SignatureDoesNotMatch"
            | "AccessDenied"
            | "ExpiredToken"
            | "InvalidToken"
            | "TokenRefreshRequired"
            | "AllAccessDisabled"
            | "InvalidSecurity",
        ) => FailureKind::AccessDenied,
        Some("NoSuchBucket") => FailureKind::NoSuchBucket,
        Some("NoSuchKey" | "NotFound") => FailureKind::NotFound,
        Some("SlowDown" | "Throttling" | "ThrottlingException" | "RequestLimitExceeded" | "TooManyRequests") => {
            FailureKind::Throttled
        }
        Some("RequestTimeout") => FailureKind::Timeout,
        _ => match status {
            401 | 403 => FailureKind::AccessDenied,
            404 => FailureKind::NotFound,
            429 | 503 => FailureKind::Throttled,
            500..=599 => FailureKind::ServerError,
            _ => FailureKind::Other,
        },
    };
    let reason = match (code, message) {
        (Some(code), Some(message)) if !message.is_empty() => format!("{code}: {message} (HTTP {status})"),
        (Some(code), _) => format!("{code} (HTTP {status})"),
        (None, _) if kind == FailureKind::NotFound => format!("no such object (HTTP {status})"),
        (None, _) => format!("HTTP {status}"),
    };
    AttemptError::new(kind, reason)
}

/// The deepest I/O error in words (`connection refused`), or the deepest message.
fn innermost_reason(err: &(dyn std::error::Error + 'static)) -> String {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    let mut last = err.to_string();
    let mut io: Option<String> = None;
    // Source chains are short; the bound only guards against a cycle.
    for _ in 0..32 {
        let Some(e) = current else { break };
        if let Some(io_err) = e.downcast_ref::<std::io::Error>() {
            io = Some(io_reason(io_err));
        }
        last = e.to_string();
        current = e.source();
    }
    io.unwrap_or(last)
}

/// Every message of the source chain, joined with ": ", repeats dropped.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    for _ in 0..32 {
        let Some(e) = current else { break };
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        current = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_errors_map_to_bounded_kinds() {
        let cases = [
            (403, Some("InvalidAccessKeyId"), FailureKind::AccessDenied),
            (403, Some("SignatureDoesNotMatch"), FailureKind::AccessDenied),
            (403, None, FailureKind::AccessDenied),
            (404, Some("NoSuchBucket"), FailureKind::NoSuchBucket),
            (404, Some("NoSuchKey"), FailureKind::NotFound),
            (404, None, FailureKind::NotFound),
            (503, Some("SlowDown"), FailureKind::Throttled),
            (429, None, FailureKind::Throttled),
            (500, Some("InternalError"), FailureKind::ServerError),
            (400, Some("RequestTimeout"), FailureKind::Timeout),
            (400, Some("InvalidArgument"), FailureKind::Other),
        ];
        for (status, code, kind) in cases {
            assert_eq!(classify_service(status, code, Some("m")).kind, kind, "{status} {code:?}");
        }
        assert_eq!(
            classify_service(403, Some("InvalidAccessKeyId"), Some("unknown key")).reason,
            "InvalidAccessKeyId: unknown key (HTTP 403)"
        );
        assert_eq!(classify_service(404, None, None).reason, "no such object (HTTP 404)");
    }

    #[test]
    fn a_key_error_in_a_delete_answer_keeps_its_code_and_retryability() {
        let denied = classify_key_error(Some("AccessDenied"), Some("Access Denied"));
        assert_eq!(denied, AttemptError::new(FailureKind::AccessDenied, "AccessDenied: Access Denied"));
        let internal = classify_key_error(Some("InternalError"), Some("try again"));
        assert_eq!(internal.kind, FailureKind::ServerError);
        assert!(internal.kind.is_retryable());
        assert_eq!(classify_key_error(Some("SlowDown"), None).kind, FailureKind::Throttled);
        assert_eq!(classify_key_error(Some("NoSuchVersion"), Some("")).reason, "NoSuchVersion");
        assert_eq!(classify_key_error(None, None).kind, FailureKind::Other);
    }

    #[test]
    fn s3_timestamps_become_system_times() {
        let time = aws_sdk_s3::primitives::DateTime::from_secs_and_nanos(1_767_614_400, 500);
        assert_eq!(to_system_time(&time), Some(UNIX_EPOCH + Duration::new(1_767_614_400, 500)));
    }

    #[test]
    fn innermost_io_error_gives_the_reason() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("dispatch failure")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let err = Outer(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(innermost_reason(&err), "connection refused");
        assert!(error_chain(&err).starts_with("dispatch failure: "), "{}", error_chain(&err));
    }
}
