//! Issue 20's scope, as Stakater Reloader's flags give it, end to end:
//! `wasmwatch run` against the test API server, the bundled rollout-restart
//! restarting a Deployment per namespace.
//! - `watch.ignoreNamespaces` (`--namespaces-to-ignore`): the API server
//!   leaves the namespace's objects out of the watch, nothing there restarts;
//! - `watch.namespaceSelector` (`--namespace-selector`, here in Reloader's
//!   legacy `k:v` form): a namespace labelled after the start (with
//!   kubectl) is in scope from then on, one unlabelled leaves it, with no
//!   restart of wasmwatch; an object already in a namespace that comes into
//!   scope is delivered at its next change, not before.
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use wasmwatch_core::DataValue;
use wasmwatch_core::digest::data_digest;

fn manifest(watch: &str) -> String {
    format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {watch}
ha: {{enabled: false}}
plugins:
  - name: rollout-restart
    module: {{module:rollout-restart}}
    sha256: {{sha256:rollout-restart}}
    events: {{kinds: [ConfigMap]}}
    capabilities: {{restart: [\"*\"], events: true}}
    delivery: {{debounce: 0s, retries: 3, backoffInitial: 100ms, backoffMax: 1s}}
"
    )
}

/// Namespace `ns` with `labels`, a ConfigMap `settings` (`v: 1`) and a
/// Deployment `orders` using it, annotated `reloader.stakater.com/auto`.
async fn shop_in(c: &kube::Client, ns: &str, labels: serde_json::Value) {
    if ns != "shop" {
        apply(
            c,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": labels}}),
        )
        .await;
    } else {
        let api: Api<Namespace> = Api::all(c.clone());
        let patch = serde_json::json!({"metadata": {"labels": labels}});
        api.patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "settings"}, "data": {"v": "1"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    workload(
        c,
        ns,
        "Deployment",
        "orders",
        serde_json::json!({"reloader.stakater.com/auto": "true"}),
        serde_json::json!({}),
        serde_json::json!({"containers": [{"name": "app", "image": "example/app:1",
            "envFrom": [{"configMapRef": {"name": "settings"}}]}]}),
    )
    .await;
}

/// Sets `settings`' value in `ns`.
async fn change(c: &kube::Client, ns: &str, v: &str) {
    let patch = serde_json::json!({"data": {"v": v}});
    Api::<ConfigMap>::namespaced(c.clone(), ns)
        .patch("settings", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The hash of `settings` on `orders`' pod template in `ns`, if any.
async fn recorded(c: &kube::Client, ns: &str) -> Option<String> {
    let d = Api::<Deployment>::namespaced(c.clone(), ns)
        .get("orders")
        .await
        .unwrap();
    d.spec
        .template
        .metadata
        .and_then(|m| m.annotations)
        .and_then(|a| {
            a.get("config-hash.wasmwatch.io/configmap.settings")
                .cloned()
        })
}

/// The hash rollout-restart records for `settings` holding `v`.
fn hash(v: &str) -> String {
    let data = BTreeMap::from([("v".to_string(), DataValue::Text(v.to_string()))]);
    format!("configmap/settings:{}", data_digest(&data, None))
}

/// A replica, once its watches are open: the lookups' eight, the
/// ConfigMaps', and `more` (the Namespaces' with a selector).
async fn start(e: &TestEnv, more: usize) -> Replica {
    replica_watching(e, 9 + more).await
}

/// `kubectl label namespace NS CHANGE --overwrite` (`k=v`, or `k-` to
/// remove), with the kube client when kubectl is not installed.
async fn label(e: &TestEnv, ns: &str, change: &str) {
    let kubectl = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("kubectl"))
            .find(|p| p.is_file())
    });
    if let Some(kubectl) = kubectl {
        let out = std::process::Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(&e.kubeconfig)
            .args(["label", "namespace", ns, change, "--overwrite"])
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl label namespace {ns} {change}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let labels = match change.split_once('=') {
        Some((k, v)) => serde_json::json!({k: v}),
        None => serde_json::json!({change.trim_end_matches('-'): null}),
    };
    let patch = serde_json::json!({"metadata": {"labels": labels}});
    Api::<Namespace>::all(e.client.clone())
        .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Changes `settings` in `ns` (a namespace just labelled) until a change
/// restarts `orders`: then wasmwatch has seen the label, and every
/// Namespace event before it. Returns the value last set.
async fn until_delivered(c: &kube::Client, ns: &str, first: u32) -> String {
    let mut n = first;
    loop {
        let v = n.to_string();
        change(c, ns, &v).await;
        for _ in 0..25 {
            if recorded(c, ns).await == Some(hash(&v)) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        n += 1;
        assert!(n < first + 15, "{ns} never came into scope");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ignored_namespace_is_left_out_by_the_api_server_and_never_restarts() {
    let e = test_env(
        &manifest("{kinds: [ConfigMap], ignoreNamespaces: [legacy, kube-system]}"),
        "shop",
    )
    .await;
    let c = &e.client;
    shop_in(c, "shop", serde_json::json!({})).await;
    shop_in(c, "legacy", serde_json::json!({})).await;
    let replica = start(&e, 0).await;
    let received = "wasmwatch_events_received_total{kind=\"ConfigMap\"}";
    let before = replica.metric(received).await;

    // legacy's change first: had the watch carried it, it would be
    // received before shop's.
    change(c, "legacy", "2").await;
    change(c, "shop", "2").await;
    eventually(Duration::from_secs(10), "shop restarted", || async {
        recorded(c, "shop").await == Some(hash("2"))
    })
    .await;
    assert_eq!(recorded(c, "legacy").await, None, "legacy restarted");
    assert_eq!(
        replica.metric(received).await,
        before + 1.0,
        "only shop's change reached wasmwatch: the API server filtered legacy's"
    );
    drop(replica);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_labelled_after_the_start_come_into_scope_and_unlabelled_ones_leave() {
    // Reloader's legacy form of `reloader=enabled`.
    let e = test_env(
        &manifest("{kinds: [ConfigMap], namespaceSelector: \"reloader:enabled\"}"),
        "shop",
    )
    .await;
    let c = &e.client;
    shop_in(c, "shop", serde_json::json!({"reloader": "enabled"})).await;
    for ns in ["billing", "probe", "late"] {
        shop_in(c, ns, serde_json::json!({})).await;
    }
    let replica = start(&e, 1).await;

    // Only shop is in scope. billing's change comes first in the
    // ConfigMaps' watch: once shop's is handled, billing's was dropped.
    change(c, "billing", "2").await;
    change(c, "shop", "2").await;
    eventually(Duration::from_secs(10), "shop restarted", || async {
        recorded(c, "shop").await == Some(hash("2"))
    })
    .await;
    assert_eq!(recorded(c, "billing").await, None);

    // billing, then probe, gain the label; wasmwatch keeps running. Once a
    // change in probe restarts it, billing's label was seen too.
    label(&e, "billing", "reloader=enabled").await;
    label(&e, "probe", "reloader=enabled").await;
    until_delivered(c, "probe", 2).await;
    // billing's ConfigMap, changed while out of scope, is not delivered
    // now that billing is in scope (as in Reloader) ...
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(recorded(c, "billing").await, None);
    // ... its next change is.
    change(c, "billing", "3").await;
    eventually(Duration::from_secs(10), "billing restarted", || async {
        recorded(c, "billing").await == Some(hash("3"))
    })
    .await;

    // shop loses the label; late gains it after: once late is in scope,
    // shop's removal was seen.
    label(&e, "shop", "reloader-").await;
    label(&e, "late", "reloader=enabled").await;
    until_delivered(c, "late", 2).await;
    // shop's change comes before billing's: once billing's is handled,
    // shop's was dropped.
    change(c, "shop", "4").await;
    change(c, "billing", "4").await;
    eventually(
        Duration::from_secs(10),
        "billing restarted again",
        || async { recorded(c, "billing").await == Some(hash("4")) },
    )
    .await;
    assert_eq!(
        recorded(c, "shop").await,
        Some(hash("2")),
        "shop out of scope"
    );
    drop(replica);
}
