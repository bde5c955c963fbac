//! A checkpointed watch of one kind in one namespace (or all), as an
//! explicit state machine:
//!
//! ```text
//! Baseline ── list: the baseline ───────┐
//!                                       ▼
//! Start{from} ── read the version ─▶ Watch{from} ── events, bookmarks ──┐
//!   │ no stored index                ▲   ▲  │  ▲                        │
//!   └─▶ Rebuild{from} ── list: index ┘   │  │  └─ stream ended or idle ─┘
//!                                        │  │ 410 Gone (from the request
//!           watch from the list's version│  ▼ or the stream): gone()
//!                                    Relist{floor} (diff against the index)
//! errors anywhere: back off (exponential, jittered) and retry the state
//! ```
//!
//! Resuming from a checkpoint is a WATCH from that version: no list, no
//! synthetic ADDED storm; exactly the changes after it arrive. Without a
//! checkpoint, the first list is a baseline and delivers nothing. After a
//! 410 the loop lists and delivers only what differs from the
//! [`ObjectIndex`] of handled objects. Delivering every object (after
//! unreadable checkpoints) starts at `Relist`, against an empty index.
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ApiResource, DynamicObject, ListParams, WatchEvent, WatchParams};

use crate::apis::ObjectApi;
use tokio::sync::mpsc;
use wasmwatch_core::digest::DigestKey;
use wasmwatch_core::event::Metadata;
use wasmwatch_core::index::{ObjectIndex, Remember, Resync, Seen};
use wasmwatch_core::manifest::CustomKindSpec;
use wasmwatch_core::{ChangeEvent, ChangeType, ObjectKind, ObjectSnapshot, Scope};

/// What one watch loop watches.
#[derive(Debug, Clone)]
pub struct WatchTarget {
    pub kind: ObjectKind,
    pub scope: Scope,
    pub label_selector: Option<String>,
    /// A field selector for the list and the watch
    /// (`metadata.namespace!=a,...`: the manifest's `watch.ignoreNamespaces`).
    pub field_selector: Option<String>,
    /// Count label/annotation-only changes as modifications.
    pub metadata_changes: bool,
    /// Keys the digests of this kind's objects (Secrets; see
    /// `wasmwatch_core::digest`). `None`: plain SHA-256.
    pub digest_key: Option<DigestKey>,
    /// The labels and annotations the index keeps of each object (what the
    /// plugins of this kind declare they read; see `Remember`).
    pub remember: Arc<Remember>,
    /// For a custom kind: its resource and content (issue 34 §1).
    pub custom: Option<Arc<CustomKindSpec>>,
}

impl WatchTarget {
    /// An empty index for this target's objects.
    fn new_index(&self) -> ObjectIndex {
        ObjectIndex::new(self.kind)
            .with_digest_key(self.digest_key.clone())
            .with_remember(self.remember.clone())
    }
}

/// What the loop reports, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// A change to handle; the checkpoint may pass `resource_version` once it
    /// and everything before it are handled. `None`: a change without a
    /// version of its own (the delivery of every object after unreadable
    /// checkpoints), which only waits its turn.
    ///
    /// `event.replay` is set by the loop: the change happened while nobody
    /// led (see [`WatchLoop::new`]).
    Change {
        event: Box<ChangeEvent>,
        resource_version: Option<String>,
    },
    /// Nothing to handle up to this version (a bookmark, a baseline list, a
    /// resync's list version): the checkpoint may advance to it.
    ///
    /// `index_changed`: the loop's index changed without a change to
    /// deliver (a baseline or resync list, a label-only change): the
    /// checkpoint may pass it only together with an index that has it
    /// ([`crate::checkpoint::Progress::remembered`]).
    Progress {
        resource_version: String,
        index_changed: bool,
    },
    /// The loop's index of handled objects after everything reported
    /// before it; it may be stored once those changes are handled
    /// ([`crate::checkpoint::Progress::index`]). Sent after a list, and
    /// within `index_interval` of any change or `index_changed` progress
    /// (a checkpoint waits for it).
    Index(ObjectIndex),
}

/// Asks watch loops for their index at once (a leader stepping down; see
/// [`WatchLoop::with_flush`]). Not a `tokio::sync::watch`: that one wakes
/// its receivers in an order drawn at random, and the simulator must
/// replay a schedule exactly; a `Notify` wakes them in a fixed order.
#[derive(Clone, Default)]
pub struct Flush(std::sync::Arc<FlushShared>);

#[derive(Default)]
struct FlushShared {
    asked: std::sync::atomic::AtomicU64,
    notify: tokio::sync::Notify,
}

impl Flush {
    /// Every loop made `with_flush` this sends its index now.
    pub fn ask(&self) {
        self.0
            .asked
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    fn watcher(&self) -> FlushWatcher {
        FlushWatcher {
            flush: self.clone(),
            seen: self.0.asked.load(std::sync::atomic::Ordering::SeqCst),
        }
    }
}

/// One loop's view of a [`Flush`]: what it has answered.
struct FlushWatcher {
    flush: Flush,
    seen: u64,
}

impl FlushWatcher {
    /// Returns once asked since the last return.
    async fn asked(&mut self) {
        let shared = &self.flush.0;
        loop {
            let notified = shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now = shared.asked.load(std::sync::atomic::Ordering::SeqCst);
            if now > self.seen {
                self.seen = now;
                return;
            }
            notified.await;
        }
    }
}

/// How soon the index follows a creation: the creations of this moment
/// share one save (group commit) before their actions run.
pub const CREATION_INDEX_AFTER: Duration = Duration::from_millis(10);

/// How long a replay may pause before its held changes go out (see
/// [`WatchLoop::hold_replay`]).
pub const REPLAY_QUIET: Duration = Duration::from_millis(250);

/// Two changes of one object as one: the newer, with the keys both
/// changed; a creation if the older was one (and the object was not
/// deleted since).
fn fold(older: ChangeEvent, mut newer: ChangeEvent) -> ChangeEvent {
    let mut keys = older.changed_keys;
    keys.append(&mut newer.changed_keys);
    keys.sort();
    keys.dedup();
    newer.changed_keys = keys;
    if older.change == ChangeType::Added && newer.change == ChangeType::Modified {
        newer.change = ChangeType::Added;
    }
    newer
}

/// Counters of one loop, readable while it runs (for metrics).
#[derive(Debug, Default)]
pub struct WatchStats {
    /// Watch requests started again (stream ended, idle, error).
    pub restarts: std::sync::atomic::AtomicU64,
    /// Relists after 410 Gone.
    pub resyncs: std::sync::atomic::AtomicU64,
}

/// The loop's state. A step that fails leaves the state it got to, to be
/// retried after a backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// No checkpoint: list and take the result as the baseline (it
    /// delivers nothing), then watch live from the list's version.
    Baseline,
    /// Resuming from the checkpoint `from`, before the first watch: read
    /// the collection's version (the changes up to it happened while
    /// nobody led: replays), then rebuild the index first if
    /// `rebuild_index` (no stored index: see [`WatchLoop::with_index`]),
    /// and watch.
    Start { from: String, rebuild_index: bool },
    /// Resuming without a stored index, the version read: list to rebuild
    /// the index, then watch (a rebuild that failed is retried without
    /// reading the version again).
    Rebuild {
        from: String,
        replay_until: Option<u64>,
    },
    /// Watch from a version.
    Watch(Watch),
    /// The history is gone: list and deliver only real differences.
    Relist(Relist),
}

/// [`State::Watch`]: a watch to start, or to resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    /// The checkpoint, a list's version, or the last version the previous
    /// watch of this loop handed out (a stream that ended, went idle or
    /// failed resumes from what it reached, not from its start: the index
    /// has moved on).
    pub from: String,
    /// Which changes are replays of what happened while nobody led (they
    /// reach the plugins with `replay` set): resuming from a checkpoint,
    /// the changes up to the collection's version when the loop started,
    /// and a resync's differences until the first live change, which ends
    /// the replay. `None`: none (a loop that started live, a replay over,
    /// or versions that are not numbers).
    pub replay_until: Option<u64>,
    /// 410s without an event in between (the relist between two of them
    /// does not count as one): from the second on, the relist waits a
    /// backoff first.
    pub gone_in_a_row: u32,
}

impl Watch {
    /// A watch from `from`, no 410 before it.
    fn at(from: String, replay_until: Option<u64>) -> Watch {
        Watch {
            from,
            replay_until,
            gone_in_a_row: 0,
        }
    }
}

/// [`State::Relist`]: a relist after a 410, or the delivery of every
/// object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relist {
    /// The last version handed out before the history was lost (or older,
    /// when replays were held: see `WatchLoop::gone`): the differences
    /// carry it, and an object written after it is delivered even when it
    /// equals the index.
    /// `None`: the differences carry the list's version.
    pub floor: Option<String>,
    /// 410s without an event in between, the one that led here included
    /// (the watch after the relist goes on counting).
    pub gone_in_a_row: u32,
    /// Deliver every object, as a replay and without a version (a relist
    /// against an empty index; see [`WatchLoop::deliver_all`]); the watch
    /// after it is live.
    pub deliver_all: bool,
    /// As [`Watch::replay_until`].
    pub replay_until: Option<u64>,
}

/// The watch loop for one target. `A`: the collection's API (kube's, or
/// the simulator's; see [`crate::apis`]).
pub struct WatchLoop<A = crate::parsed::Collection> {
    api: A,
    target: WatchTarget,
    index: ObjectIndex,
    state: State,
    /// Consecutive failures, for backoff.
    failures: u32,
    /// Server-side timeout of one watch request.
    pub watch_timeout: Duration,
    /// Client-side: a watch silent this long is abandoned and resumed.
    pub idle_timeout: Duration,
    /// How often, at most, the index is sent while it changes.
    pub index_interval: Duration,
    /// The index changed since it was last sent.
    index_dirty: bool,
    index_sent: tokio::time::Instant,
    /// A creation sent since the index was last sent: the index follows
    /// within [`CREATION_INDEX_AFTER`] (the term holds a creation's
    /// actions until an index with its object is stored).
    created_at: Option<tokio::time::Instant>,
    /// Asks for the index now (a leader stepping down sends its last
    /// save with an index taken after everything it handled).
    flush: Option<FlushWatcher>,
    stats: std::sync::Arc<WatchStats>,
    /// A watch request was made before (the next one is a restart).
    watched: bool,
    /// Replayed changes held until the replay is over, the newest per
    /// object (see [`WatchLoop::hold_replay`]), by version. Only while
    /// watching: a 410 drops them ([`WatchLoop::gone`]), and no other
    /// state starts with any.
    replays: std::collections::BTreeMap<(String, String), (u64, ChangeEvent, String)>,
    /// When held replays go out if nothing more comes.
    replay_quiet: Option<tokio::time::Instant>,
    /// The stored index this loop resumed with, as the state trusts it
    /// (see [`WatchLoop::trusting`]); until the watch passes `at`, or a
    /// relist has read every object.
    trusted: Option<Trusted>,
    /// Once the watch reaches this version, every object of the index is
    /// verified (see [`ObjectIndex::mark_verified`]).
    verify_at: Option<u64>,
}

/// What the state says of a stored index (issue 33): it was taken when
/// its watch had got to `at`, and every object but `unhandled` had then
/// reached the apps as stored (the changes of `unhandled` were still in
/// their turns, retries or pipeline).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trusted {
    pub at: u64,
    pub unhandled: std::collections::BTreeSet<(String, String)>,
}

/// Objects per list page. kube-rs's watcher and client-go's reflector ask
/// for 500, and 250 makes a 10,000-object list take 40 round trips, but
/// 500 was measured to cost memory: `bench memory` (10,000 ConfigMaps of
/// 10 KiB, release) gave RSS 96 MiB with 500 against 76-77 MiB with 250
/// (2026-12-05): a page is held parsed, twice the 10 KiB objects at once.
const LIST_PAGE: u32 = 250;

/// Why one step failed. All are retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("api: {0}")]
    Api(#[from] kube::Error),
    #[error("the consumer of the watch loop is gone")]
    Closed,
}

fn api_resource(target: &WatchTarget) -> ApiResource {
    match (target.kind, &target.custom) {
        (ObjectKind::ConfigMap, _) => ApiResource::erase::<ConfigMap>(&()),
        (ObjectKind::Secret, _) => ApiResource::erase::<Secret>(&()),
        (ObjectKind::Custom(k), spec) => {
            let gvk = kube::api::GroupVersionKind::gvk(k.group(), k.version(), k.kind());
            match spec.as_ref().and_then(|s| s.plural.as_deref()) {
                Some(plural) => ApiResource::from_gvk_with_plural(&gvk, plural),
                None => ApiResource::from_gvk(&gvk),
            }
        }
    }
}

impl WatchLoop {
    /// A loop that resumes from `checkpoint`, or takes a baseline without one.
    ///
    /// Resuming, the loop first reads the collection's current version: the
    /// changes up to it happened while nobody led, and so do the
    /// differences of a resync before the first live change; they come out
    /// with `replay` set.
    pub fn new(client: kube::Client, target: WatchTarget, checkpoint: Option<String>) -> WatchLoop {
        let ar = api_resource(&target);
        let api = crate::parsed::Collection::new(client, target.scope.namespace(), &ar);
        WatchLoop::with_api(api, target, checkpoint)
    }

    /// A loop that lists first and delivers every object as changed (a
    /// resync against an empty index), then watches: for a kind whose
    /// checkpoints could not be read, where nobody can tell which changes
    /// were handled.
    pub fn deliver_all(client: kube::Client, target: WatchTarget) -> WatchLoop {
        WatchLoop::new(client, target, None).delivering_all()
    }
}

impl<A: ObjectApi> WatchLoop<A> {
    /// [`WatchLoop::new`] on the collection API `api` (`target`'s kind and
    /// scope).
    pub fn with_api(api: A, target: WatchTarget, checkpoint: Option<String>) -> WatchLoop<A> {
        WatchLoop {
            api,
            index: target.new_index(),
            target,
            state: match checkpoint {
                Some(from) => State::Start {
                    from,
                    rebuild_index: true,
                },
                None => State::Baseline,
            },
            failures: 0,
            watch_timeout: Duration::from_secs(290),
            idle_timeout: Duration::from_secs(320),
            index_interval: Duration::from_secs(5),
            index_dirty: false,
            index_sent: tokio::time::Instant::now(),
            created_at: None,
            flush: None,
            stats: Default::default(),
            watched: false,
            replays: Default::default(),
            replay_quiet: None,
            trusted: None,
            verify_at: None,
        }
    }

    /// This loop (made without a checkpoint) as [`WatchLoop::deliver_all`].
    pub fn delivering_all(mut self) -> WatchLoop<A> {
        self.state = State::Relist(Relist {
            floor: None,
            gone_in_a_row: 0,
            deliver_all: true,
            replay_until: None,
        });
        self
    }

    /// Holds a replayed change of the watch's history (issue 32: a replay
    /// must never move an app backwards). The predecessor may have
    /// delivered any change up to the version the replay runs to, so the
    /// replay hands out only each object's newest change of it: its
    /// changed keys, all of the object's held changes' together; a
    /// creation, if it was one. Held changes go out, in version order, at
    /// the first change or bookmark past the replay, when the loop is
    /// asked for its index (stepping down), or once nothing more came for
    /// [`REPLAY_QUIET`] (the server sends its history at once, so a later
    /// change of the same object is newer than all of it). Until then no
    /// progress and no index goes out (either would pass them), and a
    /// watch that ends goes on holding them (the rest of the history
    /// follows on the next one); a 410 drops them for the relist (see
    /// [`WatchLoop::gone`]).
    fn hold_replay(&mut self, event: ChangeEvent, resource_version: String) {
        let key = (event.object.namespace.clone(), event.object.name.clone());
        let at = resource_version.parse::<u64>().unwrap_or(u64::MAX);
        let event = match self.replays.remove(&key) {
            None => event,
            Some((_, older, _)) => fold(older, event),
        };
        self.replays.insert(key, (at, event, resource_version));
        self.replay_quiet = Some(tokio::time::Instant::now() + REPLAY_QUIET);
    }

    /// The history is gone (a 410, refusing the watch request or as an
    /// ERROR event on its stream): relist from the last version the watch
    /// handed out.
    ///
    /// The history is gone while a replay is held: its changes are not
    /// handed out, and the relist hands out the held objects' current
    /// state instead (it delivers whatever was written after its floor,
    /// which goes back to before the oldest held change). The index has
    /// the held changes' objects already, so without the lower floor they
    /// would look handled.
    fn gone(&mut self, watch: Watch) -> Relist {
        tracing::info!(kind = self.target.kind.as_str(), from = %watch.from, "watch history expired; resynchronising");
        self.replay_quiet = None;
        let oldest = self.replays.values().map(|(at, _, _)| *at).min();
        self.replays.clear();
        let floor = match oldest {
            Some(oldest) => oldest.saturating_sub(1).to_string(),
            None => watch.from,
        };
        Relist {
            floor: Some(floor),
            gone_in_a_row: watch.gone_in_a_row + 1,
            deliver_all: false,
            replay_until: watch.replay_until,
        }
    }

    /// Sends the held replays (see [`WatchLoop::hold_replay`]).
    async fn flush_replays(&mut self, out: &mpsc::Sender<Output>) -> Result<(), WatchError> {
        self.replay_quiet = None;
        if self.replays.is_empty() {
            return Ok(());
        }
        let mut held: Vec<_> = std::mem::take(&mut self.replays).into_values().collect();
        held.sort_by_key(|(at, _, _)| *at);
        for (_, event, rv) in held {
            if event.change == ChangeType::Added {
                self.created_at
                    .get_or_insert_with(tokio::time::Instant::now);
            }
            self.send_marked(out, event, Some(rv)).await?;
        }
        Ok(())
    }

    /// Sends a change whose `replay` is set.
    async fn send_marked(
        &mut self,
        out: &mpsc::Sender<Output>,
        event: ChangeEvent,
        resource_version: Option<String>,
    ) -> Result<(), WatchError> {
        send(
            out,
            Output::Change {
                event: Box::new(event),
                resource_version,
            },
        )
        .await
    }

    /// The collection's current resourceVersion (a list of one item): a new
    /// leader marks the changes up to it as replays of what happened while
    /// nobody led.
    async fn current_version(&self) -> Result<String, WatchError> {
        let mut lp = ListParams::default().limit(1);
        if let Some(sel) = &self.target.label_selector {
            lp = lp.labels(sel);
        }
        if let Some(sel) = &self.target.field_selector {
            lp = lp.fields(sel);
        }
        let list = self.api.list_metadata(&lp).await?;
        Ok(list.metadata.resource_version.unwrap_or_default())
    }

    /// The loop's counters.
    /// Sends the index at once whenever `flush` is signalled while the
    /// loop watches.
    pub fn with_flush(mut self, flush: &Flush) -> WatchLoop<A> {
        self.flush = Some(flush.watcher());
        self
    }

    pub fn stats(&self) -> std::sync::Arc<WatchStats> {
        self.stats.clone()
    }

    /// Starts from the index of objects handled before (stored by an
    /// earlier leader) instead of an empty one, so that a resync after a
    /// 410 delivers only what differs from it.
    ///
    /// Resuming from a checkpoint, the stored objects are marked unverified
    /// (see [`ObjectIndex::mark_unverified`]): the stored index may be ahead
    /// of the checkpoint (a crash between the shard writes and the state
    /// write), so a replayed event equal to it may still be unhandled.
    ///
    /// Without a checkpoint the loop takes a baseline, which lists every
    /// object anyway: a stored index is not used then (objects deleted since
    /// it was stored would stay in it and come out as deletions at the next
    /// relist).
    ///
    /// A loop resuming from a checkpoint without a stored index (none was
    /// stored, it was set aside as unreadable, or the stored one has no part
    /// for this stream) rebuilds one first from a list, delivering nothing,
    /// and sends it (`Output::Index`) before anything else: without it, a
    /// later 410 relist would deliver every object as added and miss the
    /// deletions of the gap. Its objects start unverified too: the list is
    /// newer than the checkpoint. What it cannot give: a deletion between
    /// the checkpoint and the list is seen only by the watch's replay (lost
    /// if the history is gone already), and an object created in that span
    /// comes out of a relist as `resynced`, not `added`.
    pub fn with_index(mut self, mut index: ObjectIndex) -> WatchLoop<A> {
        if let State::Start { rebuild_index, .. } = &mut self.state {
            index.mark_unverified();
            self.index = index
                .with_digest_key(self.target.digest_key.clone())
                .with_remember(self.target.remember.clone());
            *rebuild_index = false;
        }
        self
    }

    /// The stored index given to [`WatchLoop::with_index`] is trusted as
    /// the state says (issue 33): only `trusted.unhandled` start
    /// unverified, and a replayed change up to `trusted.at` of any other
    /// object is skipped: the index has it already, and its apps had it
    /// (a SIGTERM handover replays only what was not handled). Why that
    /// holds: every change up to `at` is in the index, and the ones not
    /// handled when the state was stored are `unhandled`'s; a change after
    /// `at` compares with the index's content as usual.
    pub fn trusting(mut self, trusted: Trusted) -> WatchLoop<A> {
        if let State::Start {
            rebuild_index: false,
            ..
        } = &self.state
        {
            self.index.mark_unverified_only(&trusted.unhandled);
            self.trusted = Some(trusted);
        }
        self
    }

    /// Whether the change of `key` at `rv` is one a trusted stored index
    /// has as handled (see [`WatchLoop::trusting`]). Past `at` nothing is.
    fn trusted_handled(&mut self, key: &(String, String), rv: &str) -> bool {
        let Some(t) = &self.trusted else {
            return false;
        };
        match rv.parse::<u64>() {
            Ok(v) if v <= t.at => !t.unhandled.contains(key),
            _ => {
                self.trusted = None;
                false
            }
        }
    }

    /// The watch got to `rv`: past where the replay of a resumed (or
    /// rebuilt) index runs, every object of the index is verified: one
    /// with no change since the checkpoint was handled before it.
    fn reached(&mut self, rv: &str) {
        if let (Some(at), Ok(v)) = (self.verify_at, rv.parse::<u64>())
            && v >= at
        {
            self.index.mark_verified();
            self.verify_at = None;
        }
    }

    async fn send_index(&mut self, out: &mpsc::Sender<Output>) -> Result<(), WatchError> {
        // The index has the held replays' objects: they go first.
        self.flush_replays(out).await?;
        self.index_dirty = false;
        self.created_at = None;
        self.index_sent = tokio::time::Instant::now();
        send(out, Output::Index(self.index.clone())).await
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// The object as plugins see it, and its resourceVersion. Read from
    /// kube's parse of the body, moving its strings (it was copied into a
    /// JSON value and read from that, two copies of every value).
    fn snapshot(&self, obj: DynamicObject) -> Option<(ObjectSnapshot, String)> {
        let m = obj.metadata;
        let rv = m.resource_version.unwrap_or_default();
        let name = m.name.unwrap_or_default();
        let meta = Metadata {
            name: name.clone(),
            namespace: m.namespace.unwrap_or_default(),
            uid: m.uid.unwrap_or_default(),
            resource_version: rv.clone(),
            labels: m.labels.unwrap_or_default(),
            annotations: m.annotations.unwrap_or_default(),
        };
        let read = match &self.target.custom {
            Some(spec) => {
                ObjectSnapshot::from_content(self.target.kind, meta, &obj.data, &spec.content)
            }
            None => ObjectSnapshot::from_parts(self.target.kind, meta, obj.data),
        };
        match read {
            Ok(s) => Some((s, rv)),
            Err(e) => {
                tracing::warn!(kind = self.target.kind.as_str(), %name, "skipping unreadable object: {e}");
                None
            }
        }
    }

    /// One page of the list (`LIST_PAGE` objects): its objects, the list's
    /// resourceVersion, and the token of the next page if any. Paging keeps
    /// a large collection (10,000 objects of 10 KiB) from ever being in
    /// memory at once.
    async fn list_page(
        &self,
        token: Option<String>,
    ) -> Result<(Vec<ObjectSnapshot>, String, Option<String>), WatchError> {
        let mut lp = ListParams::default().limit(LIST_PAGE);
        if let Some(sel) = &self.target.label_selector {
            lp = lp.labels(sel);
        }
        if let Some(sel) = &self.target.field_selector {
            lp = lp.fields(sel);
        }
        if let Some(t) = token {
            lp = lp.continue_token(&t);
        }
        let list = self.api.list(&lp).await?;
        let rv = list.metadata.resource_version.clone().unwrap_or_default();
        let next = list.metadata.continue_.clone().filter(|t| !t.is_empty());
        let objects = list
            .items
            .into_iter()
            .filter_map(|o| self.snapshot(o).map(|(s, _)| s))
            .collect();
        Ok((objects, rv, next))
    }

    /// Lists every object into the index, delivering nothing (a baseline,
    /// a rebuilt index); returns the list's version.
    async fn list_into_index(&mut self) -> Result<String, WatchError> {
        let mut token = None;
        loop {
            let (objects, rv, next) = self.list_page(token).await?;
            for o in objects {
                self.index
                    .apply(Seen::Added, o, self.target.metadata_changes);
            }
            match next {
                Some(t) => token = Some(t),
                None => return Ok(rv),
            }
        }
    }

    /// One step of the state machine: a baseline, a watch or a relist (a
    /// start goes straight on to its first watch). Returns when the state
    /// changed or the stream ended; outputs are sent as they come.
    pub async fn step(&mut self, out: &mpsc::Sender<Output>) -> Result<(), WatchError> {
        loop {
            match self.state.clone() {
                State::Baseline => return self.baseline(out).await,
                State::Start {
                    from,
                    rebuild_index,
                } => self.start(from, rebuild_index).await?,
                State::Rebuild { from, replay_until } => {
                    self.rebuild(out, from, replay_until).await?
                }
                State::Watch(watch) => return self.watch(out, watch).await,
                State::Relist(relist) => return self.relist(out, relist).await,
            }
        }
    }

    /// [`State::Baseline`]: the list delivers nothing; its version and the
    /// index go out.
    async fn baseline(&mut self, out: &mpsc::Sender<Output>) -> Result<(), WatchError> {
        let rv = self.list_into_index().await?;
        self.send_listed(out, &rv).await?;
        self.state = State::Watch(Watch::at(rv, None));
        Ok(())
    }

    /// [`State::Start`]: reads where the replay ends.
    async fn start(&mut self, from: String, rebuild_index: bool) -> Result<(), WatchError> {
        // Not a number (another server's versions): nothing can be told
        // apart, so nothing is marked.
        let replay_until = self.current_version().await?.parse::<u64>().ok();
        if !rebuild_index {
            self.verify_at = replay_until;
        }
        self.state = if rebuild_index {
            State::Rebuild { from, replay_until }
        } else {
            State::Watch(Watch::at(from, replay_until))
        };
        Ok(())
    }

    /// [`State::Rebuild`]: lists into a new index, delivering nothing, and
    /// sends it before anything else.
    async fn rebuild(
        &mut self,
        out: &mpsc::Sender<Output>,
        from: String,
        replay_until: Option<u64>,
    ) -> Result<(), WatchError> {
        self.index = self.target.new_index();
        let listed = self.list_into_index().await?;
        self.index.mark_unverified();
        // The list is newer than the replay's end: changes up to it may
        // still come, each its object's first since the checkpoint.
        self.verify_at = listed.parse().ok();
        tracing::info!(
            kind = self.target.kind.as_str(),
            objects = self.index.len(),
            "no stored index to resume with: rebuilt it from a list"
        );
        self.state = State::Watch(Watch::at(from, replay_until));
        self.send_index(out).await
    }

    /// After a list: its version (the index changed with it), then the
    /// index.
    async fn send_listed(
        &mut self,
        out: &mpsc::Sender<Output>,
        rv: &str,
    ) -> Result<(), WatchError> {
        send(
            out,
            Output::Progress {
                resource_version: rv.to_string(),
                index_changed: true,
            },
        )
        .await?;
        self.send_index(out).await
    }

    /// [`State::Relist`]: delivers what differs from the index, then the
    /// list's version and the index; the watch goes on from that version.
    async fn relist(
        &mut self,
        out: &mpsc::Sender<Output>,
        mut relist: Relist,
    ) -> Result<(), WatchError> {
        self.stats
            .resyncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let rv = match self.resync(out, &mut relist).await {
            Ok(rv) => rv,
            Err(e) => {
                // Retried at the same floor; a replay it ended stays over.
                self.state = State::Relist(relist);
                return Err(e);
            }
        };
        // The index has the list now: nothing of it is taken on trust.
        self.trusted = None;
        self.send_listed(out, &rv).await?;
        // After delivering every object, `replay_until` is `None`: live.
        self.state = State::Watch(Watch {
            from: rv,
            replay_until: relist.replay_until,
            gone_in_a_row: relist.gone_in_a_row,
        });
        Ok(())
    }

    /// The relist's list, page by page, against the index: hands out the
    /// differences and returns the list's version.
    async fn resync(
        &mut self,
        out: &mpsc::Sender<Output>,
        relist: &mut Relist,
    ) -> Result<String, WatchError> {
        // The differences are handed out at the version the history
        // was lost from, not at the list's: the checkpoint must not
        // pass the relist before all of it is handed out (a new
        // leader would resume after it and miss the rest).
        let mut resync = Resync::new(self.target.metadata_changes);
        if let Some(floor) = &relist.floor {
            resync = resync.after(floor);
        }
        if let Some(t) = &self.trusted {
            resync = resync.trusting(t.at, &t.unhandled);
        }
        // Delivering every object: the changes have no version (the
        // checkpoint appears with the progress after the last one).
        let versioned = !relist.deliver_all;
        let mut token = None;
        let rv = loop {
            let (objects, rv, next) = self.list_page(token).await?;
            let at = relist.floor.clone().unwrap_or_else(|| rv.clone());
            for event in self.index.resync_page(&mut resync, objects) {
                self.send_relisted(out, relist, event, versioned.then(|| at.clone()))
                    .await?;
            }
            match next {
                Some(t) => token = Some(t),
                None => break rv,
            }
        };
        let at = relist.floor.clone().unwrap_or_else(|| rv.clone());
        for event in self.index.finish_resync(resync) {
            self.send_relisted(out, relist, event, versioned.then(|| at.clone()))
                .await?;
        }
        Ok(rv)
    }

    /// Sends a difference of a relist, marked as a replay: every object
    /// delivered after unreadable checkpoints is one, else see
    /// [`replayed`].
    async fn send_relisted(
        &mut self,
        out: &mpsc::Sender<Output>,
        relist: &mut Relist,
        mut event: ChangeEvent,
        resource_version: Option<String>,
    ) -> Result<(), WatchError> {
        event.replay = relist.deliver_all
            || replayed(
                &mut relist.replay_until,
                &event,
                resource_version.as_deref(),
            );
        self.send_marked(out, event, resource_version).await
    }

    /// [`State::Watch`]: one watch request and its stream. Its end, an
    /// idle stream or an error resume from what the watch reached (a
    /// replay held goes on being held: the rest of it follows on the next
    /// watch); a 410 relists.
    async fn watch(
        &mut self,
        out: &mpsc::Sender<Output>,
        mut watch: Watch,
    ) -> Result<(), WatchError> {
        match self.follow(out, &mut watch).await {
            Ok(Ended::Gone) => {
                let relist = self.gone(watch);
                let in_a_row = relist.gone_in_a_row;
                self.state = State::Relist(relist);
                // A 410 again right after a relist (no event in
                // between) must not spin list+watch: back off.
                if in_a_row > 1 {
                    tokio::time::sleep(backoff(in_a_row - 1)).await;
                }
                Ok(())
            }
            ended => {
                self.state = State::Watch(watch);
                ended.map(|_| ())
            }
        }
    }

    /// Watches from `watch.from` until the stream ends (`watch.from` then
    /// is the last version it handed out) or the history is gone.
    async fn follow(
        &mut self,
        out: &mpsc::Sender<Output>,
        watch: &mut Watch,
    ) -> Result<Ended, WatchError> {
        if std::mem::replace(&mut self.watched, true) {
            self.stats
                .restarts
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let mut wp = WatchParams::default().timeout(self.watch_timeout.as_secs() as u32);
        wp.bookmarks = true;
        if let Some(sel) = &self.target.label_selector {
            wp = wp.labels(sel);
        }
        if let Some(sel) = &self.target.field_selector {
            wp = wp.fields(sel);
        }
        let mut stream = match self.api.watch(&wp, &watch.from).await {
            Ok(stream) => stream,
            // Some servers refuse a too-old version with an HTTP 410
            // instead of an ERROR event: the same resync.
            Err(kube::Error::Api(status)) if status.code == 410 => return Ok(Ended::Gone),
            Err(e) => return Err(e.into()),
        };
        // A replay held across a reconnection waits for the rest of
        // the history from this new watch.
        if self.replay_quiet.is_some() {
            self.replay_quiet = Some(tokio::time::Instant::now() + REPLAY_QUIET);
        }
        let mut last_event = tokio::time::Instant::now();
        while let Some(event) = self.next_event(out, &mut stream, last_event).await? {
            last_event = tokio::time::Instant::now();
            let gone = self.on_event(out, watch, event).await?;
            if gone {
                return Ok(Ended::Gone);
            }
        }
        Ok(Ended::Stream)
    }

    /// The stream's next event; `None` once it ended, or stayed silent for
    /// the idle timeout since `last_event`. Meanwhile held replays go out
    /// once quiet, and the index when it is due or asked for.
    async fn next_event(
        &mut self,
        out: &mpsc::Sender<Output>,
        stream: &mut Events,
        last_event: tokio::time::Instant,
    ) -> Result<Option<WatchEvent<DynamicObject>>, WatchError> {
        // A stream that stays silent longer than this is dead (the server
        // sends bookmarks and ends streams at its timeout): resume rather
        // than wait forever.
        let idle = self.idle_timeout;
        let idle_at = last_event + idle;
        loop {
            let wake = self.wake(idle_at);
            let flush = async {
                match self.flush.as_mut() {
                    Some(f) => f.asked().await,
                    None => std::future::pending().await,
                }
            };
            // Biased: the same schedule picks the same branch (the
            // simulator replays a seed exactly).
            let next = tokio::select! {
                biased;
                () = flush => None,
                next = tokio::time::timeout_at(wake, stream.try_next()) => Some(next),
            };
            let Some(next) = next else {
                self.send_index(out).await?;
                continue;
            };
            match next {
                Ok(next) => return next.map_err(WatchError::from),
                Err(_) if tokio::time::Instant::now() < idle_at => self.woke(out).await?,
                Err(_) => {
                    tracing::warn!(
                        kind = self.target.kind.as_str(),
                        "watch idle for {idle:?}; resuming"
                    );
                    return Ok(None);
                }
            }
        }
    }

    /// When a watch waiting for an event must wake up without one: at
    /// `idle_at`, at the end of a held replay, or when the index is due.
    fn wake(&self, idle_at: tokio::time::Instant) -> tokio::time::Instant {
        let mut wake = idle_at;
        match self.replay_quiet {
            // While a replay is held no index goes out: only its end is
            // due.
            Some(at) => wake = wake.min(at),
            None => {
                if self.index_dirty {
                    wake = wake.min(self.index_sent + self.index_interval);
                }
                if let Some(at) = self.created_at {
                    wake = wake.min(at + CREATION_INDEX_AFTER);
                }
            }
        }
        wake
    }

    /// A watch woke without an event before its idle timeout (see
    /// [`WatchLoop::wake`]).
    async fn woke(&mut self, out: &mpsc::Sender<Output>) -> Result<(), WatchError> {
        let now = tokio::time::Instant::now();
        if self.replay_quiet.is_some_and(|q| q <= now) {
            // The replay went quiet: its changes go.
            self.flush_replays(out).await?;
        }
        // The index is due: send it while the watch waits (not while a
        // replay is held: it has the held changes' objects).
        let due = (self.index_dirty && now >= self.index_sent + self.index_interval)
            || self
                .created_at
                .is_some_and(|t| now >= t + CREATION_INDEX_AFTER);
        if due && self.replays.is_empty() {
            self.send_index(out).await?;
        }
        Ok(())
    }

    /// One event of the watch's stream; `true`: the history is gone (a 410).
    async fn on_event(
        &mut self,
        out: &mpsc::Sender<Output>,
        watch: &mut Watch,
        event: WatchEvent<DynamicObject>,
    ) -> Result<bool, WatchError> {
        if !matches!(&event, WatchEvent::Error(_)) {
            watch.gone_in_a_row = 0;
        }
        self.failures = 0;
        let (seen, obj) = match event {
            WatchEvent::Added(o) => (Seen::Added, o),
            WatchEvent::Modified(o) => (Seen::Modified, o),
            WatchEvent::Deleted(o) => (Seen::Deleted, o),
            WatchEvent::Bookmark(b) => {
                watch.from = b.metadata.resource_version;
                self.on_bookmark(out, watch).await?;
                self.reached(&watch.from);
                return Ok(false);
            }
            WatchEvent::Error(status) if status.code == 410 => return Ok(true),
            WatchEvent::Error(status) => return Err(WatchError::Api(kube::Error::Api(status))),
        };
        let Some((snapshot, rv)) = self.snapshot(obj) else {
            return Ok(false);
        };
        watch.from = rv.clone();
        self.on_change(out, watch, seen, snapshot, rv).await?;
        self.reached(&watch.from);
        Ok(false)
    }

    /// A bookmark at `watch.from`: nothing to handle up to it.
    async fn on_bookmark(
        &mut self,
        out: &mpsc::Sender<Output>,
        watch: &Watch,
    ) -> Result<(), WatchError> {
        if !self.replays.is_empty() {
            // Past the replay: its changes go first. Before its end: no
            // progress may pass them.
            if !replay_ends_at(watch.replay_until, &watch.from) {
                return Ok(());
            }
            self.flush_replays(out).await?;
        }
        send(
            out,
            Output::Progress {
                resource_version: watch.from.clone(),
                index_changed: false,
            },
        )
        .await
    }

    /// An object's change at `rv`: into the index, and out as a change
    /// (held while it is a replay) or as progress.
    async fn on_change(
        &mut self,
        out: &mpsc::Sender<Output>,
        watch: &mut Watch,
        seen: Seen,
        snapshot: ObjectSnapshot,
        rv: String,
    ) -> Result<(), WatchError> {
        let key = (snapshot.namespace.clone(), snapshot.name.clone());
        let (event, remembered_changed) = if self.trusted_handled(&key, &rv) {
            // The stored index has it, and its apps had it.
            (None, false)
        } else {
            self.index
                .apply_noting(seen, snapshot, self.target.metadata_changes)
        };
        // A label-only change delivers nothing but changes what the stored
        // index must remember; a change always counts (the checkpoint
        // waits for an index sent after it).
        self.index_dirty |= remembered_changed || event.is_some();
        match event {
            Some(mut event) => {
                event.replay = replayed(&mut watch.replay_until, &event, Some(&rv));
                if event.replay {
                    self.hold_replay(event, rv);
                    return Ok(());
                }
                self.flush_replays(out).await?;
                if event.change == ChangeType::Added {
                    self.created_at
                        .get_or_insert_with(tokio::time::Instant::now);
                }
                self.send_marked(out, event, Some(rv)).await?;
                if self.index_sent.elapsed() >= self.index_interval
                    || self
                        .created_at
                        .is_some_and(|t| t.elapsed() >= CREATION_INDEX_AFTER)
                {
                    self.send_index(out).await?;
                }
            }
            None if !self.replays.is_empty() => {
                // Nothing to deliver, but no progress may pass the held
                // replays: it waits for a later one.
            }
            None => {
                send(
                    out,
                    Output::Progress {
                        resource_version: rv,
                        index_changed: remembered_changed,
                    },
                )
                .await?
            }
        }
        Ok(())
    }

    /// Runs until the consumer goes away, backing off on errors.
    pub async fn run(mut self, out: mpsc::Sender<Output>) {
        // A kind the server does not serve (a custom kind whose CRD is not
        // installed, or was removed) is said once, not at every retry.
        let mut not_served = false;
        loop {
            match self.step(&out).await {
                Ok(()) => {
                    if std::mem::take(&mut not_served) {
                        tracing::info!(
                            kind = self.target.kind.as_str(),
                            "the API server serves this kind now: watching it"
                        );
                    }
                }
                Err(WatchError::Closed) => return,
                Err(e) => {
                    self.failures += 1;
                    let delay = backoff(self.failures);
                    let missing =
                        matches!(&e, WatchError::Api(kube::Error::Api(s)) if s.code == 404);
                    if missing && !not_served {
                        tracing::warn!(
                            kind = self.target.kind.as_str(),
                            "the API server does not serve this kind (404; for a custom kind: is its CustomResourceDefinition installed?); none of its changes is handled until it does, retrying every {}s at most",
                            backoff_max().as_secs()
                        );
                    }
                    not_served |= missing;
                    if missing {
                        tracing::debug!(
                            kind = self.target.kind.as_str(),
                            "still not served, retrying in {delay:?}"
                        );
                    } else {
                        tracing::warn!(kind = self.target.kind.as_str(), state = ?self.state, "watch failed, retrying in {delay:?}: {e}");
                    }
                    tokio::select! {
                        biased;
                        _ = out.closed() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }
}

/// How a watch ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The stream ended (the server's timeout, closed) or went idle.
    Stream,
    /// 410 Gone: the history from its version is gone.
    Gone,
}

/// A watch's stream of events.
type Events = futures_util::stream::BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>;

async fn send(out: &mpsc::Sender<Output>, output: Output) -> Result<(), WatchError> {
    out.send(output).await.map_err(|_| WatchError::Closed)
}

/// Whether a change at `rv` (`None`: no version) is a replay, replaying up
/// to `until` (see [`Watch::replay_until`]); a live change ends the replay
/// (`until` becomes `None`).
fn replayed(until: &mut Option<u64>, event: &ChangeEvent, rv: Option<&str>) -> bool {
    let Some(end) = *until else {
        return false;
    };
    match rv.and_then(|v| v.parse::<u64>().ok()) {
        Some(v) if v <= end => true,
        // A resync right after taking over: the differences are from the
        // gap.
        _ if event.change == ChangeType::Resynced => true,
        _ => {
            *until = None;
            false
        }
    }
}

/// Whether a bookmark at `version` is past a replay up to `until`.
fn replay_ends_at(until: Option<u64>, version: &str) -> bool {
    match (until, version.parse::<u64>()) {
        (Some(until), Ok(v)) => v >= until,
        _ => true,
    }
}

/// Exponential backoff from 200 ms to 30 s with ±25 % jitter
/// ([`wasmwatch_core::jitter`]).
pub fn backoff(failures: u32) -> Duration {
    let base = 0.2 * 2f64.powi(failures.saturating_sub(1).min(8) as i32);
    wasmwatch_core::jitter::spread(Duration::from_secs_f64(
        base.min(backoff_max().as_secs_f64()),
    ))
}

/// The longest [`backoff`] (before its jitter).
pub fn backoff_max() -> Duration {
    Duration::from_secs(30)
}

#[cfg(test)]
mod tests;
