//! The operator's HTTP endpoint: `GET /metrics` (Prometheus text 0.0.4, or
//! OpenMetrics when the scraper asks for it), `GET /healthz` (the process
//! serves) and `GET /readyz` (the controller's watches have started; a
//! replica waiting for the leader Lease is ready too — it is healthy, just
//! not leading).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::metrics::{Metrics, OPENMETRICS_CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE};

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct ServerState {
    /// The metrics to serve.
    pub metrics: Arc<Metrics>,
    /// Set once the operator is ready.
    pub ready: Arc<AtomicBool>,
}

/// The routes.
pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(state): State<ServerState>, headers: HeaderMap) -> Response {
    let wants_openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    if wants_openmetrics {
        ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], state.metrics.encode()).into_response()
    } else {
        ([(header::CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE)], state.metrics.encode_prometheus_text()).into_response()
    }
}

async fn readyz(State(state): State<ServerState>) -> Response {
    if state.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting").into_response()
    }
}

/// Serves on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, path: &str, accept: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
    }

    #[tokio::test]
    async fn serves_metrics_health_and_readiness_on_loopback() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = ServerState { metrics: Arc::new(Metrics::new()), ready: Arc::new(AtomicBool::new(false)) };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, state.clone(), async move {
            let _ = stopped.await;
        }));
        assert!(get(addr, "/healthz", "*/*").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz", "*/*").await.starts_with("HTTP/1.1 503"));
        state.ready.store(true, Ordering::Relaxed);
        assert!(get(addr, "/readyz", "*/*").await.starts_with("HTTP/1.1 200"));
        let text = get(addr, "/metrics", "text/plain").await;
        assert!(
            text.contains("text/plain; version=0.0.4") && text.contains("basecamp_tasks{phase=\"Pending\"} 0"),
            "{text}"
        );
        let open = get(addr, "/metrics", "application/openmetrics-text; version=1.0.0").await;
        assert!(open.contains("# EOF"), "{open}");
        let _ = stop.send(());
        server.await.expect("joined").expect("served");
    }
}
