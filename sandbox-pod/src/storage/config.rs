//! How to reach S3 and how hard to try: endpoint, region, credentials,
//! retries, timeouts and the multipart threshold.
//!
//! The defaults talk to AWS itself with the standard credential chain
//! (environment, profile, web identity, container and instance roles).
//! [`StorageConfig::with_endpoint`] points at any S3-compatible server
//! (MinIO, Ceph, s3s-fs) and switches to path-style addressing, which those
//! servers need.

use std::fmt;
use std::time::Duration;

/// The smallest part S3 accepts in a multipart upload (except the last).
pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;
/// The default part size and multipart threshold: 8 MiB.
pub const DEFAULT_PART_SIZE: u64 = 8 * 1024 * 1024;

/// Retries of a whole operation (a whole file, a whole listing), on top of
/// the SDK's own per-request retries. Only retryable failures are retried
/// (unreachable, timeouts, throttling, 5xx); wrong credentials fail at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, at least 1.
    pub max_attempts: u32,
    /// The wait before the second attempt; doubled each time after.
    pub initial_backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max_attempts: 4, initial_backoff: Duration::from_millis(500), max_backoff: Duration::from_secs(10) }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1-based): `initial * 2^(attempt-1)`, capped.
    pub fn backoff_after(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
        self.initial_backoff.saturating_mul(factor).min(self.max_backoff)
    }

    /// `max_attempts`, never less than 1.
    pub fn attempts(&self) -> u32 {
        self.max_attempts.max(1)
    }
}

/// An access key pair given explicitly instead of the credential chain.
#[derive(Clone, PartialEq, Eq)]
pub struct StaticCredentials {
    /// The access key id.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
    /// A session token, for temporary credentials.
    pub session_token: Option<String>,
}

impl StaticCredentials {
    /// An access key pair without a session token.
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        Self { access_key_id: access_key_id.into(), secret_access_key: secret_access_key.into(), session_token: None }
    }
}

impl fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"** redacted **")
            .field("session_token", &self.session_token.as_ref().map(|_| "** redacted **"))
            .finish()
    }
}

/// Everything the storage client needs besides the destination itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageConfig {
    /// An S3-compatible endpoint such as `http://127.0.0.1:9000`; `None`
    /// for AWS (or whatever `AWS_ENDPOINT_URL(_S3)` says).
    pub endpoint_url: Option<String>,
    /// The region; `None` reads `AWS_REGION`/`AWS_DEFAULT_REGION`, then the
    /// profile, then falls back to `us-east-1`.
    pub region: Option<String>,
    /// `http://host/bucket/key` instead of `http://bucket.host/key`; S3-compatible servers need it.
    pub force_path_style: bool,
    /// Explicit credentials; `None` uses the standard chain.
    pub credentials: Option<StaticCredentials>,
    /// Retries of a whole operation (see [`RetryPolicy`]).
    pub retry: RetryPolicy,
    /// Attempts per request inside the SDK (its standard retry mode), at least 1.
    pub sdk_max_attempts: u32,
    /// The SDK's first backoff between two of its own attempts.
    pub sdk_initial_backoff: Duration,
    /// The longest wait for a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// The longest wait for a response's first byte once a request is sent:
    /// a server that takes the connection and never answers fails the
    /// attempt in this time, not in `attempt_timeout`.
    pub read_timeout: Duration,
    /// The longest wait for one request attempt, transfer included.
    pub attempt_timeout: Duration,
    /// Files larger than this go up in a multipart upload.
    pub multipart_threshold: u64,
    /// The part size of multipart uploads (raised to 5 MiB if smaller, S3's minimum).
    pub part_size: u64,
    /// How many files `upload_dir` sends at once.
    pub concurrency: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            endpoint_url: None,
            region: None,
            force_path_style: false,
            credentials: None,
            retry: RetryPolicy::default(),
            sdk_max_attempts: 3,
            sdk_initial_backoff: Duration::from_millis(200),
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(300),
            multipart_threshold: DEFAULT_PART_SIZE,
            part_size: DEFAULT_PART_SIZE,
            concurrency: 4,
        }
    }
}

impl StorageConfig {
    /// The defaults, with endpoint and region taken from `AWS_ENDPOINT_URL_S3`
    /// (or `AWS_ENDPOINT_URL`) and the region chain; an endpoint from the
    /// environment turns on path-style addressing.
    pub fn from_env() -> Self {
        let endpoint = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()));
        match endpoint {
            Some(url) => Self::default().with_endpoint(url),
            None => Self::default(),
        }
    }

    /// Points at an S3-compatible endpoint, with path-style addressing.
    pub fn with_endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint_url = Some(url.into());
        self.force_path_style = true;
        self
    }

    /// Uses these credentials instead of the standard chain.
    pub fn with_credentials(mut self, credentials: StaticCredentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Sets the region.
    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Sets the whole-operation retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The part size actually used: at least S3's 5 MiB minimum.
    pub fn effective_part_size(&self) -> u64 {
        self.part_size.max(MIN_PART_SIZE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let policy = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
        };
        let waits: Vec<u128> = (1..=5).map(|a| policy.backoff_after(a).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 500, 500]);
        assert_eq!(policy.backoff_after(200), Duration::from_millis(500));
        assert_eq!(RetryPolicy { max_attempts: 0, ..policy }.attempts(), 1);
    }

    #[test]
    fn debug_hides_secrets() {
        let creds = StaticCredentials {
            access_key_id: "AKIA".into(),
            secret_access_key: "very-secret".into(),
            session_token: Some("token-secret".into()),
        };
        let text = format!("{:?}", StorageConfig::default().with_credentials(creds));
        assert!(text.contains("AKIA") && !text.contains("very-secret") && !text.contains("token-secret"), "{text}");
    }

    #[test]
    fn an_endpoint_turns_on_path_style() {
        let config = StorageConfig::default().with_endpoint("http://127.0.0.1:9000");
        assert!(config.force_path_style);
        assert_eq!(StorageConfig { part_size: 1, ..config }.effective_part_size(), MIN_PART_SIZE);
    }
}
