//! HTTP executors: one call ([`Action::Http`](wasmwatch_core::Action::Http))
//! and a Service refresh
//! ([`Action::RefreshService`](wasmwatch_core::Action::RefreshService)), the
//! way Spring Cloud Kubernetes' configuration watcher posts
//! `/actuator/refresh` to every instance of an app.
//!
//! ```text
//! call(method, url, headers, body) ─▶ verified client ─▶ status
//! refresh_service(ns, svc, ..) ─▶ Lookups::service ─▶ ready endpoints
//!     ─▶ <scheme>://<address>:<port><path> on each, concurrently
//!        (pod client: TLS without certificate verification) ─▶ RefreshReport
//! ```
//!
//! Outcomes: 2xx is success; 408, 429, 5xx, connection failures and timeouts
//! are [`ExecError::Retryable`]; every other status is
//! [`ExecError::Permanent`]. Every message names the method, the URL and the
//! status or cause.
//!
//! ## TLS
//!
//! - [`HttpExecutor::call`] on an `https` URL verifies the server's
//!   certificate against the system's trust store (`/etc/ssl/certs`, read
//!   once at start-up through `rustls-native-certs`; the container image
//!   ships the Debian CA bundle). A certificate that does not verify is a
//!   connection failure (retryable: certificates get fixed and rotated).
//! - [`HttpExecutor::refresh_service`] with `tls = true` **does not verify
//!   the pods' certificates**. Pods are reached by IP address, which their
//!   certificates rarely name, and there is no CA to check them against in
//!   general; Spring's watcher offers the same trade-off as an insecure
//!   option. The connection is encrypted, and the handshake signature is
//!   still checked against the presented certificate's key, but anyone able
//!   to answer on a pod's IP can impersonate the pod. The request carries no
//!   secret (a bodyless POST), so the exposure is that a refresh can be
//!   swallowed, never that data leaks. Plugins and operators who need
//!   verified TLS use an `http` action with a URL whose name the certificate
//!   holds.
//!
//! ## Requests
//!
//! HTTP/1.1 with connection pooling (idle connections kept 30 s, at most 4
//! per host). A request without a body and with a method that usually has
//! one (POST, PUT, PATCH) carries `Content-Length: 0`, as Spring's watcher
//! sends its bodyless POST. The timeout covers connecting and receiving the
//! response head; the response body (bounded, discarded) only decides
//! whether the connection can be reused.
use std::net::Ipv6Addr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_LENGTH, HeaderName, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tracing::{debug, info, warn};
use wasmwatch_core::Lookups;
use wasmwatch_core::action::{Header, HttpMethod};
use wasmwatch_core::lookups::{Endpoint, ServiceInfo};

use crate::{ExecError, error_chain};

/// How many pods of one Service are called at the same time.
const MAX_CONCURRENT_PODS: usize = 32;
/// Response bodies are read (and discarded) up to this size so the
/// connection can be reused; a larger body closes the connection instead.
const MAX_DRAINED_BODY: usize = 64 * 1024;

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Executes HTTP calls and Service refreshes. Cheap to share (`Arc`); the
/// clients inside pool their connections.
pub struct HttpExecutor {
    lookups: Arc<dyn Lookups>,
    timeout: Duration,
    /// Verifies certificates: for [`HttpExecutor::call`].
    verified: HttpsClient,
    /// Accepts any certificate: for pods reached by IP (see the module docs).
    pods: HttpsClient,
}

/// One pod a Service refresh calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefreshTarget {
    /// `pod NAME (ADDRESS)`, or `endpoint ADDRESS`.
    pub label: String,
    /// The URL called, or why this pod cannot be called.
    pub url: Result<String, ExecError>,
}

/// The pods [`HttpExecutor::refresh_service`] calls, from `lookups` as they
/// are now: one target per ready endpoint (empty: nothing to call). The
/// refresh itself and `wasmwatch run --dry-run` both ask here.
pub fn refresh_targets(
    lookups: &dyn Lookups,
    namespace: &str,
    service: &str,
    port: Option<u16>,
    path: &str,
    tls: bool,
) -> Result<Vec<RefreshTarget>, ExecError> {
    let Some(svc) = lookups.service(namespace, service) else {
        return Err(ExecError::Retryable(format!(
            "refresh of service {namespace}/{service}: service not found"
        )));
    };
    if !path.starts_with('/') {
        return Err(ExecError::Permanent(format!(
            "refresh of service {namespace}/{service}: path {path:?} does not start with '/'"
        )));
    }
    let scheme = if tls { "https" } else { "http" };
    Ok(lookups
        .ready_endpoints(namespace, service)
        .iter()
        .map(|ep| RefreshTarget {
            label: pod_label(ep),
            url: pod_url(scheme, &svc, ep, port, path),
        })
        .collect())
}

/// What a successful [`HttpExecutor::refresh_service`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefreshReport {
    /// Ready endpoints called (0 when the Service has none).
    pub called: usize,
    /// Of those, how many answered 2xx (all of them: a failure is an error).
    pub succeeded: usize,
}

impl HttpExecutor {
    /// `timeout` bounds each request (connect and response head).
    pub fn new(lookups: Arc<dyn Lookups>, timeout: Duration) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verified = client(verified_tls(provider.clone()), timeout);
        let pods = client(unverified_tls(provider), timeout);
        HttpExecutor {
            lookups,
            timeout,
            verified,
            pods,
        }
    }

    /// One request. Returns the 2xx status.
    pub async fn call(
        &self,
        method: HttpMethod,
        url: &str,
        headers: &[Header],
        body: Option<&[u8]>,
    ) -> Result<u16, ExecError> {
        self.send(&self.verified, method, url, headers, body).await
    }

    /// The uid of Service `namespace/name`, as the lookups know it.
    pub fn service_uid(&self, namespace: &str, name: &str) -> Option<String> {
        self.lookups.service_uid(namespace, name)
    }

    /// Calls `path` on every ready endpoint of the Service, concurrently.
    ///
    /// The port is `port` if given, else the endpoint's first port, else the
    /// Service's first port (Spring's default: the instance's port). An
    /// unknown Service is retryable: the plugin found it in the same caches
    /// moments ago, so its absence is most likely the caches catching up
    /// (a relist, a Service recreated by an apply); a Service really gone
    /// dead-letters after the pipeline's bounded retries. No ready endpoints
    /// is success with 0 pods called (nothing to refresh; new pods read the
    /// new configuration when they start).
    ///
    /// Any failing pod makes the whole refresh an error naming the failing
    /// pods: retryable if every failure is, else permanent. A retry calls
    /// every pod again (actuator refreshes are idempotent).
    pub async fn refresh_service(
        &self,
        namespace: &str,
        service: &str,
        method: HttpMethod,
        port: Option<u16>,
        path: &str,
        tls: bool,
    ) -> Result<RefreshReport, ExecError> {
        let targets = refresh_targets(&*self.lookups, namespace, service, port, path, tls)?;
        if targets.is_empty() {
            warn!(
                namespace,
                service, "refresh: the service has no ready endpoints; nothing to call"
            );
            return Ok(RefreshReport {
                called: 0,
                succeeded: 0,
            });
        }
        // Each call owns its label and URL: futures that borrow the
        // endpoint trip the compiler's higher-ranked lifetime checks once
        // this future is boxed behind `Send`.
        let calls: Vec<_> = targets
            .into_iter()
            .map(|RefreshTarget { label, url }| async move {
                let result = match url {
                    Ok(url) => self.send(&self.pods, method, &url, &[], None).await,
                    Err(e) => Err(e),
                };
                (label, result)
            })
            .collect();
        let results: Vec<(String, Result<u16, ExecError>)> = futures_util::stream::iter(calls)
            .buffer_unordered(MAX_CONCURRENT_PODS)
            .collect()
            .await;
        let called = results.len();
        let failures: Vec<(String, ExecError)> = results
            .into_iter()
            .filter_map(|(label, r)| r.err().map(|e| (label, e)))
            .collect();
        if failures.is_empty() {
            info!(
                namespace,
                service,
                pods = called,
                "refresh: all pods called"
            );
            return Ok(RefreshReport {
                called,
                succeeded: called,
            });
        }
        let all_retryable = failures.iter().all(|(_, e)| e.is_retryable());
        let detail = failures
            .iter()
            .map(|(label, e)| format!("{label}: {e}"))
            .collect::<Vec<_>>()
            .join("; ");
        let message = format!(
            "refresh of service {namespace}/{service}: {} of {called} pods failed: {detail}",
            failures.len()
        );
        Err(if all_retryable {
            ExecError::Retryable(message)
        } else {
            ExecError::Permanent(message)
        })
    }

    async fn send(
        &self,
        client: &HttpsClient,
        method: HttpMethod,
        url: &str,
        headers: &[Header],
        body: Option<&[u8]>,
    ) -> Result<u16, ExecError> {
        let method = http_method(method);
        let what = format!("{method} {}", redact_url(url));
        let request = build_request(&method, url, headers, body)
            .map_err(|cause| ExecError::Permanent(format!("{what}: {cause}")))?;
        let response = match tokio::time::timeout(self.timeout, client.request(request)).await {
            Err(_) => {
                return Err(ExecError::Retryable(format!(
                    "{what}: no response within {:?}",
                    self.timeout
                )));
            }
            Ok(Err(e)) => {
                let kind = if e.is_connect() {
                    "connection failed"
                } else {
                    "request failed"
                };
                return Err(ExecError::Retryable(format!(
                    "{what}: {kind}: {}",
                    error_chain(&e)
                )));
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        // Drain a bounded body so the connection returns to the pool; its
        // content is not needed and failures here change nothing.
        let drain = Limited::new(response.into_body(), MAX_DRAINED_BODY).collect();
        let _ = tokio::time::timeout(self.timeout, drain).await;
        let code = status.as_u16();
        if status.is_success() {
            debug!(%what, code, "http call succeeded");
            return Ok(code);
        }
        let message = format!("{what}: {status}");
        if code == 408 || code == 429 || status.is_server_error() {
            Err(ExecError::Retryable(message))
        } else {
            Err(ExecError::Permanent(message))
        }
    }
}

fn http_method(method: HttpMethod) -> Method {
    match method {
        HttpMethod::Get => Method::GET,
        HttpMethod::Post => Method::POST,
        HttpMethod::Put => Method::PUT,
        HttpMethod::Patch => Method::PATCH,
        HttpMethod::Delete => Method::DELETE,
    }
}

fn build_request(
    method: &Method,
    url: &str,
    headers: &[Header],
    body: Option<&[u8]>,
) -> Result<Request<Full<Bytes>>, String> {
    let uri: Uri = url.parse().map_err(|e| format!("invalid URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        other => {
            return Err(format!(
                "unsupported URL scheme {:?} (http and https only)",
                other.unwrap_or("")
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("URL has no host".to_string());
    }
    let mut builder = Request::builder().method(method.clone()).uri(uri);
    for h in headers {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| format!("invalid header name {:?}", h.name))?;
        let value = HeaderValue::from_str(&h.value)
            .map_err(|_| format!("invalid value for header {:?}", h.name))?;
        builder = builder.header(name, value);
    }
    let body = body.map(Bytes::copy_from_slice).unwrap_or_default();
    let sets_length = headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("content-length"));
    if body.is_empty()
        && !sets_length
        && matches!(*method, Method::POST | Method::PUT | Method::PATCH)
    {
        // hyper sends no Content-Length for an empty body; Spring's watcher
        // and many servers expect an explicit 0 on a bodyless POST.
        builder = builder.header(CONTENT_LENGTH, HeaderValue::from_static("0"));
    }
    builder
        .body(Full::new(body))
        .map_err(|e| format!("invalid request: {e}"))
}

/// `<scheme>://<address>:<port><path>`, IPv6 addresses bracketed.
fn pod_url(
    scheme: &str,
    svc: &ServiceInfo,
    ep: &Endpoint,
    port: Option<u16>,
    path: &str,
) -> Result<String, ExecError> {
    let port = port
        .or_else(|| ep.ports.first().map(|p| p.port))
        .or_else(|| svc.ports.first().map(|p| p.port))
        .ok_or_else(|| {
            ExecError::Permanent(format!(
                "no port to call: the action names none and neither the endpoint nor service {}/{} has one",
                svc.namespace, svc.name
            ))
        })?;
    let host = if ep.address.parse::<Ipv6Addr>().is_ok() {
        format!("[{}]", ep.address)
    } else {
        ep.address.clone()
    };
    Ok(format!("{scheme}://{host}:{port}{path}"))
}

/// How a pod is named in messages: `pod (address)`, or the address alone.
fn pod_label(ep: &Endpoint) -> String {
    match &ep.pod {
        Some(pod) => format!("pod {pod} ({})", ep.address),
        None => format!("endpoint {}", ep.address),
    }
}

fn client(tls: ClientConfig, timeout: Duration) -> HttpsClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(timeout));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(4)
        .build(connector)
}

fn verified_tls(provider: Arc<CryptoProvider>) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        warn!(error = %e, "loading the system's CA certificates");
    }
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        warn!("no system CA certificates found: https calls will fail verification");
    }
    debug!(added, ignored, "system CA certificates loaded");
    ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

fn unverified_tls(provider: Arc<CryptoProvider>) -> ClientConfig {
    ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
        .with_no_client_auth()
}

/// Accepts any server certificate (pods reached by IP; see the module docs)
/// but still checks the handshake signature against the certificate's key.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `url` as logs, reports and Events show it: webhook URLs carry their
/// secret in the path (Slack's `/services/T…/B…/<token>`, Teams',
/// Discord's) or the query, and Events are readable by whoever may list
/// them in the namespace. Kept: scheme, host, port, and path segments that
/// look like names (`services`, `actuator`, `refresh`); replaced by `…`:
/// user info, the query, and every path segment of 20 or more characters,
/// or of 8 or more with two digits (ids, tokens, UUIDs). Not a URL: shown
/// as `…`.
pub fn redact_url(url: &str) -> String {
    let Ok(uri) = url.parse::<Uri>() else {
        return "…".to_string();
    };
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return "…".to_string();
    };
    let host = match authority.as_str().rsplit_once('@') {
        Some((_, host)) => format!("…@{host}"),
        None => authority.as_str().to_string(),
    };
    let path: Vec<&str> = uri
        .path()
        .split('/')
        .map(|seg| {
            let digits = seg.chars().filter(char::is_ascii_digit).count();
            if seg.len() >= 20 || (seg.len() >= 8 && digits >= 2) {
                "…"
            } else {
                seg
            }
        })
        .collect();
    let query = if uri.query().is_some() { "?…" } else { "" };
    format!("{scheme}://{host}{}{query}", path.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmwatch_core::lookups::ServicePort;

    fn svc(ports: &[u16]) -> ServiceInfo {
        ServiceInfo {
            namespace: "shop".into(),
            name: "orders".into(),
            labels: Default::default(),
            annotations: Default::default(),
            ports: ports
                .iter()
                .map(|&port| ServicePort { name: None, port })
                .collect(),
        }
    }

    fn ep(address: &str, ports: &[u16]) -> Endpoint {
        Endpoint {
            address: address.into(),
            pod: None,
            ports: ports
                .iter()
                .map(|&port| ServicePort { name: None, port })
                .collect(),
        }
    }

    #[test]
    fn port_precedence_and_ipv6_brackets() {
        let s = svc(&[80]);
        let url = |e: &Endpoint, p| pod_url("http", &s, e, p, "/r").unwrap();
        assert_eq!(
            url(&ep("10.0.0.1", &[8080]), Some(9090)),
            "http://10.0.0.1:9090/r"
        );
        assert_eq!(
            url(&ep("10.0.0.1", &[8080, 1]), None),
            "http://10.0.0.1:8080/r"
        );
        assert_eq!(url(&ep("10.0.0.1", &[]), None), "http://10.0.0.1:80/r");
        assert_eq!(
            url(&ep("fd00::1", &[8080]), None),
            "http://[fd00::1]:8080/r"
        );
        let none = pod_url("http", &svc(&[]), &ep("10.0.0.1", &[]), None, "/r");
        assert!(matches!(none, Err(ExecError::Permanent(_))));
    }

    #[test]
    fn bodyless_post_says_content_length_zero() {
        let r = build_request(&Method::POST, "http://a:1/x", &[], None).unwrap();
        assert_eq!(r.headers()[CONTENT_LENGTH], "0");
        let r = build_request(&Method::GET, "http://a:1/x", &[], None).unwrap();
        assert!(r.headers().get(CONTENT_LENGTH).is_none());
        assert!(build_request(&Method::GET, "ftp://a/x", &[], None).is_err());
        let bad = [Header {
            name: "bad name".into(),
            value: "v".into(),
        }];
        assert!(build_request(&Method::GET, "http://a/x", &bad, None).is_err());
    }

    #[test]
    fn webhook_secrets_are_not_shown() {
        assert_eq!(
            redact_url(
                "https://hooks.slack.com/services/T0A1B2C3D/B0A1B2C3D/abcdEFGHijklMNOP12345678"
            ),
            "https://hooks.slack.com/services/…/…/…"
        );
        assert_eq!(
            redact_url(
                "https://example.webhook.office.com/webhookb2/3f1c0b9e-1d2c-4e5f-8a9b-0c1d2e3f4a5b@9a8b7c6d-5e4f-3a2b-1c0d-9e8f7a6b5c4d/IncomingWebhook/0123456789abcdef0123456789abcdef/5b4a3f2e-1d0c-9b8a-7f6e-5d4c3b2a1f0e"
            ),
            "https://example.webhook.office.com/webhookb2/…/IncomingWebhook/…/…"
        );
        assert_eq!(
            redact_url("http://user:pw@10.0.0.7:8080/actuator/refresh?token=s3cret"),
            "http://…@10.0.0.7:8080/actuator/refresh?…"
        );
        assert_eq!(
            redact_url("http://10.0.0.7:8080/actuator/refresh"),
            "http://10.0.0.7:8080/actuator/refresh"
        );
        assert_eq!(redact_url("not a url"), "…");
    }
}
