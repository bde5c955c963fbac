//! `wasmwatch run`: the service.
//!
//! ```text
//! start: manifest → plugins (compiled, checked) → caches (workloads, Services)
//!        → namespace scope (ignored, selected by a watch of Namespaces)
//!        → admin port (/healthz, /readyz, /leader)
//! HA on:  elector ──leading──▶ lead(term) ──not leading / fenced──▶ wait again
//! HA off: lead() at once, no checkpoints (each start takes a baseline)
//!
//! lead(term):
//!   claim the state Lease (checkpoints + object indexes of the last term)
//!   one WatchLoop per kind × namespace, resuming from its checkpoint
//!   Change ─▶ (its namespace in scope: NamespaceWatch) ─▶ plugins whose
//!          filter selects it ─▶ pipeline (debounce, retry)
//!          ─▶ executors (fenced) ─▶ done ─▶ Progress ─▶ batched save
//! ```
//!
//! A change's ticket completes when every plugin's actions for it finished
//! or dead-lettered (a plugin that fails, after its retries, dead-letters
//! too); only then can the checkpoint pass it. On SIGTERM the leader stops
//! its watches, saves what is complete, and only then releases the lease.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use anyhow::Context;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;
use wasmwatch_core::action::EventType;
use wasmwatch_core::digest::DigestKey;
use wasmwatch_core::{Action, ChangeEvent, Folded, Lookups, Manifest, ObjectKind};
use wasmwatch_exec::executors::{Executors, describe_action};
use wasmwatch_exec::pipeline::{
    Execute, Outcome, PauseOf, Pipeline, PipelineConfig, Policy, Report, Submission,
};
use wasmwatch_exec::{ExecError, Origin};
use wasmwatch_kube::checkpoint::{
    CheckpointError, CheckpointStore, Checkpoints, StreamIndex, Ticket,
};
use wasmwatch_kube::elector::{Elector, ElectorConfig, Fence, Leadership};
use wasmwatch_kube::lookups::KubeLookups;
use wasmwatch_kube::namespaces::NamespaceWatch;
use wasmwatch_kube::term::{Effect, End, Input, Saved, Start, Term};
use wasmwatch_kube::watchloop::{WatchLoop, WatchTarget};
use wasmwatch_runtime::{Plugin, Runtime, RuntimeConfig};

use crate::metrics::Metrics;

/// How `wasmwatch run` was asked to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub manifest: PathBuf,
    pub cache_dir: Option<PathBuf>,
    /// How to reach registries for `oci://` modules.
    pub registry: wasmwatch_oci::RegistryOptions,
    pub admin_addr: std::net::SocketAddr,
    /// This replica's identity (POD_NAME, else the host name).
    pub identity: String,
    /// Namespace of the Leases when the manifest does not say (POD_NAMESPACE).
    pub namespace: String,
    /// How to print every executed, retried or dead-lettered action on stdout.
    pub reports: Reports,
    /// Print one JSON line when ready (admin address, identity).
    pub announce: bool,
    /// The cluster to talk to; `None`: KUBECONFIG or the in-cluster config.
    pub kube_config: Option<kube::Config>,
    /// How often the leader writes its checkpoints (when they moved).
    pub checkpoint_interval: Duration,
    /// Elect a leader even when the manifest's `ha.enabled` is false (the
    /// local run's two replicas must never both act).
    pub force_ha: bool,
}

/// How action reports are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reports {
    Quiet,
    /// One JSON object per line.
    Json,
    /// One sentence per line, prefixed with the replica's identity.
    Human,
}

/// A loaded plugin and its delivery policy.
struct Loaded {
    plugin: Arc<Plugin>,
    policy: Policy,
}

/// What every term of leadership shares.
struct Service {
    client: kube::Client,
    manifest: Manifest,
    plugins: Vec<Loaded>,
    executors: Arc<Executors>,
    options: RunOptions,
    lease_namespace: String,
    metrics: Arc<Metrics>,
    /// Keys Secret digests (see `wasmwatch_core::digest`); `None` when no
    /// Secrets are watched.
    digest_key: Option<DigestKey>,
    /// Workloads' pause periods, from the lookups' cache.
    pause_of: PauseOf,
    /// Which namespaces' objects are delivered (`watch.ignoreNamespaces`,
    /// `watch.namespaceSelector`).
    namespaces: Arc<NamespaceWatch>,
}

/// Runs the service until `shutdown`.
pub async fn run(
    options: RunOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut manifest = Manifest::from_file(&options.manifest)?;
    crate::oci::resolve_modules(
        &mut manifest,
        options.cache_dir.as_deref(),
        &options.registry,
        None,
    )
    .await?;
    let client = match options.kube_config.clone() {
        Some(config) => kube::Client::try_from(config)?,
        None => kube::Client::try_default()
            .await
            .context("cannot configure the Kubernetes client")?,
    };
    let lookups = KubeLookups::start_with(
        client.clone(),
        watched_namespaces(&manifest),
        manifest.watch.field_selector(),
    );
    let in_scope = NamespaceWatch::start(
        client.clone(),
        wasmwatch_core::scope::NamespaceScope::of(&manifest.watch),
    );
    let runtime = Runtime::new(
        runtime_config(options.cache_dir.clone(), manifest.plugins.len()),
        lookups.clone() as Arc<dyn Lookups>,
    )
    .map_err(|e| anyhow::anyhow!("cannot start the plugin runtime: {e:#}"))?;
    let mut plugins: Vec<Loaded> = Vec::new();
    for entry in &manifest.plugins {
        plugins.push(Loaded {
            plugin: Arc::new(runtime.load(entry, &manifest.base_dir).await?),
            policy: Policy::from(&entry.delivery),
        });
    }
    let buses = wasmwatch_bus::Buses::new(&manifest.buses)?;
    let metrics = Arc::new(Metrics::new(&manifest.metrics));
    let kube = Arc::new(wasmwatch_exec::workload::KubeExecutor::new(
        client.clone(),
        "wasmwatch",
        &options.identity,
    ));
    let events = {
        let metrics = metrics.clone();
        wasmwatch_exec::recorder::EventRecorder::start(
            kube.clone(),
            wasmwatch_exec::recorder::DEFAULT_CAPACITY,
            wasmwatch_exec::recorder::DEFAULT_CONCURRENCY,
            move || {
                metrics.k8s_events_dropped.inc();
            },
        )
    };
    let executors = Arc::new(Executors {
        http: wasmwatch_exec::http::HttpExecutor::new(
            lookups.clone() as Arc<dyn Lookups>,
            Duration::from_secs(10),
        ),
        buses,
        kube,
        events,
        on_reload: Some({
            let metrics = metrics.clone();
            Box::new(move |workload, success| metrics.reloaded(&workload.namespace, success))
        }),
        restart_strategies: manifest
            .plugins
            .iter()
            .map(|p| (p.name.clone(), p.delivery.restart_strategy))
            .collect(),
    });

    let mut ha = manifest.ha.clone();
    ha.enabled |= options.force_ha;
    let lease_namespace = ha
        .namespace
        .clone()
        .unwrap_or_else(|| options.namespace.clone());
    let (ready_tx, ready) = watch::channel(false);
    let (leadership_tx, leadership) = watch::channel(Leadership::default());
    let mut elector_parts = None;
    let leadership = if ha.enabled {
        let config = ElectorConfig {
            namespace: lease_namespace.clone(),
            lease_name: ha.lease_name.clone(),
            identity: options.identity.clone(),
            lease_duration: ha.lease_duration.0,
            renew_deadline: ha.renew_deadline.0,
            retry_period: ha.retry_period.0,
        };
        let (elector, rx) =
            Elector::new(client.clone(), config).map_err(|e| anyhow::anyhow!("ha: {e}"))?;
        elector_parts = Some(elector);
        rx
    } else {
        leadership_tx.send_replace(Leadership {
            leading: true,
            term: None,
            holder: Some(options.identity.clone()),
        });
        leadership
    };

    let listener = crate::admin::bind(options.admin_addr)
        .await
        .with_context(|| format!("cannot listen on {}", options.admin_addr))?;
    let admin_addr = listener.local_addr()?;
    let admin = tokio::spawn(crate::admin::serve(
        listener,
        crate::admin::AdminState {
            leadership: leadership.clone(),
            fence: elector_parts.as_ref().map(Elector::fence),
            ready,
            metrics: Some(metrics.clone()),
        },
    ));
    // Set now, not only when the task first runs: a scrape right after the
    // ready line read 0 with HA off when the task had not run yet.
    metrics.leader.set(i64::from(leadership.borrow().leading));
    tokio::spawn(track_leadership(leadership.clone(), metrics.clone()));
    tracing::info!(identity = %options.identity, "admin port listening on http://{admin_addr}");
    tokio::pin!(shutdown);
    let digest_key = tokio::select! {
        key = digest_key(&client, &manifest, &lease_namespace) => key?,
        _ = &mut shutdown => return Ok(()),
    };
    // The caches filled, and the namespaces in scope known: changes are
    // routed by namespace from the first one on. (Without RBAC on
    // namespaces the second never comes: not ready, and a SIGTERM ends it.)
    tokio::select! {
        _ = async { tokio::join!(lookups.ready(), in_scope.ready()) } => {}
        _ = &mut shutdown => return Ok(()),
    }
    ready_tx.send_replace(true);
    if options.announce {
        println!(
            "{}",
            serde_json::json!({
                "ready": true,
                "identity": options.identity,
                "admin": format!("http://{admin_addr}"),
                "plugins": plugins.len(),
                "ha": ha.enabled,
            })
        );
    }

    let service = Arc::new(Service {
        client,
        manifest,
        plugins,
        executors,
        options,
        lease_namespace,
        metrics,
        digest_key,
        pause_of: pause_of(lookups.clone()),
        namespaces: in_scope,
    });
    match elector_parts {
        None => {
            service.lead(None, leadership, &mut shutdown).await;
        }
        Some(elector) => {
            let fence = elector.fence();
            let (stop_elector, stopped) = tokio::sync::oneshot::channel::<()>();
            let elector_task = tokio::spawn(elector.run(async {
                let _ = stopped.await;
            }));
            let mut leadership = leadership;
            loop {
                let term = tokio::select! {
                    t = wait_leading(&mut leadership) => t,
                    _ = &mut shutdown => break,
                };
                let Some(term) = term else { break };
                tracing::info!(term = %term, "leading");
                let stop = service
                    .lead(Some(fence.clone()), leadership.clone(), &mut shutdown)
                    .await;
                if stop {
                    break;
                }
                // A term that ended at once (a claim refused as fenced or
                // corrupt) must not spin: wait a little before the next.
                tokio::select! {
                    _ = tokio::time::sleep(ha.retry_period.0) => {}
                    _ = &mut shutdown => break,
                }
            }
            // Leader work has stopped and its checkpoint is saved: now release.
            let _ = stop_elector.send(());
            let _ = elector_task.await;
        }
    }
    // The last Events about actions done, bounded so that SIGTERM still
    // ends within about a second.
    if !service
        .executors
        .events
        .flush(Duration::from_millis(500))
        .await
    {
        tracing::warn!("shutting down with Events not yet written");
    }
    admin.abort();
    Ok(())
}

/// The key of Secret digests, read (or created) before this replica is
/// ready: every replica must hash Secrets alike before it may lead. A
/// missing right or a Secret without a usable key ends the run with the
/// fix in the message; an API server that cannot be reached is retried.
///
/// `WASMWATCH_UNKEYED_DIGESTS=1` hashes Secrets as versions before keys
/// did (plain SHA-256). It exists for the upgrade tests, which need state
/// written that way; it is not a setting.
async fn digest_key(
    client: &kube::Client,
    manifest: &Manifest,
    namespace: &str,
) -> anyhow::Result<Option<DigestKey>> {
    if !manifest.watch.kinds.contains(&ObjectKind::Secret)
        || std::env::var_os("WASMWATCH_UNKEYED_DIGESTS").is_some_and(|v| v == "1")
    {
        return Ok(None);
    }
    let name = &manifest.watch.digest_key_secret;
    let mut backoff = Duration::from_millis(200);
    loop {
        match wasmwatch_kube::digest_key::load(client.clone(), namespace, name, true).await {
            Ok(key) => return Ok(key),
            Err(wasmwatch_kube::digest_key::KeyError::Permanent(e)) => anyhow::bail!("{e}"),
            Err(wasmwatch_kube::digest_key::KeyError::Retryable(e)) => {
                tracing::warn!("{e}; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// The longest pause period honoured (a longer one holds the checkpoint
/// back as long: a held restart's change is not done).
const MAX_PAUSE: Duration = Duration::from_secs(3600);

/// A restart's pause period: its workload's `pause-period` annotation, from
/// the lookups' cache (no API call). A bad value is logged and ignored.
fn pause_of(lookups: Arc<KubeLookups>) -> PauseOf {
    Arc::new(move |action: &Action| {
        let Action::Restart { workload, .. } = action else {
            return None;
        };
        match lookups.workload(workload)?.pause_period()? {
            Ok(d) if d > MAX_PAUSE => {
                tracing::warn!(
                    "{:?} {}/{}: pause period {d:?} is longer than {MAX_PAUSE:?}: using {MAX_PAUSE:?}",
                    workload.kind,
                    workload.namespace,
                    workload.name
                );
                Some(MAX_PAUSE)
            }
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!("{e}: no pause");
                None
            }
        }
    })
}

/// The runtime's settings for `plugins` plugins (`run` and `--dry-run`).
pub(crate) fn runtime_config(cache_dir: Option<PathBuf>, plugins: usize) -> RuntimeConfig {
    let defaults = RuntimeConfig::default();
    RuntimeConfig {
        cache_dir,
        // Every plugin has its share of sandboxes, whatever the others do.
        max_concurrency: defaults
            .max_concurrency
            .max(defaults.plugin_concurrency * plugins as u32),
        ..defaults
    }
}

/// The namespaces the lookups' caches cover (`None`: all).
pub(crate) fn watched_namespaces(manifest: &Manifest) -> Option<Vec<String>> {
    manifest
        .watch
        .scopes()
        .iter()
        .map(|s| s.namespace().map(str::to_string))
        .collect()
}

/// Keeps the leader gauge and transition counter up to date.
async fn track_leadership(mut leadership: watch::Receiver<Leadership>, metrics: Arc<Metrics>) {
    let mut was = false;
    loop {
        let now = leadership.borrow_and_update().leading;
        metrics.leader.set(i64::from(now));
        if now != was {
            metrics
                .leader_transitions
                .inc(&[if now { "leading" } else { "following" }]);
            was = now;
        }
        if leadership.changed().await.is_err() {
            return;
        }
    }
}

/// Waits until this replica leads; `None` when the elector is gone.
async fn wait_leading(
    leadership: &mut watch::Receiver<Leadership>,
) -> Option<wasmwatch_kube::elector::Term> {
    loop {
        {
            let l = leadership.borrow_and_update();
            if l.leading
                && let Some(t) = &l.term
            {
                return Some(t.clone());
            }
        }
        leadership.changed().await.ok()?;
    }
}

impl Service {
    /// Logs what of the state Lease could not be read and puts a Warning
    /// Event on it (in the background: leading does not wait for it).
    fn report_unreadable_state(
        &self,
        store: &CheckpointStore,
        claimed: &wasmwatch_kube::checkpoint::Claimed,
    ) {
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

    /// Leads until this replica may not act any more (returns false) or
    /// shutdown (true). The rules live in [`Term`] (host/kube/src/term.rs);
    /// this is its shell: it claims the state, runs the watch loops, the
    /// plugin calls and the pipeline, feeds the term what happens and
    /// carries out what it decides.
    async fn lead(
        self: &Arc<Self>,
        fence: Option<Fence>,
        mut leadership: watch::Receiver<Leadership>,
        shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> bool {
        // One value for "may this replica act": the stretch of acting this
        // term began in (HA off: always).
        let acting = match &fence {
            Some(f) => match f.acting() {
                Some(a) => Some(a),
                None => return false,
            },
            None => None,
        };
        let may_act: Arc<dyn Fn() -> bool + Send + Sync> = {
            let fence = fence.clone();
            let acting = acting.clone();
            Arc::new(move || match (&fence, &acting) {
                (Some(f), Some(a)) => f.still(a),
                _ => true,
            })
        };
        // Claim the state (HA only), retrying while we may act.
        let mut store = None;
        let mut claimed = None;
        if let Some(acting) = &acting {
            let mut s = CheckpointStore::new(
                self.client.clone(),
                &self.lease_namespace,
                &self.manifest.ha.state_lease_name,
                &self.manifest.ha.lease_name,
                acting.term.clone(),
            );
            let mut failures = 0;
            loop {
                match s.claim().await {
                    Ok(c) => {
                        claimed = Some(c);
                        break;
                    }
                    Err(CheckpointError::Api(e)) if may_act() => {
                        failures += 1;
                        let delay = wasmwatch_kube::watchloop::backoff(failures);
                        tracing::warn!("cannot claim the state Lease, retrying in {delay:?}: {e}");
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = &mut *shutdown => return true,
                        }
                    }
                    Err(e) => {
                        tracing::error!("cannot claim the state Lease: {e}; not leading this term");
                        return false;
                    }
                }
            }
            if let Some(c) = &claimed {
                self.report_unreadable_state(&s, c);
            }
            store = Some(s);
        }
        let mut claimed = claimed.unwrap_or_default();
        // Moved out: each loop gets its part, then it is dropped.
        let indexes = std::mem::take(&mut claimed.indexes);
        let checkpoints = std::mem::take(&mut claimed.checkpoints);
        let unreadable = std::mem::take(&mut claimed.unreadable);
        let covers = |kind: ObjectKind, scope: &wasmwatch_core::Scope| claimed.covers(kind, scope);
        let route = {
            let plugins: Vec<Arc<Plugin>> = self.plugins.iter().map(|l| l.plugin.clone()).collect();
            let in_scope = self.namespaces.clone();
            Box::new(move |event: &ChangeEvent| {
                // Ignored, or not selected now: handled, by no plugin. The
                // watch loops still index the object, so its next change
                // once its namespace is in scope is told against this one.
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
        };
        let mut term = Term::new(
            checkpoints.clone(),
            unreadable.keys().copied(),
            store.is_some(),
            self.options.checkpoint_interval,
            Instant::now(),
            route,
        );

        // One watch loop per stream, tagged with its stream id. The term
        // reads every loop's channel itself: a forwarding task per loop
        // cost one more task wake-up per change (issue 24).
        let mut streams = Vec::new();
        let mut tasks = Vec::new();
        // Asks every loop for its index when stepping down.
        let flush = wasmwatch_kube::watchloop::Flush::default();
        // Per loop: kind, counters, and the values already counted.
        let mut watch_stats = Vec::new();
        for kind in &self.manifest.watch.kinds {
            for scope in self.manifest.watch.scopes() {
                let target = WatchTarget {
                    kind: *kind,
                    scope: scope.clone(),
                    label_selector: self
                        .manifest
                        .watch
                        .label_selector
                        .as_ref()
                        .map(|s| s.as_str().to_string()),
                    field_selector: self.manifest.watch.field_selector(),
                    metadata_changes: self.manifest.watch.metadata_changes,
                    digest_key: match kind {
                        ObjectKind::Secret => self.digest_key.clone(),
                        ObjectKind::ConfigMap => None,
                    },
                };
                let from = checkpoints.get(*kind, &scope).map(str::to_string);
                let (start, mut wl) = if unreadable.contains_key(kind) {
                    (
                        Start::DeliverAll,
                        WatchLoop::deliver_all(self.client.clone(), target),
                    )
                } else if from.is_some() {
                    (
                        Start::Resume,
                        WatchLoop::new(self.client.clone(), target, from),
                    )
                } else {
                    (
                        Start::Baseline,
                        WatchLoop::new(self.client.clone(), target, None),
                    )
                };
                // A stream the stored index has no part for rebuilds one
                // from a list before watching (not `with_index`).
                if let Some(index) = indexes.get(kind)
                    && covers(*kind, &scope)
                {
                    wl = wl.with_index(index.part(&scope));
                }
                let span = tracing::info_span!("watch", kind = kind.as_str(), namespace = %scope);
                let id = term.stream(*kind, scope, start);
                // The checkpoint waits for an index taken after each change:
                // send it as often as checkpoints are saved.
                wl.index_interval = self.options.checkpoint_interval;
                let wl = wl.with_flush(&flush);
                watch_stats.push((*kind, wl.stats(), 0u64, 0u64));
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
        // Ends (`None`) when every loop has ended.
        let mut outputs = futures_util::stream::select_all(streams);
        // Each loop has its part of the claimed index now.
        drop(indexes);

        let (done_tx, mut done) = mpsc::unbounded_channel::<Tickets>();
        let on_report = {
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
                    // (`may_act` stays false for this stretch), and the
                    // next one replays what was given up.
                    Outcome::Abandoned => metrics.actions.inc(&[kind, "abandoned"]),
                }
                match print {
                    Reports::Quiet => {}
                    Reports::Json => print_report(r),
                    Reports::Human => println!("[{identity}] {}", describe(r)),
                }
            }) as Arc<dyn Fn(&Report) + Send + Sync>
        };
        let pipeline = Pipeline::start_with_pauses(
            self.executors.clone() as Arc<dyn Execute>,
            PipelineConfig::from(&self.manifest.rate_limits),
            Some(self.pause_of.clone()),
            may_act.clone(),
            Some(on_report),
            done_tx.clone(),
        );
        let metrics = self.metrics.clone();
        // The plugin calls of this term, and per plugin and object the
        // latest call's turn (see `dispatch`).
        let mut calls = tokio::task::JoinSet::new();
        let mut order: HashMap<OrderKey, Turn> = HashMap::new();
        // Effects of inputs fed on the way to the next one (the other
        // tickets of a folded call).
        let mut pending_effects: Vec<Effect> = Vec::new();
        // The save being written (it holds the store until it is over):
        // polled beside the other inputs, so that changes go on meanwhile
        // (the term asks for one save at a time; issue 24).
        let mut writing: Option<Writing> = None;
        // How the saves go, for the metrics and a Warning Event.
        let mut health = store
            .as_ref()
            .map(|_| wasmwatch_kube::checkpoint::SaveHealth::new(Instant::now()));
        // Stepping down (SIGTERM): until when the term may drain.
        let mut closing: Option<Instant> = None;
        let end = loop {
            let input = tokio::select! {
                biased;
                _ = &mut *shutdown, if closing.is_none() => {
                    // Dispatch nothing more, let what runs finish, and get
                    // an index after it from every loop: the final save
                    // then covers everything handled (issue 32).
                    closing = Some(Instant::now() + DRAIN);
                    flush.ask();
                    Input::Closing
                }
                () = std::future::ready(()), if closing.is_some() && term.drained() => Input::Shutdown,
                () = tokio::time::sleep_until(closing.unwrap_or_else(Instant::now)), if closing.is_some() => {
                    tracing::warn!("stepping down before every change in flight was handled; the next leader replays them");
                    Input::Shutdown
                }
                r = leadership.changed() => {
                    if r.is_ok() && may_act() {
                        continue;
                    }
                    tracing::warn!("not leading any more; stopping leader work");
                    Input::NotActing
                }
                Some(joined) = calls.join_next(), if !calls.is_empty() => {
                    if let Err(e) = joined
                        && e.is_panic()
                    {
                        std::panic::resume_unwind(e.into_panic());
                    }
                    continue;
                }
                (s, saved) = async { writing.as_mut().expect("checked").await }, if writing.is_some() => {
                    store = Some(s);
                    writing = None;
                    self.saved(health.as_mut(), &saved, store.as_ref());
                    Input::Saved(saved)
                }
                Some(tickets) = done.recv() => {
                    // A call that stood for several changes (folded while
                    // waiting for its turn) finishes each of them.
                    let (last, folded) = tickets.split_last().expect("a call has a ticket");
                    let mut effects = Vec::new();
                    for t in folded {
                        effects.extend(term.handle(Input::Finished(*t), Instant::now()));
                    }
                    pending_effects = effects;
                    Input::Finished(*last)
                }
                _ = tokio::time::sleep_until(term.wake_at()) => {
                    // Forget the turns of calls that are over.
                    order.retain(|_, turn| matches!(turn.done.try_recv(), Err(oneshot::error::TryRecvError::Empty)));
                    self.update_metrics(&term, &pipeline, &mut watch_stats);
                    if let Some(h) = &health {
                        self.metrics
                            .checkpoint_save_age_seconds
                            .set(h.age(Instant::now()).as_secs_f64());
                    }
                    if may_act() {
                        Input::Tick
                    } else {
                        tracing::warn!("the fence closed; stopping leader work");
                        Input::NotActing
                    }
                }
                // Back-pressure: outputs are read only while the plugin
                // calls in flight and the pipeline's jobs are under a
                // budget, so a burst (or a destination that keeps failing
                // while contents queue for it) waits in the watch loops'
                // channels, not in memory.
                o = outputs.next(), if term.wants_outputs()
                    && calls.len() < CALLS_IN_FLIGHT
                    && pipeline.stats().queued.load(std::sync::atomic::Ordering::Relaxed) < QUEUED_JOBS => match o {
                    Some((id, output)) => Input::Output(id, output),
                    None => Input::WatchesGone,
                },
            };
            let mut effects: std::collections::VecDeque<Effect> =
                std::mem::take(&mut pending_effects).into();
            effects.extend(term.handle(input, Instant::now()));
            let mut ended = None;
            while let Some(effect) = effects.pop_front() {
                match effect {
                    Effect::Dispatch {
                        ticket,
                        event,
                        plugins,
                    } => {
                        let span = tracing::info_span!(
                            "delivery",
                            object = %format!("{}/{}/{}", event.object.kind.as_str(), event.object.namespace, event.object.name),
                            change = ?event.change,
                            resource_version = %event.object.resource_version,
                            replay = event.replay,
                        );
                        span.in_scope(|| {
                            self.dispatch(
                                *event, ticket, &plugins, &pipeline, &done_tx, &mut calls,
                                &mut order,
                            )
                        });
                    }
                    Effect::Save {
                        checkpoints,
                        indexes,
                    } => {
                        let mut s = store
                            .take()
                            .expect("a term without a store saves nothing (or one save at a time)");
                        let (may_act, metrics) = (may_act.clone(), metrics.clone());
                        writing = Some(Box::pin(async move {
                            let saved =
                                write(&mut s, &checkpoints, &indexes, &*may_act, &metrics).await;
                            (s, saved)
                        }));
                    }
                    Effect::Received(kind) => metrics.events_received.inc(&[kind.as_str()]),
                    Effect::Handled(kind) => metrics.events_handled.inc(&[kind.as_str()]),
                    Effect::End(why) => ended = Some(why),
                }
            }
            if let Some(why) = ended {
                break why;
            }
        };
        if let End::Fenced(why) = &end {
            tracing::error!("{why}; stopping leader work");
        }
        // Stop watching, deciding and executing first, then save what is
        // complete. Dropping a plugin call ends its sandbox at once.
        drop(tasks);
        calls.abort_all();
        drop(calls);
        drop(pipeline);
        // The save being written ends first: one write at a time. One that
        // found the state fenced leaves nothing more to write.
        let mut fenced = false;
        if let Some(w) = writing.take() {
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
        self.metrics.checkpoint_save_age_seconds.set(0.0);
        self.metrics.checkpoint_save_failures.set(0);
        matches!(end, End::Shutdown)
    }

    /// Feeds a save's outcome to the term's `health`: the metrics, and a
    /// Warning Event `CheckpointSaveFailed` on the state Lease after
    /// failures in a row (in the background).
    fn saved(
        &self,
        health: Option<&mut wasmwatch_kube::checkpoint::SaveHealth>,
        saved: &Saved,
        store: Option<&CheckpointStore>,
    ) {
        let Some(health) = health else { return };
        let outcome = match saved {
            Saved::Stored => Ok(()),
            Saved::Failed(e) => Err(e.as_str()),
            Saved::Fenced(_) | Saved::NotActing => return,
        };
        let now = Instant::now();
        let warning = health.saved(outcome, now);
        self.metrics
            .checkpoint_save_failures
            .set(i64::from(health.failed_in_a_row()));
        self.metrics
            .checkpoint_save_age_seconds
            .set(health.age(now).as_secs_f64());
        let Some(message) = warning else { return };
        tracing::error!(lease = %self.manifest.ha.state_lease_name, "{message}");
        self.warn_on_state_lease(
            store.and_then(CheckpointStore::uid),
            "CheckpointSaveFailed",
            message,
        );
    }

    fn update_metrics(
        &self,
        term: &Term,
        pipeline: &Pipeline<Tickets>,
        watch_stats: &mut [(
            ObjectKind,
            Arc<wasmwatch_kube::watchloop::WatchStats>,
            u64,
            u64,
        )],
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        let metrics = &self.metrics;
        metrics
            .queue_depth
            .set(pipeline.stats().queued.load(Relaxed) as i64);
        metrics.checkpoint_lag_versions.set(term.unsaved() as i64);
        for (kind, stats, restarts, resyncs) in watch_stats.iter_mut() {
            let (r, s) = (stats.restarts.load(Relaxed), stats.resyncs.load(Relaxed));
            metrics.watch_restarts.add(&[kind.as_str()], r - *restarts);
            metrics.resyncs.add(&[kind.as_str()], s - *resyncs);
            (*restarts, *resyncs) = (r, s);
        }
        metrics
            .checkpoint_lag_seconds
            .set(term.oldest(Instant::now()).as_secs_f64());
    }

    /// Hands the change to the plugins the term chose (`plugins`, indexes
    /// into `self.plugins`); each completes on the `done` channel.
    ///
    /// Each plugin decides in a task of its own (in `calls`, which the term
    /// drops when it ends), so a slow or blocked plugin delays neither the
    /// other plugins nor this loop (nor shutdown). Per plugin and object,
    /// `order` chains the calls: a change is decided, and its actions
    /// submitted, only after the plugin's decision on the previous change
    /// of the same object. A change arriving while the plugin's last call
    /// on the object still waits for its turn folds into that call
    /// ([`ChangeEvent::folded`]): one decision on the newer content stands
    /// for both, and finishes both tickets. So a backlog costs one call per
    /// object, not one per change, as a controller's work queue holds a key
    /// once however often it is added (issue 24).
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        self: &Arc<Self>,
        event: ChangeEvent,
        ticket: Ticket,
        plugins: &[usize],
        pipeline: &Pipeline<Tickets>,
        done: &mpsc::UnboundedSender<Tickets>,
        calls: &mut tokio::task::JoinSet<()>,
        order: &mut HashMap<OrderKey, Turn>,
    ) {
        let event = Arc::new(event);
        for &index in plugins {
            let loaded = &self.plugins[index];
            let key = (
                index,
                event.object.kind,
                event.object.namespace.clone(),
                event.object.name.clone(),
            );
            if let Some(last) = order.get(&key)
                && fold(&last.waiting, &event, ticket)
            {
                self.metrics.changes_folded.inc(&[loaded.plugin.name()]);
                continue;
            }
            let (turn_done, done_rx) = oneshot::channel::<()>();
            let waiting = Arc::new(Mutex::new(Some(Waiting {
                event: event.clone(),
                tickets: vec![ticket],
            })));
            let previous = order
                .insert(
                    key,
                    Turn {
                        done: done_rx,
                        waiting: waiting.clone(),
                    },
                )
                .map(|t| t.done);
            let call = PluginCall {
                plugin: loaded.plugin.clone(),
                policy: loaded.policy,
                waiting,
                submit: pipeline.submitter(),
                done: done.clone(),
                executors: self.executors.clone(),
                metrics: self.metrics.clone(),
            };
            calls.spawn(
                call.run(previous, turn_done)
                    .instrument(tracing::Span::current()),
            );
        }
    }
}

/// Folds `event` (with its `ticket`) into the call `waiting` stands for,
/// if that call has not started deciding and the two fold; false: it needs
/// a call of its own.
fn fold(waiting: &Mutex<Option<Waiting>>, event: &Arc<ChangeEvent>, ticket: Ticket) -> bool {
    let mut waiting = waiting.lock().unwrap_or_else(|e| e.into_inner());
    let Some(w) = waiting.as_mut() else {
        return false;
    };
    w.event = match ChangeEvent::folded(&w.event, event) {
        Folded::Apart => return false,
        Folded::AsNewer => event.clone(),
        Folded::Changed(e) => Arc::new(*e),
    };
    w.tickets.push(ticket);
    true
}

/// The changes a call stands for, in order: its own first, then those
/// folded into it while it waited.
type Tickets = Vec<Ticket>;

/// The latest call of a plugin on an object.
struct Turn {
    /// Sent (or dropped) when the call is over.
    done: oneshot::Receiver<()>,
    /// What it will decide; taken (`None`) when it starts deciding.
    waiting: Arc<Mutex<Option<Waiting>>>,
}

/// A call's change while it waits for its turn.
struct Waiting {
    event: Arc<ChangeEvent>,
    tickets: Tickets,
}

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

/// Which calls must keep their order: plugin (its index), kind, namespace, name.
type OrderKey = (usize, ObjectKind, String, String);

/// One plugin's decision on one change, and what follows from it.
struct PluginCall {
    plugin: Arc<Plugin>,
    policy: Policy,
    waiting: Arc<Mutex<Option<Waiting>>>,
    submit: wasmwatch_exec::pipeline::Submitter<Tickets>,
    done: mpsc::UnboundedSender<Tickets>,
    executors: Arc<Executors>,
    metrics: Arc<Metrics>,
}

impl PluginCall {
    /// Waits for the plugin's previous call on the same object (`previous`),
    /// takes the change (with whatever folded into it meanwhile), decides,
    /// submits the allowed actions, then lets the next call on the object
    /// go (`turn_done`). A failed call is retried per the plugin's delivery
    /// policy, then dead-lettered, holding its turn: a newer change's
    /// decision must not be submitted before an older one's (its actions
    /// would run first and the older content land last), and it cannot be
    /// skipped either (a plugin may act only on the keys a change touched;
    /// a change folded in carries its keys along).
    async fn run(self, previous: Option<oneshot::Receiver<()>>, turn_done: oneshot::Sender<()>) {
        // Released when this call is over, whichever way it ends.
        let _turn = turn_done;
        if let Some(previous) = previous {
            // Sent or dropped: either way the previous call is over.
            let _ = previous.await;
        }
        let Some(Waiting { event, tickets }) = self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let origin = Origin {
            kind: event.object.kind,
            namespace: event.object.namespace.clone(),
            name: event.object.name.clone(),
            uid: event.object.uid.clone(),
            resource_version: event.object.resource_version.clone(),
            plugin: self.plugin.name().to_string(),
            unkeyed_digest: event
                .unkeyed_digest
                .as_ref()
                .map(|plain| (event.digest.clone(), plain.clone())),
        };
        let name = self.plugin.name();
        let object = format!("{}/{}", origin.namespace, origin.name);
        let result = self.decide(&event).await;
        let error = match result {
            Ok(decision) => {
                self.submit_decision(decision, tickets, origin);
                return;
            }
            Err(e) => e,
        };
        tracing::warn!(plugin = name, object = %object, "plugin failed: {error}");
        for attempt in 1..=self.policy.retries {
            // The term is over (its loop dropped `done`): stop.
            if self.done.is_closed() {
                return;
            }
            tokio::time::sleep(wasmwatch_exec::pipeline::retry_delay(&self.policy, attempt)).await;
            match self.decide(&event).await {
                Ok(decision) => {
                    self.submit_decision(decision, tickets, origin);
                    return;
                }
                Err(e) => tracing::warn!(plugin = name, attempt, "plugin failed again: {e}"),
            }
        }
        let error = ExecError::Permanent(format!("plugin {name} failed: {error}"));
        tracing::error!(plugin = name, object = %object, "dead-lettered: {error}");
        let action = Action::Event {
            event_type: EventType::Warning,
            reason: "PluginFailed".into(),
            message: error.to_string(),
        };
        if self.done.is_closed() {
            return;
        }
        let _ = self.done.send(tickets);
        self.executors.dead_letter(&origin, &action, &error);
    }

    async fn decide(
        &self,
        event: &ChangeEvent,
    ) -> Result<wasmwatch_runtime::Decision, wasmwatch_runtime::PluginError> {
        let started = Instant::now();
        // Boxed: the call's state (wasmtime's instantiation and call
        // futures) is kilobytes, and inline it made every `PluginCall::run`
        // task that large, copied whole when spawned and twice more when it
        // ended (tokio's `set_stage`, the JoinSet's read of the output):
        // ~3% of the saturated profile in memmove (issue 24).
        let result = Box::pin(self.plugin.handle(event)).await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        let name = self.plugin.name();
        self.metrics.plugin_invocations.inc(&[name, outcome]);
        self.metrics
            .plugin_duration
            .observe(&[name, outcome], started.elapsed().as_secs_f64());
        result
    }

    fn submit_decision(
        &self,
        decision: wasmwatch_runtime::Decision,
        tickets: Tickets,
        origin: Origin,
    ) {
        self.submit.submit(Submission {
            ticket: tickets,
            origin,
            actions: decision.allowed().cloned().collect(),
            policy: self.policy,
        });
    }
}

fn print_report(r: &Report) {
    let objects: Vec<String> = r
        .origins
        .iter()
        .map(|o| format!("{}/{}/{}", o.kind.as_str(), o.namespace, o.name))
        .collect();
    let (outcome, error) = match &r.outcome {
        Outcome::Done => ("done", None),
        Outcome::Retrying { error, .. } => ("retrying", Some(error.to_string())),
        Outcome::DeadLettered { error } => ("dead-lettered", Some(error.to_string())),
        Outcome::Abandoned => ("abandoned", None),
    };
    println!(
        "{}",
        serde_json::json!({
            "action": r.action,
            "plugin": r.origins.last().map(|o| o.plugin.clone()),
            "objects": objects,
            "attempt": r.attempt,
            "outcome": outcome,
            "error": error,
        })
    );
}

/// One report as a sentence, for people watching the local run.
pub fn describe(r: &Report) -> String {
    let what = describe_action(&r.action);
    let objects: Vec<String> = r
        .origins
        .iter()
        .map(|o| format!("{} {}/{}", o.kind.as_str(), o.namespace, o.name))
        .collect();
    let plugin = r.origins.last().map_or("", |o| o.plugin.as_str());
    let outcome = match &r.outcome {
        Outcome::Done => "done".to_string(),
        Outcome::Retrying { error, delay } => format!("failed ({error}), retrying in {delay:?}"),
        Outcome::DeadLettered { error } => format!("gave up: {error}"),
        Outcome::Abandoned => "abandoned (not leading)".to_string(),
    };
    format!("{plugin}: {what}, for {}: {outcome}", objects.join(", "))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
