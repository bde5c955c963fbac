//! One replica of wasmwatch in the simulated world: the real elector, the
//! real checkpoint store, the real watch loops and the real term, wired as
//! `wasmwatch run` wires them (host/wasmwatch/src/run.rs, `Service::lead`),
//! with the plugin and its HTTP action replaced by the simulated app.
//!
//! The term's loop is host/kube's `shell::Shell`, the one `wasmwatch run`
//! runs; what acts on a change is [`SimAct`] (the binary's is its
//! `Acting`: plugin calls, the pipeline, the executors).
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use wasmwatch_core::turns::{Call, Offered, Turns};
use wasmwatch_core::{ChangeEvent, ChangeType, ObjectKind, Scope};
use wasmwatch_kube::checkpoint::{CheckpointError, CheckpointStore, Ticket};
use wasmwatch_kube::elector::{Acting, Elector, ElectorConfig, Fence, Leadership};
use wasmwatch_kube::shell::{Act, Shell};
use wasmwatch_kube::term::{End, HOLD_FAILURES, Saved, Start, Term};
use wasmwatch_kube::watchloop::{WatchLoop, WatchTarget};

use crate::world::{Conn, Delivery, Objects};

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
    /// Probability that the app answers 503 (the action is retried).
    pub app_503: f64,
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
    let may_act = {
        let (fence, acting) = (fence.clone(), acting.clone());
        move || fence.still(&acting)
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
        "node {} leads as {} from {:?}",
        conn.node,
        acting.term.transitions,
        claimed.checkpoints.format(ObjectKind::ConfigMap)
    ));
    let indexes = std::mem::take(&mut claimed.indexes);
    let checkpoints = std::mem::take(&mut claimed.checkpoints);
    let unreadable = std::mem::take(&mut claimed.unreadable);
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
        may_act: Arc::new(may_act),
        act: SimAct {
            conn: conn.clone(),
            setup: setup.clone(),
            fence: fence.clone(),
            acting: acting.clone(),
            turns: Turns::default(),
            calls: JoinSet::new(),
            watches,
            failed_saves: 0,
        },
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
    }
    matches!(end, End::Shutdown)
}

/// The simulated plugin and app behind the shared shell (run.rs's
/// `Acting`): the decide stage's rules (per object, one call at a time in
/// change order, changes waiting for their turn folded into one call),
/// each call holding its turn through its action (stricter than run.rs,
/// where the pipeline orders the actions).
struct SimAct {
    conn: Conn,
    setup: Setup,
    fence: Fence,
    acting: Acting,
    turns: Turns<(String, String), Ticket>,
    calls: JoinSet<((String, String), Vec<Ticket>)>,
    watches: JoinSet<()>,
    failed_saves: u32,
}

impl SimAct {
    fn start(&mut self, key: (String, String), call: Call<Ticket>) {
        self.calls.spawn(act(
            self.conn.clone(),
            self.setup.clone(),
            self.fence.clone(),
            self.acting.clone(),
            key,
            call,
        ));
    }
}

impl Act for SimAct {
    fn dispatch(&mut self, ticket: Ticket, event: Box<ChangeEvent>, _plugins: Vec<usize>) {
        let key = (event.object.namespace.clone(), event.object.name.clone());
        if let Offered::Start(call) = self.turns.offer(key.clone(), Arc::new(*event), ticket) {
            self.start(key, call);
        }
    }

    async fn next(&mut self) -> Option<Vec<Ticket>> {
        let Some(joined) = self.calls.join_next().await else {
            return std::future::pending().await;
        };
        let (key, tickets) = joined.expect("a call does not panic");
        if let Some(next) = self.turns.finished(&key) {
            self.start(key, next);
        }
        // None: abandoned (the successor replays it).
        (!tickets.is_empty()).then_some(tickets)
    }

    fn stop(&mut self) -> Vec<Ticket> {
        self.watches.abort_all();
        self.calls.abort_all();
        Vec::new()
    }

    fn gate(&mut self) -> impl std::future::Future<Output = ()> + Send {
        self.conn.gate()
    }

    fn saved(&mut self, saved: &Saved, _state_uid: Option<String>, last: bool) {
        let mut w = self.conn.world.lock();
        if last {
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

/// The plugin's decision and its action: POST to the app, retried on 503,
/// never outside the fence (the executors' check before every action).
/// Gives back the key and the changes it finished (none: abandoned).
async fn act(
    conn: Conn,
    setup: Setup,
    fence: Fence,
    acting: Acting,
    key: (String, String),
    call: Call<Ticket>,
) -> ((String, String), Vec<Ticket>) {
    let event = &call.event;
    // A deletion found at a resync carries the index's entry: no data,
    // content unknown (0).
    let content = match event.object.data.get("v") {
        Some(wasmwatch_core::event::DataValue::Text(v)) => v.parse().unwrap_or(0),
        _ => 0,
    };
    let mut delivery = Delivery {
        at: Duration::ZERO,
        node: conn.node,
        namespace: key.0.clone(),
        name: key.1.clone(),
        content: (event.change != ChangeType::Deleted).then_some(content),
        of: event.object.resource_version.parse().unwrap_or(0),
        replay: event.replay,
        store_failing: false,
    };
    let mut attempt = 0u32;
    loop {
        let latency = {
            let mut w = conn.world.lock();
            let max = setup.act_latency.as_micros().max(1) as u64;
            Duration::from_micros(w.rng.random_range(0..max))
        };
        tokio::time::sleep(latency).await;
        conn.gate().await;
        if !fence.still(&acting) {
            // Abandoned: the term ends, the successor replays it.
            return (key, Vec::new());
        }
        // The app is reachable from a partitioned replica (only the API
        // server is not).
        // Refused: retried as the pipeline's default delivery policy does
        // (5 retries, 1 s doubling), then dead-lettered (handled, and the
        // app keeps what it had: counted apart by the checks).
        let refused = setup.app_503 > 0.0 && conn.world.lock().rng.random_bool(setup.app_503);
        if refused {
            attempt += 1;
            if attempt > 5 {
                let mut w = conn.world.lock();
                w.log(format!(
                    "node {} dead-letters {}/{} at rv {}",
                    conn.node, delivery.namespace, delivery.name, delivery.of
                ));
                w.dead_letters
                    .insert((delivery.namespace.clone(), delivery.name.clone()));
                break;
            }
            tokio::time::sleep(Duration::from_secs(1 << (attempt - 1))).await;
            continue;
        }
        let mut w = conn.world.lock();
        let identity = w.nodes[conn.node].identity.clone();
        if w.holder(LEADER_LEASE).as_deref() != Some(identity.as_str()) {
            let holder = w.holder(LEADER_LEASE);
            let v = format!(
                "node {} ({identity}) acted while the leader Lease was held by {holder:?}: {}/{} {:?}",
                conn.node, delivery.namespace, delivery.name, delivery.content
            );
            w.violations.push(v);
        }
        delivery.at = w.elapsed();
        delivery.store_failing = w.nodes[conn.node].store_failing;
        w.log(format!(
            "node {} delivers {}/{} {} at rv {}{}",
            conn.node,
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
        break;
    }
    (key, call.tickets)
}
