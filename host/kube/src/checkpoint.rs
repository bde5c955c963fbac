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
