//! The admin HTTP port: `/healthz`, `/readyz`, `/leader` and `/metrics`.
//!
//! `/leader` answers `true` or `false` (text, the leader-election sidecar
//! convention), or `{"leading":..,"holder":..,"term":..}` with
//! `Accept: application/json` or `?format=json`.
//!
//! Plain hyper rather than axum: four fixed GET paths need no router or
//! extractors, and axum would add build time for no gain.
use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use wasmwatch_kube::elector::Leadership;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    pub leadership: watch::Receiver<Leadership>,
    /// Ready once start-up finished (manifest loaded, plugins compiled).
    pub ready: watch::Receiver<bool>,
    /// Served on `/metrics` when present.
    pub metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
}

fn text(status: StatusCode, body: impl Into<Bytes>, content_type: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .expect("static response parts")
}

fn handle(state: &AdminState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n",
            "text/plain",
        );
    }
    match req.uri().path() {
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n", "text/plain"),
        "/readyz" => {
            if *state.ready.borrow() {
                text(StatusCode::OK, "ok\n", "text/plain")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "starting\n", "text/plain")
            }
        }
        "/leader" => {
            let l = state.leadership.borrow().clone();
            let wants_json = req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|p| p == "format=json"))
                || req
                    .headers()
                    .get("accept")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("application/json"));
            if wants_json {
                let body = serde_json::json!({
                    "leading": l.leading,
                    "holder": l.holder,
                    "term": l.term.map(|t| serde_json::json!({"holder": t.holder, "transitions": t.transitions, "leaseUid": t.lease_uid})),
                });
                text(StatusCode::OK, format!("{body}\n"), "application/json")
            } else {
                text(StatusCode::OK, format!("{}\n", l.leading), "text/plain")
            }
        }
        "/metrics" => match &state.metrics {
            Some(m) => text(StatusCode::OK, m.render(), crate::metrics::CONTENT_TYPE),
            None => text(StatusCode::NOT_FOUND, "no metrics here\n", "text/plain"),
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n", "text/plain"),
    }
}

/// Binds the admin port; serving starts with [`serve`].
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves the admin endpoints until the task is dropped.
pub async fn serve(listener: TcpListener, state: AdminState) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let resp = handle(&state, &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
