//! Host-side prefilters (issue 35): a plugin declares in its needs what can
//! never interest it, the host skips those calls, counts them, and still
//! judges a deletion found at a resync on what the object carried. And the
//! success Events go on the app (the Service, the workload), not on each
//! changed object. Real `wasmwatch run` processes, the test API server,
//! the bundled plugins and a test plugin, kubectl reading the Events.
mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "shop";
/// The lookups' watches, and one ConfigMap watch.
const WATCHES: usize = 9;

/// The bundled http-refresh over namespace `shop`, HA with short leases.
const HTTP_REFRESH: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: true, namespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms}
plugins:
  - name: http-refresh
    module: {module:http-refresh}
    sha256: {sha256:http-refresh}
    events: {kinds: [ConfigMap]}
    capabilities: {refresh: [shop]}
    delivery: {debounce: 0s}
";

fn config_map(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "data": {"k": "1"}
    }))
    .unwrap()
}

/// Until the leader stored its baseline: changes from then on are its.
async fn baseline(e: &TestEnv) {
    eventually(Duration::from_secs(30), "the baseline stored", || async {
        checkpoint(&e.client, NS).await.is_some()
    })
    .await;
}

async fn set(cms: &Api<ConfigMap>, name: &str, value: &str) -> u64 {
    let patch = json!({"data": {"k": value}});
    let cm = cms
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    cm.metadata.resource_version.unwrap().parse().unwrap()
}

/// The bundled plugins declare theirs: http-refresh is called only for
/// objects whose Spring apps have a Service, rollout-restart only for
/// objects some workload uses. An object neither uses (a Helm release's
/// ConfigMap, say) costs no call at all, and is still handled (the
/// checkpoint moves past it). The refresh and the restart are told on the
/// Service and the Deployment, once, and not on the ConfigMaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bundled_plugins_are_not_called_for_objects_no_app_uses_and_tell_the_app() {
    let manifest = format!(
        "{HTTP_REFRESH}  - name: rollout-restart
    module: {{module:rollout-restart}}
    sha256: {{sha256:rollout-restart}}
    events: {{kinds: [ConfigMap]}}
    capabilities: {{restart: [shop]}}
    delivery: {{debounce: 0s}}
"
    );
    let e = test_env(&manifest, NS).await;
    let orders = Pod::start().await;
    service(&e.client, NS, "orders", &[&orders], &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(e.client.clone(), NS);
    for name in ["orders", "helm-release", "mounted"] {
        cms.create(&PostParams::default(), &config_map(name, json!({})))
            .await
            .unwrap();
    }
    workload(
        &e.client,
        NS,
        "Deployment",
        "web",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({}),
        json!({"containers": [{"name": "c", "image": "x",
            "envFrom": [{"configMapRef": {"name": "mounted"}}]}]}),
    )
    .await;
    let r = replica_named(&e, "solo", WATCHES).await;
    eventually(Duration::from_secs(10), "it leads", || r.leading()).await;
    baseline(&e).await;

    set(&cms, "orders", "2").await;
    set(&cms, "mounted", "2").await;
    let last = set(&cms, "helm-release", "2").await;
    eventually(Duration::from_secs(30), "orders refreshed", || async {
        orders.hits(REFRESH) == 1
    })
    .await;
    eventually(Duration::from_secs(10), "web restarted", || async {
        deployment_state(&e.client, NS, "web").await.0 == 2
    })
    .await;
    eventually(Duration::from_secs(10), "every change handled", || async {
        checkpoint(&e.client, NS).await.is_some_and(|rv| rv >= last)
    })
    .await;
    let skipped = |p: &str, c: &str| {
        format!("wasmwatch_plugin_calls_skipped_total{{plugin=\"{p}\",condition=\"{c}\"}}")
    };
    let calls =
        |p: &str| format!("wasmwatch_plugin_invocations_total{{plugin=\"{p}\",outcome=\"ok\"}}");
    // mounted and helm-release have no Spring app Service; orders and
    // helm-release no workload.
    assert_eq!(
        r.metric(&skipped("http-refresh", "usedBySpringService"))
            .await,
        2.0
    );
    assert_eq!(
        r.metric(&skipped("rollout-restart", "usedByWorkload"))
            .await,
        2.0
    );
    assert_eq!(r.metric(&calls("http-refresh")).await, 1.0, "orders only");
    assert_eq!(
        r.metric(&calls("rollout-restart")).await,
        1.0,
        "mounted only"
    );
    assert_eq!(
        r.metric("wasmwatch_events_handled_total{kind=\"ConfigMap\"}")
            .await,
        3.0
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(orders.hits(REFRESH), 1);
    assert_eq!(deployment_state(&e.client, NS, "web").await.0, 2);

    // The Events, as kubectl lists them: on the app, none on the objects.
    let listed = || {
        e.kubectl(
            &[
                "get",
                "events",
                "-n",
                NS,
                "-o",
                "custom-columns=KIND:.involvedObject.kind,NAME:.involvedObject.name,REASON:.reason,COUNT:.count",
                "--no-headers",
            ],
            None,
        )
    };
    let mut events = String::new();
    for _ in 0..50 {
        events = listed();
        if events.contains("Refreshed") && events.contains("Reloaded") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows: Vec<Vec<&str>> = events
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        rows.contains(&vec!["Service", "orders", "Refreshed", "1"]),
        "{events}"
    );
    assert!(
        rows.contains(&vec!["Deployment", "web", "Reloaded", "1"]),
        "{events}"
    );
    assert!(
        rows.iter().all(|r| r[0] != "ConfigMap"),
        "no success Event on a changed object: {events}"
    );

    // The same app refreshed again: its one Event counts it.
    set(&cms, "orders", "3").await;
    eventually(
        Duration::from_secs(10),
        "orders refreshed again",
        || async { orders.hits(REFRESH) == 2 },
    )
    .await;
    let mut counted = false;
    for _ in 0..100 {
        let events = listed();
        let refreshed: Vec<&str> = events.lines().filter(|l| l.contains("Refreshed")).collect();
        assert_eq!(refreshed.len(), 1, "one Event per app: {events}");
        if refreshed[0].split_whitespace().last() == Some("2") {
            counted = true;
            break;
        }
        // Written at most once per 5 s per Event.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(counted, "the app's Event counts 2 refreshes");
}

/// A test plugin declaring `label:wasmwatch.test/watched` and
/// `annotation:wasmwatch.test/owner`: an object without both costs no
/// call. The plugin declares it reads no label or annotation, so the
/// stored index keeps of each object only what the prefilter names: a
/// deletion the next leader finds at a resync (the history compacted in a
/// leaderless gap) still carries them, and reaches the plugin; the
/// deletions of the objects missing one do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_and_annotation_prefilters_skip_calls_and_a_deletion_found_at_a_resync_is_still_routed()
 {
    let ledger = Pod::start().await;
    let manifest = format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [ConfigMap], namespaces: [shop]}}
ha: {{enabled: true, namespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms}}
plugins:
  - name: ledger
    module: {{module:misbehave}}
    sha256: {{sha256:misbehave}}
    events: {{kinds: [ConfigMap]}}
    config: {{mode: ledger, url: \"http://{}/ledger\", only_label: wasmwatch.test/watched, only_annotation: wasmwatch.test/owner}}
    capabilities: {{http: [\"http://127.0.0.1:*/\"]}}
    delivery: {{debounce: 0s}}
",
        ledger.addr
    );
    let e = test_env(&manifest, NS).await;
    let cms: Api<ConfigMap> = Api::namespaced(e.client.clone(), NS);
    let labelled = json!({"wasmwatch.test/watched": "yes", "team": "a"});
    let owned = json!({"wasmwatch.test/owner": "team-a", "note": "x"});
    let object = |name: &str, labels: &serde_json::Value, annotations: &serde_json::Value| {
        let mut cm = config_map(name, labels.clone());
        cm.metadata.annotations = serde_json::from_value(annotations.clone()).unwrap();
        cm
    };
    for cm in [
        object("a", &labelled, &owned),
        object("b", &labelled, &json!({})),
        object("c", &json!({"team": "a"}), &owned),
    ] {
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let hits = || ledger.hits("POST /ledger");
    let skipped = |condition: &str| {
        format!(
            "wasmwatch_plugin_calls_skipped_total{{plugin=\"ledger\",condition=\"{condition}\"}}"
        )
    };
    let (no_label, no_annotation) = (
        skipped("label:wasmwatch.test/watched"),
        skipped("annotation:wasmwatch.test/owner"),
    );
    let calls = "wasmwatch_plugin_invocations_total{plugin=\"ledger\",outcome=\"ok\"}";

    let mut a = replica_named(&e, "replica-a", WATCHES).await;
    eventually(Duration::from_secs(10), "replica a leads", || a.leading()).await;
    baseline(&e).await;
    set(&cms, "b", "2").await;
    set(&cms, "c", "2").await;
    let last = set(&cms, "a", "2").await;
    eventually(Duration::from_secs(30), "a's change delivered", || async {
        hits() == 1
    })
    .await;
    eventually(Duration::from_secs(10), "checkpoint past all", || async {
        checkpoint(&e.client, NS).await.is_some_and(|rv| rv >= last)
    })
    .await;
    assert_eq!(a.metric(&no_annotation).await, 1.0, "b costs no call");
    assert_eq!(a.metric(&no_label).await, 1.0, "c costs no call");
    assert_eq!(a.metric(calls).await, 1.0);
    a.child.kill().unwrap();
    a.child.wait().unwrap();

    // All deleted while nobody leads, and the history lost.
    for name in ["a", "b", "c"] {
        cms.delete(name, &DeleteParams::default()).await.unwrap();
    }
    e.server.faults().compact_history();

    let b = replica_named(&e, "replica-b", WATCHES).await;
    eventually(Duration::from_secs(15), "replica b leads", || b.leading()).await;
    eventually(
        Duration::from_secs(10),
        "a's deletion delivered",
        || async { hits() == 2 },
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "b's and c's deletions skipped",
        || async { b.metric(&no_annotation).await == 1.0 && b.metric(&no_label).await == 1.0 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(hits(), 2);
    assert_eq!(b.metric(calls).await, 1.0, "a's deletion only");
}

/// Spring's list of apps passes 512 bytes at ~40 apps. http-refresh
/// declares it reads that annotation, so the stored index keeps it whole,
/// and a deletion the next leader finds at a resync (the history compacted
/// in a leaderless gap) refreshes the apps it lists. Until 2026-12-07 the
/// index dropped annotation values over 512 bytes: this deletion reached
/// no app (the ConfigMap's namesake has no Service, so the call was
/// skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_found_at_a_resync_refreshes_the_apps_of_a_long_spring_list() {
    let e = test_env(HTTP_REFRESH, NS).await;
    let orders = Pod::start().await;
    service(&e.client, NS, "orders", &[&orders], &[]).await;
    let apps: Vec<String> = (0..40)
        .map(|i| format!("app-{i:02}-of-the-shop"))
        .chain(["orders".to_string()])
        .collect();
    let apps = apps.join(",");
    assert!(apps.len() > 512, "{} bytes", apps.len());
    let cms: Api<ConfigMap> = Api::namespaced(e.client.clone(), NS);
    let mut cm = config_map("settings", json!({}));
    cm.metadata.annotations = Some(
        [(
            "spring.cloud.kubernetes.configmap.apps".to_string(),
            apps.clone(),
        )]
        .into(),
    );
    cms.create(&PostParams::default(), &cm).await.unwrap();

    let mut a = replica_named(&e, "replica-a", WATCHES).await;
    eventually(Duration::from_secs(10), "replica a leads", || a.leading()).await;
    baseline(&e).await;
    let last = set(&cms, "settings", "2").await;
    eventually(Duration::from_secs(30), "orders refreshed", || async {
        orders.hits(REFRESH) == 1
    })
    .await;
    eventually(Duration::from_secs(10), "checkpoint past it", || async {
        checkpoint(&e.client, NS).await.is_some_and(|rv| rv >= last)
    })
    .await;
    a.child.kill().unwrap();
    a.child.wait().unwrap();

    cms.delete("settings", &DeleteParams::default())
        .await
        .unwrap();
    e.server.faults().compact_history();

    let b = replica_named(&e, "replica-b", WATCHES).await;
    eventually(Duration::from_secs(15), "replica b leads", || b.leading()).await;
    eventually(
        Duration::from_secs(15),
        "the deletion refreshed orders",
        || async { orders.hits(REFRESH) == 2 },
    )
    .await;
}
