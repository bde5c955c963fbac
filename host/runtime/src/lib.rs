//! wasmwatch's plugin runtime: sandboxed WebAssembly components on wasmtime.
//!
//! ```text
//! Runtime::new ── one Engine (pooling allocator, epoch interruption),
//!                 one Linker (host interface + zero-authority WASI),
//!                 an epoch ticker thread (ticking while calls run),
//!                 a compiled-artifact cache
//!     │
//!     ▼
//! Runtime::load(entry) ── read module, check sha256, refuse non-components,
//!                         compile (or load the cached artifact), refuse
//!                         imports outside the allowed set, pre-link
//!                         (InstancePre), check the world, call check-config
//!     │
//!     ▼
//! Plugin::handle(event) ── per event: a fresh Store with a memory limiter and
//!                          an epoch deadline, instantiate, call `handle`,
//!                          classify failures, check every returned action
//!                          against the plugin's capabilities
//! ```
//!
//! A plugin that loops, allocates without bound, traps, recurses too deeply or
//! returns too much fails that one call with a [`PluginError`] naming the
//! plugin and the cause; the host goes on with the next event.
#![deny(unsafe_code)]

mod bindings;
mod cache;
mod convert;
mod error;
// Implements wasmtime's `Lift` for `handle`'s result, and calls `handle`
// through a function typed once at load.
#[allow(unsafe_code)]
mod output;
mod plugin;
mod sandbox;
mod ticker;

pub use error::{LoadError, PluginError};
pub use plugin::{CheckedAction, Decision, Plugin};
pub use sandbox::{Runtime, RuntimeConfig};
