//! HTTP plumbing: the accept loop (which the "refuse connections" fault
//! closes and reopens), per-connection hyper tasks, request routing from
//! real Kubernetes paths to verbs, and the `/_faults/...` endpoints.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderValue, RETRY_AFTER, USER_AGENT};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::Shared;
use crate::api::{self, Query, Reply, Target};
use crate::audit::{self, Attributes};
use crate::discovery;
use crate::error::ApiError;
use crate::faults::{
    ConflictRequest, Control, DurationRequest, FailRequest, Failure, FaultAnswer, RequestFault,
    WatchClose, injected_status,
};
use crate::patch::PatchType;
use crate::resources::{self, RESOURCES, ResourceId};
use crate::table;
use crate::watch::Chunks;

/// Response body: a full document or a watch stream.
pub type Body = UnsyncBoxBody<Bytes, io::Error>;

/// Request body: as received, or read ahead and put back (a create whose
/// name a [`RequestFault`] looks at).
type ReqBody = UnsyncBoxBody<Bytes, hyper::Error>;

const MAX_BODY: usize = 3 * 1024 * 1024;

fn full(code: u16, content_type: &'static str, bytes: Bytes) -> Response<Body> {
    let mut r = Response::new(
        Full::new(bytes)
            .map_err(|e: Infallible| match e {})
            .boxed_unsync(),
    );
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    full(
        code,
        "application/json",
        Bytes::from(serde_json::to_vec(v).expect("a Value always serialises")),
    )
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.code, &e.status());
    if let Some(s) = e.retry_after {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// kube-apiserver's answer to a path no handler claims (its delegation
/// chain ends in Go's `http.NotFound`): a plain-text 404. Paths inside a
/// built-in group get a `Status` instead (go-restful's 404, turned into
/// one); paths of an API group that only custom resources make up (served
/// or not) and of unknown groups get this.
fn page_not_found() -> Response<Body> {
    let mut r = full(
        404,
        "text/plain; charset=utf-8",
        Bytes::from_static(b"404 page not found\n"),
    );
    r.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// The 404 for an unknown path under `/apis/{group}`: a `Status` in a
/// built-in group, else [`page_not_found`].
fn group_path_not_found(group: &str) -> Response<Body> {
    if group.is_empty() || RESOURCES.iter().any(|r| r.group == group && !r.custom) {
        error_response(&ApiError::path_not_found())
    } else {
        page_not_found()
    }
}

fn watch_response(chunks: Chunks) -> Response<Body> {
    let body = StreamBody::new(chunks.map(|c| c.map(Frame::data)));
    let mut r = Response::new(BodyExt::boxed_unsync(body));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// `protobuf`: the client's Accept prefers protobuf; kinds not converted
/// (and watches) are answered as JSON, which client-go decodes by Content-Type.
fn reply_response(reply: Reply, protobuf: bool) -> Response<Body> {
    if protobuf && let Some((code, b)) = crate::protobuf::encode_reply(&reply) {
        return full(code, crate::protobuf::MEDIA_TYPE, Bytes::from(b));
    }
    match reply {
        Reply::Json(code, v) => json_response(code, &v),
        Reply::Stored(code, v) => json_response(code, &v),
        Reply::Raw(code, b) => full(code, "application/json", b),
        Reply::Watch(chunks) => watch_response(chunks),
    }
}

fn percent_decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: Option<&str>) -> Query {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

/// Map path segments after `/api/v1` or `/apis/{g}/{v}` to a target, among
/// the resources `served` admits (a custom resource without its CRD is an
/// unknown path). Returns the target and whether a legacy `/watch/` prefix
/// was used.
fn route(
    group: &str,
    version: &str,
    segs: &[&str],
    served: &dyn Fn(ResourceId) -> bool,
) -> Option<(Target, bool)> {
    let (segs, legacy_watch) = match segs.first() {
        Some(&"watch") => (&segs[1..], true),
        _ => (segs, false),
    };
    let lookup = |plural: &str| resources::lookup(group, version, plural).filter(|&r| served(r));
    if segs.len() >= 3
        && segs[0] == "namespaces"
        && let Some(res) = lookup(segs[2]).filter(|&r| RESOURCES[r].namespaced)
        && segs.len() <= 5
    {
        return Some((
            Target {
                resource: res,
                namespace: Some(segs[1].to_string()),
                name: segs.get(3).map(|s| s.to_string()),
                subresource: segs.get(4).map(|s| s.to_string()),
            },
            legacy_watch,
        ));
    }
    let res = lookup(segs.first()?)?;
    if RESOURCES[res].namespaced {
        if segs.len() != 1 {
            return None;
        }
        return Some((
            Target {
                resource: res,
                namespace: None,
                name: None,
                subresource: None,
            },
            legacy_watch,
        ));
    }
    if segs.len() > 3 {
        return None;
    }
    Some((
        Target {
            resource: res,
            namespace: None,
            name: segs.get(1).map(|s| s.to_string()),
            subresource: segs.get(2).map(|s| s.to_string()),
        },
        legacy_watch,
    ))
}

async fn read_body(req: Request<ReqBody>) -> Result<(String, Bytes), ApiError> {
    let ct = content_type(&req);
    Ok((ct, collect_body(req.into_body()).await?))
}

fn content_type<B>(req: &Request<B>) -> String {
    req.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string()
}

async fn collect_body(body: ReqBody) -> Result<Bytes, ApiError> {
    let body = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ApiError::too_large()
            } else {
                ApiError::bad_request(format!("error reading the request body: {e}"))
            }
        })?
        .to_bytes();
    Ok(body)
}

async fn handle_resource(
    sh: &Shared,
    req: Request<ReqBody>,
    t: Target,
    legacy_watch: bool,
    q: Query,
) -> Result<Reply, ApiError> {
    if let Some(sub) = &t.subresource
        && !(sub == "status" && t.rt().status_subresource)
        && !(sub == "scale" && t.rt().scale_subresource)
    {
        // kube-apiserver's handler of custom resources answers an unknown
        // subresource as a missing object.
        return Err(if t.rt().custom {
            ApiError::not_found(t.rt(), t.name.as_deref().unwrap_or_default())
        } else {
            ApiError::path_not_found()
        });
    }
    let is_watch = legacy_watch || q.get("watch").is_some_and(|v| v == "true" || v == "1");
    let method = req.method().clone();
    if t.subresource.as_deref() == Some("scale") {
        return match method {
            Method::GET if !is_watch => api::scale_get(sh, &t),
            Method::PUT => {
                let (ct, body) = read_body(req).await?;
                api::scale_update(sh, &t, &q, api::parse_body(&ct, &body)?, None).await
            }
            Method::PATCH => {
                let (ct, body) = read_body(req).await?;
                let ty = PatchType::from_content_type(&ct)
                    .ok_or_else(|| ApiError::unsupported_patch_type(&ct))?;
                let body = api::parse_body("application/json", &body)?;
                api::scale_update(sh, &t, &q, body, Some(ty)).await
            }
            _ => Err(ApiError::method_not_allowed()),
        };
    }
    // kubectl asks for a Table when it prints columns; others get the objects.
    let table = || {
        let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
        table::requested(accept, &q)
    };
    match (method, t.name.is_some()) {
        (Method::GET, _) if is_watch => api::watch(sh, &t, &q, table()?),
        (Method::GET, false) => api::list(sh, &t, &q, table()?),
        (Method::GET, true) => api::get(sh, &t, table()?),
        (Method::POST, false) => {
            let (ct, body) = read_body(req).await?;
            api::create(sh, &t, &q, api::parse_body(&ct, &body)?).await
        }
        (Method::PUT, true) => {
            let (ct, body) = read_body(req).await?;
            api::replace(sh, &t, &q, api::parse_body(&ct, &body)?).await
        }
        (Method::PATCH, true) => {
            let (ct, body) = read_body(req).await?;
            let ty = PatchType::from_content_type(&ct)
                .ok_or_else(|| ApiError::unsupported_patch_type(&ct))?;
            if ty == PatchType::Strategic && t.rt().custom {
                return Err(ApiError::strategic_patch_of_custom_resource());
            }
            api::patch(sh, &t, &q, ty, api::parse_body("application/json", &body)?).await
        }
        (Method::DELETE, true) => {
            let (ct, body) = read_body(req).await?;
            let opts = if body.is_empty() {
                None
            } else {
                Some(api::parse_body(&ct, &body)?)
            };
            api::delete(sh, &t, &q, opts)
        }
        (Method::DELETE, false) => api::delete_collection(sh, &t, &q),
        _ => Err(ApiError::method_not_allowed()),
    }
}

async fn handle_faults(sh: &Shared, req: Request<ReqBody>, what: &str) -> Result<Value, ApiError> {
    if req.method() != Method::POST {
        return Err(ApiError::method_not_allowed());
    }
    let (_, body) = read_body(req).await?;
    let body: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(e.to_string()))?
    };
    fn de<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
        serde_json::from_value(v).map_err(|e| ApiError::bad_request(e.to_string()))
    }
    let f = &sh.faults;
    match what {
        "close-watches" => f.close_watches(),
        "fail" => {
            let r: FailRequest = de(body)?;
            let failure = match r.code {
                500 => Failure::Internal,
                429 => Failure::TooManyRequests {
                    retry_after_seconds: r.retry_after_seconds,
                },
                c => return Err(ApiError::bad_request(format!("unsupported code {c}"))),
            };
            f.fail_next(r.count, failure);
        }
        "latency" => f.set_latency(Duration::from_millis(de::<DurationRequest>(body)?.millis)),
        "compact" => f.compact_history(),
        "refuse" => {
            f.refuse_connections(Duration::from_millis(de::<DurationRequest>(body)?.millis))
                .await
        }
        "conflict" => {
            let r: ConflictRequest = de(body)?;
            f.conflict_next_write(&r.resource, &r.namespace, &r.name);
        }
        "request" => {
            let r: RequestFault = de(body)?;
            r.check().map_err(ApiError::bad_request)?;
            f.fail_nth(r);
        }
        "reset" => f.reset(),
        _ => return Err(ApiError::path_not_found()),
    }
    Ok(json!({ "ok": true, "fault": what }))
}

/// Answers one request; an error closes the connection without an answer
/// (an injected [`FaultAnswer::Drop`] or [`FaultAnswer::DropAfter`]).
async fn handle(sh: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, io::Error> {
    let req = req.map(BodyExt::boxed_unsync);
    let path = req.uri().path().to_string();
    if let Some(what) = path.strip_prefix("/_faults/") {
        let what = what.to_string();
        return Ok(match handle_faults(&sh, req, &what).await {
            Ok(v) => json_response(200, &v),
            Err(e) => error_response(&e),
        });
    }
    let q = parse_query(req.uri().query());
    let attributes = (sh.requests.enabled() || sh.faults.request_faults_armed()).then(|| {
        let user_agent = req
            .headers()
            .get(USER_AGENT)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        Attributes::of(req.method(), &path, &q, user_agent)
    });
    let resp = respond(&sh, req, &path, q, attributes.as_ref()).await;
    if let Some(a) = attributes {
        // Code 0: no answer was sent.
        sh.requests
            .record(a, resp.as_ref().map_or(0, |r| r.status().as_u16()));
    }
    resp.ok_or_else(|| io::Error::other("connection dropped by an injected fault"))
}

/// The answer to a request, after the injected latency and failures; `None`:
/// close the connection without one.
async fn respond(
    sh: &Arc<Shared>,
    req: Request<ReqBody>,
    path: &str,
    q: Query,
    attributes: Option<&Attributes>,
) -> Option<Response<Body>> {
    if let Some(d) = sh.faults.latency() {
        tokio::time::sleep(d).await;
    }
    if let Some(e) = sh.faults.take_failure() {
        return Some(error_response(&e));
    }
    let Some(Attributes::Resource(r)) = attributes.filter(|_| sh.faults.request_faults_armed())
    else {
        return Some(serve(sh, req, path, q).await);
    };
    let (req, body_name) = match create_name(req, r).await {
        Ok(v) => v,
        Err(e) => return Some(error_response(&e)),
    };
    let name = r.name.as_deref().or(body_name.as_deref());
    match sh.faults.take_request_fault(r, name) {
        None => Some(serve(sh, req, path, q).await),
        Some(FaultAnswer::Status(code)) => Some(error_response(&injected_status(code, r, name))),
        Some(FaultAnswer::Drop) => {
            // Received in full, then lost.
            let _ = read_body(req).await;
            None
        }
        Some(FaultAnswer::DropAfter) => {
            drop(serve(sh, req, path, q).await);
            None
        }
    }
}

/// For a create, the name in its body (`metadata.name`, else
/// `metadata.generateName`), read ahead and put back into the request.
async fn create_name(
    req: Request<ReqBody>,
    r: &audit::Request,
) -> Result<(Request<ReqBody>, Option<String>), ApiError> {
    if r.verb != "create" || r.name.is_some() {
        return Ok((req, None));
    }
    let ct = content_type(&req);
    let (parts, body) = req.into_parts();
    let bytes = collect_body(body).await?;
    let name = api::parse_body(&ct, &bytes).ok().and_then(|v| {
        ["/metadata/name", "/metadata/generateName"]
            .iter()
            .filter_map(|p| v.pointer(p).and_then(Value::as_str))
            .find(|n| !n.is_empty())
            .map(str::to_string)
    });
    let body = Full::new(bytes)
        .map_err(|e: Infallible| match e {})
        .boxed_unsync();
    Ok((Request::from_parts(parts, body), name))
}

/// Routes a request to discovery or the resource API.
async fn serve(sh: &Arc<Shared>, req: Request<ReqBody>, path: &str, q: Query) -> Response<Body> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let get_only = |v: Option<Value>| -> Response<Body> {
        match v {
            Some(v) if req.method() == Method::GET => json_response(200, &v),
            Some(_) => error_response(&ApiError::method_not_allowed()),
            None => error_response(&ApiError::path_not_found()),
        }
    };
    let served = || sh.store.served_all();
    match segs.as_slice() {
        ["version"] => get_only(Some(discovery::version())),
        ["healthz" | "readyz" | "livez"] => full(200, "text/plain", Bytes::from_static(b"ok")),
        ["api"] => get_only(Some(discovery::api_versions(&sh.addr.to_string()))),
        ["apis"] => get_only(Some(discovery::api_group_list(&served()))),
        ["api", "v1"] => get_only(discovery::api_resource_list("", "v1", &served())),
        ["apis", g] => match discovery::api_group(g, &served()) {
            None => group_path_not_found(g),
            doc => get_only(doc),
        },
        ["apis", g, v] => match discovery::api_resource_list(g, v, &served()) {
            None => group_path_not_found(g),
            doc => get_only(doc),
        },
        ["openapi", "v2"] | ["swagger-2.0.0.pb-v1"] if req.method() == Method::GET => full(
            200,
            // What kube-apiserver answers; kubectl cannot parse the Accept type back.
            "application/octet-stream",
            Bytes::from(discovery::openapi_v2_protobuf()),
        ),
        ["openapi", "v3"] => get_only(Some(discovery::openapi_v3_index(&served()))),
        ["openapi", "v3", "api", v] => {
            get_only(discovery::openapi_v3_group_version("", v, &served()))
        }
        ["openapi", "v3", "apis", g, v] => {
            get_only(discovery::openapi_v3_group_version(g, v, &served()))
        }
        ["api", "v1", rest @ ..] => resource_response(sh, req, "", "v1", rest, q).await,
        ["apis", g, v, rest @ ..] => {
            let (g, v) = (g.to_string(), v.to_string());
            let rest: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
            resource_response(sh, req, &g, &v, &rest, q).await
        }
        _ => error_response(&ApiError::path_not_found()),
    }
}

async fn resource_response(
    sh: &Shared,
    req: Request<ReqBody>,
    group: &str,
    version: &str,
    rest: &[&str],
    q: Query,
) -> Response<Body> {
    let served = |res: ResourceId| !RESOURCES[res].custom || sh.store.served(res);
    let Some((t, legacy_watch)) = route(group, version, rest, &served) else {
        return group_path_not_found(group);
    };
    let protobuf =
        crate::protobuf::prefers_protobuf(req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()));
    match handle_resource(sh, req, t, legacy_watch, q).await {
        Ok(r) => reply_response(r, protobuf),
        Err(e) => error_response(&e),
    }
}

fn serve_connection(stream: TcpStream, sh: Arc<Shared>, mut stop: watch::Receiver<u64>) {
    let _ = stream.set_nodelay(true);
    tokio::spawn(async move {
        stop.mark_unchanged();
        let svc = service_fn(move |req| handle(sh.clone(), req));
        let conn = http1::Builder::new()
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), svc);
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = stop.changed() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    });
}

async fn rebind(addr: SocketAddr) -> io::Result<TcpListener> {
    let mut last = None;
    for _ in 0..100 {
        match TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(last.expect("tried at least once"))
}

/// Accept connections until shut down; obey fault control commands.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    sh: Arc<Shared>,
    mut control: mpsc::UnboundedReceiver<Control>,
    mut shutdown: watch::Receiver<bool>,
) {
    let (stop_conns, _) = watch::channel(0u64);
    let mut listener = Some(listener);
    loop {
        let Some(l) = listener.as_ref() else {
            return;
        };
        tokio::select! {
            r = l.accept() => {
                if let Ok((stream, _)) = r {
                    serve_connection(stream, sh.clone(), stop_conns.subscribe());
                }
            }
            Some(cmd) = control.recv() => match cmd {
                Control::Refuse(d, ack) => {
                    drop(listener.take());
                    sh.faults.signal_watches(WatchClose::Abort);
                    stop_conns.send_modify(|e| *e += 1);
                    let _ = ack.send(());
                    tokio::select! {
                        _ = tokio::time::sleep(d) => {}
                        _ = shutdown.changed() => return,
                    }
                    match rebind(sh.addr).await {
                        Ok(l) => listener = Some(l),
                        Err(e) => {
                            tracing::error!(addr = %sh.addr, error = %e, "cannot listen again after refusing connections");
                            return;
                        }
                    }
                }
            },
            _ = shutdown.changed() => {
                sh.faults.signal_watches(WatchClose::Abort);
                stop_conns.send_modify(|e| *e += 1);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = parse_query(Some("labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1&x"));
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        assert_eq!(q["watch"], "1");
        assert_eq!(q["x"], "");
    }

    #[test]
    fn routes() {
        let all = |_: ResourceId| true;
        let route = |g, v, segs: &[&str]| route(g, v, segs, &all);
        let (t, w) = route("", "v1", &["namespaces", "ns", "configmaps", "x"]).unwrap();
        assert_eq!(t.namespace.as_deref(), Some("ns"));
        assert_eq!(t.name.as_deref(), Some("x"));
        assert!(!w);
        let (t, _) = route("", "v1", &["namespaces", "ns"]).unwrap();
        assert_eq!(RESOURCES[t.resource].plural, "namespaces");
        assert_eq!(t.name.as_deref(), Some("ns"));
        let (t, _) = route("", "v1", &["namespaces", "ns", "status"]).unwrap();
        assert_eq!(t.subresource.as_deref(), Some("status"));
        let (t, w) = route("", "v1", &["watch", "configmaps"]).unwrap();
        assert!(w && t.namespace.is_none() && t.name.is_none());
        assert!(route("", "v1", &["configmaps", "x"]).is_none());
        assert!(
            route(
                "apps",
                "v1",
                &["namespaces", "a", "deployments", "d", "status"]
            )
            .is_some()
        );
    }

    #[test]
    fn unserved_resources_are_unknown_paths() {
        let builtin = |r: ResourceId| !RESOURCES[r].custom;
        let ro = ["namespaces", "default", "rollouts", "r"];
        assert!(route("argoproj.io", "v1alpha1", &ro, &builtin).is_none());
        assert!(route("argoproj.io", "v1alpha1", &["rollouts"], &builtin).is_none());
        assert!(route("argoproj.io", "v1alpha1", &ro, &|_| true).is_some());
        assert!(route("apps", "v1", &["deployments"], &builtin).is_some());
    }
}
