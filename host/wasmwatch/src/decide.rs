//! The service's side of the decide stage ([`wasmwatch_exec::decide`]):
//! a sandboxed plugin behind its [`Decider`] seam, and the metrics behind
//! its [`Observe`].
use std::sync::Arc;

use wasmwatch_core::{Action, ChangeEvent};
use wasmwatch_exec::decide::{Decider, Observe};
use wasmwatch_exec::pipeline::{BoxFuture, Policy};
use wasmwatch_runtime::Plugin;

use crate::metrics::Metrics;

/// A loaded plugin and its delivery policy.
#[derive(Clone)]
pub(crate) struct Loaded {
    pub plugin: Arc<Plugin>,
    pub policy: Policy,
}

impl Loaded {
    /// As the decide stage calls it.
    pub fn decider(&self) -> wasmwatch_exec::decide::Loaded {
        wasmwatch_exec::decide::Loaded {
            plugin: Arc::new(Sandboxed(self.plugin.clone())),
            policy: self.policy,
        }
    }
}

/// A WebAssembly plugin, one fresh sandbox per call.
struct Sandboxed(Arc<Plugin>);

impl Decider for Sandboxed {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn decide<'a>(&'a self, event: &'a ChangeEvent) -> BoxFuture<'a, Result<Vec<Action>, String>> {
        // Boxed: the call's state (wasmtime's instantiation and call
        // futures) is kilobytes, and inline it made every call task that
        // large, copied whole when spawned and twice more when it ended
        // (tokio's `set_stage`, the JoinSet's read of the output): ~3% of
        // the saturated profile in memmove (issue 24).
        Box::pin(async move {
            match self.0.handle(event).await {
                Ok(decision) => Ok(decision.allowed().cloned().collect()),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

impl Observe for Metrics {
    fn called(&self, plugin: &str, ok: bool, seconds: f64) {
        let outcome = if ok { "ok" } else { "error" };
        self.plugin_invocations.inc(&[plugin, outcome]);
        self.plugin_duration.observe(&[plugin, outcome], seconds);
    }

    fn folded(&self, plugin: &str) {
        self.changes_folded.inc(&[plugin]);
    }
}
