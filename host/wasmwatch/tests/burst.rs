//! Issue 20's burst control, end to end: `wasmwatch run` against the test
//! API server, the bundled rollout-restart restarting a Deployment.
//! - objects a workload uses that change within one debounce roll it once,
//!   every object's hash in one patch;
//! - a Secret that flaps rolls it at most once per `delivery.cooldown`, the
//!   last content ending on the pod template, and a Warning Event says so.
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use wasmwatch_core::DataValue;
use wasmwatch_core::digest::{DigestKey, data_digest};

fn manifest(kind: &str, delivery: &str) -> String {
    format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [{kind}], namespaces: [shop]}}
ha: {{enabled: false}}
plugins:
  - name: rollout-restart
    module: {{module:rollout-restart}}
    sha256: {{sha256:rollout-restart}}
    events: {{kinds: [{kind}]}}
    capabilities: {{restart: [shop], events: true}}
    delivery: {delivery}
"
    )
}

/// (generation, pod-template annotations) of Deployment `shop/orders`.
async fn orders(client: &kube::Client) -> (i64, BTreeMap<String, String>) {
    deployment_state(client, "shop", "orders").await
}

async fn orders_using(client: &kube::Client, env_from: serde_json::Value) {
    orders_annotated(
        client,
        serde_json::json!({"reloader.stakater.com/auto": "true"}),
        env_from,
    )
    .await
}

async fn orders_annotated(
    client: &kube::Client,
    annotations: serde_json::Value,
    env_from: serde_json::Value,
) {
    workload(
        client,
        "shop",
        "Deployment",
        "orders",
        annotations,
        serde_json::json!({}),
        serde_json::json!({"containers": [{"name": "app", "image": "example/app:1",
            "envFrom": env_from}]}),
    )
    .await;
}

/// A replica, once its watches are open (the lookups' eight and the
/// watched kind's): changes from then on are its to handle.
async fn start(e: &TestEnv) -> Replica {
    replica_watching(e, 9).await
}

fn data(v: &str) -> BTreeMap<String, DataValue> {
    BTreeMap::from([("v".to_string(), DataValue::Text(v.to_string()))])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_configmaps_changed_in_one_debounce_roll_the_workload_once_with_both_hashes() {
    let e = test_env(
        &manifest(
            "ConfigMap",
            "{debounce: 1s, retries: 3, backoffInitial: 100ms, backoffMax: 1s}",
        ),
        "shop",
    )
    .await;
    let c = &e.client;
    orders_using(
        c,
        serde_json::json!([{"configMapRef": {"name": "a"}}, {"configMapRef": {"name": "b"}}]),
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
    let replica = start(&e).await;
    let (generation, _) = orders(c).await;
    for name in ["a", "b"] {
        let patch = serde_json::json!({"data": {"v": "2"}});
        cms.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    let want = |name: &str| format!("configmap/{name}:{}", data_digest(&data("2"), None));
    eventually(Duration::from_secs(10), "both hashes", || async {
        let (_, a) = orders(c).await;
        a.get("config-hash.wasmwatch.io/configmap.a") == Some(&want("a"))
            && a.get("config-hash.wasmwatch.io/configmap.b") == Some(&want("b"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        orders(c).await.0,
        generation + 1,
        "one rollout for both ConfigMaps"
    );
    drop(replica);
}

/// The acceptance of issue 20: a Secret flipping between two values every
/// 100 ms for 60 s, cooldown 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_secret_rolls_the_workload_at_most_once_per_cooldown() {
    const FLAP: Duration = Duration::from_secs(60);
    const COOLDOWN: Duration = Duration::from_secs(10);
    let e = test_env(
        &manifest(
            "Secret",
            "{debounce: 0s, cooldown: 10s, retries: 3, backoffInitial: 100ms, backoffMax: 1s}",
        ),
        "shop",
    )
    .await;
    let c = &e.client;
    orders_using(c, serde_json::json!([{"secretRef": {"name": "token"}}])).await;
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "shop");
    let token: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "token"}, "stringData": {"v": "x"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &token)
        .await
        .unwrap();
    let replica = start(&e).await;
    let (generation, _) = orders(c).await;

    let start = Instant::now();
    let mut last = "x";
    let mut flips = 0;
    while start.elapsed() < FLAP {
        last = if last == "x" { "y" } else { "x" };
        let patch = serde_json::json!({"stringData": {"v": last}});
        secrets
            .patch("token", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        flips += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let keys: Api<Secret> = Api::namespaced(c.clone(), "default");
    let key = keys.get("wasmwatch-digest-key").await.unwrap();
    let key = DigestKey::new(&key.data.unwrap()["key"].0).unwrap();
    let want = format!("secret/token:{}", data_digest(&data(last), Some(&key)));
    eventually(
        COOLDOWN + Duration::from_secs(5),
        "the last content on the template",
        || async {
            orders(c)
                .await
                .1
                .get("config-hash.wasmwatch.io/secret.token")
                == Some(&want)
        },
    )
    .await;
    let rollouts = orders(c).await.0 - generation;
    // The first change rolls at once (a cooldown adds no latency to a
    // single change), then at most one per cooldown, the last landing the
    // final content: ceil(60 / 10) + 1.
    let bound = FLAP.as_secs().div_ceil(COOLDOWN.as_secs()) as i64 + 1;
    eprintln!("{flips} flips in {FLAP:?}: {rollouts} rollouts (bound {bound})");
    assert!(
        (2..=bound).contains(&rollouts),
        "{rollouts} rollouts for {flips} flips"
    );
    let events: Api<Event> = Api::namespaced(c.clone(), "shop");
    let throttled: Vec<Event> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Throttled"))
        .collect();
    assert!(!throttled.is_empty(), "a Warning Event says so");
    assert_eq!(throttled[0].type_.as_deref(), Some("Warning"));
    let message = throttled[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("Deployment shop/orders") && message.contains("cooldown"),
        "{message}"
    );
    drop(replica);
}

/// Reloader's `deployment.reloader.stakater.com/pause-period`: the first
/// change rolls at once, the changes within the period wait and roll once
/// at its end with the last content (Reloader pauses the Deployment with
/// `spec.paused`; we hold the restart, for every kind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_period_annotation_holds_and_merges_restarts() {
    let e = test_env(
        &manifest(
            "ConfigMap",
            "{debounce: 0s, retries: 3, backoffInitial: 100ms, backoffMax: 1s}",
        ),
        "shop",
    )
    .await;
    let c = &e.client;
    orders_annotated(
        c,
        serde_json::json!({"reloader.stakater.com/auto": "true",
            "deployment.reloader.stakater.com/pause-period": "3s"}),
        serde_json::json!([{"configMapRef": {"name": "a"}}]),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "shop");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "a"}, "data": {"v": "1"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let replica = start(&e).await;
    let (generation, _) = orders(c).await;
    let key = "config-hash.wasmwatch.io/configmap.a";
    let hash = |v: &str| format!("configmap/a:{}", data_digest(&data(v), None));
    let set = |v: &'static str| {
        let cms = cms.clone();
        async move {
            let patch = serde_json::json!({"data": {"v": v}});
            cms.patch("a", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    };
    set("2").await;
    let first = Instant::now();
    eventually(
        Duration::from_secs(5),
        "the first restart, at once",
        || async { orders(c).await.1.get(key) == Some(&hash("2")) },
    )
    .await;
    for v in ["3", "4"] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        set(v).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        orders(c).await,
        (generation + 1, orders(c).await.1.clone()),
        "held during the pause"
    );
    assert_eq!(orders(c).await.1.get(key), Some(&hash("2")));
    eventually(Duration::from_secs(5), "the held restart", || async {
        orders(c).await.1.get(key) == Some(&hash("4"))
    })
    .await;
    assert!(
        first.elapsed() >= Duration::from_millis(2800),
        "{:?}",
        first.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        orders(c).await.0,
        generation + 2,
        "two rollouts for three changes"
    );
    drop(replica);
}

/// Issue 20's reload strategies: `delivery.restartStrategy: env-vars`
/// (Reloader's default) sets `STAKATER_<NAME>_CONFIGMAP` in the container
/// that uses the ConfigMap, holding Reloader's SHA-1 of its content, with
/// no pod-template annotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_env_vars_strategy_sets_reloaders_variable() {
    let e = test_env(
        &manifest(
            "ConfigMap",
            "{debounce: 0s, restartStrategy: env-vars, retries: 3, backoffInitial: 100ms, backoffMax: 1s}",
        ),
        "shop",
    )
    .await;
    let c = &e.client;
    orders_using(
        c,
        serde_json::json!([{"configMapRef": {"name": "app-config"}}]),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "shop");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "app-config"}, "data": {"v": "1"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let replica = start(&e).await;
    let (generation, _) = orders(c).await;
    let patch = serde_json::json!({"data": {"v": "2"}});
    cms.patch("app-config", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    // Reloader's SHA-1 of the content, as Reloader writes it (a switch
    // back to Reloader restarts nothing).
    let want = serde_json::json!([{"name": "STAKATER_APP_CONFIG_CONFIGMAP",
        "value": wasmwatch_core::digest::reloader_hash(
            wasmwatch_core::ObjectKind::ConfigMap, &data("2"))}]);
    let api: Api<Deployment> = Api::namespaced(c.clone(), "shop");
    eventually(Duration::from_secs(10), "the variable", || async {
        let d = serde_json::to_value(api.get("orders").await.unwrap()).unwrap();
        d["spec"]["template"]["spec"]["containers"][0]["env"] == want
    })
    .await;
    let (g, annotations) = orders(c).await;
    assert_eq!(g, generation + 1);
    assert!(
        !annotations
            .keys()
            .any(|k| k.starts_with("config-hash.wasmwatch.io/")),
        "no content-hash annotation: {annotations:?}"
    );
    drop(replica);
}

/// Issue 24's work-queue rule: changes of one object that arrive while the
/// plugin's call on it still waits for its turn (the call before is
/// deciding) are decided together, once, on the newest content. Without the
/// fold, each of the 9 changes is a call of 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_waiting_for_a_busy_plugin_fold_into_one_call_on_the_newest_content() {
    let e = test_env(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: false}
plugins:
  - name: spy
    module: {module:misbehave}
    sha256: {sha256:misbehave}
    events: {kinds: [ConfigMap]}
    config: {mode: spy, hold_ms: 1000}
    limits: {timeout: 5s}
    capabilities: {events: true}
    delivery: {debounce: 0s}
",
        "shop",
    )
    .await;
    let c = &e.client;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "shop");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "orders"}, "data": {"v": "0"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let replica = start(&e).await;
    let set = |v: usize| {
        let cms = cms.clone();
        async move {
            let patch = serde_json::json!({"data": {"v": v.to_string()}});
            cms.patch("orders", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    };
    // The first change's call holds the plugin for 1 s; the next eight
    // arrive meanwhile.
    set(1).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    for v in 2..=9 {
        set(v).await;
    }
    let handled = "wasmwatch_events_handled_total{kind=\"ConfigMap\"}";
    eventually(Duration::from_secs(15), "all 9 changes handled", || async {
        replica.metric(handled).await >= 9.0
    })
    .await;
    let events: Api<Event> = Api::namespaced(c.clone(), "shop");
    let mut seen: Vec<String> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("SawData"))
        .map(|e| (e.count.unwrap_or(1), e.message.unwrap_or_default()))
        .flat_map(|(n, m)| std::iter::repeat_n(m, n as usize))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        ["v=1", "v=9"],
        "one call per turn, the second on the newest content"
    );
    assert_eq!(
        replica
            .metric("wasmwatch_plugin_invocations_total{plugin=\"spy\",outcome=\"ok\"}")
            .await,
        2.0
    );
    assert_eq!(
        replica
            .metric("wasmwatch_changes_folded_total{plugin=\"spy\"}")
            .await,
        7.0
    );
    assert_eq!(replica.metric(handled).await, 9.0);
    drop(replica);
}
