//! The plugin manifest: one YAML document that says what to watch, how
//! replicas elect a leader, which bus connections exist, and which plugins get
//! which events with what capabilities, limits and delivery policy.
//!
//! Parsing refuses unknown fields and bad values; every problem is reported
//! with the field's path and the offending value, before anything runs.
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::capability::Capabilities;
use crate::event::{ChangeType, ObjectKind};
use crate::selector::LabelSelector;
use crate::units::{ByteSize, HumanDuration};

pub const API_VERSION: &str = "wasmwatch.io/v1alpha1";
pub const KIND: &str = "PluginManifest";

/// The whole manifest.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Manifest {
    /// `wasmwatch.io/v1alpha1`.
    #[schemars(extend("const" = "wasmwatch.io/v1alpha1"))]
    pub api_version: String,
    /// `PluginManifest`.
    #[schemars(extend("const" = "PluginManifest"))]
    pub kind: String,
    /// What the host watches (default: ConfigMaps and Secrets in every namespace).
    #[serde(default)]
    pub watch: WatchSpec,
    /// Leader election among replicas, and where checkpoints are kept.
    #[serde(default)]
    pub ha: HaSpec,
    /// Bus connections (AMQP or NATS) plugins may publish to by name.
    #[serde(default)]
    pub buses: Vec<BusConnection>,
    /// How fast the host acts, over all targets and per target.
    #[serde(default)]
    pub rate_limits: RateLimits,
    /// Optional metric families on the admin port's `/metrics`.
    #[serde(default)]
    pub metrics: MetricsSpec,
    /// The plugins, each with the events it gets and what it may do.
    pub plugins: Vec<PluginEntry>,
    /// The folder module paths are relative to (the manifest file's folder).
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// What the host watches.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WatchSpec {
    /// ConfigMap, Secret (both by default), and other kinds: by
    /// apiVersion/Kind when wasmwatch knows their content (the CSI
    /// driver's SecretProviderClassPodStatus), else as {apiVersion, kind,
    /// content}.
    #[serde(default = "all_watched")]
    pub kinds: Vec<WatchedKind>,
    /// Namespaces to watch, or `["*"]` for all of them (one cluster-wide
    /// stream per kind).
    #[serde(default = "all_namespaces")]
    pub namespaces: Vec<String>,
    /// Only objects with these labels are watched (a Kubernetes label
    /// selector; Stakater Reloader's legacy `k:v`, `k:*` are accepted too).
    #[serde(default)]
    pub label_selector: Option<LabelSelector>,
    /// Namespaces whose objects are never delivered to any plugin
    /// (Reloader's `--namespaces-to-ignore`). Filtered by the API server
    /// (`metadata.namespace!=...` on every watch and lookup cache).
    #[serde(default)]
    pub ignore_namespaces: Vec<String>,
    /// Only objects in namespaces whose labels match are delivered
    /// (Reloader's `--namespace-selector`, its legacy `k:v`, `k:*`, `k=*`
    /// accepted). The host watches Namespaces (RBAC: list and watch
    /// `namespaces`): a namespace that gains the labels is in scope from
    /// then on, one that loses them is out, without a restart. Objects
    /// already there are not delivered until they change.
    #[serde(default)]
    pub namespace_selector: Option<LabelSelector>,
    /// Whether a change of only labels or annotations counts as a
    /// modification (by default only data changes do, as in the Spring watcher).
    #[serde(default)]
    pub metadata_changes: bool,
    /// The Secret, in wasmwatch's namespace (`ha.namespace`, else the
    /// pod's), holding the key of Secret digests (HMAC-SHA-256; field
    /// `key`). Created with a random key when absent.
    #[serde(default = "default_digest_key_secret")]
    pub digest_key_secret: String,
}

impl Default for WatchSpec {
    fn default() -> Self {
        WatchSpec {
            kinds: all_watched(),
            namespaces: all_namespaces(),
            label_selector: None,
            ignore_namespaces: Vec::new(),
            namespace_selector: None,
            metadata_changes: false,
            digest_key_secret: default_digest_key_secret(),
        }
    }
}

fn default_digest_key_secret() -> String {
    "wasmwatch-digest-key".to_string()
}

impl WatchSpec {
    /// The kinds watched, in the manifest's order.
    pub fn object_kinds(&self) -> Vec<ObjectKind> {
        self.kinds.iter().map(WatchedKind::kind).collect()
    }

    /// Whether `kind` is watched.
    pub fn watches(&self, kind: ObjectKind) -> bool {
        self.kinds.iter().any(|k| k.kind() == kind)
    }

    /// How a watched custom kind is read (`None` for ConfigMap, Secret, a
    /// kind not watched, or one named without its content).
    pub fn custom(&self, kind: ObjectKind) -> Option<CustomKindSpec> {
        self.kinds
            .iter()
            .filter(|k| k.kind() == kind)
            .find_map(WatchedKind::spec)
    }

    /// One scope per watch stream of a kind: each namespace, or all of them.
    pub fn scopes(&self) -> Vec<crate::Scope> {
        if self.namespaces.iter().any(|n| n == "*") {
            vec![crate::Scope::All]
        } else {
            self.namespaces
                .iter()
                .map(|n| crate::Scope::Namespace(n.clone()))
                .collect()
        }
    }

    /// The field selector that leaves out `ignoreNamespaces` on the API
    /// server (`metadata.namespace!=a,metadata.namespace!=b`), `None` when
    /// none is ignored. Every resource supports `metadata.namespace` in
    /// field selectors.
    pub fn field_selector(&self) -> Option<String> {
        let unique: BTreeSet<&str> = self.ignore_namespaces.iter().map(String::as_str).collect();
        (!unique.is_empty()).then(|| {
            unique
                .iter()
                .map(|n| format!("metadata.namespace!={n}"))
                .collect::<Vec<_>>()
                .join(",")
        })
    }
}

fn all_kinds() -> Vec<ObjectKind> {
    vec![ObjectKind::ConfigMap, ObjectKind::Secret]
}

fn all_watched() -> Vec<WatchedKind> {
    all_kinds().into_iter().map(WatchedKind::Named).collect()
}

/// One entry of `watch.kinds`: `ConfigMap`, `Secret`, a kind wasmwatch
/// knows the content of by its `apiVersion/Kind` (the CSI driver's
/// `secrets-store.csi.x-k8s.io/v1/SecretProviderClassPodStatus`), or any
/// namespaced kind with its content spelled out ([`CustomKindSpec`]).
#[derive(Debug, Clone, PartialEq)]
pub enum WatchedKind {
    Named(ObjectKind),
    Custom(CustomKindSpec),
}

/// The CSI driver's per-pod mount status: what Reloader's
/// `--enable-csi-integration` watches. Its content is the SecretProviderClass
/// it mounts and the `{id, version}` of each object mounted (Reloader
/// hashes those: `plugins/reloader-spec.md` §7.2).
pub const SECRET_PROVIDER_CLASS_POD_STATUS: &str =
    "secrets-store.csi.x-k8s.io/v1/SecretProviderClassPodStatus";

impl WatchedKind {
    pub fn kind(&self) -> ObjectKind {
        match self {
            WatchedKind::Named(k) => *k,
            WatchedKind::Custom(spec) => spec.object_kind(),
        }
    }

    /// How a custom kind is read: spelled out, or known by name.
    pub fn spec(&self) -> Option<CustomKindSpec> {
        match self {
            WatchedKind::Custom(spec) => Some(spec.clone()),
            WatchedKind::Named(k) if k.as_str() == SECRET_PROVIDER_CLASS_POD_STATUS => {
                Some(CustomKindSpec {
                    api_version: "secrets-store.csi.x-k8s.io/v1".into(),
                    kind: "SecretProviderClassPodStatus".into(),
                    plural: Some("secretproviderclasspodstatuses".into()),
                    content: vec![
                        "status.secretProviderClassName".into(),
                        "status.objects".into(),
                    ],
                })
            }
            WatchedKind::Named(_) => None,
        }
    }
}

impl Serialize for WatchedKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            WatchedKind::Named(k) => k.serialize(s),
            WatchedKind::Custom(spec) => spec.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for WatchedKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = WatchedKind;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a kind (ConfigMap, Secret, apiVersion/Kind) or {apiVersion, kind, content}",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<WatchedKind, E> {
                ObjectKind::parse(v)
                    .map(WatchedKind::Named)
                    .map_err(E::custom)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<WatchedKind, A::Error> {
                CustomKindSpec::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(WatchedKind::Custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl schemars::JsonSchema for WatchedKind {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "WatchedKind".into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let named = g.subschema_for::<ObjectKind>();
        let custom = g.subschema_for::<CustomKindSpec>();
        schemars::json_schema!({ "anyOf": [named, custom] })
    }
}

/// A namespaced kind watched like ConfigMaps and Secrets: through the same
/// checkpoints, stored index, replay and resync. Its content is what a
/// change is a change of.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CustomKindSpec {
    /// `group/version`, e.g. `secrets-store.csi.x-k8s.io/v1`.
    pub api_version: String,
    /// The kind, e.g. `SecretProviderClassPodStatus`.
    pub kind: String,
    /// The resource's plural name (default: the kind in lower case made
    /// plural as kube-rs does: `-s`, `-es`, `-ies`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plural: Option<String>,
    /// Field paths (dotted, e.g. `status.objects`) whose values are the
    /// object's content: each is one key of the data plugins see, holding
    /// a string as it is and anything else as compact JSON. Only a change
    /// of them is a modification (unless `watch.metadataChanges`).
    pub content: Vec<String>,
}

impl CustomKindSpec {
    pub fn object_kind(&self) -> ObjectKind {
        let (group, version) = self
            .api_version
            .split_once('/')
            .unwrap_or(("", &self.api_version));
        ObjectKind::Custom(crate::kind::CustomKind::intern(group, version, &self.kind))
    }

    /// What is wrong with it, if anything: one line per problem.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let name = format!("{}/{}", self.api_version, self.kind);
        match ObjectKind::parse(&name) {
            Err(e) => out.push(("kind".to_string(), e)),
            Ok(ObjectKind::Custom(_)) => {}
            Ok(k) => out.push((
                "kind".to_string(),
                format!("{k} is watched by its name: write `{k}` in watch.kinds"),
            )),
        }
        if let Some(p) = &self.plural
            && !is_dns_label(p)
        {
            out.push(("plural".into(), format!("{p:?} is not a resource name")));
        }
        if self.content.is_empty() {
            out.push((
                "content".into(),
                "must name at least one field path (such as status.objects)".into(),
            ));
        }
        for (i, path) in self.content.iter().enumerate() {
            if path.split('.').any(str::is_empty)
                || path.starts_with("metadata.")
                || path == "metadata"
            {
                out.push((
                    format!("content[{i}]"),
                    format!(
                        "{path:?} is not a field path of the object's body (a.b.c, not metadata)"
                    ),
                ));
            }
        }
        out
    }
}

fn all_namespaces() -> Vec<String> {
    vec!["*".to_string()]
}

/// Leader election and checkpoints.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HaSpec {
    /// Elect a leader among replicas through a Lease; only the leader acts.
    #[serde(default)]
    pub enabled: bool,
    /// Namespace of both Leases; default: the pod's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The leader Lease.
    #[serde(default = "default_lease_name")]
    pub lease_name: String,
    /// The Lease holding checkpoints and the index of handled objects.
    #[serde(default = "default_state_lease_name")]
    pub state_lease_name: String,
    /// How long a leader holds the Lease without renewing it (whole seconds, at most 1h).
    #[serde(default = "default_lease_duration")]
    pub lease_duration: HumanDuration,
    /// A leader that cannot renew within this gives up leading.
    #[serde(default = "default_renew_deadline")]
    pub renew_deadline: HumanDuration,
    /// How often replicas try to acquire or renew.
    #[serde(default = "default_retry_period")]
    pub retry_period: HumanDuration,
}

impl Default for HaSpec {
    fn default() -> Self {
        HaSpec {
            enabled: false,
            namespace: None,
            lease_name: default_lease_name(),
            state_lease_name: default_state_lease_name(),
            lease_duration: default_lease_duration(),
            renew_deadline: default_renew_deadline(),
            retry_period: default_retry_period(),
        }
    }
}

fn default_lease_name() -> String {
    "wasmwatch-leader".into()
}
fn default_state_lease_name() -> String {
    "wasmwatch-state".into()
}
/// The longest `ha.leaseDuration`.
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(3600);
/// The longest `delivery.debounce`.
pub const MAX_DEBOUNCE: Duration = Duration::from_secs(3600);
/// The longest `delivery.backoffMax`.
pub const MAX_BACKOFF: Duration = Duration::from_secs(24 * 3600);

fn default_lease_duration() -> HumanDuration {
    HumanDuration(Duration::from_secs(15))
}
fn default_renew_deadline() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
fn default_retry_period() -> HumanDuration {
    HumanDuration(Duration::from_secs(2))
}

/// A named bus connection the host owns; plugins publish to it by name.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BusConnection {
    /// The name plugins publish to (a DNS-1123 label).
    pub name: String,
    /// An AMQP 0-9-1 broker (RabbitMQ); exactly one of amqp and nats.
    #[serde(default)]
    pub amqp: Option<AmqpSpec>,
    /// A NATS server; exactly one of amqp and nats.
    #[serde(default)]
    pub nats: Option<NatsSpec>,
}

/// An AMQP 0-9-1 broker (RabbitMQ). Credentials may sit in the URL or, read
/// from a mounted Secret, in `passwordFile`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AmqpSpec {
    /// `amqp[s]://[user[:password]@]host[:port][/vhost][?heartbeat=S&cacertfile=..]`
    pub url: String,
    /// A file holding the password (for the URL's user, `guest` if none);
    /// overrides a password in the URL. Read at start-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// TLS files (`amqps://` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
}

/// A NATS server. At most one way to authenticate: user and password (in
/// the URL, the password possibly from `passwordFile`), a token (in the URL
/// as `nats://TOKEN@host`, or `tokenFile`), an NKey seed file, or a
/// credentials file (JWT and seed, as `nsc` writes it).
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NatsSpec {
    /// `nats://[user:password@|token@]host[:port]`, or `tls://host:port` to
    /// require TLS.
    pub url: String,
    /// A file holding the password for the URL's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// A file holding a token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// A file holding an NKey user seed (`SU...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nkey_file: Option<PathBuf>,
    /// A `.creds` file (user JWT and NKey seed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creds_file: Option<PathBuf>,
    /// TLS files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
}

/// PEM files for a TLS connection to a broker. Relative paths are relative
/// to the manifest's folder.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsFiles {
    /// CA certificates to verify the server with, instead of the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// A client certificate (with `keyFile`), for servers that ask for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (with `certFile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

impl BusConnection {
    /// Makes the files it names relative to `base_dir`.
    fn resolve_files(&mut self, base_dir: &Path) {
        let join = |p: &mut Option<PathBuf>| {
            if let Some(p) = p {
                *p = base_dir.join(&*p);
            }
        };
        let tls = |t: &mut Option<TlsFiles>| {
            if let Some(t) = t {
                join(&mut t.ca_file);
                join(&mut t.cert_file);
                join(&mut t.key_file);
            }
        };
        if let Some(a) = &mut self.amqp {
            join(&mut a.password_file);
            tls(&mut a.tls);
        }
        if let Some(n) = &mut self.nats {
            join(&mut n.password_file);
            join(&mut n.token_file);
            join(&mut n.nkey_file);
            join(&mut n.creds_file);
            tls(&mut n.tls);
        }
    }
}

/// One plugin and everything the operator says about it.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginEntry {
    /// A DNS-1123 label, unique in the manifest.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Path of the component (`.wasm`), relative to the manifest's folder,
    /// or `oci://REGISTRY/REPOSITORY:TAG` (or `@sha256:DIGEST`): an artifact
    /// the host pulls from an OCI registry (see [`PluginEntry::oci_reference`]).
    pub module: PathBuf,
    /// Hex SHA-256 of the module file (for `oci://`, of the component layer);
    /// the host refuses any other content.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: String,
    /// Which changes reach the plugin (default: every change the host watches).
    #[serde(default)]
    pub events: EventFilter,
    /// Handed to the plugin as JSON (`host.config()` and `check-config`).
    #[serde(default)]
    pub config: serde_json::Value,
    /// What the plugin's actions may do; deny by default.
    #[serde(default)]
    pub capabilities: Capabilities,
    /// Sandbox limits of one call.
    #[serde(default)]
    pub limits: Limits,
    /// How its actions are delivered: coalescing, retries, backoff.
    #[serde(default)]
    pub delivery: Delivery,
}

/// The scheme of a module pulled from an OCI registry.
pub const OCI_SCHEME: &str = "oci://";

impl PluginEntry {
    /// The module's path, resolved against the manifest's folder. An
    /// `oci://` module has no path until it is pulled (wasmwatch-oci), which
    /// replaces `module` with the cached file's absolute path.
    pub fn module_path(&self, base_dir: &Path) -> PathBuf {
        base_dir.join(&self.module)
    }

    /// The registry reference (after `oci://`) when the module is pulled
    /// from an OCI registry.
    pub fn oci_reference(&self) -> Option<&str> {
        self.module.to_str()?.strip_prefix(OCI_SCHEME)
    }
}

/// What is wrong with the reference of an `oci://` module (the text after
/// `oci://`), if anything: the registry must be explicit (a host name with a
/// dot or a port, or `localhost`), and a tag or a digest must follow the
/// repository. The full grammar is checked when the module is pulled.
pub fn oci_reference_problem(reference: &str) -> Option<String> {
    let Some((registry, rest)) = reference.split_once('/') else {
        return Some("must be oci://REGISTRY/REPOSITORY:TAG or ...@sha256:DIGEST".into());
    };
    if registry.is_empty()
        || !(registry.contains('.') || registry.contains(':') || registry == "localhost")
    {
        return Some(format!(
            "{registry:?} is not a registry host (it needs a dot or a port, or be localhost); \
             write the registry explicitly, e.g. oci://ghcr.io/{reference}"
        ));
    }
    let (name, digest) = match rest.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (rest, None),
    };
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Some(format!("{d:?} is not a sha256:DIGEST (64 hex digits)"));
        }
    }
    let slash = name.rfind('/').unwrap_or(0);
    let (repository, tag) = match name[slash..].find(':') {
        Some(i) => (&name[..slash + i], Some(&name[slash + i + 1..])),
        None => (name, None),
    };
    match (tag, digest) {
        (Some(""), _) => return Some("the tag after ':' is empty".into()),
        (None, None) => return Some("needs a tag (:TAG) or a digest (@sha256:DIGEST)".into()),
        _ => {}
    }
    if repository.is_empty() || repository.ends_with('/') {
        return Some("the repository name is missing".into());
    }
    None
}

/// Which events a plugin gets.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EventFilter {
    /// ConfigMap, Secret or both (default); each must be in watch.kinds.
    #[serde(default = "all_kinds")]
    pub kinds: Vec<ObjectKind>,
    /// added, modified, deleted, resynced (default: all).
    #[serde(default = "all_changes")]
    pub changes: Vec<ChangeType>,
    /// Namespaces, or ["*"] (default) for all that are watched.
    #[serde(default = "all_namespaces")]
    pub namespaces: Vec<String>,
    /// Only objects with these labels reach the plugin (a Kubernetes label selector).
    #[serde(default)]
    pub label_selector: Option<LabelSelector>,
}

impl Default for EventFilter {
    fn default() -> Self {
        EventFilter {
            kinds: all_kinds(),
            changes: all_changes(),
            namespaces: all_namespaces(),
            label_selector: None,
        }
    }
}

fn all_changes() -> Vec<ChangeType> {
    vec![
        ChangeType::Added,
        ChangeType::Modified,
        ChangeType::Deleted,
        ChangeType::Resynced,
    ]
}

impl EventFilter {
    /// Whether this plugin gets the event.
    pub fn matches(&self, event: &crate::event::ChangeEvent) -> bool {
        let o = &event.object;
        self.kinds.contains(&o.kind)
            && self.changes.contains(&event.change)
            && self
                .namespaces
                .iter()
                .any(|n| n == "*" || *n == o.namespace)
            && self
                .label_selector
                .as_ref()
                .is_none_or(|s| s.matches(&o.labels))
    }
}

/// Sandbox limits of one plugin.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Limits {
    /// Wall-clock deadline of one call (instantiation included).
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    /// Linear memory the plugin may grow to.
    #[serde(default = "default_memory")]
    pub memory: ByteSize,
    /// Actions one call may return.
    #[serde(default = "default_max_actions")]
    pub max_actions: u32,
}

pub const MAX_MEMORY: u64 = 1 << 30;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: default_timeout(),
            memory: default_memory(),
            max_actions: default_max_actions(),
        }
    }
}

fn default_timeout() -> HumanDuration {
    HumanDuration(Duration::from_millis(100))
}
fn default_memory() -> ByteSize {
    ByteSize(32 << 20)
}
fn default_max_actions() -> u32 {
    1000
}

/// How the host delivers a plugin's actions.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Delivery {
    /// Wait this long after a change before acting; changes to the same target
    /// within the window are coalesced into one.
    #[serde(default = "zero")]
    pub debounce: HumanDuration,
    /// Retries after the first attempt, before dead-lettering.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// The first retry's delay; it doubles up to backoffMax.
    #[serde(default = "default_backoff_initial")]
    pub backoff_initial: HumanDuration,
    /// The longest delay between retries (at most 24h).
    #[serde(default = "default_backoff_max")]
    pub backoff_max: HumanDuration,
    /// The shortest time between two actions on one target (a workload's
    /// restarts, a Service's refreshes; at most 1h). Changes meanwhile wait
    /// and merge, the last content winning, and a Warning Event
    /// (`Throttled`) on the changed object says so: a Secret that flaps
    /// rolls its workloads at most once per cooldown. 0: none.
    #[serde(default = "zero")]
    pub cooldown: HumanDuration,
    /// How this plugin's restarts roll a workload: `annotations` (one
    /// pod-template annotation per object) or `env-vars` (Reloader's
    /// default: a `STAKATER_<NAME>_<KIND>` variable in the container that
    /// uses the object). A workload's `wasmwatch.io/reload-strategy`
    /// annotation overrides it.
    #[serde(default)]
    pub restart_strategy: crate::action::RestartStrategy,
}

impl Default for Delivery {
    fn default() -> Self {
        Delivery {
            debounce: zero(),
            retries: default_retries(),
            backoff_initial: default_backoff_initial(),
            backoff_max: default_backoff_max(),
            cooldown: zero(),
            restart_strategy: Default::default(),
        }
    }
}

/// Optional metric families on the admin port's `/metrics` (the others are
/// always there).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MetricsSpec {
    /// Also count restarts per namespace, as Stakater Reloader does with
    /// `METRICS_COUNT_BY_NAMESPACE=enabled` (Helm `enableMetricsByNamespace`):
    /// the family `reloader_reload_executed_total_by_namespace{namespace,success}`,
    /// one series per namespace with a restart (default false: a series per
    /// namespace can be many).
    #[serde(default)]
    pub reloader_by_namespace: bool,
}

/// Token buckets the host's actions pass before every attempt.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimits {
    /// Over every action (default 1,000 per second, bursts of 1,000).
    #[serde(default = "default_global_rate")]
    pub global: Rate,
    /// Per target: one workload, one Service's refresh path, one URL
    /// (default 50 per second, bursts of 50).
    #[serde(default = "default_per_target_rate")]
    pub per_target: Rate,
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits {
            global: default_global_rate(),
            per_target: default_per_target_rate(),
        }
    }
}

/// `perSecond` on average, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Rate {
    pub per_second: f64,
    pub burst: u32,
}

// Ceilings against a runaway writer, not the storm guard: that is the
// coalescing (one job per target, everything meanwhile merged into it),
// which keeps a target at one refresh in flight whatever the rate of
// changes. Until 2026-12-05 the defaults were 200/s (bursts of 100) and 5/s
// (bursts of 5); at 1,000 changes/s over 50 apps (20 a second each) they,
// not the work, made write -> POST p50 119 ms (`bench compare`, issue 24).
fn default_global_rate() -> Rate {
    Rate {
        per_second: 1000.0,
        burst: 1000,
    }
}
fn default_per_target_rate() -> Rate {
    Rate {
        per_second: 50.0,
        burst: 50,
    }
}

fn zero() -> HumanDuration {
    HumanDuration(Duration::ZERO)
}
fn default_retries() -> u32 {
    5
}
fn default_backoff_initial() -> HumanDuration {
    HumanDuration(Duration::from_secs(1))
}
fn default_backoff_max() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}

/// One problem in a manifest: where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The field's path, like `plugins[0].limits.memory`; empty for the whole document.
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Why a manifest was refused: every problem found, each naming its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// The manifest file, when it was read from one.
    pub source: Option<PathBuf>,
    pub problems: Vec<Problem>,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(p) => write!(f, "invalid manifest {}", p.display())?,
            None => write!(f, "invalid manifest")?,
        }
        for p in &self.problems {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ManifestError {}

/// What [`Manifest::check`] found.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The manifest as read, faulty fields left out; `None` when unreadable.
    pub manifest: Option<Manifest>,
    /// Every problem, each naming its field; empty when the manifest is valid.
    pub errors: Vec<Problem>,
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

impl Manifest {
    /// Parses and validates a manifest from YAML text. Module paths are
    /// relative to `base_dir`. Refused, it names every problem found (see
    /// [`Manifest::check`]).
    pub fn parse(yaml: &str, base_dir: &Path) -> Result<Manifest, ManifestError> {
        match Manifest::check(yaml, base_dir) {
            Checked {
                manifest: Some(m),
                errors,
            } if errors.is_empty() => Ok(m),
            Checked { errors, .. } => Err(ManifestError {
                source: None,
                problems: errors,
            }),
        }
    }

    /// Parses and validates a manifest, going on past each problem to find
    /// the others: a field of a wrong type, with a bad value or unknown is
    /// reported, then left out (a missing required field gets a
    /// placeholder) and the rest read again, so one run names every
    /// problem, not only the first. `manifest` is what was read with the
    /// faulty fields left out (for further checks of its sound parts; never
    /// run it when `errors` is not empty); `None` when the text is not YAML
    /// or the problems could not be stepped over.
    pub fn check(yaml: &str, base_dir: &Path) -> Checked {
        let value: serde_yaml::Value = match serde_yaml::from_str(yaml) {
            Ok(v) => v,
            Err(e) => {
                return Checked {
                    manifest: None,
                    errors: vec![Problem {
                        path: String::new(),
                        message: e.to_string(),
                    }],
                };
            }
        };
        let (manifest, errors, repaired) = crate::repair::deserialize_all::<Manifest>(value);
        let Some(mut manifest) = manifest else {
            return Checked { manifest, errors };
        };
        manifest.base_dir = base_dir.to_path_buf();
        for b in &mut manifest.buses {
            b.resolve_files(base_dir);
        }
        let mut errors = errors;
        // A field left out or filled in stands for a problem already
        // reported: what the checks say about it (or its parent) is noise.
        errors.extend(
            manifest
                .problems()
                .into_iter()
                .filter(|p| !repaired.iter().any(|r| crate::repair::related(&p.path, r))),
        );
        Checked {
            manifest: Some(manifest),
            errors,
        }
    }

    /// Reads, parses and validates a manifest file.
    pub fn from_file(path: &Path) -> Result<Manifest, ManifestError> {
        let with_source = |mut e: ManifestError| {
            e.source = Some(path.to_path_buf());
            e
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            with_source(ManifestError {
                source: None,
                problems: vec![Problem {
                    path: String::new(),
                    message: format!("cannot read it: {e}"),
                }],
            })
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Manifest::parse(&text, base).map_err(with_source)
    }

    /// The entry named `name`.
    pub fn plugin(&self, name: &str) -> Option<&PluginEntry> {
        self.plugins.iter().find(|p| p.name == name)
    }

    /// What can never work in a valid manifest, each naming its field: a
    /// plugin filter that selects nothing (a label selector that
    /// contradicts itself or the watch's, namespaces that are not watched,
    /// no kinds). `wasmwatch run` starts with these; `validate` warns.
    /// [`crate::needs::shortfalls`] adds the grants a plugin lacks.
    pub fn warnings(&self) -> Vec<Problem> {
        use crate::selector::LabelSelector;
        let mut out = Vec::new();
        let mut warn = |path: String, message: String| out.push(Problem { path, message });
        let watch_sel = self.watch.label_selector.as_ref();
        let watch_never = watch_sel.and_then(|s| LabelSelector::never_matches(&[s]));
        if let (Some(s), Some(why)) = (watch_sel, &watch_never) {
            warn(
                "watch.labelSelector".into(),
                format!("{:?} never matches: {why}; nothing is watched", s.as_str()),
            );
        }
        let watch_all = self.watch.namespaces.iter().any(|n| n == "*");
        let ignored = |n: &String| self.watch.ignore_namespaces.contains(n);
        for (i, n) in self.watch.ignore_namespaces.iter().enumerate() {
            if self.watch.namespaces.contains(n) {
                warn(
                    format!("watch.ignoreNamespaces[{i}]"),
                    format!(
                        "{n:?} is also in watch.namespaces: it is watched, but none of its objects is ever delivered"
                    ),
                );
            }
        }
        if !watch_all && self.watch.namespaces.iter().all(ignored) {
            warn(
                "watch.ignoreNamespaces".into(),
                "ignores every namespace of watch.namespaces: nothing is ever delivered".into(),
            );
        }
        if let Some(sel) = &self.watch.namespace_selector
            && let Some(why) = LabelSelector::never_matches(&[sel])
        {
            warn(
                "watch.namespaceSelector".into(),
                format!(
                    "{:?} never matches: {why}; no namespace is ever in scope",
                    sel.as_str()
                ),
            );
        }
        for (i, p) in self.plugins.iter().enumerate() {
            let at = format!("plugins[{i}].events");
            for (j, n) in p.events.namespaces.iter().enumerate() {
                if ignored(n) {
                    warn(
                        format!("{at}.namespaces[{j}]"),
                        format!(
                            "{n:?} is in watch.ignoreNamespaces: the plugin never gets events from it"
                        ),
                    );
                }
            }
            if p.events.kinds.is_empty() {
                warn(
                    format!("{at}.kinds"),
                    "is empty: the plugin never gets any event".into(),
                );
            }
            if !watch_all && !p.events.namespaces.iter().any(|n| n == "*") {
                let unwatched = |n: &String| !self.watch.namespaces.contains(n);
                let none_watched = p.events.namespaces.iter().all(unwatched);
                for (j, n) in p.events.namespaces.iter().enumerate() {
                    if unwatched(n) {
                        warn(
                            format!("{at}.namespaces[{j}]"),
                            format!(
                                "{n:?} is not in watch.namespaces ({}): the plugin never gets events from it{}",
                                self.watch.namespaces.join(", "),
                                if none_watched {
                                    ", nor from any of its namespaces"
                                } else {
                                    ""
                                }
                            ),
                        );
                    }
                }
            }
            let Some(sel) = &p.events.label_selector else {
                continue;
            };
            if let Some(why) = LabelSelector::never_matches(&[sel]) {
                warn(
                    format!("{at}.labelSelector"),
                    format!(
                        "{:?} never matches: {why}; the plugin never gets any event",
                        sel.as_str()
                    ),
                );
            } else if let Some(w) = watch_sel
                && watch_never.is_none()
                && let Some(why) = LabelSelector::never_matches(&[w, sel])
            {
                warn(
                    format!("{at}.labelSelector"),
                    format!(
                        "{:?} never matches an object that watch.labelSelector {:?} lets through: {why}; \
                         the plugin never gets any event",
                        sel.as_str(),
                        w.as_str()
                    ),
                );
            }
        }
        out
    }

    /// The JSON Schema (draft 7) of the manifest, from these types: what
    /// `wasmwatch manifest schema` prints and deploy/manifest.schema.json
    /// holds, for editors (the YAML language server) to check manifests as
    /// they are written. The checks across fields stay with
    /// [`Manifest::check`].
    pub fn json_schema() -> serde_json::Value {
        let generator = schemars::generate::SchemaSettings::draft07().into_generator();
        let mut schema = generator.into_root_schema_for::<Manifest>().to_value();
        if let Some(o) = schema.as_object_mut() {
            o.insert(
                "title".into(),
                "wasmwatch plugin manifest (PluginManifest, wasmwatch.io/v1alpha1)".into(),
            );
        }
        schema
    }

    /// Every semantic problem, each with its field path.
    fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let mut bad = |path: String, message: String| out.push(Problem { path, message });
        if self.api_version != API_VERSION {
            bad(
                "apiVersion".into(),
                format!(
                    "{:?} is not supported; expected {API_VERSION:?}",
                    self.api_version
                ),
            );
        }
        if self.kind != KIND {
            bad("kind".into(), format!("{:?}: expected {KIND:?}", self.kind));
        }
        for (field, rate) in [
            ("rateLimits.global", self.rate_limits.global),
            ("rateLimits.perTarget", self.rate_limits.per_target),
        ] {
            if !(rate.per_second.is_finite() && rate.per_second > 0.0 && rate.per_second <= 1e6) {
                bad(
                    format!("{field}.perSecond"),
                    format!(
                        "{} is out of range (more than 0, at most 1000000)",
                        rate.per_second
                    ),
                );
            }
            if rate.burst == 0 {
                bad(
                    format!("{field}.burst"),
                    "must be at least 1 (0 would let nothing through)".into(),
                );
            }
        }
        if self.watch.kinds.is_empty() {
            bad("watch.kinds".into(), "must name at least one kind".into());
        }
        let mut seen = BTreeSet::new();
        for (i, k) in self.watch.kinds.iter().enumerate() {
            if !seen.insert(k.kind()) {
                bad(
                    format!("watch.kinds[{i}]"),
                    format!("{} is named twice", k.kind()),
                );
            }
            match k {
                WatchedKind::Custom(spec) => {
                    for (field, why) in spec.problems() {
                        bad(format!("watch.kinds[{i}].{field}"), why);
                    }
                }
                WatchedKind::Named(ObjectKind::Custom(_)) if k.spec().is_none() => bad(
                    format!("watch.kinds[{i}]"),
                    format!(
                        "wasmwatch does not know what {} holds: write it as {{apiVersion, kind, content: [field paths]}}",
                        k.kind()
                    ),
                ),
                WatchedKind::Named(_) => {}
            }
        }
        check_namespaces(&self.watch.namespaces, "watch.namespaces", &mut bad);
        for (i, n) in self.watch.ignore_namespaces.iter().enumerate() {
            if !is_dns_label(n) {
                bad(
                    format!("watch.ignoreNamespaces[{i}]"),
                    format!("{n:?} is not a valid namespace name"),
                );
            }
        }
        if !is_dns_subdomain(&self.watch.digest_key_secret) {
            bad(
                "watch.digestKeySecret".into(),
                format!(
                    "{:?} is not a valid Secret name (DNS-1123 subdomain)",
                    self.watch.digest_key_secret
                ),
            );
        }

        let ha = &self.ha;
        for (field, name) in [
            ("ha.leaseName", &ha.lease_name),
            ("ha.stateLeaseName", &ha.state_lease_name),
        ] {
            if !is_dns_subdomain(name) {
                bad(
                    field.into(),
                    format!("{name:?} is not a valid Lease name (DNS-1123 subdomain)"),
                );
            }
        }
        if ha.lease_name == ha.state_lease_name {
            bad(
                "ha.stateLeaseName".into(),
                format!("{:?} must differ from ha.leaseName", ha.state_lease_name),
            );
        }
        if let Some(ns) = &ha.namespace
            && !is_dns_label(ns)
        {
            bad(
                "ha.namespace".into(),
                format!("{ns:?} is not a valid namespace name"),
            );
        }
        if ha.lease_duration <= ha.renew_deadline {
            bad(
                "ha.leaseDuration".into(),
                format!(
                    "{} must be greater than ha.renewDeadline ({})",
                    ha.lease_duration, ha.renew_deadline
                ),
            );
        }
        if ha.renew_deadline.0.as_secs_f64() <= 1.2 * ha.retry_period.0.as_secs_f64() {
            bad(
                "ha.renewDeadline".into(),
                format!(
                    "{} must be greater than 1.2 x ha.retryPeriod ({})",
                    ha.renew_deadline, ha.retry_period
                ),
            );
        }
        if ha.retry_period.0.is_zero() {
            bad("ha.retryPeriod".into(), "must be greater than 0".into());
        }
        // Leases count whole seconds in an int32, and the elector adds these
        // to clock readings: keep them to sane, overflow-free values.
        // A Lease holds its duration in whole seconds.
        if ha.lease_duration.0.subsec_nanos() != 0 {
            bad(
                "ha.leaseDuration".into(),
                format!("{} must be whole seconds", ha.lease_duration),
            );
        }
        if ha.lease_duration.0 > MAX_LEASE_DURATION {
            bad(
                "ha.leaseDuration".into(),
                format!("{} is out of range (at most 1h)", ha.lease_duration),
            );
        }

        let mut bus_names = BTreeSet::new();
        for (i, b) in self.buses.iter().enumerate() {
            let at = format!("buses[{i}]");
            if !is_dns_label(&b.name) {
                bad(
                    format!("{at}.name"),
                    format!(
                        "{:?} is not a valid name (lowercase letters, digits, '-')",
                        b.name
                    ),
                );
            }
            if !bus_names.insert(b.name.as_str()) {
                bad(
                    format!("{at}.name"),
                    format!("{:?} is defined twice", b.name),
                );
            }
            match (&b.amqp, &b.nats) {
                (Some(a), None) => {
                    if !(a.url.starts_with("amqp://") || a.url.starts_with("amqps://")) {
                        bad(
                            format!("{at}.amqp.url"),
                            format!("{:?} must start with amqp:// or amqps://", a.url),
                        );
                    }
                }
                (None, Some(n)) => {
                    if !n.url.starts_with("nats://") {
                        bad(
                            format!("{at}.nats.url"),
                            format!("{:?} must start with nats://", n.url),
                        );
                    }
                }
                _ => bad(at, "must have exactly one of amqp or nats".into()),
            }
        }

        if self.plugins.is_empty() {
            bad("plugins".into(), "must list at least one plugin".into());
        }
        let mut names = BTreeSet::new();
        for (i, p) in self.plugins.iter().enumerate() {
            let at = format!("plugins[{i}]");
            if !is_dns_label(&p.name) {
                bad(
                    format!("{at}.name"),
                    format!(
                        "{:?} is not a valid name (lowercase letters, digits, '-')",
                        p.name
                    ),
                );
            }
            if !names.insert(p.name.as_str()) {
                bad(
                    format!("{at}.name"),
                    format!("{:?} is used by another plugin", p.name),
                );
            }
            if p.sha256.len() != 64
                || !p
                    .sha256
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            {
                bad(
                    format!("{at}.sha256"),
                    format!("{:?} is not a SHA-256 (64 lowercase hex digits)", p.sha256),
                );
            }
            if p.module.as_os_str().is_empty() {
                bad(format!("{at}.module"), "must not be empty".into());
            }
            if let Some(reference) = p.oci_reference()
                && let Some(problem) = oci_reference_problem(reference)
            {
                bad(
                    format!("{at}.module"),
                    format!("{:?}: {problem}", p.module.display().to_string()),
                );
            }
            for k in &p.events.kinds {
                if !self.watch.watches(*k) {
                    bad(
                        format!("{at}.events.kinds"),
                        format!("{} is not watched (add it to watch.kinds)", k.as_str()),
                    );
                }
            }
            if p.events.changes.is_empty() {
                bad(
                    format!("{at}.events.changes"),
                    "must name at least one change type".into(),
                );
            }
            check_namespaces(
                &p.events.namespaces,
                &format!("{at}.events.namespaces"),
                &mut bad,
            );
            let l = &p.limits;
            if l.timeout.0 < Duration::from_millis(1) || l.timeout.0 > Duration::from_secs(60) {
                bad(
                    format!("{at}.limits.timeout"),
                    format!("{} is out of range (1ms to 60s)", l.timeout),
                );
            }
            if l.memory.0 < 1 << 20 || l.memory.0 > MAX_MEMORY {
                bad(
                    format!("{at}.limits.memory"),
                    format!("{} is out of range (1Mi to 1Gi)", l.memory),
                );
            }
            if l.max_actions == 0 || l.max_actions > 100_000 {
                bad(
                    format!("{at}.limits.maxActions"),
                    format!("{} is out of range (1 to 100000)", l.max_actions),
                );
            }
            let d = &p.delivery;
            if d.retries > 100 {
                bad(
                    format!("{at}.delivery.retries"),
                    format!("{} is out of range (0 to 100)", d.retries),
                );
            }
            // The pipeline adds these to clock readings; bounded, they cannot
            // overflow (a panic there would stall the plugin's deliveries).
            if d.debounce.0 > MAX_DEBOUNCE {
                bad(
                    format!("{at}.delivery.debounce"),
                    format!("{} is out of range (at most 1h)", d.debounce),
                );
            }
            if d.cooldown.0 > MAX_DEBOUNCE {
                bad(
                    format!("{at}.delivery.cooldown"),
                    format!("{} is out of range (at most 1h)", d.cooldown),
                );
            }
            if d.backoff_max.0 > MAX_BACKOFF {
                bad(
                    format!("{at}.delivery.backoffMax"),
                    format!("{} is out of range (at most 24h)", d.backoff_max),
                );
            }
            if d.backoff_initial > d.backoff_max {
                bad(
                    format!("{at}.delivery.backoffInitial"),
                    format!(
                        "{} must not exceed delivery.backoffMax ({})",
                        d.backoff_initial, d.backoff_max
                    ),
                );
            }
            for (j, g) in p.capabilities.bus.iter().enumerate() {
                if g.connection != "*" && !bus_names.contains(g.connection.as_str()) {
                    bad(
                        format!("{at}.capabilities.bus[{j}]"),
                        format!("connection {:?} is not defined in buses", g.connection),
                    );
                }
            }
            for (j, kind) in p.capabilities.restart.kinds.iter().enumerate() {
                if kind == "*" {
                    continue;
                }
                if let Err(why) = crate::action::WorkloadKind::parse(kind) {
                    bad(format!("{at}.capabilities.restart.kinds[{j}]"), why);
                }
            }
            for (field, list) in [
                ("refresh", &p.capabilities.refresh),
                ("restart", &p.capabilities.restart.namespaces),
            ] {
                for (j, n) in list.iter().enumerate() {
                    if n.0 != "*" && !is_dns_label(&n.0) {
                        bad(
                            format!("{at}.capabilities.{field}[{j}]"),
                            format!("{:?} is not a namespace name or *", n.0),
                        );
                    }
                }
            }
        }
        out
    }
}

fn check_namespaces(list: &[String], path: &str, bad: &mut impl FnMut(String, String)) {
    if list.is_empty() {
        bad(
            path.into(),
            "must name at least one namespace, or \"*\" for all".into(),
        );
    }
    if list.len() > 1 && list.iter().any(|n| n == "*") {
        bad(
            path.into(),
            "\"*\" (all namespaces) cannot be combined with names".into(),
        );
    }
    for (i, n) in list.iter().enumerate() {
        if n != "*" && !is_dns_label(n) {
            bad(
                format!("{path}[{i}]"),
                format!("{n:?} is not a valid namespace name"),
            );
        }
    }
}
