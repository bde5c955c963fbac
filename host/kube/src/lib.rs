//! wasmwatch's Kubernetes layer.
//!
//! - [`elector`]: Lease-based leader election with client-go's semantics,
//!   written on `Api<Lease>`; leadership is published as a value
//!   ([`elector::Leadership`] on a `tokio::sync::watch` channel) that the rest
//!   of the host observes.
#![forbid(unsafe_code)]

pub mod elector;
