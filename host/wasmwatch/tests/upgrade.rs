//! Issue 32: an upgrade from the version before segments and a rollback to
//! it, with the real previous binary: nothing restarts by itself, nothing
//! is lost. The previous version stored its index in shards it wrote over
//! one by one (format 1); this one stores segments named by the state Lease.
//!
//! It runs when `WASMWATCH_PREVIOUS` names that version's binary;
//! `tests/previous-version` builds it (commit b067761, the last before
//! segments) and prints the path. Without it the test says so and passes:
//! the rule it checks end to end is also checked against the test API
//! server by host/kube's
//! `after_a_rollback_and_back_the_shards_of_the_old_version_win_over_the_stale_log`,
//! which runs everywhere.
mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

const MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: true, namespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms}
plugins:
  # A WIT 0.3.0 plugin, which the previous version loads too (the bundled
  # rollout-restart is 0.4.0): it restarts every workload referencing a
  # changed, created or deleted ConfigMap, once per content.
  - name: v3-restart
    module: {module:v3-restart}
    sha256: {sha256:v3-restart}
    events: {kinds: [ConfigMap]}
    capabilities: {restart: [shop]}
    delivery: {debounce: 0s, retries: 3, backoffInitial: 100ms, backoffMax: 1s}
";

/// (generation, pod-template annotations) of Deployment `shop/orders`.
async fn orders(client: &kube::Client) -> (i64, serde_json::Value) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), "shop");
    let d = api.get("orders").await.unwrap();
    let generation = d.metadata.generation.unwrap();
    let d = serde_json::to_value(d).unwrap();
    (
        generation,
        d.pointer("/spec/template/metadata/annotations")
            .cloned()
            .unwrap_or_default(),
    )
}

fn hash_of(annotations: &serde_json::Value, name: &str) -> Option<String> {
    annotations[format!("config-hash.wasmwatch.io/configmap.{name}")]
        .as_str()
        .map(str::to_string)
}

async fn state_annotation(client: &kube::Client, key: &str) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "default");
    api.get_opt("wasmwatch-state")
        .await
        .unwrap()?
        .metadata
        .annotations?
        .get(key)
        .cloned()
}

async fn set(cms: &Api<ConfigMap>, name: &str, value: &str) -> u64 {
    let patch = serde_json::json!({"data": {"v": value}});
    cms.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap()
}

fn previous(e: &TestEnv, identity: &str, bin: &std::path::Path) -> Replica {
    let mut cmd = run_command_of(
        bin,
        &e.kubeconfig,
        &e.manifest,
        identity,
        "200ms",
        "default",
    );
    Replica::spawn(&mut cmd, identity, Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_and_a_rollback_and_back_restart_nothing_and_lose_no_deletion() {
    let Some(bin) = std::env::var_os("WASMWATCH_PREVIOUS") else {
        eprintln!(
            "skipped: WASMWATCH_PREVIOUS is not set (tests/previous-version builds the version before segments)"
        );
        return;
    };
    let bin = std::path::PathBuf::from(bin);
    let e = test_env(MANIFEST, "shop").await;
    let c = &e.client;
    namespace(c, "elsewhere").await;
    workload(
        c,
        "shop",
        "Deployment",
        "orders",
        serde_json::json!({"reloader.stakater.com/auto": "true"}),
        serde_json::json!({}),
        serde_json::json!({"containers": [{"name": "app", "image": "example/app:1",
            "envFrom": [{"configMapRef": {"name": "a"}},
                        {"configMapRef": {"name": "b"}},
                        {"configMapRef": {"name": "x", "optional": true}}]}]}),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "shop");
    for name in ["a", "b"] {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}, "data": {"v": "1"}
        }))
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }

    // 1. The previous version leads first, then this one takes over: the
    //    upgrade restarts nothing.
    let old = previous(&e, "old-1", &bin);
    eventually(
        Duration::from_secs(15),
        "the previous version leads",
        || old.leading(),
    )
    .await;
    eventually(Duration::from_secs(10), "its baseline", || async {
        checkpoint(c, "shop").await.is_some()
            && state_annotation(c, "wasmwatch.io/configmap-index-shards")
                .await
                .is_some()
    })
    .await;
    let start = orders(c).await;
    old.signal("TERM");
    let new = Replica::start(&e.kubeconfig, &e.manifest, "new-1");
    eventually(Duration::from_secs(15), "this version leads", || {
        new.leading()
    })
    .await;
    eventually(Duration::from_secs(10), "the index as segments", || async {
        state_annotation(c, "wasmwatch.io/index-log")
            .await
            .is_some()
            && state_annotation(c, "wasmwatch.io/configmap-index-shards")
                .await
                .is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(orders(c).await, start, "the upgrade restarted nothing");

    // 2. Rollback: the previous version leads again. It finds no shard
    //    count (this version dropped it) and lists: nothing restarts. Then
    //    it handles a change of a and the creation of x, and stores them in
    //    its shards; the stale segment log stays beside them (it keeps the
    //    annotations it does not know).
    new.signal("TERM");
    let old = previous(&e, "old-2", &bin);
    eventually(
        Duration::from_secs(15),
        "the previous version leads again",
        || old.leading(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(orders(c).await, start, "the rollback restarted nothing");
    let rv_a = set(&cms, "a", "2").await;
    let x: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "x"}, "data": {"v": "1"}
    }))
    .unwrap();
    let rv_x: u64 = cms
        .create(&PostParams::default(), &x)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "a and x restart orders",
        || async {
            let (_, t) = orders(c).await;
            hash_of(&t, "a") != hash_of(&start.1, "a") && hash_of(&t, "x").is_some()
        },
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the previous version's checkpoint",
        || async {
            checkpoint(c, "shop")
                .await
                .is_some_and(|v| v >= rv_x.max(rv_a))
        },
    )
    .await;
    assert!(
        state_annotation(c, "wasmwatch.io/index-log")
            .await
            .is_some()
            && state_annotation(c, "wasmwatch.io/configmap-index-shards")
                .await
                .is_some(),
        "the stale log stays beside the previous version's shards"
    );
    // Its index is saved with its checkpoints, every round.
    tokio::time::sleep(Duration::from_millis(600)).await;
    old.signal("TERM");
    let _ = tokio::task::spawn_blocking(move || {
        let mut old = old;
        let _ = old.child.wait();
    })
    .await;
    let before = orders(c).await;

    // 3. While nobody leads, x is deleted and the history is lost (410).
    cms.delete("x", &DeleteParams::default()).await.unwrap();
    e.server.faults().compact_history();

    // 4. This version again: it reads the previous version's shards, not
    //    the stale segments (which never held x), so x's deletion found by
    //    the relist reaches the plugin: one restart, nothing else.
    let new = Replica::start(&e.kubeconfig, &e.manifest, "new-2");
    eventually(Duration::from_secs(15), "this version leads again", || {
        new.leading()
    })
    .await;
    eventually(
        Duration::from_secs(20),
        "x's deletion restarts orders",
        || async { hash_of(&orders(c).await.1, "x").is_some_and(|h| h.ends_with(":deleted")) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (generation, template) = orders(c).await;
    assert_eq!(generation, before.0 + 1, "one restart: x's deletion");
    assert_eq!(hash_of(&template, "a"), hash_of(&before.1, "a"));
    assert_eq!(hash_of(&template, "b"), hash_of(&start.1, "b"));
    // The stale segments and the shards are deleted after its first save.
    let leases: Api<Lease> = Api::namespaced(c.clone(), "default");
    eventually(
        Duration::from_secs(10),
        "only named segments left",
        || async {
            let log = state_annotation(c, "wasmwatch.io/index-log").await;
            let named: Vec<String> = log
                .map(|l| {
                    wasmwatch_kube::checkpoint::Log::parse(&l)
                        .unwrap()
                        .segments
                        .iter()
                        .map(|&n| wasmwatch_kube::checkpoint::segment_name("wasmwatch-state", n))
                        .collect()
                })
                .unwrap_or_default();
            let all: Vec<String> = leases
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|l| l.metadata.name)
                .filter(|n| n.starts_with("wasmwatch-state-"))
                .collect();
            all.iter().all(|n| named.contains(n))
        },
    )
    .await;
}
