//! wasmwatch's Kubernetes layer.
//!
//! - [`elector`]: Lease-based leader election with client-go's semantics,
//!   written on `Api<Lease>`; leadership is published as a value
//!   ([`elector::Leadership`] on a `tokio::sync::watch` channel) that the rest
//!   of the host observes, and a [`elector::Fence`] executors check before
//!   every action.
//! - [`checkpoint`]: per-namespace resourceVersion checkpoints in the state
//!   Lease, fenced by the leadership term.
//! - [`lookups`]: the plugins' lookups (workloads, Services, ready endpoints)
//!   answered from compact caches fed by watches; [`references`]: what a pod
//!   template references.
//! - [`digest_key`]: the key of Secret digests, kept in a Secret in
//!   wasmwatch's namespace.
//! - [`namespaces`]: which namespaces' objects are delivered
//!   (`watch.ignoreNamespaces`, `watch.namespaceSelector`), kept up to date
//!   by a watch of Namespaces.
#![forbid(unsafe_code)]

pub mod apis;
pub mod checkpoint;
pub mod digest_key;
pub mod elector;
pub mod lookups;
pub mod namespaces;
pub mod parsed;
pub mod references;
pub mod shell;
pub mod term;
pub mod watchloop;
