//! One term of leadership: the shell around [`Term`].
//!
//! ```text
//! lead: claim the state ─▶ watch loops (one per kind × namespace)
//!   Shell::next: one input (a watch output, a call over, a save written,
//!                a ticket done, a tick, shutdown, the fence)
//!   Term::handle: input ─▶ effects
//!   Shell::apply: Dispatch ─▶ Decide (plugin calls) ─▶ pipeline ─▶ done
//!                 Save ─▶ the checkpoint store (one save at a time)
//!   Shell::finish: stop, then the final save of what is complete
//! ```
//!
//! The rules live in [`Term`] (host/kube/src/term.rs) and
//! [`wasmwatch_core::turns`]; this file only carries out what they decide.
use std::collections::VecDeque;
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::{BoxStream, SelectAll};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;
use wasmwatch_core::action::EventType;
use wasmwatch_core::index::Remember;
use wasmwatch_core::{ChangeEvent, ObjectKind};
use wasmwatch_exec::pipeline::{Execute, Outcome, Pipeline, PipelineConfig, Report};
use wasmwatch_kube::checkpoint::{
    CheckpointError, CheckpointStore, Checkpoints, Claimed, SaveHealth, StreamIndex, Ticket,
};
use wasmwatch_kube::elector::{Fence, Leadership};
use wasmwatch_kube::term::{Effect, End, Input, Saved, Start, Term};
use wasmwatch_kube::watchloop::{Flush, Output, WatchLoop, WatchStats, WatchTarget};
use wasmwatch_runtime::Plugin;

use super::{AbortOnDrop, Reports, Service, describe, print_report};
use crate::decide::{Decide, Tickets};
use crate::metrics::Metrics;

/// "May this replica act": the stretch of acting its term began in (HA
/// off: always).
type MayAct = Arc<dyn Fn() -> bool + Send + Sync>;

/// Plugin calls in flight (waiting for their turn, deciding, retrying)
/// before the term stops reading watch outputs. Changes folded into a
/// waiting call cost no call, so a backlog over N objects and P plugins
/// needs about 2·N·P calls: with 1,024, a burst over a few hundred objects
/// folds (at 512, 20,000 changes over 200 objects mostly did not; each call
/// holds its change, ~13 KiB with 10 KiB of data, so the budget is ~13 MiB).
const CALLS_IN_FLIGHT: usize = 1024;

/// Pipeline jobs (waiting or running) before the term stops reading watch
/// outputs. Coalescing targets hold one job each; contents queue one per
/// change, so a destination failing for minutes would otherwise hold every
/// body written meanwhile. Not tickets: those legitimately wait out debounce
/// windows, and one app's window must not stall the others.
const QUEUED_JOBS: usize = 10_000;

/// How long a leader stepping down waits for the changes in flight and a
/// last index from every watch loop (it then releases the Lease: the
/// handover waits for this too).
const DRAIN: std::time::Duration = std::time::Duration::from_millis(500);

/// A save being written, with the store it gives back.
type Writing =
    std::pin::Pin<Box<dyn std::future::Future<Output = (CheckpointStore, Saved)> + Send>>;

/// Per watch loop: its kind, counters, and the values already counted.
type WatchCounters = Vec<(ObjectKind, Arc<WatchStats>, u64, u64)>;

impl Service {
    /// Leads until this replica may not act any more (returns false) or
    /// shutdown (true): claims the state, starts the watch loops, feeds the
    /// term what happens and carries out what it decides.
    pub(super) async fn lead(
        self: &Arc<Self>,
        fence: Option<Fence>,
        mut leadership: watch::Receiver<Leadership>,
        shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> bool {
        let acting = match &fence {
            Some(f) => match f.acting() {
                Some(a) => Some(a),
                None => return false,
            },
            None => None,
        };
        let term_of = acting.as_ref().map(|a| a.term.clone());
        let may_act: MayAct = Arc::new(move || match (&fence, &acting) {
            (Some(f), Some(a)) => f.still(a),
            _ => true,
        });
        let (store, mut claimed) = match self.claim(term_of, &may_act, shutdown).await {
            Ok(claim) => claim,
            Err(shutdown) => return shutdown,
        };
        let mut term = Term::new(
            claimed.checkpoints.clone(),
            claimed.unreadable.keys().copied(),
            store.is_some(),
            self.options.checkpoint_interval,
            Instant::now(),
            self.route(),
        );
        let flush = Flush::default();
        let (outputs, tasks, counters) = self.watch(&mut term, &mut claimed, &flush);
        drop(claimed);
        let mut shell = Shell::new(self, may_act, store, outputs, tasks, counters, flush);
        let end = loop {
            let Some(input) = shell.next(&mut term, &mut leadership, shutdown).await else {
                continue;
            };
            // A call that stood for several changes (folded while waiting
            // for its turn) finishes each of them, in order.
            let mut effects = VecDeque::new();
            for ticket in shell.folded.drain(..) {
                effects.extend(term.handle(Input::Finished(ticket), Instant::now()));
            }
            effects.extend(term.handle(input, Instant::now()));
            if let Some(end) = shell.apply(effects) {
                break end;
            }
        };
        shell.finish(term, end).await
    }

    /// Claims the state Lease (HA only: no store without it), retrying
    /// while this replica may act. `Err(true)`: shutdown came first;
    /// `Err(false)`: not leading this term.
    async fn claim(
        &self,
        term: Option<wasmwatch_kube::elector::Term>,
        may_act: &MayAct,
        shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> Result<(Option<CheckpointStore>, Claimed), bool> {
        let Some(acting) = term else {
            return Ok((None, Claimed::default()));
        };
        let mut store = CheckpointStore::new(
            self.client.clone(),
            &self.lease_namespace,
            &self.manifest.ha.state_lease_name,
            &self.manifest.ha.lease_name,
            acting,
        );
        let mut failures = 0;
        loop {
            match store.claim().await {
                Ok(claimed) => {
                    self.report_unreadable_state(&store, &claimed);
                    return Ok((Some(store), claimed));
                }
                Err(CheckpointError::Api(e)) if may_act() => {
                    failures += 1;
                    let delay = wasmwatch_kube::watchloop::backoff(failures);
                    tracing::warn!("cannot claim the state Lease, retrying in {delay:?}: {e}");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = &mut *shutdown => return Err(true),
                    }
                }
                Err(e) => {
                    tracing::error!("cannot claim the state Lease: {e}; not leading this term");
                    return Err(false);
                }
            }
        }
    }

    /// Which plugins a change goes to (indexes into the plugins): none when
    /// its namespace is out of scope. The watch loops still index such an
    /// object, so its next change once its namespace is in scope is told
    /// against this one.
    fn route(&self) -> wasmwatch_kube::term::Route {
        let plugins: Vec<_> = self.plugins.iter().map(|l| l.plugin.clone()).collect();
        let in_scope = self.namespaces.clone();
        Box::new(move |event: &ChangeEvent| {
            if !in_scope.admits(&event.object.namespace) {
                tracing::debug!(namespace = %event.object.namespace, "not delivered: namespace out of scope");
                return Vec::new();
            }
            plugins
                .iter()
                .enumerate()
                .filter(|(_, p)| p.filter().matches(event))
                .map(|(i, _)| i)
                .collect()
        })
    }

    /// Starts one watch loop per kind × namespace, each from its checkpoint
    /// and with its part of the claimed index (taken out of `claimed`),
    /// and tells the term about each stream. The term reads every loop's
    /// channel itself: a forwarding task per loop cost one more task
    /// wake-up per change (issue 24).
    fn watch(
        &self,
        term: &mut Term,
        claimed: &mut Claimed,
        flush: &Flush,
    ) -> (Outputs, Vec<AbortOnDrop>, WatchCounters) {
        let indexes = std::mem::take(&mut claimed.indexes);
        let (mut streams, mut tasks, mut counters) = (Vec::new(), Vec::new(), Vec::new());
        let watch = &self.manifest.watch;
        for kind in &watch.kinds {
            for scope in watch.scopes() {
                let target = WatchTarget {
                    kind: *kind,
                    scope: scope.clone(),
                    label_selector: watch
                        .label_selector
                        .as_ref()
                        .map(|s| s.as_str().to_string()),
                    field_selector: watch.field_selector(),
                    metadata_changes: watch.metadata_changes,
                    digest_key: match kind {
                        ObjectKind::Secret => self.digest_key.clone(),
                        ObjectKind::ConfigMap => None,
                    },
                    remember: self.remember(*kind),
                };
                let from = claimed.checkpoints.get(*kind, &scope).map(str::to_string);
                let client = self.client.clone();
                let (start, mut wl) = if claimed.unreadable.contains_key(kind) {
                    (Start::DeliverAll, WatchLoop::deliver_all(client, target))
                } else if from.is_some() {
                    (Start::Resume, WatchLoop::new(client, target, from))
                } else {
                    (Start::Baseline, WatchLoop::new(client, target, None))
                };
                // A stream the stored index has no part for rebuilds one
                // from a list before watching (not `with_index`).
                if let Some(index) = indexes.get(kind)
                    && claimed.covers(*kind, &scope)
                {
                    wl = wl.with_index(index.part(&scope));
                }
                let span = tracing::info_span!("watch", kind = kind.as_str(), namespace = %scope);
                let id = term.stream(*kind, scope, start);
                // The checkpoint waits for an index taken after each change:
                // send it as often as checkpoints are saved.
                wl.index_interval = self.options.checkpoint_interval;
                let wl = wl.with_flush(flush);
                counters.push((*kind, wl.stats(), 0u64, 0u64));
                let (loop_tx, loop_rx) = mpsc::channel(256);
                tasks.push(AbortOnDrop(tokio::spawn(wl.run(loop_tx).instrument(span))));
                streams.push(
                    futures_util::stream::unfold(loop_rx, move |mut rx| async move {
                        rx.recv().await.map(|o| ((id, o), rx))
                    })
                    .boxed(),
                );
            }
        }
        (futures_util::stream::select_all(streams), tasks, counters)
    }

    /// Counts every action report in the metrics and prints it as asked.
    /// What the index keeps of each object of `kind`: the labels and
    /// annotations its plugins declare they read and the keys the label
    /// selectors name; all of them when a plugin declares nothing.
    fn remember(&self, kind: ObjectKind) -> Arc<Remember> {
        let plugins: Vec<&Plugin> = self
            .plugins
            .iter()
            .map(|l| &*l.plugin)
            .filter(|p| p.filter().kinds.contains(&kind))
            .collect();
        let selectors = plugins
            .iter()
            .filter_map(|p| p.filter().label_selector.as_ref())
            .chain(self.manifest.watch.label_selector.as_ref());
        Arc::new(Remember::of(
            plugins.iter().map(|p| p.metadata_reads().cloned()),
            selectors.flat_map(|s| s.keys()),
        ))
    }

    fn on_report(&self) -> Arc<dyn Fn(&Report) + Send + Sync> {
        let metrics = self.metrics.clone();
        let print = self.options.reports;
        let identity = self.options.identity.clone();
        Arc::new(move |r: &Report| {
            let kind = r.action.type_name();
            match &r.outcome {
                Outcome::Done => metrics.actions.inc(&[kind, "done"]),
                Outcome::Retrying { .. } => {
                    metrics.actions.inc(&[kind, "retrying"]);
                    metrics.action_retries.inc(&[kind]);
                }
                Outcome::DeadLettered { .. } => {
                    metrics.actions.inc(&[kind, "dead_lettered"]);
                    metrics.dead_letters.inc(&[kind]);
                }
                // The fence closed: the term ends at its next look
                // (`may_act` stays false for this stretch), and the next
                // one replays what was given up.
                Outcome::Abandoned => metrics.actions.inc(&[kind, "abandoned"]),
            }
            match print {
                Reports::Quiet => {}
                Reports::Json => print_report(r),
                Reports::Human => println!("[{identity}] {}", describe(r)),
            }
        })
    }

    /// Logs what of the state Lease could not be read and puts a Warning
    /// Event on it (in the background: leading does not wait for it).
    fn report_unreadable_state(&self, store: &CheckpointStore, claimed: &Claimed) {
        let problems = claimed.problems();
        if problems.is_empty() {
            return;
        }
        let lease = &self.manifest.ha.state_lease_name;
        for p in &problems {
            tracing::error!(lease = %lease, "state Lease unreadable: {p}");
        }
        self.warn_on_state_lease(store.uid(), "StateUnreadable", problems.join("; "));
    }

    /// Puts a Warning Event on the state Lease (in the background: leading
    /// does not wait for it).
    fn warn_on_state_lease(&self, uid: Option<String>, reason: &'static str, message: String) {
        let kube = self.executors.kube.clone();
        let namespace = self.lease_namespace.clone();
        let name = self.manifest.ha.state_lease_name.clone();
        tokio::spawn(async move {
            if let Err(e) = kube
                .lease_event(&namespace, &name, uid, EventType::Warning, reason, &message)
                .await
            {
                tracing::warn!("cannot record the {reason} Event: {e}");
            }
        });
    }
}

/// Every watch loop's outputs, tagged with its stream; ends (`None`) when
/// every loop has ended.
type Outputs = SelectAll<BoxStream<'static, (usize, Output)>>;

/// What one term carries out: the watch loops' outputs, the plugin calls,
/// the pipeline, and the save being written.
struct Shell {
    service: Arc<Service>,
    may_act: MayAct,
    store: Option<CheckpointStore>,
    /// The save being written (it holds the store until it is over):
    /// polled beside the other inputs, so that changes go on meanwhile
    /// (the term asks for one save at a time; issue 24).
    writing: Option<Writing>,
    /// How the saves go, for the metrics and a Warning Event.
    health: Option<SaveHealth>,
    /// Stepping down (SIGTERM): until when the term may drain.
    closing: Option<Instant>,
    outputs: Outputs,
    tasks: Vec<AbortOnDrop>,
    counters: WatchCounters,
    /// Asks every loop for its index when stepping down.
    flush: Flush,
    decide: Decide,
    pipeline: Pipeline<Tickets>,
    done_tx: mpsc::UnboundedSender<Tickets>,
    done: mpsc::UnboundedReceiver<Tickets>,
    /// The changes finished before the last one of a call that stood for
    /// several, for the term before that one.
    folded: Vec<Ticket>,
}

impl Shell {
    fn new(
        service: &Arc<Service>,
        may_act: MayAct,
        store: Option<CheckpointStore>,
        outputs: Outputs,
        tasks: Vec<AbortOnDrop>,
        counters: WatchCounters,
        flush: Flush,
    ) -> Self {
        let (done_tx, done) = mpsc::unbounded_channel::<Tickets>();
        let pipeline = Pipeline::start_with_pauses(
            service.executors.clone() as Arc<dyn Execute>,
            PipelineConfig::from(&service.manifest.rate_limits),
            Some(service.pause_of.clone()),
            may_act.clone(),
            Some(service.on_report()),
            done_tx.clone(),
        );
        Shell {
            health: store.as_ref().map(|_| SaveHealth::new(Instant::now())),
            decide: Decide::new(
                &service.plugins,
                service.executors.clone(),
                service.metrics.clone(),
            ),
            service: service.clone(),
            may_act,
            store,
            writing: None,
            closing: None,
            outputs,
            tasks,
            counters,
            flush,
            pipeline,
            done_tx,
            done,
            folded: Vec::new(),
        }
    }

    /// The term's next input; `None`: nothing for the term (look again).
    async fn next(
        &mut self,
        // `&mut`: held across the wait, it must be `Send` (a `Term` is not `Sync`).
        term: &mut Term,
        leadership: &mut watch::Receiver<Leadership>,
        shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> Option<Input> {
        use std::sync::atomic::Ordering::Relaxed;
        let reading = term.wants_outputs()
            && self.decide.in_flight() < CALLS_IN_FLIGHT
            && self.pipeline.stats().queued.load(Relaxed) < QUEUED_JOBS;
        let Shell {
            may_act,
            closing,
            writing,
            decide,
            done,
            outputs,
            ..
        } = self;
        let input = tokio::select! {
            biased;
            _ = &mut *shutdown, if closing.is_none() => {
                // Dispatch nothing more, let what runs finish, and get an
                // index after it from every loop: the final save then
                // covers everything handled (issue 32).
                *closing = Some(Instant::now() + DRAIN);
                self.flush.ask();
                Input::Closing
            }
            () = std::future::ready(()), if closing.is_some() && term.drained() => Input::Shutdown,
            () = tokio::time::sleep_until(closing.unwrap_or_else(Instant::now)), if closing.is_some() => {
                tracing::warn!("stepping down before every change in flight was handled; the next leader replays them");
                Input::Shutdown
            }
            r = leadership.changed() => {
                if r.is_ok() && may_act() {
                    return None;
                }
                tracing::warn!("not leading any more; stopping leader work");
                Input::NotActing
            }
            decided = decide.next() => {
                self.decide.settle(decided, &self.pipeline, &self.done_tx);
                return None;
            }
            (store, saved) = async { writing.as_mut().expect("checked").await }, if writing.is_some() => {
                self.store = Some(store);
                self.writing = None;
                self.saved(&saved);
                Input::Saved(saved)
            }
            Some(mut tickets) = done.recv() => {
                let last = tickets.pop().expect("a call has a ticket");
                self.folded = tickets;
                Input::Finished(last)
            }
            _ = tokio::time::sleep_until(term.wake_at()) => {
                self.update_metrics(term);
                if (self.may_act)() {
                    Input::Tick
                } else {
                    tracing::warn!("the fence closed; stopping leader work");
                    Input::NotActing
                }
            }
            // Back-pressure: outputs are read only while the plugin calls
            // in flight and the pipeline's jobs are under a budget, so a
            // burst (or a destination that keeps failing while contents
            // queue for it) waits in the watch loops' channels, not in
            // memory.
            o = outputs.next(), if reading => match o {
                Some((id, output)) => Input::Output(id, output),
                None => Input::WatchesGone,
            },
        };
        Some(input)
    }

    /// Carries out the term's effects; the end of the term, if one says so.
    fn apply(&mut self, mut effects: VecDeque<Effect>) -> Option<End> {
        let mut ended = None;
        while let Some(effect) = effects.pop_front() {
            match effect {
                Effect::Dispatch {
                    ticket,
                    event,
                    plugins,
                } => self.decide.dispatch(*event, ticket, &plugins),
                Effect::Save {
                    checkpoints,
                    indexes,
                } => {
                    let mut store = self
                        .store
                        .take()
                        .expect("a term without a store saves nothing (or one save at a time)");
                    let may_act = self.may_act.clone();
                    let metrics = self.service.metrics.clone();
                    self.writing = Some(Box::pin(async move {
                        let saved =
                            write(&mut store, &checkpoints, &indexes, &*may_act, &metrics).await;
                        (store, saved)
                    }));
                }
                Effect::Received(kind) => {
                    self.service.metrics.events_received.inc(&[kind.as_str()])
                }
                Effect::Handled(kind) => self.service.metrics.events_handled.inc(&[kind.as_str()]),
                Effect::End(why) => ended = Some(why),
            }
        }
        ended
    }

    /// Stops watching, deciding and executing first (dropping a plugin
    /// call ends its sandbox at once), then saves what is complete. True:
    /// the term ended at shutdown.
    async fn finish(mut self, mut term: Term, end: End) -> bool {
        if let End::Fenced(why) = &end {
            tracing::error!("{why}; stopping leader work");
        }
        let metrics = self.service.metrics.clone();
        drop(std::mem::take(&mut self.tasks));
        let Shell {
            decide,
            pipeline,
            writing,
            mut store,
            mut done,
            may_act,
            ..
        } = self;
        drop(decide);
        drop(pipeline);
        // The save being written ends first: one write at a time. One that
        // found the state fenced leaves nothing more to write.
        let mut fenced = false;
        if let Some(w) = writing {
            let (s, saved) = w.await;
            store = Some(s);
            fenced = matches!(saved, Saved::Fenced(_) | Saved::NotActing);
        }
        while let Ok(tickets) = done.try_recv() {
            for ticket in tickets {
                if let Some(kind) = term.finish_late(ticket) {
                    metrics.events_handled.inc(&[kind.as_str()]);
                }
            }
        }
        if let (
            Some(store),
            Some(Effect::Save {
                checkpoints,
                indexes,
            }),
        ) = (store.as_mut(), term.final_save())
            && !fenced
            && may_act()
        {
            match write(store, &checkpoints, &indexes, &*may_act, &metrics).await {
                Saved::Stored => {}
                Saved::Failed(e) | Saved::Fenced(e) => {
                    tracing::warn!("final checkpoint not saved: {e}")
                }
                Saved::NotActing => tracing::warn!("final checkpoint not saved: the fence closed"),
            }
        }
        metrics.checkpoint_save_age_seconds.set(0.0);
        metrics.checkpoint_save_failures.set(0);
        matches!(end, End::Shutdown)
    }

    /// Feeds a save's outcome to `health`: the metrics, and a Warning Event
    /// `CheckpointSaveFailed` on the state Lease after failures in a row
    /// (in the background).
    fn saved(&mut self, saved: &Saved) {
        let Some(health) = self.health.as_mut() else {
            return;
        };
        let outcome = match saved {
            Saved::Stored => Ok(()),
            Saved::Failed(e) => Err(e.as_str()),
            Saved::Fenced(_) | Saved::NotActing => return,
        };
        let now = Instant::now();
        let warning = health.saved(outcome, now);
        let metrics = &self.service.metrics;
        metrics
            .checkpoint_save_failures
            .set(i64::from(health.failed_in_a_row()));
        metrics
            .checkpoint_save_age_seconds
            .set(health.age(now).as_secs_f64());
        let Some(message) = warning else { return };
        let service = &self.service;
        tracing::error!(lease = %service.manifest.ha.state_lease_name, "{message}");
        service.warn_on_state_lease(
            self.store.as_ref().and_then(CheckpointStore::uid),
            "CheckpointSaveFailed",
            message,
        );
    }

    fn update_metrics(&mut self, term: &Term) {
        use std::sync::atomic::Ordering::Relaxed;
        let metrics = &self.service.metrics;
        metrics
            .queue_depth
            .set(self.pipeline.stats().queued.load(Relaxed) as i64);
        metrics.checkpoint_lag_versions.set(term.unsaved() as i64);
        for (kind, stats, restarts, resyncs) in self.counters.iter_mut() {
            let (r, s) = (stats.restarts.load(Relaxed), stats.resyncs.load(Relaxed));
            metrics.watch_restarts.add(&[kind.as_str()], r - *restarts);
            metrics.resyncs.add(&[kind.as_str()], s - *resyncs);
            (*restarts, *resyncs) = (r, s);
        }
        metrics
            .checkpoint_lag_seconds
            .set(term.oldest(Instant::now()).as_secs_f64());
        if let Some(h) = &self.health {
            metrics
                .checkpoint_save_age_seconds
                .set(h.age(Instant::now()).as_secs_f64());
        }
    }
}

/// Writes one save of the term; what it did, for [`Input::Saved`].
async fn write(
    store: &mut CheckpointStore,
    checkpoints: &Checkpoints,
    indexes: &[StreamIndex],
    may_act: &(dyn Fn() -> bool + Send + Sync),
    metrics: &Metrics,
) -> Saved {
    if !may_act() {
        return Saved::NotActing;
    }
    match store.save(checkpoints, indexes).await {
        Ok(()) => {
            metrics.checkpoint_writes.inc(&["ok"]);
            Saved::Stored
        }
        Err(CheckpointError::Api(e)) => {
            metrics.checkpoint_writes.inc(&["error"]);
            tracing::warn!("checkpoint not saved, retrying: {e}");
            Saved::Failed(e.to_string())
        }
        Err(e) => {
            metrics.checkpoint_writes.inc(&["fenced"]);
            Saved::Fenced(e.to_string())
        }
    }
}
