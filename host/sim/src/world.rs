//! The simulated world: an API server (ConfigMaps with a history that is
//! compacted, watches with bookmarks and drops, Leases with optimistic
//! concurrency), faults on any request, per-replica pauses and
//! partitions, and the app that records every delivery.
//!
//! Everything runs on one thread under tokio's paused clock: a request
//! takes simulated time, and the world changes only between awaits, so a
//! seed replays the same schedule to the request.
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::stream::BoxStream;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{
    DeleteParams, DynamicObject, ListParams, ObjectList, ObjectMeta, PartialObjectMeta, WatchEvent,
    WatchParams,
};
use kube::core::{ListMeta, Status, TypeMeta};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::time::Instant;
use wasmwatch_kube::apis::{LeaseApi, ObjectApi};

/// The world, shared by every task of one schedule.
#[derive(Clone)]
pub struct Shared(Arc<Mutex<World>>);

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, World> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One ConfigMap as stored.
#[derive(Debug, Clone)]
pub struct Obj {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub rv: u64,
    /// The content: the number of the write that made it, or, for a
    /// revert, the content before the current one again.
    pub content: u64,
    /// The content before this one.
    pub previous: Option<u64>,
}

impl Obj {
    pub fn to_dynamic(&self) -> DynamicObject {
        DynamicObject {
            types: Some(TypeMeta {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
            }),
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                uid: Some(self.uid.clone()),
                resource_version: Some(self.rv.to_string()),
                ..Default::default()
            },
            data: serde_json::json!({ "data": { "v": self.content.to_string() } }),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvType {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug, Clone)]
struct Ev {
    at: Instant,
    ty: EvType,
    obj: Obj,
}

/// What the app received.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub at: Duration,
    pub node: usize,
    pub namespace: String,
    pub name: String,
    /// `None`: a deletion.
    pub content: Option<u64>,
    /// The resourceVersion delivered (the order of writes); 0 when
    /// unknown (a deletion a relist found).
    pub of: u64,
    pub replay: bool,
    /// The term that delivered it (an index into `World::claims`).
    pub term: usize,
    /// Made while the replica's saves had failed `term::HOLD_FAILURES`
    /// times in a row (creations then go without a stored index: the one
    /// loss the design accepts, reported by a Warning Event).
    pub store_failing: bool,
}

/// What a term claimed: per namespace, the checkpoint it resumed from with
/// an index that covers it (a namespace it rebuilt or delivered whole is
/// not there: nothing about it is trusted).
#[derive(Debug, Clone)]
pub struct Claim {
    pub node: usize,
    pub at: Duration,
    pub from: BTreeMap<String, u64>,
    /// It ended by SIGTERM and its final save was stored: a handover.
    pub handed_over: bool,
    /// Its final save was stored.
    pub final_stored: bool,
    /// What it trusted of the stored index (what its predecessor's last
    /// save named unhandled).
    pub trust: Option<wasmwatch_kube::checkpoint::Trust>,
}

/// Faults on requests, drawn per request.
#[derive(Debug, Clone, Default)]
pub struct RequestFaults {
    /// A 500 or 503 before the request is applied.
    pub error: f64,
    /// The request is applied and its answer lost (a dropped connection).
    pub lost_answer: f64,
    /// A watch stream ends after an event.
    pub watch_drop: f64,
}

/// A replica's connection to the world.
#[derive(Debug)]
pub struct Node {
    pub identity: String,
    /// SIGSTOP: its requests and tasks wait on `resumed`. (Not a
    /// `tokio::sync::watch`: that wakes its receivers in an order drawn at
    /// random, and a schedule must replay exactly.)
    pub paused: bool,
    pub resumed: Arc<tokio::sync::Notify>,
    pub partitioned: bool,
    /// Its saves failed `term::HOLD_FAILURES` times in a row, and none
    /// was stored since.
    pub store_failing: bool,
}

/// The world.
pub struct World {
    start: Instant,
    rv: u64,
    writes: u64,
    uids: u64,
    objects: BTreeMap<(String, String), Obj>,
    events: VecDeque<Ev>,
    /// Watches from below this version get 410 Gone.
    floor: u64,
    /// How long events stay in the history (the watch cache's ~75 s).
    pub history: Duration,
    leases: BTreeMap<String, Lease>,
    pub rng: ChaCha8Rng,
    pub faults: RequestFaults,
    pub nodes: Vec<Node>,
    pub app: Vec<Delivery>,
    /// Every object ever written, by namespace and name: its last content
    /// and whether it exists now.
    pub truth: BTreeMap<(String, String), (u64, bool)>,
    pub trace: Vec<String>,
    /// Objects a change of which was dead-lettered: how many deliveries
    /// the app had had (of any object) at the newest such dead letter.
    pub dead_letters: BTreeMap<(String, String), usize>,
    /// Every term's claim, in order.
    pub claims: Vec<Claim>,
    /// Every plugin call fails (`Fault::PluginDown`).
    pub plugin_down: bool,
    /// The app refuses every POST (`Fault::AppDown`).
    pub app_down: bool,
    /// Violations seen while running (an action outside the fence).
    pub violations: Vec<String>,
    /// Woken at every write (a `Notify`, for the fixed order).
    changed: Arc<tokio::sync::Notify>,
    /// Requests answered.
    pub requests: u64,
}

fn status(code: u16, reason: &str, message: &str) -> kube::Error {
    kube::Error::Api(Box::new(Status::failure(message, reason).with_code(code)))
}

fn unreachable_error() -> kube::Error {
    kube::Error::Service("simulated: connection timed out".into())
}

impl World {
    pub fn shared(seed: u64, history: Duration) -> Shared {
        Shared(Arc::new(Mutex::new(World {
            start: Instant::now(),
            rv: 100,
            writes: 0,
            uids: 0,
            objects: BTreeMap::new(),
            events: VecDeque::new(),
            floor: 0,
            history,
            leases: BTreeMap::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            faults: RequestFaults::default(),
            nodes: Vec::new(),
            app: Vec::new(),
            truth: BTreeMap::new(),
            trace: Vec::new(),
            violations: Vec::new(),
            dead_letters: Default::default(),
            claims: Vec::new(),
            plugin_down: false,
            app_down: false,
            changed: Default::default(),
            requests: 0,
        })))
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        Instant::now() - self.start
    }

    pub fn log(&mut self, line: impl AsRef<str>) {
        let at = self.elapsed();
        self.trace
            .push(format!("{:>9.3}s {}", at.as_secs_f64(), line.as_ref()));
    }

    pub fn add_node(&mut self, identity: &str) -> usize {
        self.nodes.push(Node {
            identity: identity.to_string(),
            paused: false,
            resumed: Default::default(),
            partitioned: false,
            store_failing: false,
        });
        self.nodes.len() - 1
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Drops history older than the window: watches from before it get 410.
    fn compact(&mut self) {
        let now = Instant::now();
        while let Some(e) = self.events.front() {
            if now.saturating_duration_since(e.at) <= self.history {
                break;
            }
            self.floor = e.obj.rv;
            self.events.pop_front();
        }
    }

    /// The writer: creates, changes or deletes `namespace/name`; `revert`
    /// changes it back to its content before the current one (A, B, A).
    pub fn write(&mut self, namespace: &str, name: &str, delete: bool, revert: bool) {
        self.compact();
        let key = (namespace.to_string(), name.to_string());
        let rv = self.next_rv();
        self.writes += 1;
        let content = self.writes;
        let ev = match (self.objects.remove(&key), delete) {
            (None, true) => return,
            (Some(mut o), true) => {
                o.rv = rv;
                self.truth.insert(key, (o.content, false));
                Ev {
                    at: Instant::now(),
                    ty: EvType::Deleted,
                    obj: o,
                }
            }
            (old, false) => {
                let ty = if old.is_some() {
                    EvType::Modified
                } else {
                    EvType::Added
                };
                let (content, previous) = match &old {
                    Some(o) if revert && o.previous.is_some() => {
                        (o.previous.unwrap_or(0), Some(o.content))
                    }
                    Some(o) => (content, Some(o.content)),
                    None => (content, None),
                };
                let uid = match old {
                    Some(o) => o.uid,
                    None => {
                        self.uids += 1;
                        format!("uid-{}", self.uids)
                    }
                };
                let o = Obj {
                    namespace: namespace.into(),
                    name: name.into(),
                    uid,
                    rv,
                    content,
                    previous,
                };
                self.objects.insert(key.clone(), o.clone());
                self.truth.insert(key, (content, true));
                Ev {
                    at: Instant::now(),
                    ty,
                    obj: o,
                }
            }
        };
        self.log(format!(
            "write {:?} {namespace}/{name} content {} rv {rv}",
            ev.ty, ev.obj.content
        ));
        self.events.push_back(ev);
        self.changed.notify_waiters();
    }

    /// Draws the fault of one request.
    fn draw(&mut self) -> Option<Drawn> {
        self.requests += 1;
        let f = self.faults.clone();
        if f.error > 0.0 && self.rng.random_bool(f.error) {
            return Some(Drawn::Error(if self.rng.random_bool(0.5) {
                500
            } else {
                503
            }));
        }
        if f.lost_answer > 0.0 && self.rng.random_bool(f.lost_answer) {
            return Some(Drawn::LostAnswer);
        }
        None
    }

    /// The latency of one request.
    pub fn latency(&mut self) -> Duration {
        Duration::from_micros(self.rng.random_range(200..20_000))
    }

    fn lease_get(&self, name: &str) -> Option<Lease> {
        self.leases.get(name).cloned()
    }

    /// The times an elector writes come from its wall clock, which here is
    /// the simulated one: a renewal's `renewTime`, and an `acquireTime`
    /// that changed. (Real time would make two renewals a microsecond
    /// apart look alike, and the schedule depend on the machine.)
    fn stamp_times(&self, lease: &mut Lease, stored: Option<&Lease>) {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::from_nanosecond(
                1_800_000_000_000_000_000 + self.elapsed().as_nanos() as i128,
            )
            .expect("a time"),
        );
        let old = stored.and_then(|l| l.spec.as_ref());
        if let Some(spec) = lease.spec.as_mut() {
            if spec.renew_time.is_some() {
                spec.renew_time = Some(now.clone());
            }
            if spec.acquire_time.is_some()
                && old.is_none_or(|o| o.acquire_time != spec.acquire_time)
            {
                spec.acquire_time = Some(now);
            }
        }
    }

    fn lease_create(&mut self, lease: &Lease) -> kube::Result<Lease> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        if self.leases.contains_key(&name) {
            return Err(status(
                409,
                "AlreadyExists",
                &format!("leases \"{name}\" already exists"),
            ));
        }
        let mut l = lease.clone();
        self.stamp_times(&mut l, None);
        self.uids += 1;
        l.metadata.uid = Some(format!("lease-uid-{}", self.uids));
        l.metadata.resource_version = Some(self.next_rv().to_string());
        self.leases.insert(name, l.clone());
        Ok(l)
    }

    fn lease_replace(&mut self, name: &str, lease: &Lease) -> kube::Result<Lease> {
        let Some(stored) = self.leases.get(name) else {
            return Err(status(
                404,
                "NotFound",
                &format!("leases \"{name}\" not found"),
            ));
        };
        if lease.metadata.resource_version.is_some()
            && lease.metadata.resource_version != stored.metadata.resource_version
        {
            return Err(status(
                409,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on leases \"{name}\": the object has been modified"
                ),
            ));
        }
        let mut l = lease.clone();
        let stored = stored.clone();
        self.stamp_times(&mut l, Some(&stored));
        l.metadata.uid = stored.metadata.uid.clone();
        l.metadata.resource_version = Some(self.next_rv().to_string());
        self.leases.insert(name.to_string(), l.clone());
        Ok(l)
    }

    fn lease_delete(&mut self, name: &str, dp: &DeleteParams) -> kube::Result<()> {
        let Some(stored) = self.leases.get(name) else {
            return Err(status(
                404,
                "NotFound",
                &format!("leases \"{name}\" not found"),
            ));
        };
        if let Some(rv) = dp
            .preconditions
            .as_ref()
            .and_then(|p| p.resource_version.as_ref())
            && Some(rv) != stored.metadata.resource_version.as_ref()
        {
            return Err(status(409, "Conflict", "precondition failed"));
        }
        self.leases.remove(name);
        Ok(())
    }

    /// The stored Leases (for the checks at the end).
    pub fn leases(&self) -> &BTreeMap<String, Lease> {
        &self.leases
    }

    /// The holder of Lease `name`, if any.
    pub fn holder(&self, name: &str) -> Option<String> {
        self.leases
            .get(name)
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty())
    }

    pub fn objects(&self) -> impl Iterator<Item = &Obj> {
        self.objects.values()
    }

    fn list(&self, namespace: Option<&str>) -> ObjectList<DynamicObject> {
        ObjectList {
            types: TypeMeta {
                api_version: "v1".into(),
                kind: "ConfigMapList".into(),
            },
            metadata: ListMeta {
                resource_version: Some(self.rv.to_string()),
                ..Default::default()
            },
            items: self
                .objects
                .values()
                .filter(|o| namespace.is_none_or(|ns| o.namespace == ns))
                .map(Obj::to_dynamic)
                .collect(),
        }
    }
}

enum Drawn {
    Error(u16),
    LostAnswer,
}

/// What one replica reaches the world through.
#[derive(Clone)]
pub struct Conn {
    pub world: Shared,
    pub node: usize,
    resumed: Arc<tokio::sync::Notify>,
}

impl Conn {
    pub fn new(world: &Shared, node: usize) -> Conn {
        let resumed = world.lock().nodes[node].resumed.clone();
        Conn {
            world: world.clone(),
            node,
            resumed,
        }
    }

    /// Waits while the replica is paused (SIGSTOP): it does nothing then.
    pub async fn gate(&self) {
        loop {
            let resumed = self.resumed.notified();
            tokio::pin!(resumed);
            resumed.as_mut().enable();
            if !self.world.lock().nodes[self.node].paused {
                return;
            }
            resumed.await;
        }
    }

    /// One request: it takes simulated time, may fail before or after it
    /// is applied, and hangs while the replica is paused; a partitioned
    /// replica's requests time out.
    async fn call<T>(
        &self,
        what: &str,
        apply: impl FnOnce(&mut World) -> kube::Result<T>,
    ) -> kube::Result<T> {
        self.gate().await;
        let latency = self.world.lock().latency();
        tokio::time::sleep(latency).await;
        self.gate().await;
        let partitioned = self.world.lock().nodes[self.node].partitioned;
        if partitioned {
            tokio::time::sleep(Duration::from_secs(5)).await;
            return Err(unreachable_error());
        }
        let mut w = self.world.lock();
        if std::env::var_os("SIM_TRACE_REQUESTS").is_some() {
            w.log(format!("node {} {what}", self.node));
        }
        match w.draw() {
            Some(Drawn::Error(code)) => {
                w.log(format!("node {} {what}: {code}", self.node));
                Err(status(code, "InternalError", "simulated failure"))
            }
            Some(Drawn::LostAnswer) => {
                let applied = apply(&mut w).is_ok();
                w.log(format!(
                    "node {} {what}: answer lost (applied: {applied})",
                    self.node
                ));
                Err(kube::Error::Service("simulated: connection reset".into()))
            }
            None => apply(&mut w),
        }
    }
}

impl LeaseApi for Conn {
    async fn get_opt(&self, name: &str) -> kube::Result<Option<Lease>> {
        self.call(&format!("get {name}"), |w| Ok(w.lease_get(name)))
            .await
    }
    async fn create(&self, lease: &Lease) -> kube::Result<Lease> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        self.call(&format!("create {name}"), |w| w.lease_create(lease))
            .await
    }
    async fn replace(&self, name: &str, lease: &Lease) -> kube::Result<Lease> {
        self.call(&format!("replace {name}"), |w| w.lease_replace(name, lease))
            .await
    }
    async fn delete(&self, name: &str, dp: &DeleteParams) -> kube::Result<()> {
        self.call(&format!("delete {name}"), |w| w.lease_delete(name, dp))
            .await
    }
}

/// A replica's view of the ConfigMaps of one namespace (or all).
#[derive(Clone)]
pub struct Objects {
    pub conn: Conn,
    pub namespace: Option<String>,
}

impl ObjectApi for Objects {
    async fn list(&self, _lp: &ListParams) -> kube::Result<ObjectList<DynamicObject>> {
        let ns = self.namespace.clone();
        self.conn.call("list", |w| Ok(w.list(ns.as_deref()))).await
    }

    async fn list_metadata(
        &self,
        _lp: &ListParams,
    ) -> kube::Result<ObjectList<PartialObjectMeta<DynamicObject>>> {
        let ns = self.namespace.clone();
        self.conn
            .call("list metadata", |w| {
                let list = w.list(ns.as_deref());
                Ok(ObjectList {
                    types: list.types,
                    metadata: list.metadata,
                    items: Vec::new(),
                })
            })
            .await
    }

    async fn watch(
        &self,
        wp: &WatchParams,
        version: &str,
    ) -> kube::Result<BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>> {
        let from: u64 = version
            .parse()
            .map_err(|_| status(400, "BadRequest", "resourceVersion is not a number"))?;
        // Some servers refuse an expired version with an HTTP 410, others
        // with an ERROR event: both, drawn per request.
        let refuse = self
            .conn
            .call("watch", |w| {
                w.compact();
                Ok(from < w.floor && w.rng.random_bool(0.5))
            })
            .await?;
        if refuse {
            return Err(status(410, "Expired", "too old resource version"));
        }
        let timeout = Duration::from_secs(wp.timeout.unwrap_or(290) as u64);
        let state = WatchState {
            objects: self.clone(),
            cursor: from,
            end_at: Instant::now() + timeout,
            next_bookmark: Instant::now(),
            changed: self.conn.world.lock().changed.clone(),
            done: false,
        };
        Ok(Box::pin(futures_util::stream::unfold(
            state,
            |mut s| async move {
                let item = s.next().await?;
                Some((item, s))
            },
        )))
    }
}

struct WatchState {
    objects: Objects,
    cursor: u64,
    end_at: Instant,
    next_bookmark: Instant,
    changed: Arc<tokio::sync::Notify>,
    done: bool,
}

impl WatchState {
    async fn next(&mut self) -> Option<kube::Result<WatchEvent<DynamicObject>>> {
        loop {
            if self.done {
                return None;
            }
            self.objects.conn.gate().await;
            let changed = self.changed.clone();
            let written = changed.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            {
                let mut w = self.objects.conn.world.lock();
                if w.nodes[self.objects.conn.node].partitioned {
                    self.done = true;
                    return Some(Err(unreachable_error()));
                }
                w.compact();
                if self.cursor < w.floor {
                    self.done = true;
                    return Some(Ok(WatchEvent::Error(Box::new(
                        Status::failure("too old resource version", "Expired").with_code(410),
                    ))));
                }
                let ns = self.objects.namespace.as_deref();
                let next = w
                    .events
                    .iter()
                    .find(|e| e.obj.rv > self.cursor && ns.is_none_or(|ns| e.obj.namespace == ns))
                    .cloned();
                if let Some(e) = next {
                    self.cursor = e.obj.rv;
                    let drop_after = w.faults.watch_drop > 0.0 && {
                        let p = w.faults.watch_drop;
                        w.rng.random_bool(p)
                    };
                    self.done = drop_after;
                    let o = e.obj.to_dynamic();
                    return Some(Ok(match e.ty {
                        EvType::Added => WatchEvent::Added(o),
                        EvType::Modified => WatchEvent::Modified(o),
                        EvType::Deleted => WatchEvent::Deleted(o),
                    }));
                }
                if Instant::now() >= self.end_at {
                    return None;
                }
                if Instant::now() >= self.next_bookmark {
                    // Nothing of this collection up to now: a bookmark
                    // at the current version (what the server may send).
                    let gap = Duration::from_secs(w.rng.random_range(5..60));
                    self.next_bookmark = Instant::now() + gap;
                    if w.rv > self.cursor {
                        self.cursor = w.rv;
                        return Some(Ok(WatchEvent::Bookmark(bookmark(self.cursor))));
                    }
                }
            }
            let wake = self.next_bookmark.min(self.end_at);
            tokio::select! {
                biased;
                _ = written => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

fn bookmark(rv: u64) -> kube::core::watch::Bookmark {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "resourceVersion": rv.to_string() }
    }))
    .expect("a bookmark")
}
