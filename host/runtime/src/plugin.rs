//! A loaded plugin, and one call into it.
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::ResourceTable;
use wasmtime::{Store, Trap};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmwatch_core::manifest::{EventFilter, Limits, PluginEntry};
use wasmwatch_core::{Action, Capabilities, ChangeEvent, Verdict};

use crate::bindings::{self, PluginPre, WORLD};
use crate::convert;
use crate::error::{LoadError, PluginError};
use crate::sandbox::{Limiter, PluginShared, Runtime, SandboxState, allowed_import};

/// What the plugin's stdout and stderr may hold per call.
const PIPE_CAPACITY: usize = 16 * 1024;
/// Bytes of actions one call may return.
const MAX_OUTPUT_BYTES: usize = 1 << 20;

/// One action with the host's verdict on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckedAction {
    pub action: Action,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// What a plugin decided about one event, checked against its capabilities.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Decision {
    pub plugin: String,
    pub actions: Vec<CheckedAction>,
}

impl Decision {
    /// The actions the host may execute.
    pub fn allowed(&self) -> impl Iterator<Item = &Action> {
        self.actions
            .iter()
            .filter(|c| c.verdict.is_allowed())
            .map(|c| &c.action)
    }
}

/// A loaded, pre-linked plugin. Cheap to share; each call gets a fresh sandbox.
pub struct Plugin {
    runtime: Runtime,
    pre: PluginPre<SandboxState>,
    shared: Arc<PluginShared>,
    limits: Limits,
    capabilities: Capabilities,
    filter: EventFilter,
    module_sha256: String,
    refused: AtomicU64,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Runtime {
    /// Loads a plugin from its manifest entry: checks the pin, compiles (or
    /// takes the cached artifact), checks imports and world, and calls the
    /// plugin's `check-config`.
    pub fn load(&self, entry: &PluginEntry, base_dir: &Path) -> Result<Plugin, LoadError> {
        let plugin = entry.name.clone();
        let path = entry.module_path(base_dir);
        let bytes = std::fs::read(&path).map_err(|source| LoadError::Read {
            plugin: plugin.clone(),
            path: path.clone(),
            source,
        })?;
        let actual = sha256_hex(&bytes);
        if actual != entry.sha256 {
            return Err(LoadError::Digest {
                plugin,
                path,
                actual,
                expected: entry.sha256.clone(),
            });
        }
        // Magic, then version (2 bytes) and layer (2 bytes): layer 1 is a component.
        if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
            return Err(LoadError::NotWasm { plugin, path });
        }
        if bytes[6..8] == [0, 0] {
            return Err(LoadError::CoreModule { plugin, path });
        }
        let inner = &self.inner;
        let component = crate::cache::compile(
            &inner.engine,
            inner.config.cache_dir.as_deref(),
            &bytes,
            &actual,
        )
        .map_err(|e| LoadError::Compile {
            plugin: plugin.clone(),
            path: path.clone(),
            message: format!("{e:#}"),
        })?;
        let ty = component.component_type();
        if let Some((import, _)) = ty
            .imports(&inner.engine)
            .find(|(name, _)| !allowed_import(name))
        {
            return Err(LoadError::ForbiddenImport {
                plugin,
                import: import.to_string(),
            });
        }
        let wrong_world = |e: wasmtime::Error| LoadError::WrongWorld {
            plugin: plugin.clone(),
            world: WORLD,
            message: format!("{e:#}"),
        };
        let instance_pre = inner
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let pre = PluginPre::new(instance_pre).map_err(wrong_world)?;
        let loaded = Plugin {
            runtime: self.clone(),
            pre,
            shared: Arc::new(PluginShared {
                name: plugin.clone(),
                config_json: entry.config.to_string(),
                lookups: inner.lookups.clone(),
            }),
            limits: entry.limits,
            capabilities: entry.capabilities.clone(),
            filter: entry.events.clone(),
            module_sha256: actual,
            refused: AtomicU64::new(0),
        };
        // The first instantiation checks the exports' types; later ones rely on it.
        let check = loaded.call_inner(true, |b, s| {
            b.call_check_config(s, &loaded.shared.config_json)
        });
        match check {
            Ok(Ok(())) => Ok(loaded),
            Ok(Err(message)) => Err(LoadError::ConfigRejected { plugin, message }),
            Err(e) => Err(LoadError::ConfigCheck {
                plugin,
                source: Box::new(e),
            }),
        }
    }
}

impl Plugin {
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn module_sha256(&self) -> &str {
        &self.module_sha256
    }

    /// Which events this plugin gets.
    pub fn filter(&self) -> &EventFilter {
        &self.filter
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Actions refused so far for lack of a capability.
    pub fn refused_actions(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Runs the plugin on one event in a fresh sandbox and checks every
    /// returned action against its capabilities. Blocks the calling thread
    /// (at most the plugin's timeout, plus waiting for a free sandbox slot).
    pub fn handle(&self, event: &ChangeEvent) -> Result<Decision, PluginError> {
        let wit_event = convert::event_to_wit(event, self.capabilities.secret_values);
        let result = self.call(|b, s| b.call_handle(s, &wit_event))?;
        let actions = result.map_err(|message| PluginError::Returned {
            plugin: self.name().to_string(),
            message,
        })?;
        if actions.len() > self.limits.max_actions as usize {
            return Err(PluginError::OutputTooLarge {
                plugin: self.name().to_string(),
                what: format!(
                    "{} actions, the limit is {}",
                    actions.len(),
                    self.limits.max_actions
                ),
            });
        }
        let actions: Vec<Action> = actions.into_iter().map(convert::action_from_wit).collect();
        let size: usize = actions.iter().map(Action::approx_size).sum();
        if size > MAX_OUTPUT_BYTES {
            return Err(PluginError::OutputTooLarge {
                plugin: self.name().to_string(),
                what: format!("{size} bytes of actions, the limit is {MAX_OUTPUT_BYTES}"),
            });
        }
        let actions = actions
            .into_iter()
            .map(|action| {
                let verdict = self.capabilities.check(&action);
                if let Verdict::Refused { capability, reason } = &verdict {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        plugin = self.name(),
                        capability,
                        action = action.type_name(),
                        "refused action: {reason}"
                    );
                }
                CheckedAction { action, verdict }
            })
            .collect();
        Ok(Decision {
            plugin: self.name().to_string(),
            actions,
        })
    }

    /// A fresh sandbox and the cheapest call (`check-config`), for benchmarks
    /// that separate the sandbox's cost from the plugin's work.
    #[doc(hidden)]
    pub fn sandbox_only(&self) -> Result<(), PluginError> {
        self.call(|b, s| b.call_check_config(s, "{}")).map(|_| ())
    }

    /// Like [`Plugin::handle`], on tokio's blocking pool.
    pub async fn handle_async(
        self: &Arc<Self>,
        event: ChangeEvent,
    ) -> Result<Decision, PluginError> {
        let me = self.clone();
        match tokio::task::spawn_blocking(move || me.handle(&event)).await {
            Ok(r) => r,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }

    /// One call in a fresh sandbox, with the deadline and the memory limit.
    fn call<R>(
        &self,
        f: impl FnOnce(&bindings::Plugin, &mut Store<SandboxState>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        self.call_inner(false, f)
    }

    /// [`Plugin::call`]; `check_types` type-checks the exports (load does,
    /// once; see [`bindings::PluginPre::instantiate_prechecked`]).
    fn call_inner<R>(
        &self,
        check_types: bool,
        f: impl FnOnce(&bindings::Plugin, &mut Store<SandboxState>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        let inner = &self.runtime.inner;
        let _permit = inner.permits.acquire();
        let stdout = MemoryOutputPipe::new(PIPE_CAPACITY);
        let stderr = MemoryOutputPipe::new(PIPE_CAPACITY);
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .build();
        let mut store = Store::new(
            &inner.engine,
            SandboxState {
                wasi,
                table: ResourceTable::new(),
                limiter: Limiter {
                    memory_limit: self.limits.memory.0,
                    memory_refused: false,
                },
                plugin: self.shared.clone(),
            },
        );
        store.limiter(|s| &mut s.limiter);
        let tick = inner.config.epoch_tick;
        store.set_epoch_deadline(ticks(self.limits.timeout.0, tick));
        store.epoch_deadline_trap();
        let instance = if check_types {
            self.pre.instantiate(&mut store)
        } else {
            self.pre.instantiate_prechecked(&mut store)
        };
        let result = instance.and_then(|bindings| f(&bindings, &mut store));
        let out = String::from_utf8_lossy(&stdout.contents()).into_owned();
        if !out.trim().is_empty() {
            tracing::debug!(plugin = self.name(), "stdout: {}", out.trim());
        }
        result.map_err(|e| self.classify(e, store.data().limiter.memory_refused, &stderr))
    }

    fn classify(
        &self,
        e: wasmtime::Error,
        memory_refused: bool,
        stderr: &MemoryOutputPipe,
    ) -> PluginError {
        let plugin = self.name().to_string();
        let stderr = String::from_utf8_lossy(&stderr.contents())
            .trim()
            .to_string();
        match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => PluginError::Timeout {
                plugin,
                limit: self.limits.timeout.0,
            },
            Some(Trap::StackOverflow) => PluginError::StackOverflow { plugin },
            _ if memory_refused => PluginError::MemoryLimit {
                plugin,
                limit: self.limits.memory.0,
                stderr,
            },
            _ => PluginError::Trap {
                plugin,
                trap: describe_trap(&e),
                stderr,
            },
        }
    }
}

/// Epoch ticks for a timeout, rounded up (the first tick may come early, so a call gets between n-1 and n ticks).
fn ticks(timeout: Duration, tick: Duration) -> u64 {
    (timeout.as_nanos().div_ceil(tick.as_nanos().max(1)) as u64).max(1)
}

/// The trap's cause, then its (short) wasm backtrace, on one line.
fn describe_trap(e: &wasmtime::Error) -> String {
    let cause = e.root_cause().to_string();
    match e.downcast_ref::<wasmtime::WasmBacktrace>() {
        Some(bt) => {
            let frames: Vec<String> = bt
                .to_string()
                .lines()
                .skip(1)
                .map(|l| l.trim().to_string())
                .collect();
            format!("{cause} (wasm backtrace: {})", frames.join(" <- "))
        }
        None => cause,
    }
}
