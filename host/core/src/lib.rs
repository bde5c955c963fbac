//! wasmwatch's core: plain types and decisions, with no Kubernetes client and
//! no WebAssembly runtime in them.
//!
//! Data flow through these types:
//!
//! ```text
//! object JSON ──ObjectSnapshot::from_json──▶ ObjectSnapshot
//!   (previous snapshot, change type) ──ChangeEvent::new──▶ ChangeEvent ──▶ plugin
//! plugin ──▶ Vec<Action> ──Capabilities::check──▶ Verdict (allowed / refused)
//! ```
//!
//! The plugin manifest ([`manifest::Manifest`]) says what is watched, which
//! plugin gets which events, and what each plugin may do.
#![forbid(unsafe_code)]

pub mod action;
pub mod capability;
pub mod digest;
pub mod event;
pub mod index;
pub mod jitter;
pub mod kind;
pub mod lookups;
pub mod manifest;
pub mod needs;
pub mod prefilter;
mod repair;
pub mod scope;
pub mod selector;
pub mod text;
pub mod turns;
pub mod units;

pub use action::Action;
pub use capability::{Capabilities, Verdict};
pub use event::{ChangeEvent, ChangeType, DataValue, Folded, ObjectKind, ObjectSnapshot};
pub use lookups::{Lookups, StaticLookups};
pub use manifest::Manifest;
pub use scope::Scope;
