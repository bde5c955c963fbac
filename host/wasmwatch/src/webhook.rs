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
//! router. The reviews are kube-core's `admission` types.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
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
use kube::api::DynamicObject;
use kube::api::PostParams;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
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

/// The webhook's tasks (serving, and keeping the certificate and the
/// caBundle current); they stop when this is dropped.
#[derive(Debug)]
pub struct Webhook {
    pub addr: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 256;
/// How long a client may take for its TLS handshake, its request head, and
/// its request body each.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a certificate folder is looked at for a renewed pair.
const CERT_DIR_POLL: Duration = Duration::from_secs(10);

/// Starts the webhook: gets the certificate, binds, serves.
pub async fn start(options: &WebhookOptions, client: &kube::Client) -> anyhow::Result<Webhook> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let (served, keeper): (Arc<Served>, BoxFuture) = match &options.tls {
        WebhookTls::Dir(dir) => {
            let key = load_pair(dir, &provider)?;
            let served = Arc::new(Served::new(key));
            let keeper = Box::pin(watch_dir(
                dir.clone(),
                provider.clone(),
                served.clone(),
                CERT_DIR_POLL,
            ));
            (served, keeper)
        }
        WebhookTls::Generate {
            namespace,
            secret,
            configuration,
            names,
        } => {
            let pair = generated(client, namespace, secret, names).await?;
            let served = Arc::new(Served::new(pair.certified(&provider)?));
            let keeper = Box::pin(keep_generated(
                client.clone(),
                options.tls.clone(),
                configuration.clone(),
                provider.clone(),
                served.clone(),
                pair,
            ));
            (served, keeper)
        }
    };
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions for the webhook")?
        .with_no_client_auth()
        .with_cert_resolver(served);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(options.addr)
        .await
        .with_context(|| format!("cannot listen on {} for the webhook", options.addr))?;
    let addr = listener.local_addr()?;
    tracing::info!("admission webhook listening on https://{addr}/mutate");
    Ok(Webhook {
        addr,
        tasks: vec![
            tokio::spawn(serve(listener, acceptor)),
            tokio::spawn(keeper),
        ],
    })
}

type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

async fn serve(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, mostly: do not spin.
                tracing::warn!(%error, "webhook: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let stream = match tokio::time::timeout(CLIENT_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(error)) => {
                    tracing::warn!(%peer, %error, "webhook TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "webhook TLS handshake timed out");
                    return;
                }
            };
            let service =
                hyper::service::service_fn(
                    |req| async move { Ok::<_, Infallible>(handle(req).await) },
                );
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(CLIENT_TIMEOUT)
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
    let read = tokio::time::timeout(
        CLIENT_TIMEOUT,
        Limited::new(req.into_body(), MAX_REVIEW).collect(),
    );
    let body = match read.await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) => return bad_request(format!("cannot read the AdmissionReview: {e}")),
        Err(_) => {
            return bad_request(format!(
                "the AdmissionReview did not arrive within {CLIENT_TIMEOUT:?}"
            ));
        }
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

/// The AdmissionReview answering `review` (kube-core's admission types):
/// allowed, with the JSON Patch that restores the records an UPDATE
/// dropped (none for anything else).
pub fn review_answer(review: &Value) -> Result<Value, String> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(review.clone())
        .map_err(|e| format!("not an AdmissionReview: {e}"))?;
    let request: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|_| "an AdmissionReview without `request`".to_string())?;
    let mut response = AdmissionResponse::from(&request);
    if let (Operation::Update, Some(old), Some(new)) =
        (&request.operation, &request.old_object, &request.object)
    {
        let json = |o: &DynamicObject| serde_json::to_value(o).map_err(|e| e.to_string());
        let patch = wasmwatch_exec::admission::restore_records(
            &request.kind.group,
            &request.kind.kind,
            &json(old)?,
            &json(new)?,
        );
        if !patch.is_empty() {
            tracing::info!(
                kind = %request.kind.kind,
                namespace = request.namespace.as_deref().unwrap_or(""),
                name = %request.name,
                restored = patch.len(),
                "webhook: restart records put back on an update that dropped them"
            );
            let patch: json_patch::Patch =
                serde_json::from_value(Value::Array(patch)).map_err(|e| e.to_string())?;
            response = response.with_patch(patch).map_err(|e| e.to_string())?;
        }
    }
    serde_json::to_value(response.into_review()).map_err(|e| e.to_string())
}

/// The certificate served now; swapped by the task that keeps it current
/// ([`watch_dir`], [`keep_generated`]), so a handshake only clones an Arc.
#[derive(Debug)]
struct Served(std::sync::RwLock<Arc<CertifiedKey>>);

impl Served {
    fn new(key: CertifiedKey) -> Self {
        Served(std::sync::RwLock::new(Arc::new(key)))
    }

    fn set(&self, key: CertifiedKey) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
    }
}

impl ResolvesServerCert for Served {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

async fn mtimes(dir: &std::path::Path) -> (Option<SystemTime>, Option<SystemTime>) {
    let m = |f: &'static str| async move {
        tokio::fs::metadata(dir.join(f))
            .await
            .and_then(|m| m.modified())
            .ok()
    };
    (m("tls.crt").await, m("tls.key").await)
}

/// Reads `tls.crt` and `tls.key` of `dir` again whenever either changes (a
/// renewed cert-manager Secret); a pair that does not load is tried again
/// at the next look, the one before served meanwhile.
async fn watch_dir(
    dir: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    served: Arc<Served>,
    every: Duration,
) {
    let mut loaded = mtimes(&dir).await;
    loop {
        tokio::time::sleep(every).await;
        let now = mtimes(&dir).await;
        if now == loaded {
            continue;
        }
        let (d, p) = (dir.clone(), provider.clone());
        match tokio::task::spawn_blocking(move || load_pair(&d, &p)).await {
            Ok(Ok(key)) => {
                served.set(key);
                loaded = now;
                tracing::info!(dir = %dir.display(), "webhook certificate read again");
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "webhook certificate changed but does not load; serving the one before")
            }
            Err(error) => tracing::warn!(%error, "reading the webhook certificate failed"),
        }
    }
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

/// A generated CA and serving certificate, as PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        metadata: wasmwatch_kube::digest_key::managed_metadata(
            namespace,
            name,
            &format!(
                "The admission webhook's CA and serving certificate (for {}), \
                 made by wasmwatch. Delete it to have new ones made.",
                names.join(", ")
            ),
        ),
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

/// Keeps the generated pair current: every [`CA_BUNDLE_CHECK`] the Secret
/// is read again (made again when deleted), a pair that changed is served
/// from then on, and its CA is written into every webhook of
/// MutatingWebhookConfiguration `configuration` whose caBundle differs.
/// Replicas converge on the Secret's pair instead of each writing its own.
async fn keep_generated(
    client: kube::Client,
    tls: WebhookTls,
    configuration: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
    served: Arc<Served>,
    mut pair: Generated,
) {
    let WebhookTls::Generate {
        namespace,
        secret,
        names,
        ..
    } = tls
    else {
        return;
    };
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut missing_told = false;
    loop {
        match set_ca_bundle(&api, &configuration, &pair.ca).await {
            Ok(Some(0)) => {}
            Ok(Some(n)) => {
                tracing::info!(%configuration, webhooks = n, "webhook CA written into the caBundle")
            }
            Ok(None) if !missing_told => {
                missing_told = true;
                tracing::warn!(
                    %configuration,
                    "no MutatingWebhookConfiguration {configuration}: the API server does not call \
                     the webhook (apply deploy/overlays/webhook); checked again every minute"
                );
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%configuration, %error, "cannot write the webhook CA into the caBundle")
            }
        }
        tokio::time::sleep(CA_BUNDLE_CHECK).await;
        match generated(&client, &namespace, &secret, &names).await {
            Ok(now) if now != pair => match now.certified(&provider) {
                Ok(key) => {
                    served.set(key);
                    pair = now;
                    tracing::info!(secret = %format!("{namespace}/{secret}"), "webhook certificate changed in its Secret; serving it");
                }
                Err(error) => {
                    tracing::warn!(%error, "the webhook certificate's Secret holds a pair that does not load")
                }
            },
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "cannot read the webhook certificate's Secret")
            }
        }
    }
}

/// Writes `ca` into each webhook's `clientConfig.caBundle` that differs, by
/// a JSON Patch that tests each webhook's name (no field this binary does
/// not know is dropped); how many it changed, `None` when the configuration
/// does not exist.
async fn set_ca_bundle(
    api: &Api<MutatingWebhookConfiguration>,
    name: &str,
    ca: &str,
) -> anyhow::Result<Option<usize>> {
    let bundle = BASE64.encode(ca.as_bytes());
    for _ in 0..5 {
        let Some(config) = api.get_opt(name).await? else {
            return Ok(None);
        };
        let mut ops = Vec::new();
        for (i, webhook) in config.webhooks.iter().flatten().enumerate() {
            if webhook
                .client_config
                .ca_bundle
                .as_ref()
                .map(|b| b.0.as_slice())
                != Some(ca.as_bytes())
            {
                ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": webhook.name}));
                ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": bundle}));
            }
        }
        if ops.is_empty() {
            return Ok(Some(0));
        }
        let changed = ops.len() / 2;
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))?;
        match api
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Json::<()>(patch),
            )
            .await
        {
            Ok(_) => return Ok(Some(changed)),
            // Changed in between (a test failed, or a conflict): read again.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!(
        "MutatingWebhookConfiguration {name} kept changing; 5 attempts to write its caBundle failed"
    )
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
                "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
                "namespace": "shop", "name": "web", "userInfo": {"username": "argocd"},
                "oldObject": template(json!({"config-hash.wasmwatch.io/configmap.cfg": "configmap/cfg:1"})),
                "object": template(json!({}))}})
        };
        let answer = review_answer(&review("UPDATE")).unwrap();
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["response"]["uid"], "u-1");
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
        // kube-core writes the patch's bytes as an array of numbers.
        let bytes: Vec<u8> = serde_json::from_value(answer["response"]["patch"].clone()).unwrap();
        let patch: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            patch,
            json!([{"op": "add",
                "path": "/spec/template/metadata/annotations/config-hash.wasmwatch.io~1configmap.cfg",
                "value": "configmap/cfg:1"}])
        );
        // A CREATE, or a DELETE, is allowed as it is.
        for operation in ["CREATE", "DELETE"] {
            let answer = review_answer(&review(operation)).unwrap();
            assert_eq!(answer["response"]["uid"], "u-1", "{operation}");
            assert_eq!(answer["response"]["allowed"], true, "{operation}");
            assert!(answer["response"].get("patch").is_none(), "{operation}");
        }
        assert!(review_answer(&json!({"request": {}})).is_err());
    }

    /// Writes a new pair for 127.0.0.1 into `dir`; its CA, as PEM.
    fn write_pair(dir: &std::path::Path) -> String {
        let pair = Generated::new(&["127.0.0.1".into()]).unwrap();
        std::fs::write(dir.join("tls.crt"), &pair.cert).unwrap();
        std::fs::write(dir.join("tls.key"), &pair.key).unwrap();
        pair.ca
    }

    /// POSTs `review` to `https://addr/mutate`, trusting only `ca`.
    async fn post(addr: SocketAddr, ca: &str, review: &Value) -> anyhow::Result<Value> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
            roots.add(cert?)?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(
                rustls::pki_types::ServerName::try_from("127.0.0.1")?.to_owned(),
                tcp,
            )
            .await?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        let req = Request::post("/mutate")
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(review)?)))?;
        let resp = send.send_request(req).await?;
        anyhow::ensure!(resp.status() == StatusCode::OK, "status {}", resp.status());
        Ok(serde_json::from_slice(
            &resp.into_body().collect().await?.to_bytes(),
        )?)
    }

    /// `--webhook-cert-dir`: the pair in the folder is served over HTTPS and
    /// answers reviews; a renewed pair (a cert-manager renewal) is served
    /// once the folder is looked at again, and a broken one is not taken.
    #[tokio::test]
    async fn a_cert_folder_is_served_and_read_again_when_renewed() {
        let dir = tempfile::tempdir().unwrap();
        let ca = write_pair(dir.path());
        let options = WebhookOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            tls: WebhookTls::Dir(dir.path().to_path_buf()),
        };
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap()))
                .unwrap();
        let webhook = start(&options, &client).await.unwrap();
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-2", "operation": "CREATE",
                "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
                "userInfo": {"username": "argocd"}}});
        let answer = post(webhook.addr, &ca, &review).await.unwrap();
        assert_eq!(answer["response"]["uid"], "u-2");
        assert_eq!(answer["response"]["allowed"], true);

        // The folder's watcher, fast: a renewal is served, a broken pair
        // is not.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let served = Arc::new(Served::new(load_pair(dir.path(), &provider).unwrap()));
        let der = |s: &Served| s.0.read().unwrap().cert[0].to_vec();
        let first = der(&served);
        let watcher = tokio::spawn(watch_dir(
            dir.path().to_path_buf(),
            provider,
            served.clone(),
            Duration::from_millis(20),
        ));
        // Modification times have a coarse grain on some file systems.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        std::fs::write(dir.path().join("tls.key"), "not a key").unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(der(&served), first, "a broken pair is not taken");
        write_pair(dir.path());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while der(&served) == first {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the renewed pair is served"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        watcher.abort();
        drop(webhook);
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
