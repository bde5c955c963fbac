//! `bench workloads` (issue 20): what caching more workload kinds costs.
//!
//! Two setups, one after the other, each against a fresh test API server:
//! (a) 10,000 workloads of today's three apps/v1 kinds (Deployments,
//! StatefulSets, DaemonSets), (b) 10,000 of six kinds (the three, batch/v1
//! CronJobs and Jobs, argoproj.io/v1alpha1 Rollouts, ~1,667 each). Every
//! workload has a pod template as in a real cluster (one or two containers,
//! an env `configMapKeyRef` and a `configMap` volume) referencing one of 200
//! ConfigMaps in 10 namespaces (50 workloads each), and half of them carry
//! `reloader.stakater.com/auto: "true"` (Jobs also
//! `wasmwatch.io/recreate-job: "true"`, without which their restart fails
//! for good). wasmwatch runs the bundled rollout-restart alone, granted
//! every kind (`restart: {namespaces, kinds}`), debounce 0, and rate limits
//! far above the load (100,000/s: the host's own work sets the pace, not
//! its guard; `BENCH_RATE_LIMITS=default` keeps the defaults).
//!
//! Per setup: RSS once idle after the caches filled (ready, leading, the
//! baseline saved), then a burst of 5,000 ConfigMap changes from the API
//! server's in-process writer over the 200 ConfigMaps (25 each): events
//! handled per second (from /metrics, as `throughput` counts them: a change
//! is handled when its decision and its restarts are over), plugin calls
//! per second, restarts done and dead-lettered, and the peak RSS. Then the
//! ratios mixed / apps-only. `BENCH_WORKLOADS` and `BENCH_CHANGES` change
//! the sizes.
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

use super::{cluster, create, metric, metric_sum, rss_kib, scrape, start, wait_leading};

const NAMESPACES: usize = 10;
const CONFIGMAPS: usize = 200;
/// Concurrent HTTP streams creating the workloads.
const CREATORS: usize = 16;

#[derive(Clone, Copy)]
struct Kind {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
}

impl Kind {
    fn resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(self.group, self.version, self.kind),
            self.plural,
        )
    }

    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

const fn kind(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
) -> Kind {
    Kind {
        group,
        version,
        kind,
        plural,
    }
}

const DEPLOYMENT: Kind = kind("apps", "v1", "Deployment", "deployments");
const STATEFULSET: Kind = kind("apps", "v1", "StatefulSet", "statefulsets");
const DAEMONSET: Kind = kind("apps", "v1", "DaemonSet", "daemonsets");
const CRONJOB: Kind = kind("batch", "v1", "CronJob", "cronjobs");
const JOB: Kind = kind("batch", "v1", "Job", "jobs");
const ROLLOUT: Kind = kind("argoproj.io", "v1alpha1", "Rollout", "rollouts");

const APPS_ONLY: &[Kind] = &[DEPLOYMENT, STATEFULSET, DAEMONSET];
const MIXED: &[Kind] = &[DEPLOYMENT, STATEFULSET, DAEMONSET, CRONJOB, JOB, ROLLOUT];

fn namespace(i: usize) -> String {
    format!("bench-{i}")
}

/// ConfigMap `cm-i` lives in namespace `bench-(i % 10)`.
fn configmap_namespace(i: usize) -> String {
    namespace(i % NAMESPACES)
}

/// Workload `idx` of its kind: its namespace, and the ConfigMap it uses (one
/// of the 20 of that namespace). Half of the workloads of each ConfigMap
/// opt in to restarts.
fn placement(idx: usize) -> (usize, usize, bool) {
    let ns = idx % NAMESPACES;
    let per_ns = CONFIGMAPS / NAMESPACES;
    let cm = ns + NAMESPACES * ((idx / NAMESPACES) % per_ns);
    let opted_in = (idx / CONFIGMAPS).is_multiple_of(2);
    (ns, cm, opted_in)
}

/// A pod template as in a real cluster: one or two containers, an env var
/// from a ConfigMap key, the ConfigMap mounted.
fn pod_template(name: &str, cm: &str, two_containers: bool, job: bool) -> Value {
    let mut containers = vec![json!({
        "name": "app",
        "image": "registry.example/shop/app:1.4.2",
        "args": ["--config", "/etc/app/application.yaml"],
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "env": [
            {"name": "LOG_LEVEL", "value": "info"},
            {"name": "FEATURE_FLAGS", "valueFrom": {"configMapKeyRef": {"name": cm, "key": "flags"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        ],
        "volumeMounts": [{"name": "config", "mountPath": "/etc/app", "readOnly": true}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5}
    })];
    if two_containers {
        containers.push(json!({
            "name": "proxy",
            "image": "registry.example/envoy:1.30.1",
            "args": ["-c", "/etc/app/proxy.yaml"],
            "ports": [{"name": "admin", "containerPort": 9901, "protocol": "TCP"}],
            "volumeMounts": [{"name": "config", "mountPath": "/etc/app", "readOnly": true}],
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}
        }));
    }
    let mut spec = json!({
        "containers": containers,
        "volumes": [{"name": "config", "configMap": {"name": cm}}]
    });
    if job {
        spec["restartPolicy"] = json!("OnFailure");
    }
    json!({"metadata": {"labels": {"app": name, "tier": "backend"}}, "spec": spec})
}

/// Workload `idx` of `kind`: its namespace and object.
fn workload(kind: &Kind, idx: usize) -> (String, Value) {
    let (ns, cm, opted_in) = placement(idx);
    let name = format!("{}-{idx}", kind.kind.to_lowercase());
    let cm = format!("cm-{cm}");
    let is_job = kind.kind == "Job" || kind.kind == "CronJob";
    let template = pod_template(&name, &cm, idx.is_multiple_of(3), is_job);
    let mut annotations = serde_json::Map::new();
    annotations.insert("owner".into(), json!("team-shop"));
    if opted_in {
        annotations.insert("reloader.stakater.com/auto".into(), json!("true"));
        if kind.kind == "Job" {
            annotations.insert("wasmwatch.io/recreate-job".into(), json!("true"));
        }
    }
    let selector = json!({"matchLabels": {"app": name}});
    let spec = match kind.kind {
        "Deployment" => json!({"replicas": 2, "selector": selector, "template": template}),
        "StatefulSet" => json!({"replicas": 1, "serviceName": name,
            "selector": selector, "template": template}),
        "DaemonSet" => json!({"selector": selector, "template": template}),
        "CronJob" => json!({"schedule": "0 3 * * *",
            "jobTemplate": {"spec": {"backoffLimit": 2, "template": template}}}),
        // No selector: the API server generates it from the Job's uid.
        "Job" => json!({"backoffLimit": 2, "template": template}),
        "Rollout" => json!({"replicas": 2, "selector": selector, "template": template,
            "strategy": {"canary": {"steps": [{"setWeight": 20}, {"pause": {"duration": "1m"}}]}}}),
        other => unreachable!("no such kind in the bench: {other}"),
    };
    let ns = namespace(ns);
    let obj = json!({
        "apiVersion": kind.api_version(),
        "kind": kind.kind,
        "metadata": {"name": name, "namespace": ns,
            "labels": {"app": name, "tier": "backend"}, "annotations": annotations},
        "spec": spec
    });
    (ns, obj)
}

/// `total` workloads spread round robin over `kinds`, created by concurrent
/// HTTP streams; how long that took.
async fn create_workloads(client: &kube::Client, kinds: &[Kind], total: usize) -> Duration {
    let objects: Vec<(ApiResource, String, DynamicObject)> = (0..total)
        .map(|j| {
            let kind = &kinds[j % kinds.len()];
            let (ns, obj) = workload(kind, j / kinds.len());
            (kind.resource(), ns, serde_json::from_value(obj).unwrap())
        })
        .collect();
    let objects = Arc::new(objects);
    let t = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..CREATORS {
        let objects = objects.clone();
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for (ar, ns, obj) in objects.iter().skip(w).step_by(CREATORS) {
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
                api.create(&PostParams::default(), obj)
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "create {} {ns}/{}: {e}",
                            ar.kind,
                            obj.metadata.name.as_deref().unwrap_or_default()
                        )
                    });
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    t.elapsed()
}

fn manifest(namespaces: &str) -> String {
    let rates = if std::env::var("BENCH_RATE_LIMITS").as_deref() == Ok("default") {
        String::new()
    } else {
        "rateLimits: {global: {perSecond: 100000, burst: 100000}, \
         perTarget: {perSecond: 100000, burst: 100000}}\n"
            .to_string()
    };
    wasmwatch_testkit::pin(&format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [ConfigMap], namespaces: [{namespaces}]}}
ha: {{enabled: true, namespace: default, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s}}
{rates}plugins:
  - name: rollout-restart
    module: {{module:rollout-restart}}
    sha256: {{sha256:rollout-restart}}
    events: {{kinds: [ConfigMap]}}
    capabilities: {{restart: {{namespaces: [{namespaces}], kinds: [Deployment, StatefulSet, DaemonSet, batch/v1/CronJob, batch/v1/Job, argoproj.io/v1alpha1/Rollout]}}}}
    delivery: {{debounce: 0s}}
"
    ))
}

/// The sum of the series of `family` whose labels hold every one of `labels`.
async fn metric_where(admin: std::net::SocketAddr, family: &str, labels: &[&str]) -> f64 {
    scrape(admin)
        .await
        .lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with('{'))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One setup's numbers.
struct Outcome {
    idle_kib: u64,
    peak_kib: u64,
    events_per_s: f64,
    /// False when not every change was handled before the timeout.
    complete: bool,
}

async fn setup(name: &str, kinds: &[Kind], total: usize, changes: usize) -> Outcome {
    let c = cluster().await;
    let namespaces: Vec<String> = (0..NAMESPACES).map(namespace).collect();
    for ns in &namespaces {
        create(
            &c.client,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
    }
    for i in 0..CONFIGMAPS {
        let ns = configmap_namespace(i);
        let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("cm-{i}"), "namespace": ns},
            "data": {"application.yaml": format!("server:\n  port: 8080\nshop:\n  id: {i}\n"),
                "flags": "checkout-v2=false"}
        }))
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let created = create_workloads(&c.client, kinds, total).await;
    let list = kinds
        .iter()
        .enumerate()
        .map(|(k, kind)| {
            let n = (total + kinds.len() - 1 - k) / kinds.len();
            format!("{n} {}s", kind.kind)
        })
        .collect::<Vec<_>>()
        .join(", ");
    let r = start(
        c.dir.path(),
        &c.kubeconfig,
        &manifest(&namespaces.join(", ")),
        "workloads-0",
    );
    // Ready means the lookups' caches hold every workload.
    let ready = r.started_to_ready;
    wait_leading(&r).await;
    // The baseline of the ConfigMaps saved, nothing in flight.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (idle_kib, _) = rss_kib(r.child.id());

    let handled_series = "wasmwatch_events_handled_total{kind=\"ConfigMap\"}";
    let handled0 = metric(r.admin, handled_series).await;
    let calls0 = metric_sum(r.admin, "wasmwatch_plugin_invocations_total").await;
    let done0 = metric_where(
        r.admin,
        "wasmwatch_actions_total",
        &["type=\"restart\"", "outcome=\"done\""],
    )
    .await;
    let dead0 = metric_where(
        r.admin,
        "wasmwatch_dead_letters_total",
        &["type=\"restart\""],
    )
    .await;
    let t = Instant::now();
    for k in 0..changes {
        let i = k % CONFIGMAPS;
        c.server
            .modify(
                "configmaps",
                &configmap_namespace(i),
                &format!("cm-{i}"),
                |o| {
                    o["data"]["flags"] = json!(format!("checkout-v2={}", k.is_multiple_of(2)));
                    o["data"]["application.yaml"] = json!(format!(
                        "server:\n  port: 8080\nshop:\n  id: {i}\n  change: {k}\n"
                    ));
                },
            )
            .unwrap();
        // Let the watch streams run on this worker too.
        if k % 256 == 255 {
            tokio::task::yield_now().await;
        }
    }
    let wrote = t.elapsed();
    let target = handled0 + changes as f64;
    let timeout = Duration::from_secs(300);
    let (mut calls, mut last_call) = (calls0, t.elapsed());
    let handled = loop {
        let n = metric_sum(r.admin, "wasmwatch_plugin_invocations_total").await;
        if n > calls {
            (calls, last_call) = (n, t.elapsed());
        }
        let h = metric(r.admin, handled_series).await;
        if h >= target || t.elapsed() > timeout {
            break h - handled0;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let took = t.elapsed();
    let complete = handled >= changes as f64;
    let (_, peak_kib) = rss_kib(r.child.id());
    let done = metric_where(
        r.admin,
        "wasmwatch_actions_total",
        &["type=\"restart\"", "outcome=\"done\""],
    )
    .await
        - done0;
    let dead = metric_where(
        r.admin,
        "wasmwatch_dead_letters_total",
        &["type=\"restart\""],
    )
    .await
        - dead0;
    let events_per_s = handled / took.as_secs_f64();
    println!(
        "workloads {name}: {total} workloads ({list}; created in {created:.2?}) over {CONFIGMAPS} ConfigMaps in {NAMESPACES} namespaces; spawn -> ready (caches filled) {ready:.2?}; idle RSS {:.1} MiB; {changes} changes written in {wrote:.2?}, {}{handled:.0} handled after {took:.2?}: {events_per_s:.0} events/s; {:.0} plugin calls, the last after {last_call:.2?}: {:.0} calls/s; {done:.0} restarts done, {dead:.0} dead-lettered; peak RSS {:.1} MiB",
        idle_kib as f64 / 1024.0,
        if complete { "" } else { "ONLY " },
        calls - calls0,
        (calls - calls0) / last_call.as_secs_f64(),
        peak_kib as f64 / 1024.0,
    );
    drop(r);
    c.server.shutdown().await;
    Outcome {
        idle_kib,
        peak_kib,
        events_per_s,
        complete,
    }
}

pub async fn workloads() {
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: a number")))
            .unwrap_or(default)
    };
    let total = env("BENCH_WORKLOADS", 10_000);
    let changes = env("BENCH_CHANGES", 5_000);
    let apps = setup("apps/v1 only (3 kinds)", APPS_ONLY, total, changes).await;
    let mixed = setup(
        "mixed (6 kinds: + CronJob, Job, Rollout)",
        MIXED,
        total,
        changes,
    )
    .await;
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "workloads mixed / apps-only: events/s {:.0} / {:.0} = {:.2}x{}; idle RSS {:.1} / {:.1} MiB = {:.2}x; peak RSS {:.1} / {:.1} MiB = {:.2}x",
        mixed.events_per_s,
        apps.events_per_s,
        mixed.events_per_s / apps.events_per_s,
        if apps.complete && mixed.complete {
            ""
        } else {
            " (a burst not fully handled: see above)"
        },
        mib(mixed.idle_kib),
        mib(apps.idle_kib),
        mixed.idle_kib as f64 / apps.idle_kib as f64,
        mib(mixed.peak_kib),
        mib(apps.peak_kib),
        mixed.peak_kib as f64 / apps.peak_kib as f64,
    );
}
