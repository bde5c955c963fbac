//! A blocked plugin inside the real service (`wasmwatch run` against the
//! test API server): it delays neither another plugin's refresh nor the
//! leader's shutdown (save, release).
mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const NS: &str = "shop";

/// The blocker comes first: before concurrent dispatch, every change
/// waited for its 20 s sleep before http-refresh was even asked.
const MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: true, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s}
plugins:
  - name: blocker
    module: {module:misbehave}
    sha256: {sha256:misbehave}
    events: {kinds: [ConfigMap]}
    config: {mode: sleep}
    limits: {timeout: 20s}
    delivery: {retries: 0}
  - name: http-refresh
    module: {module:http-refresh}
    sha256: {sha256:http-refresh}
    events: {kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}
    capabilities: {refresh: [shop]}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_plugin_delays_neither_another_plugins_refresh_nor_shutdown() {
    let (env, pod, replica) = leading(MANIFEST).await;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), NS);
    for (round, value) in ["hi", "hey"].into_iter().enumerate() {
        cms.patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"greeting": value}})),
        )
        .await
        .unwrap();
        let took = eventually(
            Duration::from_secs(10),
            "the refresh arrives while the blocker sleeps",
            || async { pod.hits(REFRESH) > round },
        )
        .await;
        assert!(
            took < Duration::from_secs(2),
            "refresh {round} took {took:?}"
        );
    }

    // The blocker is still in its calls: SIGTERM ends the leader at once,
    // and it still releases the Lease.
    let start = Instant::now();
    replica.signal("TERM");
    let status = tokio::task::spawn_blocking(move || {
        let mut replica = replica;
        let status = replica.child.wait().unwrap();
        (status, start.elapsed())
    })
    .await
    .unwrap();
    assert!(status.0.success(), "{:?}", status.0);
    assert!(
        status.1 < Duration::from_secs(1),
        "exit took {:?}",
        status.1
    );
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "default");
    let lease = leases.get("wasmwatch-leader").await.unwrap();
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert_eq!(holder, "", "the Lease is released");
}

/// A plugin whose every call fails, beside one that works.
const FAILING_MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: true, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s}
plugins:
  - name: failer
    module: {module:misbehave}
    sha256: {sha256:misbehave}
    events: {kinds: [ConfigMap]}
    config: {mode: error}
    capabilities: {events: true}
    delivery: {retries: 2, backoffInitial: 50ms, backoffMax: 100ms}
  - name: http-refresh
    module: {module:http-refresh}
    sha256: {sha256:http-refresh}
    events: {kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}
    capabilities: {refresh: [shop]}
";

/// The decide stage's dead letter (`decide::Decide::settle`): a plugin call
/// that fails through its retries is dead-lettered with a Warning Event on
/// the object, it finishes its change (the checkpoint passes it), and it
/// releases its turn (the next change of the object is decided again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_failing_for_good_is_dead_lettered_and_holds_neither_the_checkpoint_nor_the_next_change()
 {
    let (env, pod, replica) = leading(FAILING_MANIFEST).await;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), NS);
    let failed = "wasmwatch_plugin_invocations_total{plugin=\"failer\",outcome=\"error\"}";
    for (round, value) in ["hi", "hey"].into_iter().enumerate() {
        let patched = cms
            .patch(
                "orders",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"greeting": value}})),
            )
            .await
            .unwrap();
        let rv: u64 = patched.metadata.resource_version.unwrap().parse().unwrap();
        eventually(Duration::from_secs(10), "the refresh arrives", || async {
            pod.hits(REFRESH) > round
        })
        .await;
        // Three calls (one and two retries) for this change: the previous
        // change's dead letter released the object's turn.
        eventually(
            Duration::from_secs(10),
            "every attempt of this change",
            || async { replica.metric(failed).await == 3.0 * (round + 1) as f64 },
        )
        .await;
        eventually(
            Duration::from_secs(10),
            "the checkpoint passes the dead-lettered change",
            || async { checkpoint(&env.client, NS).await.is_some_and(|c| c >= rv) },
        )
        .await;
    }
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(env.client.clone(), NS);
    let warned = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some("PluginFailed")
                && e.involved_object.name.as_deref() == Some("orders")
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.contains("plugin failer failed"))
        })
        .count();
    assert!(warned >= 1, "a Warning Event names the failing plugin");
    assert_eq!(
        replica.metric(failed).await,
        6.0,
        "no call after the dead letters"
    );
    drop(replica);
}

/// `manifest` run by one replica, r0, over `shop/orders` (a labelled
/// ConfigMap) and its app: r0 leads and its baseline is saved.
async fn leading(manifest: &str) -> (TestEnv, Pod, Replica) {
    let env = test_env(manifest, NS).await;
    let pod = Pod::start().await;
    service(&env.client, NS, "orders", &[&pod], &[]).await;
    apply(
        &env.client,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "orders", "namespace": NS,
                "labels": {"spring.cloud.kubernetes.config": "true"}},
            "data": {"greeting": "hello"}}),
    )
    .await;
    let (k, m) = (env.kubeconfig.clone(), env.manifest.clone());
    let replica = tokio::task::spawn_blocking(move || Replica::start(&k, &m, "r0"))
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "r0 leads", || replica.leading()).await;
    // Its ConfigMap watch has taken its baseline (saved at once).
    eventually(
        Duration::from_secs(20),
        "the baseline checkpoint",
        || async { checkpoint(&env.client, NS).await.is_some() },
    )
    .await;
    (env, pod, replica)
}
