//! The engine, the linker and the per-call sandbox state.
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter,
};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmwatch_core::Lookups;

use crate::bindings::{self, wit};
use crate::convert;

/// How the runtime is set up. One runtime serves every plugin of a host.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where compiled artifacts are kept between runs (created 0700 if
    /// missing). `None`: compile on every load.
    pub cache_dir: Option<PathBuf>,
    /// Sandboxes alive at once, across all plugins; more calls wait.
    pub max_concurrency: u32,
    /// Granularity of the epoch deadline.
    pub epoch_tick: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: None,
            max_concurrency: 16,
            epoch_tick: Duration::from_millis(1),
        }
    }
}

/// Shared by all plugins: the engine, the linker, the epoch ticker, the
/// concurrency bound, and the lookups behind the host interface.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<RuntimeInner>,
}

pub(crate) struct RuntimeInner {
    pub engine: Engine,
    pub linker: Linker<SandboxState>,
    pub config: RuntimeConfig,
    pub lookups: Arc<dyn Lookups>,
    pub permits: Permits,
    ticker_stop: Arc<AtomicBool>,
}

impl Drop for RuntimeInner {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

impl Runtime {
    pub fn new(config: RuntimeConfig, lookups: Arc<dyn Lookups>) -> wasmtime::Result<Runtime> {
        let n = config.max_concurrency.max(1);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(n)
            // A Rust component has a handful of core instances (the module
            // and wit-component's shims); other toolchains may have more.
            .max_core_instances_per_component(32)
            .total_core_instances(n * 32)
            .max_memories_per_component(4)
            .total_memories(n * 4)
            .max_tables_per_component(8)
            .total_tables(n * 8)
            .total_stacks(n)
            .max_memory_size(wasmwatch_core::manifest::MAX_MEMORY as usize)
            // Reset up to 256 KiB of a freed slot's memory with memset
            // instead of giving the pages back to the kernel and faulting them
            // in again on the next event. Our plugins link with a 64 KiB
            // shadow stack (plugins/.cargo/config.toml), so their stack, data
            // and small heap live in the first 128 KiB. Measured
            // (benches/per_event.rs, fresh sandbox + trivial call): keeping
            // 0 B: ~82 us; 256 KiB: ~10.2 us; 256 KiB resetting only the
            // resident pages (PAGEMAP_SCAN, Linux 6.7+): ~8.7 us.
            .linear_memory_keep_resident(256 << 10)
            .pagemap_scan(if swap_is_off() {
                wasmtime::Enabled::Auto
            } else {
                wasmtime::Enabled::No
            })
            .table_keep_resident(64 << 10);
        let mut cfg = Config::new();
        cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
            .epoch_interruption(true)
            // Trap messages carry a short backtrace, not thousands of frames.
            .wasm_backtrace_max_frames(std::num::NonZeroUsize::new(6))
            .wasm_component_model(true);
        let engine = Engine::new(&cfg)?;

        let mut linker = Linker::new(&engine);
        // Every WASI interface is linked so that components from any
        // toolchain link, but the context grants nothing: no preopened
        // directories, no network, no environment, no arguments. Components
        // importing files, sockets or HTTP are refused before linking anyway
        // (see `allowed_import`).
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        bindings::Plugin::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |s| s)?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        {
            let engine = engine.clone();
            let stop = ticker_stop.clone();
            let tick = config.epoch_tick;
            std::thread::Builder::new()
                .name("wasm-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(tick);
                        engine.increment_epoch();
                    }
                })?;
        }
        if let Some(dir) = &config.cache_dir {
            crate::cache::prepare_dir(dir)?;
        }
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                engine,
                linker,
                permits: Permits::new(n),
                config,
                lookups,
                ticker_stop,
            }),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

/// Whether no swap area is active. The page scan resets only the pages it
/// finds resident and written; in wasmtime 48 a page swapped out in between
/// is neither reset nor given back, so one event's data could reach the
/// next (wasmtime PR #14357). Kubernetes nodes run without swap unless
/// configured otherwise; with swap the scan stays off.
fn swap_is_off() -> bool {
    std::fs::read_to_string("/proc/swaps").is_ok_and(|s| no_swap_areas(&s))
}

/// `/proc/swaps` lists no area below its header line.
fn no_swap_areas(proc_swaps: &str) -> bool {
    proc_swaps.lines().skip(1).all(|l| l.trim().is_empty())
}

/// Imports a plugin may have: `package/interface[@version]` names from the
/// allowed packages. Anything else is refused at load, naming it.
pub(crate) fn allowed_import(name: &str) -> bool {
    let unversioned = name.split('@').next().unwrap_or(name);
    let Some((package, interface)) = unversioned.split_once('/') else {
        return false;
    };
    match package {
        "wasmwatch:plugin" | "wasi:io" | "wasi:clocks" | "wasi:random" => true,
        "wasi:cli" => matches!(
            interface,
            "environment"
                | "exit"
                | "stdin"
                | "stdout"
                | "stderr"
                | "terminal-input"
                | "terminal-output"
                | "terminal-stdin"
                | "terminal-stdout"
                | "terminal-stderr"
        ),
        _ => false,
    }
}

/// A counting semaphore for blocking callers.
pub(crate) struct Permits {
    free: Mutex<u32>,
    cv: Condvar,
}

pub(crate) struct Permit<'a>(&'a Permits);

impl Permits {
    fn new(n: u32) -> Self {
        Permits {
            free: Mutex::new(n),
            cv: Condvar::new(),
        }
    }

    pub fn acquire(&self) -> Permit<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.cv.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        Permit(self)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.cv.notify_one();
    }
}

/// Limits one sandbox's memory and tables, and remembers a refused growth so
/// that the resulting trap is reported as what it is.
pub(crate) struct Limiter {
    pub memory_limit: u64,
    pub memory_refused: bool,
}

const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let ok = desired as u64 <= self.memory_limit;
        if !ok {
            self.memory_refused = true;
        }
        Ok(ok)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// What one plugin shares with every sandbox made for it.
pub(crate) struct PluginShared {
    pub name: String,
    pub config_json: String,
    pub lookups: Arc<dyn Lookups>,
}

/// The store's data for one call.
pub(crate) struct SandboxState {
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub limiter: Limiter,
    pub plugin: Arc<PluginShared>,
}

impl WasiView for SandboxState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl wit::Host for SandboxState {}

impl bindings::wasmwatch::plugin::host::Host for SandboxState {
    fn log(&mut self, level: wit::LogLevel, message: String) {
        let plugin = self.plugin.name.as_str();
        match level {
            wit::LogLevel::Trace => tracing::trace!(plugin, "{message}"),
            wit::LogLevel::Debug => tracing::debug!(plugin, "{message}"),
            wit::LogLevel::Info => tracing::info!(plugin, "{message}"),
            wit::LogLevel::Warn => tracing::warn!(plugin, "{message}"),
            wit::LogLevel::Error => tracing::error!(plugin, "{message}"),
        }
    }

    fn config(&mut self) -> String {
        self.plugin.config_json.clone()
    }

    fn workloads_referencing(
        &mut self,
        kind: wit::ObjectKind,
        namespace: String,
        name: String,
    ) -> Vec<wit::WorkloadInfo> {
        self.plugin
            .lookups
            .workloads_referencing(convert::kind_from_wit(kind), &namespace, &name)
            .into_iter()
            .map(convert::workload_to_wit)
            .collect()
    }

    fn service(&mut self, namespace: String, name: String) -> Option<wit::ServiceInfo> {
        self.plugin
            .lookups
            .service(&namespace, &name)
            .map(convert::service_to_wit)
    }

    fn services_with_labels(
        &mut self,
        namespace: String,
        labels: Vec<wit::KeyValue>,
    ) -> Vec<wit::ServiceInfo> {
        self.plugin
            .lookups
            .services_with_labels(&namespace, &convert::labels_from_wit(labels))
            .into_iter()
            .map(convert::service_to_wit)
            .collect()
    }

    fn ready_endpoints(&mut self, namespace: String, service: String) -> Vec<wit::Endpoint> {
        self.plugin
            .lookups
            .ready_endpoints(&namespace, &service)
            .into_iter()
            .map(convert::endpoint_to_wit)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_areas_are_read_from_proc_swaps() {
        let header = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";
        assert!(no_swap_areas(header));
        assert!(!no_swap_areas(&format!(
            "{header}/swapfile                               file\t\t2097148\t\t0\t\t-2\n"
        )));
    }

    #[test]
    fn import_policy() {
        for ok in [
            "wasmwatch:plugin/host@0.2.0",
            "wasi:io/streams@0.2.6",
            "wasi:cli/stderr@0.2.0",
            "wasi:random/random@0.2.6",
        ] {
            assert!(allowed_import(ok), "{ok}");
        }
        for no in [
            "wasi:filesystem/types@0.2.6",
            "wasi:filesystem/preopens@0.2.0",
            "wasi:sockets/tcp@0.2.6",
            "wasi:http/outgoing-handler@0.2.6",
            "wasi:cli/environmentx",
            "wasi:io-extra/x",
            "evil:thing/x",
            "bare-function",
        ] {
            assert!(!allowed_import(no), "{no}");
        }
    }
}
