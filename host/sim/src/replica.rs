//! One replica of wasmwatch in the simulated world: the real elector, the
//! real checkpoint store, the real watch loops and the real term, wired as
//! `wasmwatch run` wires them (host/wasmwatch/src/run.rs, `Service::lead`),
//! with the plugin and the app simulated behind their seams.
//!
//! The term's loop is host/kube's `shell::Shell`, the one `wasmwatch run`
//! runs; what acts on a change is host/exec's `decide::Stage` (the plugin
//! calls with their retries, then the pipeline with its queues, retries,
//! fence checks and tickets), the one `wasmwatch run` acts through.
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use wasmwatch_core::action::HttpMethod;
use wasmwatch_core::{Action, ChangeEvent, ChangeType, ObjectKind, Scope};
use wasmwatch_exec::decide::{Decide, Decider, Loaded, Stage, Unobserved};
use wasmwatch_exec::pipeline::{BoxFuture, Execute, Executed, Pipeline, PipelineConfig, Policy};
use wasmwatch_exec::{ExecError, Origin};
use wasmwatch_kube::checkpoint::{CheckpointError, CheckpointStore, Ticket};
use wasmwatch_kube::elector::{Elector, ElectorConfig, Fence, Leadership};
use wasmwatch_kube::shell::{Act, MayAct, Shell};
use wasmwatch_kube::term::{End, HOLD_FAILURES, Saved, Start, Term};
use wasmwatch_kube::watchloop::{WatchLoop, WatchTarget};

use crate::world::{Claim, Conn, Delivery, Objects};

pub const NAMESPACE: &str = "wasmwatch";
pub const LEADER_LEASE: &str = "wasmwatch-leader";
pub const STATE_LEASE: &str = "wasmwatch-state";

/// How a replica is set up.
#[derive(Debug, Clone)]
pub struct Setup {
    pub scopes: Vec<Scope>,
    pub checkpoint_interval: Duration,
    /// Plugin call and action latency, up to.
    pub act_latency: Duration,
    /// Probability that the app answers 503 (the pipeline retries it).
    pub app_503: f64,
    /// Probability that a plugin call fails (it is retried).
    pub plugin_fails: f64,
    /// Probability that a plugin call takes 1-8 s more.
    pub plugin_slow: f64,
    /// Segment size of the stored index (small: several segments a save).
    pub segment_bytes: usize,
}

/// Stepping down after SIGTERM waits this long at most (run.rs's DRAIN).
const DRAIN: Duration = Duration::from_millis(500);

/// Runs replica `node` until `shutdown` turns true (SIGTERM) or the task
/// is aborted (SIGKILL).
pub async fn run(conn: Conn, setup: Setup, mut shutdown: watch::Receiver<bool>) {
    let identity = conn.world.lock().nodes[conn.node].identity.clone();
    let config = ElectorConfig::new(NAMESPACE, LEADER_LEASE, &identity);
    let retry = config.retry_period;
    let (elector, mut leadership) = Elector::with_api(conn.clone(), config).expect("valid config");
    let fence = elector.fence();
    // As run.rs: the elector stops (and releases the lease) only after
    // leader work stopped and its last checkpoint is saved.
    let (stop_elector, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut tasks = JoinSet::new();
    tasks.spawn(elector.run_with(
        async move {
            let _ = stopped.await;
        },
        Arc::new(Notify::new()),
    ));
    loop {
        let leading = tokio::select! {
            biased;
            _ = shutdown.wait_for(|s| *s) => break,
            r = leadership.wait_for(|l: &Leadership| l.leading && l.term.is_some()) => r.is_ok(),
        };
        if !leading {
            break;
        }
        if lead(&conn, &setup, &fence, leadership.clone(), &mut shutdown).await {
            break;
        }
        tokio::select! {
            biased;
            _ = shutdown.wait_for(|s| *s) => break,
            _ = tokio::time::sleep(retry) => {}
        }
    }
    let _ = stop_elector.send(());
    while tasks.join_next().await.is_some() {}
}

/// One term of leading; true when shut down.
async fn lead(
    conn: &Conn,
    setup: &Setup,
    fence: &Fence,
    mut leadership: watch::Receiver<Leadership>,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    let Some(acting) = fence.acting() else {
        return false;
    };
    let may_act: MayAct = {
        let (fence, acting) = (fence.clone(), acting.clone());
        Arc::new(move || fence.still(&acting))
    };
    let mut store =
        CheckpointStore::with_api(conn.clone(), STATE_LEASE, LEADER_LEASE, acting.term.clone())
            .sizes(wasmwatch_kube::checkpoint::Sizes {
                segment: setup.segment_bytes,
                tail: setup.segment_bytes / 10,
                compact_floor: setup.segment_bytes * 4,
                tier: 4,
            });
    let mut failures = 0;
    let mut claimed = loop {
        match store.claim().await {
            Ok(c) => break c,
            Err(CheckpointError::Api(e)) if may_act() => {
                failures += 1;
                let delay = wasmwatch_kube::watchloop::backoff(failures);
                conn.world
                    .lock()
                    .log(format!("node {} claim failed, retrying: {e}", conn.node));
                tokio::select! {
                    biased;
                    _ = shutdown.wait_for(|s| *s) => return true,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            Err(e) => {
                conn.world
                    .lock()
                    .log(format!("node {} cannot claim: {e}", conn.node));
                return false;
            }
        }
    };
    conn.world.lock().log(format!(
        "node {} leads as {} from {:?}, trusting {}",
        conn.node,
        acting.term.transitions,
        claimed.checkpoints.format(ObjectKind::ConfigMap),
        match &claimed.trust {
            Some(t) => format!(
                "the index at {:?} but {:?}",
                t.at.format(ObjectKind::ConfigMap),
                t.unhandled.get(&ObjectKind::ConfigMap).map(|u| u.len())
            ),
            None => "nothing".to_string(),
        }
    ));
    let indexes = std::mem::take(&mut claimed.indexes);
    let checkpoints = std::mem::take(&mut claimed.checkpoints);
    let unreadable = std::mem::take(&mut claimed.unreadable);
    let term_id = {
        let kind = ObjectKind::ConfigMap;
        let mut from = std::collections::BTreeMap::new();
        for scope in &setup.scopes {
            let trusted = checkpoints.get(kind, scope).filter(|_| {
                !unreadable.contains_key(&kind)
                    && indexes.contains_key(&kind)
                    && claimed.covers(kind, scope)
            });
            if let Some(rv) = trusted.and_then(|rv| rv.parse::<u64>().ok()) {
                for ns in scope.namespace().map_or(vec!["a", "b"], |ns| vec![ns]) {
                    from.insert(ns.to_string(), rv);
                }
            }
        }
        let mut w = conn.world.lock();
        let at = w.elapsed();
        w.claims.push(Claim {
            node: conn.node,
            at,
            from,
            handed_over: false,
            final_stored: false,
            trust: claimed.trust.clone(),
        });
        w.claims.len() - 1
    };
    let mut term = Term::new(
        checkpoints.clone(),
        unreadable.keys().copied(),
        true,
        setup.checkpoint_interval,
        Instant::now(),
        Box::new(|_| vec![0]),
    );
    let kind = ObjectKind::ConfigMap;
    let flush = wasmwatch_kube::watchloop::Flush::default();
    let mut watches = JoinSet::new();
    let mut streams = Vec::new();
    for scope in &setup.scopes {
        let target = WatchTarget {
            kind,
            scope: scope.clone(),
            label_selector: None,
            field_selector: None,
            metadata_changes: false,
            digest_key: None,
            remember: Default::default(),
            custom: None,
        };
        let api = Objects {
            conn: conn.clone(),
            namespace: scope.namespace().map(str::to_string),
        };
        let from = checkpoints.get(kind, scope).map(str::to_string);
        let (start, mut wl) = if unreadable.contains_key(&kind) {
            (
                Start::DeliverAll,
                WatchLoop::with_api(api, target, None).delivering_all(),
            )
        } else if from.is_some() {
            (Start::Resume, WatchLoop::with_api(api, target, from))
        } else {
            (Start::Baseline, WatchLoop::with_api(api, target, None))
        };
        if let Some(index) = indexes.get(&kind)
            && claimed.covers(kind, scope)
        {
            wl = wl.with_index(index.part(scope));
            if let Some(trusted) = claimed.trusted(kind, scope) {
                wl = wl.trusting(trusted);
            }
        }
        let id = term.stream(kind, scope.clone(), start);
        wl.index_interval = setup.checkpoint_interval;
        let wl = wl.with_flush(&flush);
        let (tx, rx) = mpsc::channel(256);
        watches.spawn(wl.run(tx));
        streams.push(wasmwatch_kube::shell::tagged(id, rx));
    }
    let outputs = futures_util::stream::select_all(streams);
    drop(indexes);
    let shell = Shell {
        term,
        store: Some(store),
        outputs,
        flush,
        may_act: may_act.clone(),
        act: SimAct::new(conn, setup, may_act.clone(), watches, term_id),
        drain: DRAIN,
    };
    let stop = async {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    tokio::pin!(stop);
    let (end, _) = shell.run(&mut leadership, stop.as_mut()).await;
    {
        let mut w = conn.world.lock();
        w.nodes[conn.node].store_failing = false;
        w.log(format!("node {} term ends: {end:?}", conn.node));
        let claim = &mut w.claims[term_id];
        claim.handed_over = claim.final_stored && end == End::Shutdown;
    }
    matches!(end, End::Shutdown)
}

/// What acts on a change: the real decide stage and pipeline
/// (`exec::decide::Stage`, run.rs's `Acting` runs the same), with a
/// simulated plugin ([`SimPlugin`]) and app ([`SimApp`]) behind their
/// seams.
struct SimAct {
    conn: Conn,
    stage: Option<Stage<Ticket>>,
    watches: JoinSet<()>,
    /// Its term (`World::claims`).
    term: usize,
    failed_saves: u32,
}

impl SimAct {
    fn new(
        conn: &Conn,
        setup: &Setup,
        may_act: MayAct,
        watches: JoinSet<()>,
        term: usize,
    ) -> SimAct {
        let app = Arc::new(SimApp {
            conn: conn.clone(),
            term,
            app_503: setup.app_503,
        });
        let plugin = Loaded {
            plugin: Arc::new(SimPlugin {
                conn: conn.clone(),
                setup: setup.clone(),
            }),
            policy: Policy::from(&wasmwatch_core::manifest::Delivery::default()),
        };
        let decide = Decide::new(vec![plugin], app.clone(), Arc::new(Unobserved));
        let stage = Stage::new(decide, |done| {
            Pipeline::start(app, PipelineConfig::default(), may_act, None, done)
        });
        SimAct {
            conn: conn.clone(),
            stage: Some(stage),
            watches,
            term,
            failed_saves: 0,
        }
    }

    fn stage(&mut self) -> &mut Stage<Ticket> {
        self.stage.as_mut().expect("acting until stopped")
    }
}

impl Act for SimAct {
    fn dispatch(&mut self, ticket: Ticket, event: Box<ChangeEvent>, plugins: Vec<usize>) {
        self.stage().dispatch(ticket, *event, &plugins);
    }

    async fn next(&mut self) -> Option<Vec<Ticket>> {
        self.stage().next().await
    }

    fn accepting(&self) -> bool {
        self.stage.as_ref().is_some_and(|s| s.accepting())
    }

    fn stop(&mut self) -> Vec<Ticket> {
        self.watches.abort_all();
        self.stage.take().map(Stage::stop).unwrap_or_default()
    }

    fn gate(&mut self) -> impl std::future::Future<Output = ()> + Send {
        self.conn.gate()
    }

    fn saved(&mut self, saved: &Saved, _state_uid: Option<String>, last: bool) {
        let mut w = self.conn.world.lock();
        if last {
            w.claims[self.term].final_stored = *saved == Saved::Stored;
            w.log(format!(
                "node {} save after the term: {saved:?}",
                self.conn.node
            ));
            return;
        }
        match saved {
            Saved::Stored => self.failed_saves = 0,
            Saved::Failed(_) => self.failed_saves += 1,
            _ => {}
        }
        w.nodes[self.conn.node].store_failing = self.failed_saves >= HOLD_FAILURES;
        if *saved != Saved::Stored {
            w.log(format!("node {} save: {saved:?}", self.conn.node));
        }
    }
}

/// The simulated plugin: takes up to `act_latency` (now and then much
/// longer), fails as often as the seed says (the decide stage retries it
/// per the default delivery policy, then dead-letters it), and decides one
/// POST of the object's content (or its deletion) to the app.
struct SimPlugin {
    conn: Conn,
    setup: Setup,
}

impl Decider for SimPlugin {
    fn name(&self) -> &str {
        "sim"
    }

    fn decide<'a>(&'a self, event: &'a ChangeEvent) -> BoxFuture<'a, Result<Vec<Action>, String>> {
        Box::pin(async move {
            let (latency, fails) = {
                let mut w = self.conn.world.lock();
                let max = self.setup.act_latency.as_micros().max(1) as u64;
                let mut latency = Duration::from_micros(w.rng.random_range(0..max));
                if w.rng.random_bool(self.setup.plugin_slow) {
                    latency += Duration::from_millis(w.rng.random_range(1_000..8_000));
                }
                let fails = w.plugin_down
                    || (self.setup.plugin_fails > 0.0
                        && w.rng.random_bool(self.setup.plugin_fails));
                (latency, fails)
            };
            tokio::time::sleep(latency).await;
            self.conn.gate().await;
            if fails {
                return Err("the simulated plugin failed".to_string());
            }
            // A deletion found at a resync carries the index's entry: no
            // data, content unknown (0).
            let content = match event.object.data.get("v") {
                Some(wasmwatch_core::event::DataValue::Text(v)) => v.parse().unwrap_or(0u64),
                _ => 0,
            };
            let body = Body {
                content: (event.change != ChangeType::Deleted).then_some(content),
                replay: event.replay,
            };
            Ok(vec![Action::Http {
                method: HttpMethod::Post,
                url: "http://app.sim/refresh".into(),
                headers: Vec::new(),
                body: Some(body.encode()),
            }])
        })
    }
}

/// What the plugin POSTs: the content (none: a deletion) and whether the
/// change was a replay.
struct Body {
    content: Option<u64>,
    replay: bool,
}

impl Body {
    fn encode(&self) -> Vec<u8> {
        let content = self
            .content
            .map_or("deleted".to_string(), |c| c.to_string());
        format!("{content} {}", self.replay).into_bytes()
    }

    fn decode(bytes: &[u8]) -> Body {
        let text = String::from_utf8_lossy(bytes);
        let (content, replay) = text.split_once(' ').expect("a body the plugin wrote");
        Body {
            content: content.parse().ok(),
            replay: replay == "true",
        }
    }
}

/// The simulated app, as the pipeline's executor: it refuses with a 503
/// as often as the seed says (retried by the pipeline), else records the
/// delivery. The pipeline asks the fence right before an attempt, and the
/// POST leaves in the same step (no await between them), so a delivery
/// outside the leader Lease is a broken fence.
struct SimApp {
    conn: Conn,
    /// The term it acts for (`World::claims`).
    term: usize,
    app_503: f64,
}

impl Execute for SimApp {
    fn execute<'a>(
        &'a self,
        origin: &'a Origin,
        action: &'a Action,
    ) -> BoxFuture<'a, Result<Executed, ExecError>> {
        let Action::Http {
            body: Some(body), ..
        } = action
        else {
            panic!("the simulated plugin decides POSTs: {action:?}");
        };
        let body = Body::decode(body);
        // Sent now (before the future is first polled out of this step).
        let refused = {
            let mut w = self.conn.world.lock();
            let p = self.app_503;
            let refused = w.app_down || (p > 0.0 && w.rng.random_bool(p));
            if !refused {
                self.record(&mut w, origin, &body);
            }
            refused
        };
        Box::pin(async move {
            let latency = self.conn.world.lock().latency();
            tokio::time::sleep(latency).await;
            // A paused replica reads the answer once resumed.
            self.conn.gate().await;
            if refused {
                return Err(ExecError::Retryable("503 Service Unavailable".into()));
            }
            Ok(Executed {
                status: Some(200),
                pods: None,
            })
        })
    }

    fn dead_letter(&self, origin: &Origin, action: &Action, error: &ExecError) {
        let mut w = self.conn.world.lock();
        w.log(format!(
            "node {} dead-letters {}/{} at rv {} ({}: {error})",
            self.conn.node,
            origin.namespace,
            origin.name,
            origin.resource_version,
            action.type_name()
        ));
        // Where the app's deliveries stood (a deletion found at a resync
        // has no version to compare).
        let at = w.app.len();
        w.dead_letters
            .insert((origin.namespace.clone(), origin.name.clone()), at);
    }
}

impl SimApp {
    /// The app received a content: recorded, and judged against the
    /// leader Lease.
    fn record(&self, w: &mut crate::world::World, origin: &Origin, body: &Body) {
        let node = self.conn.node;
        let identity = w.nodes[node].identity.clone();
        if w.holder(LEADER_LEASE).as_deref() != Some(identity.as_str()) {
            let holder = w.holder(LEADER_LEASE);
            let v = format!(
                "node {node} ({identity}) acted while the leader Lease was held by {holder:?}: {}/{} {:?}",
                origin.namespace, origin.name, body.content
            );
            w.violations.push(v);
        }
        let delivery = Delivery {
            at: w.elapsed(),
            node,
            namespace: origin.namespace.clone(),
            name: origin.name.clone(),
            content: body.content,
            of: origin.resource_version.parse().unwrap_or(0),
            replay: body.replay,
            term: self.term,
            store_failing: w.nodes[node].store_failing,
        };
        w.log(format!(
            "node {node} delivers {}/{} {} at rv {}{}",
            delivery.namespace,
            delivery.name,
            match delivery.content {
                Some(c) => format!("content {c}"),
                None => "its deletion".to_string(),
            },
            delivery.of,
            if delivery.replay { " (replay)" } else { "" }
        ));
        w.app.push(delivery);
    }
}
