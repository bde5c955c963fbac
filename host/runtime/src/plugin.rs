//! A loaded plugin, and one call into it.
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sha2::{Digest, Sha256};
use wasmtime::component::ResourceTable;
use wasmtime::{Store, Trap, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmwatch_core::manifest::{EventFilter, Limits, PluginEntry};
use wasmwatch_core::text::{MAX_MESSAGE_BYTES, bounded_line};
use wasmwatch_core::{Action, Capabilities, ChangeEvent, ObjectKind, Verdict};

use crate::bindings::{self, Exports, Pre, WORLDS};
use crate::convert;
use crate::error::{LoadError, PluginError};
use crate::output::{self, HandleOutput, MAX_OUTPUT_BYTES, OutputRefused, WithLimits, World};
use crate::sandbox::{
    Limiter, PluginShared, Runtime, SandboxState, allowed_import, zero_authority_wasi,
};

/// What the plugin's stdout and stderr may hold per call.
/// Per guest-to-host transfer (see `Store::set_hostcall_fuel`).
const HOSTCALL_FUEL: usize = 16 << 20;
const PIPE_CAPACITY: usize = 16 * 1024;

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
    /// Pre-linked, of the world the component targets.
    pre: Pre<SandboxState>,
    shared: Arc<PluginShared>,
    limits: Limits,
    capabilities: Capabilities,
    filter: EventFilter,
    module_sha256: String,
    refused: AtomicU64,
    /// This plugin's share of the sandbox slots.
    permits: Arc<tokio::sync::Semaphore>,
    /// The labels and annotations of a changed object it declares it reads
    /// (`wasmwatch:needs` `metadata`, placeholders filled from its config).
    metadata_reads: Option<wasmwatch_core::needs::MetadataReads>,
    /// The conditions it declares every object it is called for meets
    /// (`wasmwatch:needs` `only`).
    prefilter: wasmwatch_core::prefilter::Prefilter,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Runtime {
    /// Loads a plugin from its manifest entry: checks the pin, refuses
    /// forbidden imports, compiles (or takes the cached artifact, off the
    /// async workers), checks the world, and calls the plugin's
    /// `check-config` (within the plugin's time limit).
    pub async fn load(&self, entry: &PluginEntry, base_dir: &Path) -> Result<Plugin, LoadError> {
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
        // Before compiling: a refused component costs no compile time.
        let worlds = match component_imports(&bytes) {
            Ok(imports) => {
                if let Some(import) = imports.iter().find(|name| !allowed_import(name)) {
                    return Err(LoadError::ForbiddenImport {
                        plugin,
                        import: import.clone(),
                    });
                }
                worlds_to_try(&imports)
            }
            Err(message) => {
                return Err(LoadError::Compile {
                    plugin,
                    path,
                    message,
                });
            }
        };
        // What it reads of an object's labels and annotations, if it says
        // (`wasmwatch validate` reports a section it cannot read).
        // And the host-side prefilters it declares (issue 35), whose
        // labels and annotations the stored index keeps too.
        let needs = wasmwatch_core::needs::Needs::from_wasm(&bytes)
            .ok()
            .flatten()
            .unwrap_or_default();
        let (prefilter, unknown) =
            wasmwatch_core::prefilter::Prefilter::of(&needs.only, &entry.config);
        for e in unknown {
            tracing::warn!(plugin = %plugin, "prefilter left out: {e}");
        }
        let metadata_reads =
            prefilter.join_reads(needs.metadata.map(|m| m.expanded(&entry.config)));
        let inner = &self.inner;
        let compiled = {
            let engine = inner.engine.clone();
            let cache_dir = inner.config.cache_dir.clone();
            let digest = actual.clone();
            tokio::task::spawn_blocking(move || {
                let component =
                    crate::cache::compile(&engine, cache_dir.as_deref(), &bytes, &digest)?;
                // The memory image (a memfd holding the initial memory) is
                // otherwise made by the first instantiation, inside the
                // config check's deadline: ~10 ms for a Python plugin's
                // snapshot, more on a busy machine. Best effort: sealing the
                // memfd can fail for a moment (EBUSY while the kernel finds
                // its pages pinned; seen once in CI for a 12 MB JS
                // component), and then the first instantiation tries again.
                if let Err(e) = component.initialize_copy_on_write_image() {
                    tracing::warn!(
                        module = %digest,
                        "memory image not made at load, the first sandbox makes it: {e:#}"
                    );
                }
                Ok::<_, wasmtime::Error>(component)
            })
            .await
        };
        let component = match compiled {
            Ok(r) => r,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
        .map_err(|e| LoadError::Compile {
            plugin: plugin.clone(),
            path: path.clone(),
            message: crate::sandbox::with_pool_hint(format!("{e:#}")),
        })?;
        let wrong_world = |message: String| LoadError::WrongWorld {
            plugin: plugin.clone(),
            world: WORLDS,
            message,
        };
        let instance_pre = inner
            .linker
            .instantiate_pre(&component)
            .map_err(|e| wrong_world(format!("{e:#}")))?;
        // The world whose exports the component has (the generated
        // constructors type-check them), among those its imports name.
        let mut problems = Vec::new();
        let mut pre = None;
        for world in worlds {
            let made = match world {
                bindings::v2::WORLD => {
                    bindings::v2::PluginPre::new(instance_pre.clone()).map(Pre::V2)
                }
                bindings::v3::WORLD => {
                    bindings::v3::PluginPre::new(instance_pre.clone()).map(Pre::V3)
                }
                _ => bindings::v4::PluginPre::new(instance_pre.clone()).map(Pre::V4),
            };
            match made {
                Ok(p) => {
                    pre = Some(p);
                    break;
                }
                Err(e) => problems.push(format!("{world}: {e:#}")),
            }
        }
        let pre = pre.ok_or_else(|| wrong_world(problems.join("; ")))?;
        tracing::debug!(plugin, world = pre.world(), "world");
        if !pre.open_kinds()
            && let Some(kind) = entry
                .events
                .kinds
                .iter()
                .find(|k| matches!(k, ObjectKind::Custom(_)))
        {
            return Err(LoadError::KindNotInWorld {
                plugin,
                kind: kind.to_string(),
                world: pre.world(),
            });
        }
        let loaded = Plugin {
            runtime: self.clone(),
            pre,
            shared: Arc::new(PluginShared {
                name: plugin.clone(),
                config_json: entry.config.to_string(),
                lookups: inner.lookups.clone(),
            }),
            permits: Arc::new(tokio::sync::Semaphore::new(
                inner.config.plugin_concurrency.max(1) as usize,
            )),
            limits: entry.limits,
            capabilities: entry.capabilities.clone(),
            filter: entry.events.clone(),
            module_sha256: actual,
            refused: AtomicU64::new(0),
            metadata_reads,
            prefilter,
        };
        // The first instantiation checks the exports' types; later ones
        // rely on it, and so does `output::call_handle`.
        let config = loaded.shared.config_json.clone();
        let started = Instant::now();
        let check = loaded
            .call(true, move |b, s| {
                Box::pin(async move {
                    b.check_handle(&*s)?;
                    b.call_check_config(s, &config).await
                })
            })
            .await;
        tracing::debug!(plugin, elapsed = ?started.elapsed(), "config check done");
        match check {
            Ok(Ok(())) => Ok(loaded),
            Ok(Err(message)) => Err(LoadError::ConfigRejected {
                plugin,
                message: bounded_line(&message, MAX_MESSAGE_BYTES).into_owned(),
            }),
            Err(e) => Err(LoadError::ConfigCheck {
                plugin,
                source: Box::new(e),
            }),
        }
    }

    /// [`Runtime::load`] for callers outside any async runtime.
    pub fn load_blocking(&self, entry: &PluginEntry, base_dir: &Path) -> Result<Plugin, LoadError> {
        self.block_on(self.load(entry, base_dir))
    }
}

/// The worlds to try for a component, by the `wasmwatch:plugin` versions
/// it imports (every component of either world imports its `types`): the
/// one it names, else both.
fn worlds_to_try(imports: &[String]) -> Vec<&'static str> {
    let ours = |version: &str| {
        imports.iter().any(|name| {
            name.strip_prefix("wasmwatch:plugin/")
                .and_then(|rest| rest.split_once('@'))
                .is_some_and(|(_, v)| v == version)
        })
    };
    let named: Vec<&'static str> = [
        ("0.2.0", bindings::v2::WORLD),
        ("0.3.0", bindings::v3::WORLD),
        ("0.4.0", bindings::v4::WORLD),
    ]
    .into_iter()
    .filter(|(version, _)| ours(version))
    .map(|(_, world)| world)
    .collect();
    if named.len() == 1 {
        named
    } else {
        vec![
            bindings::v2::WORLD,
            bindings::v3::WORLD,
            bindings::v4::WORLD,
        ]
    }
}

/// The names a component imports at its top level (what the host must
/// provide), read without compiling it.
fn component_imports(bytes: &[u8]) -> Result<Vec<String>, String> {
    let mut depth = 0usize;
    let mut names = Vec::new();
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| format!("not a valid component: {e}"))? {
            wasmparser::Payload::Version { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| format!("not a valid component: {e}"))?;
                    // Type imports (a world's `use`d types) are not
                    // something the host provides.
                    if !matches!(import.ty, wasmparser::ComponentTypeRef::Type(_)) {
                        names.push(import.name.name.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    Ok(names)
}

type CallFuture<'s, R> = Pin<Box<dyn Future<Output = wasmtime::Result<R>> + Send + 's>>;

impl Plugin {
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn module_sha256(&self) -> &str {
        &self.module_sha256
    }

    /// The WIT world the plugin's component targets, e.g.
    /// `wasmwatch:plugin/plugin@0.3.0`.
    pub fn world(&self) -> &'static str {
        self.pre.world()
    }

    /// Which events this plugin gets.
    pub fn filter(&self) -> &EventFilter {
        &self.filter
    }

    /// The labels and annotations of a changed object it reads; `None`
    /// when it does not declare them (any of them, then).
    pub fn metadata_reads(&self) -> Option<&wasmwatch_core::needs::MetadataReads> {
        self.metadata_reads.as_ref()
    }

    /// The host-side prefilters it declares (empty: every selected
    /// object is its to judge).
    pub fn prefilter(&self) -> &wasmwatch_core::prefilter::Prefilter {
        &self.prefilter
    }

    /// The first of its prefilters `event` does not meet, judged on the
    /// lookups its calls see; `None`: it is called.
    pub fn skips(&self, event: &ChangeEvent) -> Option<&wasmwatch_core::prefilter::Condition> {
        if self.prefilter.is_empty() {
            return None;
        }
        self.prefilter.rejects(event, &*self.runtime.inner.lookups)
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Actions refused so far for lack of a capability.
    pub fn refused_actions(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Runs the plugin on one event in a fresh sandbox and checks every
    /// returned action against its capabilities. Takes at most the
    /// plugin's timeout once a sandbox slot is free, whatever the plugin
    /// calls; dropping the future ends the call at once.
    pub async fn handle(&self, event: &ChangeEvent) -> Result<Decision, PluginError> {
        let secret_values = self.capabilities.secret_values;
        if let ObjectKind::Custom(_) = event.object.kind
            && !self.pre.open_kinds()
        {
            return Err(PluginError::KindNotInWorld {
                plugin: self.name().to_string(),
                kind: event.object.kind.to_string(),
                world: self.pre.world(),
            });
        }
        let result = match &self.pre {
            Pre::V2(_) => {
                self.call_handle::<output::V2>(convert::v2::event_to_wit(event, secret_values))
                    .await?
            }
            Pre::V3(_) => {
                self.call_handle::<output::V3>(convert::v3::event_to_wit(event, secret_values))
                    .await?
            }
            Pre::V4(_) => {
                self.call_handle::<output::V4>(convert::v4::event_to_wit(event, secret_values))
                    .await?
            }
        };
        let max_actions = self.limits.max_actions as usize;
        let actions = match result {
            HandleOutput::Actions(actions) => actions,
            HandleOutput::Error { text, len } => {
                return Err(PluginError::Returned {
                    plugin: self.name().to_string(),
                    message: returned_message(&text, len),
                });
            }
        };
        // Checked while copying already; the size again exactly (the count
        // while copying is in code units, which differ for UTF-16 guests).
        if actions.len() > max_actions {
            return Err(PluginError::OutputTooLarge {
                plugin: self.name().to_string(),
                what: format!(
                    "{} actions, the limit is {}",
                    actions.len(),
                    self.limits.max_actions
                ),
            });
        }
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
                        "refused action: {}",
                        bounded_line(reason, MAX_MESSAGE_BYTES)
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

    /// `handle` of world `W` in a fresh sandbox. The output is counted
    /// while it is copied out of the sandbox, and refused at the first
    /// action over the limits (see `output`).
    async fn call_handle<W: World>(&self, event: W::Event) -> Result<HandleOutput, PluginError>
    where
        W::Event: Send,
    {
        let max_actions = self.limits.max_actions as usize;
        self.call(false, move |b, s| {
            Box::pin(WithLimits::new(max_actions, async move {
                output::call_handle::<W>(b.handle_func(), s, &event).await
            }))
        })
        .await
    }

    /// [`Plugin::handle`] for callers outside any async runtime.
    pub fn handle_blocking(&self, event: &ChangeEvent) -> Result<Decision, PluginError> {
        self.runtime.block_on(self.handle(event))
    }

    /// A fresh sandbox and the cheapest call (`check-config`), for benchmarks
    /// that separate the sandbox's cost from the plugin's work.
    #[doc(hidden)]
    pub async fn sandbox_only(&self) -> Result<(), PluginError> {
        self.call(false, |b, s| {
            Box::pin(async move { b.call_check_config(s, "{}").await })
        })
        .await
        .map(|_| ())
    }

    /// One call in a fresh sandbox, with the deadline and the memory limit.
    /// `check_types` type-checks the exports (load does, once; see
    /// [`bindings::v2::PluginPre::instantiate_prechecked`]).
    ///
    /// The deadline holds two ways: wasm code meets the epoch callback at
    /// every tick (it yields to other tasks, and traps once the time is
    /// up), and the whole call is a future dropped at the deadline, which
    /// also ends a call waiting in a host function (a wasi:clocks poll).
    async fn call<R: Send>(
        &self,
        check_types: bool,
        f: impl FnOnce(Exports, &mut Store<SandboxState>) -> CallFuture<'_, R> + Send,
    ) -> Result<R, PluginError> {
        let inner = &self.runtime.inner;
        // Waiting for a slot is not the plugin's time. The semaphores are
        // never closed.
        let _mine = self.permits.acquire().await.expect("permits never close");
        let _slot = inner.permits.acquire().await.expect("permits never close");
        // The epoch advances while this guard lives, so the deadline below
        // reaches wasm code (the ticker sleeps between calls).
        let _ticking = inner.ticker.ticking();
        let stdout = MemoryOutputPipe::new(PIPE_CAPACITY);
        let stderr = MemoryOutputPipe::new(PIPE_CAPACITY);
        let wasi = zero_authority_wasi(stdout.clone(), stderr.clone());
        let timeout = self.limits.timeout.0;
        let deadline = Instant::now() + timeout;
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
                deadline,
                log_lines: 0,
                log_bytes: 0,
            },
        );
        store.limiter(|s| &mut s.limiter);
        // What one guest-to-host transfer (an import's arguments, an
        // export's result) may copy: wasmtime's default is 128 MiB, which a
        // hostile plugin could make the host copy uninterruptibly (a UTF-16
        // error string, a huge log argument). Accepted outputs need ~3 MiB
        // (`MAX_OUTPUT_BYTES` of payload plus per-item overhead).
        store.set_hostcall_fuel(HOSTCALL_FUEL);
        store.epoch_deadline_callback(move |_| {
            Ok(if Instant::now() >= deadline {
                UpdateDeadline::Interrupt
            } else {
                UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now()))
            })
        });
        store.set_epoch_deadline(1);
        let run = async {
            let exports = self.pre.instantiate(&mut store, check_types).await?;
            f(exports, &mut store).await
        };
        let result = tokio::time::timeout_at(deadline.into(), run).await;
        let out = String::from_utf8_lossy(&stdout.contents()).into_owned();
        if !out.trim().is_empty() {
            tracing::debug!(
                plugin = self.name(),
                "stdout: {}",
                bounded_line(out.trim(), MAX_MESSAGE_BYTES)
            );
        }
        match result {
            Ok(r) => r.map_err(|e| self.classify(e, store.data().limiter.memory_refused, &stderr)),
            Err(_elapsed) => Err(PluginError::Timeout {
                plugin: self.name().to_string(),
                limit: timeout,
            }),
        }
    }

    fn classify(
        &self,
        e: wasmtime::Error,
        memory_refused: bool,
        stderr: &MemoryOutputPipe,
    ) -> PluginError {
        let plugin = self.name().to_string();
        let stderr = bounded_line(
            String::from_utf8_lossy(&stderr.contents()).trim(),
            MAX_MESSAGE_BYTES,
        )
        .into_owned();
        if let Some(OutputRefused(what)) = e.downcast_ref::<OutputRefused>() {
            return PluginError::OutputTooLarge {
                plugin,
                what: what.clone(),
            };
        }
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
                trap: bounded_line(&describe_trap(&e), MAX_MESSAGE_BYTES).into_owned(),
                stderr,
            },
        }
    }
}

/// A plugin's error message on one bounded line. `text` is what was copied
/// out of the sandbox, `len` the length of the whole message.
fn returned_message(text: &str, len: usize) -> String {
    let line = bounded_line(text, MAX_MESSAGE_BYTES);
    if len <= text.len() {
        return line.into_owned();
    }
    // Only a prefix, longer than a line, was copied: the line is cut and
    // says how long that prefix is; say how long the message is.
    let prefix_said = format!("(truncated, {} bytes in all)", text.len());
    match line.strip_suffix(prefix_said.as_str()) {
        Some(cut) => format!("{cut}(truncated, {len} bytes in all)"),
        None => line.into_owned(),
    }
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
