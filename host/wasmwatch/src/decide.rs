//! The decide stage's shell: the plugin calls of one term.
//!
//! The rules (one call per plugin and object at a time, in change order;
//! changes waiting for their turn fold into one call) are
//! [`wasmwatch_core::turns::Turns`], without I/O. This shell runs each call
//! it starts in a task of its own (so a slow or blocked plugin delays
//! neither the other plugins nor the term's loop, nor shutdown), retries a
//! failed call per the plugin's delivery policy, and hands the call back to
//! the term's loop when it is over: [`Decide::settle`] submits its decision
//! to the pipeline (or dead-letters it) and only then starts the key's next
//! call, so decisions reach the pipeline in change order.
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;
use wasmwatch_core::action::EventType;
use wasmwatch_core::turns::{Call, Offered, Turns};
use wasmwatch_core::{Action, ChangeEvent, ObjectKind};
use wasmwatch_exec::executors::Executors;
use wasmwatch_exec::pipeline::{Execute, Pipeline, Policy, Submission};
use wasmwatch_exec::{ExecError, Origin};
use wasmwatch_kube::checkpoint::Ticket;
use wasmwatch_runtime::{Decision, Plugin};

use crate::metrics::Metrics;

/// A loaded plugin and its delivery policy.
#[derive(Clone)]
pub(crate) struct Loaded {
    pub plugin: Arc<Plugin>,
    pub policy: Policy,
}

/// The changes a call stands for, in order (see [`Call`]).
pub(crate) type Tickets = Vec<Ticket>;

/// Which calls must keep their order: plugin (its index), kind, namespace, name.
type Key = (usize, ObjectKind, String, String);

/// A call that is over, for [`Decide::settle`].
pub(crate) struct Decided {
    key: Key,
    call: Call<Ticket>,
    /// The decision, or the error it is dead-lettered with.
    result: Result<Decision, ExecError>,
}

/// The plugin calls of one term; dropping it ends every call's sandbox.
pub(crate) struct Decide {
    plugins: Vec<Loaded>,
    executors: Arc<Executors>,
    metrics: Arc<Metrics>,
    turns: Turns<Key, Ticket>,
    calls: JoinSet<Decided>,
}

impl Decide {
    pub fn new(plugins: &[Loaded], executors: Arc<Executors>, metrics: Arc<Metrics>) -> Self {
        Decide {
            plugins: plugins.to_vec(),
            executors,
            metrics,
            turns: Turns::default(),
            calls: JoinSet::new(),
        }
    }

    /// Hands a change to the plugins the term chose (indexes into the
    /// plugins): a call each, now or at its turn, or folded into a call
    /// that waits for its turn.
    pub fn dispatch(&mut self, event: ChangeEvent, ticket: Ticket, plugins: &[usize]) {
        let event = Arc::new(event);
        for &index in plugins {
            let o = &event.object;
            let key = (index, o.kind, o.namespace.clone(), o.name.clone());
            match self.turns.offer(key.clone(), event.clone(), ticket) {
                Offered::Start(call) => self.start(key, call),
                Offered::Folded => {
                    let name = self.plugins[index].plugin.name();
                    self.metrics.changes_folded.inc(&[name]);
                }
                Offered::Queued => {}
            }
        }
    }

    fn start(&mut self, key: Key, call: Call<Ticket>) {
        let loaded = self.plugins[key.0].clone();
        let metrics = self.metrics.clone();
        let o = &call.event.object;
        let span = tracing::info_span!(
            "delivery",
            object = %format!("{}/{}/{}", o.kind.as_str(), o.namespace, o.name),
            change = ?call.event.change,
            resource_version = %o.resource_version,
            replay = call.event.replay,
        );
        self.calls.spawn(
            async move {
                let result = decide(&loaded, &call.event, &metrics).await;
                Decided { key, call, result }
            }
            .instrument(span),
        );
    }

    /// The next call that is over; pending while none runs.
    pub async fn next(&mut self) -> Decided {
        loop {
            match self.calls.join_next().await {
                Some(Ok(decided)) => return decided,
                Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Some(Err(_)) => {}
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Submits a call's decision to the pipeline, which finishes its
    /// tickets once its actions are over; a dead-lettered call finishes
    /// them on `done` at once. Then starts the key's next call.
    pub fn settle(
        &mut self,
        decided: Decided,
        pipeline: &Pipeline<Tickets>,
        done: &tokio::sync::mpsc::UnboundedSender<Tickets>,
    ) {
        let Decided { key, call, result } = decided;
        let loaded = &self.plugins[key.0];
        let event = &call.event;
        let origin = Origin {
            kind: event.object.kind,
            namespace: event.object.namespace.clone(),
            name: event.object.name.clone(),
            uid: event.object.uid.clone(),
            resource_version: event.object.resource_version.clone(),
            plugin: loaded.plugin.name().to_string(),
            unkeyed_digest: event
                .unkeyed_digest
                .as_ref()
                .map(|plain| (event.digest.clone(), plain.clone())),
        };
        match result {
            Ok(decision) => pipeline.submit(Submission {
                ticket: call.tickets,
                origin,
                actions: decision.allowed().cloned().collect(),
                policy: loaded.policy,
            }),
            Err(error) => {
                tracing::error!(
                    plugin = loaded.plugin.name(),
                    object = %format!("{}/{}", origin.namespace, origin.name),
                    "dead-lettered: {error}"
                );
                let action = Action::Event {
                    event_type: EventType::Warning,
                    reason: wasmwatch_exec::executors::PLUGIN_FAILED.into(),
                    message: error.to_string(),
                };
                let _ = done.send(call.tickets);
                self.executors.dead_letter(&origin, &action, &error);
            }
        }
        if let Some(next) = self.turns.finished(&key) {
            self.start(key, next);
        }
    }

    /// Calls running or waiting for their turn.
    pub fn in_flight(&self) -> usize {
        self.calls.len() + self.turns.waiting()
    }
}

/// One plugin's decision on one change, retried per the plugin's delivery
/// policy; the error it is dead-lettered with.
async fn decide(
    loaded: &Loaded,
    event: &ChangeEvent,
    metrics: &Metrics,
) -> Result<Decision, ExecError> {
    let name = loaded.plugin.name();
    let mut attempt = 0;
    loop {
        let started = Instant::now();
        // Boxed: the call's state (wasmtime's instantiation and call
        // futures) is kilobytes, and inline it made every call task that
        // large, copied whole when spawned and twice more when it ended
        // (tokio's `set_stage`, the JoinSet's read of the output): ~3% of
        // the saturated profile in memmove (issue 24).
        let result = Box::pin(loaded.plugin.handle(event)).await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics.plugin_invocations.inc(&[name, outcome]);
        metrics
            .plugin_duration
            .observe(&[name, outcome], started.elapsed().as_secs_f64());
        let error = match result {
            Ok(decision) => return Ok(decision),
            Err(e) => e,
        };
        if attempt == 0 {
            tracing::warn!(plugin = name, "plugin failed: {error}");
        } else {
            tracing::warn!(plugin = name, attempt, "plugin failed again: {error}");
        }
        if attempt >= loaded.policy.retries {
            return Err(ExecError::Permanent(format!(
                "plugin {name} failed: {error}"
            )));
        }
        attempt += 1;
        tokio::time::sleep(wasmwatch_exec::pipeline::retry_delay(
            &loaded.policy,
            attempt,
        ))
        .await;
    }
}
