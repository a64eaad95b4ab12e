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
//!   injection's id, or 400 with a JSON `{"error": …}` that says what to fix.
//!
//! The server binds nothing itself: [`serve`] runs on the listener the
//! caller bound (loopback by default, all interfaces in a pod).

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::episode::{LiveInjection, LiveInjections};
use crate::metrics::{OPENMETRICS_CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE, SandboxMetrics};

/// The longest episode or injection id the endpoint accepts.
pub const MAX_ID_LEN: usize = 256;

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

/// The routes, for embedding in a larger server (the gym-like server mode).
pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/v1/episodes/{episode}/inject", post(inject))
        .fallback(not_found)
        .with_state(state)
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

async fn metrics(State(state): State<ServerState>, headers: HeaderMap) -> Response {
    let wants_openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if wants_openmetrics {
        ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], state.metrics.encode()).into_response()
    } else {
        ([(header::CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE)], state.metrics.encode_prometheus_text()).into_response()
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn inject(State(state): State<ServerState>, Path(episode): Path<String>, body: Bytes) -> Response {
    if let Err(problem) = check_id("episode id", &episode) {
        return bad_request(problem);
    }
    // Through `Value` first: serde would also read a struct from a JSON array.
    let request = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(fields)) => serde_json::from_value::<InjectRequest>(Value::Object(fields)),
        Ok(other) => {
            return bad_request(format!(
                "the injection body is {}, not an object; {INJECT_BODY_SHAPE}",
                crate::tools::json_type(&other)
            ));
        }
        Err(e) => Err(e),
    };
    let request = match request {
        Ok(r) => r,
        Err(e) => return bad_request(format!("invalid injection body: {e}; {INJECT_BODY_SHAPE}")),
    };
    if request.observation.is_null() {
        return bad_request(format!("`observation` is null: give the observation to inject; {INJECT_BODY_SHAPE}"));
    }
    let id = match request.id {
        Some(id) => match check_id("`id`", &id) {
            Ok(()) => id,
            Err(problem) => return bad_request(problem),
        },
        None => format!("live-{}", state.next_injection.fetch_add(1, Ordering::Relaxed)),
    };
    state
        .live
        .push(&episode, LiveInjection { id: id.clone(), observation: request.observation, at_step: request.at_step });
    tracing::info!(episode = %episode, injection = %id, at_step = ?request.at_step, "live injection queued");
    let body = json!({"id": id, "episode": episode, "at_step": request.at_step});
    (StatusCode::ACCEPTED, axum::Json(body)).into_response()
}

async fn not_found() -> Response {
    let body = json!({
        "error": "no such endpoint; this sandbox serves GET /metrics, GET /healthz and POST /v1/episodes/{id}/inject"
    });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

fn check_id(what: &str, id: &str) -> Result<(), String> {
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

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, axum::Json(json!({"error": message}))).into_response()
}
