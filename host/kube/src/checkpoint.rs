//! Checkpoints: per kind, the last fully handled resourceVersion of each
//! namespace's watch, kept in annotations of a second Lease (the state Lease),
//! in the Spring watcher's format:
//!
//! ```text
//! wasmwatch.io/configmap-resource-version: default=123,prod=456
//! wasmwatch.io/secret-resource-version: default=120
//! wasmwatch.io/term: replica-a/7
//! ```
//!
//! A cluster-wide watch stores its version under the namespace `*`.
//!
//! Fencing: a new leader first *claims* the state Lease, writing its term.
//! Every later write is a `replace` carrying the resourceVersion this leader
//! last wrote or read, so once another leader has claimed the Lease, a stale
//! leader's next write fails with 409 and it must stop ([`CheckpointError::Conflict`]).
//! The store never re-reads to "fix" a 409: a conflict means someone else owns
//! the state now.
//!
//! ## The object index
//!
//! Next to the checkpoints the store keeps, per kind, the [`ObjectIndex`] of
//! handled objects (digests, no payloads), so that a new leader meeting a 410
//! can resynchronise against what its predecessor handled instead of
//! refreshing everything.
//!
//! The rules (issue 19): an index is only ever saved when it is *safe*, that
//! is when every change it has seen was handled (see [`Progress::index`]),
//! and a checkpoint only with an index that covers it ([`Progress`]): the
//! stored index is never *behind* the stored checkpoint, or a successor's
//! resync after a 410 would not know objects created before the checkpoint
//! and miss their deletions.
//!
//! ## A save commits all or nothing (issue 32)
//!
//! The stored index is a log of immutable segments ([`segments`]): Leases
//! `<state>-segment-<n>`, each created once with lines of the index or of
//! a difference to it (both kinds, in runs after each kind's mark), and
//! never written again. The state Lease names them
//! (`wasmwatch.io/index-log: segments=3-9,12 bytes=.. base=.. kinds=..`),
//! holds the newest small differences itself (`wasmwatch.io/index-tail`)
//! and the next segment number (`wasmwatch.io/index-next-segment`). A save creates
//! its new segments first, then writes the state Lease in one conditional
//! write (guarded by the resourceVersion this term last wrote): that write
//! is the commit. A reader follows only what the state Lease names, so a
//! save that fails or dies at any write before the commit leaves the
//! previous state whole (its segments are orphans, numbered from the
//! committed next number on, removed by the next claim), and one that
//! committed is whole too. Segments the commit no longer names (after a
//! full rewrite) are deleted after it, and listed in
//! `wasmwatch.io/index-garbage` until they are. A stale leader cannot
//! commit (409), and a segment it creates in a successor's numbering meets
//! the successor's stamp and stops it.
//!
//! With the index each save commits what a successor may trust of it
//! (`wasmwatch.io/index-trust`, see [`Trust`]): per stream the version the
//! stored part was taken at, and the objects not handled at the save. A
//! SIGTERM handover then replays only those (issue 33).
//!
//! Before segments (format 1) the index was in shards
//! `<state>-index-<kind>-<n>` that every save wrote over one by one, so a
//! failure between two shard writes left a torn index. A claim still reads
//! them (`wasmwatch.io/<kind>-index-shards`); the next save of that kind
//! rewrites the whole index as segments, drops the shard count and deletes
//! the shards.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;

use crate::apis::LeaseApi;
use wasmwatch_core::index::{ObjectIndex, Seen};
use wasmwatch_core::{ObjectKind, ObjectSnapshot, Scope};

use crate::elector::Term;

pub const TERM_ANNOTATION: &str = "wasmwatch.io/term";
/// The UID of the leader Lease the stored term was taken on.
pub const TERM_LEASE_UID_ANNOTATION: &str = "wasmwatch.io/term-lease-uid";
/// On an index shard Lease: that shard's part of the encoded index.
pub const INDEX_ANNOTATION: &str = "wasmwatch.io/index";
/// Largest segment (or format-1 shard) text; Kubernetes allows 256 KiB of
/// annotations per object.
pub const SHARD_BYTES: usize = 200 * 1024;
/// On the state Lease: the number the next new segment takes.
pub const NEXT_SEGMENT_ANNOTATION: &str = "wasmwatch.io/index-next-segment";
/// On the state Lease: Leases no committed state names, still to delete.
pub const GARBAGE_ANNOTATION: &str = "wasmwatch.io/index-garbage";
/// On a segment: the state Lease it belongs to (a label, for operators).
pub const SEGMENT_LABEL: &str = "wasmwatch.io/state";
/// On a segment: the kinds of the index it is part of (for operators; the
/// state Lease decides).
pub const SEGMENT_KIND_ANNOTATION: &str = "wasmwatch.io/index-kind";

mod health;
mod segments;
mod trust;
pub use health::{REPORT_AFTER, SaveHealth};
pub use segments::{
    Log, Plan, Sizes, join_kinds, pack, split_kinds, split_lines as split_shards, unpack,
};
pub use trust::{MAX_UNHANDLED, TRUST_ANNOTATION, Trust, Unhandled};

/// On the state Lease: the segments of the stored index of every kind
/// ([`Log::format`]).
pub const LOG_ANNOTATION: &str = "wasmwatch.io/index-log";
/// On the state Lease: the lines of the stored index that apply after its
/// segments (packed, in runs of one kind as in a segment).
pub const TAIL_ANNOTATION: &str = "wasmwatch.io/index-tail";

/// The state Lease's annotation naming the segments of a kind's index
/// (format 2, read for upgrades).
pub fn log_key(kind: ObjectKind) -> String {
    format!("wasmwatch.io/{}-index-log", kind.stem())
}

/// The state Lease's annotation with the lines of a kind's index that
/// apply after its segments (format 2, read for upgrades).
pub fn tail_key(kind: ObjectKind) -> String {
    format!("wasmwatch.io/{}-index-tail", kind.stem())
}

/// The name of one index segment Lease.
pub fn segment_name(state: &str, seq: u64) -> String {
    format!("{state}-segment-{seq}")
}

/// The state Lease's annotation with the number of index shards of a kind
/// (format 1, read for upgrades).
pub fn shards_key(kind: ObjectKind) -> String {
    format!("wasmwatch.io/{}-index-shards", kind.stem())
}

/// The state Lease's annotation with the stream scopes a kind's stored index
/// covers (`shop,prod`, or `*`): a stream whose scope it lacks has no stored
/// part, not an empty one, and rebuilds one (a save may store only the
/// streams whose index was ready).
pub fn scopes_key(kind: ObjectKind) -> String {
    format!("wasmwatch.io/{}-index-scopes", kind.stem())
}

/// The name of one index shard Lease (format 1).
pub fn shard_name(state: &str, kind: ObjectKind, n: usize) -> String {
    format!("{state}-index-{}-{n}", kind.as_str().to_ascii_lowercase())
}

/// One watch stream's index that became safe to store.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamIndex {
    pub kind: ObjectKind,
    pub scope: Scope,
    pub index: ObjectIndex,
    /// The version the stream's watch had got to when the index was taken
    /// (at most: see [`Trusted`]); `None` when unknown.
    pub at: Option<String>,
}

/// What a new leader starts from.
#[derive(Debug, Clone, Default)]
pub struct Claimed {
    pub checkpoints: Checkpoints,
    /// Per kind, the stored index of handled objects (all namespaces); split
    /// it per stream with [`ObjectIndex::part`].
    pub indexes: BTreeMap<ObjectKind, ObjectIndex>,
    /// Per kind, the stream scopes the stored index covers (see
    /// [`Claimed::covers`]).
    pub covered: BTreeMap<ObjectKind, std::collections::BTreeSet<Scope>>,
    /// Kinds whose stored checkpoints could not be read, with what was
    /// wrong (naming the annotation). Nobody can tell which of their
    /// changes were handled, so their streams must deliver every object
    /// once (at least once, never lost). The store leaves the annotation
    /// as found until [`CheckpointStore::save`] is given checkpoints of that
    /// kind, so a leader failing before then leaves the same instruction to
    /// the next one.
    pub unreadable: BTreeMap<ObjectKind, String>,
    /// Other parts found unreadable and set aside: a term (overwritten by
    /// this claim), an index shard count or an index, or a missing shard
    /// (that kind's watch loops rebuild an index from a list before
    /// watching: see [`crate::watchloop::WatchLoop::with_index`]).
    pub set_aside: Vec<String>,
    /// What the stored index may be trusted for (see [`Trust`]).
    pub trust: Option<Trust>,
}

impl Claimed {
    /// Whether the stored index of `kind` has a part for a stream of
    /// `scope` (else the stream rebuilds one from a list).
    pub fn covers(&self, kind: ObjectKind, scope: &Scope) -> bool {
        self.covered
            .get(&kind)
            .is_some_and(|s| s.contains(&Scope::All) || s.contains(scope))
    }

    /// What a stream of `kind` and `scope` resuming with the stored index
    /// may trust of it (see [`crate::watchloop::WatchLoop::trusting`]).
    pub fn trusted(&self, kind: ObjectKind, scope: &Scope) -> Option<crate::watchloop::Trusted> {
        self.trust.as_ref()?.trusted(kind, scope)
    }

    /// Everything found unreadable, one line each (for the log and an Event).
    pub fn problems(&self) -> Vec<String> {
        self.unreadable
            .values()
            .chain(&self.set_aside)
            .cloned()
            .collect()
    }
}

/// The annotation holding one kind's checkpoints.
pub fn annotation_key(kind: ObjectKind) -> String {
    format!("wasmwatch.io/{}-resource-version", kind.stem())
}

/// Handled resourceVersions: kind -> stream scope -> version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoints {
    versions: BTreeMap<ObjectKind, BTreeMap<Scope, String>>,
}

impl Checkpoints {
    pub fn get(&self, kind: ObjectKind, scope: &Scope) -> Option<&str> {
        self.versions.get(&kind)?.get(scope).map(String::as_str)
    }

    /// Forgets every checkpoint of `kind`.
    pub fn clear(&mut self, kind: ObjectKind) {
        self.versions.remove(&kind);
    }

    pub fn remove(&mut self, kind: ObjectKind, scope: &Scope) {
        if let Some(m) = self.versions.get_mut(&kind) {
            m.remove(scope);
        }
    }

    pub fn set(&mut self, kind: ObjectKind, scope: &Scope, version: &str) {
        self.versions
            .entry(kind)
            .or_default()
            .insert(scope.clone(), version.to_string());
    }

    /// `ns=rv,ns2=rv2` (`*=rv` for all namespaces), sorted.
    pub fn format(&self, kind: ObjectKind) -> Option<String> {
        let m = self.versions.get(&kind).filter(|m| !m.is_empty())?;
        let mut parts: Vec<String> = m
            .iter()
            .map(|(s, rv)| format!("{}={rv}", s.key()))
            .collect();
        parts.sort();
        Some(parts.join(","))
    }

    /// Parses one annotation value; an empty value means no checkpoints.
    pub fn parse_into(&mut self, kind: ObjectKind, value: &str) -> Result<(), String> {
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                // Versions are numbers (etcd's revisions): a watch from
                // anything else would be refused over and over.
                Some((ns, rv))
                    if !ns.is_empty()
                        && !rv.is_empty()
                        && rv.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    self.set(kind, &Scope::from_key(ns), rv);
                }
                _ => {
                    return Err(format!(
                        "{}: invalid entry {part:?}, expected namespace=resourceVersion",
                        &annotation_key(kind)
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `holder/transitions`, the form of [`TERM_ANNOTATION`] (the Lease UID has
/// an annotation of its own, [`TERM_LEASE_UID_ANNOTATION`], so that a binary
/// from before it still reads the term: rollbacks keep working).
impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.holder, self.transitions)
    }
}

fn parse_term(value: &str, lease_uid: &str) -> Option<Term> {
    let (holder, transitions) = value.rsplit_once('/')?;
    Some(Term {
        holder: holder.to_string(),
        transitions: transitions.parse().ok()?,
        lease_uid: lease_uid.to_string(),
    })
}

/// Why the state cannot be claimed or written. Every variant but `Api`
/// means "stop leader work" ([`CheckpointError::is_fenced`]); `Api` is
/// retryable.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The state belongs to a newer term (of this leader Lease, or of the
    /// leader Lease that exists now).
    #[error("fenced: the state Lease belongs to a newer term ({0})")]
    NewerTerm(String),
    /// The stored term cannot be read, and the leader Lease is not held by
    /// this term: nobody can tell whose state it is.
    #[error("fenced: {0}")]
    NotHolder(String),
    /// A write conflicted: another leader claimed the state since.
    #[error("fenced: the state Lease was written by another leader ({0})")]
    Conflict(String),
    /// A save before this store claimed the state.
    #[error("this store has not claimed the state")]
    NotClaimed,
    /// The state Lease holds something we cannot read. Not retryable.
    #[error("state Lease {lease}: {message}")]
    Corrupt { lease: String, message: String },
    /// Retryable.
    #[error("state Lease: {0}")]
    Api(#[from] kube::Error),
}

impl CheckpointError {
    /// Whether leader work must stop (everything but an API error).
    pub fn is_fenced(&self) -> bool {
        !matches!(self, CheckpointError::Api(_))
    }
}

/// Reads and writes the state Lease for one leadership term.
/// The store of one state Lease. `A`: the Lease API (kube's, or the
/// simulator's; see [`crate::apis`]).
pub struct CheckpointStore<A = Api<Lease>> {
    api: A,
    name: String,
    /// The leader Lease the term was taken on (same namespace).
    leader_lease: String,
    term: Term,
    /// The state Lease as this leader last wrote it.
    lease: Option<Lease>,
    /// Per kind, the stored index as the state Lease last committed names
    /// it (all namespaces); a save writes the difference to it. Entries are
    /// shared with the watch loops' copies, so it costs little beside them.
    stored: BTreeMap<ObjectKind, ObjectIndex>,
    /// The segments the committed state names, and its tail.
    log: Log,
    /// Per tier of the log (newest first, see [`segments::TIER_SEGMENTS`]),
    /// the index per kind as the segments before the tier's first hold it:
    /// a merge of the tier writes what changed since. A kind missing had no
    /// lines yet.
    tier_bases: Vec<BTreeMap<ObjectKind, ObjectIndex>>,
    tail: String,
    /// How many saves' deltas the tail holds (a claim counts one for a
    /// tail it finds).
    tail_saves: usize,
    /// Kinds read from an older format (format 1's shards, format 2's
    /// per-kind log): the next save writes the whole index as segments of
    /// the log, and those Leases go.
    legacy: std::collections::BTreeSet<ObjectKind>,
    /// The newest safe index of each stream not committed yet: a failed
    /// save keeps them for the next.
    pending: BTreeMap<(ObjectKind, Scope), ObjectIndex>,
    /// The next segment number: the committed state's, or past the
    /// segments of this term's failed saves (see `orphans`).
    next_segment: u64,
    /// Segments this term created for saves that did not commit: listed
    /// for deletion by the next commit. Their numbers are not used again
    /// in this term, so a retried save does not meet them one by one
    /// (three more requests each; under an API server failing a few
    /// percent of requests, retries of a save of many segments then never
    /// committed, found by the simulator). They run on from the committed
    /// next number without a gap, so a successor's claim finds them too.
    orphans: Vec<u64>,
    /// Leases no committed state names any more, still to delete.
    garbage: Vec<String>,
    /// Largest segment text stored (packed).
    sizes: segments::Sizes,
    /// Per kind, the scopes the stored index covers (claimed, then grown
    /// with every stream index written).
    covered: BTreeMap<ObjectKind, std::collections::BTreeSet<Scope>>,
    /// Kinds whose checkpoints were unreadable at the claim: their
    /// annotation stays as found until a save carries checkpoints of theirs.
    unreadable: std::collections::BTreeSet<ObjectKind>,
    /// Per stream, the version its stored index part was taken at (see
    /// [`Trust`]), as committed.
    stored_at: Checkpoints,
}

impl CheckpointStore {
    /// The store of state Lease `name` for `term`, taken on leader Lease
    /// `leader_lease`, both in `namespace`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        leader_lease: &str,
        term: Term,
    ) -> Self {
        CheckpointStore::with_api(Api::namespaced(client, namespace), name, leader_lease, term)
    }
}

impl<A: LeaseApi> CheckpointStore<A> {
    /// The store of state Lease `name` for `term` through `api`.
    pub fn with_api(api: A, name: &str, leader_lease: &str, term: Term) -> Self {
        CheckpointStore {
            api,
            name: name.to_string(),
            leader_lease: leader_lease.to_string(),
            term,
            lease: None,
            stored: BTreeMap::new(),
            log: Log::default(),
            tier_bases: Vec::new(),
            tail: String::new(),
            tail_saves: 0,
            legacy: Default::default(),
            pending: BTreeMap::new(),
            next_segment: 0,
            orphans: Vec::new(),
            garbage: Vec::new(),
            sizes: segments::Sizes::with_segment(SHARD_BYTES),
            covered: BTreeMap::new(),
            unreadable: Default::default(),
            stored_at: Checkpoints::default(),
        }
    }

    /// Segments of at most `bytes` (packed) instead of [`SHARD_BYTES`]:
    /// tests make indexes of several segments with few objects.
    pub fn segment_bytes(mut self, bytes: usize) -> Self {
        self.sizes.segment = bytes;
        self
    }

    /// All of a save's limits (the simulator: a tail and a rewrite floor
    /// small enough that saves of a few objects write segments).
    pub fn sizes(mut self, sizes: Sizes) -> Self {
        self.sizes = sizes;
        self
    }

    /// Kinds whose checkpoints were unreadable at the claim and have not
    /// been written since: their annotation is left as found while a save
    /// carries no checkpoint of theirs.
    pub fn unreadable_kinds(&self) -> Vec<ObjectKind> {
        self.unreadable.iter().copied().collect()
    }

    /// The state Lease's UID once claimed.
    pub fn uid(&self) -> Option<String> {
        self.lease.as_ref()?.metadata.uid.clone()
    }

    /// Claims the state for this term (creating the Lease on first use) and
    /// returns the stored checkpoints. Fails with `NewerTerm` if the state
    /// already belongs to a newer term.
    pub async fn claim(&mut self) -> Result<Claimed, CheckpointError> {
        let mut set_aside = Vec::new();
        let mut lease = self.state_lease().await?;
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        self.check_term(annotations, &mut set_aside).await?;
        let (checkpoints, unreadable) = read_checkpoints(annotations);
        let trust = read_trust(annotations);
        let named = find_index(annotations, &mut set_aside);
        self.number_segments(annotations, &named, &mut set_aside);
        self.stamp(annotations);
        // Taken over as this term's: a successor of a term that commits
        // nothing trusts what it did.
        let trust = trust.map(|t| Trust {
            term: self.trust_term(),
            ..t
        });
        match trust.as_ref().and_then(Trust::format) {
            Some(v) => annotations.insert(TRUST_ANNOTATION.to_string(), v),
            None => annotations.remove(TRUST_ANNOTATION),
        };
        let stored_scopes: BTreeMap<ObjectKind, String> = ObjectKind::known()
            .into_iter()
            .filter_map(|k| Some((k, annotations.get(&scopes_key(k))?.clone())))
            .collect();
        self.lease = Some(self.replace(&lease).await?);
        let indexes = self
            .read_found(named, &stored_scopes, &mut set_aside)
            .await?;
        self.remove_orphans().await?;
        self.collect_garbage().await;
        self.unreadable = unreadable.keys().copied().collect();
        // A kind whose index was not read (set aside) trusts nothing.
        let trust = trust.map(|mut t| {
            for kind in ObjectKind::known() {
                if !indexes.contains_key(&kind) {
                    t.at.clear(kind);
                    t.unhandled.remove(&kind);
                }
            }
            t
        });
        self.stored_at = trust.as_ref().map(|t| t.at.clone()).unwrap_or_default();
        Ok(Claimed {
            checkpoints,
            indexes,
            covered: self.covered.clone(),
            unreadable,
            set_aside,
            trust,
        })
    }

    /// The state Lease, created when there is none.
    async fn state_lease(&self) -> Result<Lease, CheckpointError> {
        Ok(match self.api.get_opt(&self.name).await? {
            Some(l) => l,
            None => {
                let fresh = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: None,
                };
                match self.api.create(&fresh).await {
                    Ok(l) => l,
                    Err(kube::Error::Api(s)) if s.code == 409 => self.api.get(&self.name).await?,
                    Err(e) => return Err(e.into()),
                }
            }
        })
    }

    /// Whether this term may claim the state: the term stored in it is not
    /// newer (an unreadable one is set aside when the leader Lease is still
    /// this term's).
    async fn check_term(
        &self,
        annotations: &BTreeMap<String, String>,
        set_aside: &mut Vec<String>,
    ) -> Result<(), CheckpointError> {
        if let Some(stored) = annotations.get(TERM_ANNOTATION) {
            let stored_uid = annotations
                .get(TERM_LEASE_UID_ANNOTATION)
                .map_or("", String::as_str);
            match parse_term(stored, stored_uid) {
                // Terms of two incarnations of the leader Lease (deleted
                // and created again): transitions do not compare; the term
                // of the Lease that exists now is the newer one.
                Some(t)
                    if !t.lease_uid.is_empty()
                        && !self.term.lease_uid.is_empty()
                        && t.lease_uid != self.term.lease_uid =>
                {
                    let current = self
                        .api
                        .get_opt(&self.leader_lease)
                        .await?
                        .and_then(|l| l.metadata.uid);
                    if current.as_deref() != Some(self.term.lease_uid.as_str()) {
                        return Err(CheckpointError::NewerTerm(format!(
                            "{stored} (and the leader Lease {} is no longer the one this term holds)",
                            self.leader_lease
                        )));
                    }
                }
                Some(t) if t.transitions > self.term.transitions => {
                    return Err(CheckpointError::NewerTerm(stored.clone()));
                }
                Some(_) => {}
                // Unreadable: no stored term to compare with, so the leader
                // Lease decides: it must still be ours, as taken for this
                // term (a replica whose term is over must not claim). Then
                // this claim writes our term over the bad one.
                None => {
                    let leader = self.api.get_opt(&self.leader_lease).await?;
                    let spec = leader.as_ref().and_then(|l| l.spec.as_ref());
                    let holder = spec.and_then(|s| s.holder_identity.as_deref());
                    let transitions = spec.map(|s| s.lease_transitions.unwrap_or(0));
                    if holder != Some(self.term.holder.as_str())
                        || transitions != Some(self.term.transitions)
                    {
                        return Err(CheckpointError::NotHolder(format!(
                            "the stored term {stored:?} is unreadable and the leader Lease {} is not held by {}",
                            self.leader_lease, self.term
                        )));
                    }
                    set_aside.push(format!(
                        "{TERM_ANNOTATION}: cannot read {stored:?}, expected holder/transitions; replaced by this leader's term"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Numbers new segments past every one named, and takes over the
    /// garbage list (with the segments an older format superseded).
    fn number_segments(
        &mut self,
        annotations: &mut BTreeMap<String, String>,
        named: &NamedIndex,
        set_aside: &mut Vec<String>,
    ) {
        // Never at or below a number named (a hand-edited or missing
        // annotation): a new segment must never meet a committed one.
        let past_named = named
            .stored_logs
            .values()
            .chain(&named.log)
            .flat_map(|(l, _)| l.segments.iter().map(|n| n + 1))
            .chain(named.superseded.iter().map(|n| n + 1))
            .max()
            .unwrap_or(0);
        self.next_segment = match annotations.get(NEXT_SEGMENT_ANNOTATION) {
            Some(v) => v.parse::<u64>().map(|n| n.max(past_named)).unwrap_or_else(|_| {
                set_aside.push(format!(
                    "{NEXT_SEGMENT_ANNOTATION}: {v:?} is not a number; numbering goes on after the segments named"
                ));
                past_named
            }),
            None => past_named,
        };
        self.garbage = annotations
            .get(GARBAGE_ANNOTATION)
            .map(|v| {
                v.split(',')
                    .filter(|n| n.starts_with(&format!("{}-", self.name)))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if !named.superseded.is_empty() {
            self.garbage.extend(
                named
                    .superseded
                    .iter()
                    .map(|&n| segment_name(&self.name, n)),
            );
            annotations.insert(GARBAGE_ANNOTATION.to_string(), self.garbage.join(","));
        }
    }

    /// Reads the stored index the state names (after the claim: no older
    /// leader commits any more), and what namespaces it covers.
    async fn read_found(
        &mut self,
        named: NamedIndex,
        stored_scopes: &BTreeMap<ObjectKind, String>,
        set_aside: &mut Vec<String>,
    ) -> Result<BTreeMap<ObjectKind, ObjectIndex>, CheckpointError> {
        // The indexes are read after the claim: no older leader commits
        // any more (its next state write conflicts), so the segments named
        // now stay as they are.
        let mut indexes = BTreeMap::new();
        let mut found = BTreeMap::new();
        if let Some((log, tail)) = named.log {
            match self.read_log(&log, &tail).await {
                Ok((read, tier_bases)) => {
                    found.extend(read);
                    self.tier_bases = tier_bases;
                    self.log = log;
                    self.tail_saves = usize::from(!tail.is_empty());
                    self.tail = tail;
                }
                Err(CheckpointError::Corrupt { lease, message }) => set_aside.push(format!(
                    "index Lease {lease}: {message}; the stored index is not used"
                )),
                Err(e) => return Err(e),
            }
        }
        for (kind, (log, tail)) in named.stored_logs {
            match self.read_segments(kind, &log, &tail).await {
                Ok(index) => {
                    found.insert(kind, index);
                    self.legacy.insert(kind);
                }
                Err(CheckpointError::Corrupt { lease, message }) => set_aside.push(format!(
                    "index Lease {lease}: {message}; the {} index is not used",
                    kind.as_str()
                )),
                Err(e) => return Err(e),
            }
        }
        for (kind, n) in named.shard_counts {
            match self.read_index(kind, n).await {
                Ok(index) => {
                    found.insert(kind, index);
                    self.legacy.insert(kind);
                }
                Err(CheckpointError::Corrupt { lease, message }) => set_aside.push(format!(
                    "index Lease {lease}: {message}; the {} index is not used",
                    kind.as_str()
                )),
                Err(e) => return Err(e),
            }
        }
        for (kind, index) in found {
            // Written before the scopes annotation existed: the namespaces
            // it has lines for (an empty namespace is then rebuilt: a list,
            // never a loss).
            let covered = match stored_scopes.get(&kind) {
                Some(v) => v
                    .split(',')
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .map(Scope::from_key)
                    .collect(),
                None => index
                    .namespaces()
                    .into_iter()
                    .map(Scope::Namespace)
                    .collect(),
            };
            self.covered.insert(kind, covered);
            self.stored.insert(kind, index.clone());
            indexes.insert(kind, index);
        }
        Ok(indexes)
    }

    /// Reads the stored index of every kind the log holds: its segments in
    /// order, then the tail; and the indexes before each tier's segments.
    #[allow(clippy::type_complexity)]
    async fn read_log(
        &self,
        log: &Log,
        tail: &str,
    ) -> Result<
        (
            BTreeMap<ObjectKind, ObjectIndex>,
            Vec<BTreeMap<ObjectKind, ObjectIndex>>,
        ),
        CheckpointError,
    > {
        let mut indexes: BTreeMap<ObjectKind, ObjectIndex> = log
            .kinds
            .iter()
            .map(|&k| (k, ObjectIndex::new(k)))
            .collect();
        let apply = |indexes: &mut BTreeMap<ObjectKind, ObjectIndex>, text: &str| {
            for (kind, lines) in segments::split_kinds(text, &log.kinds)? {
                let index = indexes.get_mut(&kind).expect("split_kinds keeps to kinds");
                index.apply_text(&lines)?;
            }
            Ok::<(), String>(())
        };
        let starts = log.tier_starts();
        let mut tier_bases = vec![None; starts.len()];
        let mut take_bases = |at: usize, indexes: &BTreeMap<ObjectKind, ObjectIndex>| {
            for (base, _) in tier_bases
                .iter_mut()
                .zip(&starts)
                .filter(|(_, s)| **s == at)
            {
                *base = Some(indexes.clone());
            }
        };
        for (i, &seq) in log.segments.iter().enumerate() {
            take_bases(i, &indexes);
            let name = segment_name(&self.name, seq);
            let text = self.segment_text(&name).await?;
            segments::unpack(&text)
                .and_then(|text| apply(&mut indexes, &text))
                .map_err(|message| CheckpointError::Corrupt {
                    lease: name.clone(),
                    message,
                })?;
        }
        // Copies share their entries: a base costs what changed since.
        take_bases(log.segments.len(), &indexes);
        let tier_bases = tier_bases
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect();
        apply(&mut indexes, tail).map_err(|message| CheckpointError::Corrupt {
            lease: self.name.clone(),
            message: format!("{TAIL_ANNOTATION}: {message}"),
        })?;
        Ok((indexes, tier_bases))
    }

    /// A named segment's text. One that is gone would lose its objects'
    /// entries (at a resync they would count as new and their deletions in
    /// a gap go unseen): the index is set aside instead, and the watch
    /// loops rebuild one from a list.
    async fn segment_text(&self, name: &str) -> Result<String, CheckpointError> {
        self.api
            .get_opt(name)
            .await?
            .and_then(|l| l.metadata.annotations?.remove(INDEX_ANNOTATION))
            .ok_or_else(|| CheckpointError::Corrupt {
                lease: name.to_string(),
                message: "missing".into(),
            })
    }

    /// Reads one kind's stored index of format 2: its segments in order,
    /// then the tail.
    async fn read_segments(
        &self,
        kind: ObjectKind,
        log: &Log,
        tail: &str,
    ) -> Result<ObjectIndex, CheckpointError> {
        let mut index = ObjectIndex::new(kind);
        for &seq in &log.segments {
            let name = segment_name(&self.name, seq);
            let text = self.segment_text(&name).await?;
            segments::unpack(&text)
                .and_then(|text| index.apply_text(&text))
                .map_err(|message| CheckpointError::Corrupt {
                    lease: name.clone(),
                    message,
                })?;
        }
        index
            .apply_text(tail)
            .map_err(|message| CheckpointError::Corrupt {
                lease: self.name.clone(),
                message: format!("{}: {message}", tail_key(kind)),
            })?;
        Ok(index)
    }

    /// Deletes the segments a save created but never committed (it failed,
    /// or its leader died before its state write): they are numbered from
    /// the committed next number on, in a row. Runs after the claim, so no
    /// older leader commits them any more; one stamped by a newer term is
    /// left (fenced).
    async fn remove_orphans(&self) -> Result<(), CheckpointError> {
        let mut seq = self.next_segment;
        while let Some(lease) = self.api.get_opt(&segment_name(&self.name, seq)).await? {
            self.remove_orphan(&lease).await?;
            tracing::info!(lease = %segment_name(&self.name, seq), "removed a segment no save committed");
            seq += 1;
        }
        Ok(())
    }

    /// Deletes a segment no committed state names, as it was read (one
    /// written since is left), unless a newer term stamped it: then this
    /// term is fenced.
    async fn remove_orphan(&self, lease: &Lease) -> Result<(), CheckpointError> {
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        let empty = BTreeMap::new();
        self.check_stamp(lease.metadata.annotations.as_ref().unwrap_or(&empty), name)
            .await?;
        let guard = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: None,
            }),
            ..Default::default()
        };
        match self.api.delete(name, &guard).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the Leases no committed state names any more (best effort:
    /// what fails stays listed in the state Lease for the next try).
    async fn collect_garbage(&mut self) {
        let mut left = Vec::new();
        for name in std::mem::take(&mut self.garbage) {
            match self.api.delete(&name, &Default::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    tracing::debug!(lease = %name, error = %e, "could not delete an unused index Lease yet");
                    left.push(name);
                }
            }
        }
        self.garbage = left;
    }

    /// Reads a kind's index from the shards of format 1 (before segments).
    /// They are read once, after the claim, and never written again: the
    /// next save of the kind rewrites the index as segments.
    async fn read_index(
        &self,
        kind: ObjectKind,
        shards: usize,
    ) -> Result<ObjectIndex, CheckpointError> {
        let mut text = String::new();
        for n in 0..shards {
            let name = shard_name(&self.name, kind, n);
            let shard = self
                .api
                .get_opt(&name)
                .await?
                .and_then(|l| l.metadata.annotations?.remove(INDEX_ANNOTATION));
            match shard {
                Some(t) => text.push_str(&t),
                // A missing shard would lose those objects' entries: at a
                // resync they would count as new, and their deletions in a
                // gap would go unseen. The index is set aside instead (the
                // watch loops rebuild one from a list).
                None => {
                    return Err(CheckpointError::Corrupt {
                        lease: name,
                        message: "missing".into(),
                    });
                }
            }
        }
        ObjectIndex::decode(kind, &text).map_err(|message| CheckpointError::Corrupt {
            lease: shard_name(&self.name, kind, 0),
            message,
        })
    }

    /// Creates segment `seq` with `text`, stamped by this term. One found
    /// in its place is an orphan of an older term's uncommitted save
    /// (written over) or a newer term's (fenced).
    async fn create_segment(
        &self,
        seq: u64,
        kinds: &[ObjectKind],
        text: &str,
    ) -> Result<(), CheckpointError> {
        let name = segment_name(&self.name, seq);
        let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
        let mut annotations = BTreeMap::from([
            (INDEX_ANNOTATION.to_string(), text.to_string()),
            (SEGMENT_KIND_ANNOTATION.to_string(), kinds.join(",")),
        ]);
        self.stamp(&mut annotations);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([(
                    SEGMENT_LABEL.to_string(),
                    self.name.clone(),
                )])),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: None,
        };
        match self.api.create(&lease).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Deleted and created again rather than written over: the
                // shipped Role grants no update of Leases but the two named.
                // (Written since it was read: the create conflicts, and
                // the save is retried.)
                self.remove_orphan(&self.api.get(&name).await?).await?;
                self.api.create(&lease).await?;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Refuses to write a shard stamped by a newer term: a successor claimed
    /// the state while this leader was paused, and writing our (older)
    /// index over its shard would leave it an index behind its checkpoint (a
    /// deletion in the next gap past the history would be lost). A stamp of
    /// another incarnation of the leader Lease is newer when that Lease is
    /// not ours any more (as in `claim`).
    async fn check_stamp(
        &self,
        annotations: &BTreeMap<String, String>,
        name: &str,
    ) -> Result<(), CheckpointError> {
        let stamp = annotations.get(TERM_ANNOTATION).map_or("", String::as_str);
        let uid = annotations
            .get(TERM_LEASE_UID_ANNOTATION)
            .map_or("", String::as_str);
        let Some(t) = parse_term(stamp, uid) else {
            return Ok(());
        };
        let newer = if !t.lease_uid.is_empty()
            && !self.term.lease_uid.is_empty()
            && t.lease_uid != self.term.lease_uid
        {
            let current = self
                .api
                .get_opt(&self.leader_lease)
                .await?
                .and_then(|l| l.metadata.uid);
            current.as_deref() != Some(self.term.lease_uid.as_str())
        } else {
            t.transitions > self.term.transitions
        };
        if newer {
            return Err(CheckpointError::NewerTerm(format!(
                "index Lease {name} was written by {stamp}"
            )));
        }
        Ok(())
    }

    /// This term as [`Trust::term`] names it.
    fn trust_term(&self) -> String {
        trust_term(&self.term.to_string(), &self.term.lease_uid)
    }

    /// Marks the state Lease or a shard as written by this term.
    fn stamp(&self, annotations: &mut BTreeMap<String, String>) {
        annotations.insert(TERM_ANNOTATION.into(), self.term.to_string());
        if self.term.lease_uid.is_empty() {
            annotations.remove(TERM_LEASE_UID_ANNOTATION);
        } else {
            annotations.insert(
                TERM_LEASE_UID_ANNOTATION.into(),
                self.term.lease_uid.clone(),
            );
        }
    }

    /// Writes the checkpoints. A 409 means another leader claimed the state:
    /// `Conflict`, and the caller must stop.
    ///
    /// `indexes` are streams' indexes that became safe since the last
    /// save. All or nothing: the new segments are created first, and only
    /// the state write that names them commits; a save failing anywhere
    /// before leaves the stored state as it was (and the indexes kept for
    /// the next save).
    pub async fn save(
        &mut self,
        checkpoints: &Checkpoints,
        indexes: &[StreamIndex],
    ) -> Result<(), CheckpointError> {
        self.save_with(checkpoints, indexes, &Unhandled::new())
            .await
    }

    /// [`CheckpointStore::save`], committing with it what a successor may
    /// trust of the index (see [`Trust`]): per stream, the objects whose
    /// content as stored may not have reached the apps.
    pub async fn save_with(
        &mut self,
        checkpoints: &Checkpoints,
        indexes: &[StreamIndex],
        unhandled: &Unhandled,
    ) -> Result<(), CheckpointError> {
        let Some(mut lease) = self.lease.clone() else {
            return Err(CheckpointError::NotClaimed);
        };
        let mut stored_at = self.stored_at.clone();
        for ix in indexes {
            self.pending
                .insert((ix.kind, ix.scope.clone()), ix.index.clone());
            match &ix.at {
                Some(v) => stored_at.set(ix.kind, &ix.scope, v),
                None => stored_at.remove(ix.kind, &ix.scope),
            }
        }
        // Every kind the stored index holds: a rewrite writes them all.
        let mut kinds: Vec<ObjectKind> = self.pending.keys().map(|(k, _)| *k).collect();
        kinds.extend(self.legacy.iter().copied());
        kinds.extend(self.stored.keys().copied());
        kinds.sort();
        kinds.dedup();
        let planning = self.planning(&kinds);
        // Worked out off the async workers (differences and text of 10k
        // objects take milliseconds; the copies are cheap, see
        // `ObjectIndex`): changes go on meanwhile. On a current-thread
        // runtime (the simulator's, tests) there are no other workers to
        // keep free, and a blocking thread would make the schedule depend
        // on the machine: worked out in place.
        let (plan, indexes, next) = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread => {
                tokio::task::spawn_blocking(move || planning.plan())
                    .await
                    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
            }
            _ => planning.plan(),
        };
        let mut created = Vec::new();
        for (seq, text) in &plan.create {
            if let Err(e) = self.create_segment(*seq, &plan.log.kinds, text).await {
                self.abandon(created);
                return Err(e);
            }
            created.push(*seq);
        }
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        let (garbage, covered) = self.write_state(annotations, &plan, &kinds, checkpoints, next);
        match Trust::of(self.trust_term(), &stored_at, unhandled).format() {
            Some(v) => annotations.insert(TRUST_ANNOTATION.to_string(), v),
            None => annotations.remove(TRUST_ANNOTATION),
        };
        // The commit: one conditional write.
        match self.replace(&lease).await {
            Ok(l) => self.lease = Some(l),
            Err(e) => {
                self.abandon(created);
                return Err(e);
            }
        }
        self.committed(plan, indexes, next, garbage, covered, checkpoints);
        self.stored_at = stored_at;
        self.collect_garbage().await;
        Ok(())
    }

    /// What a save works out its plan from (copies: cheap, see
    /// [`ObjectIndex`]).
    fn planning(&self, kinds: &[ObjectKind]) -> Planning {
        Planning {
            work: kinds
                .iter()
                .map(|&kind| {
                    let streams: Vec<(Scope, ObjectIndex)> = self
                        .pending
                        .iter()
                        .filter(|((k, _), _)| *k == kind)
                        .map(|((_, s), ix)| (s.clone(), ix.clone()))
                        .collect();
                    let stored = self.stored.get(&kind).cloned();
                    let bases: Vec<ObjectIndex> = self
                        .tier_bases
                        .iter()
                        .map(|b| {
                            b.get(&kind)
                                .cloned()
                                .unwrap_or_else(|| ObjectIndex::new(kind))
                        })
                        .collect();
                    (
                        kind,
                        stored.unwrap_or_else(|| ObjectIndex::new(kind)),
                        bases,
                        streams,
                    )
                })
                .collect(),
            log: self.log.clone(),
            tail: (self.tail.clone(), self.tail_saves),
            // An index read from an older format is rewritten whole.
            rewrite: !self.legacy.is_empty(),
            next: self.next_segment,
            sizes: self.sizes,
        }
    }

    /// Writes into the state Lease's annotations what the save commits:
    /// the log, the tail, the scopes covered, the garbage, the numbering
    /// and the checkpoints; drops any index of an older format. Returns
    /// the garbage list and the scopes covered once committed.
    fn write_state(
        &self,
        annotations: &mut BTreeMap<String, String>,
        plan: &segments::Plan,
        kinds: &[ObjectKind],
        checkpoints: &Checkpoints,
        next: u64,
    ) -> (
        Vec<String>,
        BTreeMap<ObjectKind, std::collections::BTreeSet<Scope>>,
    ) {
        let mut garbage = self.garbage.clone();
        let mut covered = self.covered.clone();
        annotations.insert(LOG_ANNOTATION.to_string(), plan.log.format());
        if plan.tail.is_empty() {
            annotations.remove(TAIL_ANNOTATION);
        } else {
            annotations.insert(TAIL_ANNOTATION.to_string(), segments::pack(&plan.tail));
        }
        garbage.extend(plan.dropped.iter().map(|&n| segment_name(&self.name, n)));
        for &kind in kinds {
            let scopes = covered.entry(kind).or_default();
            scopes.extend(
                self.pending
                    .keys()
                    .filter(|(k, _)| *k == kind)
                    .map(|(_, s)| s.clone()),
            );
            let scopes: Vec<&str> = scopes.iter().map(Scope::key).collect();
            annotations.insert(scopes_key(kind), scopes.join(","));
        }
        for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
            // Any index of an older format goes: read (now rewritten into
            // the log) or set aside (unreadable), it must not stand beside
            // the log (a claim would take it for a rollback's, newer).
            let log = annotations.remove(&log_key(kind));
            annotations.remove(&tail_key(kind));
            let shards = annotations.remove(&shards_key(kind));
            let segments = log.and_then(|v| Log::parse(&v).ok()).map(|l| l.segments);
            let shards = shards.and_then(|v| v.parse::<usize>().ok());
            garbage.extend(
                segments
                    .unwrap_or_default()
                    .into_iter()
                    .map(|n| segment_name(&self.name, n))
                    .chain((0..shards.unwrap_or(0)).map(|i| shard_name(&self.name, kind, i))),
            );
        }
        annotations.insert(NEXT_SEGMENT_ANNOTATION.to_string(), next.to_string());
        garbage.extend(self.orphans.iter().map(|&n| segment_name(&self.name, n)));
        if garbage.is_empty() {
            annotations.remove(GARBAGE_ANNOTATION);
        } else {
            annotations.insert(GARBAGE_ANNOTATION.to_string(), garbage.join(","));
        }
        for kind in ObjectKind::known() {
            match checkpoints.format(kind) {
                Some(v) => annotations.insert(annotation_key(kind), v),
                // Unreadable at the claim and nothing of this kind handled
                // yet: leave it, so that the next leader delivers
                // everything again rather than taking a baseline.
                None if self.unreadable.contains(&kind) => None,
                None => annotations.remove(&annotation_key(kind)),
            };
        }
        (garbage, covered)
    }

    /// The save committed: what the store now holds.
    fn committed(
        &mut self,
        plan: segments::Plan,
        indexes: Vec<(ObjectKind, ObjectIndex)>,
        next: u64,
        garbage: Vec<String>,
        covered: BTreeMap<ObjectKind, std::collections::BTreeSet<Scope>>,
        checkpoints: &Checkpoints,
    ) {
        self.orphans.clear();
        self.next_segment = next;
        self.garbage = garbage;
        self.covered = covered;
        self.pending.clear();
        self.legacy.clear();
        self.log = plan.log;
        self.tail_saves = match plan.tail.is_empty() {
            true => 0,
            false if plan.tail == self.tail => self.tail_saves,
            false => self.tail_saves + 1,
        };
        self.tail = plan.tail;
        let now: BTreeMap<ObjectKind, ObjectIndex> = indexes.iter().cloned().collect();
        match plan.rebased {
            0 => {}
            usize::MAX => self.tier_bases = vec![now],
            merged => {
                // The tier merged into begins where it did; one new begins
                // where the oldest tier merged did.
                while self.tier_bases.len() <= merged {
                    let oldest = self.tier_bases.last().cloned().unwrap_or_default();
                    self.tier_bases.push(oldest);
                }
                self.tier_bases[..merged].fill(now);
            }
        }
        self.stored.extend(indexes);
        for kind in ObjectKind::known() {
            if checkpoints.format(kind).is_some() {
                self.unreadable.remove(&kind);
            }
        }
    }

    /// A save failed after creating segments `created` (in order): they are
    /// orphans, and the next save numbers its segments after them.
    fn abandon(&mut self, created: Vec<u64>) {
        if let Some(&last) = created.last() {
            self.next_segment = last + 1;
        }
        self.orphans.extend(created);
    }

    /// The RV-guarded write of the state Lease. A 409 means another
    /// leader claimed it. Any other failure leaves it unknown whether the
    /// write landed (a connection dropped after it): the Lease is read
    /// back, and while it still holds this term's stamp (nobody claimed
    /// it since) it is the truth: what was written if it says so, else the
    /// version to write over next time. Without this, a response lost
    /// after the commit made every later save conflict and end the term.
    async fn replace(&mut self, lease: &Lease) -> Result<Lease, CheckpointError> {
        let err = match self.api.replace(&self.name, lease).await {
            Ok(l) => return Ok(l),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Err(CheckpointError::Conflict(format!(
                    "write as {} conflicted",
                    self.term
                )));
            }
            Err(e) => e,
        };
        if let Ok(Some(found)) = self.api.get_opt(&self.name).await {
            let a = found.metadata.annotations.as_ref();
            let stamp = |k: &str| a.and_then(|a| a.get(k)).map_or("", String::as_str);
            if stamp(TERM_ANNOTATION) == self.term.to_string()
                && stamp(TERM_LEASE_UID_ANNOTATION) == self.term.lease_uid
            {
                if found.metadata.annotations == lease.metadata.annotations {
                    return Ok(found);
                }
                if let Some(mine) = self.lease.as_mut() {
                    mine.metadata.resource_version = found.metadata.resource_version;
                }
            }
        }
        Err(err.into())
    }
}

/// The checkpoints the state holds, and per kind why they cannot be read.
fn read_checkpoints(
    annotations: &BTreeMap<String, String>,
) -> (Checkpoints, BTreeMap<ObjectKind, String>) {
    let mut checkpoints = Checkpoints::default();
    let mut unreadable = BTreeMap::new();
    for kind in ObjectKind::known() {
        if let Some(v) = annotations.get(&annotation_key(kind))
            && let Err(message) = checkpoints.parse_into(kind, v)
        {
            // Entries before the bad one are not trusted either.
            checkpoints.clear(kind);
            unreadable.insert(
                kind,
                format!("{message}; every {} is delivered once", kind.as_str()),
            );
        }
    }
    (checkpoints, unreadable)
}

/// The trust stored with the index (see [`Trust`]), when the term that
/// wrote it is the one the state names (else a binary from before it led
/// since, and kept it as found).
fn read_trust(annotations: &BTreeMap<String, String>) -> Option<Trust> {
    let value = annotations.get(TRUST_ANNOTATION)?;
    let trust = match Trust::parse(value) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!("{e}; the stored index is not trusted beyond its checkpoint");
            return None;
        }
    };
    let stamp = |k: &str| annotations.get(k).map_or("", String::as_str);
    let term = trust_term(stamp(TERM_ANNOTATION), stamp(TERM_LEASE_UID_ANNOTATION));
    (trust.term == term).then_some(trust)
}

/// [`Trust::term`] of the term stamped `term` (holder/transitions) on the
/// leader Lease of UID `lease_uid`.
fn trust_term(term: &str, lease_uid: &str) -> String {
    format!("{term} {lease_uid}")
}

/// What the state names of the stored index (see [`find_index`]).
struct NamedIndex {
    /// The log of every kind (format 3), and its tail.
    log: Option<(Log, String)>,
    /// Per kind, a log of its own (format 2) and its tail.
    stored_logs: BTreeMap<ObjectKind, (Log, String)>,
    /// Per kind, a shard count (format 1).
    shard_counts: BTreeMap<ObjectKind, usize>,
    /// Segments of a log an older version's index superseded (a rollback
    /// and back): garbage.
    superseded: Vec<u64>,
}

/// What the state names of the stored index: the log of segments of every
/// kind (format 3), or per kind a log of its own (format 2) or shards
/// (format 1), read for upgrades and rollbacks. Drops from `annotations`
/// what a rollback left stale.
fn find_index(
    annotations: &mut BTreeMap<String, String>,
    set_aside: &mut Vec<String>,
) -> NamedIndex {
    // What the state names of the stored index: the log of segments
    // of every kind (format 3), or per kind a log of its own (format
    // 2) or shards (format 1), read for upgrades and rollbacks.
    let mut stored_logs = BTreeMap::new();
    let mut shard_counts = BTreeMap::new();
    let mut superseded = Vec::new();
    for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
        // Both a log and a shard count: a version before segments led
        // after this version's last commit (a rollback). It keeps the
        // annotations it does not know and writes its shard count on
        // every save, while this version drops the count at its first
        // save of the kind: the shards are the newer index, the log
        // (and its tail) is what stood before the rollback.
        // (A shard count that does not parse is no index: the log
        // stays, and the next save drops the count.)
        if annotations
            .get(&shards_key(kind))
            .is_some_and(|n| n.parse::<usize>().is_ok())
            && let Some(v) = annotations.remove(&log_key(kind))
        {
            annotations.remove(&tail_key(kind));
            let stale = Log::parse(&v).map(|l| l.segments).unwrap_or_default();
            tracing::info!(
                kind = kind.as_str(),
                segments = stale.len(),
                "the state holds index shards a version before segments wrote after this version's segments (a rollback and back): the shards are read, the segments deleted"
            );
            superseded.extend(stale);
        }
        if let Some(v) = annotations.get(&log_key(kind)) {
            match Log::parse(v) {
                Ok(log) => {
                    let tail = annotations.get(&tail_key(kind)).map_or("", String::as_str);
                    match segments::unpack(tail) {
                        Ok(tail) => {
                            stored_logs.insert(kind, (log, tail.into_owned()));
                        }
                        Err(e) => set_aside.push(format!(
                            "{}: {e}; the {} index is not used",
                            &tail_key(kind),
                            kind.as_str()
                        )),
                    }
                }
                Err(e) => set_aside.push(format!(
                    "{}: {v:?}: {e}; the {} index is not used",
                    &log_key(kind),
                    kind.as_str()
                )),
            }
        } else if let Some(v) = annotations.get(&shards_key(kind)) {
            match v.parse::<usize>() {
                Ok(n) => {
                    shard_counts.insert(kind, n);
                }
                Err(_) => set_aside.push(format!(
                    "{}: {v:?} is not a shard count; the {} index is not used",
                    &shards_key(kind),
                    kind.as_str()
                )),
            }
        }
    }
    // The log of every kind beside an index of an older format: a
    // version before this one led after this version's last commit (a
    // rollback) and wrote its own, as it does at every save; this
    // version drops them at every save. The older format's index is
    // the newer one; the log is what stood before the rollback.
    // (A per-kind log that cannot be read counts too: the log was
    // still written over by then.)
    let older = [ObjectKind::ConfigMap, ObjectKind::Secret]
        .into_iter()
        .any(|k| annotations.contains_key(&log_key(k)) || annotations.contains_key(&tail_key(k)));
    let mut log = None;
    if let Some(v) = annotations.get(LOG_ANNOTATION).cloned() {
        if older || !shard_counts.is_empty() {
            annotations.remove(LOG_ANNOTATION);
            annotations.remove(TAIL_ANNOTATION);
            let stale = Log::parse(&v).map(|l| l.segments).unwrap_or_default();
            tracing::info!(
                segments = stale.len(),
                "the state holds an index an older version wrote after this version's log (a rollback and back): that index is read, the log's segments deleted"
            );
            superseded.extend(stale);
        } else {
            let tail = annotations.get(TAIL_ANNOTATION).map_or("", String::as_str);
            match Log::parse(&v).and_then(|l| Ok((l, segments::unpack(tail)?.into_owned()))) {
                Ok(found) => log = Some(found),
                Err(e) => set_aside.push(format!(
                    "{LOG_ANNOTATION} or {TAIL_ANNOTATION}: {e}; the stored index is not used"
                )),
            }
        }
    }
    NamedIndex {
        log,
        stored_logs,
        shard_counts,
        superseded,
    }
}

/// What a save works out its plan from, off the async workers.
struct Planning {
    /// Per kind: the stored index, the index each tier began with, and the
    /// streams' new indexes.
    #[allow(clippy::type_complexity)]
    work: Vec<(
        ObjectKind,
        ObjectIndex,
        Vec<ObjectIndex>,
        Vec<(Scope, ObjectIndex)>,
    )>,
    log: Log,
    /// The tail, and how many saves' deltas it holds.
    tail: (String, usize),
    rewrite: bool,
    next: u64,
    sizes: Sizes,
}

impl Planning {
    /// The plan ([`Log::plan`] or a rewrite), the new index of every kind,
    /// and the next segment number.
    fn plan(self) -> (segments::Plan, Vec<(ObjectKind, ObjectIndex)>, u64) {
        let Planning {
            work,
            log,
            tail,
            rewrite,
            mut next,
            sizes,
        } = self;
        let fit = |text: String| {
            let (fit, unfit) = segments::fit_lines(&text, SHARD_BYTES);
            for object in unfit.shortened {
                tracing::warn!(
                    %object,
                    "object's entry too large for the stored index; stored without its key hashes and labels (a new leader reports every key of it changed)"
                );
            }
            for object in unfit.removed {
                tracing::warn!(
                    %object,
                    "object too large for the stored index; a resync will deliver it again"
                );
            }
            fit.into_owned()
        };
        let mut deltas = Vec::new();
        let mut indexes = Vec::new();
        let mut tier_bases = Vec::new();
        for (kind, mut index, bases, streams) in work {
            let mut delta = String::new();
            for (scope, ix) in &streams {
                delta.push_str(&index.delta(ix, scope));
                index.replace_part(scope, ix);
            }
            deltas.push((kind, fit(delta)));
            indexes.push((kind, index));
            tier_bases.push(bases);
        }
        let full = || segments::join_kinds(indexes.iter().map(|(k, ix)| (*k, fit(ix.encode()))));
        // What changed since tier `t` began.
        let merged = |t: usize| {
            segments::join_kinds(indexes.iter().zip(&tier_bases).map(|((k, ix), bases)| {
                let empty = ObjectIndex::new(*k);
                let base = bases.get(t).unwrap_or(&empty);
                (*k, fit(base.delta(ix, &Scope::All)))
            }))
        };
        let mut plan = if rewrite {
            log.rewrite(&full(), &mut next, sizes.segment)
        } else {
            let tail = (tail.0.as_str(), tail.1);
            let delta = segments::join_kinds(deltas);
            log.plan(tail, &delta, full, merged, &mut next, sizes)
        };
        plan.log.kinds = indexes.iter().map(|(k, _)| *k).collect();
        (plan, indexes, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_format_round_trips() {
        let mut c = Checkpoints::default();
        c.parse_into(ObjectKind::ConfigMap, "prod=456, default=123")
            .unwrap();
        c.set(ObjectKind::Secret, &Scope::from_key("*"), "99");
        assert_eq!(
            c.format(ObjectKind::ConfigMap).unwrap(),
            "default=123,prod=456"
        );
        assert_eq!(c.get(ObjectKind::Secret, &Scope::from_key("*")), Some("99"));
        assert_eq!(c.get(ObjectKind::Secret, &Scope::from_key("prod")), None);
        for bad in ["prod=abc", "prod=1=2", "=5", "prod="] {
            assert!(
                Checkpoints::default()
                    .parse_into(ObjectKind::ConfigMap, bad)
                    .is_err(),
                "{bad}"
            );
        }
        let e = c.parse_into(ObjectKind::ConfigMap, "prod").unwrap_err();
        assert_eq!(
            e,
            "wasmwatch.io/configmap-resource-version: invalid entry \"prod\", expected namespace=resourceVersion"
        );
        assert!(
            Checkpoints::default()
                .format(ObjectKind::ConfigMap)
                .is_none()
        );
        assert_eq!(
            parse_term("ns/pod-a/7", "3c1e4a52"),
            Some(Term {
                holder: "ns/pod-a".into(),
                transitions: 7,
                lease_uid: "3c1e4a52".into(),
            })
        );
        assert_eq!(parse_term("pod-a", ""), None);
        assert_eq!(parse_term("pod-a/x", ""), None);
    }
}

/// A change handed out for handling; complete it when all its actions were
/// executed or dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    stream: usize,
    seq: u64,
}

/// One entry of a stream's queue, in stream order.
#[derive(Debug)]
enum Entry {
    /// A change handed out; done once handled. `version: None` only waits
    /// its turn (it can never be a checkpoint).
    Change {
        seq: u64,
        version: Option<String>,
        done: bool,
        /// Its object (namespace, name), for [`Progress::unhandled`].
        object: Option<Box<(String, String)>>,
    },
    /// Nothing to handle up to `version`. `changes_index`: the loop's index
    /// changed with it (a list, a label-only change), so the checkpoint may
    /// pass it only with an index taken after it.
    Progress {
        version: String,
        changes_index: bool,
    },
    /// The loop's index after everything before it, and the version of
    /// the last entry with one before it.
    Index(ObjectIndex, Option<String>),
}

impl Entry {
    fn done(&self) -> bool {
        !matches!(self, Entry::Change { done: false, .. })
    }
}

#[derive(Debug)]
struct Stream {
    kind: Option<ObjectKind>,
    scope: Scope,
    /// The position in the stream of `pending`'s first entry. Every entry,
    /// of any kind, takes the next position, and a change's ticket carries
    /// its own, so completing a ticket finds its entry at once (a burst
    /// keeps thousands pending; a scan per completion was 1.6% of the
    /// saturated profile, issue 24).
    front: u64,
    /// The position of the next entry pushed.
    next_pos: u64,
    /// The version of the last entry pushed that had one: an index pushed
    /// now was taken with every change up to it applied.
    pushed: Option<String>,
    /// The objects the newest index the loop sent has unverified (see
    /// [`ObjectIndex::unverified_keys`]); `None`: too many, or no index
    /// yet (the stream's start is not known to be verified).
    unverified: Option<BTreeSet<(String, String)>>,
    pending: std::collections::VecDeque<Entry>,
    /// The last version of the completed prefix.
    last: Option<String>,
    /// No index-changing entry completed since the last safe index: the
    /// index to be stored covers everything up to `last`.
    covered: bool,
    /// The changes that remove an object from the index (a deletion) and
    /// are not handled yet, by position, with the object as it was: an
    /// index taken after one of them is stored only with the object put
    /// back (it would hide the deletion from a successor).
    removals: BTreeMap<u64, ObjectSnapshot>,
    /// Positions of indexes taken after such a removal, in order.
    blocked: std::collections::VecDeque<u64>,
    /// The newest index handed out to be stored (see [`Offered`]): once
    /// one of the deletions it put back is handled, it is offered again
    /// without that object.
    handed_index: Option<Offered>,
    /// The position of the newest index that may be stored (ready or
    /// handed out): it is stored with any checkpoint taken from now on, so
    /// the checkpoint may pass every handled entry before it, even while
    /// later changes are not handled yet (none of them a deletion). Without
    /// this the checkpoint waited for an index taken after the handled
    /// prefix and before anything else, and a handover replayed a few
    /// seconds of handled changes (issue 32).
    storable: u64,
}

impl Stream {
    /// Appends the entry made for the next position; returns the position.
    fn push(&mut self, entry: impl FnOnce(u64) -> Entry) -> u64 {
        let pos = self.next_pos;
        self.next_pos += 1;
        let entry = entry(pos);
        match &entry {
            Entry::Change {
                version: Some(v), ..
            } => self.pushed = Some(v.clone()),
            Entry::Progress { version, .. } if !version.is_empty() => {
                self.pushed = Some(version.clone())
            }
            _ => {}
        }
        self.pending.push_back(entry);
        pos
    }

    /// `plain`, the loop's index at `pos`, to offer with `put_back`
    /// (none for a stream without a kind).
    fn offered(
        &self,
        pos: u64,
        (plain, at): (ObjectIndex, Option<String>),
        put_back: BTreeMap<u64, ObjectSnapshot>,
    ) -> Option<Offered> {
        Some(Offered {
            pos,
            kind: self.kind?,
            scope: self.scope.clone(),
            plain,
            put_back,
            at,
        })
    }
}

/// Decides how far each watch stream's checkpoint may advance: only past
/// versions whose changes, and all changes before them, are handled. The
/// caller writes [`Progress::checkpoints`] with [`CheckpointStore::save`]
/// when [`Progress::take_dirty`] says so, at most every so often (batching).
///
/// It also decides when a watch loop's [`ObjectIndex`] is safe to store:
/// once every change the loop had seen when it took the index is handled.
///
/// And the checkpoint never passes what a safe index covers: past a change
/// (or a list, or a label-only change) it moves only once an index taken
/// after it is safe, and [`Progress::take_indexes`] hands that index out
/// with the checkpoint, so the store writes them in one round. A successor
/// that meets a 410 then resyncs against an index that knows every object
/// up to the checkpoint: one created and delivered before it, then deleted
/// while nobody led, is found missing and its deletion delivered (issue
/// 19: with the index stored every 5 s and the checkpoint every 2 s, such a
/// deletion was lost).
#[derive(Debug, Default)]
pub struct Progress {
    streams: Vec<Stream>,
    checkpoints: Checkpoints,
    dirty: bool,
    /// Per stream, the newest index that may be stored.
    ready: BTreeMap<usize, Offered>,
}

/// An index that may be stored: a watch loop's index at `pos` in its
/// stream, with the objects of the deletions not handled when it was
/// offered put back (by the deletion's position).
#[derive(Debug, Clone)]
struct Offered {
    pos: u64,
    kind: ObjectKind,
    scope: Scope,
    plain: ObjectIndex,
    put_back: BTreeMap<u64, ObjectSnapshot>,
    /// See [`StreamIndex::at`].
    at: Option<String>,
}

impl Offered {
    /// Newer is later: by position, then with fewer objects put back
    /// (the plain index at a position is newer than any patched copy).
    fn key(&self) -> (u64, usize) {
        (self.pos, usize::MAX - self.put_back.len())
    }

    /// The checkpoint may pass every handled entry before this position
    /// with it stored: up to the first deletion it puts back.
    fn cover(&self) -> u64 {
        self.put_back.keys().next().copied().unwrap_or(self.pos)
    }

    fn stream_index(&self) -> StreamIndex {
        let mut index = self.plain.clone();
        for object in self.put_back.values() {
            if !index.contains(&object.namespace, &object.name) {
                index.apply(Seen::Added, object.clone(), false);
            }
        }
        StreamIndex {
            kind: self.kind,
            scope: self.scope.clone(),
            index,
            at: self.at.clone(),
        }
    }
}

impl Progress {
    /// Starts from the stored checkpoints.
    pub fn new(checkpoints: Checkpoints) -> Self {
        Progress {
            streams: Vec::new(),
            checkpoints,
            dirty: false,
            ready: BTreeMap::new(),
        }
    }

    /// Registers a watch stream; returns its id.
    ///
    /// The stream starts covered: its stored checkpoint and the stored index
    /// belong together (a checkpoint is only ever saved with an index that
    /// covers it).
    pub fn stream(&mut self, kind: ObjectKind, scope: Scope) -> usize {
        self.streams.push(Stream {
            kind: Some(kind),
            scope,
            front: 0,
            next_pos: 0,
            pushed: None,
            unverified: None,
            pending: Default::default(),
            last: None,
            covered: true,
            removals: BTreeMap::new(),
            blocked: Default::default(),
            handed_index: None,
            storable: 0,
        });
        self.streams.len() - 1
    }

    /// A change at `resource_version` was handed out (`None`: a change
    /// without a version of its own, which only waits its turn).
    pub fn change(&mut self, stream: usize, resource_version: Option<&str>) -> Ticket {
        self.change_of(stream, resource_version, None)
    }

    /// [`Progress::change`] of a change that `removes` its object from the
    /// index (a deletion): until it is handled, no index taken after it is
    /// stored.
    pub fn change_of(
        &mut self,
        stream: usize,
        resource_version: Option<&str>,
        removes: Option<&ObjectSnapshot>,
    ) -> Ticket {
        let object = removes.map(|o| (o.namespace.clone(), o.name.clone()));
        self.change_to(stream, resource_version, object, removes)
    }

    /// [`Progress::change_of`] of a change to `object` (namespace, name):
    /// until it is handled, [`Progress::unhandled`] names it.
    pub fn change_to(
        &mut self,
        stream: usize,
        resource_version: Option<&str>,
        object: Option<(String, String)>,
        removes: Option<&ObjectSnapshot>,
    ) -> Ticket {
        let s = &mut self.streams[stream];
        let seq = s.push(|seq| Entry::Change {
            seq,
            // An empty version can never be a checkpoint (the state Lease
            // format refuses it).
            version: resource_version
                .filter(|v| !v.is_empty())
                .map(str::to_string),
            done: false,
            object: object.map(Box::new),
        });
        if let Some(object) = removes {
            s.removals.insert(seq, object.clone());
        }
        Ticket { stream, seq }
    }

    /// Nothing to handle up to `resource_version`, and the loop's index is
    /// as it was.
    pub fn progress(&mut self, stream: usize, resource_version: &str) {
        self.push_progress(stream, resource_version, false);
    }

    /// Nothing to handle up to `resource_version`, but the loop's index
    /// changed (a list, a label-only change): the checkpoint passes it only
    /// with the next index.
    pub fn remembered(&mut self, stream: usize, resource_version: &str) {
        self.push_progress(stream, resource_version, true);
    }

    fn push_progress(&mut self, stream: usize, resource_version: &str, changes_index: bool) {
        self.streams[stream].push(|_| Entry::Progress {
            version: resource_version.to_string(),
            changes_index,
        });
        self.advance(stream);
    }

    /// The stream's loop took this index after everything it reported so
    /// far: it becomes safe to store (see [`Progress::take_indexes`]) once
    /// all those changes are handled.
    ///
    /// It may be stored earlier, before the changes are handled: a
    /// successor's resync after a 410 delivers every object written after
    /// its checkpoint whatever the index says (additions and modifications
    /// cannot be hidden by an index ahead of the checkpoint), but an index
    /// without an unhandled deletion's object would hide that deletion, so
    /// such objects are put back into the copy stored (a relist finds them
    /// gone). So an object created and handed out is in a stored index
    /// soon, before its deletion in a gap could be missed (issue 32; the
    /// term holds a creation's actions until then).
    pub fn index(&mut self, stream: usize, index: ObjectIndex) {
        let s = &mut self.streams[stream];
        s.unverified = index.unverified_keys(MAX_UNHANDLED);
        // The objects of unhandled deletions put back: a successor
        // relisting finds them gone and delivers their deletions. Without
        // this a deletion whose action waits (an app answering 503,
        // retried for up to half a minute by default) held back every
        // index, and every creation waiting for one (found by the
        // simulator).
        let pos = s.next_pos;
        let patched = match s.removals.is_empty() {
            true => None,
            false => s.offered(pos, (index.clone(), s.pushed.clone()), s.removals.clone()),
        };
        let at = s.pushed.clone();
        s.push(|_| Entry::Index(index, at));
        if s.removals.is_empty() {
            self.storable(stream, pos);
        } else {
            s.blocked.push_back(pos);
            if let Some(offered) = patched {
                self.offer(stream, offered);
            }
        }
        self.advance(stream);
    }

    /// The index at `pos` (still pending) may be stored.
    fn storable(&mut self, stream: usize, pos: u64) {
        let s = &self.streams[stream];
        let at = pos.checked_sub(s.front).map(|i| i as usize);
        if let Some(Entry::Index(index, version)) = at.and_then(|i| s.pending.get(i))
            && let Some(offered) = s.offered(pos, (index.clone(), version.clone()), BTreeMap::new())
        {
            self.offer(stream, offered);
        }
    }

    /// Keeps `offered` as the stream's newest index to store, unless a
    /// newer one is ready or was handed out (see [`Offered::key`]).
    fn offer(&mut self, stream: usize, offered: Offered) {
        let s = &self.streams[stream];
        let key = offered.key();
        if s.handed_index.as_ref().is_some_and(|h| key <= h.key())
            || self.ready.get(&stream).is_some_and(|r| key <= r.key())
        {
            return;
        }
        self.make_ready(stream, offered);
    }

    fn make_ready(&mut self, stream: usize, offered: Offered) {
        let cover = offered.cover();
        self.ready.insert(stream, offered);
        let s = &mut self.streams[stream];
        if cover > s.storable {
            s.storable = cover;
            self.advance_covered(stream);
        }
    }

    /// The deletion at `pos` is handled: the newest index to store no
    /// longer puts its object back. Else the checkpoint, free to pass the
    /// deletion now, would be stored with an index that still has the
    /// object, and a successor never delivers its deletion (found by the
    /// simulator, seed 17798: a second deletion pending kept the plain
    /// index from being offered, and the copy ready put both back).
    fn unput(&mut self, stream: usize, pos: u64) {
        let s = &self.streams[stream];
        let newest = match self.ready.get(&stream) {
            Some(r) => Some(r),
            None => s.handed_index.as_ref(),
        };
        let Some(mut offered) = newest.filter(|o| o.put_back.contains_key(&pos)).cloned() else {
            return;
        };
        offered.put_back.remove(&pos);
        self.make_ready(stream, offered);
    }

    /// An index still pending became storable: everything popped so far
    /// is before it, so the checkpoint may take the completed prefix's
    /// last version (stored with that index).
    fn advance_covered(&mut self, stream: usize) {
        let s = &mut self.streams[stream];
        if s.front > s.storable {
            return;
        }
        s.covered = true;
        if let (Some(rv), Some(kind)) = (s.last.clone(), s.kind)
            && self.checkpoints.get(kind, &s.scope) != Some(rv.as_str())
        {
            self.checkpoints.set(kind, &s.scope, &rv);
            self.dirty = true;
        }
    }

    /// The change behind `ticket` is fully handled.
    pub fn complete(&mut self, ticket: Ticket) {
        let s = &mut self.streams[ticket.stream];
        // Before `front`: completed and popped already.
        let at = ticket.seq.checked_sub(s.front).map(|i| i as usize);
        if let Some(Entry::Change { seq, done, .. }) = at.and_then(|i| s.pending.get_mut(i)) {
            debug_assert_eq!(*seq, ticket.seq, "a ticket's position is its entry's");
            *done = true;
        }
        if s.removals.remove(&ticket.seq).is_some() {
            self.unput(ticket.stream, ticket.seq);
            let s = &mut self.streams[ticket.stream];
            let first = s.removals.keys().next().copied().unwrap_or(u64::MAX);
            let mut newest = None;
            while s.blocked.front().is_some_and(|p| *p < first) {
                newest = s.blocked.pop_front();
            }
            if let Some(pos) = newest {
                self.storable(ticket.stream, pos);
            }
        }
        self.advance(ticket.stream);
    }

    fn advance(&mut self, stream: usize) {
        let s = &mut self.streams[stream];
        // The furthest version the checkpoint may take now, and the newest
        // index that became safe.
        let mut to = None;
        let mut safe = None;
        while s.pending.front().is_some_and(Entry::done) {
            // An index taken after this entry will be stored with the
            // checkpoint: it covers the entry (see `Stream::storable`).
            let ahead = s.front < s.storable;
            s.front += 1;
            match s.pending.pop_front().expect("front") {
                Entry::Change { version, .. } => {
                    s.covered = ahead;
                    if version.is_some() {
                        s.last = version;
                    }
                    if ahead {
                        to = s.last.clone().or(to);
                    }
                }
                Entry::Progress {
                    version,
                    changes_index,
                } => {
                    s.covered = ahead || (s.covered && !changes_index);
                    // An empty version can never be a checkpoint.
                    if !version.is_empty() {
                        if s.covered {
                            to = Some(version.clone());
                        }
                        s.last = Some(version);
                    }
                }
                Entry::Index(index, at) => {
                    safe = Some((s.front - 1, (index, at)));
                    s.covered = true;
                    to = s.last.clone().or(to);
                }
            }
        }
        if let (Some(rv), Some(kind)) = (to, s.kind)
            && self.checkpoints.get(kind, &s.scope) != Some(rv.as_str())
        {
            self.checkpoints.set(kind, &s.scope, &rv);
            self.dirty = true;
        }
        if let Some(offered) = safe.and_then(|(pos, plain)| s.offered(pos, plain, BTreeMap::new()))
        {
            self.offer(stream, offered);
        }
    }

    /// The objects of stream `stream` whose content, as any index it
    /// stores or stored has it, may not have reached the apps: those of
    /// changes not handled yet, and those the newest index the loop sent
    /// has unverified. `None`: more than [`MAX_UNHANDLED`], or not known
    /// (no index sent yet): every object then.
    pub fn unhandled(&self, stream: usize) -> Option<BTreeSet<(String, String)>> {
        let s = &self.streams[stream];
        let mut keys = s.unverified.clone()?;
        for e in &s.pending {
            if let Entry::Change {
                done: false,
                object: Some(o),
                ..
            } = e
            {
                keys.insert((**o).clone());
            }
        }
        (keys.len() <= MAX_UNHANDLED).then_some(keys)
    }

    /// [`Progress::unhandled`] of every stream with a kind.
    pub fn unhandled_all(&self) -> Unhandled {
        self.streams
            .iter()
            .enumerate()
            .filter_map(|(id, s)| Some(((s.kind?, s.scope.clone()), self.unhandled(id))))
            .collect()
    }

    /// Changes handed out and not yet complete, over all streams.
    pub fn in_flight(&self) -> usize {
        self.streams
            .iter()
            .map(|s| s.pending.iter().filter(|e| !e.done()).count())
            .sum()
    }

    pub fn checkpoints(&self) -> &Checkpoints {
        &self.checkpoints
    }

    /// Whether every stream of `kind` has a checkpoint.
    pub fn has_checkpoints(&self, kind: ObjectKind) -> bool {
        self.streams
            .iter()
            .filter(|s| s.kind == Some(kind))
            .all(|s| self.checkpoints.get(kind, &s.scope).is_some())
    }

    /// Whether the checkpoints moved since the last call.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// The indexes that may be stored, newest per stream, not handed out
    /// before: safe ones, and newer ones taken before their changes were
    /// handled (see [`Progress::index`]).
    pub fn take_indexes(&mut self) -> Vec<StreamIndex> {
        std::mem::take(&mut self.ready)
            .into_iter()
            .map(|(stream, offered)| {
                let ix = offered.stream_index();
                self.streams[stream].handed_index = Some(offered);
                ix
            })
            .collect()
    }

    /// Whether an index is ready to be handed out.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// One past the position of the newest index of `stream` handed out by
    /// [`Progress::take_indexes`]: once it is stored, every change of the
    /// stream before it is in the stored index.
    pub fn handed(&self, stream: usize) -> u64 {
        self.streams[stream]
            .handed_index
            .as_ref()
            .map_or(0, |o| o.pos + 1)
    }

    /// The stream and position of a ticket's change.
    pub fn position(ticket: Ticket) -> (usize, u64) {
        (ticket.stream, ticket.seq)
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    fn index_of(lines: &str) -> ObjectIndex {
        ObjectIndex::decode(ObjectKind::ConfigMap, lines).unwrap()
    }

    fn one_object() -> ObjectIndex {
        index_of(&format!("prod/a {:032x} {:016x} \n", 1, 2))
    }

    fn key(name: &str) -> (String, String) {
        ("prod".to_string(), name.to_string())
    }

    /// Issue 33: what a save says a successor must not trust. Nothing is
    /// known before the loop's first index; then the objects of changes
    /// not handled, and those the index has unverified. An index carries
    /// the version of the last entry before it.
    #[test]
    fn unhandled_names_the_objects_of_changes_not_handled_and_an_index_its_version() {
        let mut p = Progress::new(Checkpoints::default());
        let s = p.stream(ObjectKind::ConfigMap, Scope::from_key("prod"));
        assert_eq!(p.unhandled(s), None, "no index yet");
        let a = p.change_to(s, Some("11"), Some(key("a")), None);
        let b = p.change_to(s, Some("12"), Some(key("b")), None);
        p.progress(s, "13");
        p.index(s, one_object());
        let c = p.change_to(s, Some("14"), Some(key("c")), None);
        p.complete(b);
        assert_eq!(p.unhandled(s), Some(BTreeSet::from([key("a"), key("c")])));
        let ready = p.take_indexes();
        assert_eq!(ready.len(), 1, "stored early, before a is handled");
        assert_eq!(ready[0].at.as_deref(), Some("13"));
        p.complete(a);
        p.complete(c);
        assert_eq!(p.unhandled(s), Some(BTreeSet::new()));
        let mut unverified = one_object();
        unverified.mark_unverified();
        p.index(s, unverified);
        assert_eq!(p.unhandled(s), Some(BTreeSet::from([key("a")])));
        let all = p.unhandled_all();
        assert_eq!(
            all.get(&(ObjectKind::ConfigMap, Scope::from_key("prod"))),
            Some(&Some(BTreeSet::from([key("a")])))
        );
    }

    /// What the delivery of every object (an unreadable checkpoint) relies
    /// on: its changes are handed out without a version, so the stream has
    /// no checkpoint until the progress after the last of them, whatever
    /// was handled before.
    #[test]
    fn changes_without_a_version_hold_the_checkpoint_until_the_progress_after_them() {
        let mut p = Progress::new(Checkpoints::default());
        let s = p.stream(ObjectKind::ConfigMap, Scope::from_key("*"));
        let page1: Vec<_> = (0..3).map(|_| p.change(s, None)).collect();
        for t in page1 {
            p.complete(t);
        }
        assert!(!p.has_checkpoints(ObjectKind::ConfigMap), "after page 1");
        let page2 = p.change(s, None);
        p.remembered(s, "40");
        p.index(s, one_object());
        assert!(
            !p.has_checkpoints(ObjectKind::ConfigMap),
            "page 2 in flight"
        );
        p.complete(page2);
        assert!(p.has_checkpoints(ObjectKind::ConfigMap));
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("*")),
            Some("40")
        );
        // A kind without streams has nothing missing.
        assert!(p.has_checkpoints(ObjectKind::Secret));
    }

    #[test]
    fn the_checkpoint_passes_a_version_only_when_everything_before_it_is_handled() {
        let mut p = Progress::new(Checkpoints::default());
        let s = p.stream(ObjectKind::ConfigMap, Scope::from_key("prod"));
        let a = p.change(s, Some("10"));
        let b = p.change(s, Some("11"));
        p.progress(s, "12"); // a bookmark
        p.index(s, one_object());
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("prod")),
            None
        );
        assert!(!p.take_dirty());
        // The later change finishes first: still nothing, 10 is in flight.
        p.complete(b);
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("prod")),
            None
        );
        assert_eq!(p.in_flight(), 1);
        // Now everything up to the bookmark is done.
        p.complete(a);
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("prod")),
            Some("12")
        );
        assert!(p.take_dirty());
        assert!(!p.take_dirty(), "one write per advance");
        assert_eq!(p.in_flight(), 0);
    }

    /// Tickets find their entries by position: completed in any order,
    /// between bookmarks and indexes, after a prefix was popped, and twice.
    #[test]
    fn tickets_complete_in_any_order_across_other_entries_and_popped_prefixes() {
        let mut p = Progress::new(Checkpoints::default());
        let s = p.stream(ObjectKind::ConfigMap, Scope::from_key("prod"));
        let at = |p: &Progress| {
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("prod"))
                .map(str::to_string)
        };
        let a = p.change(s, Some("10"));
        p.progress(s, "11");
        let b = p.change(s, Some("12"));
        p.index(s, one_object());
        let c = p.change(s, Some("13"));
        p.complete(a);
        // Done up to the bookmark, and the index taken after b may be
        // stored (b and c are no deletions): it covers a and the bookmark.
        assert_eq!(at(&p), Some("11".into()), "a done, an index after it");
        p.complete(a);
        assert_eq!(p.in_flight(), 2, "a second completion changes nothing");
        // Later entries pushed after the prefix went: positions still hold.
        let d = p.change(s, Some("14"));
        p.complete(d);
        p.complete(c);
        assert_eq!(at(&p), Some("11".into()), "b still in flight");
        p.complete(b);
        assert_eq!(at(&p), Some("12".into()), "up to the index after b");
        assert_eq!(p.in_flight(), 0);
        // And again after everything was popped.
        let e = p.change(s, Some("15"));
        p.progress(s, "16");
        p.complete(e);
        p.index(s, one_object());
        assert_eq!(at(&p), Some("16".into()));
    }

    #[test]
    fn streams_advance_independently_and_start_from_the_stored_state() {
        let mut stored = Checkpoints::default();
        stored.set(ObjectKind::Secret, &Scope::from_key("*"), "5");
        let mut p = Progress::new(stored);
        let cm = p.stream(ObjectKind::ConfigMap, Scope::from_key("a"));
        let sec = p.stream(ObjectKind::Secret, Scope::from_key("*"));
        let t = p.change(cm, Some("7"));
        p.progress(sec, "8");
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::Secret, &Scope::from_key("*")),
            Some("8")
        );
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("a")),
            None
        );
        p.complete(t);
        p.index(cm, one_object());
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("a")),
            Some("7")
        );
        // Many events, one dirty flag: the caller batches the writes.
        for i in 0..100 {
            p.progress(cm, &(100 + i).to_string());
        }
        assert!(p.take_dirty());
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("a")),
            Some("199")
        );
    }

    /// Issue 32: an index may be stored before its changes are handled
    /// (a successor's resync delivers every object written after its
    /// checkpoint whatever the index says); while a deletion it has seen
    /// is unhandled, with that object put back (else it would hide the
    /// deletion; and holding the index back held every creation waiting
    /// for one behind an app that answers 503).
    #[test]
    fn an_index_is_stored_early_with_the_objects_of_unhandled_deletions_put_back() {
        let mut p = Progress::new(Checkpoints::default());
        let s = p.stream(ObjectKind::ConfigMap, Scope::from_key("prod"));
        let a = p.change(s, Some("9"));
        let ix = one_object();
        p.index(s, ix.clone());
        let early = p.take_indexes();
        assert_eq!(early.len(), 1, "change 9 in flight is no deletion");
        assert_eq!(early[0].index, ix);
        assert_eq!(p.handed(s), 2);
        let gone = p.change_of(s, Some("10"), Some(&gone_object()));
        p.index(s, ix.clone());
        let b = p.change(s, Some("11"));
        let early = p.take_indexes();
        assert_eq!(early.len(), 1, "stored while deletion 10 is in flight");
        assert!(early[0].index.contains("prod", "gone"), "put back");
        assert!(early[0].index.contains("prod", "a"));
        assert_eq!(p.handed(s), 4);
        p.complete(b);
        p.complete(gone);
        // The deletion handled: the same index, plain, replaces the one
        // with the object put back (a stale entry would stay stored).
        let plain = p.take_indexes();
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].index, ix);
        assert_eq!(p.handed(s), 4);
        // Change 9 is not handled: the checkpoint does not move at all.
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("prod")),
            None
        );
        p.complete(a);
        // The index stored was taken before 11: the checkpoint stays at
        // 10 until an index with 11 in it is there.
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("prod")),
            Some("10")
        );
        assert!(p.take_indexes().is_empty());
    }

    /// Two deletions in flight, indexes taken after each: once the first
    /// is handled, the checkpoint may pass it, and the index stored with
    /// that checkpoint must not put its object back any more, though the
    /// second's object still is (seed 17798: the copy ready put back both,
    /// the plain index of the first was older than it and refused, and the
    /// stored index kept an object whose deletion the checkpoint passed).
    #[test]
    fn a_handled_deletion_is_no_longer_put_back_while_another_is_in_flight() {
        let named = |name: &str, rv: &str| {
            ObjectSnapshot::from_json(&serde_json::json!({"kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "prod", "resourceVersion": rv},
                "data": {"k": "v"}}))
            .unwrap()
        };
        let prod = Scope::from_key("prod");
        for taken_between in [false, true] {
            let mut p = Progress::new(Checkpoints::default());
            let s = p.stream(ObjectKind::ConfigMap, prod.clone());
            let first = p.change_of(s, Some("10"), Some(&named("one", "10")));
            p.index(s, one_object());
            if taken_between {
                // Handed out for a save already.
                assert!(p.take_indexes()[0].index.contains("prod", "one"));
            }
            let later = p.change(s, Some("11"));
            p.complete(later);
            let second = p.change_of(s, Some("12"), Some(&named("two", "12")));
            p.index(s, one_object());
            if taken_between {
                let ix = p.take_indexes();
                assert!(ix[0].index.contains("prod", "one") && ix[0].index.contains("prod", "two"));
            }
            p.complete(first);
            let checkpoint = p
                .checkpoints()
                .get(ObjectKind::ConfigMap, &prod)
                .map(str::to_string);
            let stored = p.take_indexes();
            assert_eq!(stored.len(), 1, "offered again ({taken_between})");
            assert!(!stored[0].index.contains("prod", "one"), "{taken_between}");
            assert!(stored[0].index.contains("prod", "two"), "{taken_between}");
            assert_eq!(checkpoint.as_deref(), Some("11"), "past the deletion");
            p.complete(second);
            let stored = p.take_indexes();
            assert_eq!(stored[0].index, one_object());
        }
    }

    fn gone_object() -> ObjectSnapshot {
        ObjectSnapshot::from_json(&serde_json::json!({"kind": "ConfigMap",
            "metadata": {"name": "gone", "namespace": "prod", "resourceVersion": "10"},
            "data": {"k": "v"}}))
        .unwrap()
    }

    /// Issue 19's second loss, at the state machine: W is created at 20 and
    /// its change handled, the checkpoint is saved past it, the leader
    /// dies before the index with W is stored, W is deleted while nobody
    /// leads past the history: the successor's resync against the stored
    /// index cannot know W. So the checkpoint waits for that index, and
    /// both are handed out for the same save.
    #[test]
    fn the_checkpoint_never_passes_a_change_without_an_index_that_has_it() {
        let mut p = Progress::new(Checkpoints::default());
        let s = p.stream(ObjectKind::ConfigMap, Scope::from_key("prod"));
        p.remembered(s, "10"); // the baseline list
        p.index(s, one_object());
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("prod")),
            Some("10")
        );
        assert_eq!(p.take_indexes().len(), 1);
        assert!(p.take_dirty());
        // W created at 20 and handled, a bookmark at 25: not past 10 yet.
        let w = p.change(s, Some("20"));
        p.complete(w);
        p.progress(s, "25");
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("prod")),
            Some("10")
        );
        assert!(!p.take_dirty(), "nothing to save without the index");
        // A label-only change holds it too (the stored labels route a
        // deletion found by a resync).
        p.remembered(s, "26");
        let with_w = index_of(&format!(
            "prod/a {:032x} {:016x} \nprod/w {:032x} {:016x} \n",
            1, 2, 3, 4
        ));
        p.index(s, with_w.clone());
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("prod")),
            Some("26")
        );
        assert!(p.take_dirty());
        let safe = p.take_indexes();
        assert_eq!(safe.len(), 1);
        assert_eq!(safe[0].index, with_w, "handed out with the checkpoint");
        // Bookmarks after the index move the checkpoint on their own.
        p.progress(s, "30");
        assert_eq!(
            p.checkpoints()
                .get(ObjectKind::ConfigMap, &Scope::from_key("prod")),
            Some("30")
        );
    }

    #[test]
    fn shards_split_at_lines_under_the_limit() {
        let text = "a 1\nbb 2\nccc 3\n";
        assert_eq!(split_shards(text, 10), vec!["a 1\nbb 2\n", "ccc 3\n"]);
        assert_eq!(split_shards(text, 1000), vec![text]);
        assert_eq!(split_shards("", 10), vec![""]);
        assert_eq!(
            shard_name("wasmwatch-state", ObjectKind::Secret, 3),
            "wasmwatch-state-index-secret-3"
        );
    }
}
