//! The HTTP endpoint of a running sandbox: `/metrics`, `/healthz` and live
//! observation injection.
//!
//! - `GET /metrics`: [`SandboxMetrics`] in the Prometheus text format 0.0.4,
//!   or OpenMetrics when the scraper's `Accept` asks for it;
//! - `GET /healthz`: `ok` while the process serves;
//! - `POST /v1/episodes/{id}/inject`: `{"observation": <any JSON>,
//!   "at_step": <u32, optional>, "id": <string, optional>}` queues a live
//!   injection for episode `id` in [`LiveInjections`]; the runner delivers it
//!   before the policy's turn at `at_step` (or its next turn) and marks it
//!   `INJECTION_TRIGGER_LIVE` in the trace (and counts it in
//!   `basecamp_sandbox_injections_total{trigger="live"}` when it is
//!   delivered, not when it is accepted here). Answers 202 with the
//!   injection's id. When the runner declared its episodes
//!   ([`LiveInjections::expect_episodes`]), an unknown episode is a 404 and
//!   a finished one a 409; an `id` the episode took already, or one of a
//!   scheduled injection's ([`LiveInjections::reserve_scheduled`]), is a 409
//!   `InjectionExists`.
//!
//! Every error is JSON `{"error": {"category": <PascalCase>, "message": …}}`
//! ([`ApiError`]), the shape server mode ([`crate::gym`]) answers with too;
//! its routes reuse [`observability`], [`read_injection`] and [`readable`].
//! Both modes read bodies of up to [`MAX_BODY_BYTES`]; a larger one is a
//! 413 `RequestTooLarge`.
//!
//! The server binds nothing itself: [`serve`] runs on the listener the
//! caller bound (loopback by default, all interfaces in a pod).
//! [`RunningServer`] is driver mode's server on a task of its own. Since
//! Prometheus only has what it scraped, before the first episode it can
//! [`RunningServer::first_scrape`] (Prometheus holds every series at zero)
//! and after the shard [`RunningServer::linger`] until a scrape has seen the
//! final values (both `--metrics-linger`). Every `/metrics` answer is
//! reported to [`SandboxMetrics::scrapes`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::episode::{InjectionRefused, LiveInjection, LiveInjections};
use crate::metrics::{OPENMETRICS_CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE, SandboxMetrics};

/// The longest episode or injection id the endpoint accepts.
pub const MAX_ID_LEN: usize = 256;

/// The largest request body read, in both modes. A step's `raw_logits` (a
/// `[tokens, vocab]` F32 safetensors file, base64) outgrows axum's default
/// of 2 MB at 16 tokens of a 32k vocabulary; an injected observation may
/// be as large as any other.
pub const MAX_BODY_BYTES: usize = 256 << 20;

/// The body, or the API's JSON error for one that cannot be read (axum's
/// own answer is plain text, which a client parsing errors cannot read).
pub fn readable(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            let limit = MAX_BODY_BYTES >> 20;
            ApiError::new(status, "RequestTooLarge", format!("the request body is over {limit} MiB, the most read"))
        } else {
            ApiError::new(status, "UnreadableBody", format!("cannot read the request body: {}", rejection.body_text()))
        }
    })
}

/// The episode id of a route's path (`/v1/episodes/{id}/…`). One that is
/// not UTF-8 names no episode (ids are text): 404 `UnknownEpisode` in the
/// API's JSON error, where axum's `Path` answered 400 in plain text.
pub struct EpisodeIdPath(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for EpisodeIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(id)) => Ok(EpisodeIdPath(id)),
            Err(rejection) => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "UnknownEpisode",
                format!("no episode has the id in this path ({})", rejection.body_text()),
            )),
        }
    }
}

/// What the handlers share: the metrics to serve and the injection queues
/// the episode runner reads.
#[derive(Debug, Clone)]
pub struct ServerState {
    pub metrics: Arc<SandboxMetrics>,
    pub live: LiveInjections,
    next_injection: Arc<AtomicU64>,
}

impl ServerState {
    pub fn new(metrics: Arc<SandboxMetrics>, live: LiveInjections) -> Self {
        Self { metrics, live, next_injection: Arc::new(AtomicU64::new(1)) }
    }
}

/// An error answer: an HTTP status, a bounded PascalCase category (the
/// metric label and what clients match on) and a message that says what
/// to fix. Serialized as `{"error": {"category": …, "message": …}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub category: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, category: &'static str, message: impl Into<String>) -> Self {
        Self { status, category, message: message.into() }
    }

    pub fn bad_request(category: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, category, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"category": self.category, "message": self.message}});
        (self.status, axum::Json(body)).into_response()
    }
}

/// The body of `POST /v1/episodes/{id}/inject`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InjectRequest {
    observation: Value,
    #[serde(default)]
    at_step: Option<u32>,
    #[serde(default)]
    id: Option<String>,
}

const INJECT_BODY_SHAPE: &str =
    r#"expected {"observation": <any JSON>, "at_step": <step number, optional>, "id": <string, optional>}"#;

/// The routes of driver mode: [`observability`] and live injection.
pub fn router(state: ServerState) -> Router {
    let routes = Router::new()
        .route("/v1/episodes/{episode}/inject", post(inject))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state.clone());
    with_fallbacks(
        routes.merge(observability(state.metrics)),
        "this sandbox serves GET /metrics, GET /healthz and POST /v1/episodes/{id}/inject",
    )
}

/// `GET /metrics` and `GET /healthz`, for both modes.
pub fn observability(metrics: Arc<SandboxMetrics>) -> Router {
    Router::new().route("/metrics", get(serve_metrics)).route("/healthz", get(healthz)).with_state(metrics)
}

/// JSON answers for an unknown path (404 `NoSuchEndpoint`) and a method a
/// path does not serve (405 `MethodNotAllowed`); `served` lists what is.
pub fn with_fallbacks(router: Router, served: &'static str) -> Router {
    router
        .fallback(move || async move {
            ApiError::new(StatusCode::NOT_FOUND, "NoSuchEndpoint", format!("no such endpoint; {served}"))
        })
        .method_not_allowed_fallback(move || async move {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("this endpoint does not serve that method; {served}"),
            )
        })
}

/// Serves [`router`] on `listener` until `shutdown` completes, then lets
/// requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}

/// Driver mode's server, running on a task of its own. Dropping it stops
/// the server too (gracefully, without waiting for it).
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    metrics: Arc<SandboxMetrics>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<io::Result<()>>,
}

/// Why [`RunningServer::first_scrape`] or [`RunningServer::linger`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LingerEnd {
    /// The scrape waited for was served, this long into the wait (zero
    /// when one was served before the wait began).
    Scraped(Duration),
    /// The limit passed without such a scrape.
    Elapsed,
    /// The caller's stop (SIGTERM, Ctrl-C) ended the wait.
    Stopped,
    /// The server is no longer serving, so no scrape can come.
    ServerDown,
}

impl RunningServer {
    /// Serves [`router`] on `listener` on a new task.
    pub fn start(listener: tokio::net::TcpListener, state: ServerState) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        let metrics = state.metrics.clone();
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        // A dropped sender stops the server too: `stopped` completes either way.
        let task = tokio::spawn(serve(listener, state, async move {
            let _ = stopped.await;
        }));
        Ok(Self { addr, metrics, shutdown, task })
    }

    /// The address it listens on (the port chosen when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until any scrape was served, at most `limit`, or until `stop`
    /// completes: before the first episode, so that Prometheus holds every
    /// series at zero ([`SandboxMetrics::declare_tools`]) and the final
    /// scrape is an increase `rate()` can see, however short the shard.
    pub async fn first_scrape(&self, limit: Duration, stop: impl Future<Output = ()>) -> LingerEnd {
        self.wait_for(self.metrics.scrapes().first_served(), limit, stop).await
    }

    /// Keeps serving until a scrape that began after
    /// [`crate::metrics::Scrapes::mark_final`] was served, at most
    /// `limit`, or until `stop` completes. The server keeps running either
    /// way; [`RunningServer::stop`] ends it.
    pub async fn linger(&self, limit: Duration, stop: impl Future<Output = ()>) -> LingerEnd {
        self.wait_for(self.metrics.scrapes().final_served(), limit, stop).await
    }

    async fn wait_for(
        &self,
        served: impl Future<Output = ()>,
        limit: Duration,
        stop: impl Future<Output = ()>,
    ) -> LingerEnd {
        let started = Instant::now();
        if self.task.is_finished() {
            return LingerEnd::ServerDown;
        }
        tokio::select! {
            // A stop that came before the wait ends it at once.
            biased;
            () = stop => LingerEnd::Stopped,
            () = served => LingerEnd::Scraped(started.elapsed()),
            () = tokio::time::sleep(limit) => LingerEnd::Elapsed,
        }
    }

    /// Stops accepting, lets requests in flight (a scrape being answered)
    /// finish, and returns once the server has stopped.
    pub async fn stop(self) -> io::Result<()> {
        let _ = self.shutdown.send(());
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(io::Error::other(format!("the metrics server task failed: {e}"))),
        }
    }
}

async fn serve_metrics(State(metrics): State<Arc<SandboxMetrics>>, headers: HeaderMap) -> Response {
    // Before reading any value: a scrape counts as final only if it began after the final update.
    let start = metrics.scrapes().begin();
    let wants_openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let response = if wants_openmetrics {
        ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], metrics.encode()).into_response()
    } else {
        ([(header::CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE)], metrics.encode_prometheus_text()).into_response()
    };
    // The body is in memory; a graceful stop (RunningServer::stop) still sends it.
    metrics.scrapes().served(start);
    response
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// An injection body as read: `id` is `None` when the body named none.
#[derive(Debug, Clone, PartialEq)]
pub struct InjectionBody {
    pub observation: Value,
    pub at_step: Option<u32>,
    pub id: Option<String>,
}

/// Reads an injection body for `episode`, its id as given (if any). Every
/// refusal is a 400 that says what to fix.
pub fn read_injection(episode: &str, body: &[u8]) -> Result<InjectionBody, ApiError> {
    let invalid = |message: String| ApiError::bad_request("InvalidInjection", message);
    check_id("episode id", episode).map_err(invalid)?;
    // Through `Value` first: serde would also read a struct from a JSON array.
    let request = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(fields)) => serde_json::from_value::<InjectRequest>(Value::Object(fields)),
        Ok(other) => {
            return Err(invalid(format!(
                "the injection body is {}, not an object; {INJECT_BODY_SHAPE}",
                crate::tools::json_type(&other)
            )));
        }
        Err(e) => Err(e),
    };
    let request = request.map_err(|e| invalid(format!("invalid injection body: {e}; {INJECT_BODY_SHAPE}")))?;
    if request.observation.is_null() {
        return Err(invalid(format!("`observation` is null: give the observation to inject; {INJECT_BODY_SHAPE}")));
    }
    // Steps are numbered from 1 (as `basecamp sandbox inject --at-step` says); 0 was taken as "the next turn".
    if request.at_step == Some(0) {
        return Err(invalid(format!(
            "`at_step` is 0: steps are numbered from 1; leave it out for the next turn; {INJECT_BODY_SHAPE}"
        )));
    }
    if let Some(id) = &request.id {
        check_id("`id`", id).map_err(invalid)?;
    }
    Ok(InjectionBody { observation: request.observation, at_step: request.at_step, id: request.id })
}

/// The next generated injection id, `live-<n>`.
pub fn generated_injection_id(next_id: &AtomicU64) -> String {
    format!("live-{}", next_id.fetch_add(1, Ordering::Relaxed))
}

async fn inject(
    State(state): State<ServerState>,
    EpisodeIdPath(episode): EpisodeIdPath,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match readable(body) {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    let read = match read_injection(&episode, &body) {
        Ok(read) => read,
        Err(e) => return e.into_response(),
    };
    let chosen = read.id.is_some();
    let at_step = read.at_step;
    let mut id = read.id.unwrap_or_else(|| generated_injection_id(&state.next_injection));
    loop {
        let injection = LiveInjection { id: id.clone(), observation: read.observation.clone(), at_step };
        let refused = match state.live.offer(&episode, injection) {
            Ok(()) => break,
            // A generated id a client chose before: the next one.
            Err(InjectionRefused::Exists { .. } | InjectionRefused::Scheduled { .. }) if !chosen => {
                id = generated_injection_id(&state.next_injection);
                continue;
            }
            Err(refused) => refused,
        };
        let (status, category) = match &refused {
            InjectionRefused::UnknownEpisode { .. } => (StatusCode::NOT_FOUND, "UnknownEpisode"),
            InjectionRefused::Finished { .. } => (StatusCode::CONFLICT, "EpisodeFinished"),
            InjectionRefused::Exists { .. } | InjectionRefused::Scheduled { .. } => {
                (StatusCode::CONFLICT, "InjectionExists")
            }
        };
        return ApiError::new(status, category, refused.to_string()).into_response();
    }
    tracing::info!(episode = %episode, injection = %id, at_step = ?at_step, "live injection queued");
    let body = json!({"id": id, "episode": episode, "at_step": at_step});
    (StatusCode::ACCEPTED, axum::Json(body)).into_response()
}

pub(crate) fn check_id(what: &str, id: &str) -> Result<(), String> {
    if id.trim().is_empty() {
        return Err(format!("{what} is empty"));
    }
    if id.len() > MAX_ID_LEN {
        return Err(format!("{what} is {} bytes long; the limit is {MAX_ID_LEN}", id.len()));
    }
    if id.chars().any(char::is_control) {
        return Err(format!("{what} contains control characters"));
    }
    Ok(())
}
