//! The host's own Events about its work (`Refreshed` on the Service,
//! `WebhookCalled`, `RefreshPublished`, `Reloaded`, `ReloadFail`,
//! `RefreshFailed`, `WebhookFailed`; which, in [`crate::executors`]),
//! recorded off the delivery path and aggregated the way client-go's event
//! correlator does.
//!
//! Such an Event is a record for `kubectl describe`, not part of handling a
//! change: a refresh is done when its pods answered, whether or not the
//! Event about it was written. A coalesced refresh has one origin per
//! changed object (200 in a storm over 200 ConfigMaps), so writing its
//! Events in the delivery job made the next refresh of the same target and
//! every change it carried wait for up to 200 API round trips (measured:
//! 20,000 changes handled after 6.8-8.8 s, while their plugin calls were
//! done after 1.7 s).
//!
//! ## Aggregation
//!
//! Writing one Event object per change cost one API write per change (a
//! 4,000-change burst wrote ~3,900 Events, nearly doubling the API
//! server's cost per change). Instead, repeats of an Event on one object
//! become one Event whose `count` and `lastTimestamp` grow, as client-go's
//! `EventCorrelator` does (`tools/record/events_cache.go`): `kubectl get
//! events` lists it once (`-o wide` shows COUNT; `kubectl describe` and
//! `kubectl events` show `x2000 over 3s`).
//!
//! **The key** of an Event is its `involvedObject` (apiVersion, kind,
//! namespace, name, uid; not its resourceVersion, which changes with every
//! change, the very thing repeated), `type`, `reason`, the plugin (the
//! `wasmwatch.io/plugin` annotation) and the **message**; the reporting
//! component and instance are the [`KubeExecutor`]'s, one per recorder.
//! The message is part of the key, as in client-go's dedup key, because
//! the host's messages say *what* was done: `Reloaded` names the
//! object, `Refreshed` the Service and how many pods answered,
//! `WebhookCalled` the URL and status, failures their error. A workload
//! restarted for two ConfigMaps gets a `Reloaded` naming each; one Event
//! per message keeps both visible, where one Event with the latest
//! message would hide the other. Messages that vary every time (an error naming a
//! pod address) must not cost an Event each, so, like client-go's
//! `EventAggregator`, a *group* (the key without the message) holds at
//! most [`DEFAULT_MAX_MESSAGES`] (10) distinct messages within the window;
//! further ones all go to one Event of the group whose message is
//! [`COMBINED_PREFIX`] followed by the latest one. So an object costs at
//! most 11 Event objects per reason and plugin in 10 minutes, and in
//! practice one.
//!
//! **The window** is client-go's 10 minutes ([`DEFAULT_WINDOW`]): a repeat
//! within 10 minutes of the key's last occurrence adds to its Event (a
//! sliding window, so a steady repeat keeps one Event growing, as client-go
//! does; the API server's Event TTL restarts with each write); after 10
//! quiet minutes the next occurrence starts a new Event. What it remembers
//! per group (the Events written, the distinct messages) is bounded by an
//! LRU of [`DEFAULT_MAX_GROUPS`] (4096, client-go's) groups; a forgotten
//! group starts new Events.
//!
//! **Writes.** The first occurrence of a key is created at once (POST, with
//! `count` 1, `firstTimestamp` = `lastTimestamp` = when it happened). Later
//! occurrences are a JSON merge PATCH of the same Event: `count` (the new
//! total), `lastTimestamp` and `message` (client-go's fields). While a
//! write of a key is queued or in flight, further occurrences merge into
//! it (the count grows by one each) instead of queueing a write each. And
//! a key is written at most once per [`DEFAULT_MIN_INTERVAL`] (5 s): what
//! happens in between merges into one PATCH when the interval is over
//! (client-go's newer `tools/events` batches a series' updates the same
//! way, for up to 30 minutes). So a burst of N occurrences of one key costs
//! one POST plus one PATCH per 5 s of burst, not N writes; an occurrence
//! after a quiet interval is written at once. A PATCH answered 404 (the
//! Event expired or was deleted) creates a new Event for the occurrences it
//! carried; one answered 403 (RBAC without `patch` on events) does too,
//! and the recorder creates instead of patching for a window, with a
//! warning. A failed write (API server down) is logged and its count is
//! carried into the key's next write.
//!
//! Plugins' own `event` actions are not aggregated here: they are actions,
//! written by the pipeline with its retries ([`KubeExecutor::event`]).
//!
//! ## Never waiting
//!
//! [`EventRecorder::record`] never waits: it merges the occurrence into a
//! queued write, or queues a write of its key for a background task that
//! writes up to `concurrency` keys at once. The queue holds keys, at most
//! `capacity` (client-go's broadcaster queue is 1000 Events); when it is
//! full (the API server is slow or down, or a storm over more objects than
//! that outruns it) an occurrence of a key not yet queued is dropped and
//! counted; a warning names the dropped Event at the 1st, 2nd, 4th, 8th,
//! ... drop. Occurrences of queued keys are never dropped. Each Event
//! carries the times its occurrences were recorded, not written. At
//! shutdown the host waits a little for the queue
//! ([`EventRecorder::flush`], 500 ms, after the Lease is released), which
//! writes what the interval held back at once.
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::{Notify, Semaphore};
use wasmwatch_core::action::{EventType, WorkloadRef};

use crate::workload::KubeExecutor;
use crate::{ExecError, Origin};

/// Service `namespace/name` as an Event's involved object (`uid`: from the
/// lookups' cache; `kubectl describe service` finds Events by it).
pub fn service_reference(namespace: &str, name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        uid,
        resource_version: None,
        field_path: None,
    }
}

/// Keys queued for a write, as client-go's queue of 1000 Events.
pub const DEFAULT_CAPACITY: usize = 1000;
/// Keys written at once.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// A repeat within this long of the key's last occurrence adds to its
/// Event (client-go's 10 minutes).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(600);
/// A key is written at most once per this long; occurrences in between
/// merge into the next write.
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_secs(5);
/// Groups (an object, type, reason and plugin) remembered, as client-go's
/// LRU of 4096.
pub const DEFAULT_MAX_GROUPS: usize = 4096;
/// Distinct messages of a group within the window before further ones are
/// combined (client-go's 10).
pub const DEFAULT_MAX_MESSAGES: usize = 10;
/// The message prefix of the Event that combines a group's further
/// messages (client-go's).
pub const COMBINED_PREFIX: &str = "(combined from similar events): ";
/// kube-apiserver's limit on a new Event's message.
const MAX_MESSAGE: usize = 1024;

/// How an [`EventRecorder`] aggregates and writes; see the module docs.
#[derive(Debug, Clone)]
pub struct RecorderConfig {
    /// Keys queued for a write; an occurrence of another key is dropped
    /// beyond this.
    pub capacity: usize,
    /// Keys written at once.
    pub concurrency: usize,
    /// A repeat within this long of the key's last occurrence adds to its
    /// Event.
    pub window: Duration,
    /// A key is written at most once per this long.
    pub min_interval: Duration,
    /// Groups remembered (least recently used ones are forgotten first).
    pub max_groups: usize,
    /// Distinct messages of a group before further ones are combined.
    pub max_messages: usize,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        RecorderConfig {
            capacity: DEFAULT_CAPACITY,
            concurrency: DEFAULT_CONCURRENCY,
            window: DEFAULT_WINDOW,
            min_interval: DEFAULT_MIN_INTERVAL,
            max_groups: DEFAULT_MAX_GROUPS,
            max_messages: DEFAULT_MAX_MESSAGES,
        }
    }
}

/// An Event to create that stands for `count` occurrences, the first at
/// `first` and the last at `last` ([`KubeExecutor::create_event`]).
#[derive(Debug, Clone)]
pub struct NewEvent<'a> {
    pub object: &'a ObjectReference,
    /// The plugin the Event is about (its `wasmwatch.io/plugin` annotation).
    pub plugin: Option<&'a str>,
    pub event_type: EventType,
    pub reason: &'a str,
    pub message: &'a str,
    pub first: Timestamp,
    pub last: Timestamp,
    pub count: u32,
}

/// What a PATCH of an Event's count ([`KubeExecutor::patch_event`]) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventPatched {
    Patched,
    /// 404: the Event expired (the API server's Event TTL) or was deleted.
    NotFound,
    /// 403: not allowed to patch Events (the API server's message).
    Forbidden(String),
}

/// Writes Events in the background, aggregated; see the module docs.
pub struct EventRecorder {
    shared: Arc<Shared>,
    dropped: AtomicU64,
    on_drop: Box<dyn Fn() + Send + Sync>,
}

impl EventRecorder {
    /// Starts the writer task (in the current tokio runtime) with the
    /// default aggregation. `on_drop` is called for each dropped
    /// occurrence (a metric).
    pub fn start(
        kube: Arc<KubeExecutor>,
        capacity: usize,
        concurrency: usize,
        on_drop: impl Fn() + Send + Sync + 'static,
    ) -> EventRecorder {
        let config = RecorderConfig {
            capacity,
            concurrency,
            ..RecorderConfig::default()
        };
        EventRecorder::start_with(kube, config, on_drop)
    }

    /// [`EventRecorder::start`] with every setting.
    pub fn start_with(
        kube: Arc<KubeExecutor>,
        config: RecorderConfig,
        on_drop: impl Fn() + Send + Sync + 'static,
    ) -> EventRecorder {
        let config = RecorderConfig {
            capacity: config.capacity.max(1),
            concurrency: config.concurrency.max(1),
            max_groups: config.max_groups.max(1),
            ..config
        };
        let shared = Arc::new(Shared {
            kube,
            permits: Arc::new(Semaphore::new(config.concurrency)),
            config,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
        });
        tokio::spawn(writer(shared.clone()));
        EventRecorder {
            shared,
            dropped: AtomicU64::new(0),
            on_drop: Box::new(on_drop),
        }
    }

    /// Records an occurrence of an Event on `origin`'s object; false when
    /// it was dropped.
    pub fn record(
        &self,
        origin: &Origin,
        event_type: EventType,
        reason: &'static str,
        message: String,
    ) -> bool {
        let object = self.shared.kube.object_reference(origin);
        self.record_on(object, &origin.plugin, event_type, reason, message)
    }

    /// Records an occurrence of an Event on a workload (with its uid when
    /// the executor's `restart` saw it); false when it was dropped.
    pub fn record_workload(
        &self,
        workload: &WorkloadRef,
        event_type: EventType,
        reason: &'static str,
        message: String,
    ) -> bool {
        let object = self.shared.kube.workload_reference(workload);
        self.record_on(object, "", event_type, reason, message)
    }

    /// Records an occurrence of an Event on `object` (an app's Service,
    /// [`service_reference`]), aggregated per object, plugin and message;
    /// false when it was dropped.
    pub fn record_on(
        &self,
        object: ObjectReference,
        plugin: &str,
        event_type: EventType,
        reason: &'static str,
        message: String,
    ) -> bool {
        let at = Timestamp::now();
        let now = Instant::now();
        let (key, resource_version) = GroupKey::new(object, plugin, event_type, reason);
        let occurrence = Occurrence {
            at,
            message: cut_message(message),
            resource_version,
        };
        let admitted = {
            let mut state = self.shared.lock();
            (!state.stopped).then(|| state.admit(&self.shared.config, &key, occurrence, now))
        };
        let why = match admitted {
            Some(Admit::Merged) => return true,
            Some(Admit::Queued) => {
                self.shared.wake.notify_one();
                return true;
            }
            Some(Admit::Full) => "Event queue full",
            None => "Event writer stopped",
        };
        (self.on_drop)();
        let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                dropped = n,
                "{why}: not recording the {} Event on {} {}/{} ({n} dropped so far)",
                key.reason,
                key.kind,
                key.namespace,
                key.name
            );
        }
        false
    }

    /// Waits until every queued write is done (or failed), at most
    /// `within`, writing what the minimum interval holds back at once;
    /// true when none is left. For shutdown, after the leader Lease is
    /// released: Events recorded in the last moments are written rather
    /// than dropped with the process.
    pub async fn flush(&self, within: Duration) -> bool {
        struct Hurry<'a>(&'a Shared);
        impl Drop for Hurry<'_> {
            fn drop(&mut self) {
                self.0.lock().hurry -= 1;
            }
        }
        self.shared.lock().hurry += 1;
        let _hurry = Hurry(&self.shared);
        self.shared.wake.notify_one();
        let idle = async {
            while self.shared.lock().busy > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(within, idle).await.is_ok()
    }

    /// Occurrences dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for EventRecorder {
    /// The writer task writes what is queued, then ends.
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
    }
}

/// What the recorder and its writer task share.
struct Shared {
    kube: Arc<KubeExecutor>,
    config: RecorderConfig,
    state: Mutex<State>,
    /// Wakes the writer task: a key queued or due, a write done, flush,
    /// close.
    wake: Notify,
    permits: Arc<Semaphore>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One write of a key: what merged into it since its last write.
    async fn write(&self, job: Job) {
        let started = Instant::now();
        let taken = {
            let mut state = self.lock();
            let patch_refused = state.patch_refused_until.is_some_and(|t| t > started);
            let taken = state.slot_mut(&job).and_then(|slot| {
                let mut pending = slot.pending.take()?;
                if let Some((count, first)) = slot.carried.take() {
                    pending.count = pending.count.saturating_add(count);
                    pending.first = pending.first.min(first);
                }
                slot.in_flight = true;
                slot.last_write = Some(started);
                Some((pending, slot.written.clone(), patch_refused))
            });
            if taken.is_none() {
                // Not reached: a queued key keeps its slot and pending.
                state.busy = state.busy.saturating_sub(1);
            }
            taken
        };
        let Some((pending, written, patch_refused)) = taken else {
            self.wake.notify_one();
            return;
        };
        let outcome = self.deliver(&job.0, &pending, written, patch_refused).await;
        {
            let now = Instant::now();
            let mut state = self.lock();
            let interval = self.config.min_interval;
            let Some(slot) = state.slot_mut(&job) else {
                // Not reached: a slot in flight is never forgotten.
                state.busy = state.busy.saturating_sub(1);
                drop(state);
                self.wake.notify_one();
                return;
            };
            slot.in_flight = false;
            match outcome {
                Ok(written) => slot.written = Some(written),
                Err(e) => {
                    tracing::warn!(
                        occurrences = pending.count,
                        "cannot record the {} Event: {e} (its count is carried into the next write)",
                        job.0.reason
                    );
                    slot.carried = Some(match slot.carried {
                        Some((count, first)) => (
                            count.saturating_add(pending.count),
                            first.min(pending.first),
                        ),
                        None => (pending.count, pending.first),
                    });
                }
            }
            if slot.pending.is_some() {
                let due = started + interval;
                state.schedule(job, (due > now).then_some(due));
            } else {
                state.busy = state.busy.saturating_sub(1);
            }
        }
        self.wake.notify_one();
    }

    /// PATCHes the key's Event when there is one, else (or when it is
    /// gone, or patches are refused) creates one.
    async fn deliver(
        &self,
        key: &GroupKey,
        pending: &Pending,
        written: Option<Written>,
        patch_refused: bool,
    ) -> Result<Written, ExecError> {
        if let Some(w) = written.filter(|_| !patch_refused) {
            let count = w.count.saturating_add(pending.count);
            match self
                .kube
                .patch_event(
                    &key.namespace,
                    &w.name,
                    count,
                    pending.last,
                    &pending.message,
                )
                .await?
            {
                EventPatched::Patched => return Ok(Written { count, ..w }),
                EventPatched::NotFound => {
                    tracing::debug!(name = %w.name, "the Event to update is gone: creating a new one");
                }
                EventPatched::Forbidden(detail) => self.refuse_patches(&detail),
            }
        }
        let object = key.object(pending.resource_version.clone());
        let name = self
            .kube
            .create_event(&NewEvent {
                object: &object,
                plugin: Some(key.plugin.as_str()).filter(|p| !p.is_empty()),
                event_type: key.event_type(),
                reason: key.reason,
                message: &pending.message,
                first: pending.first,
                last: pending.last,
                count: pending.count,
            })
            .await?;
        Ok(Written {
            name,
            count: pending.count,
        })
    }

    /// A PATCH was refused (403): create new Events instead for a window.
    fn refuse_patches(&self, detail: &str) {
        let mut state = self.lock();
        let now = Instant::now();
        if state.patch_refused_until.is_none_or(|t| t <= now) {
            tracing::warn!(
                "cannot update Events (403: {detail}): writing a new Event for each repeat for {:?}; \
                 allow `patch` on events in wasmwatch's RBAC rules",
                self.config.window
            );
        }
        state.patch_refused_until = Some(now + self.config.window);
    }
}

/// The writer task: takes a free writer, then a queued key whose interval
/// is over (all of them while flushing or closing), and writes it.
async fn writer(shared: Arc<Shared>) {
    struct Stopped(Arc<Shared>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.lock().stopped = true;
        }
    }
    let _stopped = Stopped(shared.clone());
    loop {
        // A free writer first: the queue holds what waits for one.
        let permit = shared
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        let job = loop {
            let next_due = {
                let mut state = shared.lock();
                let next_due = state.promote(Instant::now());
                if let Some(job) = state.ready.pop_front() {
                    break Some(job);
                }
                if state.closed && state.busy == 0 {
                    break None;
                }
                next_due
            };
            match next_due {
                Some(due) => {
                    tokio::select! {
                        () = shared.wake.notified() => {}
                        () = tokio::time::sleep_until(due.into()) => {}
                    }
                }
                None => shared.wake.notified().await,
            }
        };
        let Some(job) = job else { break };
        let shared = shared.clone();
        tokio::spawn(async move {
            shared.write(job).await;
            drop(permit);
        });
    }
}

/// What an Event is keyed by, but its message: one group of Events.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupKey {
    api_version: String,
    kind: String,
    namespace: String,
    name: String,
    uid: String,
    /// `type` Warning (else Normal).
    warning: bool,
    reason: &'static str,
    /// Empty for none.
    plugin: String,
}

impl GroupKey {
    /// The key of an Event on `object`, and the object's resourceVersion
    /// (not part of the key).
    fn new(
        object: ObjectReference,
        plugin: &str,
        event_type: EventType,
        reason: &'static str,
    ) -> (GroupKey, Option<String>) {
        let key = GroupKey {
            api_version: object.api_version.unwrap_or_default(),
            kind: object.kind.unwrap_or_default(),
            namespace: object.namespace.unwrap_or_default(),
            name: object.name.unwrap_or_default(),
            uid: object.uid.unwrap_or_default(),
            warning: event_type == EventType::Warning,
            reason,
            plugin: plugin.to_string(),
        };
        (key, object.resource_version)
    }

    fn event_type(&self) -> EventType {
        if self.warning {
            EventType::Warning
        } else {
            EventType::Normal
        }
    }

    fn object(&self, resource_version: Option<String>) -> ObjectReference {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        ObjectReference {
            api_version: some(&self.api_version),
            kind: some(&self.kind),
            name: some(&self.name),
            namespace: some(&self.namespace),
            uid: some(&self.uid),
            resource_version,
            field_path: None,
        }
    }
}

/// Which Event of a group: one message's, or the combined one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MessageKey {
    /// A hash of the message.
    Exact(u64),
    Combined,
}

/// A key to write: its group and its Event in the group.
type Job = (Arc<GroupKey>, MessageKey);

/// One recorded occurrence.
struct Occurrence {
    at: Timestamp,
    message: String,
    /// The involved object's, at this occurrence.
    resource_version: Option<String>,
}

/// Occurrences of a key not written yet.
struct Pending {
    count: u32,
    first: Timestamp,
    last: Timestamp,
    /// The latest.
    message: String,
    /// The latest occurrence's, for a new Event's `involvedObject`.
    resource_version: Option<String>,
}

impl Pending {
    fn new(o: Occurrence) -> Pending {
        Pending {
            count: 1,
            first: o.at,
            last: o.at,
            message: o.message,
            resource_version: o.resource_version,
        }
    }

    fn merge(&mut self, o: Occurrence) {
        self.count = self.count.saturating_add(1);
        self.first = self.first.min(o.at);
        self.last = self.last.max(o.at);
        self.message = o.message;
        if o.resource_version.is_some() {
            self.resource_version = o.resource_version;
        }
    }
}

/// The Event a key wrote last.
#[derive(Debug, Clone)]
struct Written {
    name: String,
    /// Its `count` as written.
    count: u32,
}

/// One Event of a group (one key).
struct Slot {
    message: MessageKey,
    /// The last occurrence recorded.
    last_seen: Instant,
    /// When its last write started (the minimum interval runs from there).
    last_write: Option<Instant>,
    written: Option<Written>,
    pending: Option<Pending>,
    in_flight: bool,
    /// Occurrences whose write failed (count, first): added to the next.
    carried: Option<(u32, Timestamp)>,
}

impl Slot {
    fn new(message: MessageKey, now: Instant) -> Slot {
        Slot {
            message,
            last_seen: now,
            last_write: None,
            written: None,
            pending: None,
            in_flight: false,
            carried: None,
        }
    }

    /// Queued or being written: never forgotten.
    fn busy(&self) -> bool {
        self.pending.is_some() || self.in_flight
    }
}

/// The Events of one group (at most `max_messages` + 1).
#[derive(Default)]
struct Group {
    /// When it was last used (the LRU's clock).
    used: u64,
    slots: Vec<Slot>,
}

/// A key waiting for its minimum interval.
struct Delayed {
    due: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Delayed {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Delayed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

/// What [`State::admit`] did with an occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    /// Added to a write already queued or in flight.
    Merged,
    /// A write of its key was queued.
    Queued,
    /// The queue is full: dropped.
    Full,
}

#[derive(Default)]
struct State {
    groups: HashMap<Arc<GroupKey>, Group>,
    /// Keys to write now, in order.
    ready: VecDeque<Job>,
    /// Keys to write when their minimum interval is over.
    delayed: BinaryHeap<Reverse<Delayed>>,
    seq: u64,
    tick: u64,
    /// Keys queued or being written.
    busy: usize,
    /// Flushes running: write delayed keys now.
    hurry: usize,
    /// The recorder was dropped.
    closed: bool,
    /// The writer task ended (its runtime shut down).
    stopped: bool,
    /// PATCHes were refused (403): create instead until then.
    patch_refused_until: Option<Instant>,
}

impl State {
    /// Merges an occurrence into its key's queued write, or queues one.
    fn admit(
        &mut self,
        config: &RecorderConfig,
        key: &GroupKey,
        occurrence: Occurrence,
        now: Instant,
    ) -> Admit {
        let waiting = self.ready.len() + self.delayed.len();
        self.tick += 1;
        let tick = self.tick;
        let group_key = match self.groups.get_key_value(key) {
            Some((k, _)) => k.clone(),
            None => {
                if self.groups.len() >= config.max_groups {
                    self.evict(config.max_groups);
                }
                let k = Arc::new(key.clone());
                self.groups.insert(k.clone(), Group::default());
                k
            }
        };
        let group = self.groups.get_mut(key).expect("inserted");
        group.used = tick;
        // What the window let go is forgotten: a repeat starts a new Event.
        group
            .slots
            .retain(|s| s.busy() || now.duration_since(s.last_seen) <= config.window);
        let exact = MessageKey::Exact(message_key(&occurrence.message));
        let mut occurrence = occurrence;
        let (index, created) = match group.slots.iter().position(|s| s.message == exact) {
            Some(i) => (i, false),
            None => {
                let distinct = group
                    .slots
                    .iter()
                    .filter(|s| matches!(s.message, MessageKey::Exact(_)))
                    .count();
                let wanted = if distinct < config.max_messages {
                    exact
                } else {
                    occurrence.message =
                        cut_message(format!("{COMBINED_PREFIX}{}", occurrence.message));
                    MessageKey::Combined
                };
                match group.slots.iter().position(|s| s.message == wanted) {
                    Some(i) => (i, false),
                    None => {
                        group.slots.push(Slot::new(wanted, now));
                        (group.slots.len() - 1, true)
                    }
                }
            }
        };
        let slot = &mut group.slots[index];
        if let Some(pending) = &mut slot.pending {
            pending.merge(occurrence);
            slot.last_seen = now;
            return Admit::Merged;
        }
        if slot.in_flight {
            // Written when the write in flight is done.
            slot.pending = Some(Pending::new(occurrence));
            slot.last_seen = now;
            return Admit::Merged;
        }
        if waiting >= config.capacity {
            if created {
                group.slots.remove(index);
            }
            if group.slots.is_empty() {
                self.groups.remove(key);
            }
            return Admit::Full;
        }
        slot.pending = Some(Pending::new(occurrence));
        slot.last_seen = now;
        let due = slot
            .last_write
            .map(|t| t + config.min_interval)
            .filter(|due| *due > now);
        let job = (group_key, slot.message);
        self.busy += 1;
        self.schedule(job, due);
        Admit::Queued
    }

    fn schedule(&mut self, job: Job, due: Option<Instant>) {
        match due {
            None => self.ready.push_back(job),
            Some(due) => {
                self.seq += 1;
                self.delayed.push(Reverse(Delayed {
                    due,
                    seq: self.seq,
                    job,
                }));
            }
        }
    }

    /// Moves the delayed keys that are due (all of them while flushing or
    /// closing) to the ready queue; the next due time of the others.
    fn promote(&mut self, now: Instant) -> Option<Instant> {
        let all = self.hurry > 0 || self.closed;
        while let Some(Reverse(next)) = self.delayed.peek() {
            if !all && next.due > now {
                return Some(next.due);
            }
            let Reverse(next) = self.delayed.pop().expect("peeked");
            self.ready.push_back(next.job);
        }
        None
    }

    /// Forgets the least recently used quarter of the groups, never one
    /// with a write queued or in flight.
    fn evict(&mut self, max_groups: usize) {
        let mut idle: Vec<(u64, Arc<GroupKey>)> = self
            .groups
            .iter()
            .filter(|(_, g)| !g.slots.iter().any(Slot::busy))
            .map(|(k, g)| (g.used, k.clone()))
            .collect();
        idle.sort_unstable_by_key(|(used, _)| *used);
        for (_, key) in idle.into_iter().take((max_groups / 4).max(1)) {
            self.groups.remove(&key);
        }
    }

    fn slot_mut(&mut self, job: &Job) -> Option<&mut Slot> {
        self.groups
            .get_mut(&job.0)?
            .slots
            .iter_mut()
            .find(|s| s.message == job.1)
    }
}

/// A hash of a message, to key it without keeping it.
fn message_key(message: &str) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    message.hash(&mut hasher);
    hasher.finish()
}

/// The message within kube-apiserver's 1024 bytes (a cut one ends in `…`,
/// as [`KubeExecutor`] cuts them), so a queued one holds no more.
fn cut_message(message: String) -> String {
    if message.len() <= MAX_MESSAGE {
        return message;
    }
    let mark = "…";
    let mut end = MAX_MESSAGE - mark.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{mark}", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RecorderConfig {
        RecorderConfig {
            capacity: 4,
            max_groups: 8,
            max_messages: 3,
            ..RecorderConfig::default()
        }
    }

    fn key(name: &str, reason: &'static str) -> GroupKey {
        GroupKey {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: "shop".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            warning: false,
            reason,
            plugin: "p".into(),
        }
    }

    fn occurrence(message: &str) -> Occurrence {
        Occurrence {
            at: Timestamp::now(),
            message: message.into(),
            resource_version: Some("1".into()),
        }
    }

    /// Takes the next ready key as the writer does and ends its write.
    fn write_one(state: &mut State, name: &str) -> (Job, u32) {
        let job = state.ready.pop_front().expect("a ready key");
        let slot = state.slot_mut(&job).unwrap();
        let pending = slot.pending.take().unwrap();
        slot.written = Some(Written {
            name: name.into(),
            count: pending.count,
        });
        slot.last_write = Some(Instant::now());
        state.busy -= 1;
        (job, pending.count)
    }

    #[test]
    fn repeats_merge_into_one_queued_write() {
        let mut state = State::default();
        let now = Instant::now();
        let k = key("a", "Refreshed");
        assert_eq!(
            state.admit(&config(), &k, occurrence("m"), now),
            Admit::Queued
        );
        for _ in 0..999 {
            assert_eq!(
                state.admit(&config(), &k, occurrence("m"), now),
                Admit::Merged
            );
        }
        assert_eq!((state.ready.len(), state.busy), (1, 1));
        let (_, count) = write_one(&mut state, "a.1");
        assert_eq!(count, 1000);
        // Another reason, another object: other keys.
        let other = [key("a", "RefreshFailed"), key("b", "Refreshed")];
        for k in &other {
            assert_eq!(
                state.admit(&config(), k, occurrence("m"), now),
                Admit::Queued
            );
        }
        assert_eq!(state.ready.len(), 2);
    }

    #[test]
    fn a_repeat_within_the_interval_waits_and_flush_hurries_it() {
        let mut state = State::default();
        let now = Instant::now();
        let k = key("a", "Refreshed");
        state.admit(&config(), &k, occurrence("m"), now);
        write_one(&mut state, "a.1");
        assert_eq!(
            state.admit(&config(), &k, occurrence("m"), now),
            Admit::Queued
        );
        assert!(state.ready.is_empty());
        let due = state.promote(now).expect("delayed");
        assert!(due > now && due <= now + DEFAULT_MIN_INTERVAL + Duration::from_secs(1));
        assert_eq!(state.promote(due), None);
        assert_eq!(state.ready.len(), 1);
        // A flush writes at once.
        state.admit(&config(), &key("b", "Refreshed"), occurrence("m"), now);
        write_one(&mut state, "a.1");
        write_one(&mut state, "b.1");
        state.admit(&config(), &k, occurrence("m"), now);
        assert!(state.ready.is_empty());
        state.hurry = 1;
        assert_eq!(state.promote(now), None);
        assert_eq!(state.ready.len(), 1);
    }

    #[test]
    fn distinct_messages_beyond_the_limit_are_combined() {
        let mut state = State::default();
        let mut config = config();
        config.capacity = 100;
        let now = Instant::now();
        let k = key("a", "RefreshFailed");
        for i in 0..10 {
            state.admit(&config, &k, occurrence(&format!("error {i}")), now);
        }
        // Three own Events, then one combined.
        assert_eq!(state.ready.len(), 4);
        let slots = &state.groups[&k].slots;
        assert_eq!(slots.len(), 4);
        let combined = slots
            .iter()
            .find(|s| s.message == MessageKey::Combined)
            .unwrap();
        let pending = combined.pending.as_ref().unwrap();
        assert_eq!(pending.count, 7);
        assert_eq!(pending.message, format!("{COMBINED_PREFIX}error 9"));
        // A message seen before keeps its own Event.
        state.admit(&config, &k, occurrence("error 1"), now);
        let own = state.groups[&k]
            .slots
            .iter()
            .find(|s| s.message == MessageKey::Exact(message_key("error 1")))
            .unwrap();
        assert_eq!(own.pending.as_ref().unwrap().count, 2);
    }

    #[test]
    fn the_window_forgets_and_a_full_queue_drops_new_keys_only() {
        let mut state = State::default();
        let config = config();
        let now = Instant::now();
        let k = key("a", "Refreshed");
        state.admit(&config, &k, occurrence("m"), now);
        write_one(&mut state, "a.1");
        // After the window, the key starts over: no Event to patch.
        let later = now + DEFAULT_WINDOW + Duration::from_secs(1);
        assert_eq!(
            state.admit(&config, &k, occurrence("m"), later),
            Admit::Queued
        );
        let job = state.ready.front().unwrap().clone();
        assert!(state.slot_mut(&job).unwrap().written.is_none());
        // Fill the queue (4 keys), then only queued keys are taken.
        for name in ["b", "c", "d"] {
            assert_eq!(
                state.admit(&config, &key(name, "Refreshed"), occurrence("m"), later),
                Admit::Queued
            );
        }
        assert_eq!(
            state.admit(&config, &key("e", "Refreshed"), occurrence("m"), later),
            Admit::Full
        );
        assert!(!state.groups.contains_key(&key("e", "Refreshed")));
        assert_eq!(
            state.admit(&config, &key("b", "Refreshed"), occurrence("m"), later),
            Admit::Merged
        );
        assert_eq!(state.busy, 4);
    }

    #[test]
    fn the_lru_forgets_idle_groups_only() {
        let mut state = State::default();
        let mut config = config();
        config.capacity = 100;
        let now = Instant::now();
        // Group 0 stays queued; the others are written.
        state.admit(&config, &key("g0", "R"), occurrence("m"), now);
        for i in 1..8 {
            state.admit(&config, &key(&format!("g{i}"), "R"), occurrence("m"), now);
        }
        let queued = state.ready.pop_front().unwrap();
        while !state.ready.is_empty() {
            write_one(&mut state, "x");
        }
        state.ready.push_front(queued);
        // Use g1 again: g2 and g3 are the least recently used.
        state.admit(&config, &key("g1", "R"), occurrence("m"), now);
        state.admit(&config, &key("g8", "R"), occurrence("m"), now);
        assert!(state.groups.len() <= 8, "{}", state.groups.len());
        for kept in ["g0", "g1", "g8"] {
            assert!(state.groups.contains_key(&key(kept, "R")), "{kept}");
        }
        for gone in ["g2", "g3"] {
            assert!(!state.groups.contains_key(&key(gone, "R")), "{gone}");
        }
    }

    #[test]
    fn messages_are_cut_on_a_character_boundary() {
        let m = cut_message("é".repeat(1000));
        assert!(m.len() <= MAX_MESSAGE && m.ends_with('…'), "{}", m.len());
        assert_eq!(cut_message("short".into()), "short");
    }
}
