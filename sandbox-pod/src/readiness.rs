//! Waiting for the policy: its server (`spec.policy.server`, a sidecar such
//! as vLLM loading the checkpoint under test) before the first episode and
//! after an outage, and a hosted endpoint after an outage.
//!
//! The sandbox polls `server.readiness_url()` every [`POLL_INTERVAL`] until
//! it answers 200, for at most `server.startup_timeout()`. Episodes that
//! started against a server still loading its model would all fail with
//! connection errors and be scored as policy failures; a server that never
//! comes up is a configuration problem, reported with the URL, the timeout
//! and the last answer or error, so the pod's termination message says why.
//!
//! A hosted endpoint (`spec.policy.endpoint` without a server) has no
//! readiness URL: after an outage, `GET <endpoint>/models` with the API key
//! is polled until it answers anything but 408, 429 or 5xx, for at most
//! `spec.policy.outageTimeout` ([`Readiness::after_an_outage`]).

use std::future::Future;
use std::time::{Duration, Instant};

use basecamp_api::task::PolicySpec;

use crate::policy::{OpenAiPolicy, Policy};

/// How often the readiness URL is polled.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The longest one poll may take: a server that accepts the connection but
/// never answers still gets polled again before the deadline.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What is waited for: it decides what counts as ready and what the error
/// advises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaited {
    /// `spec.policy.server`: ready when its readiness URL answers 200.
    Server,
    /// `spec.policy.endpoint` without a server: back when `GET
    /// <endpoint>/models` answers anything but 408, 429 or 5xx (a 401 or
    /// 404 comes from a server that is up).
    Endpoint,
}

/// The policy's server or endpoint did not answer in time.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.message())]
pub struct NotReady {
    /// The URL polled.
    pub url: String,
    /// The bound, as written in the manifest (or the default).
    pub timeout: basecamp_api::Duration,
    /// The last answer (`status 503 Service Unavailable`) or error (`error: connection refused`).
    pub last: String,
    /// How many polls were made.
    pub attempts: u32,
    pub awaited: Awaited,
}

impl NotReady {
    /// A fixed name for this kind of error.
    pub fn category(&self) -> &'static str {
        match self.awaited {
            Awaited::Server => "PolicyServerNotReady",
            Awaited::Endpoint => "PolicyEndpointDown",
        }
    }

    fn message(&self) -> String {
        let Self { url, timeout, last, .. } = self;
        match self.awaited {
            Awaited::Server => format!(
                "the policy server did not answer 200 at {url} within {timeout} (spec.policy.server.startupTimeout); \
                 last {last}; check the policy-server container's logs, or raise startupTimeout if loading the model \
                 takes longer"
            ),
            Awaited::Endpoint => format!(
                "the policy endpoint was still down at {url} after {timeout} (spec.policy.outageTimeout: no answer, \
                 or only 408, 429 or 5xx); last {last}; check the provider's status, or raise outageTimeout to wait \
                 longer"
            ),
        }
    }
}

/// Polls `url` every `interval` until it answers 200 or `timeout` has
/// passed; returns how long it took.
pub async fn wait_until_ready(
    url: &str,
    timeout: basecamp_api::Duration,
    interval: Duration,
) -> Result<Duration, NotReady> {
    let client = reqwest::Client::builder().build();
    let probe = |per_request: Duration| {
        let client = &client;
        async move {
            match client {
                Err(e) => Err(format!("error: cannot build the HTTP client: {e}")),
                Ok(client) => match client.get(url).timeout(per_request).send().await {
                    Ok(response) if response.status() == reqwest::StatusCode::OK => Ok(()),
                    Ok(response) => Err(format!("status {}", response.status())),
                    Err(e) => Err(format!("error: {}", error_chain(&e))),
                },
            }
        }
    };
    poll(url, timeout, interval, Awaited::Server, probe).await
}

/// Calls `probe` (given how long its request may take) every `interval`
/// until it answers `Ok` or `timeout` has passed; returns how long it took.
async fn poll<F, Fut>(
    url: &str,
    timeout: basecamp_api::Duration,
    interval: Duration,
    awaited: Awaited,
    probe: F,
) -> Result<Duration, NotReady>
where
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    let bound = timeout.to_std().unwrap_or(Duration::ZERO);
    let deadline = started + bound;
    let mut attempts = 0;
    let last = loop {
        attempts += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let per_request = remaining.clamp(Duration::from_millis(100), REQUEST_TIMEOUT);
        let last = match probe(per_request).await {
            Ok(()) => return Ok(started.elapsed()),
            Err(last) => last,
        };
        // The sleep ends at the deadline at the latest, so the last poll is made there.
        let now = Instant::now();
        if now >= deadline {
            break last;
        }
        tokio::time::sleep(interval.min(deadline - now)).await;
    };
    Err(NotReady { url: url.to_string(), timeout, last, attempts, awaited })
}

/// How to tell that the policy answers: its server's readiness URL, or a
/// hosted endpoint's `/models`, and how long to wait for it.
#[derive(Debug, Clone)]
pub struct Readiness {
    pub url: String,
    pub timeout: basecamp_api::Duration,
    probe: Probe,
}

#[derive(Debug, Clone)]
enum Probe {
    Server,
    /// The client asks: it holds the API key and its redaction.
    Endpoint(Box<OpenAiPolicy>),
}

impl Readiness {
    /// A policy server's: ready when `url` answers 200.
    pub fn server(url: String, timeout: basecamp_api::Duration) -> Self {
        Self { url, timeout, probe: Probe::Server }
    }

    /// The policy's server's, `None` for a policy without one (a hosted
    /// endpoint, a script): what is waited for before the first episode.
    pub fn of(policy: &PolicySpec) -> Option<Self> {
        let server = policy.server.as_ref()?;
        Some(Self::server(server.readiness_url(), server.startup_timeout()))
    }

    /// What a shard waits for after an outage: the policy's server, else an
    /// endpoint's `/models` for `spec.policy.outageTimeout` (none when that
    /// is zero); `None` for a script.
    pub fn after_an_outage(spec: &PolicySpec, policy: &Policy) -> Option<Self> {
        if let Some(server) = Self::of(spec) {
            return Some(server);
        }
        let timeout = spec.outage_timeout();
        match policy {
            Policy::OpenAi(client) if timeout.is_positive() => {
                Some(Self { url: client.models_url().to_string(), timeout, probe: Probe::Endpoint(client.clone()) })
            }
            _ => None,
        }
    }

    pub fn awaited(&self) -> Awaited {
        match self.probe {
            Probe::Server => Awaited::Server,
            Probe::Endpoint(_) => Awaited::Endpoint,
        }
    }

    /// "the policy server to answer 200 at URL", for a line saying what is waited for.
    pub fn describe(&self) -> String {
        match self.probe {
            Probe::Server => format!("the policy server to answer 200 at {}", self.url),
            Probe::Endpoint(_) => format!("the policy endpoint to answer at {} (other than 408, 429 or 5xx)", self.url),
        }
    }

    /// Polls until it answers (every [`POLL_INTERVAL`], for at most the
    /// timeout); returns how long that took.
    pub async fn wait(&self) -> Result<Duration, NotReady> {
        match &self.probe {
            Probe::Server => wait_until_ready(&self.url, self.timeout, POLL_INTERVAL).await,
            Probe::Endpoint(client) => {
                let probe = |per_request| client.answers(per_request);
                poll(&self.url, self.timeout, POLL_INTERVAL, Awaited::Endpoint, probe).await
            }
        }
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
