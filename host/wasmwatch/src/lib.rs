//! wasmwatch: refresh apps when their ConfigMaps and Secrets change, as
//! decided by sandboxed WebAssembly plugins.
//!
//! This crate wires the others together and holds the command line
//! ([`cli`]); the binary is a thin wrapper around [`cli::main`].
#![forbid(unsafe_code)]

pub mod admin;
pub mod cli;
mod decide;
pub mod dryrun;
pub mod event_file;
pub mod local;
pub mod local_controller;
pub mod metrics;
pub mod oci;
pub mod plugin_dir;
pub mod plugin_test;
pub mod run;
pub mod scaffold;
pub mod validate;
pub mod webhook;
