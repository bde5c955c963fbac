//! The admin HTTP port: `/healthz`, `/readyz`, `/leader` and `/metrics`.
//!
//! `/leader` answers `true` or `false` (text, the leader-election sidecar
//! convention), or `{"leading":..,"holder":..,"term":..}` with
//! `Accept: application/json` or `?format=json`. With an elector it answers
//! from the fence ([`Fence::acting`]), not from the published leadership: a
//! leader paused past its lease says `false` the moment it wakes, before its
//! elector has run again, as the `wasmwatch elect` sidecar's apps act on it.
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
use wasmwatch_kube::elector::{Fence, Leadership};

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    pub leadership: watch::Receiver<Leadership>,
    /// With an elector: whether this replica may act now (`/leader`).
    pub fence: Option<Fence>,
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
    let wants_json = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "format=json"))
        || req
            .headers()
            .get("accept")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("application/json"));
    respond(state, req.method(), req.uri().path(), wants_json)
}

/// What the leader endpoint says: from the fence when there is one.
fn leader(state: &AdminState) -> (bool, Option<String>, Option<wasmwatch_kube::elector::Term>) {
    let l = state.leadership.borrow().clone();
    match &state.fence {
        Some(fence) => {
            let term = fence.acting().map(|a| a.term);
            (term.is_some(), l.holder, term)
        }
        None => (l.leading, l.holder, l.term),
    }
}

fn respond(state: &AdminState, method: &Method, path: &str, json: bool) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n",
            "text/plain",
        );
    }
    match path {
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n", "text/plain"),
        "/readyz" => {
            if *state.ready.borrow() {
                text(StatusCode::OK, "ok\n", "text/plain")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "starting\n", "text/plain")
            }
        }
        "/leader" => {
            let (leading, holder, term) = leader(state);
            if json {
                let body = serde_json::json!({
                    "leading": leading,
                    "holder": holder,
                    "term": term.map(|t| serde_json::json!({"holder": t.holder, "transitions": t.transitions, "leaseUid": t.lease_uid})),
                });
                text(StatusCode::OK, format!("{body}\n"), "application/json")
            } else {
                text(StatusCode::OK, format!("{leading}\n"), "text/plain")
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body(r: Response<Full<Bytes>>) -> String {
        let b = r.into_body().collect().await.expect("full body").to_bytes();
        String::from_utf8(b.to_vec()).expect("utf-8")
    }

    /// A leader whose fence closed (paused past its renew deadline) says
    /// `false`, though the published leadership still says it leads: its
    /// elector has not run since it woke.
    #[tokio::test]
    async fn leader_answers_from_the_fence_not_the_published_leadership() {
        let term = wasmwatch_kube::elector::Term {
            holder: "me".into(),
            transitions: 2,
            lease_uid: "u".into(),
        };
        let (_tx, leadership) = watch::channel(Leadership {
            leading: true,
            term: Some(term.clone()),
            holder: Some("me".into()),
        });
        let (_ready_tx, ready) = watch::channel(true);
        let fence = Fence::default();
        let state = AdminState {
            leadership,
            fence: Some(fence.clone()),
            ready,
            metrics: None,
        };
        // The fence was never opened: not leading, whatever was published.
        let r = respond(&state, &Method::GET, "/leader", false);
        assert_eq!(body(r).await, "false\n");
        let r = respond(&state, &Method::GET, "/leader", true);
        let v: serde_json::Value = serde_json::from_str(&body(r).await).unwrap();
        assert_eq!(v["leading"], false);
        assert_eq!(v["term"], serde_json::Value::Null);
        assert_eq!(v["holder"], "me", "the last observed holder stays visible");
    }
}
