//! Waiting for the policy server (`spec.policy.server`, a sidecar such as
//! vLLM loading the checkpoint under test) before the first episode.
//!
//! The sandbox polls `server.readiness_url()` every [`POLL_INTERVAL`] until
//! it answers 200, for at most `server.startup_timeout()`. Episodes that
//! started against a server still loading its model would all fail with
//! connection errors and be scored as policy failures; a server that never
//! comes up is a configuration problem, reported with the URL, the timeout
//! and the last answer or error, so the pod's termination message says why.

use std::time::{Duration, Instant};

use basecamp_api::task::PolicySpec;

/// How often the readiness URL is polled.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The longest one poll may take: a server that accepts the connection but
/// never answers still gets polled again before the deadline.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The policy server did not become ready in time.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the policy server did not answer 200 at {url} within {timeout} (spec.policy.server.startupTimeout); \
     last {last}; check the policy-server container's logs, or raise startupTimeout if loading the model takes longer"
)]
pub struct NotReady {
    /// The readiness URL polled.
    pub url: String,
    /// The bound, as written in the manifest (or the default).
    pub timeout: basecamp_api::Duration,
    /// The last answer (`status 503 Service Unavailable`) or error (`error: connection refused`).
    pub last: String,
    /// How many polls were made.
    pub attempts: u32,
}

impl NotReady {
    /// A fixed name for this kind of error.
    pub fn category(&self) -> &'static str {
        "PolicyServerNotReady"
    }
}

/// Polls `url` every `interval` until it answers 200 or `timeout` has
/// passed; returns how long it took.
pub async fn wait_until_ready(
    url: &str,
    timeout: basecamp_api::Duration,
    interval: Duration,
) -> Result<Duration, NotReady> {
    let started = Instant::now();
    let bound = timeout.to_std().unwrap_or(Duration::ZERO);
    let deadline = started + bound;
    let client = reqwest::Client::builder().build();
    let mut attempts = 0;
    let last = loop {
        attempts += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let per_request = remaining.clamp(Duration::from_millis(100), REQUEST_TIMEOUT);
        let last = match &client {
            Err(e) => format!("error: cannot build the HTTP client: {e}"),
            Ok(client) => match client.get(url).timeout(per_request).send().await {
                Ok(response) if response.status() == reqwest::StatusCode::OK => return Ok(started.elapsed()),
                Ok(response) => format!("status {}", response.status()),
                Err(e) => format!("error: {}", error_chain(&e)),
            },
        };
        // The sleep ends at the deadline at the latest, so the last poll is made there.
        let now = Instant::now();
        if now >= deadline {
            break last;
        }
        tokio::time::sleep(interval.min(deadline - now)).await;
    };
    Err(NotReady { url: url.to_string(), timeout, last, attempts })
}

/// How to tell that a policy server (`spec.policy.server`) is ready: its
/// readiness URL and how long to wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    pub url: String,
    pub timeout: basecamp_api::Duration,
}

impl Readiness {
    /// The policy's server's, `None` for a policy without one (a hosted
    /// endpoint, a script): nothing then says when it is ready.
    pub fn of(policy: &PolicySpec) -> Option<Self> {
        let server = policy.server.as_ref()?;
        Some(Self { url: server.readiness_url(), timeout: server.startup_timeout() })
    }

    /// Polls the URL until it answers 200 (every [`POLL_INTERVAL`], for at
    /// most the timeout); returns how long that took.
    pub async fn wait(&self) -> Result<Duration, NotReady> {
        wait_until_ready(&self.url, self.timeout, POLL_INTERVAL).await
    }
}

/// With `policy.server`, waits for it and returns how long that took
/// (`None` without a server). Logs one line when it is ready.
pub async fn wait_for_policy_server(policy: &PolicySpec) -> Result<Option<Duration>, NotReady> {
    let Some(readiness) = Readiness::of(policy) else { return Ok(None) };
    let took = readiness.wait().await?;
    crate::stderr_line!("policy server ready: {} answered 200 after {:.1}s", readiness.url, took.as_secs_f64());
    Ok(Some(took))
}

/// `error sending request: connection refused`: reqwest's message and its causes.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_port_times_out_naming_the_url_the_bound_and_the_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}/v1/models");
        let started = Instant::now();
        let err = wait_until_ready(&url, basecamp_api::Duration::from_millis(700), Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3), "bounded by the timeout: {:?}", started.elapsed());
        assert!(err.attempts >= 3, "polled every interval: {}", err.attempts);
        let message = err.to_string();
        assert!(message.contains(&url), "{message}");
        assert!(message.contains("700ms"), "{message}");
        assert!(message.to_lowercase().contains("connect"), "{message}");
        assert_eq!(err.category(), "PolicyServerNotReady");
    }

    #[tokio::test]
    async fn no_server_no_wait() {
        assert_eq!(wait_for_policy_server(&PolicySpec::default()).await.unwrap(), None);
    }
}
