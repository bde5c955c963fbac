//! [`KubeLookups`]: the plugins' read-only lookups answered from in-memory
//! caches fed by watches, never by an API call per lookup.
//!
//! Data flow: one `kube::runtime::watcher` per kind (Deployments,
//! StatefulSets, DaemonSets, CronJobs, Jobs, Argo Rollouts, Services,
//! EndpointSlices) × namespace (or one cluster-wide), with the watcher's
//! default backoff, feeds a [`Cache`] behind a `RwLock`. The [`Lookups`]
//! methods are synchronous (they run inside a wasm call on a blocking
//! thread) and only take the read lock.
//!
//! Custom resource kinds ([`CustomKind`]: Argo Rollouts by default) are
//! watched while the API server's discovery lists them: a follower per kind
//! asks `/apis/<group>/<version>` at start and every
//! [`DISCOVERY_INTERVAL`] after (at once when one of the kind's watches is
//! answered 404). A kind not served at start counts as listed for
//! [`KubeLookups::ready`]; one served later (its CRD installed) is watched
//! from then on; one no longer served (its CRD deleted) has its watches
//! stopped and its objects dropped from the cache, with one info log each
//! way and no warning per retry. Their objects are read as `metadata` and
//! `spec.template` only.
//!
//! The pod template is at `spec.template` (Deployment, StatefulSet,
//! DaemonSet, Job, Rollout) or `spec.jobTemplate.spec.template` (CronJob).
//!
//! The cache keeps only what the lookups return, in compact form: per
//! workload its labels, annotations, pod-template annotations and the
//! ConfigMaps/Secrets its pod template references with their uses (see
//! [`crate::references`]); an index of the references, and one of the
//! workloads carrying a named `reload` annotation (see
//! [`wasmwatch_core::lookups::reload_annotations`]), which
//! `workloads_referencing` returns beside the referencing ones when the
//! annotation names the object;
//! per Service its labels, annotations and ports; per EndpointSlice its ports
//! and its ready endpoints (address and Pod name). Whole objects are parsed
//! and dropped. The annotation `kubectl.kubernetes.io/last-applied-configuration`
//! (a copy of the whole object, often the largest thing in it) is not kept.
//!
//! [`KubeLookups::start_with`] passes a field selector to every watch: the
//! manifest's `watch.ignoreNamespaces` as `metadata.namespace!=...`, so the
//! API server leaves those namespaces' objects out. `watch.namespaceSelector`
//! does not narrow the caches: a namespace that comes into scope has its
//! workloads and Services cached already.
//!
//! A relist (after an error or a 410) applies the listed objects as they come
//! and, when the list is complete, removes the objects of that stream that
//! were not listed: between the two, a deleted object may still be answered.
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Debug;
use std::pin::pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{PodTemplateSpec, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;
use wasmwatch_core::ObjectKind;
use wasmwatch_core::action::{WorkloadKind, WorkloadRef};
use wasmwatch_core::lookups::{
    Endpoint, Lookups, ObjectRef, ObjectUse, ServiceInfo, ServicePort, UseVia, WorkloadInfo,
    reload_annotations, reload_value_names,
};

use crate::references::pod_spec_references;

/// Annotations not kept in the cache (nor returned by the lookups).
pub const DROPPED_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Watches feeding a [`Cache`]; the watch tasks stop when this is dropped.
pub struct KubeLookups {
    cache: Arc<RwLock<Cache>>,
    /// Streams whose initial list has not been applied yet.
    pending: watch::Receiver<usize>,
    tasks: Vec<JoinHandle<()>>,
}

impl Debug for KubeLookups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLookups")
            .field("pending", &*self.pending.borrow())
            .field("tasks", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl KubeLookups {
    /// Starts the watches: cluster-wide when `namespaces` is `None`, else one
    /// per kind and namespace. Must be called inside a tokio runtime.
    pub fn start(client: Client, namespaces: Option<Vec<String>>) -> Arc<KubeLookups> {
        KubeLookups::start_with(client, namespaces, None)
    }

    /// [`KubeLookups::start`], every watch with this field selector
    /// (`metadata.namespace!=a,...`: the namespaces the manifest ignores,
    /// whose objects are then neither fetched nor kept).
    pub fn start_with(
        client: Client,
        namespaces: Option<Vec<String>>,
        field_selector: Option<String>,
    ) -> Arc<KubeLookups> {
        KubeLookups::start_with_custom(
            client,
            namespaces,
            field_selector,
            vec![CustomKind::rollout()],
        )
    }

    /// [`KubeLookups::start_with`], watching these custom resource kinds
    /// (each while discovery lists it, read again every
    /// [`DISCOVERY_INTERVAL`]) instead of Argo Rollouts alone.
    pub fn start_with_custom(
        client: Client,
        namespaces: Option<Vec<String>>,
        field_selector: Option<String>,
        custom: Vec<CustomKind>,
    ) -> Arc<KubeLookups> {
        KubeLookups::start_following(
            client,
            namespaces,
            field_selector,
            custom,
            DISCOVERY_INTERVAL,
        )
    }

    /// [`KubeLookups::start_with_custom`], reading each custom kind's
    /// discovery again every `discovery_every` (and at once when one of its
    /// watches is answered 404): a kind served later is watched from then
    /// on, one no longer served is dropped from the cache.
    pub fn start_following(
        client: Client,
        namespaces: Option<Vec<String>>,
        field_selector: Option<String>,
        custom: Vec<CustomKind>,
        discovery_every: Duration,
    ) -> Arc<KubeLookups> {
        let scopes: Vec<Option<String>> = match namespaces {
            None => vec![None],
            Some(list) => {
                let unique: BTreeSet<String> = list.into_iter().collect();
                unique.into_iter().map(Some).collect()
            }
        };
        let mut cache = Cache::default();
        let custom: Vec<CustomType> = custom
            .into_iter()
            .map(|kind| {
                let rank = cache.register(kind.workload_kind());
                CustomType { kind, rank }
            })
            .collect();
        let cache = Arc::new(RwLock::new(cache));
        let (pending_tx, pending) = watch::channel(scopes.len() * (7 + custom.len()));
        let pending_tx = Arc::new(pending_tx);
        let mut tasks = Vec::new();
        for scope in &scopes {
            let ctx = StreamCtx {
                client: &client,
                scope,
                fields: field_selector.as_deref(),
                cache: &cache,
                listed: &pending_tx,
                gone: None,
            };
            tasks.push(ctx.spawn::<Deployment>(()));
            tasks.push(ctx.spawn::<StatefulSet>(()));
            tasks.push(ctx.spawn::<DaemonSet>(()));
            tasks.push(ctx.spawn::<CronJob>(()));
            tasks.push(ctx.spawn::<Job>(()));
            tasks.push(ctx.spawn::<Service>(()));
            tasks.push(ctx.spawn::<EndpointSlice>(()));
        }
        for dt in custom {
            let span = tracing::info_span!("lookups-discovery", kind = %dt.kind);
            let follower = Follower {
                client: client.clone(),
                dt,
                scopes: scopes.clone(),
                fields: field_selector.clone(),
                cache: cache.clone(),
                pending: pending_tx.clone(),
                every: discovery_every,
                gone: Arc::new(Notify::new()),
            };
            tasks.push(tokio::spawn(follower.run().instrument(span)));
        }
        Arc::new(KubeLookups {
            cache,
            pending,
            tasks,
        })
    }

    /// Resolves once every watch has applied its initial list.
    pub async fn ready(&self) {
        let mut pending = self.pending.clone();
        // Err only if every task is gone, which happens only after drop.
        let _ = pending.wait_for(|n| *n == 0).await;
    }

    /// Whether every watch has applied its initial list.
    pub fn is_ready(&self) -> bool {
        *self.pending.borrow() == 0
    }

    /// One workload as cached (for the restart executor).
    pub fn workload(&self, r: &WorkloadRef) -> Option<WorkloadInfo> {
        self.read().workload(r)
    }

    /// How many objects the cache holds.
    pub fn stats(&self) -> CacheStats {
        self.read().stats()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Cache> {
        self.cache.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for KubeLookups {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Lookups for KubeLookups {
    fn workloads_referencing(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> Vec<WorkloadInfo> {
        self.read().workloads_referencing(kind, namespace, name)
    }

    fn service(&self, namespace: &str, name: &str) -> Option<ServiceInfo> {
        self.read().service(namespace, name)
    }

    fn services_with_labels(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<ServiceInfo> {
        self.read().services_with_labels(namespace, labels)
    }

    fn ready_endpoints(&self, namespace: &str, service: &str) -> Vec<Endpoint> {
        self.read().ready_endpoints(namespace, service)
    }

    fn used_by_workload(&self, kind: ObjectKind, namespace: &str, name: &str) -> bool {
        self.read().used_by_workload(kind, namespace, name)
    }

    fn has_service(&self, namespace: &str, name: &str) -> bool {
        self.read()
            .namespaces
            .get(namespace)
            .is_some_and(|n| n.services.contains_key(name))
    }

    fn service_uid(&self, namespace: &str, name: &str) -> Option<String> {
        let cache = self.read();
        let entry = cache.namespaces.get(namespace)?.services.get(name)?;
        entry.uid.as_deref().map(str::to_string)
    }
}

struct StreamCtx<'a> {
    client: &'a Client,
    scope: &'a Option<String>,
    fields: Option<&'a str>,
    cache: &'a Arc<RwLock<Cache>>,
    /// Counts down once when the stream's first list is applied.
    listed: &'a Arc<watch::Sender<usize>>,
    /// Told when the stream is answered 404 (its kind may be gone).
    gone: Option<&'a Arc<Notify>>,
}

impl StreamCtx<'_> {
    fn spawn<K: Cached>(&self, dt: K::DynamicType) -> JoinHandle<()> {
        tokio::spawn(self.stream::<K>(dt))
    }

    /// The stream of kind `K` in this scope, not started.
    fn stream<K: Cached>(&self, dt: K::DynamicType) -> impl Future<Output = ()> + Send + use<K> {
        let api = K::api(self.client.clone(), self.scope.as_deref(), &dt);
        let span = tracing::info_span!(
            "lookups-watch",
            kind = %K::kind(&dt),
            namespace = self.scope.as_deref().unwrap_or("*")
        );
        let mut config = watcher::Config::default();
        if let Some(fields) = self.fields {
            config = config.fields(fields);
        }
        run_stream(
            api,
            config,
            StreamState::new(self.scope.clone()),
            self.cache.clone(),
            self.listed.clone(),
            self.gone.cloned(),
            dt,
        )
        .instrument(span)
    }
}

/// How often the discovery of a custom kind is read again while running: a
/// CRD installed later is watched, and one removed is dropped, within this
/// long (or at once, for a removal its watches are answered 404 for).
pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(30);

/// The first pause before discovery is read again after a failure; it
/// doubles up to a minute.
const DISCOVERY_RETRY: Duration = Duration::from_millis(500);

/// A custom kind's watches (one per scope), started while discovery lists
/// the kind and stopped, with the kind's objects dropped from the cache,
/// when it no longer does.
struct Follower {
    client: Client,
    dt: CustomType,
    scopes: Vec<Option<String>>,
    fields: Option<String>,
    cache: Arc<RwLock<Cache>>,
    /// The lookups' count of first lists not applied yet; this kind holds
    /// one per scope of it until its streams listed, or it is known not
    /// served.
    pending: Arc<watch::Sender<usize>>,
    every: Duration,
    gone: Arc<Notify>,
}

/// A custom kind's running streams.
struct Watching {
    task: JoinHandle<()>,
    /// Its streams whose first list has not been applied yet.
    unlisted: watch::Receiver<usize>,
}

impl Follower {
    async fn run(self) {
        let mut owed = self.scopes.len();
        let mut watching: Option<Watching> = None;
        let mut first = true;
        let mut retry = DISCOVERY_RETRY;
        loop {
            let mut wait = self.every;
            let mut failed = false;
            match served(&self.client, &self.dt.kind).await {
                Err(error) => {
                    tracing::warn!(%error, "discovery of {} failed; retrying", self.dt.kind);
                    (wait, failed) = (retry, true);
                    retry = (retry * 2).min(Duration::from_secs(60));
                }
                Ok(true) if watching.is_none() => {
                    if !first {
                        tracing::info!(
                            "the API server now serves {}; its workloads are looked up",
                            self.dt.kind
                        );
                    }
                    watching = Some(self.start());
                }
                Ok(true) => {}
                Ok(false) => {
                    if let Some(mut w) = watching.take() {
                        // Stopped before its objects go: an event it was
                        // applying must not put one back.
                        w.task.abort();
                        let _ = (&mut w.task).await;
                        drop(w);
                        let dropped = self
                            .cache
                            .write()
                            .unwrap_or_else(PoisonError::into_inner)
                            .drop_kind(self.dt.rank);
                        tracing::info!(
                            dropped,
                            "the API server no longer serves {}; its workloads are no longer looked up",
                            self.dt.kind
                        );
                    } else if first {
                        tracing::info!(
                            "the API server does not serve {}; its workloads are looked up once it does",
                            self.dt.kind
                        );
                    }
                    self.release(&mut owed);
                }
            }
            if !failed {
                retry = DISCOVERY_RETRY;
                first = false;
            }
            // Until the next look: meanwhile a first list done releases
            // readiness, and a 404 looks again at once (also while
            // discovery itself is failing and retried).
            let next = tokio::time::Instant::now() + wait;
            let mut streams_died = false;
            loop {
                let listed = async {
                    match watching.as_mut() {
                        Some(w) if owed > 0 => w.unlisted.wait_for(|n| *n == 0).await.is_ok(),
                        _ => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep_until(next) => break,
                    () = self.gone.notified() => break,
                    listed = listed => {
                        if !listed {
                            // The streams ended (a panic): start them
                            // again at the next look.
                            streams_died = true;
                            break;
                        }
                        self.release(&mut owed);
                    }
                }
            }
            if streams_died {
                tracing::warn!("the watches of {} ended; starting them again", self.dt.kind);
                watching = None;
            }
        }
    }

    /// Starts the kind's streams, one per scope.
    fn start(&self) -> Watching {
        let (listed, unlisted) = watch::channel(self.scopes.len());
        let listed = Arc::new(listed);
        let streams: Vec<_> = self
            .scopes
            .iter()
            .map(|scope| {
                StreamCtx {
                    client: &self.client,
                    scope,
                    fields: self.fields.as_deref(),
                    cache: &self.cache,
                    listed: &listed,
                    gone: Some(&self.gone),
                }
                .stream::<TemplatedObject>(self.dt.clone())
            })
            .collect();
        let task = tokio::spawn(
            async move {
                futures_util::future::join_all(streams).await;
            }
            .in_current_span(),
        );
        Watching { task, unlisted }
    }

    /// Gives back what this kind holds of the lookups' pending count.
    fn release(&self, owed: &mut usize) {
        let n = std::mem::take(owed);
        if n > 0 {
            self.pending.send_modify(|p| *p = p.saturating_sub(n));
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        // The follower is aborted with the lookups; its streams go with it.
        self.task.abort();
    }
}

/// Whether discovery lists `kind`'s resource (a 404 for its group/version
/// is `false`).
async fn served(client: &Client, kind: &CustomKind) -> Result<bool, kube::Error> {
    let group_version = format!("{}/{}", kind.group, kind.version);
    match client.list_api_group_resources(&group_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == kind.plural)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error),
    }
}

/// Whether a watch failed because its resource is not served (404).
fn not_found(error: &watcher::Error) -> bool {
    let api = match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => match e {
            kube::Error::Api(status) => status.code,
            _ => return false,
        },
        watcher::Error::WatchError(status) => status.code,
        _ => return false,
    };
    api == 404
}

/// Applies one watch stream to the cache, forever (errors are logged and
/// retried with the watcher's default backoff; a 404 is told to `gone`, if
/// any, instead of logged).
async fn run_stream<K: Cached>(
    api: Api<K>,
    config: watcher::Config,
    mut state: StreamState,
    cache: Arc<RwLock<Cache>>,
    listed: Arc<watch::Sender<usize>>,
    gone: Option<Arc<Notify>>,
    dt: K::DynamicType,
) {
    let mut stream = pin!(watcher(api, config).default_backoff());
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(event) => event,
            Err(error) => {
                match &gone {
                    Some(gone) if not_found(&error) => {
                        tracing::debug!(%error, "lookups watch answered 404");
                        gone.notify_one();
                    }
                    _ => tracing::warn!(%error, "lookups watch failed; retrying with backoff"),
                }
                continue;
            }
        };
        let first_list_done = {
            let mut cache = cache.write().unwrap_or_else(PoisonError::into_inner);
            state.handle(event, &mut cache, &dt)
        };
        if first_list_done {
            listed.send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}

/// What one stream needs to apply its events: which namespace it covers
/// and, during a (re)list, which objects were listed.
#[derive(Debug)]
struct StreamState {
    scope: Option<String>,
    listed: HashSet<(String, String)>,
    listed_once: bool,
}

impl StreamState {
    fn new(scope: Option<String>) -> Self {
        StreamState {
            scope,
            listed: HashSet::new(),
            listed_once: false,
        }
    }

    /// Applies one event; true when it completed the stream's first list.
    fn handle<K: Cached>(
        &mut self,
        event: Event<K>,
        cache: &mut Cache,
        dt: &K::DynamicType,
    ) -> bool {
        match event {
            Event::Init => self.listed.clear(),
            Event::InitApply(obj) => {
                if let Some(key) = key_of(obj.meta()) {
                    self.listed.insert(key);
                }
                obj.apply_to(cache, dt);
            }
            Event::InitDone => {
                // Whatever this stream had but the list did not have is gone.
                let mut removed = 0usize;
                for (ns, name) in cache.names::<K>(self.scope.as_deref(), dt) {
                    if !self.listed.contains(&(ns.clone(), name.clone())) {
                        K::delete_from(cache, dt, &ns, &name);
                        removed += 1;
                    }
                }
                self.listed = HashSet::new();
                tracing::debug!(removed, "lookups list applied");
                let first = !self.listed_once;
                self.listed_once = true;
                return first;
            }
            Event::Apply(obj) => obj.apply_to(cache, dt),
            Event::Delete(obj) => {
                if let Some((ns, name)) = key_of(obj.meta()) {
                    K::delete_from(cache, dt, &ns, &name);
                }
            }
        }
        false
    }
}

fn watcher<K: Cached>(
    api: Api<K>,
    config: watcher::Config,
) -> impl futures_util::Stream<Item = watcher::Result<Event<K>>> + Send {
    watcher::watcher(api, config)
}

fn key_of(meta: &ObjectMeta) -> Option<(String, String)> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

/// Counts of cached objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub namespaces: usize,
    pub workloads: usize,
    pub services: usize,
    pub endpoint_slices: usize,
}

/// A kind the cache is fed with. `DynamicType` is `()` for the kinds of
/// k8s-openapi; custom kinds are read through one type, with the kind as
/// its dynamic type.
pub trait Cached:
    Resource<DynamicType: Clone + Send + Sync + 'static>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The API of this kind in `namespace`, or in all namespaces.
    fn api(client: Client, namespace: Option<&str>, dt: &Self::DynamicType) -> Api<Self>;
    /// Stores (or replaces) the compact form of this object.
    fn apply_to(&self, cache: &mut Cache, dt: &Self::DynamicType);
    /// Forgets the object of this kind with this namespace and name.
    fn delete_from(cache: &mut Cache, dt: &Self::DynamicType, namespace: &str, name: &str);
    /// The names of the objects of this kind in one namespace.
    fn names_in(ns: &Namespace, dt: &Self::DynamicType) -> Vec<String>;
}

/// A custom resource kind with a pod template at `spec.template`, watched
/// when the API server serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomKind {
    pub group: String,
    pub version: String,
    pub kind: String,
    /// The resource's plural name, as in its URL path (`rollouts`).
    pub plural: String,
}

impl CustomKind {
    /// Argo Rollouts' `argoproj.io/v1alpha1` Rollout.
    pub fn rollout() -> CustomKind {
        CustomKind {
            group: "argoproj.io".into(),
            version: "v1alpha1".into(),
            kind: "Rollout".into(),
            plural: "rollouts".into(),
        }
    }

    fn workload_kind(&self) -> WorkloadKind {
        WorkloadKind::from_gvk(&self.group, &self.version, &self.kind)
    }
}

impl std::fmt::Display for CustomKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}/{}", self.plural, self.group, self.version)
    }
}

/// The dynamic type of [`TemplatedObject`]: the kind and its index in the
/// cache.
#[derive(Debug, Clone)]
pub struct CustomType {
    kind: CustomKind,
    rank: u8,
}

/// An object of a custom kind, as much as the cache reads of it: the rest
/// is skipped while parsing.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct TemplatedObject {
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<TemplatedSpec>,
}

#[derive(Debug, Clone, serde::Deserialize)]
struct TemplatedSpec {
    #[serde(default)]
    template: Option<PodTemplateSpec>,
}

impl Resource for TemplatedObject {
    type DynamicType = CustomType;
    // Namespaced (the cache keeps namespaced workloads only), but read
    // through the dynamic API's constructors.
    type Scope = kube::core::DynamicResourceScope;

    fn kind(dt: &CustomType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.kind.kind)
    }

    fn group(dt: &CustomType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.kind.group)
    }

    fn version(dt: &CustomType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.kind.version)
    }

    fn plural(dt: &CustomType) -> Cow<'_, str> {
        Cow::Borrowed(&dt.kind.plural)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Cached for TemplatedObject {
    fn api(client: Client, namespace: Option<&str>, dt: &CustomType) -> Api<Self> {
        match namespace {
            None => Api::all_with(client, dt),
            Some(ns) => Api::namespaced_with(client, ns, dt),
        }
    }

    fn apply_to(&self, cache: &mut Cache, dt: &CustomType) {
        let template = self.spec.as_ref().and_then(|s| s.template.as_ref());
        cache.apply_workload(dt.rank, &self.metadata, template);
    }

    fn delete_from(cache: &mut Cache, dt: &CustomType, namespace: &str, name: &str) {
        cache.delete_workload(dt.rank, namespace, name);
    }

    fn names_in(ns: &Namespace, dt: &CustomType) -> Vec<String> {
        ns.workload_names(dt.rank)
    }
}

/// Sorted key-value pairs; an empty one does not allocate.
type Pairs = Box<[(Box<str>, Box<str>)]>;

fn pairs(map: Option<&BTreeMap<String, String>>, drop_keys: &[&str]) -> Pairs {
    map.into_iter()
        .flatten()
        .filter(|(k, _)| !drop_keys.contains(&k.as_str()))
        .map(|(k, v)| (Box::from(k.as_str()), Box::from(v.as_str())))
        .collect()
}

fn to_map(pairs: &Pairs) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The cache's index (rank) of each kind of k8s-openapi it watches; custom
/// kinds come after these ([`Cache::register`]).
const DEPLOYMENT: u8 = 0;
const STATEFULSET: u8 = 1;
const DAEMONSET: u8 = 2;
const CRONJOB: u8 = 3;
const JOB: u8 = 4;

fn builtin_kinds() -> Vec<WorkloadKind> {
    vec![
        WorkloadKind::Deployment,
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
        WorkloadKind::from_gvk("batch", "v1", "CronJob"),
        WorkloadKind::from_gvk("batch", "v1", "Job"),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct WorkloadEntry {
    labels: Pairs,
    annotations: Pairs,
    template_annotations: Pairs,
    references: Box<[CachedRef]>,
}

/// An [`ObjectRef`], compact.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CachedRef {
    kind: ObjectKind,
    name: Box<str>,
    uses: Box<[(UseVia, Option<Box<str>>)]>,
}

impl WorkloadEntry {
    fn references(&self, kind: ObjectKind, name: &str) -> bool {
        self.references
            .iter()
            .any(|r| r.kind == kind && *r.name == *name)
    }

    /// The object kinds a reload annotation of this workload (or its
    /// template) names objects of.
    fn named_kinds(&self) -> impl Iterator<Item = ObjectKind> + '_ {
        [
            ObjectKind::ConfigMap,
            ObjectKind::Secret,
            crate::references::secret_provider_class(),
        ]
        .into_iter()
        .filter(|kind| self.reload_values(*kind).any(|v| !v.trim().is_empty()))
    }

    fn reload_values(&self, kind: ObjectKind) -> impl Iterator<Item = &str> + '_ {
        let keys = reload_annotations(kind);
        [&self.annotations, &self.template_annotations]
            .into_iter()
            .flat_map(|pairs| pairs.iter())
            .filter(move |(k, _)| keys.contains(&&**k))
            .map(|(_, v)| &**v)
    }

    /// Whether a reload annotation names object `kind`/`name`.
    fn names_for_reload(&self, kind: ObjectKind, name: &str) -> bool {
        self.reload_values(kind)
            .any(|v| reload_value_names(v, name))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ServiceEntry {
    /// For Events about the Service (`kubectl describe` finds them by it).
    uid: Option<Box<str>>,
    labels: Pairs,
    annotations: Pairs,
    ports: Box<[ServicePort]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct SliceEntry {
    service: Box<str>,
    ports: Box<[ServicePort]>,
    ready: Box<[ReadyEndpoint]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ReadyEndpoint {
    address: Box<str>,
    pod: Option<Box<str>>,
}

/// The cached objects of one namespace.
#[derive(Debug, Default)]
pub struct Namespace {
    /// Per workload kind (by rank: [`Cache::register`]), by name; grown as
    /// kinds are seen.
    workloads: Vec<BTreeMap<Box<str>, WorkloadEntry>>,
    /// (referenced kind, referenced name, workload kind rank, workload name).
    referencing: BTreeSet<(ObjectKind, Box<str>, u8, Box<str>)>,
    /// (object kind, workload kind rank, workload name) of the workloads
    /// whose reload annotation for that kind of object is not empty.
    named: BTreeSet<(ObjectKind, u8, Box<str>)>,
    services: BTreeMap<Box<str>, ServiceEntry>,
    slices: BTreeMap<Box<str>, SliceEntry>,
    /// (service name, slice name).
    slices_by_service: BTreeSet<(Box<str>, Box<str>)>,
}

impl Namespace {
    fn workload_names(&self, rank: u8) -> Vec<String> {
        self.workloads
            .get(rank as usize)
            .into_iter()
            .flat_map(|m| m.keys().map(|k| k.to_string()))
            .collect()
    }

    fn workloads_mut(&mut self, rank: u8) -> &mut BTreeMap<Box<str>, WorkloadEntry> {
        let r = rank as usize;
        if self.workloads.len() <= r {
            self.workloads.resize_with(r + 1, BTreeMap::new);
        }
        &mut self.workloads[r]
    }

    fn workload(&self, rank: u8, name: &str) -> Option<&WorkloadEntry> {
        self.workloads.get(rank as usize)?.get(name)
    }

    /// Removes workload `name` (of rank `r`, as `old`) from the indexes.
    fn unindex(&mut self, r: u8, name: &str, old: &WorkloadEntry) {
        for cached in old.references.iter() {
            self.referencing
                .remove(&(cached.kind, cached.name.clone(), r, Box::from(name)));
        }
        for kind in old.named_kinds() {
            self.named.remove(&(kind, r, Box::from(name)));
        }
    }

    fn is_empty(&self) -> bool {
        self.workloads.iter().all(BTreeMap::is_empty)
            && self.services.is_empty()
            && self.slices.is_empty()
    }
}

/// The lookups' state: no I/O; fed by [`Cached::apply_to`] and
/// [`Cached::delete_from`] (the watches, or tests directly).
#[derive(Debug)]
pub struct Cache {
    namespaces: HashMap<Box<str>, Namespace>,
    /// The workload kinds, by rank.
    kinds: Vec<WorkloadKind>,
}

impl Default for Cache {
    fn default() -> Self {
        Cache {
            namespaces: HashMap::new(),
            kinds: builtin_kinds(),
        }
    }
}

impl Cache {
    /// Stores (or replaces) the compact form of `obj`.
    pub fn apply<K: Cached<DynamicType = ()>>(&mut self, obj: &K) {
        obj.apply_to(self, &());
    }

    /// Forgets an object.
    pub fn delete<K: Cached<DynamicType = ()>>(&mut self, namespace: &str, name: &str) {
        K::delete_from(self, &(), namespace, name);
    }

    /// The rank of a workload kind, added if new.
    fn register(&mut self, kind: WorkloadKind) -> u8 {
        match self.kinds.iter().position(|k| *k == kind) {
            Some(r) => r as u8,
            None => {
                self.kinds.push(kind);
                u8::try_from(self.kinds.len() - 1).expect("fewer than 256 workload kinds")
            }
        }
    }

    fn rank(&self, kind: &WorkloadKind) -> Option<u8> {
        self.kinds.iter().position(|k| k == kind).map(|r| r as u8)
    }

    fn ns_mut(&mut self, ns: &str) -> &mut Namespace {
        if !self.namespaces.contains_key(ns) {
            self.namespaces.insert(Box::from(ns), Namespace::default());
        }
        self.namespaces.get_mut(ns).expect("just inserted")
    }

    /// Runs `f` on an existing namespace and drops the namespace if it ends up empty.
    fn with_existing_ns(&mut self, ns: &str, f: impl FnOnce(&mut Namespace)) {
        if let Some(n) = self.namespaces.get_mut(ns) {
            f(n);
            if n.is_empty() {
                self.namespaces.remove(ns);
            }
        }
    }

    /// (namespace, name) of every object of kind `K` in `scope` (a namespace,
    /// or all when `None`).
    fn names<K: Cached>(&self, scope: Option<&str>, dt: &K::DynamicType) -> Vec<(String, String)> {
        self.namespaces
            .iter()
            .filter(|(ns, _)| scope.is_none_or(|s| s == &***ns))
            .flat_map(|(ns, n)| {
                K::names_in(n, dt)
                    .into_iter()
                    .map(move |name| (ns.to_string(), name))
            })
            .collect()
    }

    pub fn stats(&self) -> CacheStats {
        let mut stats = CacheStats {
            namespaces: self.namespaces.len(),
            ..CacheStats::default()
        };
        for n in self.namespaces.values() {
            stats.workloads += n.workloads.iter().map(BTreeMap::len).sum::<usize>();
            stats.services += n.services.len();
            stats.endpoint_slices += n.slices.len();
        }
        stats
    }

    fn apply_workload(&mut self, r: u8, meta: &ObjectMeta, template: Option<&PodTemplateSpec>) {
        let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
            return;
        };
        let references = template
            .and_then(|t| t.spec.as_ref())
            .map(pod_spec_references)
            .unwrap_or_default()
            .into_iter()
            .map(|r| CachedRef {
                kind: r.kind,
                name: Box::from(r.name),
                uses: r
                    .uses
                    .into_iter()
                    .map(|u| (u.via, u.key.map(Box::from)))
                    .collect(),
            })
            .collect();
        let entry = WorkloadEntry {
            labels: pairs(meta.labels.as_ref(), &[]),
            annotations: pairs(meta.annotations.as_ref(), DROPPED_ANNOTATIONS),
            template_annotations: pairs(
                template
                    .and_then(|t| t.metadata.as_ref())
                    .and_then(|m| m.annotations.as_ref()),
                DROPPED_ANNOTATIONS,
            ),
            references,
        };
        let n = self.ns_mut(ns);
        let old = n.workloads_mut(r).remove(name.as_str());
        if old.as_ref() == Some(&entry) {
            n.workloads_mut(r).insert(Box::from(name.as_str()), entry);
            return;
        }
        if let Some(old) = old {
            n.unindex(r, name, &old);
        }
        for cached in entry.references.iter() {
            n.referencing.insert((
                cached.kind,
                cached.name.clone(),
                r,
                Box::from(name.as_str()),
            ));
        }
        for kind in entry.named_kinds() {
            n.named.insert((kind, r, Box::from(name.as_str())));
        }
        n.workloads_mut(r).insert(Box::from(name.as_str()), entry);
    }

    /// Forgets every workload of rank `r` (a kind no longer served); how
    /// many there were.
    fn drop_kind(&mut self, r: u8) -> usize {
        let mut dropped = 0;
        self.namespaces.retain(|_, n| {
            if let Some(map) = n.workloads.get_mut(r as usize) {
                for (name, old) in std::mem::take(map) {
                    n.unindex(r, &name, &old);
                    dropped += 1;
                }
            }
            !n.is_empty()
        });
        dropped
    }

    fn delete_workload(&mut self, r: u8, ns: &str, name: &str) {
        self.with_existing_ns(ns, |n| {
            let old = n.workloads.get_mut(r as usize).and_then(|m| m.remove(name));
            if let Some(old) = old {
                n.unindex(r, name, &old);
            }
        });
    }

    fn apply_service(&mut self, svc: &Service) {
        let meta = &svc.metadata;
        let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
            return;
        };
        let ports = svc
            .spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .filter_map(|p| {
                Some(ServicePort {
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    port: u16::try_from(p.port).ok()?,
                })
            })
            .collect();
        let entry = ServiceEntry {
            uid: meta.uid.as_deref().map(Box::from),
            labels: pairs(meta.labels.as_ref(), &[]),
            annotations: pairs(meta.annotations.as_ref(), DROPPED_ANNOTATIONS),
            ports,
        };
        self.ns_mut(ns)
            .services
            .insert(Box::from(name.as_str()), entry);
    }

    fn apply_slice(&mut self, slice: &EndpointSlice) {
        let meta = &slice.metadata;
        let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
            return;
        };
        let service = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .filter(|s| !s.is_empty());
        let Some(service) = service else {
            // Not (or no longer) a Service's slice.
            self.delete_slice(ns, name);
            return;
        };
        let ports = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(ServicePort {
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    port: u16::try_from(p.port?).ok()?,
                })
            })
            .collect();
        let ready = slice
            .endpoints
            .iter()
            .flatten()
            // nil `ready` means ready (API docs: "should be interpreted as true").
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
            .filter_map(|e| {
                let address = e.addresses.first()?;
                let pod = e
                    .target_ref
                    .as_ref()
                    .filter(|t| t.kind.as_deref() == Some("Pod"))
                    .and_then(|t| t.name.as_deref())
                    .map(Box::from);
                Some(ReadyEndpoint {
                    address: Box::from(address.as_str()),
                    pod,
                })
            })
            .collect();
        let entry = SliceEntry {
            service: Box::from(service.as_str()),
            ports,
            ready,
        };
        let n = self.ns_mut(ns);
        if let Some(old) = n.slices.get(name.as_str()) {
            if old == &entry {
                return;
            }
            let key = (old.service.clone(), Box::from(name.as_str()));
            n.slices_by_service.remove(&key);
        }
        n.slices_by_service
            .insert((entry.service.clone(), Box::from(name.as_str())));
        n.slices.insert(Box::from(name.as_str()), entry);
    }

    fn delete_slice(&mut self, ns: &str, name: &str) {
        self.with_existing_ns(ns, |n| {
            if let Some(old) = n.slices.remove(name) {
                n.slices_by_service.remove(&(old.service, Box::from(name)));
            }
        });
    }

    /// One workload as cached.
    pub fn workload(&self, r: &WorkloadRef) -> Option<WorkloadInfo> {
        let n = self.namespaces.get(r.namespace.as_str())?;
        let entry = n.workload(self.rank(&r.kind)?, r.name.as_str())?;
        Some(workload_info(r.clone(), entry))
    }

    /// The workloads whose pod templates reference object `kind`/`name`
    /// (by kind, then name), then those a reload annotation names it in
    /// without a reference (likewise ordered).
    pub fn workloads_referencing(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> Vec<WorkloadInfo> {
        let Some(n) = self.namespaces.get(namespace) else {
            return Vec::new();
        };
        let info = |r: u8, wname: &str, entry: &WorkloadEntry| {
            let workload = WorkloadRef {
                kind: self.kinds[r as usize].clone(),
                namespace: namespace.to_string(),
                name: wname.to_string(),
            };
            workload_info(workload, entry)
        };
        let from = (kind, Box::from(name), 0u8, Box::from(""));
        let referencing = n
            .referencing
            .range(from..)
            .take_while(|(k, obj, _, _)| *k == kind && &**obj == name)
            .filter_map(|(_, _, r, wname)| Some(info(*r, wname, n.workload(*r, wname)?)));
        let named = n
            .named
            .range((kind, 0u8, Box::from(""))..)
            .take_while(|(k, _, _)| *k == kind)
            .filter_map(|(_, r, wname)| {
                let entry = n.workload(*r, wname)?;
                let only_named =
                    !entry.references(kind, name) && entry.names_for_reload(kind, name);
                only_named.then(|| info(*r, wname, entry))
            });
        referencing.chain(named).collect()
    }

    /// Whether [`Cache::workloads_referencing`] would find any, without
    /// copying what it finds.
    pub fn used_by_workload(&self, kind: ObjectKind, namespace: &str, name: &str) -> bool {
        let Some(n) = self.namespaces.get(namespace) else {
            return false;
        };
        let from = (kind, Box::from(name), 0u8, Box::from(""));
        let referenced = n
            .referencing
            .range(from..)
            .take_while(|(k, obj, _, _)| *k == kind && &**obj == name)
            .any(|(_, _, r, wname)| n.workload(*r, wname).is_some());
        referenced
            || n.named
                .range((kind, 0u8, Box::from(""))..)
                .take_while(|(k, _, _)| *k == kind)
                .any(|(_, r, wname)| {
                    n.workload(*r, wname)
                        .is_some_and(|entry| entry.names_for_reload(kind, name))
                })
    }

    pub fn service(&self, namespace: &str, name: &str) -> Option<ServiceInfo> {
        let n = self.namespaces.get(namespace)?;
        let entry = n.services.get(name)?;
        Some(service_info(namespace, name, entry))
    }

    pub fn services_with_labels(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<ServiceInfo> {
        let Some(n) = self.namespaces.get(namespace) else {
            return Vec::new();
        };
        n.services
            .iter()
            .filter(|(_, s)| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(sk, sv)| **sk == **k && **sv == **v))
            })
            .map(|(name, s)| service_info(namespace, name, s))
            .collect()
    }

    /// The ready endpoints of a Service's EndpointSlices, without duplicates
    /// (an endpoint may briefly be in two slices).
    pub fn ready_endpoints(&self, namespace: &str, service: &str) -> Vec<Endpoint> {
        // EndpointSlices of a deleted Service linger until garbage
        // collected: no Service, no endpoints.
        let Some(n) = self
            .namespaces
            .get(namespace)
            .filter(|n| n.services.contains_key(service))
        else {
            return Vec::new();
        };
        let mut ready_endpoints: Vec<Endpoint> = Vec::new();
        let from = (Box::from(service), Box::from(""));
        let slices = n
            .slices_by_service
            .range(from..)
            .take_while(|(svc, _)| &**svc == service)
            .filter_map(|(_, slice)| n.slices.get(slice));
        for slice in slices {
            for ready in slice.ready.iter() {
                let endpoint = Endpoint {
                    address: ready.address.to_string(),
                    pod: ready.pod.as_deref().map(str::to_string),
                    ports: slice.ports.to_vec(),
                };
                if !ready_endpoints.contains(&endpoint) {
                    ready_endpoints.push(endpoint);
                }
            }
        }
        ready_endpoints
    }
}

fn workload_info(workload: WorkloadRef, e: &WorkloadEntry) -> WorkloadInfo {
    WorkloadInfo {
        workload,
        labels: to_map(&e.labels),
        annotations: to_map(&e.annotations),
        template_annotations: to_map(&e.template_annotations),
        references: e
            .references
            .iter()
            .map(|r| ObjectRef {
                kind: r.kind,
                name: r.name.to_string(),
                uses: r
                    .uses
                    .iter()
                    .map(|(via, key)| ObjectUse {
                        via: *via,
                        key: key.as_deref().map(str::to_string),
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn service_info(namespace: &str, name: &str, s: &ServiceEntry) -> ServiceInfo {
    ServiceInfo {
        namespace: namespace.to_string(),
        name: name.to_string(),
        labels: to_map(&s.labels),
        annotations: to_map(&s.annotations),
        ports: s.ports.to_vec(),
    }
}

fn typed_api<K>(client: Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
{
    match namespace {
        None => Api::all(client),
        Some(ns) => Api::namespaced(client, ns),
    }
}

/// `Cached` for a kind of k8s-openapi: its rank and where its pod
/// template is (a closure from the object to `Option<&PodTemplateSpec>`).
macro_rules! workload_kind {
    ($ty:ty, $rank:expr, $template:expr) => {
        impl Cached for $ty {
            fn api(client: Client, namespace: Option<&str>, _: &()) -> Api<Self> {
                typed_api(client, namespace)
            }

            fn apply_to(&self, cache: &mut Cache, _: &()) {
                let template: fn(&$ty) -> Option<&PodTemplateSpec> = $template;
                cache.apply_workload($rank, &self.metadata, template(self));
            }

            fn delete_from(cache: &mut Cache, _: &(), namespace: &str, name: &str) {
                cache.delete_workload($rank, namespace, name);
            }

            fn names_in(ns: &Namespace, _: &()) -> Vec<String> {
                ns.workload_names($rank)
            }
        }
    };
}

workload_kind!(Deployment, DEPLOYMENT, |d| Some(&d.spec.template));
workload_kind!(StatefulSet, STATEFULSET, |s| Some(&s.spec.template));
workload_kind!(DaemonSet, DAEMONSET, |d| Some(&d.spec.template));
workload_kind!(Job, JOB, |j| j.spec.as_ref().map(|s| &s.template));
workload_kind!(CronJob, CRONJOB, |c| c
    .spec
    .job_template
    .spec
    .as_ref()
    .map(|s| &s.template));

impl Cached for Service {
    fn api(client: Client, namespace: Option<&str>, _: &()) -> Api<Self> {
        typed_api(client, namespace)
    }

    fn apply_to(&self, cache: &mut Cache, _: &()) {
        cache.apply_service(self);
    }

    fn delete_from(cache: &mut Cache, _: &(), namespace: &str, name: &str) {
        cache.with_existing_ns(namespace, |n| {
            n.services.remove(name);
        });
    }

    fn names_in(ns: &Namespace, _: &()) -> Vec<String> {
        ns.services.keys().map(|k| k.to_string()).collect()
    }
}

impl Cached for EndpointSlice {
    fn api(client: Client, namespace: Option<&str>, _: &()) -> Api<Self> {
        typed_api(client, namespace)
    }

    fn apply_to(&self, cache: &mut Cache, _: &()) {
        cache.apply_slice(self);
    }

    fn delete_from(cache: &mut Cache, _: &(), namespace: &str, name: &str) {
        cache.delete_slice(namespace, name);
    }

    fn names_in(ns: &Namespace, _: &()) -> Vec<String> {
        ns.slices.keys().map(|k| k.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj<K: DeserializeOwned>(v: serde_json::Value) -> K {
        serde_json::from_value(v).unwrap()
    }

    fn deployment(name: &str, cm: &str) -> Deployment {
        obj(serde_json::json!({
            "metadata": {"namespace": "ns", "name": name, "labels": {"app": name},
                "annotations": {"reloader.stakater.com/auto": "true",
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
            "spec": {"selector": {}, "template": {
                "metadata": {"annotations": {"t": "1"}},
                "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": cm}}]}]}
            }}
        }))
    }

    fn slice(name: &str, svc: Option<&str>, endpoints: serde_json::Value) -> EndpointSlice {
        obj(serde_json::json!({
            "metadata": {"namespace": "ns", "name": name,
                "labels": svc.map(|s| serde_json::json!({SERVICE_NAME_LABEL: s})).unwrap_or_default()},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": endpoints
        }))
    }

    fn names(ws: &[WorkloadInfo]) -> Vec<&str> {
        ws.iter().map(|w| w.workload.name.as_str()).collect()
    }

    #[test]
    fn the_reference_index_follows_updates_and_deletes() {
        let mut cache = Cache::default();
        cache.apply(&deployment("a", "one"));
        cache.apply(&deployment("b", "one"));
        let found = cache.workloads_referencing(ObjectKind::ConfigMap, "ns", "one");
        assert_eq!(names(&found), ["a", "b"]);
        let a = &found[0];
        assert_eq!(a.annotations.len(), 1, "last-applied is dropped");
        assert_eq!(a.template_annotations["t"], "1");
        assert_eq!(a.labels["app"], "a");

        cache.apply(&deployment("a", "two"));
        let one = cache.workloads_referencing(ObjectKind::ConfigMap, "ns", "one");
        assert_eq!(names(&one), ["b"]);
        let two = cache.workloads_referencing(ObjectKind::ConfigMap, "ns", "two");
        assert_eq!(names(&two), ["a"]);
        assert!(
            cache
                .workloads_referencing(ObjectKind::Secret, "ns", "one")
                .is_empty()
        );
        assert!(
            cache
                .workloads_referencing(ObjectKind::ConfigMap, "other", "one")
                .is_empty()
        );
        // A prefix of a name is another name.
        assert!(
            cache
                .workloads_referencing(ObjectKind::ConfigMap, "ns", "on")
                .is_empty()
        );

        cache.delete::<Deployment>("ns", "b");
        assert!(
            cache
                .workloads_referencing(ObjectKind::ConfigMap, "ns", "one")
                .is_empty()
        );
        cache.delete::<Deployment>("ns", "a");
        assert_eq!(
            cache.stats(),
            CacheStats::default(),
            "empty namespaces are dropped"
        );
    }

    #[test]
    fn slices_merge_skip_not_ready_endpoints_and_follow_their_label() {
        let mut cache = Cache::default();
        cache.apply::<Service>(&obj(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "web"},
            "spec": {"ports": [{"name": "http", "port": 80}]}
        })));
        cache.apply(&slice("web-1", Some("web"), serde_json::json!([
            {"addresses": ["10.0.0.1"], "targetRef": {"kind": "Pod", "name": "p1"}},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
            {"addresses": ["10.0.0.3"], "conditions": {"ready": true}, "targetRef": {"kind": "Node", "name": "n"}},
            {"addresses": []}
        ])));
        cache.apply(&slice(
            "web-2",
            Some("web"),
            serde_json::json!([
                {"addresses": ["10.0.0.4", "10.0.0.5"], "conditions": {}}
            ]),
        ));
        cache.apply(&slice(
            "webx-1",
            Some("webx"),
            serde_json::json!([{"addresses": ["10.9.9.9"]}]),
        ));
        let svc = cache.service("ns", "web").unwrap();
        let ready = cache.ready_endpoints("ns", "web");
        let eps: Vec<(&str, Option<&str>)> = ready
            .iter()
            .map(|e| (e.address.as_str(), e.pod.as_deref()))
            .collect();
        assert_eq!(
            eps,
            [
                ("10.0.0.1", Some("p1")),
                ("10.0.0.3", None),
                ("10.0.0.4", None)
            ]
        );
        assert_eq!(
            svc.ports,
            [ServicePort {
                name: Some("http".into()),
                port: 80
            }]
        );
        assert_eq!(
            ready[0].ports,
            [ServicePort {
                name: Some("http".into()),
                port: 8080
            }]
        );

        // The label moves the slice to another service.
        cache.apply(&slice(
            "web-2",
            Some("webx"),
            serde_json::json!([{"addresses": ["10.0.0.4"]}]),
        ));
        assert_eq!(cache.ready_endpoints("ns", "web").len(), 2);
        // Losing the label removes it.
        cache.apply(&slice(
            "web-1",
            None,
            serde_json::json!([{"addresses": ["10.0.0.1"]}]),
        ));
        assert!(cache.ready_endpoints("ns", "web").is_empty());
        assert!(cache.ready_endpoints("elsewhere", "web").is_empty());
        // The Service goes; its (labelled) slice lingers, its pods do not count.
        cache.apply(&slice(
            "web-1",
            Some("web"),
            serde_json::json!([{"addresses": ["10.0.0.1"]}]),
        ));
        assert_eq!(cache.ready_endpoints("ns", "web").len(), 1);
        cache.delete::<Service>("ns", "web");
        assert!(cache.service("ns", "web").is_none());
        assert!(cache.ready_endpoints("ns", "web").is_empty());
    }

    #[test]
    fn a_relist_removes_what_it_did_not_list_within_its_scope() {
        let mut cache = Cache::default();
        let other: Deployment = obj(serde_json::json!({
            "metadata": {"namespace": "elsewhere", "name": "x"},
            "spec": {"selector": {}, "template": {}}
        }));
        cache.apply(&other);
        let mut state = StreamState::new(Some("ns".into()));
        assert!(!state.handle::<Deployment>(Event::Init, &mut cache, &()));
        assert!(!state.handle(Event::InitApply(deployment("a", "one")), &mut cache, &()));
        assert!(!state.handle(Event::InitApply(deployment("b", "one")), &mut cache, &()));
        assert!(
            state.handle::<Deployment>(Event::InitDone, &mut cache, &()),
            "first list done"
        );
        assert!(!state.handle(Event::Apply(deployment("c", "one")), &mut cache, &()));
        assert_eq!(cache.stats().workloads, 4);

        // After an error the watcher lists again: b was deleted meanwhile.
        assert!(!state.handle::<Deployment>(Event::Init, &mut cache, &()));
        assert!(!state.handle(Event::InitApply(deployment("a", "one")), &mut cache, &()));
        assert!(!state.handle(Event::InitApply(deployment("c", "one")), &mut cache, &()));
        assert!(
            !state.handle::<Deployment>(Event::InitDone, &mut cache, &()),
            "not the first"
        );
        let found = cache.workloads_referencing(ObjectKind::ConfigMap, "ns", "one");
        assert_eq!(names(&found), ["a", "c"]);
        assert!(cache.service("ns", "a").is_none(), "kinds are apart");
        let kept = WorkloadRef {
            kind: WorkloadKind::Deployment,
            namespace: "elsewhere".into(),
            name: "x".into(),
        };
        assert!(
            cache.workload(&kept).is_some(),
            "another stream's namespace is kept"
        );

        assert!(!state.handle(Event::Delete(deployment("a", "one")), &mut cache, &()));
        assert_eq!(cache.stats().workloads, 2);
    }

    #[test]
    fn named_reload_annotations_select_workloads_without_references_and_follow_updates() {
        let mut cache = Cache::default();
        let named = |name: &str, ann: serde_json::Value, tmpl: serde_json::Value| -> Deployment {
            obj(serde_json::json!({
                "metadata": {"namespace": "ns", "name": name, "annotations": ann},
                "spec": {"selector": {}, "template": {
                    "metadata": {"annotations": tmpl},
                    "spec": {"containers": [{"name": "c"}]}
                }}
            }))
        };
        cache.apply(&deployment("uses", "one"));
        cache.apply(&named(
            "meta",
            serde_json::json!({"configmap.reloader.stakater.com/reload": "x, on.*"}),
            serde_json::json!({}),
        ));
        cache.apply(&named(
            "tmpl",
            serde_json::json!({}),
            serde_json::json!({"wasmwatch.io/reload-configmaps": "one"}),
        ));
        // Names the object it references: returned once, as referencing.
        let both: Deployment = obj(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "both",
                "annotations": {"configmap.reloader.stakater.com/reload": "one"}},
            "spec": {"selector": {}, "template": {"spec": {"containers": [
                {"name": "c", "envFrom": [{"configMapRef": {"name": "one"}}]}
            ]}}}
        }));
        cache.apply(&both);
        cache.apply(&named(
            "secret",
            serde_json::json!({"secret.reloader.stakater.com/reload": "one"}),
            serde_json::json!({}),
        ));
        let found = cache.workloads_referencing(ObjectKind::ConfigMap, "ns", "one");
        assert_eq!(names(&found), ["both", "uses", "meta", "tmpl"]);
        assert!(found[2].references.is_empty());
        assert_eq!(
            found[0].references[0].uses,
            [ObjectUse {
                via: UseVia::EnvFrom,
                key: None
            }]
        );
        assert_eq!(
            names(&cache.workloads_referencing(ObjectKind::ConfigMap, "ns", "other")),
            Vec::<&str>::new()
        );
        assert_eq!(
            names(&cache.workloads_referencing(ObjectKind::ConfigMap, "ns", "only")),
            ["meta"]
        );
        assert_eq!(
            names(&cache.workloads_referencing(ObjectKind::Secret, "ns", "one")),
            ["secret"]
        );

        // The annotation goes: so does the workload.
        cache.apply(&named("meta", serde_json::json!({}), serde_json::json!({})));
        assert_eq!(
            names(&cache.workloads_referencing(ObjectKind::ConfigMap, "ns", "one")),
            ["both", "uses", "tmpl"]
        );
        cache.delete::<Deployment>("ns", "tmpl");
        cache.delete::<Deployment>("ns", "both");
        assert_eq!(
            names(&cache.workloads_referencing(ObjectKind::ConfigMap, "ns", "one")),
            ["uses"]
        );
        for name in ["uses", "meta", "secret"] {
            cache.delete::<Deployment>("ns", name);
        }
        assert_eq!(cache.stats(), CacheStats::default());
    }

    #[test]
    fn cronjobs_and_jobs_are_read_at_their_templates() {
        let mut cache = Cache::default();
        let pod = serde_json::json!({"containers": [{"name": "c", "env": [
            {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}
        ]}]});
        let cronjob: CronJob = obj(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "nightly"},
            "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": {
                "metadata": {"annotations": {"t": "cj"}}, "spec": pod.clone()
            }}}}
        }));
        let job: Job = obj(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "once"},
            "spec": {"template": {"spec": pod}}
        }));
        cache.apply(&cronjob);
        cache.apply(&job);
        let found = cache.workloads_referencing(ObjectKind::ConfigMap, "ns", "cfg");
        let kinds: Vec<String> = found.iter().map(|w| w.workload.kind.to_string()).collect();
        assert_eq!(kinds, ["batch/v1/CronJob", "batch/v1/Job"]);
        assert_eq!(found[0].template_annotations["t"], "cj");
        assert_eq!(
            found[1].references[0].uses,
            [ObjectUse {
                via: UseVia::Env,
                key: Some("k".into())
            }]
        );
        assert_eq!(cache.workload(&found[0].workload).as_ref(), Some(&found[0]));
        cache.delete::<CronJob>("ns", "nightly");
        cache.delete::<Job>("ns", "once");
        assert_eq!(cache.stats(), CacheStats::default());
    }
}
