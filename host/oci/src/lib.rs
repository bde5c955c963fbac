//! Plugin modules from OCI registries.
//!
//! A manifest's `module: oci://REGISTRY/REPOSITORY:TAG` (or `@sha256:...`)
//! names a Wasm OCI artifact (config `application/vnd.wasm.config.v0+json`,
//! one layer `application/wasm`: the component). Its `sha256` pins the
//! layer. [`Registry::pull`] checks the manifest's layer digest against the
//! pin before downloading and the bytes after; [`ModuleStore`] keeps
//! verified modules by digest, so a later start uses the file and never
//! contacts the registry. [`Registry::push`] publishes a component.
//!
//! A registry is not trusted to behave: a pull has one deadline for all of
//! it ([`RegistryOptions::pull_timeout`]), reads at most
//! [`MAX_MANIFEST_BYTES`] of a manifest, the declared size of the layer
//! (at most [`MAX_MODULE_BYTES`]) and [`MAX_ERROR_BODY_BYTES`] of an error
//! answer (shown escaped, on one line), and requests only the registry
//! itself: a layer's `urls` are never followed. oci-client reads whole
//! bodies, so the pull's manifest and blob requests are made here with
//! reqwest; oci-client does the token exchange and pushes.
//!
//! The crate keeps oci-client (reqwest, rustls with ring) out of the crates
//! that do not need it; the runtime only ever sees a local file.
#![forbid(unsafe_code)]

pub mod auth;
mod store;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::client::{Config, ImageLayer};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciImageManifest, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use sha2::{Digest as _, Sha256};
use wasmwatch_core::text::bounded_line;

pub use auth::{AuthSource, Credentials};
pub use store::ModuleStore;

/// The config media type of the Wasm OCI artifact convention.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of the Wasm OCI artifact convention.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The layer media type of the older wasm-to-oci convention (oci-client's
/// `WASM_LAYER_MEDIA_TYPE`), also accepted on pull.
pub const LEGACY_WASM_LAYER_MEDIA_TYPE: &str = oci_client::manifest::WASM_LAYER_MEDIA_TYPE;
/// The largest module the host pulls.
pub const MAX_MODULE_BYTES: u64 = 512 << 20;
/// The largest manifest the host reads: the size the OCI distribution spec
/// says registries should accept at least (an artifact's manifest is about
/// 500 bytes).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// How much of an error answer's body is read, and shown (escaped).
pub const MAX_ERROR_BODY_BYTES: usize = 4096;
/// The manifest media types a pull accepts (an index is refused after).
const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json";
const USER_AGENT: &str = concat!("wasmwatch/", env!("CARGO_PKG_VERSION"));
/// The scheme of module references.
pub const SCHEME: &str = "oci://";

/// Why a module could not be pulled or pushed. Each message is one line
/// and names the reference.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("{reference}: not a valid OCI reference: {message}")]
    Reference { reference: String, message: String },
    /// The registry could not be reached, refused, or answered an error.
    #[error("{reference}: {message}")]
    Registry { reference: String, message: String },
    /// The registry's credentials were refused (or none were given).
    #[error("{reference}: {message}")]
    Unauthorized { reference: String, message: String },
    /// The artifact's component is not the pinned one.
    #[error(
        "{reference}: digest mismatch: the registry's component is sha256:{actual}, the manifest pins sha256:{expected}; refused (nothing cached or run)"
    )]
    Digest {
        reference: String,
        expected: String,
        actual: String,
    },
    /// Not a Wasm component artifact.
    #[error("{reference}: {message}")]
    Artifact { reference: String, message: String },
    /// A file to push is not a component.
    #[error("{path}: {message}")]
    NotComponent { path: String, message: String },
    /// Client set-up: credentials file, CA file.
    #[error("{0}")]
    Config(String),
    #[error("cannot write {path} into the module cache: {source}")]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A parsed `oci://` module reference.
#[derive(Debug, Clone)]
pub struct ModuleRef {
    text: String,
    reference: Reference,
}

impl ModuleRef {
    /// Parses `oci://REGISTRY/REPOSITORY:TAG` or `...@sha256:DIGEST`. The
    /// registry must be explicit (a host with a dot or a port, or
    /// `localhost`): no implicit Docker Hub.
    pub fn parse(module: &str) -> Result<ModuleRef, OciError> {
        let bad = |message: String| OciError::Reference {
            reference: module.to_string(),
            message,
        };
        let rest = module
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad(format!("must start with {SCHEME}")))?;
        let registry = rest.split('/').next().unwrap_or_default();
        let reference: Reference = rest.parse().map_err(|e| bad(format!("{e}")))?;
        if reference.registry() != registry || !rest.contains('/') {
            return Err(bad(
                "the registry must be explicit: oci://REGISTRY/REPOSITORY:TAG".into(),
            ));
        }
        let last = rest.rsplit('/').next().unwrap_or(rest);
        if !last.contains(':') && !last.contains('@') {
            return Err(bad("needs a tag (:TAG) or a digest (@sha256:DIGEST)".into()));
        }
        Ok(ModuleRef {
            text: module.to_string(),
            reference,
        })
    }

    /// `host[:port]` of the registry.
    pub fn registry(&self) -> &str {
        self.reference.registry()
    }

    /// The repository (without registry and tag).
    pub fn repository(&self) -> &str {
        self.reference.repository()
    }
}

impl fmt::Display for ModuleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// How to reach registries.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Registries (`host[:port]`, as in references) spoken to over plain
    /// HTTP; all others only over HTTPS.
    pub insecure: Vec<String>,
    /// PEM files of CA certificates trusted beside the system's.
    pub ca_files: Vec<PathBuf>,
    pub auth: AuthSource,
    pub connect_timeout: Duration,
    /// Longest wait for any read: a registry silent this long is given up
    /// (a pull as a whole is bounded by `pull_timeout`). Shorter than the
    /// default pull timeout, so that a registry that never answers is told
    /// apart from one that is slow.
    pub read_timeout: Duration,
    /// The longest one pull may take, from its first request to the last
    /// byte of the component: a registry that answers slowly (a byte now
    /// and then restarts `read_timeout`) or not at all is given up after it.
    pub pull_timeout: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            insecure: Vec::new(),
            ca_files: Vec::new(),
            auth: AuthSource::default(),
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            pull_timeout: Duration::from_secs(60),
        }
    }
}

/// Where pulled modules are cached when no cache folder is configured:
/// `$XDG_CACHE_HOME/wasmwatch`, else `$HOME/.cache/wasmwatch`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("wasmwatch"))
}

/// An error and its causes on one line, leaving out a cause whose text the
/// one before already holds (reqwest and hyper repeat theirs).
fn chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !parts.last().is_some_and(|l| l.contains(&text)) {
            parts.push(text);
        }
        cause = c.source();
    }
    parts.join(": ")
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What a push published.
#[derive(Debug, Clone)]
pub struct Pushed {
    /// The reference pushed to, `oci://...`.
    pub reference: String,
    /// sha256 of the component layer: the manifest's `sha256:` pin.
    pub sha256: String,
    /// The artifact manifest's digest (`sha256:...`), for `@` references.
    pub manifest_digest: Option<String>,
    pub size: usize,
}

/// A client for registries.
pub struct Registry {
    client: Client,
    /// The pull's manifest and blob requests (see the crate's documentation).
    http: reqwest::Client,
    options: RegistryOptions,
}

/// `host[:port]` of `url`, as written in `--insecure-registry`.
fn host_port(url: &reqwest::Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    }
}

/// `url` without its query and fragment, for messages: a registry may
/// redirect to storage with a signed query (a temporary credential).
fn shown(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

/// The pull's redirects: registries send blobs to storage on other hosts
/// (S3, a CDN), so redirects are followed (at most 10; reqwest drops the
/// credentials when the host changes), but to plain HTTP only for a host
/// listed with `--insecure-registry`: a redirect reaches no further than
/// the registry's own requests may.
fn redirect_policy(insecure: Vec<String>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 10 {
            return attempt.error("more than 10 redirects");
        }
        let url = attempt.url();
        if url.scheme() == "https" || insecure.contains(&host_port(url)) {
            return attempt.follow();
        }
        let error = format!(
            "redirected to {}, plain HTTP to a host not listed with --insecure-registry",
            shown(url)
        );
        attempt.error(error)
    })
}

/// Reads at most `max` bytes of `response`'s body; true when there was more
/// (left unread: the connection is dropped, not drained).
async fn read_at_most(
    mut response: reqwest::Response,
    max: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = max - out.len();
        if chunk.len() > room {
            out.extend_from_slice(&chunk[..room]);
            return Ok((out, true));
        }
        out.extend_from_slice(&chunk);
    }
    Ok((out, false))
}

/// Adds a hint when `message` looks like HTTPS spoken to a plain-HTTP registry.
fn insecure_hint(module: &ModuleRef, message: &mut String) {
    if message.contains("InvalidContentType")
        || message.contains("wrong version number")
        || message.contains("http2 error")
        || message.contains("HTTP/1.1 400")
    {
        message.push_str(&format!(
            " (a plain-HTTP registry? list it with --insecure-registry {})",
            module.registry()
        ));
    }
}

impl Registry {
    /// A client with these options (reads the CA files).
    pub fn new(options: RegistryOptions) -> Result<Registry, OciError> {
        // reqwest is built without a crypto provider; use ring, as kube does.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut certificates = Vec::new();
        let mut http = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .read_timeout(options.read_timeout)
            .user_agent(USER_AGENT)
            .redirect(redirect_policy(options.insecure.clone()));
        for path in &options.ca_files {
            let data = std::fs::read(path).map_err(|e| {
                OciError::Config(format!("cannot read CA file {}: {e}", path.display()))
            })?;
            let pem = reqwest::Certificate::from_pem_bundle(&data).map_err(|e| {
                OciError::Config(format!(
                    "CA file {}: not PEM certificates: {}",
                    path.display(),
                    chain(&e)
                ))
            })?;
            http = http.tls_certs_merge(pem);
            certificates.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            });
        }
        let http = http.build().map_err(|e| {
            OciError::Config(format!("cannot set up the HTTP client: {}", chain(&e)))
        })?;
        let config = ClientConfig {
            protocol: if options.insecure.is_empty() {
                ClientProtocol::Https
            } else {
                ClientProtocol::HttpsExcept(options.insecure.clone())
            },
            extra_root_certificates: certificates,
            // An artifact is one manifest; an index is not ours.
            platform_resolver: None,
            connect_timeout: Some(options.connect_timeout),
            read_timeout: Some(options.read_timeout),
            user_agent: USER_AGENT,
            ..ClientConfig::default()
        };
        // Not `Client::new`: it falls back to a default client on error,
        // which would drop the protocol and CA settings.
        let client = Client::try_from(config).map_err(|e| {
            OciError::Config(format!("cannot set up the OCI client: {}", chain(&e)))
        })?;
        Ok(Registry {
            client,
            http,
            options,
        })
    }

    fn credentials(&self, module: &ModuleRef) -> Result<Credentials, OciError> {
        self.options.auth.credentials(module.registry())
    }

    /// The message for a refusal of `credentials`.
    fn refused(module: &ModuleRef, credentials: &Credentials, what: &str, why: &str) -> OciError {
        OciError::Unauthorized {
            reference: module.to_string(),
            message: format!(
                "{what}: the registry refused {} ({why}); set credentials in a docker config.json \
                 (--registry-config) or WASMWATCH_REGISTRY_USERNAME/_PASSWORD",
                credentials.from
            ),
        }
    }

    /// Turns a client error into ours, with a hint where one helps. The
    /// client's text may hold what the registry answered: it is bounded and
    /// escaped like a plugin's message.
    fn error(
        &self,
        module: &ModuleRef,
        credentials: &Credentials,
        what: &str,
        e: OciDistributionError,
    ) -> OciError {
        let unauthorized = match &e {
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => true,
            OciDistributionError::ServerError { code, .. } => *code == 401 || *code == 403,
            OciDistributionError::RegistryError { envelope, .. } => {
                envelope.errors.iter().any(|e| {
                    matches!(
                        e.code,
                        oci_client::errors::OciErrorCode::Unauthorized
                            | oci_client::errors::OciErrorCode::Denied
                    )
                })
            }
            _ => false,
        };
        let text = bounded_line(&chain(&e), MAX_ERROR_BODY_BYTES).into_owned();
        if unauthorized {
            return Registry::refused(module, credentials, what, &text);
        }
        let mut message = format!("{what}: {text}");
        insecure_hint(module, &mut message);
        OciError::Registry {
            reference: module.to_string(),
            message,
        }
    }

    /// `scheme://registry/v2/repository/path`: HTTPS unless the registry
    /// is listed as insecure (as oci-client decides).
    fn url(&self, module: &ModuleRef, path: &str) -> String {
        let registry = module.registry();
        let scheme = if self.options.insecure.iter().any(|r| r == registry) {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{registry}/v2/{}/{path}", module.repository())
    }

    /// Sends `request`; anything but 200 is an error naming what the
    /// registry answered (at most [`MAX_ERROR_BODY_BYTES`] of the body read,
    /// escaped onto one line).
    async fn send(
        &self,
        module: &ModuleRef,
        credentials: &Credentials,
        what: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, OciError> {
        let response = request.send().await.map_err(|e| {
            let url = e.url().map(shown).unwrap_or_default();
            let mut message = format!("{what} ({url}): {}", chain(&e.without_url()));
            insecure_hint(module, &mut message);
            OciError::Registry {
                reference: module.to_string(),
                message,
            }
        })?;
        let status = response.status();
        if status == reqwest::StatusCode::OK {
            return Ok(response);
        }
        let url = shown(response.url());
        let (body, more) = read_at_most(response, MAX_ERROR_BODY_BYTES)
            .await
            .unwrap_or_default();
        let mut answer = format!("{url} answered {status}");
        let body = String::from_utf8_lossy(&body);
        if !body.trim().is_empty() {
            answer.push_str(": ");
            answer.push_str(&bounded_line(body.trim(), MAX_ERROR_BODY_BYTES));
            if more {
                answer.push_str(&format!(
                    " … (only the first {MAX_ERROR_BODY_BYTES} bytes read)"
                ));
            }
        }
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(Registry::refused(module, credentials, what, &answer));
        }
        Err(OciError::Registry {
            reference: module.to_string(),
            message: format!("{what}: {answer}"),
        })
    }

    /// Pulls the component `module` names and checks it against `sha256`
    /// (the pin): the manifest's layer digest before downloading, the bytes
    /// after. Returns the verified bytes. All of it within
    /// [`RegistryOptions::pull_timeout`].
    pub async fn pull(&self, module: &ModuleRef, sha256: &str) -> Result<Vec<u8>, OciError> {
        let limit = self.options.pull_timeout;
        match tokio::time::timeout(limit, self.pull_within(module, sha256)).await {
            Ok(result) => result,
            Err(_) => Err(OciError::Registry {
                reference: module.to_string(),
                message: format!(
                    "the registry did not deliver the component within {} (--pull-timeout); \
                     nothing cached",
                    wasmwatch_core::units::HumanDuration(limit)
                ),
            }),
        }
    }

    async fn pull_within(&self, module: &ModuleRef, sha256: &str) -> Result<Vec<u8>, OciError> {
        let reference = module.to_string();
        let credentials = self.credentials(module)?;
        // The registry's Bearer challenge and token service, if it has one.
        let token = self
            .client
            .auth(
                &module.reference,
                &credentials.auth,
                RegistryOperation::Pull,
            )
            .await
            .map_err(|e| self.error(module, &credentials, "cannot reach the registry", e))?;
        let authorize = |request: reqwest::RequestBuilder| match (&token, &credentials.auth) {
            (Some(token), _) => request.bearer_auth(token),
            (None, RegistryAuth::Basic(user, password)) => request.basic_auth(user, Some(password)),
            (None, _) => request,
        };

        let what = "cannot fetch the manifest";
        let tag_or_digest = module
            .reference
            .digest()
            .or(module.reference.tag())
            .unwrap_or("latest");
        let request = self
            .http
            .get(self.url(module, &format!("manifests/{tag_or_digest}")))
            .header(reqwest::header::ACCEPT, MANIFEST_ACCEPT);
        let response = self
            .send(module, &credentials, what, authorize(request))
            .await?;
        let too_large = |size: String| OciError::Artifact {
            reference: reference.clone(),
            message: format!(
                "the manifest is {size} bytes, over the limit of {MAX_MANIFEST_BYTES} \
                 (4 MiB, the OCI distribution spec's size for manifests); refused"
            ),
        };
        if let Some(length) = response.content_length()
            && length > MAX_MANIFEST_BYTES as u64
        {
            return Err(too_large(length.to_string()));
        }
        let (body, more) = read_at_most(response, MAX_MANIFEST_BYTES)
            .await
            .map_err(|e| OciError::Registry {
                reference: reference.clone(),
                message: format!("while reading the manifest: {}", chain(&e.without_url())),
            })?;
        if more {
            return Err(too_large(format!("more than {MAX_MANIFEST_BYTES}")));
        }
        if let Some(digest) = module.reference.digest() {
            let actual = format!("sha256:{}", sha256_hex(&body));
            if actual != digest {
                return Err(OciError::Artifact {
                    reference,
                    message: format!(
                        "the registry's manifest is {actual}, not the {digest} the reference names; refused"
                    ),
                });
            }
        }
        let manifest = match serde_json::from_slice::<OciManifest>(&body) {
            Ok(OciManifest::Image(m)) if m.schema_version == 2 => m,
            Ok(OciManifest::Image(m)) => {
                return Err(OciError::Artifact {
                    reference,
                    message: format!(
                        "manifest schemaVersion {} is not supported (only 2)",
                        m.schema_version
                    ),
                });
            }
            Ok(OciManifest::ImageIndex(_)) => {
                return Err(OciError::Artifact {
                    reference,
                    message: "an image index, not a Wasm component artifact \
                              (one manifest with one application/wasm layer)"
                        .into(),
                });
            }
            Err(e) => {
                return Err(OciError::Artifact {
                    reference,
                    message: format!(
                        "not an OCI image manifest: {}",
                        bounded_line(&e.to_string(), MAX_ERROR_BODY_BYTES)
                    ),
                });
            }
        };
        let wasm: Vec<_> = manifest
            .layers
            .iter()
            .filter(|l| {
                l.media_type == WASM_LAYER_MEDIA_TYPE
                    || l.media_type == LEGACY_WASM_LAYER_MEDIA_TYPE
            })
            .collect();
        let [layer] = wasm[..] else {
            let types: Vec<&str> = manifest
                .layers
                .iter()
                .map(|l| l.media_type.as_str())
                .collect();
            return Err(OciError::Artifact {
                reference,
                message: bounded_line(
                    &format!(
                        "not a Wasm component artifact: expected one {WASM_LAYER_MEDIA_TYPE} layer, \
                         found layers {types:?} (config {:?})",
                        manifest.config.media_type
                    ),
                    MAX_ERROR_BODY_BYTES,
                )
                .into_owned(),
            });
        };
        if layer.digest != format!("sha256:{sha256}") {
            let actual = layer
                .digest
                .strip_prefix("sha256:")
                .unwrap_or(&layer.digest);
            return Err(OciError::Digest {
                reference,
                expected: sha256.to_string(),
                actual: bounded_line(actual, 128).into_owned(),
            });
        }
        if layer.size < 0 || layer.size as u64 > MAX_MODULE_BYTES {
            return Err(OciError::Artifact {
                reference,
                message: format!(
                    "the component layer is {} bytes, over the limit of {MAX_MODULE_BYTES}",
                    layer.size
                ),
            });
        }
        let size = layer.size as u64;

        // The blob from the registry itself, never from the layer's `urls`
        // (OCI "non-distributable" layers): they may name any host, address
        // and scheme, so following them would let any registry make
        // wasmwatch send requests where it likes from inside the cluster
        // (plain HTTP to hosts never listed as insecure included). A Wasm
        // artifact has no use for them: its component is a blob of its
        // registry, and the pin says what the bytes must be, so another
        // source would add only reach. Not even the same registry's: such
        // a URL names nothing its blob endpoint cannot serve. The URL is
        // built from the pin, not from the registry's text.
        let what = "cannot fetch the component";
        let request = self
            .http
            .get(self.url(module, &format!("blobs/sha256:{sha256}")));
        let mut response = self
            .send(module, &credentials, what, authorize(request))
            .await?;
        let more_than_declared = || OciError::Artifact {
            reference: reference.clone(),
            message: format!("the registry sent more than the {size} bytes the manifest declares"),
        };
        if response.content_length().is_some_and(|l| l > size) {
            return Err(more_than_declared());
        }
        let mut bytes = Vec::with_capacity(size.min(64 << 20) as usize);
        while let Some(chunk) = response.chunk().await.map_err(|e| OciError::Registry {
            reference: reference.clone(),
            message: format!(
                "while downloading the component: {}",
                chain(&e.without_url())
            ),
        })? {
            if (bytes.len() + chunk.len()) as u64 > size {
                return Err(more_than_declared());
            }
            bytes.extend_from_slice(&chunk);
        }
        let actual = sha256_hex(&bytes);
        if actual != sha256 {
            return Err(OciError::Digest {
                reference,
                expected: sha256.to_string(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Publishes `component` (checked to be a valid component) as a Wasm
    /// OCI artifact at `module`.
    pub async fn push(
        &self,
        module: &ModuleRef,
        file: &Path,
        component: Vec<u8>,
    ) -> Result<Pushed, OciError> {
        check_component(&component).map_err(|message| OciError::NotComponent {
            path: file.display().to_string(),
            message,
        })?;
        let sha256 = sha256_hex(&component);
        let size = component.len();
        let layer_digest = format!("sha256:{sha256}");
        let title = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let config = serde_json::json!({
            "created": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [layer_digest],
        });
        let layer = ImageLayer::new(
            component,
            WASM_LAYER_MEDIA_TYPE.to_string(),
            Some(BTreeMap::from([(
                "org.opencontainers.image.title".to_string(),
                title,
            )])),
        );
        let config = Config::new(
            serde_json::to_vec(&config).expect("JSON"),
            WASM_CONFIG_MEDIA_TYPE.to_string(),
            None,
        );
        let manifest = OciImageManifest::build(std::slice::from_ref(&layer), &config, None);
        let credentials = self.credentials(module)?;
        self.client
            .push(
                &module.reference,
                &[layer],
                config,
                &credentials.auth,
                Some(manifest),
            )
            .await
            .map_err(|e| self.error(module, &credentials, "cannot push", e))?;
        let manifest_digest = self
            .client
            .fetch_manifest_digest(&module.reference, &credentials.auth)
            .await
            .ok();
        Ok(Pushed {
            reference: module.to_string(),
            sha256,
            manifest_digest,
            size,
        })
    }

    /// Whether anonymous access is what these options give `module`'s registry.
    pub fn is_anonymous(&self, module: &ModuleRef) -> bool {
        self.credentials(module)
            .is_ok_and(|c| c.auth == RegistryAuth::Anonymous)
    }
}

/// Whether `bytes` are a valid WebAssembly component (not a core module).
pub fn check_component(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err("not a WebAssembly file".into());
    }
    // Version (2 bytes), then layer (2 bytes): layer 1 is a component.
    if bytes[6..8] == [0, 0] {
        return Err(
            "a core WebAssembly module, not a component (wrap it with `wasm-tools component new`)"
                .into(),
        );
    }
    wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
        .validate_all(bytes)
        .map(|_| ())
        .map_err(|e| format!("not a valid component: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r = ModuleRef::parse("oci://127.0.0.1:5000/plugins/refresh:1.0").unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "plugins/refresh");
        let digest = format!("oci://ghcr.io/acme/refresh@sha256:{}", "a".repeat(64));
        assert_eq!(ModuleRef::parse(&digest).unwrap().registry(), "ghcr.io");
        for bad in [
            "ghcr.io/acme/refresh:1",
            "oci://acme/refresh:1",
            "oci://ghcr.io/acme/refresh",
            "oci://ghcr.io/Acme/refresh:1",
        ] {
            assert!(ModuleRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_components_are_pushed() {
        assert!(check_component(b"hello").is_err());
        let core = b"\0asm\x01\0\0\0";
        assert!(check_component(core).unwrap_err().contains("core"));
    }
}
