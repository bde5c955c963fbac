//! `/metrics` and Events as an operator sees them: a real `wasmwatch run`
//! process refreshes a real HTTP app; its `/metrics` OpenMetrics text parses
//! with an independent Prometheus parser (prometheus-parse) and the counters
//! move with the change; a `Refreshed` Event lands on the app's Service.
mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use prometheus_parse::{Scrape, Value};
use wasmwatch_apiserver::{Config, Server};

const MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: false}
plugins:
  - name: http-refresh
    module: {module:http-refresh}
    sha256: {sha256:http-refresh}
    events: {kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}
    capabilities: {refresh: [shop]}
    delivery: {debounce: 0s, retries: 3, backoffInitial: 100ms, backoffMax: 1s}
";

/// The status line and headers of a GET.
async fn raw_head(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    buf.split_once("\r\n\r\n").unwrap().0.to_string() + "\r\n"
}

async fn scrape(r: &Replica) -> Scrape {
    let (status, text) = get(r.admin, "/metrics").await.expect("/metrics answers");
    assert_eq!(status, 200);
    assert!(
        text.ends_with("\n# EOF\n"),
        "OpenMetrics ends with # EOF: {text}"
    );
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text format")
}

/// The value of the sample `name` whose labels include `labels`, 0 if none.
fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    s.samples
        .iter()
        .filter(|x| x.metric == name)
        .filter(|x| labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match &x.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max),
            Value::Summary(_) => f64::NAN,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_move_and_a_refresh_leaves_an_event_on_the_service() {
    let server = Server::start(Config::default()).await.unwrap();
    let client = server.client().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let manifest = dir.path().join("manifest.yaml");
    std::fs::write(&manifest, wasmwatch_testkit::pin(MANIFEST)).unwrap();
    namespace(&client, "shop").await;
    let pods = [Pod::start().await, Pod::start().await];
    service(&client, "shop", "orders", &[&pods[0], &pods[1]], &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "shop");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "orders", "labels": {"spring.cloud.kubernetes.config": "true"}},
        "data": {"greeting": "hello"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();

    let r = Replica::start(&kubeconfig, &manifest, "replica-a");
    let before = scrape(&r).await;
    let head = raw_head(r.admin, "/metrics").await;
    assert!(
        head.to_ascii_lowercase().contains(
            "\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"
        ),
        "{head}"
    );
    // Every family is exposed with HELP and TYPE, even before any event
    // (OpenMetrics names a counter family without the `_total` of its
    // series).
    for family in [
        "wasmwatch_events_received",
        "wasmwatch_plugin_duration_seconds",
        "wasmwatch_actions",
        "wasmwatch_dead_letters",
        "wasmwatch_k8s_events_dropped",
        "wasmwatch_queue_depth",
        "wasmwatch_checkpoint_lag_seconds",
        "wasmwatch_leader",
        "wasmwatch_watch_restarts",
        "wasmwatch_resyncs",
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            before.docs.contains_key(family),
            "{family} has no HELP line: {:?}",
            before.docs.keys()
        );
    }
    assert_eq!(
        value(&before, "wasmwatch_leader", &[]),
        1.0,
        "HA off: it acts"
    );
    assert!(value(&before, "process_resident_memory_bytes", &[]) > 0.0);
    assert!(value(&before, "process_open_fds", &[]) > 0.0);
    let received = value(
        &before,
        "wasmwatch_events_received_total",
        &[("kind", "ConfigMap")],
    );

    tokio::time::sleep(Duration::from_millis(300)).await;
    cms.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"greeting": "hi"}})),
    )
    .await
    .unwrap();
    eventually(Duration::from_secs(10), "both pods refreshed", || async {
        pods.iter().all(|p| p.hits(REFRESH) == 1)
    })
    .await;
    // The report is counted just after the POSTs are answered.
    let mut after = scrape(&r).await;
    for _ in 0..50 {
        if value(
            &after,
            "wasmwatch_actions_total",
            &[("type", "refreshService"), ("outcome", "done")],
        ) >= 1.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        after = scrape(&r).await;
    }
    assert_eq!(
        value(
            &after,
            "wasmwatch_events_received_total",
            &[("kind", "ConfigMap")]
        ),
        received + 1.0
    );
    assert_eq!(
        value(
            &after,
            "wasmwatch_actions_total",
            &[("type", "refreshService"), ("outcome", "done")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &after,
            "wasmwatch_plugin_invocations_total",
            &[("plugin", "http-refresh"), ("outcome", "ok")]
        ),
        1.0
    );
    // The histogram's +Inf bucket: one plugin call observed.
    assert_eq!(
        value(
            &after,
            "wasmwatch_plugin_duration_seconds",
            &[("plugin", "http-refresh"), ("outcome", "ok")]
        ),
        1.0,
        "{:?}",
        after
            .samples
            .iter()
            .filter(|s| s.metric.starts_with("wasmwatch_plugin_duration"))
            .collect::<Vec<_>>()
    );

    // The Event on the app's Service (issue 35), with its uid, as
    // `kubectl describe service` finds it.
    let events: Api<Event> = Api::namespaced(client.clone(), "shop");
    eventually(Duration::from_secs(5), "a Refreshed Event", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("Refreshed")
                    && e.involved_object.kind.as_deref() == Some("Service")
                    && e.involved_object.name.as_deref() == Some("orders")
                    && e.involved_object.uid.is_some()
                    && e.message.as_deref().is_some_and(|m| {
                        m.contains("plugin http-refresh") && m.contains(": 2 pods answered")
                    })
            })
    })
    .await;
}

/// Events name what was done: a plugin's plain `http` action (a webhook,
/// not a refresh of a Service's pods) leaves `WebhookCalled` with the
/// status it was answered with, and `WebhookFailed` when it fails for
/// good; never `Refreshed` or `RefreshFailed` (issue 21).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_call_is_named_as_such_in_its_events_not_refreshed() {
    let hook = Pod::start().await;
    let url = format!("http://{}/hooks/config", hook.addr);
    let manifest = format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [ConfigMap], namespaces: [shop]}}
ha: {{enabled: false}}
plugins:
  - name: hook
    module: {{module:misbehave}}
    sha256: {{sha256:misbehave}}
    config: {{mode: echo-url, url: \"{url}\"}}
    events: {{kinds: [ConfigMap]}}
    capabilities: {{http: [\"http://127.0.0.1:*/hooks/*\"]}}
    delivery: {{debounce: 0s, retries: 0, backoffInitial: 100ms, backoffMax: 100ms}}
"
    );
    let e = test_env(&manifest, "shop").await;
    let cms: Api<ConfigMap> = Api::namespaced(e.client.clone(), "shop");
    for name in ["called", "refused"] {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}, "data": {"v": "1"}
        }))
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let _r = Replica::start(&e.kubeconfig, &e.manifest, "replica-a");
    // The lookups' eight and ConfigMaps'.
    e.server.wait_for_watches(9).await;
    let events: Api<Event> = Api::namespaced(e.client.clone(), "shop");
    let on = |name: &'static str| {
        let events = events.clone();
        async move {
            events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some(name))
                .map(|e| {
                    (
                        e.reason.unwrap_or_default(),
                        e.type_.unwrap_or_default(),
                        e.message.unwrap_or_default(),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    let bump = |name: &'static str| {
        let cms = cms.clone();
        async move {
            cms.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"data": {"v": "2"}})),
            )
            .await
            .unwrap();
        }
    };

    bump("called").await;
    eventually(Duration::from_secs(10), "an Event on `called`", || async {
        !on("called").await.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        on("called").await,
        vec![(
            "WebhookCalled".to_string(),
            "Normal".to_string(),
            format!("POST {url} answered 200 (plugin hook)")
        )]
    );
    assert_eq!(hook.hits("POST /hooks/config"), 1);

    // 404: permanent, dead-lettered at once.
    hook.answer(&[404]);
    bump("refused").await;
    eventually(Duration::from_secs(10), "an Event on `refused`", || async {
        !on("refused").await.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let failed = on("refused").await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (reason, kind, message) = &failed[0];
    assert_eq!(
        (reason.as_str(), kind.as_str()),
        ("WebhookFailed", "Warning")
    );
    assert!(
        message.contains(&format!("POST {url}")) && message.contains("404"),
        "{message}"
    );
}
