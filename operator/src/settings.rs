//! What the operator was started with that shapes the objects it builds:
//! the sandbox image, how pods reach S3, Job retry and clean-up limits, how
//! long a sandbox pod waits for a final scrape, and how often a training
//! task's checkpoints are polled.

/// Where the `basecamp-sandbox` binary lives in the Basecamp image.
pub const SANDBOX_BINARY_IN_IMAGE: &str = "/usr/local/bin/basecamp-sandbox";
/// Where the `basecamp` CLI lives in the Basecamp image (the trainer pod's
/// `inject-basecamp` init container copies it for `basecamp data preprocess`).
pub const CLI_BINARY_IN_IMAGE: &str = "/usr/local/bin/basecamp";
/// Where the `basecamp-operator` binary lives in the Basecamp image (the
/// init container uses its `inject-sandbox` command: the image has no shell
/// and no `cp`).
pub const OPERATOR_BINARY_IN_IMAGE: &str = "/usr/local/bin/basecamp-operator";

/// Settings that reach the built objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The Basecamp image (sandbox binary, operator binary).
    pub sandbox_image: String,
    /// An S3-compatible endpoint passed to pods as `AWS_ENDPOINT_URL_S3`
    /// and allowed by the NetworkPolicy; `None` for AWS S3 (HTTPS, 443).
    pub s3_endpoint: Option<String>,
    /// A Secret in the task's namespace whose keys become the sandbox's
    /// environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, ...).
    pub s3_secret: Option<String>,
    /// `ttlSecondsAfterFinished` of the Jobs.
    pub job_ttl_seconds: i32,
    /// `backoffLimitPerIndex`: retries of one shard.
    pub backoff_limit_per_index: i32,
    /// Where `basecamp serve` runs; `status.reportUrl` links the task's page there.
    pub report_base_url: Option<String>,
    /// How often a training task is looked at while its trainer runs or
    /// checkpoint evaluations are queued or running, in seconds.
    pub checkpoint_poll_seconds: u64,
    /// `basecamp-sandbox run --metrics-linger`: how long a sandbox pod whose
    /// shard is done keeps serving `/metrics` for a scrape of its final
    /// counts (it exits as soon as one was served). Zero: exit at once.
    pub sandbox_metrics_linger: std::time::Duration,
}

/// The default [`Settings::sandbox_metrics_linger`]: one scrape interval
/// of 30 s (the Prometheus Operator's default) plus 15 s for Prometheus to
/// discover a new pod and for a slow scrape.
pub const DEFAULT_SANDBOX_METRICS_LINGER: std::time::Duration = std::time::Duration::from_secs(45);

impl Default for Settings {
    fn default() -> Self {
        Self {
            sandbox_image: "basecamp:dev".into(),
            s3_endpoint: None,
            s3_secret: None,
            job_ttl_seconds: 7 * 24 * 3600,
            backoff_limit_per_index: 2,
            report_base_url: None,
            checkpoint_poll_seconds: 10,
            sandbox_metrics_linger: DEFAULT_SANDBOX_METRICS_LINGER,
        }
    }
}
