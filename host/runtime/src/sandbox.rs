//! The engine, the linker and the per-call sandbox state.
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter,
};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmwatch_core::Lookups;
use wasmwatch_core::text::{MAX_MESSAGE_BYTES, bounded_line};

use crate::bindings;
use crate::convert;
use crate::ticker::EpochTicker;

/// How the runtime is set up. One runtime serves every plugin of a host.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where compiled artifacts are kept between runs (created 0700 if
    /// missing). `None`: compile on every load.
    pub cache_dir: Option<PathBuf>,
    /// Sandboxes alive at once, across all plugins; more calls wait.
    pub max_concurrency: u32,
    /// Sandboxes one plugin may have alive at once, so that one slow or
    /// hostile plugin cannot take every slot from the others. Size
    /// `max_concurrency` as this times the number of plugins.
    pub plugin_concurrency: u32,
    /// Granularity of the epoch deadline: how often a running call meets
    /// its deadline check (and yields). The epoch only advances while a
    /// call runs.
    pub epoch_tick: Duration,
    /// Core module instances one component may have (each sandbox's
    /// share of the pool). Rust components have a handful; componentize-py
    /// 0.25.1 makes 14, 38 with `--stub-wasi`; componentize-js 4 (measured
    /// 2026-12-07). Default [`DEFAULT_MAX_CORE_INSTANCES`], or
    /// `WASMWATCH_MAX_CORE_INSTANCES`.
    pub max_core_instances: u32,
}

/// See [`RuntimeConfig::max_core_instances`]: room for componentize-py's
/// `--stub-wasi` output (38) and more. A slot costs only address space
/// until used.
pub const DEFAULT_MAX_CORE_INSTANCES: u32 = 64;

/// The environment variable that sets [`RuntimeConfig::max_core_instances`]
/// for every command (`run`, `validate`, `plugin test`, `local`).
pub const MAX_CORE_INSTANCES_ENV: &str = "WASMWATCH_MAX_CORE_INSTANCES";

/// [`MAX_CORE_INSTANCES_ENV`] if set to a number from 1 to 10000, else
/// the default (a bad value is said once on stderr).
fn max_core_instances() -> u32 {
    match std::env::var(MAX_CORE_INSTANCES_ENV) {
        Err(_) => DEFAULT_MAX_CORE_INSTANCES,
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if (1..=10_000).contains(&n) => n,
            _ => {
                tracing::warn!(
                    "{MAX_CORE_INSTANCES_ENV}={v:?} is not a number from 1 to 10000: using {DEFAULT_MAX_CORE_INSTANCES}"
                );
                DEFAULT_MAX_CORE_INSTANCES
            }
        },
    }
}

/// A compile error about the pool's per-component limits, with how to
/// raise the one that can be raised.
pub(crate) fn with_pool_hint(message: String) -> String {
    if message.contains("core module instances") && message.contains("pooling allocator") {
        format!("{message} (set {MAX_CORE_INSTANCES_ENV} to allow more core instances per plugin)")
    } else {
        message
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: None,
            max_concurrency: 16,
            plugin_concurrency: 4,
            epoch_tick: Duration::from_millis(1),
            max_core_instances: max_core_instances(),
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
    /// Free sandbox slots, across all plugins.
    pub permits: Arc<tokio::sync::Semaphore>,
    /// Advances the epoch while calls run (`ticker.ticking()` in `Plugin::call`).
    pub ticker: EpochTicker,
    /// Drives the blocking entry points ([`Runtime::load_blocking`],
    /// `Plugin::handle_blocking`) for callers outside any async runtime.
    blocking: OnceLock<tokio::runtime::Runtime>,
}

impl Drop for RuntimeInner {
    fn drop(&mut self) {
        // Never blocks, so the last clone may be dropped in async code too.
        if let Some(rt) = self.blocking.take() {
            rt.shutdown_background();
        }
    }
}

impl Runtime {
    pub fn new(config: RuntimeConfig, lookups: Arc<dyn Lookups>) -> wasmtime::Result<Runtime> {
        let n = config.max_concurrency.max(1);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(n)
            // A Rust component has a handful of core instances (the module
            // and wit-component's shims); other toolchains have more.
            .max_core_instances_per_component(config.max_core_instances)
            .total_core_instances(n * config.max_core_instances)
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
        // Calls run as futures on fibers (`call_async`): a call can then be
        // dropped at its deadline whatever it waits in, and a looping plugin
        // yields to other tasks at every epoch tick.
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
        // importing files, sockets or HTTP are refused before compiling
        // anyway (see `allowed_import`). Async, so that a wasi:io poll (a
        // plugin's `sleep`) is a future the deadline can drop.
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        // Every world's host interface (`wasmwatch:plugin/host@0.2.0`,
        // `@0.3.0`, `@0.4.0`): a plugin of any links.
        bindings::v2::Plugin::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
            &mut linker,
            |s| s,
        )?;
        bindings::v3::Plugin::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
            &mut linker,
            |s| s,
        )?;
        bindings::v4::Plugin::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
            &mut linker,
            |s| s,
        )?;

        let ticker = EpochTicker::start(engine.clone(), config.epoch_tick)?;
        if let Some(dir) = &config.cache_dir {
            crate::cache::prepare_dir(dir)?;
        }
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                engine,
                linker,
                permits: Arc::new(tokio::sync::Semaphore::new(n as usize)),
                config,
                lookups,
                ticker,
                blocking: OnceLock::new(),
            }),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Runs `f` to completion for a caller outside any async runtime (the
    /// CLI, tests, benchmarks). Panics inside an async runtime: there,
    /// await the async methods.
    pub(crate) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.inner
            .blocking
            .get_or_init(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("wasm-blocking")
                    .enable_all()
                    .build()
                    .expect("cannot start the plugin runtime's timer thread")
            })
            .block_on(f)
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
///
/// All of WASI 0.2 but HTTP is linked, because the Python and JavaScript
/// toolchains import files, sockets and the environment whether a plugin
/// uses them or not. Every such import has zero authority (see
/// [`zero_authority_wasi`]): the filesystem has no preopened directory, so
/// no path can be opened; TCP, UDP and name lookups are refused with
/// `access-denied`; the environment and arguments are empty; stdin is
/// closed; stdout and stderr go to a bounded buffer shown only in error
/// reports. `wasi:http` (outgoing requests) and anything outside WASI stay
/// refused: a plugin's only way to reach the network is a returned action.
pub(crate) fn allowed_import(name: &str) -> bool {
    let unversioned = name.split('@').next().unwrap_or(name);
    let Some((package, _interface)) = unversioned.split_once('/') else {
        return false;
    };
    matches!(
        package,
        "wasmwatch:plugin"
            | "wasi:io"
            | "wasi:clocks"
            | "wasi:random"
            | "wasi:cli"
            | "wasi:filesystem"
            | "wasi:sockets"
    )
}

/// The WASI context of one call: no authority at all. Written out rather
/// than left to `WasiCtxBuilder`'s defaults so that a default changing in
/// a wasmtime upgrade cannot grant anything.
pub(crate) fn zero_authority_wasi(
    stdout: wasmtime_wasi::p2::pipe::MemoryOutputPipe,
    stderr: wasmtime_wasi::p2::pipe::MemoryOutputPipe,
) -> WasiCtx {
    wasmtime_wasi::WasiCtxBuilder::new()
        .stdout(stdout)
        .stderr(stderr)
        // No `preopened_dir`: without a preopen no path resolves.
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }))
        .max_random_size(MAX_RANDOM_BYTES)
        .build()
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

/// What one call may write to the host's log through `host::log`: beyond
/// it, messages are dropped (and one warning says so).
pub(crate) const LOG_LINES_PER_CALL: u32 = 32;
pub(crate) const LOG_BYTES_PER_CALL: usize = 16 * 1024;

/// Bytes of `wasi:random` one request may ask for (wasmtime's default is
/// 64 MiB, ~230 ms of work the deadline cannot stop).
pub(crate) const MAX_RANDOM_BYTES: u64 = 64 * 1024;

/// Bytes one host lookup may answer (and never more than the plugin's
/// memory limit): copying an answer into the sandbox cannot be interrupted,
/// so its size bounds how late a call past its deadline ends (a 4 MiB
/// answer takes a few ms).
pub(crate) const MAX_LOOKUP_BYTES: u64 = 4 << 20;

/// The store's data for one call.
pub(crate) struct SandboxState {
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub limiter: Limiter,
    pub plugin: Arc<PluginShared>,
    /// When the call's time is up; host lookups check it first.
    pub deadline: Instant,
    /// `host::log` lines and bytes written so far in this call.
    pub log_lines: u32,
    pub log_bytes: usize,
}

impl WasiView for SandboxState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl SandboxState {
    /// A host call made past the deadline ends the call as a timeout
    /// instead of doing work nobody waits for.
    fn in_time(&self) -> wasmtime::Result<()> {
        if Instant::now() >= self.deadline {
            return Err(wasmtime::Trap::Interrupt.into());
        }
        Ok(())
    }

    /// A lookup answer must fit the plugin's memory and MAX_LOOKUP_BYTES:
    /// copying a larger one into the sandbox could only fail, or take time
    /// the deadline cannot interrupt.
    fn fits<T>(
        &self,
        lookup: &str,
        items: Vec<T>,
        size: impl Fn(&T) -> usize,
    ) -> wasmtime::Result<Vec<T>> {
        let bytes: usize = items.iter().map(size).sum();
        let limit = self.limiter.memory_limit.min(MAX_LOOKUP_BYTES);
        if bytes as u64 > limit {
            return Err(wasmtime::format_err!(
                "host lookup `{lookup}` answered {} items, {bytes} bytes, more than the {limit} bytes a lookup may answer (the plugin's memory limit, at most {MAX_LOOKUP_BYTES})",
                items.len(),
            ));
        }
        self.in_time()?;
        Ok(items)
    }
}

/// The host interface of world `$v`: the same lookups in both worlds, the
/// workloads converted per world (`convert::$v::workloads_to_wit`).
macro_rules! host_interface {
    ($v:ident) => {
        impl bindings::$v::wit::Host for SandboxState {}

        impl bindings::$v::wasmwatch::plugin::host::Host for SandboxState {
            fn log(
                &mut self,
                level: bindings::$v::wit::LogLevel,
                message: String,
            ) -> wasmtime::Result<()> {
                use bindings::$v::wit::LogLevel;
                let plugin = self.plugin.name.as_str();
                if self.log_lines >= LOG_LINES_PER_CALL || self.log_bytes >= LOG_BYTES_PER_CALL {
                    if self.log_lines == LOG_LINES_PER_CALL || self.log_bytes < usize::MAX {
                        tracing::warn!(
                            plugin,
                            "log limit of this call reached ({LOG_LINES_PER_CALL} lines or {LOG_BYTES_PER_CALL} bytes): dropping its further messages"
                        );
                        self.log_lines = LOG_LINES_PER_CALL + 1;
                        self.log_bytes = usize::MAX;
                    }
                    return Ok(());
                }
                let message = bounded_line(&message, MAX_MESSAGE_BYTES);
                self.log_lines += 1;
                self.log_bytes = self.log_bytes.saturating_add(message.len());
                match level {
                    LogLevel::Trace => tracing::trace!(plugin, "{message}"),
                    LogLevel::Debug => tracing::debug!(plugin, "{message}"),
                    LogLevel::Info => tracing::info!(plugin, "{message}"),
                    LogLevel::Warn => tracing::warn!(plugin, "{message}"),
                    LogLevel::Error => tracing::error!(plugin, "{message}"),
                }
                Ok(())
            }

            fn config(&mut self) -> wasmtime::Result<String> {
                Ok(self.plugin.config_json.clone())
            }

            fn workloads_referencing(
                &mut self,
                kind: bindings::$v::wit::ObjectKind,
                namespace: String,
                name: String,
            ) -> wasmtime::Result<Vec<bindings::$v::wit::WorkloadInfo>> {
                self.in_time()?;
                // A kind the host does not know is used by no workload.
                let Some(kind) = convert::$v::kind_from_wit(kind) else {
                    return Ok(Vec::new());
                };
                let found = self
                    .plugin
                    .lookups
                    .workloads_referencing(kind, &namespace, &name);
                // What this world sees of it (0.2.0: referencing apps/v1
                // workloads only), before its size counts.
                let found = convert::$v::visible(found, kind, &name);
                let found =
                    self.fits("workloads-referencing", found, convert::$v::workload_size)?;
                Ok(convert::$v::workloads_to_wit(found, kind, &name))
            }

            fn service(
                &mut self,
                namespace: String,
                name: String,
            ) -> wasmtime::Result<Option<bindings::$v::wit::ServiceInfo>> {
                self.in_time()?;
                Ok(self
                    .plugin
                    .lookups
                    .service(&namespace, &name)
                    .map(convert::$v::service_to_wit))
            }

            fn services_with_labels(
                &mut self,
                namespace: String,
                labels: Vec<bindings::$v::wit::KeyValue>,
            ) -> wasmtime::Result<Vec<bindings::$v::wit::ServiceInfo>> {
                self.in_time()?;
                let found = self
                    .plugin
                    .lookups
                    .services_with_labels(&namespace, &convert::$v::labels_from_wit(labels));
                let found = self.fits("services-with-labels", found, convert::service_size)?;
                Ok(found.into_iter().map(convert::$v::service_to_wit).collect())
            }

            fn ready_endpoints(
                &mut self,
                namespace: String,
                service: String,
            ) -> wasmtime::Result<Vec<bindings::$v::wit::Endpoint>> {
                self.in_time()?;
                let found = self.plugin.lookups.ready_endpoints(&namespace, &service);
                let found = self.fits("ready-endpoints", found, convert::endpoint_size)?;
                Ok(found.into_iter().map(convert::$v::endpoint_to_wit).collect())
            }
        }
    };
}

host_interface!(v2);
host_interface!(v3);
host_interface!(v4);

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
            "wasi:cli/environment@0.2.0",
            "wasi:random/random@0.2.6",
            // Linked with zero authority (see `zero_authority_wasi`).
            "wasi:filesystem/types@0.2.6",
            "wasi:filesystem/preopens@0.2.0",
            "wasi:sockets/tcp@0.2.6",
            "wasi:sockets/ip-name-lookup@0.2.12",
        ] {
            assert!(allowed_import(ok), "{ok}");
        }
        for no in [
            "wasi:http/outgoing-handler@0.2.6",
            "wasi:http/types@0.2.0",
            "wasi:io-extra/x",
            "evil:thing/x",
            "bare-function",
        ] {
            assert!(!allowed_import(no), "{no}");
        }
    }
}
