//! `wasmwatch run`: the service.
//!
//! ```text
//! start: manifest → plugins (compiled, checked) → caches (workloads, Services)
//!        → namespace scope (ignored, selected by a watch of Namespaces)
//!        → admin port (/healthz, /readyz, /leader)
//! HA on:  elector ──leading──▶ lead(term) ──not leading / fenced──▶ wait again
//! HA off: lead() at once, no checkpoints (each start takes a baseline)
//!
//! lead(term) (run/lead.rs):
//!   claim the state Lease (checkpoints + object indexes of the last term)
//!   one WatchLoop per kind × namespace, resuming from its checkpoint
//!   Change ─▶ Term (kube::term) ─▶ (its namespace in scope: NamespaceWatch)
//!          ─▶ Decide (plugins whose filter selects it, in turn per object)
//!          ─▶ pipeline (debounce, retry) ─▶ executors (fenced) ─▶ done
//!          ─▶ Term ─▶ batched save
//! ```
//!
//! A change's ticket completes when every plugin's actions for it finished
//! or dead-lettered (a plugin that fails, after its retries, dead-letters
//! too); only then can the checkpoint pass it. On SIGTERM the leader stops
//! its watches, saves what is complete, and only then releases the lease.
mod lead;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use wasmwatch_core::digest::DigestKey;
use wasmwatch_core::{Action, Lookups, Manifest, ObjectKind};
use wasmwatch_exec::executors::{Executors, describe_action};
use wasmwatch_exec::pipeline::{Outcome, PauseOf, Policy, Report};
use wasmwatch_kube::elector::{Elector, ElectorConfig, Leadership};
use wasmwatch_kube::lookups::{CustomKind, KubeLookups};
use wasmwatch_kube::namespaces::NamespaceWatch;
use wasmwatch_runtime::{Runtime, RuntimeConfig};

use crate::decide::Loaded;
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
    /// `--plugin-dir`: modules read from a local folder instead of the
    /// image's.
    pub plugin_dirs: Vec<crate::plugin_dir::PluginDirMap>,
    /// How often the discovery of custom workload kinds (Argo Rollouts) is
    /// read again: a CRD installed or removed while running is followed.
    pub discovery_interval: Duration,
    /// The mutating admission webhook, when asked for (`--webhook-addr`).
    pub webhook: Option<crate::webhook::WebhookOptions>,
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
    crate::plugin_dir::apply_noting(&mut manifest, &options.plugin_dirs);
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
    let lookups = KubeLookups::start_following(
        client.clone(),
        watched_namespaces(&manifest),
        manifest.watch.field_selector(),
        vec![CustomKind::rollout()],
        options.discovery_interval,
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
    let metrics = Arc::new(Metrics::new(&manifest.metrics));
    let executors = executors(&client, &options, &manifest, &lookups, &metrics)?;

    let mut ha = manifest.ha.clone();
    ha.enabled |= options.force_ha;
    let lease_namespace = ha
        .namespace
        .clone()
        .unwrap_or_else(|| options.namespace.clone());
    let (ready_tx, ready) = watch::channel(false);
    let (elector_parts, _leadership_tx, leadership) =
        elect(&client, &options, &ha, &lease_namespace)?;

    // Its tasks stop when this is dropped, with `run`.
    let _webhook = match &options.webhook {
        Some(webhook) => Some(crate::webhook::start(webhook, &client).await?),
        None => None,
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
    lead_terms(
        &service,
        elector_parts,
        leadership,
        ha.retry_period.0,
        &mut shutdown,
    )
    .await;
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

/// What [`elect`] gives back.
type Elected = (
    Option<Elector>,
    watch::Sender<Leadership>,
    watch::Receiver<Leadership>,
);

/// The elector (HA on: not running yet) and the leadership it will tell;
/// HA off: this replica leads, alone, as long as the sender given back
/// lives (a leadership whose sender is gone would end the term).
fn elect(
    client: &kube::Client,
    options: &RunOptions,
    ha: &wasmwatch_core::manifest::HaSpec,
    lease_namespace: &str,
) -> anyhow::Result<Elected> {
    let (leadership_tx, leadership) = watch::channel(Leadership::default());
    Ok(if ha.enabled {
        let config = ElectorConfig {
            namespace: lease_namespace.to_string(),
            lease_name: ha.lease_name.clone(),
            identity: options.identity.clone(),
            lease_duration: ha.lease_duration.0,
            renew_deadline: ha.renew_deadline.0,
            retry_period: ha.retry_period.0,
        };
        let (elector, rx) =
            Elector::new(client.clone(), config).map_err(|e| anyhow::anyhow!("ha: {e}"))?;
        (Some(elector), leadership_tx, rx)
    } else {
        leadership_tx.send_replace(Leadership {
            leading: true,
            term: None,
            holder: Some(options.identity.clone()),
        });
        (None, leadership_tx, leadership)
    })
}

/// The executors of the plugins' actions: HTTP (endpoints from the
/// lookups), the buses, the Kubernetes API (restarts, Events).
fn executors(
    client: &kube::Client,
    options: &RunOptions,
    manifest: &Manifest,
    lookups: &Arc<KubeLookups>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Arc<Executors>> {
    let buses = wasmwatch_bus::Buses::new(&manifest.buses)?;
    // Every namespace watched: the cluster-wide install, whose ClusterRole
    // lets the restarts read a namespace (one being deleted restarts
    // nothing).
    let kube = Arc::new(
        wasmwatch_exec::workload::KubeExecutor::new(client.clone(), "wasmwatch", &options.identity)
            .reading_namespaces(
                manifest
                    .watch
                    .scopes()
                    .contains(&wasmwatch_core::Scope::All),
            ),
    );
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
    Ok(Arc::new(Executors {
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
    }))
}

/// Leads each term this replica wins (HA), or one term (HA off), until
/// shutdown; the elector releases the Lease only after leader work stopped
/// and its checkpoint is saved.
async fn lead_terms(
    service: &Arc<Service>,
    elector: Option<Elector>,
    leadership: watch::Receiver<Leadership>,
    retry: Duration,
    shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) {
    match elector {
        None => {
            service.lead(None, leadership, shutdown).await;
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
                    _ = &mut *shutdown => break,
                };
                let Some(term) = term else { break };
                tracing::info!(term = %term, "leading");
                let stop = service
                    .lead(Some(fence.clone()), leadership.clone(), shutdown)
                    .await;
                if stop {
                    break;
                }
                // A term that ended at once (a claim refused as fenced or
                // corrupt) must not spin: wait a little before the next.
                tokio::select! {
                    _ = tokio::time::sleep(retry) => {}
                    _ = &mut *shutdown => break,
                }
            }
            // Leader work has stopped and its checkpoint is saved: now release.
            let _ = stop_elector.send(());
            let _ = elector_task.await;
        }
    }
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
    if !manifest.watch.watches(ObjectKind::Secret)
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
