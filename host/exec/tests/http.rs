//! The HTTP executor against real HTTP(S) servers on loopback addresses
//! standing in for pods: which pods a Service refresh calls, what they
//! receive, failure classes, timeouts, TLS.
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use wasmwatch_apiserver::{Config, Server};
use wasmwatch_core::action::{Header, HttpMethod};
use wasmwatch_core::lookups::{Endpoint, ServiceEndpoints, ServiceInfo, ServicePort};
use wasmwatch_core::{Lookups, StaticLookups};
use wasmwatch_exec::ExecError;
use wasmwatch_exec::http::{HttpExecutor, RefreshReport};
use wasmwatch_kube::lookups::KubeLookups;

const REFRESH: &str = "/actuator/refresh";

/// One request as a pod saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    content_length: Option<String>,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

/// An HTTP(S) server standing in for a pod. Stops when dropped.
struct Pod {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Pod {
    /// Serves on `listener`, answering `status` after `delay`.
    fn serve(listener: TcpListener, status: u16, delay: Duration, tls: Option<TlsAcceptor>) -> Pod {
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let log = log.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let log = log.clone();
                        async move {
                            let method = req.method().to_string();
                            let path = req.uri().path().to_string();
                            let headers: BTreeMap<String, String> = req
                                .headers()
                                .iter()
                                .map(|(k, v)| {
                                    (k.to_string(), v.to_str().unwrap_or("?").to_string())
                                })
                                .collect();
                            let content_length = headers.get("content-length").cloned();
                            let body = req.into_body().collect().await?.to_bytes().to_vec();
                            log.lock().unwrap().push(Seen {
                                method,
                                path,
                                content_length,
                                headers,
                                body,
                            });
                            tokio::time::sleep(delay).await;
                            let mut resp = Response::new(Full::new(Bytes::from_static(b"{}")));
                            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
                            Ok::<_, hyper::Error>(resp)
                        }
                    });
                    let builder = hyper::server::conn::http1::Builder::new();
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = builder
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        Pod { addr, seen, task }
    }

    async fn start(status: u16) -> Pod {
        Pod::start_with(status, Duration::ZERO, None).await
    }

    async fn start_with(status: u16, delay: Duration, tls: Option<TlsAcceptor>) -> Pod {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Pod::serve(listener, status, delay, tls)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }
}

/// A self-signed certificate for `localhost` (not for 127.0.0.1).
fn self_signed_acceptor() -> TlsAcceptor {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .unwrap();
    TlsAcceptor::from(Arc::new(config))
}

/// A Service whose ready endpoints are `pods` (named `orders-<i>`).
fn lookups_for(pods: &[&Pod]) -> Arc<dyn Lookups> {
    let ready = pods
        .iter()
        .enumerate()
        .map(|(i, pod)| Endpoint {
            address: pod.addr.ip().to_string(),
            pod: Some(format!("orders-{i}")),
            ports: vec![ServicePort {
                name: Some("http".into()),
                port: pod.port(),
            }],
        })
        .collect();
    Arc::new(StaticLookups {
        workloads: vec![],
        services: vec![ServiceInfo {
            namespace: "shop".into(),
            name: "orders".into(),
            labels: Default::default(),
            annotations: Default::default(),
            ports: vec![ServicePort {
                name: Some("http".into()),
                port: 80,
            }],
        }],
        endpoints: vec![ServiceEndpoints {
            namespace: "shop".into(),
            service: "orders".into(),
            ready,
        }],
    })
}

fn executor(lookups: Arc<dyn Lookups>, timeout: Duration) -> HttpExecutor {
    HttpExecutor::new(lookups, timeout)
}

async fn refresh(exec: &HttpExecutor, tls: bool) -> Result<RefreshReport, ExecError> {
    exec.refresh_service("shop", "orders", HttpMethod::Post, None, REFRESH, tls)
        .await
}

fn assert_one_refresh(pod: &Pod) {
    let seen = pod.seen();
    assert_eq!(seen.len(), 1, "{} saw {seen:?}", pod.addr);
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].path, REFRESH);
    assert_eq!(seen[0].content_length.as_deref(), Some("0"));
    assert!(seen[0].body.is_empty());
}

/// Listeners on 127.0.0.1 to 127.0.0.<n> with one common port, as pods of
/// one EndpointSlice share their port.
async fn listeners_on_one_port(n: u8) -> Vec<TcpListener> {
    'attempt: for _ in 0..20 {
        let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        let mut all = vec![first];
        for i in 2..=n {
            let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, i));
            match TcpListener::bind(SocketAddr::new(ip, port)).await {
                Ok(l) => all.push(l),
                Err(_) => continue 'attempt,
            }
        }
        return all;
    }
    panic!("no port free on 127.0.0.1-{n}");
}

/// The whole path: a Service and its EndpointSlice (3 ready endpoints, 1
/// not ready) in the test API server, seen through the kube-backed
/// lookups; exactly the ready pods get one bodyless POST.
#[tokio::test]
async fn refresh_calls_exactly_the_ready_pods() {
    let pods: Vec<Pod> = listeners_on_one_port(4)
        .await
        .into_iter()
        .map(|l| Pod::serve(l, 200, Duration::ZERO, None))
        .collect();
    let port = pods[0].port();

    let server = Server::start(Config::default().auto_create_namespaces(true))
        .await
        .unwrap();
    let client = server.client().unwrap();
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": {
            "selector": {"app": "orders"},
            "ports": [{"name": "http", "port": 80, "targetPort": port}],
        },
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), "shop")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let endpoint = |i: usize, ready: bool| {
        json!({
            "addresses": [pods[i].addr.ip().to_string()],
            "conditions": {"ready": ready},
            "targetRef": {"kind": "Pod", "namespace": "shop", "name": format!("orders-{i}")},
        })
    };
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {
            "name": "orders-abcde",
            "namespace": "shop",
            "labels": {"kubernetes.io/service-name": "orders"},
        },
        "addressType": "IPv4",
        "endpoints": [endpoint(0, true), endpoint(1, true), endpoint(2, true), endpoint(3, false)],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(client.clone(), "shop")
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();

    let lookups = KubeLookups::start(client, Some(vec!["shop".into()]));
    tokio::time::timeout(Duration::from_secs(10), lookups.ready())
        .await
        .expect("lookups ready");
    let exec = executor(lookups.clone(), Duration::from_secs(5));
    let report = refresh(&exec, false).await.unwrap();
    assert_eq!(
        report,
        RefreshReport {
            called: 3,
            succeeded: 3
        }
    );
    for pod in &pods[..3] {
        assert_one_refresh(pod);
    }
    assert!(pods[3].seen().is_empty(), "the not-ready pod was called");
}

#[tokio::test]
async fn a_pod_answering_500_is_retryable_and_named() {
    let ok = Pod::start(200).await;
    let failing = Pod::start(500).await;
    let exec = executor(lookups_for(&[&ok, &failing]), Duration::from_secs(5));
    let err = refresh(&exec, false).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("service shop/orders"), "{text}");
    assert!(text.contains("1 of 2 pods failed"), "{text}");
    assert!(text.contains("pod orders-1 (127.0.0.1)"), "{text}");
    assert!(text.contains("500"), "{text}");
    assert!(!text.contains("orders-0"), "{text}");
    // Every pod was called anyway.
    assert_one_refresh(&ok);
    assert_one_refresh(&failing);
}

#[tokio::test]
async fn a_pod_answering_404_is_permanent() {
    let ok = Pod::start(200).await;
    let missing = Pod::start(404).await;
    let unavailable = Pod::start(503).await;
    let exec = executor(
        lookups_for(&[&ok, &missing, &unavailable]),
        Duration::from_secs(5),
    );
    let err = refresh(&exec, false).await.unwrap_err();
    // Any permanent failure makes the whole refresh permanent.
    assert!(matches!(err, ExecError::Permanent(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("pod orders-1") && text.contains("404"),
        "{text}"
    );
    assert!(
        text.contains("pod orders-2") && text.contains("503"),
        "{text}"
    );

    let exec = executor(lookups_for(&[&missing]), Duration::from_secs(5));
    let err = refresh(&exec, false).await.unwrap_err();
    assert!(matches!(err, ExecError::Permanent(_)), "{err:?}");
}

#[tokio::test]
async fn a_dead_port_is_retryable() {
    // A port that was just free: nothing listens there.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let exec = executor(lookups_for_addr(addr), Duration::from_secs(5));
    let t = Instant::now();
    let err = refresh(&exec, false).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("connection failed"), "{err}");
    assert!(err.to_string().contains("orders-0"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    let err = exec
        .call(HttpMethod::Get, &format!("http://{addr}/health"), &[], None)
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        err.to_string()
            .contains(&format!("GET http://{addr}/health")),
        "{err}"
    );
}

fn lookups_for_addr(addr: SocketAddr) -> Arc<dyn Lookups> {
    Arc::new(StaticLookups {
        workloads: vec![],
        services: vec![ServiceInfo {
            namespace: "shop".into(),
            name: "orders".into(),
            labels: Default::default(),
            annotations: Default::default(),
            ports: vec![],
        }],
        endpoints: vec![ServiceEndpoints {
            namespace: "shop".into(),
            service: "orders".into(),
            ready: vec![Endpoint {
                address: addr.ip().to_string(),
                pod: Some("orders-0".into()),
                ports: vec![ServicePort {
                    name: None,
                    port: addr.port(),
                }],
            }],
        }],
    })
}

#[tokio::test]
async fn a_slow_pod_times_out_retryably_within_the_timeout() {
    let slow = Pod::start_with(200, Duration::from_secs(10), None).await;
    let timeout = Duration::from_millis(300);
    let exec = executor(lookups_for(&[&slow]), timeout);
    let t = Instant::now();
    let err = refresh(&exec, false).await.unwrap_err();
    let took = t.elapsed();
    assert!(err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("no response within"), "{err}");
    assert!(took >= timeout, "{took:?}");
    assert!(took < timeout + Duration::from_millis(500), "{took:?}");
}

#[tokio::test]
async fn refresh_over_tls_accepts_a_self_signed_pod() {
    let pod = Pod::start_with(200, Duration::ZERO, Some(self_signed_acceptor())).await;
    let exec = executor(lookups_for(&[&pod]), Duration::from_secs(5));
    let report = refresh(&exec, true).await.unwrap();
    assert_eq!(report.called, 1);
    assert_one_refresh(&pod);

    // The same pod spoken to in plain HTTP is no HTTP server: a failure.
    let err = refresh(&exec, false).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}

#[tokio::test]
async fn call_verifies_certificates() {
    let pod = Pod::start_with(200, Duration::ZERO, Some(self_signed_acceptor())).await;
    let exec = executor(lookups_for(&[]), Duration::from_secs(5));
    for url in [
        format!("https://127.0.0.1:{}/hook", pod.port()),
        format!("https://localhost:{}/hook", pod.port()),
    ] {
        let err = exec
            .call(HttpMethod::Post, &url, &[], Some(b"{}"))
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        let text = err.to_string().to_lowercase();
        assert!(text.contains(&url.to_lowercase()), "{text}");
        assert!(text.contains("certificate"), "{text}");
    }
    assert!(
        pod.seen().is_empty(),
        "no request crossed an untrusted connection"
    );
}

#[tokio::test]
async fn call_sends_method_headers_and_body() {
    let pod = Pod::start(202).await;
    let exec = executor(lookups_for(&[]), Duration::from_secs(5));
    let url = format!("http://127.0.0.1:{}/hooks/config", pod.port());
    let headers = [Header {
        name: "X-Config-Change".into(),
        value: "shop/orders".into(),
    }];
    let status = exec
        .call(HttpMethod::Put, &url, &headers, Some(b"{\"changed\":true}"))
        .await
        .unwrap();
    assert_eq!(status, 202);
    let seen = pod.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "PUT");
    assert_eq!(seen[0].path, "/hooks/config");
    assert_eq!(seen[0].body, b"{\"changed\":true}");
    assert_eq!(seen[0].content_length.as_deref(), Some("16"));
    assert_eq!(
        seen[0].headers.get("x-config-change").map(String::as_str),
        Some("shop/orders")
    );

    let gone = Pod::start(410).await;
    let url = format!("http://127.0.0.1:{}/x", gone.port());
    let err = exec
        .call(HttpMethod::Get, &url, &[], None)
        .await
        .unwrap_err();
    assert!(matches!(err, ExecError::Permanent(_)), "{err:?}");
    assert!(err.to_string().contains("410"), "{err}");
    let busy = Pod::start(429).await;
    let url = format!("http://127.0.0.1:{}/x", busy.port());
    let err = exec
        .call(HttpMethod::Get, &url, &[], None)
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(
        busy.seen()[0].content_length,
        None,
        "no Content-Length on a GET"
    );
}
