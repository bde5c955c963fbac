//! The object store: every object of every kind as a `serde_json::Value`,
//! one global resourceVersion counter, a bounded history ring of changes per
//! kind (kube-apiserver keeps a watch cache per resource, so writes of one
//! kind never expire another kind's versions) and the broadcast feed that
//! watches consume.
//!
//! Everything sits under one mutex so that "take a snapshot (or a history
//! replay) and subscribe to later changes" is atomic: a watch started from a
//! list's resourceVersion neither misses nor duplicates an event. The
//! critical section of a write is small: bump the counter, stamp the version,
//! insert, push to the ring, hand an `Arc` to the broadcast channel.
//! Serialising an event for the wire happens lazily, once, in whichever watch
//! gets to it first.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::error::ApiError;
use crate::resources::{RESOURCES, ResourceId, crds_id, custom_for_crd, namespaces_id};

/// Key of an object inside one resource: (namespace, name); cluster-scoped
/// objects use an empty namespace. Ordered like kube-apiserver's etcd keys.
pub type Key = (String, String);

/// A list result: objects in key order and the snapshot's resourceVersion.
pub type Listing = (Vec<(Key, Arc<Value>)>, u64);

/// One page of a list ([`Store::list_page`]).
#[derive(Debug)]
pub struct Page {
    /// Objects in key order.
    pub items: Vec<(Key, Arc<Value>)>,
    /// The snapshot's resourceVersion.
    pub rv: u64,
    /// Admitted objects after the page (0: it is the last one).
    pub remaining: usize,
}

impl Page {
    fn of<'a>(
        range: impl Iterator<Item = (&'a Key, &'a Arc<Value>)>,
        keep: &dyn Fn(&Value) -> bool,
        limit: usize,
        rv: u64,
    ) -> Page {
        let mut admitted = range.filter(|(_, v)| keep(v));
        let mut items = Vec::new();
        for (k, v) in admitted.by_ref() {
            items.push((k.clone(), v.clone()));
            if limit > 0 && items.len() == limit {
                break;
            }
        }
        Page {
            items,
            rv,
            remaining: admitted.count(),
        }
    }
}

/// Kind of a stored change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeType::Added => "ADDED",
            ChangeType::Modified => "MODIFIED",
            ChangeType::Deleted => "DELETED",
        }
    }
}

/// One committed write, as kept in the history ring and broadcast to watches.
#[derive(Debug)]
pub struct Change {
    pub rv: u64,
    pub resource: ResourceId,
    pub kind: ChangeType,
    pub namespace: String,
    /// The object after the change (for a deletion: the last state, stamped
    /// with the deletion's resourceVersion, as kube-apiserver does).
    pub object: Arc<Value>,
    /// The object before the change, if any (for selector transitions and
    /// rewinding history into a past snapshot).
    pub prev: Option<Arc<Value>>,
    line: OnceLock<Bytes>,
}

impl Change {
    /// The wire form `{"type":...,"object":...}\n`, serialised once.
    pub fn line(&self) -> &Bytes {
        self.line
            .get_or_init(|| event_line(self.kind.as_str(), &self.object))
    }
}

/// Serialise one watch event line.
pub fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(kind.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    serde_json::to_writer(&mut buf, object).expect("a Value always serialises");
    buf.extend_from_slice(b"}\n");
    Bytes::from(buf)
}

/// Store errors that the request layer turns into API errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("already exists")]
    AlreadyExists,
    /// The object's resourceVersion is not the expected one.
    #[error("resource version changed")]
    Changed,
    #[error("namespace {0} not found")]
    NamespaceNotFound(String),
    #[error("namespace {0} is terminating")]
    NamespaceTerminating(String),
    /// A custom resource whose CRD does not exist (any more).
    #[error("resource not served")]
    NotServed,
}

struct Inner {
    rv: u64,
    objects: Vec<BTreeMap<Key, Arc<Value>>>,
    /// Per resource: its last `capacity` changes.
    history: Vec<VecDeque<Arc<Change>>>,
    capacity: usize,
    /// Per resource: every change of it with rv > compacted is in its history.
    compacted: Vec<u64>,
}

/// How a watch begins, computed atomically with its subscription.
pub struct WatchStart {
    /// Objects for synthetic ADDED events (watch without a resourceVersion).
    pub initial: Vec<Arc<Value>>,
    /// Changes after the requested resourceVersion.
    pub replay: Vec<Arc<Change>>,
    /// The resourceVersion the watch is at once `initial`/`replay` are sent.
    pub rv: u64,
    pub rx: broadcast::Receiver<Arc<Change>>,
    /// Counts this watch as open until dropped.
    pub guard: WatchGuard,
}

/// Keeps a watch counted in [`Store::open_watches`] while alive.
pub struct WatchGuard(tokio::sync::watch::Sender<usize>);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// The in-memory object store.
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Change>>,
    auto_create_namespaces: bool,
    open_watches: tokio::sync::watch::Sender<usize>,
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

/// The resourceVersion of a stored object.
pub fn rv_of(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

impl Store {
    pub fn new(history: usize, broadcast_capacity: usize, auto_create_namespaces: bool) -> Self {
        let (tx, _) = broadcast::channel(broadcast_capacity.max(16));
        Store {
            inner: Mutex::new(Inner {
                rv: 0,
                objects: RESOURCES.iter().map(|_| BTreeMap::new()).collect(),
                history: RESOURCES.iter().map(|_| VecDeque::new()).collect(),
                capacity: history,
                compacted: vec![0; RESOURCES.len()],
            }),
            tx,
            auto_create_namespaces,
            open_watches: tokio::sync::watch::channel(0).0,
        }
    }

    /// A receiver of the number of open watch streams.
    pub fn open_watches(&self) -> tokio::sync::watch::Receiver<usize> {
        self.open_watches.subscribe()
    }

    fn watch_guard(&self) -> WatchGuard {
        self.open_watches.send_modify(|n| *n += 1);
        WatchGuard(self.open_watches.clone())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated
        // in a way later readers would trip over, so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current (latest committed) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    fn served_locked(g: &Inner, res: ResourceId) -> bool {
        let rt = &RESOURCES[res];
        !rt.custom || g.objects[crds_id()].contains_key(&(String::new(), rt.qualified()))
    }

    /// Whether a resource is served: built-in ones always, custom ones
    /// while their CustomResourceDefinition exists.
    pub fn served(&self, res: ResourceId) -> bool {
        Self::served_locked(&self.lock(), res)
    }

    /// [`Store::served`] of every resource, indexed by id, at one moment.
    pub fn served_all(&self) -> Vec<bool> {
        let g = self.lock();
        (0..RESOURCES.len())
            .map(|res| Self::served_locked(&g, res))
            .collect()
    }

    /// Drop all kept history and expire every version up to the current one:
    /// a watch resuming from any version handed out so far (and an exact list
    /// or continue token at one) gets 410 Expired.
    pub fn compact(&self) {
        let mut g = self.lock();
        let expired = g.rv + 1;
        for h in &mut g.history {
            h.clear();
        }
        for c in &mut g.compacted {
            *c = expired;
        }
    }

    /// Change the history size of every kind (takes effect for later
    /// writes; shrinks now).
    pub fn set_history_capacity(&self, capacity: usize) {
        let mut g = self.lock();
        g.capacity = capacity;
        let Inner {
            history, compacted, ..
        } = &mut *g;
        for (h, c) in history.iter_mut().zip(compacted.iter_mut()) {
            while h.len() > capacity {
                let old = h.pop_front().expect("non-empty");
                *c = old.rv;
            }
        }
    }

    pub fn get(&self, res: ResourceId, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.lock().objects[res]
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    fn commit(
        &self,
        g: &mut Inner,
        res: ResourceId,
        key: Key,
        kind: ChangeType,
        mut obj: Value,
        prev: Option<Arc<Value>>,
    ) -> Arc<Value> {
        g.rv += 1;
        let rv = g.rv;
        set_rv(&mut obj, rv);
        let obj = Arc::new(obj);
        match kind {
            ChangeType::Deleted => {
                g.objects[res].remove(&key);
            }
            _ => {
                g.objects[res].insert(key.clone(), obj.clone());
            }
        }
        let change = Arc::new(Change {
            rv,
            resource: res,
            kind,
            namespace: key.0,
            object: obj.clone(),
            prev,
            line: OnceLock::new(),
        });
        if g.capacity > 0 {
            if g.history[res].len() >= g.capacity {
                let old = g.history[res].pop_front().expect("non-empty");
                g.compacted[res] = old.rv;
            }
            g.history[res].push_back(change.clone());
        } else {
            g.compacted[res] = rv;
        }
        let _ = self.tx.send(change);
        obj
    }

    fn check_namespace(&self, g: &mut Inner, res: ResourceId, ns: &str) -> Result<(), StoreError> {
        if !RESOURCES[res].namespaced {
            return Ok(());
        }
        let nsid = namespaces_id();
        let key = (String::new(), ns.to_string());
        match g.objects[nsid].get(&key) {
            Some(n) if n.pointer("/metadata/deletionTimestamp").is_some() => {
                Err(StoreError::NamespaceTerminating(ns.to_string()))
            }
            Some(_) => Ok(()),
            None if self.auto_create_namespaces => {
                let obj = crate::objects::new_namespace(ns);
                self.commit(g, nsid, key, ChangeType::Added, obj, None);
                Ok(())
            }
            None => Err(StoreError::NamespaceNotFound(ns.to_string())),
        }
    }

    /// Insert a new object (already prepared by the request layer).
    pub fn create(
        &self,
        res: ResourceId,
        ns: &str,
        name: &str,
        obj: Value,
    ) -> Result<Arc<Value>, StoreError> {
        let mut g = self.lock();
        if !Self::served_locked(&g, res) {
            return Err(StoreError::NotServed);
        }
        self.check_namespace(&mut g, res, ns)?;
        let key = (ns.to_string(), name.to_string());
        if g.objects[res].contains_key(&key) {
            return Err(StoreError::AlreadyExists);
        }
        Ok(self.commit(&mut g, res, key, ChangeType::Added, obj, None))
    }

    /// Replace an object whose current resourceVersion must be `expect_rv`.
    /// An object left with a deletionTimestamp and no finalizers is deleted.
    pub fn update(
        &self,
        res: ResourceId,
        ns: &str,
        name: &str,
        expect_rv: u64,
        obj: Value,
    ) -> Result<Arc<Value>, StoreError> {
        let mut g = self.lock();
        let key = (ns.to_string(), name.to_string());
        let cur = g.objects[res]
            .get(&key)
            .cloned()
            .ok_or(StoreError::NotFound)?;
        if rv_of(&cur) != expect_rv {
            return Err(StoreError::Changed);
        }
        let finalized = obj.pointer("/metadata/deletionTimestamp").is_some()
            && obj
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(|f| f.is_empty());
        let kind = if finalized {
            // A CRD whose last finalizer went: its custom resources go first.
            if res == crds_id() {
                self.delete_dependents_locked(&mut g, res, name);
            }
            ChangeType::Deleted
        } else {
            ChangeType::Modified
        };
        Ok(self.commit(&mut g, res, key, kind, obj, Some(cur)))
    }

    /// kube-apiserver's deletion of a namespace (its `kubernetes` finalizer):
    /// only marked, `deletionTimestamp` and phase `Terminating`; from then
    /// on nothing new may be created in it (NamespaceLifecycle), while
    /// updates and patches of what it holds still work. The namespace
    /// controller deletes the content ([`Store::delete_content`]) and then
    /// the namespace.
    pub fn terminate_namespace(&self, name: &str) -> Result<Arc<Value>, StoreError> {
        let mut g = self.lock();
        let nsid = namespaces_id();
        let key = (String::new(), name.to_string());
        let cur = g.objects[nsid]
            .get(&key)
            .cloned()
            .ok_or(StoreError::NotFound)?;
        let mut obj = crate::objects::mark_deleting(&cur);
        obj["status"] = serde_json::json!({"phase": "Terminating"});
        Ok(self.commit(&mut g, nsid, key, ChangeType::Modified, obj, Some(cur)))
    }

    /// The namespace controller's step: every object of `res` in `ns`
    /// deleted.
    pub fn delete_content(&self, res: ResourceId, ns: &str) {
        self.delete_content_locked(&mut self.lock(), res, ns);
    }

    fn delete_content_locked(&self, g: &mut Inner, res: ResourceId, ns: &str) {
        let keys: Vec<Key> = g.objects[res]
            .range((ns.to_string(), String::new())..)
            .take_while(|(k, _)| k.0 == ns)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            let o = g.objects[res].get(&k).cloned().expect("present");
            self.commit(g, res, k, ChangeType::Deleted, (*o).clone(), Some(o));
        }
    }

    /// Every object of `res`, in all namespaces, deleted (each with its
    /// DELETED change and resourceVersion).
    fn delete_all_locked(&self, g: &mut Inner, res: ResourceId) {
        let keys: Vec<Key> = g.objects[res].keys().cloned().collect();
        for k in keys {
            let o = g.objects[res].get(&k).cloned().expect("present");
            self.commit(g, res, k, ChangeType::Deleted, (*o).clone(), Some(o));
        }
    }

    /// What goes with an object about to be deleted, in the same critical
    /// section: everything in a namespace; every object of a CRD's custom
    /// resource (kube-apiserver's finalizer `customresourcecleanup` does
    /// that before the CRD goes, after which the resource is not served).
    fn delete_dependents_locked(&self, g: &mut Inner, res: ResourceId, name: &str) {
        if RESOURCES[res].is_namespace() {
            for (rid, rt) in RESOURCES.iter().enumerate() {
                if rt.namespaced {
                    self.delete_content_locked(g, rid, name);
                }
            }
        } else if res == crds_id()
            && let Some(custom) = custom_for_crd(name)
        {
            self.delete_all_locked(g, custom);
        }
    }

    /// Delete an object (optionally only at `expect_rv`). Deleting a namespace
    /// deletes everything in it; deleting a CRD every object of its custom
    /// resource.
    pub fn delete(
        &self,
        res: ResourceId,
        ns: &str,
        name: &str,
        expect_rv: Option<u64>,
    ) -> Result<Arc<Value>, StoreError> {
        let mut g = self.lock();
        let key = (ns.to_string(), name.to_string());
        let cur = g.objects[res]
            .get(&key)
            .cloned()
            .ok_or(StoreError::NotFound)?;
        if expect_rv.is_some_and(|rv| rv != rv_of(&cur)) {
            return Err(StoreError::Changed);
        }
        self.delete_dependents_locked(&mut g, res, name);
        Ok(self.commit(
            &mut g,
            res,
            key,
            ChangeType::Deleted,
            (*cur).clone(),
            Some(cur),
        ))
    }

    /// Objects of a resource (optionally one namespace) in key order, at the
    /// latest version or exactly at `at` (rebuilt by rewinding history).
    pub fn list(
        &self,
        res: ResourceId,
        ns: Option<&str>,
        at: Option<u64>,
    ) -> Result<Listing, ApiError> {
        let g = self.lock();
        let in_ns = |k: &Key| ns.is_none_or(|n| k.0 == n);
        let map = &g.objects[res];
        let current = || -> Vec<(Key, Arc<Value>)> {
            match ns {
                Some(n) => map
                    .range((n.to_string(), String::new())..)
                    .take_while(|(k, _)| k.0 == n)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                None => map.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            }
        };
        let Some(at) = at.filter(|&at| at != g.rv) else {
            return Ok((current(), g.rv));
        };
        if at > g.rv {
            return Err(ApiError::too_large_rv(at, g.rv));
        }
        if at < g.compacted[res] {
            return Err(ApiError::too_old(at, g.compacted[res].min(g.rv)));
        }
        let mut snap: BTreeMap<Key, Arc<Value>> = current().into_iter().collect();
        let history = &g.history[res];
        let start = history.partition_point(|c| c.rv <= at);
        for c in history.range(start..).rev() {
            let key = (
                c.namespace.clone(),
                c.object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            );
            if !in_ns(&key) {
                continue;
            }
            match &c.prev {
                Some(p) => {
                    snap.insert(key, p.clone());
                }
                None => {
                    snap.remove(&key);
                }
            }
        }
        Ok((snap.into_iter().collect(), at))
    }

    /// One page of a list: up to `limit` objects (0: all) after
    /// `start_after` that `keep` admits, at `at` (`None`: now), as
    /// [`Store::list`] sees them. At the current version the page is read
    /// in place from the key-ordered map, as kube-apiserver reads a range
    /// from etcd: a page costs its own objects, not the whole resource
    /// (a paged list of 200,000 objects copied every one of them for each
    /// of its 800 pages). So is a page at an older version when nothing of
    /// the resource changed since; otherwise the snapshot is rebuilt from
    /// the history (O(objects) a page, as before).
    pub fn list_page(
        &self,
        res: ResourceId,
        ns: Option<&str>,
        at: Option<u64>,
        start_after: Option<&Key>,
        keep: &dyn Fn(&Value) -> bool,
        limit: usize,
    ) -> Result<Page, ApiError> {
        let current = {
            let g = self.lock();
            // The objects as they were at `at` are the current ones when
            // nothing of this resource changed since (other resources'
            // writes, a leader's Lease renewals, move the version on).
            let unchanged_since = |at: u64| {
                at <= g.rv
                    && at >= g.compacted[res]
                    && g.history[res].back().is_none_or(|c| c.rv <= at)
            };
            at.is_none_or(unchanged_since).then(|| {
                let map = &g.objects[res];
                let from = match (start_after, ns) {
                    (Some(k), _) => Bound::Excluded(k.clone()),
                    (None, Some(n)) => Bound::Included((n.to_string(), String::new())),
                    (None, None) => Bound::Unbounded,
                };
                let range = map
                    .range((from, Bound::Unbounded))
                    .take_while(|(k, _)| ns.is_none_or(|n| k.0 == n));
                Page::of(range, keep, limit, g.rv)
            })
        };
        if let Some(page) = current {
            return Ok(page);
        }
        let (items, rv) = self.list(res, ns, at)?;
        let range = items
            .iter()
            .filter(|(k, _)| start_after.is_none_or(|s| k > s))
            .map(|(k, v)| (k, v));
        Ok(Page::of(range, keep, limit, rv))
    }

    /// Start a watch: from the current state (`from = None`: the caller sends
    /// synthetic ADDED events for `initial`) or from a resourceVersion (the
    /// caller replays `replay`). Either way `rx` delivers every later change.
    /// A custom resource without its CRD is 404 (not served).
    pub fn watch(&self, res: ResourceId, from: Option<u64>) -> Result<WatchStart, ApiError> {
        let g = self.lock();
        if !Self::served_locked(&g, res) {
            return Err(ApiError::path_not_found());
        }
        let rx = self.tx.subscribe();
        match from {
            None => Ok(WatchStart {
                initial: g.objects[res].values().cloned().collect(),
                replay: Vec::new(),
                rv: g.rv,
                rx,
                guard: self.watch_guard(),
            }),
            Some(n) => {
                if n < g.compacted[res] {
                    return Err(ApiError::too_old(n, g.compacted[res].min(g.rv)));
                }
                let history = &g.history[res];
                let start = history.partition_point(|c| c.rv <= n);
                Ok(WatchStart {
                    initial: Vec::new(),
                    replay: history.range(start..).cloned().collect(),
                    rv: n,
                    rx,
                    guard: self.watch_guard(),
                })
            }
        }
    }

    /// A fresh namespace-less object count (for tests and diagnostics).
    pub fn len(&self, res: ResourceId) -> usize {
        self.lock().objects[res].len()
    }

    /// The history bounds of one resource: (compacted, latest).
    pub fn history_bounds(&self, res: ResourceId) -> (u64, u64) {
        let g = self.lock();
        (g.compacted[res], g.rv)
    }
}

/// A minimal object carrying only `metadata.resourceVersion` (bookmarks).
pub fn bookmark_object(api_version: &str, kind: &str, rv: u64, initial_end: bool) -> Value {
    let mut o = json!({
        "kind": kind,
        "apiVersion": api_version,
        "metadata": { "resourceVersion": rv.to_string() },
    });
    if initial_end {
        o["metadata"]["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    o
}
