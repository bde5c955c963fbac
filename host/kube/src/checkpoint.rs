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
//! leader's next write fails with 409 and it must stop ([`CheckpointError::Fenced`]).
//! The store never re-reads to "fix" a 409: a conflict means someone else owns
//! the state now.
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use wasmwatch_core::ObjectKind;

use crate::elector::Term;

pub const TERM_ANNOTATION: &str = "wasmwatch.io/term";

/// The annotation holding one kind's checkpoints.
pub fn annotation_key(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::ConfigMap => "wasmwatch.io/configmap-resource-version",
        ObjectKind::Secret => "wasmwatch.io/secret-resource-version",
    }
}

/// Handled resourceVersions: kind -> namespace (or `*`) -> version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoints {
    versions: BTreeMap<ObjectKind, BTreeMap<String, String>>,
}

impl Checkpoints {
    pub fn get(&self, kind: ObjectKind, namespace: &str) -> Option<&str> {
        self.versions.get(&kind)?.get(namespace).map(String::as_str)
    }

    pub fn set(&mut self, kind: ObjectKind, namespace: &str, version: &str) {
        self.versions
            .entry(kind)
            .or_default()
            .insert(namespace.to_string(), version.to_string());
    }

    /// `ns=rv,ns2=rv2`, namespaces sorted.
    pub fn format(&self, kind: ObjectKind) -> Option<String> {
        let m = self.versions.get(&kind).filter(|m| !m.is_empty())?;
        Some(
            m.iter()
                .map(|(ns, rv)| format!("{ns}={rv}"))
                .collect::<Vec<_>>()
                .join(","),
        )
    }

    /// Parses one annotation value; an empty value means no checkpoints.
    pub fn parse_into(&mut self, kind: ObjectKind, value: &str) -> Result<(), String> {
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some((ns, rv)) if !ns.is_empty() && !rv.is_empty() && !rv.contains('=') => {
                    self.set(kind, ns, rv);
                }
                _ => {
                    return Err(format!(
                        "{}: invalid entry {part:?}, expected namespace=resourceVersion",
                        annotation_key(kind)
                    ));
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.holder, self.transitions)
    }
}

fn parse_term(value: &str) -> Option<Term> {
    let (holder, transitions) = value.rsplit_once('/')?;
    Some(Term {
        holder: holder.to_string(),
        transitions: transitions.parse().ok()?,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Another leader has claimed the state: stop all leader work. Not retryable.
    #[error("fenced: the state Lease was written by a newer leader ({0})")]
    Fenced(String),
    /// The state Lease holds something we cannot read. Not retryable.
    #[error("state Lease {lease}: {message}")]
    Corrupt { lease: String, message: String },
    /// Retryable.
    #[error("state Lease: {0}")]
    Api(#[from] kube::Error),
}

/// Reads and writes the state Lease for one leadership term.
pub struct CheckpointStore {
    api: Api<Lease>,
    name: String,
    term: Term,
    /// The state Lease as this leader last wrote it.
    lease: Option<Lease>,
}

impl CheckpointStore {
    pub fn new(client: kube::Client, namespace: &str, name: &str, term: Term) -> Self {
        CheckpointStore {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            term,
            lease: None,
        }
    }

    /// Claims the state for this term (creating the Lease on first use) and
    /// returns the stored checkpoints. Fails with `Fenced` if the state
    /// already belongs to a newer term.
    pub async fn claim(&mut self) -> Result<Checkpoints, CheckpointError> {
        let mut lease = match self.api.get_opt(&self.name).await? {
            Some(l) => l,
            None => {
                let fresh = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: None,
                };
                match self.api.create(&PostParams::default(), &fresh).await {
                    Ok(l) => l,
                    Err(kube::Error::Api(s)) if s.code == 409 => self.api.get(&self.name).await?,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        if let Some(stored) = annotations.get(TERM_ANNOTATION) {
            match parse_term(stored) {
                Some(t) if t.transitions > self.term.transitions => {
                    return Err(CheckpointError::Fenced(stored.clone()));
                }
                Some(_) => {}
                None => {
                    return Err(CheckpointError::Corrupt {
                        lease: self.name.clone(),
                        message: format!(
                            "{TERM_ANNOTATION}: cannot read {stored:?}, expected holder/transitions"
                        ),
                    });
                }
            }
        }
        let mut checkpoints = Checkpoints::default();
        for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
            if let Some(v) = annotations.get(annotation_key(kind)) {
                checkpoints
                    .parse_into(kind, v)
                    .map_err(|message| CheckpointError::Corrupt {
                        lease: self.name.clone(),
                        message,
                    })?;
            }
        }
        annotations.insert(TERM_ANNOTATION.to_string(), self.term.to_string());
        self.lease = Some(self.replace(&lease).await?);
        Ok(checkpoints)
    }

    /// Writes the checkpoints. A 409 means another leader claimed the state:
    /// `Fenced`, and the caller must stop.
    pub async fn save(&mut self, checkpoints: &Checkpoints) -> Result<(), CheckpointError> {
        let Some(mut lease) = self.lease.clone() else {
            return Err(CheckpointError::Fenced(
                "this store has not claimed the state".into(),
            ));
        };
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        for kind in [ObjectKind::ConfigMap, ObjectKind::Secret] {
            match checkpoints.format(kind) {
                Some(v) => annotations.insert(annotation_key(kind).to_string(), v),
                None => annotations.remove(annotation_key(kind)),
            };
        }
        self.lease = Some(self.replace(&lease).await?);
        Ok(())
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, CheckpointError> {
        match self
            .api
            .replace(&self.name, &PostParams::default(), lease)
            .await
        {
            Ok(l) => Ok(l),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(CheckpointError::Fenced(format!(
                "write as {} conflicted",
                self.term
            ))),
            Err(e) => Err(e.into()),
        }
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
        c.set(ObjectKind::Secret, "*", "99");
        assert_eq!(
            c.format(ObjectKind::ConfigMap).unwrap(),
            "default=123,prod=456"
        );
        assert_eq!(c.get(ObjectKind::Secret, "*"), Some("99"));
        assert_eq!(c.get(ObjectKind::Secret, "prod"), None);
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
            parse_term("pod-a/7"),
            Some(Term {
                holder: "pod-a".into(),
                transitions: 7
            })
        );
        assert_eq!(parse_term("pod-a"), None);
    }
}

/// A change handed out for handling; complete it when all its actions were
/// executed or dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    stream: usize,
    seq: u64,
}

#[derive(Debug, Default)]
struct Stream {
    kind: Option<ObjectKind>,
    namespace: String,
    next_seq: u64,
    /// In stream order: (seq, resourceVersion, done).
    pending: std::collections::VecDeque<(u64, String, bool)>,
}

/// Decides how far each watch stream's checkpoint may advance: only past
/// versions whose changes, and all changes before them, are handled. The
/// caller writes [`Progress::checkpoints`] with [`CheckpointStore::save`]
/// when [`Progress::take_dirty`] says so, at most every so often (batching).
#[derive(Debug, Default)]
pub struct Progress {
    streams: Vec<Stream>,
    checkpoints: Checkpoints,
    dirty: bool,
}

impl Progress {
    /// Starts from the stored checkpoints.
    pub fn new(checkpoints: Checkpoints) -> Self {
        Progress {
            streams: Vec::new(),
            checkpoints,
            dirty: false,
        }
    }

    /// Registers a watch stream (namespace `*` for cluster-wide); returns its id.
    pub fn stream(&mut self, kind: ObjectKind, namespace: &str) -> usize {
        self.streams.push(Stream {
            kind: Some(kind),
            namespace: namespace.to_string(),
            ..Default::default()
        });
        self.streams.len() - 1
    }

    /// A change at `resource_version` was handed out.
    pub fn change(&mut self, stream: usize, resource_version: &str) -> Ticket {
        let s = &mut self.streams[stream];
        let seq = s.next_seq;
        s.next_seq += 1;
        s.pending
            .push_back((seq, resource_version.to_string(), false));
        Ticket { stream, seq }
    }

    /// Nothing to handle up to `resource_version`.
    pub fn progress(&mut self, stream: usize, resource_version: &str) {
        let s = &mut self.streams[stream];
        let seq = s.next_seq;
        s.next_seq += 1;
        s.pending
            .push_back((seq, resource_version.to_string(), true));
        self.advance(stream);
    }

    /// The change behind `ticket` is fully handled.
    pub fn complete(&mut self, ticket: Ticket) {
        if let Some(entry) = self.streams[ticket.stream]
            .pending
            .iter_mut()
            .find(|e| e.0 == ticket.seq)
        {
            entry.2 = true;
        }
        self.advance(ticket.stream);
    }

    fn advance(&mut self, stream: usize) {
        let s = &mut self.streams[stream];
        let mut last = None;
        while s.pending.front().is_some_and(|e| e.2) {
            last = s.pending.pop_front().map(|e| e.1);
        }
        if let (Some(rv), Some(kind)) = (last, s.kind)
            && self.checkpoints.get(kind, &s.namespace) != Some(rv.as_str())
        {
            self.checkpoints.set(kind, &s.namespace, &rv);
            self.dirty = true;
        }
    }

    /// Changes handed out and not yet complete, over all streams.
    pub fn in_flight(&self) -> usize {
        self.streams
            .iter()
            .map(|s| s.pending.iter().filter(|e| !e.2).count())
            .sum()
    }

    pub fn checkpoints(&self) -> &Checkpoints {
        &self.checkpoints
    }

    /// Whether the checkpoints moved since the last call.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    #[test]
    fn the_checkpoint_passes_a_version_only_when_everything_before_it_is_handled() {
        let mut p = Progress::new(Checkpoints::default());
        let s = p.stream(ObjectKind::ConfigMap, "prod");
        let a = p.change(s, "10");
        let b = p.change(s, "11");
        p.progress(s, "12"); // a bookmark
        assert_eq!(p.checkpoints().get(ObjectKind::ConfigMap, "prod"), None);
        assert!(!p.take_dirty());
        // The later change finishes first: still nothing, 10 is in flight.
        p.complete(b);
        assert_eq!(p.checkpoints().get(ObjectKind::ConfigMap, "prod"), None);
        assert_eq!(p.in_flight(), 1);
        // Now everything up to the bookmark is done.
        p.complete(a);
        assert_eq!(
            p.checkpoints().get(ObjectKind::ConfigMap, "prod"),
            Some("12")
        );
        assert!(p.take_dirty());
        assert!(!p.take_dirty(), "one write per advance");
        assert_eq!(p.in_flight(), 0);
    }

    #[test]
    fn streams_advance_independently_and_start_from_the_stored_state() {
        let mut stored = Checkpoints::default();
        stored.set(ObjectKind::Secret, "*", "5");
        let mut p = Progress::new(stored);
        let cm = p.stream(ObjectKind::ConfigMap, "a");
        let sec = p.stream(ObjectKind::Secret, "*");
        let t = p.change(cm, "7");
        p.progress(sec, "8");
        assert_eq!(p.checkpoints().get(ObjectKind::Secret, "*"), Some("8"));
        assert_eq!(p.checkpoints().get(ObjectKind::ConfigMap, "a"), None);
        p.complete(t);
        assert_eq!(p.checkpoints().get(ObjectKind::ConfigMap, "a"), Some("7"));
        // Many events, one dirty flag: the caller batches the writes.
        for i in 0..100 {
            p.progress(cm, &(100 + i).to_string());
        }
        assert!(p.take_dirty());
        assert_eq!(p.checkpoints().get(ObjectKind::ConfigMap, "a"), Some("199"));
    }
}
