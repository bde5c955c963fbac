//! Leader election against the test API server over real HTTP.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use wasmwatch_apiserver::{Config, Server, ServerHandle};
use wasmwatch_kube::elector::{Elector, ElectorConfig, Fence, Leadership};

const LEASE: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(200);

struct Replica {
    rx: watch::Receiver<Leadership>,
    fence: Fence,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

/// Every leadership change of every replica: (when, replica, leading).
type Log = Arc<Mutex<Vec<(Instant, usize, bool)>>>;

fn start(server: &ServerHandle, id: usize, log: &Log) -> Replica {
    let mut cfg = ElectorConfig::new("default", "wasmwatch-leader", &format!("replica-{id}"));
    cfg.lease_duration = LEASE;
    cfg.renew_deadline = RENEW;
    cfg.retry_period = RETRY;
    let (elector, rx) = Elector::new(server.client().unwrap(), cfg).unwrap();
    let fence = elector.fence();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(elector.run(async move {
        let _ = stopped.await;
    }));
    let mut watch_rx = rx.clone();
    let log = log.clone();
    tokio::spawn(async move {
        let mut was = false;
        loop {
            let now = watch_rx.borrow_and_update().leading;
            if now != was {
                log.lock().unwrap().push((Instant::now(), id, now));
                was = now;
            }
            if watch_rx.changed().await.is_err() {
                break;
            }
        }
    });
    Replica {
        rx,
        fence,
        stop: Some(stop),
        task,
    }
}

async fn wait_for_leader(replicas: &[&Replica], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        if let Some(i) = replicas.iter().position(|r| r.rx.borrow().leading) {
            return i;
        }
        assert!(Instant::now() < deadline, "no leader within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// At no moment did two replicas lead. `killed` ends a replica's leadership
/// at the given time (a killed process publishes nothing).
fn assert_never_two_leaders(log: &Log, killed: &[(usize, Instant)]) {
    let mut events = log.lock().unwrap().clone();
    events.extend(killed.iter().map(|(i, t)| (*t, *i, false)));
    events.sort_by_key(|e| e.0);
    let mut leading = std::collections::BTreeSet::new();
    for (t, i, l) in events {
        if l {
            leading.insert(i);
        } else {
            leading.remove(&i);
        }
        assert!(leading.len() <= 1, "two leaders at {t:?}: {leading:?}");
    }
}

async fn server() -> ServerHandle {
    Server::start(Config::default()).await.unwrap()
}

async fn lease(server: &ServerHandle) -> Lease {
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    api.get("wasmwatch-leader").await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_three_leads_and_holds_the_lease() {
    let server = server().await;
    let log = Log::default();
    let replicas: Vec<Replica> = (0..3).map(|i| start(&server, i, &log)).collect();
    let refs: Vec<&Replica> = replicas.iter().collect();
    let leader = wait_for_leader(&refs, Duration::from_secs(5)).await;
    tokio::time::sleep(RETRY * 5).await;
    let leaders: Vec<usize> = (0..3)
        .filter(|&i| replicas[i].rx.borrow().leading)
        .collect();
    assert_eq!(leaders, vec![leader]);
    let spec = lease(&server).await.spec.unwrap();
    assert_eq!(
        spec.holder_identity.as_deref(),
        Some(format!("replica-{leader}").as_str())
    );
    assert_eq!(spec.lease_duration_seconds, Some(3));
    let term = replicas[leader].rx.borrow().term.clone().unwrap();
    assert_eq!(term.holder, format!("replica-{leader}"));
    assert_eq!(Some(term.transitions), spec.lease_transitions);
    // Followers know who leads.
    for r in &replicas {
        assert_eq!(
            r.rx.borrow().holder.as_deref(),
            Some(format!("replica-{leader}").as_str())
        );
    }
    assert_never_two_leaders(&log, &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_after_the_lease_expires() {
    let server = server().await;
    let log = Log::default();
    let mut replicas: Vec<Replica> = (0..2).map(|i| start(&server, i, &log)).collect();
    let leader =
        wait_for_leader(&replicas.iter().collect::<Vec<_>>(), Duration::from_secs(5)).await;
    let transitions_before = lease(&server)
        .await
        .spec
        .unwrap()
        .lease_transitions
        .unwrap();
    // Kill without release: the task just stops.
    let killed_at = Instant::now();
    replicas[leader].task.abort();
    let other = 1 - leader;
    let took = {
        let start = Instant::now();
        wait_for_leader(&[&replicas[other]], Duration::from_secs(10)).await;
        start.elapsed()
    };
    assert!(
        took >= LEASE - RETRY * 2,
        "took over before the lease could expire: {took:?}"
    );
    assert!(
        took <= LEASE + Duration::from_secs(1),
        "took over late: {took:?}"
    );
    let spec = lease(&server).await.spec.unwrap();
    assert_eq!(
        spec.holder_identity.as_deref(),
        Some(format!("replica-{other}").as_str())
    );
    assert_eq!(spec.lease_transitions, Some(transitions_before + 1));
    assert_never_two_leaders(&log, &[(leader, killed_at)]);
    replicas[other].stop.take().unwrap().send(()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_leader_hands_over_within_a_second() {
    let server = server().await;
    let log = Log::default();
    let mut replicas: Vec<Replica> = (0..2).map(|i| start(&server, i, &log)).collect();
    let leader =
        wait_for_leader(&replicas.iter().collect::<Vec<_>>(), Duration::from_secs(5)).await;
    tokio::time::sleep(RETRY * 2).await;
    let start = Instant::now();
    replicas[leader].stop.take().unwrap().send(()).unwrap();
    let other = 1 - leader;
    wait_for_leader(&[&replicas[other]], Duration::from_secs(5)).await;
    let took = start.elapsed();
    assert!(took < Duration::from_secs(1), "handover took {took:?}");
    assert!(!replicas[leader].rx.borrow().leading);
    assert!(!replicas[leader].fence.may_act());
    assert!(replicas[other].fence.may_act());
    assert_never_two_leaders(&log, &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_stops_acting_when_the_api_server_is_gone() {
    let server = server().await;
    let log = Log::default();
    let replicas: Vec<Replica> = (0..2).map(|i| start(&server, i, &log)).collect();
    let leader =
        wait_for_leader(&replicas.iter().collect::<Vec<_>>(), Duration::from_secs(5)).await;
    tokio::time::sleep(RETRY * 2).await;
    let down_at = Instant::now();
    server
        .faults()
        .refuse_connections(Duration::from_secs(4))
        .await;
    // The leader steps down by its renew deadline, before anyone could
    // consider its lease expired.
    let mut rx = replicas[leader].rx.clone();
    tokio::time::timeout(LEASE, rx.wait_for(|l| !l.leading))
        .await
        .expect("leader did not step down before the lease could expire")
        .unwrap();
    let stepped_down = down_at.elapsed();
    assert!(!replicas[leader].fence.may_act());
    assert!(
        stepped_down <= RENEW + RETRY,
        "stepped down after {stepped_down:?}"
    );
    // Once the API server is back, a leader is elected again.
    wait_for_leader(
        &replicas.iter().collect::<Vec<_>>(),
        Duration::from_secs(10),
    )
    .await;
    assert_never_two_leaders(&log, &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_was_taken_over_stops_at_once() {
    let server = server().await;
    let log = Log::default();
    let replica = start(&server, 0, &log);
    wait_for_leader(&[&replica], Duration::from_secs(5)).await;
    // Another holder writes the Lease (as a replica that judged ours expired
    // would): ours must stop at its next look, not at its renew deadline.
    let api: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    let mut taken = lease(&server).await;
    let spec = taken.spec.as_mut().unwrap();
    spec.holder_identity = Some("intruder".into());
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    let taken_at = Instant::now();
    api.replace("wasmwatch-leader", &Default::default(), &taken)
        .await
        .unwrap();
    let mut rx = replica.rx.clone();
    tokio::time::timeout(RENEW, rx.wait_for(|l| !l.leading))
        .await
        .expect("still leading at the renew deadline")
        .unwrap();
    let stopped = taken_at.elapsed();
    assert!(!replica.fence.may_act());
    assert!(stopped <= RETRY * 3, "stopped after {stopped:?}");
    assert_eq!(rx.borrow().holder.as_deref(), Some("intruder"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_renew_is_retried_at_once() {
    let server = server().await;
    let log = Log::default();
    let replica = start(&server, 0, &log);
    wait_for_leader(&[&replica], Duration::from_secs(5)).await;
    let renews = || {
        server
            .requests()
            .iter()
            .filter(|r| r.verb == "update" && r.name.as_deref() == Some("wasmwatch-leader"))
            .count()
    };
    // Wait for a renew to have just happened, then make the next one conflict.
    let wait_for = |n: usize| async move {
        let deadline = Instant::now() + Duration::from_secs(5);
        while renews() <= n {
            assert!(Instant::now() < deadline, "no renew");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Instant::now()
    };
    let n = renews();
    wait_for(n).await;
    server
        .faults()
        .conflict_next_write("leases", "default", "wasmwatch-leader");
    let n = renews();
    let conflicted = wait_for(n).await;
    let renewed = wait_for(n + 1).await;
    assert!(
        renewed - conflicted < RETRY / 2,
        "retried after {:?}",
        renewed - conflicted
    );
    assert!(replica.rx.borrow().leading && replica.fence.may_act());
    assert_never_two_leaders(&log, &[]);
}
