//! An in-memory Kubernetes API server for tests and the embedded local run.
//!
//! It speaks the real Kubernetes HTTP API (plain HTTP/1.1 on loopback, JSON,
//! real paths and verbs) for the resources wasmwatch touches — namespaces,
//! configmaps, secrets, services, pods, events (core/v1), endpointslices,
//! deployments, statefulsets, daemonsets, jobs, cronjobs, leases,
//! events.k8s.io events, customresourcedefinitions (apiextensions.k8s.io/v1),
//! mutatingwebhookconfigurations (admissionregistration.k8s.io/v1),
//! and four custom resources (no strategic merge patch): Argo Rollouts
//! (argoproj.io/v1alpha1), OpenKruise CloneSets (apps.kruise.io/v1alpha1)
//! and the Secrets Store CSI driver's SecretProviderClasses and
//! SecretProviderClassPodStatuses (secrets-store.csi.x-k8s.io/v1) —
//! with kube-apiserver's resourceVersion, watch, bookmark, 410 and 409
//! semantics, so that kubectl and kube-rs work against it unmodified.
//!
//! A custom resource is served only while its CustomResourceDefinition
//! (`<plural>.<group>`) exists, as on kube-apiserver: otherwise its paths
//! are 404 and discovery does not list it. [`Config::preinstalled_crds`]
//! (on by default) creates the four CRDs at start; without it a test
//! creates them (`kubectl apply -f crd.yaml`). A CRD can be created only for
//! a custom type of the registry ([`resources`]), with its kind and scope
//! (422 Invalid otherwise); it is established at once. Deleting a CRD
//! deletes every object of its resource (DELETED events) and ends the
//! watches on it.
//!
//! Mutating admission webhooks are called as kube-apiserver calls them
//! ([`admission`]): every create and update (POST, PUT, every PATCH, and
//! `/status` and `/scale` when a rule names them) goes, after the server's
//! defaults and before validation and storage, to each matching webhook of
//! every MutatingWebhookConfiguration (by name, then list order) over HTTPS
//! (`clientConfig.url`, trusted through `caBundle`); a JSON Patch answer is
//! applied, a denial or a failed call (under `failurePolicy: Fail`) fails
//! the write with kube's status and message.
//!
//! # Design
//!
//! * [`resources`] is a static registry of the resource types: group,
//!   version, plural, kind, scope, and the few behaviours that differ by kind
//!   (generation tracking, status subresource, name rules, custom types
//!   served only with their CRD).
//! * [`store`] keeps every object as a `serde_json::Value` keyed by
//!   (resource, namespace, name), one global resourceVersion counter, a bounded
//!   ring of past changes and a broadcast feed, all under one mutex so that a
//!   watch started from a list's version never misses or duplicates a change.
//!   Past snapshots (exact lists, continue tokens) are rebuilt by rewinding
//!   the ring; anything older than the ring is 410 Expired.
//! * [`objects`] applies what kube-apiserver does to an object on write
//!   (uid, creationTimestamp, generation, status rules, Secret `stringData`,
//!   defaults) and validates it (422 Invalid).
//! * [`api`] implements the verbs with kube-apiserver's optimistic update
//!   loop (mutating admission webhooks, [`admission`], are called between
//!   computing an object and committing it, with no lock held, so a webhook
//!   may call back into the server); [`patch`] the three patch formats;
//!   [`selector`] label and field
//!   selectors; [`watch`] the streaming watch responses; [`discovery`] the
//!   discovery documents; [`table`] the `Table` answers kubectl asks for
//!   to print columns (kube-apiserver's printers).
//! * [`http`] is the hyper server: routing, the accept loop and `/_faults`.
//! * [`audit`] records every request answered as Kubernetes authorization
//!   sees it (verb, group, resource, namespace, name), for tests that check
//!   a client's RBAC needs ([`ServerHandle::requests`]), and every
//!   admission webhook call ([`ServerHandle::webhook_calls`]).
//! * [`faults`] holds the switches tests flip: close watches, fail requests
//!   with 500/429, add latency, compact history, refuse connections, force a
//!   409 on a named object, answer the Nth request matching a filter with a
//!   403/409/500/503 or a dropped connection ([`Faults::fail_nth`]).
//!
//! # Use in tests
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use wasmwatch_apiserver::{Config, Server};
//! let server = Server::start(Config::default()).await?;
//! let client = server.client()?;             // a kube::Client
//! let dir = tempfile::tempdir()?;
//! let kubeconfig = dir.path().join("kubeconfig");
//! server.write_kubeconfig(&kubeconfig)?;     // for kubectl --kubeconfig
//! server.wait_for_watches(1).await;         // the code under test is watching
//! server.faults().close_watches();
//! for call in server.webhook_calls() {       // admission webhooks called
//!     println!("{} {} {}/{}: {}", call.webhook, call.operation, call.namespace, call.name, call.outcome);
//! }
//! # Ok(()) }
//! ```
//!
//! A test exercises a mutating admission webhook by creating a
//! `MutatingWebhookConfiguration` whose `clientConfig.url` is an HTTPS
//! server of its own (`https://127.0.0.1:PORT/...`, `caBundle` the base64
//! PEM of the CA that signed its certificate); `tests/webhooks.rs` has one
//! (hyper, tokio-rustls, an rcgen CA).
//!
//! The same faults are reachable out of process as `POST /_faults/...`
//! (see the crate README); `wasmwatch-apiserver --port P --kubeconfig F
//! --history N` runs the server as a binary until Ctrl-C.

pub mod admission;
pub mod api;
pub mod audit;
pub mod discovery;
pub mod error;
pub mod faults;
pub mod http;
pub mod objects;
pub mod patch;
pub mod protobuf;
pub mod resources;
pub mod selector;
pub mod store;
pub mod table;
pub mod validation;
pub mod watch;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch as tokio_watch};

pub use audit::{NonResourceRequest, Request, WebhookCall};
pub use error::{ApiError, Error};
pub use faults::{Failure, FaultAnswer, Faults, RequestFault};

/// Server settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen; port 0 picks a free port.
    pub addr: SocketAddr,
    /// How many past changes are kept for watch resumption and exact lists.
    pub history: usize,
    /// Interval between BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Changes buffered per watch before a slow watch is closed.
    pub broadcast_capacity: usize,
    /// Create a namespace on first use instead of answering 404 for objects
    /// in a namespace that does not exist (kube-apiserver answers 404).
    pub auto_create_namespaces: bool,
    /// How many requests the request log keeps (the newest; resource and
    /// non-resource requests each); 0 records nothing. See [`audit`].
    pub request_log: usize,
    /// A namespace being deleted: the pause before each resource's content
    /// goes, then the namespace (the namespace controller's pace; see
    /// `api::terminate_namespace`).
    pub namespace_teardown_step: Duration,
    /// Create at start the CustomResourceDefinition of every custom type
    /// of the registry (so they are served from the start, the default);
    /// off: no custom resource is served until its CRD is created.
    pub preinstalled_crds: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            history: 10_000,
            bookmark_interval: Duration::from_secs(60),
            broadcast_capacity: 64 * 1024,
            auto_create_namespaces: false,
            request_log: 100_000,
            namespace_teardown_step: Duration::from_millis(20),
            preinstalled_crds: true,
        }
    }
}

impl Config {
    pub fn port(mut self, port: u16) -> Self {
        self.addr.set_port(port);
        self
    }

    pub fn namespace_teardown_step(mut self, step: Duration) -> Self {
        self.namespace_teardown_step = step;
        self
    }

    pub fn history(mut self, history: usize) -> Self {
        self.history = history;
        self
    }

    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    pub fn broadcast_capacity(mut self, capacity: usize) -> Self {
        self.broadcast_capacity = capacity;
        self
    }

    pub fn auto_create_namespaces(mut self, on: bool) -> Self {
        self.auto_create_namespaces = on;
        self
    }

    pub fn request_log(mut self, capacity: usize) -> Self {
        self.request_log = capacity;
        self
    }

    pub fn preinstalled_crds(mut self, on: bool) -> Self {
        self.preinstalled_crds = on;
        self
    }
}

/// State shared by every connection.
pub struct Shared {
    pub(crate) store: Arc<store::Store>,
    pub(crate) faults: Faults,
    pub(crate) config: Config,
    pub(crate) addr: SocketAddr,
    pub(crate) requests: Arc<audit::RequestLog>,
}

/// Entry point: `Server::start(config)`.
pub struct Server;

/// Namespaces that exist from the start, as in a fresh cluster.
pub const INITIAL_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

impl Server {
    /// Bind, create the initial namespaces (and the CRDs, with
    /// [`Config::preinstalled_crds`]) and serve in the background.
    pub async fn start(config: Config) -> Result<ServerHandle, Error> {
        let listener = TcpListener::bind(config.addr)
            .await
            .map_err(|source| Error::Bind {
                addr: config.addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.addr,
            source,
        })?;
        let store = Arc::new(store::Store::new(
            config.history,
            config.broadcast_capacity,
            config.auto_create_namespaces,
        ));
        let ns = resources::namespaces_id();
        for name in INITIAL_NAMESPACES {
            store
                .create(ns, "", name, objects::new_namespace(name))
                .expect("fresh store");
        }
        if config.preinstalled_crds {
            let crds = resources::crds_id();
            for rt in resources::RESOURCES.iter().filter(|r| r.custom) {
                let (name, crd) =
                    objects::prepare_create(&resources::RESOURCES[crds], "", objects::crd_for(rt))
                        .expect("the registry's CRDs are valid");
                store.create(crds, "", &name, crd).expect("fresh store");
            }
        }
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let faults = Faults::new(store.clone(), control_tx);
        let requests = Arc::new(audit::RequestLog::new(config.request_log));
        let shared = Arc::new(Shared {
            store: store.clone(),
            faults: faults.clone(),
            config,
            addr,
            requests: requests.clone(),
        });
        let (shutdown, shutdown_rx) = tokio_watch::channel(false);
        let task = tokio::spawn(http::accept_loop(listener, shared, control_rx, shutdown_rx));
        tracing::debug!(%addr, "test API server listening");
        Ok(ServerHandle {
            addr,
            store,
            faults,
            requests,
            shutdown,
            task: Some(task),
        })
    }
}

/// A running server. Dropping it stops the server.
pub struct ServerHandle {
    addr: SocketAddr,
    store: Arc<store::Store>,
    faults: Faults,
    requests: Arc<audit::RequestLog>,
    shutdown: tokio_watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ServerHandle {
    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The fault switches.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The latest committed resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store.resource_version()
    }

    /// The number of watch streams open right now.
    pub fn open_watches(&self) -> usize {
        *self.store.open_watches().borrow()
    }

    /// A receiver of the number of open watch streams, to await changes.
    pub fn watch_count(&self) -> tokio::sync::watch::Receiver<usize> {
        self.store.open_watches()
    }

    /// Wait until at least `n` watch streams are open (e.g. until the code
    /// under test has established its watch), without sleeping.
    pub async fn wait_for_watches(&self, n: usize) {
        let mut rx = self.store.open_watches();
        let _ = rx.wait_for(|&open| open >= n).await;
    }

    /// The resource requests answered since the start or the last
    /// [`Self::clear_requests`], oldest first, each as Kubernetes
    /// authorization sees it: verb (get, list, watch, create, update, patch,
    /// delete, deletecollection), group, resource, subresource, namespace,
    /// name (also from a `metadata.name=` field selector), with the response
    /// status and User-Agent. See [`audit`].
    pub fn requests(&self) -> Vec<Request> {
        self.requests.requests()
    }

    /// The other requests answered (discovery, `/version`, `/openapi`,
    /// health, unknown paths), oldest first; `/_faults` is not recorded.
    pub fn non_resource_requests(&self) -> Vec<NonResourceRequest> {
        self.requests.non_resource_requests()
    }

    /// The mutating admission webhook calls made since the start or the
    /// last [`Self::clear_requests`], oldest first: which webhook, for what
    /// write, and how it ended (`allowed`, `patched`, `denied`, `failed`,
    /// `ignored`). See [`admission`].
    pub fn webhook_calls(&self) -> Vec<WebhookCall> {
        self.requests.webhook_calls()
    }

    /// How many requests the log dropped (beyond [`Config::request_log`])
    /// since the start or the last [`Self::clear_requests`].
    pub fn requests_dropped(&self) -> u64 {
        self.requests.dropped()
    }

    /// Empty the request log (and the webhook calls).
    pub fn clear_requests(&self) {
        self.requests.clear();
    }

    /// Change the history size; shrinking drops the oldest changes now.
    pub fn set_history(&self, capacity: usize) {
        self.store.set_history_capacity(capacity);
    }

    fn resource(resource: &str) -> Option<resources::ResourceId> {
        let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
        resources::RESOURCES
            .iter()
            .position(|r| r.plural == plural && r.group == group)
    }

    /// One stored object; `resource` is `configmaps` or `deployments.apps`
    /// (as kubectl spells it); use an empty namespace for cluster-scoped kinds.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let res = Self::resource(resource)?;
        self.store.get(res, namespace, name).map(|o| (*o).clone())
    }

    /// Changes one stored object in process, the way an update through the
    /// API does (the same checks, a new resourceVersion, one watch event),
    /// but without HTTP and without admission webhooks: for benchmarks that
    /// need a writer faster than the client they measure. Returns the new resourceVersion, or why not
    /// (unknown resource, no such object, a refused object).
    pub fn modify(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        change: impl Fn(&mut Value),
    ) -> Result<u64, String> {
        let res = Self::resource(resource).ok_or_else(|| format!("unknown resource {resource}"))?;
        loop {
            let cur = self
                .store
                .get(res, namespace, name)
                .ok_or_else(|| format!("{resource} {namespace}/{name} not found"))?;
            let cur_rv = store::rv_of(&cur);
            let mut desired = (*cur).clone();
            change(&mut desired);
            let new =
                objects::prepare_update(&resources::RESOURCES[res], namespace, name, &cur, desired)
                    .map_err(|e| e.message)?;
            match self.store.update(res, namespace, name, cur_rv, new) {
                Ok(stored) => return Ok(store::rv_of(&stored)),
                Err(store::StoreError::Changed) => continue,
                Err(e) => return Err(format!("{resource} {namespace}/{name}: {e}")),
            }
        }
    }

    /// Every stored object of a resource (all namespaces) in key order,
    /// with the resourceVersion of that snapshot.
    pub fn snapshot(&self, resource: &str) -> Option<(Vec<Value>, u64)> {
        let res = Self::resource(resource)?;
        let (items, rv) = self.store.list(res, None, None).ok()?;
        Some((items.into_iter().map(|(_, o)| (*o).clone()).collect(), rv))
    }

    /// A kubeconfig (YAML) pointing at this server: cluster, a user without
    /// credentials, a context using namespace `default`, set as current.
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: wasmwatch-test\n  cluster:\n    server: {url}\n\
             users:\n\
             - name: wasmwatch-test\n  user: {{}}\n\
             contexts:\n\
             - name: wasmwatch-test\n  context:\n    cluster: wasmwatch-test\n    user: wasmwatch-test\n    namespace: default\n\
             current-context: wasmwatch-test\n\
             preferences: {{}}\n",
            url = self.url()
        )
    }

    /// Write [`Self::kubeconfig_yaml`] to `path`.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        std::fs::write(path, self.kubeconfig_yaml()).map_err(|source| Error::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })
    }

    /// A `kube::Config` for this server (default namespace `default`).
    pub fn kube_config(&self) -> kube::Config {
        let mut c = kube::Config::new(self.url().parse().expect("valid URL"));
        c.default_namespace = "default".into();
        c
    }

    /// A `kube::Client` for this server. Must be called inside a tokio runtime.
    pub fn client(&self) -> Result<kube::Client, Error> {
        kube::Client::try_from(self.kube_config()).map_err(|e| Error::Client(e.to_string()))
    }

    /// Stop serving and wait until the listener is closed.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}
