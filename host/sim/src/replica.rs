//! One replica of wasmwatch in the simulated world: the real elector, the
//! real checkpoint store, the real watch loops and the real term, wired as
//! `wasmwatch run` wires them (host/wasmwatch/src/run.rs, `Service::lead`),
//! with the plugin and its HTTP action replaced by the simulated app.
//!
//! The wiring here mirrors run.rs by hand: moving that shell out of the
//! binary so both run the same one is issue 33's next step.
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use rand::Rng;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use wasmwatch_core::turns::{Call, Offered, Turns};
use wasmwatch_core::{ChangeType, ObjectKind, Scope};
use wasmwatch_kube::checkpoint::{
    CheckpointError, CheckpointStore, Checkpoints, StreamIndex, Ticket,
};
use wasmwatch_kube::elector::{Acting, Elector, ElectorConfig, Fence, Leadership};
use wasmwatch_kube::term::{Effect, End, HOLD_FAILURES, Input, Saved, Start, Term};
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
        streams.push(
            futures_util::stream::unfold(rx, move |mut rx| async move {
                rx.recv().await.map(|o| ((id, o), rx))
            })
            .boxed(),
        );
    }
    let mut outputs = futures_util::stream::select_all(streams);
    drop(indexes);

    let (done_tx, mut done) = mpsc::unbounded_channel::<Ticket>();
    let mut calls = JoinSet::new();
    // The decide stage's rules (run.rs's `Decide`): per object, one call
    // at a time in change order, changes waiting for their turn folded
    // into one call. The simulated plugin call holds its turn through its
    // action (stricter than run.rs, where the pipeline orders the actions).
    let mut turns: Turns<(String, String), Ticket> = Turns::default();
    let start = |calls: &mut JoinSet<_>, key: (String, String), call: Call<Ticket>| {
        calls.spawn(act(
            conn.clone(),
            setup.clone(),
            fence.clone(),
            acting.clone(),
            key,
            call,
        ));
    };
    type Writing =
        std::pin::Pin<Box<dyn std::future::Future<Output = (CheckpointStore<Conn>, Saved)> + Send>>;
    let mut writing: Option<Writing> = None;
    let mut store = Some(store);
    let mut closing: Option<Instant> = None;
    let mut failed_saves = 0;
    let end = loop {
        conn.gate().await;
        let input = tokio::select! {
            biased;
            _ = shutdown.wait_for(|s| *s), if closing.is_none() => {
                closing = Some(Instant::now() + DRAIN);
                flush.ask();
                Input::Closing
            }
            () = std::future::ready(()), if closing.is_some() && term.drained() => Input::Shutdown,
            () = tokio::time::sleep_until(closing.unwrap_or_else(Instant::now)), if closing.is_some() => Input::Shutdown,
            r = leadership.changed() => {
                if r.is_ok() && may_act() {
                    continue;
                }
                Input::NotActing
            }
            Some(joined) = calls.join_next(), if !calls.is_empty() => {
                let (key, tickets) = joined.expect("a call does not panic");
                for ticket in tickets {
                    let _ = done_tx.send(ticket);
                }
                if let Some(next) = turns.finished(&key) {
                    start(&mut calls, key, next);
                }
                continue;
            }
            (s, saved) = async { writing.as_mut().expect("checked").await }, if writing.is_some() => {
                store = Some(s);
                writing = None;
                match &saved {
                    Saved::Stored => failed_saves = 0,
                    Saved::Failed(_) => failed_saves += 1,
                    _ => {}
                }
                let mut w = conn.world.lock();
                w.nodes[conn.node].store_failing = failed_saves >= HOLD_FAILURES;
                if saved != Saved::Stored {
                    w.log(format!("node {} save: {saved:?}", conn.node));
                }
                drop(w);
                Input::Saved(saved)
            }
            Some(ticket) = done.recv() => Input::Finished(ticket),
            _ = tokio::time::sleep_until(term.wake_at()) => {
                if may_act() { Input::Tick } else { Input::NotActing }
            }
            o = outputs.next(), if term.wants_outputs() => match o {
                Some((id, output)) => Input::Output(id, output),
                None => Input::WatchesGone,
            },
        };
        let mut ended = None;
        for effect in term.handle(input, Instant::now()) {
            match effect {
                Effect::Dispatch { ticket, event, .. } => {
                    let key = (event.object.namespace.clone(), event.object.name.clone());
                    if let Offered::Start(call) = turns.offer(key.clone(), Arc::new(*event), ticket)
                    {
                        start(&mut calls, key, call);
                    }
                }
                Effect::Save {
                    checkpoints,
                    indexes,
                } => {
                    let mut s = store.take().expect("one save at a time");
                    let may_act = may_act.clone();
                    writing = Some(Box::pin(async move {
                        let saved = write(&mut s, &checkpoints, &indexes, &may_act).await;
                        (s, saved)
                    }));
                }
                Effect::Received(_) | Effect::Handled(_) => {}
                Effect::End(why) => ended = Some(why),
            }
        }
        if let Some(why) = ended {
            break why;
        }
    };
    {
        let mut w = conn.world.lock();
        w.nodes[conn.node].store_failing = false;
        w.log(format!("node {} term ends: {end:?}", conn.node));
    }
    drop(watches);
    calls.abort_all();
    drop(calls);
    let mut fenced = false;
    if let Some(w) = writing.take() {
        let (s, saved) = w.await;
        store = Some(s);
        fenced = matches!(saved, Saved::Fenced(_) | Saved::NotActing);
    }
    while let Ok(ticket) = done.try_recv() {
        term.finish_late(ticket);
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
        let saved = write(store, &checkpoints, &indexes, &may_act).await;
        conn.world
            .lock()
            .log(format!("node {} final save: {saved:?}", conn.node));
    }
    matches!(end, End::Shutdown)
}

/// run.rs's `write`.
async fn write(
    store: &mut CheckpointStore<Conn>,
    checkpoints: &Checkpoints,
    indexes: &[StreamIndex],
    may_act: &impl Fn() -> bool,
) -> Saved {
    if !may_act() {
        return Saved::NotActing;
    }
    match store.save(checkpoints, indexes).await {
        Ok(()) => Saved::Stored,
        Err(CheckpointError::Api(e)) => Saved::Failed(e.to_string()),
        Err(e) => Saved::Fenced(e.to_string()),
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
