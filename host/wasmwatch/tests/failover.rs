//! The HA cycle end to end: `wasmwatch run` replicas as real processes
//! against the test API server, the real http-refresh plugin, real HTTP pods
//! counting actuator refreshes.
mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

const MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: true, namespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms}
plugins:
  - name: http-refresh
    module: {module:http-refresh}
    sha256: {sha256:http-refresh}
    events: {kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}
    capabilities: {refresh: [shop]}
    delivery: {debounce: 0s, retries: 3, backoffInitial: 100ms, backoffMax: 1s}
";

struct Cluster {
    server: wasmwatch_apiserver::ServerHandle,
    client: kube::Client,
    _dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    manifest: std::path::PathBuf,
    orders: Vec<Pod>,
    billing: Pod,
    cms: Api<ConfigMap>,
}

async fn cluster() -> Cluster {
    cluster_with(MANIFEST).await
}

async fn cluster_with(manifest: &str) -> Cluster {
    let TestEnv {
        server,
        client,
        dir,
        kubeconfig,
        manifest,
    } = test_env(manifest, "shop").await;
    let orders = vec![Pod::start().await, Pod::start().await];
    let billing = Pod::start().await;
    service(&client, "shop", "orders", &[&orders[0], &orders[1]], &[]).await;
    service(&client, "shop", "billing", &[&billing], &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "shop");
    for name in ["orders", "billing"] {
        cms.create(&PostParams::default(), &config_map(name, "1"))
            .await
            .unwrap();
    }
    Cluster {
        server,
        client,
        _dir: dir,
        kubeconfig,
        manifest,
        orders,
        billing,
        cms,
    }
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"spring.cloud.kubernetes.config": "true"}},
        "data": {"application.yaml": format!("value: {value}")}
    }))
    .unwrap()
}

async fn set(cms: &Api<ConfigMap>, name: &str, value: &str) -> u64 {
    let patch = serde_json::json!({"data": {"application.yaml": format!("value: {value}")}});
    let cm = cms
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    cm.metadata.resource_version.unwrap().parse().unwrap()
}

fn orders_hits(c: &Cluster) -> Vec<usize> {
    c.orders.iter().map(|p| p.hits(REFRESH)).collect()
}

/// Each test runs replicas with 3 s leases (renew deadline 2 s): one at a
/// time, so that a loaded 2-core machine does not starve a leader into
/// stepping down.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_while_nobody_leads_is_replayed_exactly_once_by_the_next_leader() {
    let _alone = ALONE.lock().await;
    let c = cluster().await;
    let a = Replica::start(&c.kubeconfig, &c.manifest, "replica-a");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    let b = Replica::start(&c.kubeconfig, &c.manifest, "replica-b");
    // The leader's watch is up: one for ConfigMaps in shop, plus the lookups' watches.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 1. The leader handles a change: both orders pods refreshed once.
    let rv1 = set(&c.cms, "orders", "2").await;
    eventually(Duration::from_secs(10), "first refresh", || async {
        orders_hits(&c) == vec![1, 1]
    })
    .await;
    eventually(
        Duration::from_secs(5),
        "checkpoint passes the change",
        || async {
            checkpoint(&c.client, "shop")
                .await
                .is_some_and(|rv| rv >= rv1)
        },
    )
    .await;
    assert!(!b.leading().await);

    // 2. Killed without release; during the gap a change is made.
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    set(&c.cms, "orders", "3").await;
    assert_eq!(orders_hits(&c), vec![1, 1], "nobody leads yet");

    // 3. The next leader replays it: exactly once, and nothing else.
    let took = eventually(Duration::from_secs(15), "replica-b leads", || b.leading()).await;
    eventually(Duration::from_secs(10), "replayed refresh", || async {
        orders_hits(&c) == vec![2, 2]
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(orders_hits(&c), vec![2, 2], "delivered exactly once");
    assert_eq!(c.billing.total(), 0, "nothing else is redelivered");
    let reports = b.reports();
    let done: Vec<_> = reports.iter().filter(|r| r["outcome"] == "done").collect();
    assert_eq!(done.len(), 1, "{reports:?}");
    assert_eq!(done[0]["objects"][0], "ConfigMap/shop/orders");
    eprintln!("failover after kill: successor led after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_over_within_a_second_and_loses_nothing() {
    let _alone = ALONE.lock().await;
    let c = cluster().await;
    let a = Replica::start(&c.kubeconfig, &c.manifest, "replica-a");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    let b = Replica::start(&c.kubeconfig, &c.manifest, "replica-b");
    tokio::time::sleep(Duration::from_millis(500)).await;
    set(&c.cms, "orders", "2").await;
    eventually(Duration::from_secs(10), "first refresh", || async {
        orders_hits(&c) == vec![1, 1]
    })
    .await;

    a.signal("TERM");
    let start = std::time::Instant::now();
    // A change right as the leader goes: whoever handles it, once.
    set(&c.cms, "billing", "2").await;
    eventually(Duration::from_secs(5), "replica-b leads", || b.leading()).await;
    let took = start.elapsed();
    eventually(Duration::from_secs(10), "billing refreshed", || async {
        c.billing.hits(REFRESH) >= 1
    })
    .await;
    let mut a = a;
    let status = a.child.wait().unwrap();
    assert!(status.success(), "graceful exit: {status:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        orders_hits(&c),
        vec![1, 1],
        "no redelivery after a graceful handover"
    );
    assert!(
        c.billing.hits(REFRESH) <= 2,
        "at most a duplicate for the change in flight"
    );
    assert!(
        took < Duration::from_secs(1),
        "SIGTERM handover took {took:?}"
    );
    eprintln!("SIGTERM handover: successor led after {took:?}");
}

/// Issue 33 (issue 32's bound): a change still in its retries at SIGTERM
/// (its app answering 503) holds the checkpoint before it, and a change
/// after it is delivered meanwhile. The final save names the stuck one
/// unhandled; the successor delivers it and nothing else: before, it
/// delivered every change after the checkpoint again (orders here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_handover_redelivers_only_the_change_still_in_its_retries() {
    let _alone = ALONE.lock().await;
    let patient = MANIFEST.replace(
        "retries: 3, backoffInitial: 100ms, backoffMax: 1s",
        "retries: 30, backoffInitial: 200ms, backoffMax: 1s",
    );
    let c = cluster_with(&patient).await;
    let a = Replica::start(&c.kubeconfig, &c.manifest, "replica-a");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    let b = Replica::start(&c.kubeconfig, &c.manifest, "replica-b");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (billing, cms) = (&c.billing, &c.cms);

    billing.answer(&[503; 10]);
    set(cms, "billing", "2").await;
    eventually(Duration::from_secs(10), "billing refused twice", || async {
        billing.hits(REFRESH) >= 2
    })
    .await;
    set(cms, "orders", "2").await;
    eventually(Duration::from_secs(10), "orders refreshed", || async {
        orders_hits(&c) == vec![1, 1]
    })
    .await;
    a.signal("TERM");
    let mut a = a;
    assert!(a.child.wait().unwrap().success(), "graceful exit");
    assert!(
        billing.hits(REFRESH) < 10,
        "still in its retries at the handover: {}",
        billing.hits(REFRESH)
    );
    eventually(Duration::from_secs(5), "replica-b leads", || b.leading()).await;
    eventually(
        Duration::from_secs(20),
        "billing delivered by the successor",
        || async { billing.hits(REFRESH) >= 11 },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        orders_hits(&c),
        vec![1, 1],
        "orders was handled: not replayed"
    );
    let objects: Vec<String> = b
        .reports()
        .iter()
        .filter(|r| r["outcome"] == "done")
        .flat_map(|r| r["objects"].as_array().unwrap().clone())
        .map(|o| o.as_str().unwrap().to_string())
        .collect();
    assert_eq!(objects, ["ConfigMap/shop/billing"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_gap_longer_than_the_history_only_what_changed_is_delivered() {
    let _alone = ALONE.lock().await;
    let c = cluster().await;
    // Many objects, all for the orders app.
    for i in 0..200 {
        let mut cm = config_map(&format!("cm-{i}"), "1");
        cm.metadata.annotations = Some(
            [(
                "spring.cloud.kubernetes.configmap.apps".to_string(),
                "orders".to_string(),
            )]
            .into(),
        );
        c.cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let a = Replica::start(&c.kubeconfig, &c.manifest, "replica-a");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    let b = Replica::start(&c.kubeconfig, &c.manifest, "replica-b");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rv = set(&c.cms, "billing", "2").await;
    eventually(Duration::from_secs(10), "billing refreshed", || async {
        c.billing.hits(REFRESH) == 1
    })
    .await;
    // Wait for checkpoint and object index to be saved (index every 5 s at most).
    eventually(Duration::from_secs(5), "checkpoint", || async {
        checkpoint(&c.client, "shop").await.is_some_and(|v| v >= rv)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;

    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    // The gap: one modified, one deleted, one created; then the history goes.
    set(&c.cms, "cm-7", "2").await;
    c.cms
        .delete("cm-8", &DeleteParams::default())
        .await
        .unwrap();
    let mut new = config_map("cm-new", "1");
    new.metadata.annotations = Some(
        [(
            "spring.cloud.kubernetes.configmap.apps".to_string(),
            "orders".to_string(),
        )]
        .into(),
    );
    c.cms.create(&PostParams::default(), &new).await.unwrap();
    c.server.faults().compact_history();

    eventually(Duration::from_secs(15), "replica-b leads", || b.leading()).await;
    eventually(Duration::from_secs(10), "orders refreshed", || async {
        orders_hits(&c).iter().all(|h| *h >= 1)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut objects: Vec<String> = b
        .reports()
        .iter()
        .filter(|r| r["outcome"] == "done")
        .flat_map(|r| {
            r["objects"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    objects.sort();
    objects.dedup();
    assert_eq!(
        objects,
        vec![
            "ConfigMap/shop/cm-7",
            "ConfigMap/shop/cm-8",
            "ConfigMap/shop/cm-new"
        ],
        "only the three objects that changed during the gap"
    );
    assert_eq!(c.billing.hits(REFRESH), 1, "billing did not change again");
}

/// Issue 19's recipe for the two losses at a 410 resync. The leader handles
/// X = B, Z = B and a new W, and its checkpoint is saved past them; it is
/// killed; while nobody leads X goes back to A, Z to C, W is deleted, and
/// the history is lost. Before the fix the stored index (written at most
/// every 5 s) still had X = A and no W: the successor's relist found X
/// equal to it and W unknown, and the apps kept B and W's configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_and_a_deletion_in_a_gap_past_the_history_reach_the_apps() {
    let _alone = ALONE.lock().await;
    let c = cluster().await;
    let w_app = Pod::start().await;
    service(&c.client, "shop", "w", &[&w_app], &[]).await;
    let a = Replica::start(&c.kubeconfig, &c.manifest, "replica-a");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    set(&c.cms, "orders", "B").await;
    set(&c.cms, "billing", "B").await;
    let w = c
        .cms
        .create(&PostParams::default(), &config_map("w", "1"))
        .await
        .unwrap();
    let rv_w: u64 = w.metadata.resource_version.unwrap().parse().unwrap();
    eventually(Duration::from_secs(10), "B and W delivered", || async {
        orders_hits(&c) == vec![1, 1] && c.billing.hits(REFRESH) == 1 && w_app.hits(REFRESH) == 1
    })
    .await;
    eventually(
        Duration::from_secs(10),
        "checkpoint saved past W",
        || async {
            checkpoint(&c.client, "shop")
                .await
                .is_some_and(|rv| rv >= rv_w)
        },
    )
    .await;
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();

    set(&c.cms, "orders", "1").await; // back to A
    set(&c.cms, "billing", "C").await;
    c.cms.delete("w", &DeleteParams::default()).await.unwrap();
    c.server.faults().compact_history();

    let b = Replica::start(&c.kubeconfig, &c.manifest, "replica-b");
    eventually(Duration::from_secs(15), "replica-b leads", || b.leading()).await;
    eventually(Duration::from_secs(10), "the gap delivered", || async {
        orders_hits(&c) == vec![2, 2] && c.billing.hits(REFRESH) == 2 && w_app.hits(REFRESH) == 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(orders_hits(&c), vec![2, 2], "the revert, once");
    assert_eq!(c.billing.hits(REFRESH), 2);
    assert_eq!(w_app.hits(REFRESH), 2, "W's deletion, once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_old_leader_that_wakes_after_a_successor_took_over_does_nothing() {
    let _alone = ALONE.lock().await;
    let c = cluster().await;
    let a = Replica::start(&c.kubeconfig, &c.manifest, "replica-a");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    let b = Replica::start(&c.kubeconfig, &c.manifest, "replica-b");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes_before = a
        .metric("wasmwatch_checkpoint_writes_total{outcome=\"ok\"}")
        .await;

    // Paused (a GC pause, a stalled node): its watch still buffers events.
    a.signal("STOP");
    set(&c.cms, "orders", "2").await;
    eventually(Duration::from_secs(15), "replica-b leads", || b.leading()).await;
    eventually(Duration::from_secs(10), "replica-b refreshed", || async {
        orders_hits(&c) == vec![1, 1]
    })
    .await;
    let state: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.client.clone(), "default");
    let term_of = |l: k8s_openapi::api::coordination::v1::Lease| {
        l.metadata.annotations.unwrap_or_default()["wasmwatch.io/term"].clone()
    };
    let term = term_of(state.get("wasmwatch-state").await.unwrap());
    assert!(term.starts_with("replica-b/"), "{term}");

    // It wakes up, reads the buffered change, and must not act on it. Its
    // /leader answers from the fence: false from the first moment, before
    // its elector has run (the sidecar's apps act on it).
    a.signal("CONT");
    for _ in 0..50 {
        assert!(!a.leading().await, "/leader said true after waking");
    }
    eventually(
        Duration::from_secs(5),
        "replica-a knows it does not lead",
        || async { !a.leading().await },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(orders_hits(&c), vec![1, 1], "exactly once, by replica-b");
    assert_eq!(
        a.metric("wasmwatch_actions_total{type=\"refreshService\",outcome=\"done\"}")
            .await,
        0.0,
        "the woken leader executed nothing"
    );
    assert_eq!(
        a.metric("wasmwatch_checkpoint_writes_total{outcome=\"ok\"}")
            .await,
        writes_before,
        "and wrote no checkpoint"
    );
    assert_eq!(term_of(state.get("wasmwatch-state").await.unwrap()), term);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_longer_than_the_renew_deadline_stops_the_leader_then_it_recovers() {
    let _alone = ALONE.lock().await;
    let c = cluster().await;
    let a = Replica::start(&c.kubeconfig, &c.manifest, "replica-a");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    let b = Replica::start(&c.kubeconfig, &c.manifest, "replica-b");
    tokio::time::sleep(Duration::from_secs(1)).await;

    let faults = c.server.faults().clone();
    let outage =
        tokio::spawn(async move { faults.refuse_connections(Duration::from_secs(4)).await });
    // The renew deadline is 2 s, the lease 3 s: it stops before it could expire.
    let stopped = eventually(
        Duration::from_millis(2900),
        "replica-a stops leading",
        || async { !a.leading().await },
    )
    .await;
    outage.await.unwrap();
    eventually(Duration::from_secs(15), "someone leads again", || async {
        a.leading().await || b.leading().await
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    set(&c.cms, "orders", "2").await;
    eventually(
        Duration::from_secs(10),
        "refreshed after the outage",
        || async { orders_hits(&c) == vec![1, 1] },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(orders_hits(&c), vec![1, 1], "exactly once");
    eprintln!("API outage: leader stopped acting {stopped:?} after it began");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_leader_stores_its_baseline_before_handling_changes() {
    let _alone = ALONE.lock().await;
    let c = cluster().await;
    // Checkpoints batched every 60 s: only the baseline is written at once.
    let a = Replica::start_with(&c.kubeconfig, &c.manifest, "replica-a", "60s");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    let took = eventually(
        Duration::from_secs(3),
        "the baseline checkpoint",
        || async { checkpoint(&c.client, "shop").await.is_some() },
    )
    .await;
    // Killed right after a change: the successor resumes from the baseline
    // and delivers it, rather than taking a baseline that hides it.
    let b = Replica::start(&c.kubeconfig, &c.manifest, "replica-b");
    set(&c.cms, "orders", "2").await;
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    eventually(Duration::from_secs(15), "replica-b leads", || b.leading()).await;
    eventually(
        Duration::from_secs(10),
        "the change is delivered",
        || async { orders_hits(&c).iter().all(|h| *h >= 1) },
    )
    .await;
    eprintln!("baseline checkpoint stored {took:?} after leading");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_state_lease_makes_the_leader_deliver_everything_once_and_repair_it() {
    let _alone = ALONE.lock().await;
    let c = cluster().await;
    // A hand-edited state Lease: a checkpoint and a term nobody can read.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.client.clone(), "default");
    let state = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "wasmwatch-state", "annotations": {
            "wasmwatch.io/configmap-resource-version": "shop=12,oops",
            "wasmwatch.io/term": "garbage",
        }}
    }))
    .unwrap();
    leases.create(&PostParams::default(), &state).await.unwrap();

    // Nobody can tell which changes were handled: every watched ConfigMap
    // is delivered once (orders and billing), as a replay.
    let a = Replica::start(&c.kubeconfig, &c.manifest, "replica-a");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    eventually(
        Duration::from_secs(10),
        "every app refreshed once",
        || async { orders_hits(&c) == vec![1, 1] && c.billing.hits(REFRESH) == 1 },
    )
    .await;
    // The operator is told on the state Lease itself.
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(c.client.clone(), "default");
    let warning = eventually(Duration::from_secs(5), "StateUnreadable Event", || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("StateUnreadable")
                    && e.type_.as_deref() == Some("Warning")
                    && e.involved_object.kind.as_deref() == Some("Lease")
                    && e.involved_object.name.as_deref() == Some("wasmwatch-state")
            })
    })
    .await;
    let message = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("StateUnreadable"))
        .and_then(|e| e.message)
        .unwrap();
    assert!(
        message.contains(
            "wasmwatch.io/configmap-resource-version: invalid entry \"oops\", expected namespace=resourceVersion; every ConfigMap is delivered once"
        ) && message.contains("wasmwatch.io/term: cannot read \"garbage\""),
        "{message}"
    );
    // The state is repaired: a readable checkpoint past every object.
    let rv = set(&c.cms, "orders", "2").await;
    eventually(Duration::from_secs(10), "the next change, once", || async {
        orders_hits(&c) == vec![2, 2]
    })
    .await;
    eventually(Duration::from_secs(5), "a readable checkpoint", || async {
        checkpoint(&c.client, "shop").await.is_some_and(|v| v >= rv)
    })
    .await;
    assert_eq!(c.billing.hits(REFRESH), 1, "billing did not change again");

    // A successor resumes from the repaired state: nothing is delivered again.
    let b = Replica::start(&c.kubeconfig, &c.manifest, "replica-b");
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    eventually(Duration::from_secs(15), "replica-b leads", || b.leading()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        orders_hits(&c),
        vec![2, 2],
        "nothing redelivered after repair"
    );
    assert_eq!(c.billing.hits(REFRESH), 1);
    eprintln!("StateUnreadable Event after {warning:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_baseline_write_that_fails_is_retried_before_any_change_is_handled() {
    let _alone = ALONE.lock().await;
    let c = cluster().await;
    // The first three writes of a ConfigMap checkpoint fail with a 500
    // (the claim, which writes only the term, goes through).
    c.server
        .faults()
        .fail_replaces_where("leases", "default", "wasmwatch-state", 3, |lease| {
            lease
                .pointer("/metadata/annotations/wasmwatch.io~1configmap-resource-version")
                .is_some()
        });
    // Checkpoints batched every 60 s: only the baseline is written early.
    let a = Replica::start_with(&c.kubeconfig, &c.manifest, "replica-a", "60s");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    let took = eventually(
        Duration::from_secs(10),
        "the baseline stored despite the failures",
        || async { checkpoint(&c.client, "shop").await.is_some() },
    )
    .await;
    assert_eq!(c.server.faults().replace_failures_left(), 0);
    set(&c.cms, "orders", "2").await;
    eventually(Duration::from_secs(10), "first refresh", || async {
        orders_hits(&c) == vec![1, 1]
    })
    .await;

    // Killed; a change in the gap reaches the successor, which resumes from
    // the baseline (a successor finding none would take a baseline of its
    // own after the change and never deliver it).
    let b = Replica::start(&c.kubeconfig, &c.manifest, "replica-b");
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    set(&c.cms, "orders", "3").await;
    eventually(Duration::from_secs(15), "replica-b leads", || b.leading()).await;
    eventually(
        Duration::from_secs(10),
        "the change made in the gap is delivered",
        || async { orders_hits(&c).iter().all(|h| *h >= 2) },
    )
    .await;
    eprintln!("baseline stored {took:?} after leading, after 3 failed writes");
}

/// Issue 32: saves refused for good (here a 403 on every write of the state
/// Lease) are told where operators look: the failures in a row and the age
/// of the last stored state on /metrics, and a Warning Event on the state
/// Lease naming the cause. Changes are still delivered meanwhile, and once
/// the writes are allowed again the state catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saves_that_keep_failing_are_reported_on_the_state_lease_and_in_the_metrics() {
    use wasmwatch_apiserver::{FaultAnswer, RequestFault};
    let _alone = ALONE.lock().await;
    let c = cluster().await;
    let a = Replica::start(&c.kubeconfig, &c.manifest, "replica-a");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    eventually(Duration::from_secs(10), "a checkpoint", || async {
        checkpoint(&c.client, "shop").await.is_some()
    })
    .await;
    let before = orders_hits(&c);
    for _ in 0..1000 {
        c.server.faults().fail_nth(RequestFault {
            verb: Some("update".into()),
            resource: "leases".into(),
            namespace: Some("default".into()),
            name_prefix: Some("wasmwatch-state".into()),
            skip: 0,
            answer: FaultAnswer::Status(403),
        });
    }
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(c.client.clone(), "default");
    let warning = || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("CheckpointSaveFailed")
                    && e.type_.as_deref() == Some("Warning")
                    && e.involved_object.name.as_deref() == Some("wasmwatch-state")
            })
            .and_then(|e| e.message)
    };
    let mut n = 1;
    eventually(
        Duration::from_secs(20),
        "a CheckpointSaveFailed Event",
        || {
            n += 1;
            let value = n.to_string();
            let cms = c.cms.clone();
            let warning = warning();
            async move {
                set(&cms, "orders", &value).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                warning.await.is_some()
            }
        },
    )
    .await;
    let message = warning().await.unwrap();
    assert!(
        message.contains("saves of the checkpoints and index failed in a row")
            && message.contains("is forbidden")
            && message.contains("(RBAC:"),
        "{message}"
    );
    assert!(a.metric("wasmwatch_checkpoint_save_failures").await >= 3.0);
    eventually(
        Duration::from_secs(5),
        "the age of the stored state grows",
        || async { a.metric("wasmwatch_checkpoint_save_age_seconds").await >= 1.0 },
    )
    .await;
    // Changes are delivered all the same.
    eventually(Duration::from_secs(10), "the changes refreshed", || async {
        orders_hits(&c).iter().zip(&before).all(|(h, b)| h > b)
    })
    .await;
    // Allowed again: the state catches up, the metrics say so.
    c.server.faults().reset();
    let rv = set(&c.cms, "orders", "last").await;
    eventually(
        Duration::from_secs(10),
        "the checkpoint catches up",
        || async { checkpoint(&c.client, "shop").await.is_some_and(|v| v >= rv) },
    )
    .await;
    eventually(Duration::from_secs(5), "no failures in a row", || async {
        a.metric("wasmwatch_checkpoint_save_failures").await == 0.0
    })
    .await;
}

/// Issue 32: an object created and delivered shortly before its leader is
/// killed (well within a checkpoint interval, so no periodic save has it),
/// then deleted while nobody leads, past the history. Before, the stored
/// index did not know it: the successor's 410 relist saw no deletion and
/// the app kept the created configuration for good. Now the creation's
/// actions wait until an index with the object is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_created_just_before_a_kill_then_deleted_in_a_gap_past_the_history_is_deleted() {
    let _alone = ALONE.lock().await;
    let c = cluster().await;
    let w_app = Pod::start().await;
    service(&c.client, "shop", "w", &[&w_app], &[]).await;
    // Saves every 30 s: none falls between the creation and the kill.
    let a = Replica::start_with(&c.kubeconfig, &c.manifest, "replica-a", "30s");
    eventually(Duration::from_secs(10), "replica-a leads", || a.leading()).await;
    eventually(Duration::from_secs(10), "a baseline checkpoint", || async {
        checkpoint(&c.client, "shop").await.is_some()
    })
    .await;
    let base = checkpoint(&c.client, "shop").await.unwrap();
    c.cms
        .create(&PostParams::default(), &config_map("w", "1"))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "W's creation delivered",
        || async { w_app.hits(REFRESH) == 1 },
    )
    .await;
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    assert_eq!(
        checkpoint(&c.client, "shop").await,
        Some(base),
        "the checkpoint is still before the creation"
    );

    c.cms.delete("w", &DeleteParams::default()).await.unwrap();
    c.server.faults().compact_history();
    let b = Replica::start_with(&c.kubeconfig, &c.manifest, "replica-b", "30s");
    eventually(Duration::from_secs(15), "replica-b leads", || b.leading()).await;
    eventually(
        Duration::from_secs(10),
        "W's deletion delivered",
        || async { w_app.hits(REFRESH) == 2 },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(w_app.hits(REFRESH), 2, "once");
    assert_eq!(orders_hits(&c), vec![0, 0], "nothing else");
    assert_eq!(c.billing.hits(REFRESH), 0);
}
