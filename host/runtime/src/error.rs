//! Errors of loading a plugin and of one call into it. Every message names
//! the plugin.
use std::path::PathBuf;
use std::time::Duration;

/// Why a plugin could not be loaded. Not retryable: the module, the manifest
/// entry or the plugin's config must change.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("plugin `{plugin}`: cannot read module {}: {source}", path.display())]
    Read {
        plugin: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("plugin `{plugin}`: module {} has sha256 {actual}, but the manifest pins {expected}", path.display())]
    Digest {
        plugin: String,
        path: PathBuf,
        actual: String,
        expected: String,
    },
    #[error("plugin `{plugin}`: {} is not a WebAssembly file", path.display())]
    NotWasm { plugin: String, path: PathBuf },
    #[error(
        "plugin `{plugin}`: {} is a core WebAssembly module, not a component; build it for wasm32-wasip2 (or wrap it with `wasm-tools component new`)",
        path.display()
    )]
    CoreModule { plugin: String, path: PathBuf },
    #[error("plugin `{plugin}`: cannot compile {}: {message}", path.display())]
    Compile {
        plugin: String,
        path: PathBuf,
        message: String,
    },
    #[error(
        "plugin `{plugin}`: imports `{import}`, which plugins are not granted (a plugin reaches the network only through the actions it returns; allowed: the wasmwatch:plugin host interface and WASI 0.2's io, clocks, random, cli, filesystem and sockets, the last three with no authority: no files, no connections, no environment)"
    )]
    ForbiddenImport { plugin: String, import: String },
    #[error("plugin `{plugin}`: is not a component of the {world} world: {message}")]
    WrongWorld {
        plugin: String,
        world: &'static str,
        message: String,
    },
    #[error(
        "plugin `{plugin}`: its events.kinds name {kind}, but it is a component of {world}, which carries ConfigMaps and Secrets only; build it for wasmwatch:plugin@0.4.0 or leave {kind} out"
    )]
    KindNotInWorld {
        plugin: String,
        kind: String,
        world: &'static str,
    },
    #[error("plugin `{plugin}`: rejected its config: {message}")]
    ConfigRejected { plugin: String, message: String },
    #[error("plugin `{plugin}`: config check failed: {source}")]
    ConfigCheck {
        plugin: String,
        #[source]
        source: Box<PluginError>,
    },
}

/// Why one call into a plugin failed. The host counts it and retries the
/// delivery per its policy; the plugin stays loaded.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("plugin `{plugin}` exceeded its time limit of {limit:?}")]
    Timeout { plugin: String, limit: Duration },
    #[error(
        "plugin `{plugin}` exceeded its memory limit of {limit} bytes{}",
        detail(stderr)
    )]
    MemoryLimit {
        plugin: String,
        limit: u64,
        stderr: String,
    },
    #[error("plugin `{plugin}` overflowed its stack (unbounded recursion?)")]
    StackOverflow { plugin: String },
    #[error("plugin `{plugin}` trapped: {trap}{}", detail(stderr))]
    Trap {
        plugin: String,
        trap: String,
        stderr: String,
    },
    #[error("plugin `{plugin}` returned an error: {message}")]
    Returned { plugin: String, message: String },
    #[error("plugin `{plugin}` returned too much: {what}")]
    OutputTooLarge { plugin: String, what: String },
    #[error("plugin `{plugin}` is a component of {world}, which cannot carry a {kind}")]
    KindNotInWorld {
        plugin: String,
        kind: String,
        world: &'static str,
    },
}

fn detail(stderr: &str) -> String {
    let s = stderr.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!(" (stderr: {s})")
    }
}

impl PluginError {
    /// A short label of the failure, for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            PluginError::Timeout { .. } => "timeout",
            PluginError::MemoryLimit { .. } => "memory",
            PluginError::StackOverflow { .. } => "stack_overflow",
            PluginError::Trap { .. } => "trap",
            PluginError::Returned { .. } => "error",
            PluginError::OutputTooLarge { .. } => "output_too_large",
            PluginError::KindNotInWorld { .. } => "kind_not_in_world",
        }
    }
}
