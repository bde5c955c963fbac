//! `wasmwatch run --dry-run` as a process against the test API server: real
//! watches, a real plugin, decisions printed as JSON lines.
mod common;

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use wasmwatch_apiserver::{Config, Server};
use wasmwatch_testkit::pin;

fn cm(name: &str, labels: serde_json::Value, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels}, "data": {"v": value}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_shows_what_the_plugins_decide_for_each_selected_change() {
    let server = Server::start(Config::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let manifest = dir.path().join("manifest.yaml");
    std::fs::write(
        &manifest,
        pin("apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {namespaces: [default]}
plugins:
  - name: seen
    module: {module:misbehave}
    sha256: {sha256:misbehave}
    config: {mode: ok, only_label: watch}
    events: {kinds: [ConfigMap]}
    capabilities: {events: true}
"),
    )
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(server.client().unwrap(), "default");
    api.create(
        &PostParams::default(),
        &cm("a", serde_json::json!({"watch": "me"}), "1"),
    )
    .await
    .unwrap();

    let (mut child, ready, lines_rx) = common::spawn_ready(
        Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
            .args(["run", "--dry-run", "--manifest", manifest.to_str().unwrap()])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn"),
        Duration::from_secs(30),
    );
    assert_eq!(ready["watches"], 2, "ConfigMaps and Secrets in `default`");
    server.wait_for_watches(2).await;

    // Baseline delivered nothing; now: a modification, a creation the
    // plugin's prefilter rejects, a creation.
    let mut a = api.get("a").await.unwrap();
    a.data.as_mut().unwrap().insert("v".into(), "2".into());
    api.replace("a", &PostParams::default(), &a).await.unwrap();
    api.create(&PostParams::default(), &cm("b", serde_json::json!({}), "1"))
        .await
        .unwrap();
    api.create(
        &PostParams::default(),
        &cm("c", serde_json::json!({"watch": "me"}), "1"),
    )
    .await
    .unwrap();

    let mut seen = Vec::new();
    let mut skipped = Vec::new();
    while seen.len() + skipped.len() < 3 {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a decision line");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if let Some(why) = v["skipped"].as_str() {
            // The plugin's prefilter (`label:watch`, from its config):
            // shown, not called (issue 35).
            assert_eq!(v["plugin"], "seen", "{line}");
            assert_eq!(
                why, "fails the plugin's prefilter label:watch: not called",
                "{line}"
            );
            skipped.push(v["object"].as_str().unwrap().to_string());
            continue;
        }
        assert_eq!(v["decision"]["plugin"], "seen", "{line}");
        let action = &v["decision"]["actions"][0];
        assert_eq!(action["verdict"], "allowed", "{line}");
        seen.push((
            v["object"].as_str().unwrap().to_string(),
            v["change"].as_str().unwrap().to_string(),
        ));
        assert_eq!(action["action"]["message"], v["object"], "{line}");
    }
    assert_eq!(
        seen,
        vec![
            ("default/a".to_string(), "modified".to_string()),
            ("default/c".to_string(), "added".to_string())
        ],
        "b fails the plugin's prefilter"
    );
    assert_eq!(skipped, vec!["default/b".to_string()]);
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn run_with_a_missing_manifest_names_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
        .args(["run", "--manifest", "/nonexistent.yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent.yaml"), "{err}");
}

/// The deploy manifest's HTTP and restart plugins, HA off, in `shop`.
const ACTING_MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: false}
plugins:
  - name: http-refresh
    module: {module:http-refresh}
    sha256: {sha256:http-refresh}
    events: {kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}
    config: {strategy: refresh}
    capabilities: {refresh: [shop], events: true}
    delivery: {debounce: 0s, retries: 1, backoffInitial: 100ms, backoffMax: 200ms}
  - name: rollout-restart
    module: {module:rollout-restart}
    sha256: {sha256:rollout-restart}
    events: {kinds: [ConfigMap]}
    config: {reloadOnCreate: false, reloadOnDelete: false}
    capabilities: {restart: [shop], events: true}
    delivery: {debounce: 0s, retries: 1, backoffInitial: 100ms, backoffMax: 200ms}
";

/// Sets ConfigMap `shop/orders`'s greeting.
async fn greet(cms: &Api<ConfigMap>, greeting: &str) {
    use kube::api::{Patch, PatchParams};
    let patch = serde_json::json!({"data": {"greeting": greeting}});
    cms.patch("orders", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// (generation, pod-template annotations) of Deployment `shop/orders`.
async fn deployment(client: &kube::Client) -> (i64, serde_json::Value) {
    let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), "shop");
    let d = serde_json::to_value(api.get("orders").await.unwrap()).unwrap();
    (
        d["metadata"]["generation"].as_i64().unwrap(),
        d.pointer("/spec/template/metadata/annotations")
            .cloned()
            .unwrap_or_default(),
    )
}

/// Issue 21: the dry run decides from the same caches as `run` (it used to
/// answer lookups from nothing and printed no actions), and prints exactly
/// what `run` then executes for the same change, executing none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_prints_exactly_the_actions_run_executes_for_the_same_change() {
    use common::*;
    let e = test_env(ACTING_MANIFEST, "shop").await;
    let c = &e.client;
    let (p1, p2, unready) = (Pod::start().await, Pod::start().await, Pod::start().await);
    service(c, "shop", "orders", &[&p1, &p2], &[&unready]).await;
    workload(
        c,
        "shop",
        "Deployment",
        "orders",
        serde_json::json!({"reloader.stakater.com/auto": "true"}),
        serde_json::json!({}),
        serde_json::json!({"containers": [{"name": "app", "image": "example/app:1",
            "envFrom": [{"configMapRef": {"name": "orders"}}]}]}),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "shop");
    let orders: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "orders", "labels": {"spring.cloud.kubernetes.config": "true"}},
        "data": {"greeting": "hello"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &orders).await.unwrap();
    let before = deployment(c).await;

    // 1. The dry run, for the change hello -> hi.
    let (mut dry, ready, lines) = spawn_ready(
        Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
            .args(["run", "--dry-run", "--manifest"])
            .arg(&e.manifest)
            .env("KUBECONFIG", &e.kubeconfig)
            .env("WASMWATCH_CACHE_DIR", artifact_cache_dir())
            .env("RUST_LOG", "warn"),
        Duration::from_secs(120),
    );
    assert_eq!(ready["watches"], 1, "{ready}");
    greet(&cms, "hi").await;
    let mut decisions = std::collections::BTreeMap::new();
    while decisions.len() < 2 {
        let line = lines
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("a decision per plugin; so far {decisions:#?}"));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["object"], "shop/orders", "{line}");
        assert_eq!(v["change"], "modified", "{line}");
        let plugin = v["decision"]["plugin"].as_str().unwrap().to_string();
        decisions.insert(plugin, v["decision"]["actions"].clone());
    }
    // Nothing executed: no POST, no patched template, no Event.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        (p1.total(), p2.total(), unready.total()),
        (0, 0, 0),
        "the dry run calls no pod"
    );
    assert_eq!(
        deployment(c).await,
        before,
        "the dry run patches no workload"
    );
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.clone(), "shop");
    let written = events.list(&Default::default()).await.unwrap().items;
    assert!(
        written.is_empty(),
        "the dry run writes no Event: {written:?}"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &dry.id().to_string()])
        .status();
    assert!(dry.wait().unwrap().success());

    // What it printed: every action allowed, with what `run` would do.
    let url = |p: &Pod| format!("POST http://{}/actuator/refresh", p.addr);
    let mut expected_calls = vec![url(&p1), url(&p2)];
    expected_calls.sort();
    let refresh = &decisions["http-refresh"];
    assert_eq!(refresh.as_array().unwrap().len(), 1, "{refresh:#}");
    assert_eq!(
        refresh[0]["action"]["type"], "refreshService",
        "{refresh:#}"
    );
    assert_eq!(refresh[0]["action"]["service"], "orders", "{refresh:#}");
    let mut calls: Vec<String> = serde_json::from_value(refresh[0]["calls"].clone())
        .unwrap_or_else(|_| panic!("the pods it would call: {refresh:#}"));
    calls.sort();
    assert_eq!(calls, expected_calls, "the ready pods only");
    let restart = &decisions["rollout-restart"];
    assert_eq!(restart.as_array().unwrap().len(), 1, "{restart:#}");
    assert_eq!(restart[0]["action"]["type"], "restart", "{restart:#}");
    assert_eq!(
        restart[0]["action"]["workload"]["name"], "orders",
        "{restart:#}"
    );
    assert_eq!(restart[0]["patch"], true, "{restart:#}");
    let mut dry_actions = Vec::new();
    for (plugin, actions) in &decisions {
        for a in actions.as_array().unwrap() {
            assert_eq!(a["verdict"], "allowed", "{plugin}: {a}");
            assert_eq!(a["execute"], true, "{plugin}: {a}");
            dry_actions.push((plugin.clone(), a["action"].clone()));
        }
    }
    dry_actions.sort_by_key(|(p, a)| format!("{p} {a}"));

    // 2. Back to hello while nobody watches; `run` takes it as its
    // baseline, then gets the same change.
    greet(&cms, "hello").await;
    let replica = Replica::start(&e.kubeconfig, &e.manifest, "solo");
    // ConfigMaps, and the lookups' eight kinds.
    e.server.wait_for_watches(9).await;
    greet(&cms, "hi").await;
    let mut reports: Vec<serde_json::Value> = Vec::new();
    eventually(Duration::from_secs(15), "both actions done", || {
        reports.extend(replica.reports());
        let done = reports.iter().filter(|r| r["outcome"] == "done").count();
        async move { done >= 2 }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    reports.extend(replica.reports());
    let mut run_actions: Vec<(String, serde_json::Value)> = reports
        .iter()
        .map(|r| {
            assert_eq!(r["outcome"], "done", "{r}");
            (
                r["plugin"].as_str().unwrap().to_string(),
                r["action"].clone(),
            )
        })
        .collect();
    run_actions.sort_by_key(|(p, a)| format!("{p} {a}"));
    assert_eq!(
        dry_actions, run_actions,
        "the dry run printed what run executed"
    );
    // And `run` did call exactly the pods the dry run named.
    assert_eq!(
        (p1.hits(REFRESH), p2.hits(REFRESH), unready.total()),
        (1, 1, 0)
    );
    assert_eq!(deployment(c).await.0, before.0 + 1, "restarted once");
}
