//! What the host remembers of every handled object, so that it can tell a
//! real content change from a repeat, and resynchronise after the API
//! server's history is lost (410) without refreshing everything.
//!
//! Per object it keeps the content digest, a hash of labels and annotations,
//! and a short hash per data key (for `changed-keys`): memory grows with the
//! number of objects and keys, not with the size of their data.
//!
//! [`ObjectIndex::encode`] writes it as one line per object
//! (`ns/name digest metadata key=hash;key=hash`), about 45 bytes plus 20 per
//! key; host/kube's checkpoint store keeps that text in shards next to the
//! checkpoints, so that a new leader resynchronises against what its
//! predecessor handled.
//!
//! An index of Secrets holds a [`DigestKey`]: its digests and per-key hashes
//! are then HMAC-SHA-256 (see [`crate::digest`]) and its lines say so
//! (`"k":true` in the labels/annotations field). Lines without the mark,
//! written by versions before keys, are compared against the plain digests
//! of the same object, so an upgrade delivers no change by itself; such a
//! line is rewritten keyed the next time its object is seen.
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::digest::{DigestKey, data_digest, short_hash};
use crate::event::{ChangeEvent, ChangeType, ObjectKind, ObjectSnapshot};

/// What is remembered of one handled object.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Handled {
    /// The first 64 bits of the data's SHA-256 ([`ObjectSnapshot::digest`];
    /// keyed, HMAC): enough to tell one version's content from the next
    /// (a line's hex hashes do not pack, so each bit is stored; lines
    /// written with 128 bits read as their first 64).
    digest: u64,
    metadata: u64,
    /// Data keys with a short hash of each value, sorted by key.
    keys: Vec<(String, u64)>,
    /// Labels and annotations (see [`remembered`]), so that a deletion
    /// found by a resync still reaches the plugins whose selectors and
    /// annotation rules chose the object.
    /// Remembered labels and annotations as compact JSON (see [`Meta`]);
    /// `None` when there are none. One small allocation instead of two
    /// maps: it is kept for every object.
    meta: Option<Box<str>>,
    /// Loaded from a stored index that may be older than the checkpoint the
    /// watch resumes from (see [`ObjectIndex::mark_unverified`]).
    unverified: bool,
    /// The hashes are keyed (HMAC under the index's [`DigestKey`]).
    keyed: bool,
}

/// The labels and annotations remembered of a handled object.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Meta {
    #[serde(rename = "l", default, skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
    #[serde(rename = "a", default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
    /// The line's hashes are keyed (absent in lines written before keys).
    #[serde(rename = "k", default, skip_serializing_if = "std::ops::Not::not")]
    keyed: bool,
}

/// When every annotation is remembered ([`Remember::keeps_everything`]),
/// undeclared values longer than this are not (they are payloads, like
/// `kubectl.kubernetes.io/last-applied-configuration`, not routing).
const MAX_REMEMBERED_VALUE: usize = 512;

/// A declared annotation (a plugin reads it) is remembered however long:
/// Spring's list of apps (`spring.cloud.kubernetes.configmap.apps`) passes
/// 512 bytes at ~40 apps, and a deletion found at a resync without it
/// would refresh the wrong apps, or none. Declared values are kept,
/// shortest first, up to this many bytes per object, so that a line
/// still fits a segment (host/kube's `SHARD_BYTES`, 200 KiB); a value
/// past that is not remembered.
const MAX_DECLARED_BYTES: usize = 32 * 1024;

fn remembered(o: &ObjectSnapshot, keyed: bool, remember: &Remember) -> Meta {
    let mut annotations = BTreeMap::new();
    let mut declared: Vec<(&String, &String)> = Vec::new();
    for (k, v) in &o.annotations {
        if k.as_str() == "kubectl.kubernetes.io/last-applied-configuration" {
            continue;
        }
        if remember.annotations.has(k) {
            declared.push((k, v));
        } else if remember.all && v.len() <= MAX_REMEMBERED_VALUE {
            annotations.insert(k.clone(), v.clone());
        }
    }
    declared.sort_by_key(|(_, v)| v.len());
    let mut budget = MAX_DECLARED_BYTES;
    for (k, v) in declared {
        let Some(left) = budget.checked_sub(v.len()) else {
            break;
        };
        budget = left;
        annotations.insert(k.clone(), v.clone());
    }
    Meta {
        keyed,
        labels: o
            .labels
            .iter()
            .filter(|(k, _)| remember.all || remember.labels.has(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        annotations,
    }
}

/// Which labels and annotations an index remembers of each object: all of
/// them, or only the keys the plugins declare they read (their
/// `wasmwatch:needs` `metadata`, see [`crate::needs::MetadataReads`]) and
/// the keys the manifest's label selectors name. A deletion found at a
/// resync carries what is remembered, and routing and the plugins read no
/// other key of it. Keys outside the declaration are dropped from a line
/// when its object is next seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remember {
    /// Every label and annotation (some plugin of the kind declares
    /// nothing), or only the declared ones.
    all: bool,
    labels: Keys,
    annotations: Keys,
}

impl Default for Remember {
    /// Everything.
    fn default() -> Remember {
        Remember {
            all: true,
            labels: Keys::default(),
            annotations: Keys::default(),
        }
    }
}

/// A set of label or annotation keys; a key ending in `*` stands for every
/// key it starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keys {
    exact: std::collections::BTreeSet<String>,
    prefixes: Vec<String>,
}

impl Keys {
    pub fn add(&mut self, key: &str) {
        match key.strip_suffix('*') {
            Some(prefix) => self.prefixes.push(prefix.to_string()),
            None => {
                self.exact.insert(key.to_string());
            }
        }
    }

    pub fn has(&self, key: &str) -> bool {
        self.exact.contains(key) || self.prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }
}

impl Remember {
    /// What to remember for the plugins whose declarations are `reads`
    /// (`None`: a plugin that declares nothing, so everything is kept) and
    /// the label selectors' keys.
    pub fn of<'a>(
        reads: impl IntoIterator<Item = Option<crate::needs::MetadataReads>>,
        selector_keys: impl IntoIterator<Item = &'a str>,
    ) -> Remember {
        let mut remember = Remember {
            all: false,
            ..Remember::default()
        };
        for r in reads {
            match r {
                // The others' declared keys still count: their values are
                // kept however long.
                None => remember.all = true,
                Some(r) => {
                    r.labels.iter().for_each(|k| remember.labels.add(k));
                    r.annotations
                        .iter()
                        .for_each(|k| remember.annotations.add(k));
                }
            }
        }
        selector_keys
            .into_iter()
            .for_each(|k| remember.labels.add(k));
        remember
    }

    /// Whether every label and annotation is kept (some plugin declares
    /// nothing).
    pub fn keeps_everything(&self) -> bool {
        self.all
    }
}

/// A stable hash of labels and annotations: it is persisted with the index
/// (a new leader compares against it), so it must not depend on the Rust
/// version or the process, as `DefaultHasher` may.
fn metadata_hash(o: &ObjectSnapshot) -> u64 {
    let mut h = Sha256::new();
    for map in [&o.labels, &o.annotations] {
        for (k, v) in map {
            h.update((k.len() as u64).to_le_bytes());
            h.update(k.as_bytes());
            h.update((v.len() as u64).to_le_bytes());
            h.update(v.as_bytes());
        }
        h.update(u64::MAX.to_le_bytes());
    }
    u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

impl Handled {
    /// What is remembered of `o`, and its full hex digest (the event's),
    /// keyed when `key` is given.
    fn of(o: &ObjectSnapshot, key: Option<&DigestKey>, remember: &Remember) -> (Handled, String) {
        let hex = data_digest(&o.data, key);
        let handled = Handled {
            digest: u64::from_str_radix(&hex[..16], 16).expect("hex digest"),
            metadata: metadata_hash(o),
            keys: o
                .data
                .iter()
                .map(|(k, v)| (k.clone(), short_hash(v.as_bytes(), key)))
                .collect(),
            meta: {
                let m = remembered(o, key.is_some(), remember);
                (m != Meta::default()).then(|| {
                    serde_json::to_string(&m)
                        .expect("string maps serialize")
                        .into()
                })
            },
            unverified: false,
            keyed: key.is_some(),
        };
        (handled, hex)
    }

    /// Every key of `now` and of `self`, sorted.
    fn all_keys(&self, now: &Handled) -> Vec<String> {
        let keys: std::collections::BTreeSet<&str> = self
            .keys
            .iter()
            .chain(&now.keys)
            .map(|(k, _)| k.as_str())
            .collect();
        keys.into_iter().map(str::to_string).collect()
    }

    fn changed_keys(&self, now: &Handled) -> Vec<String> {
        let before: BTreeMap<&str, u64> = self.keys.iter().map(|(k, h)| (k.as_str(), *h)).collect();
        let after: BTreeMap<&str, u64> = now.keys.iter().map(|(k, h)| (k.as_str(), *h)).collect();
        let mut keys: Vec<String> = after
            .iter()
            .filter(|(k, h)| before.get(*k) != Some(*h))
            .map(|(k, _)| k.to_string())
            .chain(
                before
                    .keys()
                    .filter(|k| !after.contains_key(*k))
                    .map(|k| k.to_string()),
            )
            .collect();
        keys.sort();
        keys
    }
}

/// How a watch reported an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Added,
    Modified,
    Deleted,
}

/// Objects by namespace and name: a persistent map (`imbl`), so that a copy
/// of the index (the watch loop hands one to the term every checkpoint
/// interval, the term keeps one per save) costs nothing, and a change
/// after it copies one path of the tree, its entries two reference counts
/// each. A `BTreeMap` copy of 10k objects at every interval held the
/// leader's one worker for milliseconds (issue 24).
type Objects = imbl::OrdMap<Arc<(String, String)>, Arc<Handled>>;

/// The handled objects of one kind, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectIndex {
    kind: ObjectKind,
    objects: Objects,
    /// Keys the digests (of Secrets; see the module docs).
    key: Option<DigestKey>,
    /// The labels and annotations kept of each object.
    remember: Arc<Remember>,
    /// Some entry may be unverified (see [`ObjectIndex::mark_unverified`]):
    /// without it [`ObjectIndex::unverified_keys`] reads no entry.
    some_unverified: bool,
}

impl ObjectIndex {
    pub fn new(kind: ObjectKind) -> Self {
        ObjectIndex {
            kind,
            objects: Objects::new(),
            key: None,
            remember: Arc::default(),
            some_unverified: false,
        }
    }

    /// Objects seen from now on keep only the labels and annotations
    /// `remember` names; lines already held keep theirs until their object
    /// is seen again.
    pub fn with_remember(mut self, remember: Arc<Remember>) -> Self {
        self.remember = remember;
        self
    }

    /// Digests of objects seen from now on are keyed with `key` (or plain
    /// with `None`); lines already held keep theirs until their object is
    /// seen again.
    pub fn with_digest_key(mut self, key: Option<DigestKey>) -> Self {
        self.key = key;
        self
    }

    pub fn digest_key(&self) -> Option<&DigestKey> {
        self.key.as_ref()
    }

    /// The event for `object` with the `digest` this index computed, and
    /// the plain one beside it when that is keyed.
    fn event(&self, change: ChangeType, object: ObjectSnapshot, digest: String) -> ChangeEvent {
        let unkeyed = self.key.is_some().then(|| object.digest());
        let mut ev = ChangeEvent::with_digest(change, object, digest);
        ev.unkeyed_digest = unkeyed;
        ev
    }

    /// What is remembered of `o`, with its digest, under this index's key.
    fn handled(&self, o: &ObjectSnapshot) -> (Handled, String) {
        Handled::of(o, self.key.as_ref(), &self.remember)
    }

    /// `now` in the hashes `before` was written with, so that they compare:
    /// a line from before keys (plain) against plain hashes of the object.
    /// A keyed line in an index without the key cannot be compared: it
    /// counts as different.
    fn comparable<'a>(before: &Handled, now: &'a Handled, o: &ObjectSnapshot) -> Cow<'a, Handled> {
        if before.keyed || !now.keyed {
            Cow::Borrowed(now)
        } else {
            Cow::Owned(Handled::of(o, None, &Remember::default()).0)
        }
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether the index has `namespace/name`.
    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.objects
            .contains_key(&(namespace.to_string(), name.to_string()))
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    pub fn kind(&self) -> ObjectKind {
        self.kind
    }

    /// The namespaces it has objects of.
    pub fn namespaces(&self) -> std::collections::BTreeSet<String> {
        self.objects.keys().map(|k| k.0.clone()).collect()
    }

    /// The part of the index a watch stream of `scope` covers.
    pub fn part(&self, scope: &crate::Scope) -> ObjectIndex {
        if scope == &crate::Scope::All {
            return self.clone();
        }
        ObjectIndex {
            kind: self.kind,
            objects: self
                .objects
                .iter()
                .filter(|(k, _)| scope.contains(&k.0))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            key: self.key.clone(),
            remember: self.remember.clone(),
            some_unverified: self.some_unverified,
        }
    }

    /// Marks every object as possibly out of date: a watch resuming from a
    /// checkpoint starts from the stored index, which is saved less often
    /// than the checkpoint, so an object may have changed (A to B, handled
    /// by the previous leader) after the index was stored. Its next event
    /// then looks like no change when it returns to A. Every event after a
    /// checkpoint is a real change, so an unverified object's next event is
    /// delivered whatever its content; after it the object is verified.
    pub fn mark_unverified(&mut self) {
        self.set_verified(false);
    }

    /// Marks only `keys` (namespace, name) as possibly out of date: the
    /// stored index's objects whose stored content may not have reached
    /// the apps (issue 33: the state names them beside the index), the
    /// others verified.
    pub fn mark_unverified_only<'a>(
        &mut self,
        keys: impl IntoIterator<Item = &'a (String, String)>,
    ) {
        self.set_verified(true);
        for key in keys {
            if let Some((k, h)) = self.objects.get_key_value(key) {
                let mut h = Handled::clone(h);
                h.unverified = true;
                let k = k.clone();
                self.objects.insert(k, Arc::new(h));
                self.some_unverified = true;
            }
        }
    }

    /// Marks every object verified: its entry is what the apps were last
    /// given, or older than every change still to come. True once a watch
    /// resuming from a checkpoint has seen every change up to where its
    /// stored (or rebuilt) index was taken: an object with no change since
    /// the checkpoint was handled before it.
    pub fn mark_verified(&mut self) {
        if self.some_unverified {
            self.set_verified(true);
        }
    }

    fn set_verified(&mut self, verified: bool) {
        self.objects = self
            .objects
            .iter()
            .map(|(k, h)| {
                if h.unverified != verified {
                    return (k.clone(), h.clone());
                }
                let mut h = Handled::clone(h);
                h.unverified = !verified;
                (k.clone(), Arc::new(h))
            })
            .collect();
        self.some_unverified = !verified && !self.objects.is_empty();
    }

    /// The objects still unverified (see [`ObjectIndex::mark_unverified`]),
    /// or `None` when there are more than `limit`.
    pub fn unverified_keys(&self, limit: usize) -> Option<BTreeSet<(String, String)>> {
        let mut keys = BTreeSet::new();
        if !self.some_unverified {
            return Some(keys);
        }
        for (k, h) in &self.objects {
            if h.unverified {
                if keys.len() == limit {
                    return None;
                }
                keys.insert(Arc::unwrap_or_clone(k.clone()));
            }
        }
        Some(keys)
    }

    /// Keeps only the objects of the namespaces `keep` accepts.
    pub fn retain_namespaces(&mut self, keep: impl Fn(&str) -> bool) {
        self.objects = self
            .objects
            .iter()
            .filter(|(k, _)| keep(&k.0))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
    }

    /// Adds `other`'s objects (another stream's part), replacing equal keys.
    pub fn extend(&mut self, other: &ObjectIndex) {
        self.objects
            .extend(other.objects.iter().map(|(k, v)| (k.clone(), v.clone())));
    }

    /// Turns one watch event into the change to deliver, if any, and
    /// remembers the object. Only data changes count as modifications unless
    /// `metadata_changes`; an ADDED for an object already handled with the
    /// same content (a relist, a replay) delivers nothing.
    pub fn apply(
        &mut self,
        seen: Seen,
        object: ObjectSnapshot,
        metadata_changes: bool,
    ) -> Option<ChangeEvent> {
        self.apply_noting(seen, object, metadata_changes).0
    }

    /// [`ObjectIndex::apply`], also saying whether what the index remembers
    /// changed: a label-only change delivers nothing (without
    /// `metadata_changes`) but updates the remembered labels, which a stored
    /// copy of the index must then get too.
    pub fn apply_noting(
        &mut self,
        seen: Seen,
        object: ObjectSnapshot,
        metadata_changes: bool,
    ) -> (Option<ChangeEvent>, bool) {
        let key = (object.namespace.clone(), object.name.clone());
        if seen == Seen::Deleted {
            let removed = self.objects.remove(&key).is_some();
            let digest = object.digest_with(self.key.as_ref());
            return (
                Some(self.event(ChangeType::Deleted, object, digest)),
                removed,
            );
        }
        let (now, digest) = self.handled(&object);
        let previous = self.objects.insert(Arc::new(key), Arc::new(now.clone()));
        let change = match previous {
            // A replay after failover may modify objects this replica never
            // saw: a modification with every key counted as changed.
            None if seen == Seen::Modified => ChangeType::Modified,
            None => ChangeType::Added,
            Some(before) => {
                let same = Self::comparable(&before, &now, &object);
                let content = before.digest != same.digest;
                let metadata = metadata_changes && before.metadata != now.metadata;
                if !(content || metadata || before.unverified) {
                    return (None, *before != now);
                }
                // An unverified entry may come from a list taken after the
                // event (a rebuilt index): an ADDED is still a creation.
                let change = if seen == Seen::Added && before.unverified {
                    ChangeType::Added
                } else {
                    ChangeType::Modified
                };
                let changed_keys = if before.unverified {
                    // What changed since the last handled version is
                    // unknown: every key may have.
                    before.all_keys(&now)
                } else {
                    before.changed_keys(&same)
                };
                let mut ev = self.event(change, object, digest);
                ev.changed_keys = changed_keys;
                return (Some(ev), true);
            }
        };
        (Some(self.event(change, object, digest)), true)
    }

    /// After the watch history was lost: compares a fresh list with what was
    /// handled. Objects whose content differs are delivered as `resynced`, new
    /// ones as `added`, vanished ones as `deleted` (with their remembered
    /// labels and annotations, no data); unchanged objects deliver nothing.
    pub fn resync(
        &mut self,
        current: Vec<ObjectSnapshot>,
        metadata_changes: bool,
    ) -> Vec<ChangeEvent> {
        let mut r = Resync::new(metadata_changes);
        let mut out = self.resync_page(&mut r, current);
        out.extend(self.finish_resync(r));
        out
    }

    /// [`ObjectIndex::resync`] one list page at a time, so that a large
    /// collection never has to be in memory at once.
    pub fn resync_page(&self, r: &mut Resync, page: Vec<ObjectSnapshot>) -> Vec<ChangeEvent> {
        let mut out = Vec::new();
        for object in page {
            let key = (object.namespace.clone(), object.name.clone());
            let (now, digest) = self.handled(&object);
            let Some(before) = self.objects.get(&key) else {
                out.push(self.event(ChangeType::Added, object, digest));
                r.fresh.insert(Arc::new(key), Arc::new(now));
                continue;
            };
            let same = Self::comparable(before, &now, &object);
            let changed_keys = if before.digest != same.digest
                || (r.metadata_changes && before.metadata != now.metadata)
            {
                Some(before.changed_keys(&same))
            } else if r.changed_after_floor(&object) {
                // Equal to what the index remembers, but written after the
                // history was lost: what happened in between is unknown (a
                // predecessor may have delivered a B the index never saw
                // before the object went back to A). Deliver it, every key
                // counted as changed.
                Some(before.all_keys(&now))
            } else {
                None
            };
            if let Some(changed_keys) = changed_keys {
                let mut ev = self.event(ChangeType::Resynced, object, digest);
                ev.changed_keys = changed_keys;
                out.push(ev);
            }
            r.fresh.insert(Arc::new(key), Arc::new(now));
        }
        out
    }

    /// Ends a paged resync: the deletions, and the index becomes the list.
    pub fn finish_resync(&mut self, r: Resync) -> Vec<ChangeEvent> {
        let mut out = Vec::new();
        for (key, h) in self
            .objects
            .iter()
            .filter(|(k, _)| !r.fresh.contains_key(&***k))
        {
            let (namespace, name) = &**key;
            let meta: Meta = h
                .meta
                .as_deref()
                .and_then(|m| serde_json::from_str(m).ok())
                .unwrap_or_default();
            let gone = ObjectSnapshot {
                kind: self.kind,
                namespace: namespace.clone(),
                name: name.clone(),
                uid: String::new(),
                resource_version: String::new(),
                labels: meta.labels,
                annotations: meta.annotations,
                data: Default::default(),
            };
            let digest = gone.digest_with(self.key.as_ref());
            out.push(self.event(ChangeType::Deleted, gone, digest));
        }
        self.objects = r.fresh;
        out
    }
}

/// A resync in progress: what the fresh list holds so far.
#[derive(Debug)]
pub struct Resync {
    fresh: Objects,
    metadata_changes: bool,
    /// The version the watch history was lost from, when known: an object
    /// last written after it changed while nobody could see it.
    floor: Option<u64>,
    /// A stored index trusted up to a version, but for some objects (see
    /// [`Resync::trusting`]).
    trusted: Option<(u64, BTreeSet<(String, String)>)>,
}

impl Resync {
    pub fn new(metadata_changes: bool) -> Resync {
        Resync {
            fresh: Objects::new(),
            metadata_changes,
            floor: None,
            trusted: None,
        }
    }

    /// A resync against a stored index the state trusts (issue 33): it
    /// has every change up to `at`, and all of them but `unhandled`'s had
    /// reached the apps. An object of the others last written by then is
    /// delivered only when its content differs from the index's.
    pub fn trusting(mut self, at: u64, unhandled: &BTreeSet<(String, String)>) -> Resync {
        self.trusted = Some((at, unhandled.clone()));
        self
    }

    /// A resync after the history was lost from `floor` (the last version
    /// the stream had handed out, which the index covers): objects written
    /// after it are delivered even when their content equals the index's
    /// (the A→B→A of a change handled, but not yet in the stored index,
    /// then reverted while nobody led). A version that is not a number
    /// counts as written after it.
    pub fn after(mut self, floor: &str) -> Resync {
        self.floor = Some(floor.parse().unwrap_or(0));
        self
    }

    fn changed_after_floor(&self, object: &ObjectSnapshot) -> bool {
        let Some(mut floor) = self.floor else {
            return false;
        };
        if let Some((at, unhandled)) = &self.trusted
            && !unhandled.contains(&(object.namespace.clone(), object.name.clone()))
        {
            floor = floor.max(*at);
        }
        object
            .resource_version
            .parse::<u64>()
            .map_or(true, |rv| rv > floor)
    }
}

/// The line of a deleted object in an index delta ([`ObjectIndex::delta`]).
const TOMBSTONE: &str = "-";

impl ObjectIndex {
    /// One line per object, sorted: `ns/name digest metadata k=h;k=h {meta}`
    /// (hex hashes; the keys field is empty for an object without data;
    /// `{meta}`, remembered labels and annotations as compact JSON, only
    /// when there are any).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        for (key, h) in &self.objects {
            encode_line(&mut out, key, h);
        }
        out
    }

    /// Reads [`ObjectIndex::encode`]'s text; errors name the line.
    pub fn decode(kind: ObjectKind, text: &str) -> Result<ObjectIndex, String> {
        let mut index = ObjectIndex::new(kind);
        index.apply_text(text)?;
        Ok(index)
    }

    /// What turns this index's part for `scope` into `newer` (a stream's
    /// index of that scope), in [`ObjectIndex::encode`]'s lines: a line per
    /// object added or changed, `ns/name -` per object gone, sorted.
    /// Entries a copy shares with this index compare by pointer first, so
    /// a delta of two copies of one index costs a walk, not a comparison
    /// of every entry.
    pub fn delta(&self, newer: &ObjectIndex, scope: &crate::Scope) -> String {
        let mut out = String::new();
        if scope == &crate::Scope::All {
            // Shared subtrees are skipped whole.
            for d in self.objects.diff(&newer.objects) {
                match d {
                    imbl::ordmap::DiffItem::Add(k, h) => encode_line(&mut out, k, h),
                    imbl::ordmap::DiffItem::Update {
                        new: (k, h),
                        old: (_, o),
                    } => {
                        if !same_stored(o, h) {
                            change_line(&mut out, k, o, h)
                        }
                    }
                    imbl::ordmap::DiffItem::Remove(k, _) => tombstone_line(&mut out, k),
                }
            }
            return out;
        }
        let mut old = self.range_of(scope).peekable();
        let mut new = newer.objects.iter().peekable();
        loop {
            match (old.peek(), new.peek()) {
                (None, None) => break,
                (Some((ko, _)), Some((kn, _))) if ko < kn => {
                    tombstone_line(&mut out, ko);
                    old.next();
                }
                (Some(_), None) => {
                    let (ko, _) = old.next().expect("peeked");
                    tombstone_line(&mut out, ko);
                }
                (Some((ko, ho)), Some((kn, hn))) if ko == kn => {
                    if !Arc::ptr_eq(ho, hn) && !same_stored(ho, hn) {
                        change_line(&mut out, kn, ho, hn);
                    }
                    old.next();
                    new.next();
                }
                (_, Some(_)) => {
                    let (kn, hn) = new.next().expect("peeked");
                    encode_line(&mut out, kn, hn);
                }
            }
        }
        out
    }

    /// The entries of one namespace scope, in order (a range of the map,
    /// not a walk of every namespace).
    fn range_of(
        &self,
        scope: &crate::Scope,
    ) -> impl Iterator<Item = (&Arc<(String, String)>, &Arc<Handled>)> {
        let ns = scope.namespace().unwrap_or_default().to_string();
        // (ns, "") is the first key of ns; (ns + "\0", "") the first after.
        let from = Arc::new((ns.clone(), String::new()));
        let to = Arc::new((format!("{ns}\0"), String::new()));
        self.objects.range(from..to)
    }

    /// Replaces this index's part for `scope` with `newer` (entries shared,
    /// not copied): what [`ObjectIndex::delta`]'s text does when applied.
    pub fn replace_part(&mut self, scope: &crate::Scope, newer: &ObjectIndex) {
        if scope == &crate::Scope::All {
            self.objects = newer.objects.clone();
            return;
        }
        let gone: Vec<Arc<(String, String)>> =
            self.range_of(scope).map(|(k, _)| k.clone()).collect();
        for k in gone {
            self.objects.remove(&k);
        }
        self.extend(newer);
    }

    /// Applies lines of [`ObjectIndex::encode`] or [`ObjectIndex::delta`]
    /// in order: a line sets its object's entry, `ns/name -` removes it.
    /// Errors name the line; nothing is applied after a bad line.
    pub fn apply_text(&mut self, text: &str) -> Result<(), String> {
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let bad = |why: &str| format!("object index line {}: {why}: {line:?}", i + 1);
            let mut parts = line.splitn(5, ' ');
            let id = parts.next().unwrap_or_default();
            let (ns, name) = id.split_once('/').ok_or_else(|| bad("expected ns/name"))?;
            let key = Arc::new((ns.to_string(), name.to_string()));
            let digest = parts.next();
            if digest == Some(TOMBSTONE) {
                self.objects.remove(&key);
                continue;
            }
            if digest == Some(PATCH) {
                // A patch of an entry the index does not have: its object's
                // whole line was too large to store (`fit_lines` made it a
                // removal), and it stays unknown (a resync delivers it
                // again) rather than the whole index being set aside.
                let Some(before) = self.objects.get(&key) else {
                    continue;
                };
                let digest = parts.next().unwrap_or_default();
                let digest = u64::from_str_radix(digest, 16).map_err(|_| bad("bad digest"))?;
                let mut keys: BTreeMap<String, u64> = before.keys.iter().cloned().collect();
                for kv in parts
                    .next()
                    .unwrap_or("")
                    .split(';')
                    .filter(|k| !k.is_empty())
                {
                    let (k, h) = kv.rsplit_once('=').ok_or_else(|| bad("bad key hash"))?;
                    if h == TOMBSTONE {
                        keys.remove(k);
                    } else {
                        let h = u64::from_str_radix(h, 16).map_err(|_| bad("bad key hash"))?;
                        keys.insert(k.to_string(), h);
                    }
                }
                let patched = Handled {
                    digest,
                    keys: keys.into_iter().collect(),
                    unverified: false,
                    ..Handled::clone(before)
                };
                self.objects.insert(key, Arc::new(patched));
                continue;
            }
            let (Some(digest), Some(meta)) = (digest, parts.next()) else {
                return Err(bad("expected `ns/name digest metadata keys`"));
            };
            // 128 bits before issue 32's format 3: their first 64.
            let digest = digest.get(..16).unwrap_or(digest);
            let digest = u64::from_str_radix(digest, 16).map_err(|_| bad("bad digest"))?;
            let metadata = u64::from_str_radix(meta, 16).map_err(|_| bad("bad metadata hash"))?;
            let keys = parts
                .next()
                .unwrap_or("")
                .split(';')
                .filter(|k| !k.is_empty())
                .map(|kv| {
                    let (k, h) = kv.rsplit_once('=').ok_or_else(|| bad("bad key hash"))?;
                    let h = u64::from_str_radix(h, 16).map_err(|_| bad("bad key hash"))?;
                    Ok((k.to_string(), h))
                })
                .collect::<Result<Vec<_>, String>>()?;
            let (meta, keyed) = match parts.next() {
                Some(json) => {
                    let m = serde_json::from_str::<Meta>(json)
                        .map_err(|_| bad("bad labels/annotations"))?;
                    (Some(json.into()), m.keyed)
                }
                None => (None, false),
            };
            self.objects.insert(
                key,
                Arc::new(Handled {
                    digest,
                    metadata,
                    keys,
                    meta,
                    unverified: false,
                    keyed,
                }),
            );
        }
        Ok(())
    }
}

/// Whether two entries store the same line (`unverified` is not stored).
fn same_stored(a: &Handled, b: &Handled) -> bool {
    a.digest == b.digest
        && a.metadata == b.metadata
        && a.keys == b.keys
        && a.meta == b.meta
        && a.keyed == b.keyed
}

fn encode_line(out: &mut String, key: &(String, String), h: &Handled) {
    use std::fmt::Write;
    let (ns, name) = key;
    let _ = write!(out, "{ns}/{name} {:016x} {:016x} ", h.digest, h.metadata);
    for (i, (k, v)) in h.keys.iter().enumerate() {
        if i > 0 {
            out.push(';');
        }
        let _ = write!(out, "{k}={v:016x}");
    }
    if let Some(meta) = &h.meta {
        out.push(' ');
        out.push_str(meta);
    }
    out.push('\n');
}

/// An entry's line without its key hashes and remembered labels and
/// annotations (only its keying stays): `ns/name digest metadata` and
/// `{"k":true}` when keyed. For a line too long for a segment (an object
/// with thousands of keys): stored so, the object is still known to a new
/// leader (a deletion in a gap past the history is found; an unchanged
/// object stays quiet; a change reports every key changed, as for an
/// object whose keys were unknown), where dropping the line forgot it.
/// `None` for any other line (a patch, a removal).
pub fn shortened_line(line: &str) -> Option<String> {
    let mut entry = ObjectIndex::new(ObjectKind::ConfigMap);
    entry.apply_text(line).ok()?;
    let (key, h) = entry.objects.iter().next()?;
    let meta = Meta {
        keyed: h.keyed,
        ..Meta::default()
    };
    let short = Handled {
        keys: Vec::new(),
        meta: h.keyed.then(|| {
            serde_json::to_string(&meta)
                .expect("string maps serialize")
                .into()
        }),
        ..(**h).clone()
    };
    let mut out = String::new();
    encode_line(&mut out, key, &short);
    Some(out)
}

/// The mark of a line that changes an entry's data only: `ns/name +
/// digest k=h;j=-` sets the digest and the hashes of the keys named (`-`:
/// the key is gone), and keeps the rest of the entry the index has. A
/// changed object's line then stores the hashes that changed, not all of
/// them (hex hashes do not pack: they are most of a stored line).
const PATCH: &str = "+";

/// The line that turns `old`'s entry into `new`'s: a patch when only the
/// data changed, else the whole entry.
fn change_line(out: &mut String, key: &(String, String), old: &Handled, new: &Handled) {
    use std::fmt::Write;
    if old.metadata != new.metadata || old.meta != new.meta || old.keyed != new.keyed {
        return encode_line(out, key, new);
    }
    let (ns, name) = key;
    let _ = write!(out, "{ns}/{name} {PATCH} {:016x} ", new.digest);
    let before: BTreeMap<&str, u64> = old.keys.iter().map(|(k, h)| (k.as_str(), *h)).collect();
    let mut first = true;
    let mut sep = |out: &mut String| {
        if !std::mem::take(&mut first) {
            out.push(';');
        }
    };
    for (k, h) in &new.keys {
        if before.get(k.as_str()) != Some(h) {
            sep(out);
            let _ = write!(out, "{k}={h:016x}");
        }
    }
    for (k, _) in &old.keys {
        if !new.keys.iter().any(|(n, _)| n == k) {
            sep(out);
            let _ = write!(out, "{k}={TOMBSTONE}");
        }
    }
    out.push('\n');
}

fn tombstone_line(out: &mut String, key: &(String, String)) {
    let (ns, name) = key;
    out.push_str(ns);
    out.push('/');
    out.push_str(name);
    out.push(' ');
    out.push_str(TOMBSTONE);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str, data: serde_json::Value, labels: serde_json::Value) -> ObjectSnapshot {
        ObjectSnapshot::from_json(&json!({"kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "labels": labels}, "data": data}))
        .unwrap()
    }

    /// Copies share their entries (issue 24): what one copy learns later
    /// must not show in another, whatever changes (a change, a deletion,
    /// `mark_unverified`, a resync).
    #[test]
    fn a_copy_of_the_index_keeps_what_it_had_when_taken() {
        let mut ix = ObjectIndex::new(ObjectKind::ConfigMap);
        for i in 0..200 {
            ix.apply(
                Seen::Added,
                cm(&format!("cm-{i}"), json!({"k": "1"}), json!({})),
                false,
            );
        }
        let copy = ix.clone();
        let text = copy.encode();
        ix.apply(
            Seen::Modified,
            cm("cm-7", json!({"k": "2"}), json!({})),
            false,
        );
        ix.apply(
            Seen::Deleted,
            cm("cm-8", json!({"k": "1"}), json!({})),
            false,
        );
        ix.apply(Seen::Added, cm("new", json!({"k": "1"}), json!({})), false);
        ix.mark_unverified();
        assert_eq!(copy.encode(), text);
        assert_eq!(copy.len(), 200);
        assert_ne!(ix.encode(), text);
        // And the other way round: a change to the copy leaves the original.
        let mut copy2 = ix.clone();
        let before = ix.encode();
        copy2.resync(vec![cm("cm-1", json!({"k": "9"}), json!({}))], false);
        assert_eq!(ix.encode(), before);
        assert_eq!(copy2.len(), 1);
    }

    #[test]
    fn only_content_changes_are_modifications() {
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap);
        let a = idx
            .apply(
                Seen::Added,
                cm("a", json!({"k": "1", "j": "x"}), json!({})),
                false,
            )
            .unwrap();
        assert_eq!(a.change, ChangeType::Added);
        // Same content again (a relist or replay): nothing.
        assert!(
            idx.apply(
                Seen::Added,
                cm("a", json!({"k": "1", "j": "x"}), json!({})),
                false
            )
            .is_none()
        );
        // Label-only change: nothing by default, a modification when asked.
        assert!(
            idx.apply(
                Seen::Modified,
                cm("a", json!({"k": "1", "j": "x"}), json!({"l": "1"})),
                false
            )
            .is_none()
        );
        let m = idx
            .apply(
                Seen::Modified,
                cm("a", json!({"k": "1", "j": "x"}), json!({"l": "2"})),
                true,
            )
            .unwrap();
        assert_eq!(m.changed_keys, Vec::<String>::new());
        // A data change names exactly the keys that changed.
        let m = idx
            .apply(
                Seen::Modified,
                cm("a", json!({"k": "2", "n": "new"}), json!({"l": "2"})),
                false,
            )
            .unwrap();
        assert_eq!(m.change, ChangeType::Modified);
        assert_eq!(m.changed_keys, vec!["j", "k", "n"]);
        let d = idx
            .apply(Seen::Deleted, cm("a", json!({"k": "2"}), json!({})), false)
            .unwrap();
        assert_eq!(d.change, ChangeType::Deleted);
        assert!(idx.is_empty());
    }

    /// Issue 33: only the objects the state names stay unverified; the
    /// others compare by content, and `mark_verified` ends it for all.
    #[test]
    fn only_the_named_objects_start_unverified() {
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap);
        for name in ["a", "b", "c"] {
            idx.apply(Seen::Added, cm(name, json!({"k": "A"}), json!({})), false);
        }
        assert_eq!(idx.unverified_keys(10), Some(BTreeSet::new()));
        let b = ("ns".to_string(), "b".to_string());
        let gone = ("ns".to_string(), "gone".to_string());
        idx.mark_unverified_only([&b, &gone]);
        assert_eq!(idx.unverified_keys(10), Some(BTreeSet::from([b.clone()])));
        // a: verified, its stored content is what the apps have.
        assert!(
            idx.apply(Seen::Modified, cm("a", json!({"k": "A"}), json!({})), false)
                .is_none()
        );
        // b: its stored content may not have reached them.
        assert!(
            idx.apply(Seen::Modified, cm("b", json!({"k": "A"}), json!({})), false)
                .is_some()
        );
        idx.mark_unverified();
        assert_eq!(idx.unverified_keys(2), None, "three, over the limit");
        idx.mark_verified();
        assert_eq!(idx.unverified_keys(0), Some(BTreeSet::new()));
        assert!(
            idx.apply(Seen::Modified, cm("c", json!({"k": "A"}), json!({})), false)
                .is_none()
        );
    }

    #[test]
    fn an_unverified_object_delivers_its_next_event_whatever_its_content() {
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap);
        idx.apply(
            Seen::Added,
            cm("a", json!({"k": "A", "old": "x"}), json!({})),
            false,
        );
        idx.mark_unverified();
        // Back to A after a B the index never saw: a real change, and any
        // key may have changed since the last handled version.
        let ev = idx
            .apply(
                Seen::Modified,
                cm("a", json!({"k": "A", "new": "y"}), json!({})),
                false,
            )
            .expect("delivered");
        assert_eq!(ev.change, ChangeType::Modified);
        assert_eq!(ev.changed_keys, ["k", "new", "old"]);
        // Verified now.
        assert!(
            idx.apply(
                Seen::Modified,
                cm("a", json!({"k": "A", "new": "y"}), json!({})),
                false
            )
            .is_none()
        );
    }

    #[test]
    fn a_label_only_change_delivers_nothing_but_changes_what_is_remembered() {
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap);
        let (ev, changed) =
            idx.apply_noting(Seen::Added, cm("a", json!({"k": "1"}), json!({})), false);
        assert!(ev.is_some() && changed);
        let relabelled = || cm("a", json!({"k": "1"}), json!({"team": "x"}));
        assert_eq!(
            idx.apply_noting(Seen::Modified, relabelled(), false),
            (None, true),
            "the stored index must learn the new labels"
        );
        assert_eq!(
            idx.apply_noting(Seen::Modified, relabelled(), false),
            (None, false),
            "nothing new"
        );
        // A deletion found by a resync carries the new labels.
        let gone = idx.resync(vec![], false);
        assert_eq!(gone[0].object.labels["team"], "x");
        // Deleting what is not remembered changes nothing.
        let (ev, changed) = idx.apply_noting(Seen::Deleted, cm("a", json!({}), json!({})), false);
        assert!(ev.is_some() && !changed);
    }

    /// With the plugins' declarations, a line keeps only the labels and
    /// annotations they read (and the selectors' keys): a deletion found
    /// at a resync still carries those, and nothing else is stored.
    #[test]
    fn only_the_declared_labels_and_annotations_are_remembered() {
        let reads = crate::needs::MetadataReads {
            labels: vec![],
            annotations: vec![
                "spring.cloud.kubernetes.configmap.apps".into(),
                "acme.io/*".into(),
            ],
        };
        let remember = Remember::of([Some(reads.clone())], ["app"]);
        let object = || {
            ObjectSnapshot::from_json(&json!({"kind": "ConfigMap",
                "metadata": {"name": "a", "namespace": "ns",
                    "labels": {"app": "shop", "helm.sh/chart": "shop-1.2.3"},
                    "annotations": {
                        "spring.cloud.kubernetes.configmap.apps": "orders",
                        "acme.io/team": "x",
                        "kubernetes.io/description": "a long description",
                        "meta.helm.sh/release-name": "shop"}},
                "data": {"k": "1"}}))
            .unwrap()
        };
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap).with_remember(Arc::new(remember));
        idx.apply(Seen::Added, object(), false);
        let line = idx.encode();
        assert!(
            line.contains("orders") && line.contains("acme.io/team") && line.contains("\"app\""),
            "{line}"
        );
        assert!(
            !line.contains("helm") && !line.contains("description"),
            "{line}"
        );
        let gone = idx.resync(vec![], false);
        assert_eq!(gone[0].change, ChangeType::Deleted);
        assert_eq!(
            gone[0].object.labels,
            BTreeMap::from([("app".into(), "shop".into())])
        );
        assert_eq!(gone[0].object.annotations.len(), 2);
        // A declared annotation is remembered however long (Spring's list
        // of 100 apps: 1.7 KB), within the object's budget.
        let apps = (0..100)
            .map(|i| format!("app-{i:03}-orders"))
            .collect::<Vec<_>>()
            .join(",");
        let mut long = object();
        long.annotations.insert(
            "spring.cloud.kubernetes.configmap.apps".into(),
            apps.clone(),
        );
        long.annotations
            .insert("acme.io/payload".into(), "x".repeat(MAX_DECLARED_BYTES));
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap)
            .with_remember(Arc::new(Remember::of([Some(reads.clone())], ["app"])));
        idx.apply(Seen::Added, long, false);
        let gone = idx.resync(vec![], false);
        let kept = &gone[0].object.annotations;
        assert_eq!(kept["spring.cloud.kubernetes.configmap.apps"], apps);
        assert_eq!(kept["acme.io/team"], "x");
        assert!(
            !kept.contains_key("acme.io/payload"),
            "past the budget: {:?}",
            kept.keys()
        );
        // A change of a key nobody reads delivers nothing and keeps it out
        // (the line's hash of all labels and annotations, which
        // `metadataChanges` compares, still follows it).
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap)
            .with_remember(Arc::new(Remember::of([Some(reads.clone())], ["app"])));
        idx.apply(Seen::Added, object(), false);
        let mut relabelled = object();
        relabelled
            .labels
            .insert("helm.sh/chart".into(), "shop-1.2.4".into());
        assert_eq!(idx.apply_noting(Seen::Modified, relabelled, false).0, None);
        assert!(!idx.encode().contains("helm"));
        // One plugin without a declaration: everything is kept.
        assert!(Remember::of([Some(reads.clone()), None], ["app"]).keeps_everything());
        let mut all = ObjectIndex::new(ObjectKind::ConfigMap);
        all.apply(Seen::Added, object(), false);
        assert!(all.encode().contains("description"));
        // Everything kept: long values only of the keys some plugin
        // declares.
        let mut long = object();
        long.annotations.insert(
            "spring.cloud.kubernetes.configmap.apps".into(),
            apps.clone(),
        );
        long.annotations
            .insert("kubernetes.io/description".into(), "d".repeat(600));
        let mut all = ObjectIndex::new(ObjectKind::ConfigMap)
            .with_remember(Arc::new(Remember::of([Some(reads), None], ["app"])));
        all.apply(Seen::Added, long, false);
        let gone = all.resync(vec![], false);
        let kept = &gone[0].object.annotations;
        assert_eq!(kept["spring.cloud.kubernetes.configmap.apps"], apps);
        assert_eq!(kept["meta.helm.sh/release-name"], "shop");
        assert!(!kept.contains_key("kubernetes.io/description"));
    }

    #[test]
    fn the_index_round_trips_through_its_text_form() {
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap);
        idx.apply(
            Seen::Added,
            cm("a", json!({"k": "1", "j.yaml": "x"}), json!({"l": "1"})),
            false,
        );
        idx.apply(Seen::Added, cm("empty", json!({}), json!({})), false);
        let text = idx.encode();
        assert_eq!(text.lines().count(), 2);
        let back = ObjectIndex::decode(ObjectKind::ConfigMap, &text).unwrap();
        assert_eq!(back, idx);
        // A decoded index still recognises repeats and names changed keys.
        let mut back = back;
        assert!(
            back.apply(
                Seen::Modified,
                cm("a", json!({"k": "1", "j.yaml": "x"}), json!({"l": "1"})),
                false
            )
            .is_none()
        );
        let ev = back
            .apply(
                Seen::Modified,
                cm("a", json!({"k": "2", "j.yaml": "x"}), json!({})),
                false,
            )
            .unwrap();
        assert_eq!(ev.changed_keys, vec!["k"]);
        let err = ObjectIndex::decode(ObjectKind::ConfigMap, "ns/a zz 00\n").unwrap_err();
        assert_eq!(err, "object index line 1: bad digest: \"ns/a zz 00\"");
    }

    /// A change of data alone is stored as the hashes that changed (a
    /// patch line), not the whole entry; one of labels or annotations as
    /// the whole entry. Applied in order, both give the newer index.
    #[test]
    fn a_change_of_data_alone_stores_only_the_hashes_that_changed() {
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap);
        idx.apply(
            Seen::Added,
            cm(
                "a",
                json!({"k": "1", "j": "x", "gone": "y"}),
                json!({"l": "1"}),
            ),
            false,
        );
        idx.apply(Seen::Added, cm("b", json!({"k": "1"}), json!({})), false);
        let mut newer = idx.clone();
        newer.apply(
            Seen::Modified,
            cm(
                "a",
                json!({"k": "2", "j": "x", "new": "z"}),
                json!({"l": "1"}),
            ),
            false,
        );
        newer.apply(
            Seen::Modified,
            cm("b", json!({"k": "1"}), json!({"l": "2"})),
            false,
        );
        let delta = idx.delta(&newer, &crate::Scope::All);
        let lines: Vec<&str> = delta.lines().collect();
        assert_eq!(lines.len(), 2, "{delta}");
        let patch: Vec<&str> = lines[0].split(' ').collect();
        assert_eq!(patch[..2], ["ns/a", "+"], "{delta}");
        let keys: Vec<&str> = patch[3]
            .split(';')
            .map(|kv| kv.split('=').next().unwrap())
            .collect();
        assert_eq!(keys, ["k", "new", "gone"], "only what changed: {delta}");
        assert!(
            !lines[1].contains(" + "),
            "a label changed: the whole entry"
        );
        let mut back = idx.clone();
        back.apply_text(&delta).unwrap();
        assert_eq!(back, newer);
        let mut fresh = ObjectIndex::new(ObjectKind::ConfigMap);
        fresh.apply_text(lines[0]).unwrap();
        assert!(
            fresh.is_empty(),
            "a patch of an unknown entry leaves it unknown"
        );
    }

    /// A line keeps 64 bits of the content digest (16 hex); lines written
    /// with 128 (32 hex, before issue 32's format 3) read as their first
    /// 64, so that an unchanged object is still found unchanged.
    #[test]
    fn lines_with_the_digests_of_128_bits_read_as_their_first_64() {
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap);
        let a = || cm("a", json!({"k": "1"}), json!({}));
        idx.apply(Seen::Added, a(), false);
        let line = idx.encode();
        let digest = line.split(' ').nth(1).unwrap();
        assert_eq!(digest.len(), 16, "{line}");
        let full = a().digest();
        assert!(full.starts_with(digest), "{full} {digest}");
        let old = line.replace(digest, &full[..32]);
        let mut back = ObjectIndex::decode(ObjectKind::ConfigMap, &old).unwrap();
        assert_eq!(back, idx);
        assert!(back.resync(vec![a()], false).is_empty(), "unchanged");
        let changed = cm("a", json!({"k": "2"}), json!({}));
        assert_eq!(back.resync(vec![changed], false).len(), 1);
    }

    #[test]
    fn resync_delivers_only_what_changed_during_the_gap() {
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap);
        for i in 0..1000 {
            idx.apply(
                Seen::Added,
                cm(&format!("o{i}"), json!({"v": i.to_string()}), json!({})),
                false,
            );
        }
        // During the gap: o5 changed, o7 deleted, o1000 created, o9 relabelled.
        let after_gap = || -> Vec<ObjectSnapshot> {
            (0..1001)
                .filter(|i| *i != 7)
                .map(|i| match i {
                    5 => cm("o5", json!({"v": "changed"}), json!({})),
                    9 => cm("o9", json!({"v": "9"}), json!({"new": "label"})),
                    _ => cm(&format!("o{i}"), json!({"v": i.to_string()}), json!({})),
                })
                .collect()
        };
        let events = idx.resync(after_gap(), false);
        let got: Vec<(ChangeType, String)> = events
            .iter()
            .map(|e| (e.change, e.object.name.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (ChangeType::Resynced, "o5".to_string()),
                (ChangeType::Added, "o1000".to_string()),
                (ChangeType::Deleted, "o7".to_string()),
            ]
        );
        assert_eq!(events[0].changed_keys, vec!["v"]);
        assert_eq!(idx.len(), 1000);
        // A second resync of the same state delivers nothing.
        assert!(idx.resync(after_gap(), false).is_empty());
    }

    fn at(mut o: ObjectSnapshot, rv: u64) -> ObjectSnapshot {
        o.resource_version = rv.to_string();
        o
    }

    /// Issue 19's first loss: an object goes A → B, B is delivered, the
    /// stored index still says A (it is stored less often), the history is
    /// lost and the object goes back to A. Comparing contents alone finds
    /// nothing; the object's version says it was written after the floor.
    #[test]
    fn a_resync_delivers_an_object_written_after_the_floor_even_with_the_indexed_content() {
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap);
        idx.apply(
            Seen::Added,
            at(cm("x", json!({"k": "A"}), json!({})), 10),
            false,
        );
        idx.apply(
            Seen::Added,
            at(cm("y", json!({"k": "Y"}), json!({})), 11),
            false,
        );
        let list = || {
            vec![
                // Back to A, written at 40, after the floor 20.
                at(cm("x", json!({"k": "A"}), json!({})), 40),
                // Untouched since 11.
                at(cm("y", json!({"k": "Y"}), json!({})), 11),
            ]
        };
        let mut plain = idx.clone();
        assert!(
            plain.resync(list(), false).is_empty(),
            "without a floor the revert is invisible (the old behaviour)"
        );
        let mut r = Resync::new(false).after("20");
        let mut events = idx.resync_page(&mut r, list());
        events.extend(idx.finish_resync(r));
        let got: Vec<_> = events
            .iter()
            .map(|e| (e.change, e.object.name.as_str(), e.changed_keys.clone()))
            .collect();
        assert_eq!(
            got,
            vec![(ChangeType::Resynced, "x", vec!["k".to_string()])]
        );
        // Unparsable versions count as written after the floor.
        let mut r = Resync::new(false).after("20");
        let odd = vec![at(cm("y", json!({"k": "Y"}), json!({})), 0)]
            .into_iter()
            .map(|mut o| {
                o.resource_version = "abc".into();
                o
            })
            .collect();
        assert_eq!(idx.resync_page(&mut r, odd).len(), 1);
    }

    #[test]
    fn a_deletion_found_by_a_resync_carries_the_remembered_labels_and_annotations() {
        let mut idx = ObjectIndex::new(ObjectKind::ConfigMap);
        let mut o = cm(
            "gone",
            json!({"v": "1"}),
            json!({"spring.cloud.kubernetes.config": "true"}),
        );
        o.annotations = [
            (
                "spring.cloud.kubernetes.configmap.apps".to_string(),
                "orders, billing".to_string(),
            ),
            (
                "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                "{}".to_string(),
            ),
            ("big".to_string(), "x".repeat(MAX_REMEMBERED_VALUE + 1)),
        ]
        .into();
        idx.apply(Seen::Added, o, false);
        // Through the stored form, as a new leader gets it.
        let mut idx = ObjectIndex::decode(ObjectKind::ConfigMap, &idx.encode()).unwrap();
        let events = idx.resync(Vec::new(), false);
        assert_eq!(events.len(), 1);
        let gone = &events[0].object;
        assert_eq!(events[0].change, ChangeType::Deleted);
        assert_eq!(gone.labels["spring.cloud.kubernetes.config"], "true");
        assert_eq!(
            gone.annotations.keys().collect::<Vec<_>>(),
            vec!["spring.cloud.kubernetes.configmap.apps"],
            "payload-sized annotations are not remembered"
        );
    }

    fn secret(name: &str, pin: &str, labels: serde_json::Value) -> ObjectSnapshot {
        ObjectSnapshot::from_json(&json!({"kind": "Secret",
            "metadata": {"name": name, "namespace": "shop", "labels": labels},
            "stringData": {"pin": pin, "user": "bob"}}))
        .unwrap()
    }

    fn key(b: u8) -> Option<DigestKey> {
        Some(DigestKey::new(&[b; 32]).unwrap())
    }

    /// The index a version before keys stored, read back by a keyed one.
    fn legacy_then_keyed(objects: &[ObjectSnapshot]) -> ObjectIndex {
        let mut old = ObjectIndex::new(ObjectKind::Secret);
        for o in objects {
            old.apply(Seen::Added, o.clone(), false);
        }
        let text = old.encode();
        assert!(text.contains("pin=5ce1f3164267ac03"), "{text}");
        ObjectIndex::decode(ObjectKind::Secret, &text)
            .unwrap()
            .with_digest_key(key(7))
    }

    #[test]
    fn keyed_secret_digests_reveal_no_plain_hash() {
        let mut idx = ObjectIndex::new(ObjectKind::Secret).with_digest_key(key(7));
        let ev = idx
            .apply(Seen::Added, secret("pin", "1234", json!({})), false)
            .unwrap();
        let plain = secret("pin", "1234", json!({})).digest();
        assert_ne!(ev.digest, plain, "event.digest is keyed");
        assert_eq!(ev.unkeyed_digest.as_deref(), Some(plain.as_str()));
        assert_eq!(ev.digest.len(), 64);
        let text = idx.encode();
        assert!(!text.contains("5ce1f3164267ac03"), "{text}");
        assert!(!text.contains(&plain[..32]), "{text}");
        assert!(
            text.contains(r#"{"k":true}"#),
            "keyed lines are marked: {text}"
        );
        // Read back with the key: the same content is no change.
        let mut back = ObjectIndex::decode(ObjectKind::Secret, &text)
            .unwrap()
            .with_digest_key(key(7));
        assert_eq!(back, idx);
        assert!(
            back.apply(Seen::Added, secret("pin", "1234", json!({})), false)
                .is_none()
        );
        let ev = back
            .apply(Seen::Modified, secret("pin", "9999", json!({})), false)
            .unwrap();
        assert_eq!(ev.changed_keys, vec!["pin"]);
    }

    #[test]
    fn an_index_written_before_keys_compares_equal_until_the_object_changes() {
        let mut idx = legacy_then_keyed(&[
            secret("a", "1234", json!({"app": "shop"})),
            secret("b", "1", json!({})),
        ]);
        // The same content, seen again (a relist, a replayed event): nothing.
        let (ev, changed) = idx.apply_noting(
            Seen::Added,
            secret("a", "1234", json!({"app": "shop"})),
            false,
        );
        assert_eq!(ev, None);
        assert!(changed, "the line is rewritten keyed, and must be saved");
        let text = idx.encode();
        assert!(
            !text.contains("5ce1f3164267ac03"),
            "a's plain hash is gone: {text}"
        );
        assert!(text.contains(r#"shop/a "#) && text.contains(r#""k":true"#));
        // A real change of a legacy line: delivered, with only the key that changed.
        let ev = idx
            .apply(Seen::Modified, secret("b", "2", json!({})), false)
            .unwrap();
        assert_eq!(ev.change, ChangeType::Modified);
        assert_eq!(ev.changed_keys, vec!["pin"]);
        assert_ne!(ev.digest, secret("b", "2", json!({})).digest());
    }

    #[test]
    fn a_resync_against_an_index_written_before_keys_delivers_only_changes() {
        let mut idx = legacy_then_keyed(&[
            secret("a", "1234", json!({})),
            secret("b", "1", json!({})),
            secret("gone", "x", json!({})),
        ]);
        let events = idx.resync(
            vec![secret("a", "1234", json!({})), secret("b", "2", json!({}))],
            false,
        );
        let seen: Vec<(ChangeType, &str, Vec<String>)> = events
            .iter()
            .map(|e| (e.change, e.object.name.as_str(), e.changed_keys.clone()))
            .collect();
        assert_eq!(
            seen,
            vec![
                (ChangeType::Resynced, "b", vec!["pin".to_string()]),
                (ChangeType::Deleted, "gone", vec![]),
            ]
        );
        // Every line is keyed after the resync.
        assert!(!idx.encode().contains("5ce1f3164267ac03"));
    }

    #[test]
    fn keyed_lines_read_without_the_key_or_with_another_count_as_changed() {
        let mut idx = ObjectIndex::new(ObjectKind::Secret).with_digest_key(key(7));
        idx.apply(Seen::Added, secret("a", "1234", json!({})), false);
        let text = idx.encode();
        for other in [None, key(8)] {
            let mut back = ObjectIndex::decode(ObjectKind::Secret, &text)
                .unwrap()
                .with_digest_key(other);
            let ev = back.apply(Seen::Added, secret("a", "1234", json!({})), false);
            assert!(ev.is_some(), "hashes of another key cannot be compared");
        }
    }
}
