//! What the host does with the actions plugins return.
//!
//! - [`decide`]: the plugin calls of a term (one per plugin and object at
//!   a time, in change order; retried; folded), before the pipeline.
//! - [`executors`]: the [`pipeline::Execute`] the service runs: each action
//!   to its executor, and the host's own Events.
//! - [`http`]: HTTP calls and Service refreshes (every ready pod).
//! - [`workload`]: rollout restarts by a pod-template hash annotation, and
//!   Kubernetes Events.
//! - [`pipeline`]: per-target debounce and coalescing, retries with backoff,
//!   dead letters, rate limits; completes each change's ticket once all its
//!   actions finished or dead-lettered.
#![forbid(unsafe_code)]

pub mod admission;
pub mod decide;
pub mod executors;
pub mod http;
pub mod pipeline;
pub mod recorder;
pub mod workload;

use wasmwatch_core::ObjectKind;

/// The changed object an action is about (for Events, logs, dead letters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub kind: ObjectKind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// The plugin whose decision this is.
    pub plugin: String,
    /// For a Secret whose digest is keyed: (keyed, plain) digests of its
    /// content (`ChangeEvent::unkeyed_digest`). A restart for a content
    /// hash holding the keyed one accepts a pod template that records the
    /// plain one (written by versions before keys).
    pub unkeyed_digest: Option<(String, String)>,
    /// (digest, Reloader's hash) of the object's content
    /// ([`wasmwatch_core::digest::reloader_hash`]), when the decision holds a
    /// restart. A restart for a content hash holding the digest accepts a
    /// workload that records Reloader's hash (its `STAKATER_*` variable, or
    /// `reloader.stakater.com/last-reloaded-from`) as at this content.
    pub reloader_hash: Option<(String, String)>,
}

/// Why an action failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// Worth retrying (connection refused, timeout, 5xx, 429, API conflict).
    #[error("{0}")]
    Retryable(String),
    /// Retrying cannot help (4xx other than 408/429, unknown bus connection,
    /// workload not found).
    #[error("{0}")]
    Permanent(String),
}

impl ExecError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, ExecError::Retryable(_))
    }
}

/// `outer: cause: root cause`, skipping repeats (hyper's and kube's errors
/// wrap their causes without printing them).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}
