//! One term of leadership: the shell around [`Term`].
//!
//! ```text
//! lead: claim the state ─▶ watch loops (one per kind × namespace)
//!   kube::shell::Shell::run: one input at a time (a watch output, a call
//!       over, a save written, changes done, a tick, shutdown, the fence)
//!     Term::handle: input ─▶ effects
//!     Dispatch ─▶ Acting (Act): Decide (plugin calls) ─▶ pipeline ─▶ done
//!     Save ─▶ the checkpoint store (one save at a time)
//!   then: stop acting, the final save of what is complete
//! ```
//!
//! The rules live in [`Term`] (host/kube/src/term.rs) and
//! [`wasmwatch_core::turns`]; the loop around them in `wasmwatch_kube::shell`
//! (the simulator runs the same one); this file wires the binary's parts
//! into it.
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;
use wasmwatch_core::action::EventType;
use wasmwatch_core::index::Remember;
use wasmwatch_core::{ChangeEvent, ObjectKind};
use wasmwatch_exec::pipeline::{Execute, Outcome, Pipeline, PipelineConfig, Report};
use wasmwatch_kube::checkpoint::{CheckpointError, CheckpointStore, Claimed, SaveHealth, Ticket};
use wasmwatch_kube::elector::{Fence, Leadership};
use wasmwatch_kube::shell::{Act, MayAct, Outputs, Shell};
use wasmwatch_kube::term::{End, Saved, Start, Term};
use wasmwatch_kube::watchloop::{Flush, WatchLoop, WatchStats, WatchTarget};
use wasmwatch_runtime::Plugin;

use super::{AbortOnDrop, Reports, Service, describe, print_report};
use wasmwatch_exec::decide::{Decide, Stage};

/// How long a leader stepping down waits for the changes in flight and a
/// last index from every watch loop (it then releases the Lease: the
/// handover waits for this too).
const DRAIN: std::time::Duration = std::time::Duration::from_millis(500);

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
        let store_is_some = store.is_some();
        let shell = Shell {
            term,
            store,
            outputs,
            flush,
            may_act: may_act.clone(),
            act: Acting::new(self, may_act, tasks, counters, store_is_some),
            drain: DRAIN,
        };
        let (end, _) = shell.run(&mut leadership, shutdown.as_mut()).await;
        self.metrics.checkpoint_save_age_seconds.set(0.0);
        self.metrics.checkpoint_save_failures.set(0);
        matches!(end, End::Shutdown)
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
        let skipped = self.metrics.plugin_calls_skipped.clone();
        Box::new(move |event: &ChangeEvent| {
            if !in_scope.admits(&event.object.namespace) {
                tracing::debug!(namespace = %event.object.namespace, "not delivered: namespace out of scope");
                return Vec::new();
            }
            plugins
                .iter()
                .enumerate()
                .filter(|(_, p)| p.filter().matches(event))
                // The plugin's own declared rule, judged here: no call
                // (issue 35).
                .filter(|(_, p)| match p.skips(event) {
                    None => true,
                    Some(condition) => {
                        skipped.inc(&[p.name(), &condition.to_string()]);
                        false
                    }
                })
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
        for kind in &watch.object_kinds() {
            let custom = watch.custom(*kind).map(Arc::new);
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
                        _ => None,
                    },
                    remember: self.remember(*kind),
                    custom: custom.clone(),
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
                    if let Some(trusted) = claimed.trusted(*kind, &scope) {
                        wl = wl.trusting(trusted);
                    }
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
                streams.push(wasmwatch_kube::shell::tagged(id, loop_rx));
            }
        }
        (futures_util::stream::select_all(streams), tasks, counters)
    }

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

    /// Counts every action report in the metrics and prints it as asked.
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

/// What acts on a term's changes: the plugin calls (the decide stage),
/// the pipeline and its executors ([`Stage`]); the metrics and the save
/// health.
struct Acting {
    service: Arc<Service>,
    /// The watch loops (stopped first), then the stage (see [`Act::stop`]).
    running: Option<(Vec<AbortOnDrop>, Stage<Ticket>)>,
    counters: WatchCounters,
    /// How the saves go, for the metrics and a Warning Event.
    health: Option<SaveHealth>,
}

impl Acting {
    fn new(
        service: &Arc<Service>,
        may_act: MayAct,
        tasks: Vec<AbortOnDrop>,
        counters: WatchCounters,
        saves: bool,
    ) -> Self {
        let decide = Decide::new(
            service.plugins.iter().map(|l| l.decider()).collect(),
            service.executors.clone(),
            service.metrics.clone(),
        );
        let stage = Stage::new(decide, |done| {
            Pipeline::start_with_pauses(
                service.executors.clone() as Arc<dyn Execute>,
                PipelineConfig::from(&service.manifest.rate_limits),
                Some(service.pause_of.clone()),
                may_act,
                Some(service.on_report()),
                done,
            )
        });
        Acting {
            health: saves.then(|| SaveHealth::new(Instant::now())),
            running: Some((tasks, stage)),
            service: service.clone(),
            counters,
        }
    }

    fn stage(&mut self) -> &mut Stage<Ticket> {
        &mut self.running.as_mut().expect("acting until stopped").1
    }
}

impl Act for Acting {
    fn dispatch(&mut self, ticket: Ticket, event: Box<ChangeEvent>, plugins: Vec<usize>) {
        self.stage().dispatch(ticket, *event, &plugins);
    }

    /// A decision went to the pipeline (`None`), or changes are done.
    async fn next(&mut self) -> Option<Vec<Ticket>> {
        self.stage().next().await
    }

    fn accepting(&self) -> bool {
        self.running.as_ref().is_some_and(|(_, s)| s.accepting())
    }

    /// Stops watching, deciding and executing (dropping a plugin call
    /// ends its sandbox at once).
    fn stop(&mut self) -> Vec<Ticket> {
        let Some((watches, stage)) = self.running.take() else {
            return Vec::new();
        };
        drop(watches);
        stage.stop()
    }

    fn received(&mut self, kind: ObjectKind) {
        self.service.metrics.events_received.inc(&[kind.as_str()]);
    }

    fn handled(&mut self, kind: ObjectKind) {
        self.service.metrics.events_handled.inc(&[kind.as_str()]);
    }

    fn tick(&mut self, term: &Term) {
        use std::sync::atomic::Ordering::Relaxed;
        let metrics = &self.service.metrics;
        if let Some((_, stage)) = &self.running {
            metrics.queue_depth.set(stage.queued() as i64);
        }
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

    /// Counts the save, and feeds its outcome to `health`: the metrics,
    /// and a Warning Event `CheckpointSaveFailed` on the state Lease after
    /// failures in a row (in the background).
    fn saved(&mut self, saved: &Saved, state_uid: Option<String>, last: bool) {
        let metrics = &self.service.metrics;
        let outcome = match saved {
            Saved::Stored => Ok(()),
            Saved::Failed(e) => Err(e.as_str()),
            Saved::Fenced(_) => {
                metrics.checkpoint_writes.inc(&["fenced"]);
                return;
            }
            Saved::NotActing => return,
        };
        metrics
            .checkpoint_writes
            .inc(&[if outcome.is_ok() { "ok" } else { "error" }]);
        let Some(health) = self.health.as_mut().filter(|_| !last) else {
            return;
        };
        let now = Instant::now();
        let warning = health.saved(outcome, now);
        metrics
            .checkpoint_save_failures
            .set(i64::from(health.failed_in_a_row()));
        metrics
            .checkpoint_save_age_seconds
            .set(health.age(now).as_secs_f64());
        let Some(message) = warning else { return };
        let service = &self.service;
        tracing::error!(lease = %service.manifest.ha.state_lease_name, "{message}");
        service.warn_on_state_lease(state_uid, "CheckpointSaveFailed", message);
    }
}
