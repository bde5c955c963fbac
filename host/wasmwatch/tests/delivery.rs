//! The delivery path through the whole service: real `wasmwatch run`
//! processes against the test API server, the bundled plugins, real HTTP
//! "pods" counting actuator calls, a real RabbitMQ and nats-server on
//! loopback, workloads restarted on the API server.
//!
//! HA is off (one replica, no checkpoints) except in the failover test.
mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use wasmwatch_apiserver::ServerHandle;
use wasmwatch_testkit::brokers;

const NS: &str = "shop";
const SPRING_LABEL: &str = "spring.cloud.kubernetes.config";
/// Watch streams a replica opens besides its ConfigMap/Secret watches: the
/// lookups' Deployments, StatefulSets, DaemonSets, CronJobs, Jobs, Argo
/// Rollouts (served by the test API server), Services, EndpointSlices.
const LOOKUP_WATCHES: usize = 8;

const HTTP_MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: false}
plugins:
  - name: http-refresh
    module: {module:http-refresh}
    sha256: {sha256:http-refresh}
    events: {kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}
    capabilities: {refresh: [shop]}
    delivery: {debounce: DEBOUNCE, retries: 3, backoffInitial: 100ms, backoffMax: 200ms}
";

/// A test API server with namespace `shop`, a kubeconfig and a manifest.
struct Env {
    server: ServerHandle,
    client: kube::Client,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    manifest: PathBuf,
    cms: Api<ConfigMap>,
}

async fn env(manifest: &str) -> Env {
    let TestEnv {
        server,
        client,
        dir,
        kubeconfig,
        manifest,
    } = test_env(manifest, NS).await;
    Env {
        cms: Api::namespaced(client.clone(), NS),
        server,
        client,
        _dir: dir,
        kubeconfig,
        manifest,
    }
}

impl Env {
    /// Starts a replica (off the async threads: it blocks until ready) and
    /// waits until the server counts `watches` more open watch streams.
    async fn replica(&self, identity: &str, watches: usize) -> Replica {
        let before = self.server.open_watches();
        let (k, m, id) = (
            self.kubeconfig.clone(),
            self.manifest.clone(),
            identity.to_string(),
        );
        let r = tokio::task::spawn_blocking(move || Replica::start(&k, &m, &id))
            .await
            .unwrap();
        self.wait_for_watches(before + watches).await;
        r
    }

    async fn wait_for_watches(&self, n: usize) {
        if tokio::time::timeout(Duration::from_secs(15), self.server.wait_for_watches(n))
            .await
            .is_err()
        {
            panic!(
                "{n} watch streams not open within 15 s (open: {})",
                self.server.open_watches()
            );
        }
    }

    /// Warning/Normal Events with `reason` about `kind/name` in `shop`.
    async fn events(&self, kind: &str, name: &str, reason: &str) -> Vec<Event> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), NS);
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

    /// How many times `reason` happened on the object: repeats are one
    /// Event with a growing `count` (exec::recorder), written up to 5 s
    /// late, so this waits up to 10 s for `n`.
    async fn occurrences(&self, kind: &str, name: &str, reason: &str, n: i32) -> i32 {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let seen: i32 = self
                .events(kind, name, reason)
                .await
                .iter()
                .map(|e| e.count.unwrap_or(1))
                .sum();
            if seen >= n || std::time::Instant::now() > deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A Service with these labels and annotations whose endpoints are
/// `(address, ready)`, one EndpointSlice each (the address's port).
async fn app(
    client: &kube::Client,
    name: &str,
    labels: Value,
    annotations: Value,
    endpoints: &[(SocketAddr, bool)],
) {
    apply(
        client,
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
            "spec": {"ports": [{"name": "http", "port": 8080}], "selector": {"app": name}}}),
    )
    .await;
    for (i, (addr, ready)) in endpoints.iter().enumerate() {
        apply(
            client,
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{name}-{i}"), "namespace": NS,
                    "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": [addr.ip().to_string()],
                    "conditions": {"ready": ready},
                    "targetRef": {"kind": "Pod", "name": format!("{name}-{i}"), "namespace": NS}}],
                "ports": [{"name": "http", "port": addr.port(), "protocol": "TCP"}]}),
        )
        .await;
    }
}

fn ready(pods: &[&Pod]) -> Vec<(SocketAddr, bool)> {
    pods.iter().map(|p| (p.addr, true)).collect()
}

/// A ConfigMap in `shop`, with the Spring label when `labelled`.
fn config_map(name: &str, labelled: bool, annotations: Value, value: &str) -> ConfigMap {
    let labels = if labelled {
        json!({SPRING_LABEL: "true"})
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "data": {"application.yaml": format!("value: {value}")}
    }))
    .unwrap()
}

async fn create(cms: &Api<ConfigMap>, cm: ConfigMap) {
    cms.create(&PostParams::default(), &cm).await.unwrap();
}

/// Sets the ConfigMap's content; returns the object as stored.
async fn set(cms: &Api<ConfigMap>, name: &str, value: &str) -> ConfigMap {
    let patch = json!({"data": {"application.yaml": format!("value: {value}")}});
    cms.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap()
}

/// The content digest the host computes (and plugins receive) for an object.
fn digest<K: serde::Serialize>(object: &K) -> String {
    let value = serde_json::to_value(object).unwrap();
    wasmwatch_core::ObjectSnapshot::from_json(&value)
        .unwrap()
        .digest()
}

/// The keyed digest the host computes for a Secret: HMAC-SHA-256 under the
/// key wasmwatch keeps in Secret `default/wasmwatch-digest-key`.
async fn secret_digest(client: &kube::Client, secret: &Secret) -> String {
    let keys: Api<Secret> = Api::namespaced(client.clone(), "default");
    let key = keys.get("wasmwatch-digest-key").await.unwrap();
    let key = wasmwatch_core::digest::DigestKey::new(&key.data.unwrap()["key"].0).unwrap();
    let value = serde_json::to_value(secret).unwrap();
    wasmwatch_core::ObjectSnapshot::from_json(&value)
        .unwrap()
        .digest_with(Some(&key))
}

/// Reads the replica's new reports into `seen` until `done(seen)` holds.
async fn wait_reports(
    replica: &Replica,
    seen: &mut Vec<Value>,
    within: Duration,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) {
    let start = Instant::now();
    loop {
        seen.extend(replica.reports());
        if done(seen) {
            return;
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?}: {what}; reports so far: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn of_type<'a>(reports: &'a [Value], action_type: &str) -> Vec<&'a Value> {
    reports
        .iter()
        .filter(|r| r["action"]["type"] == action_type)
        .collect()
}

fn outcomes(reports: &[&Value]) -> Vec<(u64, String)> {
    reports
        .iter()
        .map(|r| {
            (
                r["attempt"].as_u64().unwrap_or(0),
                r["outcome"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

// ------------------------------------------------------------ http-refresh

/// The HA test's leases (3 s, renew deadline 2 s) must not starve on a
/// loaded 2-core machine: it runs alone, the others together.
static LOAD: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_refresh_posts_once_to_each_ready_pod_of_exactly_the_target_apps() {
    posts_once_to_each_ready_pod_of_exactly_the_target_apps("http-refresh").await;
}

/// The Python twin (plugins/python/http-refresh) in the same service, the
/// same cluster, the same assertions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_http_refresh_posts_once_to_each_ready_pod_of_exactly_the_target_apps() {
    posts_once_to_each_ready_pod_of_exactly_the_target_apps("python/http-refresh").await;
}

/// `component` (a testkit name) as the manifest's `http-refresh` plugin.
async fn posts_once_to_each_ready_pod_of_exactly_the_target_apps(component: &str) {
    // Not while the HA test runs alone (see LOAD): the warm-up compiles.
    let _load = LOAD.read().await;
    warm_cache().await;
    let manifest = HTTP_MANIFEST
        .replace("DEBOUNCE", "0s")
        .replace("{module:http-refresh}", &format!("{{module:{component}}}"))
        .replace("{sha256:http-refresh}", &format!("{{sha256:{component}}}"));
    let e = env(&manifest).await;
    let c = &e.client;
    let pod = || Pod::start();
    let (o1, o2, o_unready) = (pod().await, pod().await, pod().await);
    let billing = pod().await;
    let inventory = pod().await;
    let payments = pod().await;
    let (reports_pod, decoy) = (pod().await, pod().await);

    let mut orders_eps = ready(&[&o1, &o2]);
    orders_eps.push((o_unready.addr, false));
    app(
        c,
        "orders",
        json!({"app": "orders"}),
        json!({}),
        &orders_eps,
    )
    .await;
    app(
        c,
        "billing",
        json!({"app": "billing"}),
        json!({}),
        &ready(&[&billing]),
    )
    .await;
    app(
        c,
        "inventory",
        json!({"app": "inventory", "tier": "backend"}),
        json!({}),
        &ready(&[&inventory]),
    )
    .await;
    app(
        c,
        "payments",
        json!({"app": "payments", "tier": "backend", "team": "pay"}),
        json!({}),
        &ready(&[&payments]),
    )
    .await;
    // The endpoint's own port is the decoy's: the annotation's port must win.
    let actuator = format!("http://:{}/manage", reports_pod.addr.port());
    app(
        c,
        "reports",
        json!({"app": "reports"}),
        json!({"boot.spring.io/actuator": actuator}),
        &[(decoy.addr, true)],
    )
    .await;

    let apps = "spring.cloud.kubernetes.configmap.apps";
    let labels = "spring.cloud.kubernetes.configmap.labels";
    for cm in [
        config_map("orders", true, json!({}), "1"),
        config_map("to-billing", true, json!({apps: "billing"}), "1"),
        config_map("backend", true, json!({labels: "tier=backend"}), "1"),
        config_map(
            "backend-pay",
            true,
            json!({labels: "tier=backend, team=pay"}),
            "1",
        ),
        config_map("reports", true, json!({}), "1"),
        // Named like an app but without a Service: nothing to call.
        config_map("ghost", true, json!({}), "1"),
        // Unlabelled: not selected, whatever its name and annotation say.
        config_map("billing", false, json!({apps: "orders"}), "1"),
    ] {
        create(&e.cms, cm).await;
    }
    let replica = e.replica("solo", LOOKUP_WATCHES + 1).await;
    let mut seen = Vec::new();

    // Not selected / no Service first: handled (or skipped) before the rest.
    set(&e.cms, "billing", "2").await;
    set(&e.cms, "ghost", "2").await;
    set(&e.cms, "orders", "2").await;
    eventually(
        Duration::from_secs(10),
        "orders' ready pods refreshed",
        || {
            let (a, b) = (o1.hits(REFRESH), o2.hits(REFRESH));
            async move { a == 1 && b == 1 }
        },
    )
    .await;
    set(&e.cms, "to-billing", "2").await;
    eventually(Duration::from_secs(10), "billing refreshed", || {
        let n = billing.hits(REFRESH);
        async move { n == 1 }
    })
    .await;
    set(&e.cms, "backend", "2").await;
    eventually(
        Duration::from_secs(10),
        "every Service labelled tier=backend refreshed",
        || {
            let (i, p) = (inventory.hits(REFRESH), payments.hits(REFRESH));
            async move { i == 1 && p == 1 }
        },
    )
    .await;
    set(&e.cms, "backend-pay", "2").await;
    eventually(
        Duration::from_secs(10),
        "only the Service with both labels refreshed",
        || {
            let p = payments.hits(REFRESH);
            async move { p == 2 }
        },
    )
    .await;
    set(&e.cms, "reports", "2").await;
    eventually(
        Duration::from_secs(10),
        "reports refreshed on the actuator annotation's port and path",
        || {
            let n = reports_pod.hits("POST /manage/refresh");
            async move { n == 1 }
        },
    )
    .await;
    wait_reports(&replica, &mut seen, Duration::from_secs(5), "6 done", |r| {
        r.iter().filter(|r| r["outcome"] == "done").count() >= 6
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    seen.extend(replica.reports());

    let totals = |p: &Pod| (p.hits(REFRESH), p.total());
    assert_eq!(totals(&o1), (1, 1), "orders pod 1");
    assert_eq!(totals(&o2), (1, 1), "orders pod 2");
    assert_eq!(o_unready.total(), 0, "the not-ready endpoint is not called");
    assert_eq!(totals(&billing), (1, 1), "billing: only by to-billing");
    assert_eq!(totals(&inventory), (1, 1), "inventory: only by backend");
    assert_eq!(
        totals(&payments),
        (2, 2),
        "payments: by backend and backend-pay"
    );
    assert_eq!(
        (
            reports_pod.hits("POST /manage/refresh"),
            reports_pod.total()
        ),
        (1, 1)
    );
    assert_eq!(
        decoy.total(),
        0,
        "the endpoint's own port is not used when the annotation sets one"
    );

    // One report per refreshService, all done on the first attempt.
    let mut done: Vec<(String, String, String, Value)> = seen
        .iter()
        .map(|r| {
            assert_eq!(r["outcome"], "done", "{r}");
            assert_eq!(r["attempt"], 1, "{r}");
            assert_eq!(r["plugin"], "http-refresh", "{r}");
            let a = &r["action"];
            assert_eq!(a["type"], "refreshService", "{r}");
            assert_eq!(a["method"], "POST", "{r}");
            assert_eq!(a["namespace"], NS, "{r}");
            (
                r["objects"][0].as_str().unwrap().to_string(),
                a["service"].as_str().unwrap().to_string(),
                a["path"].as_str().unwrap().to_string(),
                a["port"].clone(),
            )
        })
        .collect();
    done.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let row = |o: &str, s: &str, p: &str, port: Value| {
        (format!("ConfigMap/shop/{o}"), s.into(), p.into(), port)
    };
    assert_eq!(
        done,
        vec![
            row("backend", "inventory", "/actuator/refresh", Value::Null),
            row("backend", "payments", "/actuator/refresh", Value::Null),
            row("backend-pay", "payments", "/actuator/refresh", Value::Null),
            row("orders", "orders", "/actuator/refresh", Value::Null),
            row(
                "reports",
                "reports",
                "/manage/refresh",
                json!(reports_pod.addr.port())
            ),
            row("to-billing", "billing", "/actuator/refresh", Value::Null),
        ]
    );
}

// ------------------------------------------------------------ retries

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_pod_is_retried_until_it_answers_and_one_that_never_does_is_dead_lettered() {
    let _load = LOAD.read().await;
    let e = env(&HTTP_MANIFEST.replace("DEBOUNCE", "0s")).await;
    let (flaky, broken) = (Pod::start().await, Pod::start().await);
    flaky.answer(&[500, 500]);
    broken.answer(&[500; 100]);
    app(
        &e.client,
        "flaky",
        json!({"app": "flaky"}),
        json!({}),
        &ready(&[&flaky]),
    )
    .await;
    app(
        &e.client,
        "broken",
        json!({"app": "broken"}),
        json!({}),
        &ready(&[&broken]),
    )
    .await;
    for name in ["flaky", "broken"] {
        create(&e.cms, config_map(name, true, json!({}), "1")).await;
    }
    let replica = e.replica("solo", LOOKUP_WATCHES + 1).await;
    let mut seen = Vec::new();
    let for_service = |seen: &[Value], svc: &str| -> Vec<(u64, String)> {
        let r: Vec<&Value> = seen
            .iter()
            .filter(|r| r["action"]["service"] == svc)
            .collect();
        outcomes(&r)
    };

    set(&e.cms, "flaky", "2").await;
    wait_reports(
        &replica,
        &mut seen,
        Duration::from_secs(10),
        "flaky done",
        |r| r.iter().any(|r| r["outcome"] == "done"),
    )
    .await;
    assert_eq!(flaky.hits(REFRESH), 3, "two failures, then the success");
    assert_eq!(
        for_service(&seen, "flaky"),
        vec![
            (1, "retrying".into()),
            (2, "retrying".into()),
            (3, "done".into())
        ]
    );

    set(&e.cms, "broken", "2").await;
    wait_reports(
        &replica,
        &mut seen,
        Duration::from_secs(10),
        "broken dead-lettered",
        |r| r.iter().any(|r| r["outcome"] == "dead-lettered"),
    )
    .await;
    assert_eq!(
        for_service(&seen, "broken"),
        vec![
            (1, "retrying".into()),
            (2, "retrying".into()),
            (3, "retrying".into()),
            (4, "dead-lettered".into())
        ],
        "retries: 3, then a dead letter"
    );
    let dead = seen
        .iter()
        .find(|r| r["outcome"] == "dead-lettered")
        .unwrap();
    assert_eq!(dead["objects"], json!(["ConfigMap/shop/broken"]));
    assert!(dead["error"].as_str().unwrap().contains("500"), "{dead}");
    assert_eq!(broken.hits(REFRESH), 4, "the first attempt and 3 retries");

    let start = Instant::now();
    let warnings = loop {
        let found = e.events("ConfigMap", "broken", "RefreshFailed").await;
        if !found.is_empty() {
            break found;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no RefreshFailed Event on ConfigMap shop/broken within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let w = &warnings[0];
    assert_eq!(w.type_.as_deref(), Some("Warning"));
    assert_eq!(w.involved_object.namespace.as_deref(), Some(NS));
    let message = w.message.as_deref().unwrap_or("");
    assert!(
        message.contains("refreshService") && message.contains("http-refresh"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        e.events("ConfigMap", "flaky", "RefreshFailed")
            .await
            .is_empty(),
        "no dead letter for the change that succeeded"
    );
    assert_eq!(broken.hits(REFRESH), 4, "no attempt after the dead letter");
    assert_eq!(flaky.hits(REFRESH), 3);
}

// ------------------------------------------------------------ debounce

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_changes_within_the_debounce_window_refreshes_each_pod_once() {
    let _load = LOAD.read().await;
    let e = env(&HTTP_MANIFEST.replace("DEBOUNCE", "1s")).await;
    let (o1, o2) = (Pod::start().await, Pod::start().await);
    app(
        &e.client,
        "orders",
        json!({"app": "orders"}),
        json!({}),
        &ready(&[&o1, &o2]),
    )
    .await;
    create(&e.cms, config_map("orders", true, json!({}), "0")).await;
    let replica = e.replica("solo", LOOKUP_WATCHES + 1).await;

    let start = Instant::now();
    for i in 1..=50 {
        set(&e.cms, "orders", &i.to_string()).await;
        tokio::time::sleep(Duration::from_millis(8)).await;
    }
    let burst = start.elapsed();
    assert!(
        burst < Duration::from_millis(900),
        "the burst took {burst:?}: too slow for a 1 s window"
    );
    assert_eq!(
        (o1.total(), o2.total()),
        (0, 0),
        "nothing before the window closes"
    );
    let took = eventually(Duration::from_secs(10), "one refresh per pod", || {
        let (a, b) = (o1.hits(REFRESH), o2.hits(REFRESH));
        async move { a >= 1 && b >= 1 }
    })
    .await
        + burst;
    assert!(
        took >= Duration::from_secs(1),
        "refreshed {took:?} after the first change: before the window closed"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        (o1.total(), o2.total()),
        (1, 1),
        "50 changes in one window: one refresh per pod"
    );
    let reports = replica.reports();
    assert_eq!(reports.len(), 1, "{reports:#?}");
    assert_eq!(reports[0]["outcome"], "done");
    let objects = reports[0]["objects"].as_array().unwrap();
    assert!(
        !objects.is_empty() && objects.iter().all(|o| o == "ConfigMap/shop/orders"),
        "{objects:?}"
    );
    eprintln!(
        "debounce: 50 changes in {burst:?}, refreshed {took:?} after the first, {} changes coalesced",
        objects.len()
    );
}

// ------------------------------------------------------------ bus-refresh

const BUS_MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: false}
buses:
  - name: rabbit
    amqp: {url: \"AMQP_URL\"}
  - name: nats
    nats: {url: \"NATS_URL\"}
plugins:
  - name: bus-rabbit
    module: {module:bus-refresh}
    sha256: {sha256:bus-refresh}
    events: {kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}
    config: {connection: rabbit, destination: EXCHANGE}
    capabilities: {bus: [rabbit/EXCHANGE]}
    delivery: {debounce: 0s, retries: 3, backoffInitial: 100ms, backoffMax: 500ms}
  - name: bus-nats
    module: {module:bus-refresh}
    sha256: {sha256:bus-refresh}
    events: {kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}
    config: {connection: nats, destination: springCloudBus.refresh}
    capabilities: {bus: [nats/springCloudBus.refresh]}
    delivery: {debounce: 0s, retries: 3, backoffInitial: 100ms, backoffMax: 500ms}
";

/// The bus-refresh plugin's message id: a version-8 UUID from SHA-256 over
/// length-prefixed (object uid, resourceVersion, content digest, app, type).
fn bus_id(cm: &ConfigMap, app: &str) -> String {
    use sha2::{Digest, Sha256};
    let (uid, rv) = (
        cm.metadata.uid.clone().unwrap(),
        cm.metadata.resource_version.clone().unwrap(),
    );
    let d = digest(cm);
    let mut h = Sha256::new();
    for p in [uid.as_str(), &rv, &d, app, "RefreshRemoteApplicationEvent"] {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    let mut b = [0u8; 16];
    b.copy_from_slice(&h.finalize()[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let x: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &x[..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..]
    )
}

/// Checks a received Spring Cloud Bus message byte for byte (fields in
/// Spring's order); the timestamp must lie within `[since, now]`.
fn assert_bus_event(payload: &[u8], app: &str, id: &str, since: u64) {
    let text = std::str::from_utf8(payload).unwrap();
    let v: Value = serde_json::from_str(text).unwrap();
    let ts = v["timestamp"].as_u64().unwrap_or(0);
    let now = epoch_millis();
    assert!(
        since <= ts && ts <= now,
        "timestamp {ts} not within [{since}, {now}]: {text}"
    );
    let expected = format!(
        "{{\"type\":\"RefreshRemoteApplicationEvent\",\"timestamp\":{ts},\"originService\":\"wasmwatch\",\"destinationService\":\"{app}:**\",\"id\":\"{id}\"}}"
    );
    assert_eq!(text, expected);
}

fn epoch_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A replica with both bus plugins (AMQP to `exchange`, NATS to
/// `springCloudBus.refresh`), a NATS subscriber and an AMQP inspector.
/// (Fields drop in order: the replica goes before the servers.)
struct Bus {
    replica: Replica,
    sub: brokers::NatsSub,
    amqp: wasmwatch_bus::testing::AmqpTestClient,
    _nats: brokers::Nats,
    e: Env,
}

async fn bus(exchange: &str, config_maps: Vec<ConfigMap>) -> Bus {
    let rabbit = tokio::task::spawn_blocking(brokers::rabbit).await.unwrap();
    let nats = brokers::Nats::start(&[]);
    // The default vhost spelled out, as `%2f`.
    let amqp_url = format!("{}%2f", rabbit.url());
    let manifest = BUS_MANIFEST
        .replace("AMQP_URL", &amqp_url)
        .replace("NATS_URL", &nats.url())
        .replace("EXCHANGE", exchange);
    let e = env(&manifest).await;
    for cm in config_maps {
        create(&e.cms, cm).await;
    }
    let sub = brokers::NatsSub::subscribe(nats.port, "springCloudBus.refresh").await;
    let replica = e.replica("solo", LOOKUP_WATCHES + 1).await;
    let amqp = wasmwatch_bus::testing::AmqpTestClient::connect(&amqp_url)
        .await
        .unwrap();
    Bus {
        replica,
        sub,
        amqp,
        _nats: nats,
        e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_refresh_publishes_the_spring_cloud_bus_event_on_rabbitmq_and_nats() {
    let _load = LOAD.read().await;
    let apps = "spring.cloud.kubernetes.configmap.apps";
    let mut b = bus(
        "springCloudBus",
        vec![
            config_map("orders", true, json!({}), "1"),
            config_map("to-billing", true, json!({apps: "billing"}), "1"),
            config_map("unlabelled", false, json!({}), "1"),
        ],
    )
    .await;
    let mut seen = Vec::new();

    // 1. No consumer yet: the publisher declares springCloudBus (a durable
    //    topic exchange, as Spring's binder does); the message reaches no
    //    queue, which is no failure. The unlabelled ConfigMap publishes nothing.
    set(&b.e.cms, "unlabelled", "2").await;
    let since = epoch_millis();
    let orders = set(&b.e.cms, "orders", "2").await;
    wait_reports(
        &b.replica,
        &mut seen,
        Duration::from_secs(15),
        "both publishes done",
        |r| r.iter().filter(|r| r["outcome"] == "done").count() == 2,
    )
    .await;
    assert!(
        b.amqp
            .exchange_is("springCloudBus", "topic", true)
            .await
            .unwrap(),
        "springCloudBus should be a durable topic exchange"
    );
    let msg = b
        .sub
        .next_within(Duration::from_secs(5))
        .await
        .expect("a NATS message for orders");
    assert_eq!(msg.subject, "springCloudBus.refresh");
    assert_eq!(
        msg.headers.as_deref(),
        Some("NATS/1.0\r\ncontent-type: application/json\r\n\r\n")
    );
    assert_bus_event(&msg.payload, "orders", &bus_id(&orders, "orders"), since);

    // 2. A Spring Bus consumer's queue (bound with #) gets the event of each
    //    change, for the app the annotation names, as NATS does.
    b.amqp
        .queue_bound("spring-bus-anonymous", "springCloudBus", "#")
        .await
        .unwrap();
    for (cm, app) in [("to-billing", "billing"), ("orders", "orders")] {
        let since = epoch_millis();
        let changed = set(&b.e.cms, cm, "3").await;
        let n = seen.len() + 2;
        wait_reports(
            &b.replica,
            &mut seen,
            Duration::from_secs(15),
            "two more publishes done",
            |r| r.iter().filter(|r| r["outcome"] == "done").count() == n,
        )
        .await;
        let d = b
            .amqp
            .get("spring-bus-anonymous")
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no AMQP message for {app}"));
        assert_eq!(d.exchange, "springCloudBus");
        assert_eq!(
            d.routing_key, "springCloudBus",
            "the routing key defaults to the destination"
        );
        assert_eq!(
            d.properties.content_type.as_deref(),
            Some("application/json")
        );
        assert_bus_event(&d.body, app, &bus_id(&changed, app), since);
        assert_eq!(
            b.amqp.get("spring-bus-anonymous").await.unwrap(),
            None,
            "exactly one AMQP message for {cm}"
        );
        let msg = b
            .sub
            .next_within(Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("no NATS message for {app}"));
        assert_eq!(msg.subject, "springCloudBus.refresh");
        assert_bus_event(&msg.payload, app, &bus_id(&changed, app), since);
    }
    assert!(
        b.sub
            .next_within(Duration::from_millis(300))
            .await
            .is_none(),
        "exactly three NATS messages"
    );
    let mut by_plugin: Vec<(String, String, u64)> = seen
        .iter()
        .map(|r| {
            assert_eq!(r["outcome"], "done", "{r}");
            assert_eq!(r["action"]["type"], "publish", "{r}");
            (
                r["plugin"].as_str().unwrap().to_string(),
                r["objects"][0].as_str().unwrap().to_string(),
                r["attempt"].as_u64().unwrap(),
            )
        })
        .collect();
    by_plugin.sort();
    let row = |p: &str, o: &str| (p.to_string(), format!("ConfigMap/shop/{o}"), 1);
    assert_eq!(
        by_plugin,
        vec![
            row("bus-nats", "orders"),
            row("bus-nats", "orders"),
            row("bus-nats", "to-billing"),
            row("bus-rabbit", "orders"),
            row("bus-rabbit", "orders"),
            row("bus-rabbit", "to-billing"),
        ]
    );
}

/// One change naming two apps must reach both: one event per target app.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_refresh_publishes_one_event_per_target_app_of_a_change() {
    let _load = LOAD.read().await;
    let apps = "spring.cloud.kubernetes.configmap.apps";
    let mut b = bus(
        "springCloudBusApps",
        vec![config_map(
            "shared",
            true,
            json!({apps: "billing, orders"}),
            "1",
        )],
    )
    .await;
    b.amqp
        .declare_exchange("springCloudBusApps", "topic")
        .await
        .unwrap();
    b.amqp
        .queue_bound("apps-queue", "springCloudBusApps", "#")
        .await
        .unwrap();
    let since = epoch_millis();
    let shared = set(&b.e.cms, "shared", "2").await;
    let mut seen = Vec::new();
    wait_reports(
        &b.replica,
        &mut seen,
        Duration::from_secs(15),
        "publishes done",
        |r| r.iter().filter(|r| r["outcome"] == "done").count() >= 2,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    seen.extend(b.replica.reports());

    let mut amqp = Vec::new();
    while let Some(d) = b.amqp.get("apps-queue").await.unwrap() {
        amqp.push(d.body);
    }
    let mut nats = Vec::new();
    while let Some(m) = b.sub.next_within(Duration::from_millis(300)).await {
        nats.push(m.payload);
    }
    let destinations = |msgs: &[Vec<u8>]| -> Vec<String> {
        msgs.iter()
            .map(|m| {
                let v: Value = serde_json::from_slice(m).unwrap();
                v["destinationService"].as_str().unwrap_or("").to_string()
            })
            .collect()
    };
    let expected = ["billing:**", "orders:**"];
    // The two apps' messages are separate targets, sent concurrently: in
    // either order.
    let by_app = |msgs: &mut Vec<Vec<u8>>| {
        msgs.sort_by_key(|m| {
            serde_json::from_slice::<Value>(m).unwrap()["destinationService"].to_string()
        })
    };
    by_app(&mut amqp);
    by_app(&mut nats);
    for (bus, msgs) in [("AMQP", &amqp), ("NATS", &nats)] {
        assert_eq!(
            destinations(msgs),
            expected,
            "{bus}: one event per app named by the ConfigMap, none coalesced \
             into another app's. Reports: {seen:#?}"
        );
        for (m, app) in msgs.iter().zip(["billing", "orders"]) {
            assert_bus_event(m, app, &bus_id(&shared, app), since);
        }
    }
}

// ------------------------------------------------------------ rollout-restart

const RESTART_PLUGIN: &str = "  - name: rollout-restart
    module: {module:MODULE}
    sha256: {sha256:MODULE}
    events: {kinds: KINDS}
    capabilities: {restart: [shop]}
    delivery: {debounce: 0s, retries: 3, backoffInitial: 100ms, backoffMax: 500ms}
";

const HASH_PREFIX: &str = "config-hash.wasmwatch.io/";

fn container(extra: Value) -> Value {
    let mut c = json!({"name": "app", "image": "example/app:1"});
    c.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    c
}

/// (generation, template annotations) of a workload.
async fn rollout_state<K>(client: &kube::Client, name: &str) -> (i64, Value)
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), NS);
    let w = serde_json::to_value(api.get(name).await.unwrap()).unwrap();
    (
        w["metadata"]["generation"].as_i64().unwrap(),
        w.pointer("/spec/template/metadata/annotations")
            .cloned()
            .unwrap_or(Value::Null),
    )
}

async fn wait_generation<K>(client: &kube::Client, name: &str, generation: i64) -> Value
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let kind = K::kind(&Default::default()).to_string();
    let start = Instant::now();
    loop {
        let (g, annotations) = rollout_state::<K>(client, name).await;
        if g >= generation {
            assert_eq!(g, generation, "{kind} {name} restarted more than once");
            return annotations;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{kind} {name} not at generation {generation} within 10 s (at {g})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_restart_restarts_each_referencing_workload_once_per_content() {
    restarts_each_referencing_workload_once_per_content("rollout-restart").await;
}

/// The same with the JavaScript twin (plugins/js/rollout-restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_rollout_restart_restarts_each_referencing_workload_once_per_content() {
    restarts_each_referencing_workload_once_per_content("js/rollout-restart").await;
}

/// Compiles the Python and JavaScript twins into the artifact cache the
/// replicas use, once, before a replica starts: a JavaScript component takes
/// tens of seconds in a debug build, and a replica loading one plugin while
/// another test compiles the other could miss its 100 ms config check.
async fn warm_cache() {
    tokio::task::spawn_blocking(|| {
        wasmwatch_testkit::warm_artifact_cache(std::path::Path::new(env!(
            "CARGO_BIN_EXE_wasmwatch"
        )))
    })
    .await
    .unwrap();
}

/// rollout-restart `module` (a testkit component name) under `wasmwatch run`.
async fn restarts_each_referencing_workload_once_per_content(module: &str) {
    let _load = LOAD.read().await;
    let manifest = format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [ConfigMap, Secret], namespaces: [shop]}}
ha: {{enabled: false}}
plugins:
{}",
        RESTART_PLUGIN
            .replace("KINDS", "[ConfigMap, Secret]")
            .replace("MODULE", module)
    );
    let e = env(&manifest).await;
    warm_cache().await;
    let c = &e.client;
    let auto = json!({"reloader.stakater.com/auto": "true"});
    create(&e.cms, config_map("orders-config", false, json!({}), "1")).await;
    create(&e.cms, config_map("ledger-config", false, json!({}), "1")).await;
    let secrets: Api<Secret> = Api::namespaced(c.clone(), NS);
    let secret = |v: &str| -> Secret {
        serde_json::from_value(json!({"metadata": {"name": "agent-secret"},
            "stringData": {"token": v}}))
        .unwrap()
    };
    secrets
        .create(&PostParams::default(), &secret("s1"))
        .await
        .unwrap();
    let env_from = json!({"containers": [container(json!({
        "envFrom": [{"configMapRef": {"name": "orders-config"}}]}))]});
    workload(
        c,
        NS,
        "Deployment",
        "orders",
        auto.clone(),
        json!({}),
        env_from.clone(),
    )
    .await;
    // References the ConfigMap but does not ask for restarts.
    workload(
        c,
        NS,
        "Deployment",
        "bystander",
        json!({}),
        json!({}),
        env_from,
    )
    .await;
    // Asks on its pod template; references through a projected volume.
    workload(
        c,
        NS,
        "StatefulSet",
        "ledger",
        json!({}),
        auto.clone(),
        json!({"containers": [container(json!({})) ],
            "volumes": [{"name": "config", "projected": {"sources": [
                {"configMap": {"name": "ledger-config"}}]}}]}),
    )
    .await;
    workload(
        c,
        NS,
        "DaemonSet",
        "agent",
        json!({"secret.reloader.stakater.com/auto": "true"}),
        json!({}),
        json!({"containers": [container(json!({}))],
            "volumes": [{"name": "token", "secret": {"secretName": "agent-secret"}}]}),
    )
    .await;
    let replica = e.replica("solo", LOOKUP_WATCHES + 2).await;

    // 1. A content change restarts the Deployment once, recording the hash.
    let v2 = set(&e.cms, "orders-config", "2").await;
    let ann = wait_generation::<Deployment>(c, "orders", 2).await;
    let key = format!("{HASH_PREFIX}configmap.orders-config");
    assert_eq!(
        ann[&key],
        format!("configmap/orders-config:{}", digest(&v2)),
        "{ann}"
    );
    assert!(
        ann["kubectl.kubernetes.io/restartedAt"].is_string(),
        "{ann}"
    );

    // 2. A label-only change and a write of the same content: nothing. The
    //    ledger change after them, on the same watch stream, shows they were
    //    handled.
    let labels = json!({"metadata": {"labels": {"touched": "yes"}}});
    e.cms
        .patch(
            "orders-config",
            &PatchParams::default(),
            &Patch::Merge(&labels),
        )
        .await
        .unwrap();
    let mut same = e.cms.get("orders-config").await.unwrap();
    same.metadata.annotations = Some([("note".to_string(), "same content".to_string())].into());
    e.cms
        .replace("orders-config", &PostParams::default(), &same)
        .await
        .unwrap();
    set(&e.cms, "orders-config", "2").await;
    let ledger = set(&e.cms, "ledger-config", "2").await;
    let ann = wait_generation::<StatefulSet>(c, "ledger", 2).await;
    assert_eq!(
        ann[format!("{HASH_PREFIX}configmap.ledger-config")],
        format!("configmap/ledger-config:{}", digest(&ledger)),
        "{ann}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        rollout_state::<Deployment>(c, "orders").await.0,
        2,
        "no restart for a label change or the same content"
    );

    // 3. The next content restarts it again, once.
    let v3 = set(&e.cms, "orders-config", "3").await;
    let ann = wait_generation::<Deployment>(c, "orders", 3).await;
    assert_eq!(
        ann[&key],
        format!("configmap/orders-config:{}", digest(&v3))
    );

    // 4. A Secret change restarts the DaemonSet that mounts it.
    let s2 = secrets
        .patch(
            "agent-secret",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"token": "s2"}})),
        )
        .await
        .unwrap();
    let ann = wait_generation::<DaemonSet>(c, "agent", 2).await;
    assert_eq!(
        ann[format!("{HASH_PREFIX}secret.agent-secret")],
        format!("secret/agent-secret:{}", secret_digest(c, &s2).await),
        "{ann}"
    );

    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rollout_state::<Deployment>(c, "orders").await.0, 3);
    assert_eq!(rollout_state::<StatefulSet>(c, "ledger").await.0, 2);
    assert_eq!(rollout_state::<DaemonSet>(c, "agent").await.0, 2);
    let (g, ann) = rollout_state::<Deployment>(c, "bystander").await;
    assert_eq!(
        (g, ann),
        (1, json!({})),
        "a workload that does not ask is left alone"
    );
    for (kind, name, n) in [
        ("Deployment", "orders", 2),
        ("StatefulSet", "ledger", 1),
        ("DaemonSet", "agent", 1),
    ] {
        assert_eq!(
            e.occurrences(kind, name, "Reloaded", n).await,
            n,
            "Reloaded Events on {kind} {name}"
        );
    }
    let reports = replica.reports();
    let restarts = of_type(&reports, "restart");
    assert_eq!(restarts.len(), 4, "{reports:#?}");
    assert!(
        restarts.iter().all(|r| r["outcome"] == "done"),
        "{restarts:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_successor_restarts_only_for_new_content() {
    let _load = LOAD.write().await;
    let manifest = format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [ConfigMap], namespaces: [shop]}}
ha: {{enabled: true, namespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms}}
plugins:
{}    config: {{reloadOnCreate: true}}
",
        RESTART_PLUGIN
            .replace("KINDS", "[ConfigMap]")
            .replace("MODULE", "rollout-restart")
    );
    let e = env(&manifest).await;
    let c = &e.client;
    create(&e.cms, config_map("orders-config", false, json!({}), "1")).await;
    workload(
        c,
        NS,
        "Deployment",
        "orders",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({}),
        json!({"containers": [container(json!({
            "envFrom": [{"configMapRef": {"name": "orders-config"}}]}))]}),
    )
    .await;

    // The worst case for a failover: the successor cannot read the stored
    // checkpoints (hand-edited below), so it delivers every object once, as
    // added (and rollout-restart reloads on create here). The hash on the
    // workload must keep it from restarting again. (A successor that only
    // lacks the stored index rebuilds one from a list and delivers nothing
    // here: the object was not written after the checkpoint.)
    let before = e.server.open_watches();
    let (k, m) = (e.kubeconfig.clone(), e.manifest.clone());
    let (a, b) = tokio::task::spawn_blocking(move || {
        std::thread::scope(|s| {
            let a = s.spawn(|| Replica::start(&k, &m, "replica-a"));
            let b = Replica::start(&k, &m, "replica-b");
            (a.join().unwrap(), b)
        })
    })
    .await
    .unwrap();
    let start = Instant::now();
    let (mut first, second) = loop {
        if a.leading().await {
            break (a, b);
        }
        if b.leading().await {
            break (b, a);
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "nobody leads after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Lookups and a Lease watch each, plus the leader's ConfigMap watch.
    e.wait_for_watches(before + 2 * (LOOKUP_WATCHES + 1) + 1)
        .await;

    let v2 = set(&e.cms, "orders-config", "2").await;
    let ann = wait_generation::<Deployment>(c, "orders", 2).await;
    let key = format!("{HASH_PREFIX}configmap.orders-config");
    let hash_v2 = format!("configmap/orders-config:{}", digest(&v2));
    assert_eq!(ann[&key], hash_v2);

    // Its checkpoint has passed the change (the successor resumes after it).
    let rv2: u64 = v2
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    eventually(
        Duration::from_secs(5),
        "the checkpoint passes v2",
        || async { checkpoint(c, "shop").await.is_some_and(|rv| rv >= rv2) },
    )
    .await;

    // Killed; its checkpoints are unreadable and the history is gone.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.clone(), "default");
    let mut state = leases.get("wasmwatch-state").await.unwrap();
    state.metadata.annotations.as_mut().unwrap().insert(
        "wasmwatch.io/configmap-resource-version".into(),
        "shop=garbage".into(),
    );
    leases
        .replace("wasmwatch-state", &Default::default(), &state)
        .await
        .unwrap();
    e.server.faults().compact_history();
    eventually(Duration::from_secs(15), "the successor leads", || {
        second.leading()
    })
    .await;
    let mut seen = Vec::new();
    wait_reports(
        &second,
        &mut seen,
        Duration::from_secs(10),
        "the successor handles the change again",
        |r| {
            r.iter()
                .any(|r| r["action"]["contentHash"] == hash_v2.as_str() && r["outcome"] == "done")
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (g, after) = rollout_state::<Deployment>(c, "orders").await;
    assert_eq!(
        (g, &after),
        (2, &ann),
        "no second restart for content already restarted for"
    );

    let v3 = set(&e.cms, "orders-config", "3").await;
    let ann = wait_generation::<Deployment>(c, "orders", 3).await;
    assert_eq!(
        ann[&key],
        format!("configmap/orders-config:{}", digest(&v3))
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rollout_state::<Deployment>(c, "orders").await.0, 3);
    assert_eq!(
        e.occurrences("Deployment", "orders", "Reloaded", 2).await,
        2,
        "one Reloaded occurrence per restart"
    );
}

// ------------------------------------------------------- from Reloader

/// Reloader's hash of `application.yaml: "value: <v>"` (its
/// `GetSHAfromConfigmap`: SHA-1 of the sorted `k=v` joined by `;`),
/// checked against one value computed outside Rust.
fn reloader_sha(v: &str) -> String {
    let cm = config_map("x", false, json!({}), v);
    let snapshot =
        wasmwatch_core::ObjectSnapshot::from_json(&serde_json::to_value(&cm).unwrap()).unwrap();
    let hash = wasmwatch_core::digest::reloader_hash(snapshot.kind, &snapshot.data);
    if v == "1" {
        // python3: hashlib.sha1(b'application.yaml=value: 1').hexdigest()
        assert_eq!(hash, "a9252138a1296257fa1f4ceb32cc6af0e2dfe373");
    }
    hash
}

/// Reloader's annotations-strategy record, as its `json.Marshal` writes it.
fn last_reloaded_from(name: &str, hash: &str) -> String {
    format!(
        r#"{{"type":"CONFIGMAP","name":"{name}","namespace":"{NS}","hash":"{hash}","containerRefs":["app"],"observedAt":1733155200}}"#
    )
}

/// Issue 34 §3: a cluster moving from Reloader restarts nothing by itself,
/// on any path that delivers its objects again. Its workloads record the
/// current content in Reloader's forms: the `STAKATER_<NAME>_CONFIGMAP`
/// variable (env-vars, Reloader's default) or `last-reloaded-from`
/// (annotations). The leader cannot read the stored checkpoints, so it
/// delivers every ConfigMap again, and a ConfigMap created while running
/// is delivered as created (`reloadOnCreate`): nothing restarts. The first
/// real change restarts each workload once and records our hash; with
/// `env-vars` the variable then holds Reloader's hash of the new content,
/// so a switch back to Reloader restarts nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_reloader_restarted_for_the_current_content_restart_on_no_path() {
    let _load = LOAD.read().await;
    let manifest = format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [ConfigMap], namespaces: [shop]}}
ha: {{enabled: true, namespace: default}}
plugins:
{}    config: {{reloadOnCreate: true}}
",
        RESTART_PLUGIN
            .replace("KINDS", "[ConfigMap]")
            .replace("MODULE", "rollout-restart")
    );
    let e = env(&manifest).await;
    let c = &e.client;
    create(&e.cms, config_map("orders-config", false, json!({}), "1")).await;
    let auto = json!({"reloader.stakater.com/auto": "true"});
    let uses = |cm: &str, env: Value| {
        json!({"containers": [container(json!({
            "envFrom": [{"configMapRef": {"name": cm}}], "env": env}))]})
    };
    let var = |name: &str, v: &str| json!([{"name": name, "value": reloader_sha(v)}]);
    // Restarted by Reloader's env-vars strategy for the current content.
    workload(
        c,
        NS,
        "Deployment",
        "by-env",
        auto.clone(),
        json!({}),
        uses(
            "orders-config",
            var("STAKATER_ORDERS_CONFIG_CONFIGMAP", "1"),
        ),
    )
    .await;
    // By its annotations strategy.
    workload(
        c,
        NS,
        "Deployment",
        "by-annotation",
        auto.clone(),
        json!({"reloader.stakater.com/last-reloaded-from":
            last_reloaded_from("orders-config", &reloader_sha("1"))}),
        uses("orders-config", json!([])),
    )
    .await;
    // Kept on env-vars with us.
    workload(
        c,
        NS,
        "Deployment",
        "stays-env",
        json!({"reloader.stakater.com/auto": "true", "wasmwatch.io/reload-strategy": "env-vars"}),
        json!({}),
        uses(
            "orders-config",
            var("STAKATER_ORDERS_CONFIG_CONFIGMAP", "1"),
        ),
    )
    .await;
    // Restarted by Reloader for a ConfigMap that is created again later.
    workload(
        c,
        NS,
        "Deployment",
        "created",
        auto.clone(),
        json!({}),
        uses("late-config", var("STAKATER_LATE_CONFIG_CONFIGMAP", "7")),
    )
    .await;
    let names = ["by-env", "by-annotation", "stays-env", "created"];

    // The checkpoints cannot be read: every ConfigMap is delivered again.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.clone(), "default");
    let state = serde_json::from_value(json!({
        "metadata": {"name": "wasmwatch-state", "annotations": {
            "wasmwatch.io/configmap-resource-version": "shop=garbage",
        }}
    }))
    .unwrap();
    leases.create(&PostParams::default(), &state).await.unwrap();
    let replica = e.replica("replica-a", LOOKUP_WATCHES + 2).await;
    eventually(Duration::from_secs(10), "replica-a leads", || {
        replica.leading()
    })
    .await;
    let v1 = e.cms.get("orders-config").await.unwrap();
    let hash_v1 = format!("configmap/orders-config:{}", digest(&v1));
    let mut seen = Vec::new();
    wait_reports(
        &replica,
        &mut seen,
        Duration::from_secs(10),
        "the three restarts for the current content",
        |r| {
            r.iter()
                .filter(|r| r["action"]["contentHash"] == hash_v1.as_str())
                .count()
                >= 3
        },
    )
    .await;
    // Created while running, with reloadOnCreate.
    let late = config_map("late-config", false, json!({}), "7");
    create(&e.cms, late.clone()).await;
    let hash_late = format!("configmap/late-config:{}", digest(&late));
    wait_reports(
        &replica,
        &mut seen,
        Duration::from_secs(10),
        "the restart for the created ConfigMap",
        |r| {
            r.iter()
                .any(|r| r["action"]["contentHash"] == hash_late.as_str())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for name in names {
        let (g, annotations) = rollout_state::<Deployment>(c, name).await;
        assert_eq!(g, 1, "{name} restarted: {annotations}; {seen:#?}");
    }
    assert!(seen.iter().all(|r| r["outcome"] == "done"), "{seen:#?}");

    // The first real change restarts each once, and records it our way.
    let v2 = set(&e.cms, "orders-config", "2").await;
    let hash_v2 = format!("configmap/orders-config:{}", digest(&v2));
    let key = format!("{HASH_PREFIX}configmap.orders-config");
    for name in ["by-env", "by-annotation"] {
        let annotations = wait_generation::<Deployment>(c, name, 2).await;
        assert_eq!(annotations[&key], hash_v2, "{name}");
    }
    let annotations = wait_generation::<Deployment>(c, "stays-env", 2).await;
    assert!(annotations.get(&key).is_none(), "{annotations}");
    let api: Api<Deployment> = Api::namespaced(c.clone(), NS);
    let stays = serde_json::to_value(api.get("stays-env").await.unwrap()).unwrap();
    assert_eq!(
        stays.pointer("/spec/template/spec/containers/0/env/0"),
        Some(&json!({"name": "STAKATER_ORDERS_CONFIG_CONFIGMAP", "value": reloader_sha("2")})),
        "Reloader's hash of the new content, as Reloader would write it"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (name, g) in [
        ("by-env", 2),
        ("by-annotation", 2),
        ("stays-env", 2),
        ("created", 1),
    ] {
        assert_eq!(rollout_state::<Deployment>(c, name).await.0, g, "{name}");
    }
}
