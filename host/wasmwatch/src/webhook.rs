//! The optional mutating admission webhook (issue 34 §4, off by default):
//! a restart's records survive a GitOps apply.
//!
//! `run --webhook-addr` serves `POST /mutate` over HTTPS. The API server
//! sends it an `AdmissionReview` for each create or update of a workload
//! its MutatingWebhookConfiguration selects (deploy/overlays/webhook: the
//! workloads labelled `wasmwatch.io/webhook: enabled`). An UPDATE that
//! drops a record a restart wrote (Argo CD or Flux applying the manifest
//! from git) gets it back as a JSON Patch
//! ([`wasmwatch_exec::admission::restore_records`]): the pod template stays
//! as it was, so the apply rolls nothing, and the same content does not
//! restart the workload again. Everything else is allowed unchanged. The
//! answer depends on the request only (no plugin, no API call, no
//! leadership), so every replica answers alike.
//!
//! TLS, as kube-apiserver calls webhooks only over HTTPS:
//! - `--webhook-cert-dir`: `tls.crt` and `tls.key` in a folder (a
//!   cert-manager Secret mounted there), read again when they change;
//! - `--webhook-generate-cert`: a CA and a serving certificate generated
//!   once and kept in Secret `wasmwatch-webhook-tls` (every replica uses
//!   the same; delete it to have new ones made), and the CA written into
//!   the MutatingWebhookConfiguration's `caBundle`, checked every minute
//!   (an apply that resets it is repaired).
//!
//! Plain hyper and tokio-rustls, as the admin port: one path needs no
//! router.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// The largest AdmissionReview read (kube-apiserver's objects are at most
/// ~1.5 MiB; a review holds two).
const MAX_REVIEW: usize = 8 * 1024 * 1024;

/// How often the generated CA is checked in the configuration's caBundle.
const CA_BUNDLE_CHECK: Duration = Duration::from_secs(60);

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum WebhookTls {
    /// `tls.crt` (the chain) and `tls.key` in this folder.
    Dir(PathBuf),
    /// Generated once, kept in Secret `namespace/secret`, its CA written
    /// into MutatingWebhookConfiguration `configuration`.
    Generate {
        namespace: String,
        secret: String,
        configuration: String,
        /// The names (and IP addresses) the certificate is for.
        names: Vec<String>,
    },
}

/// `run --webhook-*`.
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    pub addr: SocketAddr,
    pub tls: WebhookTls,
}

/// Starts the webhook: binds, gets the certificate, serves until the task
/// is dropped. Returns the address bound.
pub async fn start(
    options: &WebhookOptions,
    client: &kube::Client,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver: Arc<dyn ResolvesServerCert> = match &options.tls {
        WebhookTls::Dir(dir) => Arc::new(DirCert::load(dir.clone(), provider.clone())?),
        WebhookTls::Generate {
            namespace,
            secret,
            configuration,
            names,
        } => {
            let pair = generated(client, namespace, secret, names).await?;
            let key = pair.certified(&provider)?;
            tokio::spawn(keep_ca_bundle(
                client.clone(),
                configuration.clone(),
                pair.ca.clone(),
            ));
            Arc::new(Fixed(Arc::new(key)))
        }
    };
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions for the webhook")?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(options.addr)
        .await
        .with_context(|| format!("cannot listen on {} for the webhook", options.addr))?;
    let addr = listener.local_addr()?;
    tracing::info!("admission webhook listening on https://{addr}/mutate");
    Ok((addr, tokio::spawn(serve(listener, acceptor))))
}

async fn serve(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let stream = match acceptor.accept(stream).await {
                Ok(s) => s,
                Err(error) => {
                    tracing::debug!(%peer, %error, "webhook TLS handshake failed");
                    return;
                }
            };
            let service =
                hyper::service::service_fn(
                    |req| async move { Ok::<_, Infallible>(handle(req).await) },
                );
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn reply(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts")
}

fn bad_request(message: String) -> Response<Full<Bytes>> {
    tracing::warn!("webhook: {message}");
    reply(
        StatusCode::BAD_REQUEST,
        serde_json::to_vec(&json!({"error": message})).expect("JSON"),
    )
}

async fn handle(req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::POST || req.uri().path() != "/mutate" {
        return reply(StatusCode::NOT_FOUND, b"{}".to_vec());
    }
    let body = match Limited::new(req.into_body(), MAX_REVIEW).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return bad_request(format!("cannot read the AdmissionReview: {e}")),
    };
    let review: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("the body is not JSON: {e}")),
    };
    match review_answer(&review) {
        Ok(answer) => reply(StatusCode::OK, serde_json::to_vec(&answer).expect("JSON")),
        Err(message) => bad_request(message),
    }
}

/// The AdmissionReview answering `review`: allowed, with the JSON Patch
/// that restores the records an UPDATE dropped (none for anything else).
pub fn review_answer(review: &Value) -> Result<Value, String> {
    let request = review
        .get("request")
        .ok_or("an AdmissionReview without `request`")?;
    let uid = request
        .get("uid")
        .and_then(Value::as_str)
        .ok_or("an AdmissionReview request without `uid`")?;
    let mut response = json!({"uid": uid, "allowed": true});
    let operation = request.get("operation").and_then(Value::as_str);
    if let (Some("UPDATE"), Some(old), Some(new)) = (
        operation,
        request.get("oldObject").filter(|o| o.is_object()),
        request.get("object").filter(|o| o.is_object()),
    ) {
        let field = |f: &str| {
            request
                .pointer(&format!("/kind/{f}"))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        let patch =
            wasmwatch_exec::admission::restore_records(field("group"), field("kind"), old, new);
        if !patch.is_empty() {
            let text = |f: &str| request.get(f).and_then(|v| v.as_str()).unwrap_or("");
            tracing::info!(
                kind = field("kind"),
                namespace = text("namespace"),
                name = text("name"),
                restored = patch.len(),
                "webhook: restart records put back on an update that dropped them"
            );
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(BASE64.encode(serde_json::to_vec(&patch).expect("JSON")));
        }
    }
    Ok(json!({
        "apiVersion": review.get("apiVersion").and_then(Value::as_str).unwrap_or("admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }))
}

/// One certificate, always.
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// `tls.crt` and `tls.key` of a folder, read again when either file's
/// modification time changes (a renewed cert-manager Secret); a pair that
/// does not load keeps the one before.
#[derive(Debug)]
struct DirCert {
    dir: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    loaded: Mutex<(Option<SystemTime>, Option<SystemTime>, Arc<CertifiedKey>)>,
}

impl DirCert {
    fn load(dir: PathBuf, provider: Arc<rustls::crypto::CryptoProvider>) -> anyhow::Result<Self> {
        let key = load_pair(&dir, &provider)?;
        let (c, k) = mtimes(&dir);
        Ok(DirCert {
            dir,
            provider,
            loaded: Mutex::new((c, k, Arc::new(key))),
        })
    }
}

fn mtimes(dir: &std::path::Path) -> (Option<SystemTime>, Option<SystemTime>) {
    let m = |f: &str| {
        std::fs::metadata(dir.join(f))
            .and_then(|m| m.modified())
            .ok()
    };
    (m("tls.crt"), m("tls.key"))
}

fn load_pair(
    dir: &std::path::Path,
    provider: &rustls::crypto::CryptoProvider,
) -> anyhow::Result<CertifiedKey> {
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let chain = CertificateDer::pem_file_iter(&crt)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("cannot read the certificates in {}", crt.display()))?;
    anyhow::ensure!(!chain.is_empty(), "no certificate in {}", crt.display());
    let key = PrivateKeyDer::from_pem_file(&key)
        .with_context(|| format!("cannot read the private key in {}", key.display()))?;
    CertifiedKey::from_der(chain, key, provider)
        .with_context(|| format!("the key in {} does not fit its certificate", dir.display()))
}

impl ResolvesServerCert for DirCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let now = mtimes(&self.dir);
        if (loaded.0, loaded.1) != now {
            match load_pair(&self.dir, &self.provider) {
                Ok(key) => {
                    tracing::info!(dir = %self.dir.display(), "webhook certificate read again");
                    *loaded = (now.0, now.1, Arc::new(key));
                }
                Err(error) => {
                    tracing::warn!(%error, "webhook certificate changed but does not load; keeping the one before");
                    loaded.0 = now.0;
                    loaded.1 = now.1;
                }
            }
        }
        Some(loaded.2.clone())
    }
}

/// A generated CA and serving certificate, as PEM.
#[derive(Debug, Clone)]
struct Generated {
    ca: String,
    cert: String,
    key: String,
}

impl Generated {
    fn new(names: &[String]) -> anyhow::Result<Generated> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "wasmwatch webhook CA");
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(names.to_vec())
            .context("the webhook's names are not valid certificate names")?;
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            names.first().map_or("wasmwatch-webhook", String::as_str),
        );
        let cert = params.signed_by(&key, &ca)?;
        Ok(Generated {
            ca: ca.pem(),
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }

    fn certified(&self, provider: &rustls::crypto::CryptoProvider) -> anyhow::Result<CertifiedKey> {
        let chain = CertificateDer::pem_slice_iter(self.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .context("the generated certificate")?;
        let key =
            PrivateKeyDer::from_pem_slice(self.key.as_bytes()).context("the generated key")?;
        Ok(CertifiedKey::from_der(chain, key, provider)?)
    }
}

/// The generated pair kept in Secret `namespace/name`: read, or made and
/// stored when absent (replicas racing keep the one the API server took).
async fn generated(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    names: &[String],
) -> anyhow::Result<Generated> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("webhook certificate Secret {namespace}/{name}");
    if let Some(secret) = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading {what}"))?
    {
        return from_secret(&secret, &what);
    }
    let made = Generated::new(names)?;
    let field = |s: &str| ByteString(s.as_bytes().to_vec());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "wasmwatch".to_string(),
                )]
                .into(),
            ),
            annotations: Some(
                [(
                    "wasmwatch.io/description".to_string(),
                    format!(
                        "The admission webhook's CA and serving certificate (for {}), \
                         made by wasmwatch. Delete it to have new ones made.",
                        names.join(", ")
                    ),
                )]
                .into(),
            ),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(
            [
                ("ca.crt".to_string(), field(&made.ca)),
                ("tls.crt".to_string(), field(&made.cert)),
                ("tls.key".to_string(), field(&made.key)),
            ]
            .into(),
        ),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(secret = %format!("{namespace}/{name}"), names = %names.join(","), "generated the webhook certificate");
            Ok(made)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let secret = api
                .get(name)
                .await
                .with_context(|| format!("reading {what}"))?;
            from_secret(&secret, &what)
        }
        Err(e) => Err(e).with_context(|| format!("creating {what}")),
    }
}

fn from_secret(secret: &Secret, what: &str) -> anyhow::Result<Generated> {
    let field = |f: &str| -> anyhow::Result<String> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(f))
            .with_context(|| format!("{what} has no `{f}`: delete it to have a new one made"))?;
        String::from_utf8(bytes.0.clone()).with_context(|| format!("{what}: `{f}` is not PEM"))
    };
    Ok(Generated {
        ca: field("ca.crt")?,
        cert: field("tls.crt")?,
        key: field("tls.key")?,
    })
}

/// Keeps `ca` as the caBundle of every webhook of MutatingWebhookConfiguration
/// `name`: now, then every [`CA_BUNDLE_CHECK`].
async fn keep_ca_bundle(client: kube::Client, name: String, ca: String) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let bundle = ByteString(ca.into_bytes());
    let mut missing_told = false;
    loop {
        match set_ca_bundle(&api, &name, &bundle).await {
            Ok(Some(0)) => {}
            Ok(Some(n)) => {
                tracing::info!(configuration = %name, webhooks = n, "webhook CA written into the caBundle")
            }
            Ok(None) if !missing_told => {
                missing_told = true;
                tracing::warn!(
                    configuration = %name,
                    "no MutatingWebhookConfiguration {name}: the API server does not call the webhook \
                     (apply deploy/overlays/webhook); checked again every minute"
                );
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(configuration = %name, %error, "cannot write the webhook CA into the caBundle")
            }
        }
        tokio::time::sleep(CA_BUNDLE_CHECK).await;
    }
}

/// Writes `bundle` into each webhook's `clientConfig.caBundle` that differs;
/// how many it changed, `None` when the configuration does not exist.
async fn set_ca_bundle(
    api: &Api<MutatingWebhookConfiguration>,
    name: &str,
    bundle: &ByteString,
) -> Result<Option<usize>, kube::Error> {
    for _ in 0..5 {
        let Some(mut config) = api.get_opt(name).await? else {
            return Ok(None);
        };
        let mut changed = 0;
        for webhook in config.webhooks.iter_mut().flatten() {
            if webhook.client_config.ca_bundle.as_ref() != Some(bundle) {
                webhook.client_config.ca_bundle = Some(bundle.clone());
                changed += 1;
            }
        }
        if changed == 0 {
            return Ok(Some(0));
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => return Ok(Some(changed)),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(Some(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_dropping_a_record_is_answered_with_the_patch_restoring_it() {
        let template = |annotations: Value| {
            json!({"metadata": {"name": "web"}, "spec": {"template": {
                "metadata": {"annotations": annotations},
                "spec": {"containers": [{"name": "app"}]}}}})
        };
        let review = |operation: &str| {
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
                "uid": "u-1", "operation": operation,
                "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                "namespace": "shop", "name": "web",
                "oldObject": template(json!({"config-hash.wasmwatch.io/configmap.cfg": "configmap/cfg:1"})),
                "object": template(json!({}))}})
        };
        let answer = review_answer(&review("UPDATE")).unwrap();
        assert_eq!(answer["response"]["uid"], "u-1");
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
        let patch: Value = serde_json::from_slice(
            &BASE64
                .decode(answer["response"]["patch"].as_str().unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            patch,
            json!([{"op": "add",
                "path": "/spec/template/metadata/annotations/config-hash.wasmwatch.io~1configmap.cfg",
                "value": "configmap/cfg:1"}])
        );
        // A CREATE, or a review without objects, is allowed as it is.
        for operation in ["CREATE", "DELETE"] {
            let answer = review_answer(&review(operation)).unwrap();
            assert_eq!(
                answer["response"],
                json!({"uid": "u-1", "allowed": true}),
                "{operation}"
            );
        }
        assert!(review_answer(&json!({"request": {}})).is_err());
    }

    #[test]
    fn a_generated_pair_is_a_ca_and_a_certificate_for_the_names() {
        let pair =
            Generated::new(&["wasmwatch-webhook.ops.svc".into(), "127.0.0.1".into()]).unwrap();
        assert!(pair.ca.starts_with("-----BEGIN CERTIFICATE-----"));
        let provider = rustls::crypto::ring::default_provider();
        pair.certified(&provider).unwrap();
    }
}
