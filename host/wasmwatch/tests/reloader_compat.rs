//! What a Stakater Reloader user reads, end to end: `wasmwatch run` against
//! the test API server, the bundled rollout-restart restarting a Deployment.
//! - `/metrics` has Reloader's `reloader_reload_executed_total{success}`,
//!   both series at 0 from the start, and with the manifest's
//!   `metrics.reloaderByNamespace` its
//!   `reloader_reload_executed_total_by_namespace{namespace,success}`,
//!   the exact sample names Reloader's dashboards query;
//! - a restart counts `true` once, a restart for content the workload
//!   already has counts nothing, every failed attempt (a 409 retried, the
//!   last of a dead-lettered restart) counts `false`;
//! - the Deployment gets Reloader's `Reloaded` and `ReloadFail` Events,
//!   in its words, the ConfigMap `Restarted` and `RefreshFailed` as before.
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use wasmwatch_core::DataValue;
use wasmwatch_core::digest::data_digest;

const NS: &str = "shop";

const MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: false}
metrics: {reloaderByNamespace: true}
plugins:
  - name: rollout-restart
    module: {module:rollout-restart}
    sha256: {sha256:rollout-restart}
    events: {kinds: [ConfigMap]}
    capabilities: {restart: [shop], events: true}
    delivery: {debounce: 0s, retries: 2, backoffInitial: 100ms, backoffMax: 200ms}
";

const TRUE: &str = "reloader_reload_executed_total{success=\"true\"}";
const FALSE: &str = "reloader_reload_executed_total{success=\"false\"}";
const NS_TRUE: &str =
    "reloader_reload_executed_total_by_namespace{namespace=\"shop\",success=\"true\"}";
const NS_FALSE: &str =
    "reloader_reload_executed_total_by_namespace{namespace=\"shop\",success=\"false\"}";

/// The `/metrics` text.
async fn exposition(r: &Replica) -> String {
    let (status, text) = get(r.admin, "/metrics").await.expect("/metrics answers");
    assert_eq!(status, 200);
    text
}

/// Reloader's four series, in the order of the consts above.
async fn reloads(r: &Replica) -> [f64; 4] {
    let text = exposition(r).await;
    let value = |series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    };
    [value(TRUE), value(FALSE), value(NS_TRUE), value(NS_FALSE)]
}

async fn wait_reloads(r: &Replica, want: [f64; 4], what: &str) {
    let start = Instant::now();
    loop {
        let have = reloads(r).await;
        if have == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{what}: reloads (true, false, shop true, shop false) {have:?}, want {want:?}:\n{}",
            exposition(r).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn data(v: &str) -> BTreeMap<String, DataValue> {
    BTreeMap::from([("v".to_string(), DataValue::Text(v.to_string()))])
}

/// What rollout-restart records on the template for `orders-config` at `v`.
fn content_hash(v: &str) -> String {
    format!("configmap/orders-config:{}", data_digest(&data(v), None))
}

async fn set(cms: &Api<ConfigMap>, v: &str) {
    cms.patch(
        "orders-config",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"v": v}})),
    )
    .await
    .unwrap();
}

async fn generation(c: &kube::Client) -> i64 {
    let api: Api<Deployment> = Api::namespaced(c.clone(), NS);
    api.get("orders")
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap()
}

/// Events with `reason` on `kind/name`.
async fn events(c: &kube::Client, kind: &str, name: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(c.clone(), NS);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some(kind)
                && e.involved_object.name.as_deref() == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

/// Waits (the recorder writes a repeat up to 5 s late) until the Events
/// with `reason` on `kind/name` count `n` occurrences; returns them.
async fn occurrences(c: &kube::Client, kind: &str, name: &str, reason: &str, n: i32) -> Vec<Event> {
    let start = Instant::now();
    loop {
        let found = events(c, kind, name, reason).await;
        let seen: i32 = found.iter().map(|e| e.count.unwrap_or(1)).sum();
        if seen == n {
            return found;
        }
        assert!(
            seen < n && start.elapsed() < Duration::from_secs(15),
            "{seen} occurrences of {reason} on {kind} {name}, want {n}: {found:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for the restart reports for `hash` to end (done or
/// dead-lettered); returns their outcomes, attempt by attempt.
async fn restart_outcomes(r: &Replica, seen: &mut Vec<Value>, hash: &str) -> Vec<String> {
    let start = Instant::now();
    loop {
        seen.extend(r.reports());
        let outcomes: Vec<String> = seen
            .iter()
            .filter(|r| r["action"]["type"] == "restart" && r["action"]["contentHash"] == hash)
            .map(|r| r["outcome"].as_str().unwrap_or("").to_string())
            .collect();
        if outcomes
            .last()
            .is_some_and(|o| o == "done" || o == "dead-lettered")
        {
            return outcomes;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "no end of the restart for {hash}: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloader_metrics_and_events_as_reloader_writes_them() {
    let e = test_env(MANIFEST, NS).await;
    let c = &e.client;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), NS);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "orders-config"}, "data": {"v": "1"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    workload(
        c,
        NS,
        "Deployment",
        "orders",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({}),
        json!({"containers": [{"name": "app", "image": "example/app:1",
            "envFrom": [{"configMapRef": {"name": "orders-config"}}]}]}),
    )
    .await;
    // Ready, and its watches open (the lookups' eight and ConfigMaps').
    let r = replica_watching(&e, 9).await;
    let mut reports = Vec::new();

    // 1. From the start: both series at 0, the by-namespace family named
    //    as Reloader's (not `..._by_namespace_total`, what OpenMetrics
    //    makes of a counter), no series of it yet.
    let text = exposition(&r).await;
    for line in [
        "# TYPE reloader_reload_executed counter",
        "reloader_reload_executed_total{success=\"true\"} 0",
        "reloader_reload_executed_total{success=\"false\"} 0",
        "# TYPE reloader_reload_executed_total_by_namespace unknown",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line}:\n{text}");
    }
    assert!(
        !text.contains("_by_namespace_total") && !text.contains("_by_namespace{"),
        "{text}"
    );

    // 2. A change restarts the Deployment: `true` once, in its namespace
    //    too, and Reloader's `Reloaded` Event on the Deployment.
    let g = generation(c).await;
    set(&cms, "2").await;
    assert_eq!(
        restart_outcomes(&r, &mut reports, &content_hash("2")).await,
        ["done"]
    );
    wait_reloads(&r, [1.0, 0.0, 1.0, 0.0], "one restart").await;
    assert_eq!(generation(c).await, g + 1);
    let text = exposition(&r).await;
    let line = "reloader_reload_executed_total_by_namespace{namespace=\"shop\",success=\"true\"} 1";
    assert!(text.lines().any(|l| l == line), "no {line}:\n{text}");
    let reloaded = occurrences(c, "Deployment", "orders", "Reloaded", 1).await;
    assert_eq!(reloaded[0].type_.as_deref(), Some("Normal"));
    assert_eq!(
        reloaded[0].message.as_deref(),
        Some(
            "Changes detected in 'orders-config' of type 'CONFIGMAP' in namespace 'shop', \
             Updated 'orders' of type 'Deployment' in namespace 'shop'"
        )
    );
    // Written by wasmwatch, not `reloader-configmaps`.
    assert_eq!(
        reloaded[0]
            .source
            .as_ref()
            .and_then(|s| s.component.as_deref()),
        Some("wasmwatch")
    );
    // Success is told on the workload only (issue 35).
    occurrences(c, "ConfigMap", "orders-config", "Restarted", 0).await;

    // 3. A restart for content the Deployment already records (as after a
    //    failover): nothing written, nothing counted, no Event.
    let api: Api<Deployment> = Api::namespaced(c.clone(), NS);
    let annotation = json!({"spec": {"template": {"metadata": {"annotations": {
        "config-hash.wasmwatch.io/configmap.orders-config": content_hash("3"),
    }}}}});
    api.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(&annotation),
    )
    .await
    .unwrap();
    let g = generation(c).await;
    set(&cms, "3").await;
    assert_eq!(
        restart_outcomes(&r, &mut reports, &content_hash("3")).await,
        ["done"]
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(reloads(&r).await, [1.0, 0.0, 1.0, 0.0]);
    assert_eq!(generation(c).await, g, "no restart");

    // 4. A conflict (409) on the patch and on every re-read at once
    //    (`CONFLICT_REREADS`), then the retry patches: `false` once, `true`
    //    once more, and a `ReloadFail` Warning in Reloader's words.
    for _ in 0..=wasmwatch_exec::workload::CONFLICT_REREADS {
        e.server
            .faults()
            .conflict_next_write("deployments", NS, "orders");
    }
    set(&cms, "4").await;
    assert_eq!(
        restart_outcomes(&r, &mut reports, &content_hash("4")).await,
        ["retrying", "done"]
    );
    wait_reloads(&r, [2.0, 1.0, 2.0, 1.0], "a failed attempt, then a restart").await;
    let fail = occurrences(c, "Deployment", "orders", "ReloadFail", 1).await;
    assert_eq!(fail[0].type_.as_deref(), Some("Warning"));
    let message = fail[0].message.clone().unwrap_or_default();
    assert!(
        message.starts_with(
            "Update for 'orders' of type 'Deployment' in namespace 'shop' failed with error \
             conflict (409) when patching the pod template: Operation cannot be fulfilled on \
             deployments.apps \"orders\""
        ),
        "{message}"
    );
    occurrences(c, "Deployment", "orders", "Reloaded", 2).await;

    // 5. Every attempt fails (retries: 2): three `false`, three more
    //    `ReloadFail` occurrences, no `Reloaded`; the ConfigMap gets its
    //    `RefreshFailed` as before, and our own dead-letter count moves.
    for _ in 0..3 * (wasmwatch_exec::workload::CONFLICT_REREADS + 1) {
        e.server
            .faults()
            .conflict_next_write("deployments", NS, "orders");
    }
    set(&cms, "5").await;
    assert_eq!(
        restart_outcomes(&r, &mut reports, &content_hash("5")).await,
        ["retrying", "retrying", "dead-lettered"]
    );
    wait_reloads(&r, [2.0, 4.0, 2.0, 4.0], "three failed attempts").await;
    let fail = occurrences(c, "Deployment", "orders", "ReloadFail", 4).await;
    assert!(
        fail.iter().all(|e| e
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("Update for 'orders' of type 'Deployment'"))),
        "{fail:#?}"
    );
    let failed = occurrences(c, "ConfigMap", "orders-config", "RefreshFailed", 1).await;
    assert!(
        failed[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("failed for good")),
        "{failed:#?}"
    );
    assert_eq!(
        r.metric("wasmwatch_dead_letters_total{type=\"restart\"}")
            .await,
        1.0
    );
    assert_eq!(
        events(c, "Deployment", "orders", "Reloaded")
            .await
            .iter()
            .map(|e| e.count.unwrap_or(1))
            .sum::<i32>(),
        2,
        "no Reloaded for a restart that failed"
    );
    drop(r);
}
