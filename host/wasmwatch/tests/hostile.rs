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
    let env = test_env(MANIFEST, NS).await;
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
