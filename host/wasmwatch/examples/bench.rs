//! End-to-end benchmarks of `wasmwatch run` as a real process (release
//! build) against the test API server, with real HTTP apps:
//!
//! ```sh
//! cargo build --release -p wasmwatch --bins --examples
//! /var/tmp/wasmwatch-target/release/examples/bench [latency|throughput|throughput-in-process|burst|startup|startup-python|memory|workloads|all]
//! /var/tmp/wasmwatch-target/release/examples/bench compare [N]
//! /var/tmp/wasmwatch-target/release/examples/bench state [OBJECTS]
//! ```
//!
//! - `latency`: ConfigMap write → POST /actuator/refresh arriving at the app,
//!   debounce 0, 100 changes/s spread over 50 apps; p50/p99 over 1,000 changes.
//! - `throughput`: a burst of changes through the watch loop into (a) a no-op
//!   plugin, (b) the three bundled plugins; events handled per second (from
//!   /metrics) and API writes to the state Leases per event (counted by a
//!   watch on the Leases, independent of wasmwatch's own numbers); the
//!   writers are 4 HTTP streams, then, for the three plugins once more, the
//!   API server's in-process writer, faster than the host. `WASMWATCH_BIN=`
//!   another build of wasmwatch runs that one (before/after comparisons).
//! - `startup`: spawn to ready with the three bundled plugins, cold and warm
//!   compile cache; `startup-python`: the same with only the Python
//!   http-refresh (plugins/python/http-refresh; goal: warm under 300 ms).
//! - `memory`: RSS of a replica watching 10,000 ConfigMaps of 10 KiB each.
//! - `burst`: 100,000 changes from the in-process writer over 1,000 objects;
//!   how long until all are handled, and the replica's peak RSS (work in
//!   flight is bounded, issue 19).
//! - `workloads` (not part of `all`; issue 20): 10,000 workloads with real
//!   pod templates (env `configMapKeyRef`, a `configMap` volume; half opted
//!   in with `reloader.stakater.com/auto`) over 200 ConfigMaps in 10
//!   namespaces, cached by a replica running rollout-restart granted every
//!   kind: (a) the three apps/v1 kinds only, (b) six kinds mixed (+ batch/v1
//!   CronJob and Job, Argo Rollout), each on a fresh API server. Idle RSS
//!   with the caches filled, events handled per second over a burst of
//!   5,000 changes from the in-process writer (restarts included), peak
//!   RSS, and the ratios mixed / apps-only. See `bench/workloads.rs`.
//! - `compare [N]` (not part of `all`): wasmwatch against a kube-rs informer
//!   baseline (the peer of issue 24, a process of this binary) on the same
//!   API server, ConfigMaps, apps and load, in one run: CPU per change,
//!   write -> POST latency, a burst, the API server's CPU and Events per
//!   change, RSS and start-up; medians of N runs (default 3, or
//!   `BENCH_RUNS`) and the ratios. See `bench/compare.rs`.
//!
//! Numbers go to stdout; nothing here asserts (the machines are noisy).
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmwatch_apiserver::{Config, Server, ServerHandle};

#[path = "bench/baseline.rs"]
mod baseline;
#[path = "bench/compare.rs"]
mod compare;
#[path = "bench/state.rs"]
mod state;
#[path = "bench/workloads.rs"]
mod workloads;

fn wasmwatch_bin() -> PathBuf {
    // Another build of the host, for before/after comparisons.
    if let Some(bin) = std::env::var_os("WASMWATCH_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/examples/bench -> target/<profile>/wasmwatch
    exe.parent().unwrap().parent().unwrap().join("wasmwatch")
}

/// An app pod: records when each POST arrived.
async fn pod() -> (SocketAddr, Arc<Mutex<Vec<Instant>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(Mutex::new(Vec::new()));
    let h = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let h = h.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 2048];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    h.lock().unwrap().push(Instant::now());
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    buf.drain(..end);
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, hits)
}

async fn create(client: &kube::Client, value: serde_json::Value) {
    let obj: DynamicObject = serde_json::from_value(value.clone()).unwrap();
    let gvk = kube::api::GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
    let (ar, caps) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    let api: Api<DynamicObject> = match obj.metadata.namespace.as_deref() {
        Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
            Api::namespaced_with(client.clone(), ns, &ar)
        }
        _ => Api::all_with(client.clone(), &ar),
    };
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {value}: {e}"));
}

async fn app(client: &kube::Client, ns: &str, name: &str, pod: SocketAddr) {
    create(
        client,
        serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"ports": [{"name": "http", "port": 8080}], "selector": {"app": name}}}),
    )
    .await;
    create(
        client,
        serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [pod.ip().to_string()], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": pod.port(), "protocol": "TCP"}]}),
    )
    .await;
}

fn labelled(name: &str, app: &str, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name,
            "labels": {"spring.cloud.kubernetes.config": "true"},
            "annotations": {"spring.cloud.kubernetes.configmap.apps": app}},
        "data": {"application.yaml": value}
    }))
    .unwrap()
}

struct Replica {
    child: Child,
    admin: SocketAddr,
    started_to_ready: Duration,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &Path, kubeconfig: &Path, manifest: &str, identity: &str) -> Replica {
    let path = dir.join(format!("{identity}.yaml"));
    std::fs::write(&path, manifest).unwrap();
    let t = Instant::now();
    let mut child = Command::new(wasmwatch_bin())
        .args(["run", "--manifest", path.to_str().unwrap()])
        .args(["--identity", identity, "--admin-addr", "127.0.0.1:0"])
        .args(["--cache-dir", dir.join("cache").to_str().unwrap()])
        .args(["--checkpoint-interval", "2s"])
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAMESPACE", "default")
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start wasmwatch (build it: cargo build --release -p wasmwatch --bins --examples)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let started_to_ready = t.elapsed();
    let ready: serde_json::Value = serde_json::from_str(&line).expect("ready line");
    let admin = ready["admin"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    Replica {
        child,
        admin,
        started_to_ready,
    }
}

/// The /metrics text, or "" while the admin port does not answer.
async fn scrape(admin: SocketAddr) -> String {
    let Ok(mut s) = tokio::net::TcpStream::connect(admin).await else {
        return String::new();
    };
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    text
}

async fn metric(admin: SocketAddr, series: &str) -> f64 {
    scrape(admin)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The sum of every series of a family (`name{...} value` lines).
async fn metric_sum(admin: SocketAddr, family: &str) -> f64 {
    scrape(admin)
        .await
        .lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn leading(admin: SocketAddr) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(admin).await else {
        return false;
    };
    s.write_all(b"GET /leader HTTP/1.0\r\n\r\n").await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    text.ends_with("true") || text.ends_with("true\n")
}

async fn wait_leading(r: &Replica) {
    let t = Instant::now();
    while !leading(r.admin).await {
        assert!(t.elapsed() < Duration::from_secs(30), "never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The leader's watches are up once its first checkpoint is written.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

struct Cluster {
    server: ServerHandle,
    client: kube::Client,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

async fn cluster() -> Cluster {
    let server = Server::start(Config::default().bookmark_interval(Duration::from_secs(5)))
        .await
        .unwrap();
    let client = server.client().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    create(
        &client,
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    )
    .await;
    Cluster {
        server,
        client,
        dir,
        kubeconfig,
    }
}

const HTTP_REFRESH: &str = "  - name: http-refresh
    module: {module:http-refresh}
    sha256: {sha256:http-refresh}
    events: {kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}
    capabilities: {refresh: [shop]}
    delivery: {debounce: 0s, retries: 3, backoffInitial: 100ms, backoffMax: 1s}
";

fn manifest(plugins: &str) -> String {
    wasmwatch_testkit::pin(&format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [ConfigMap], namespaces: [shop]}}
ha: {{enabled: true, namespace: default, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s}}
buses:
  - name: nats
    nats: {{url: \"nats://127.0.0.1:4\"}}
plugins:
{plugins}"
    ))
}

async fn latency() {
    const APPS: usize = 50;
    const CHANGES: usize = 1000;
    let c = cluster().await;
    let mut pods = Vec::new();
    for i in 0..APPS {
        let (addr, hits) = pod().await;
        app(&c.client, "shop", &format!("app-{i}"), addr).await;
        pods.push(hits);
    }
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "shop");
    for i in 0..APPS {
        cms.create(
            &PostParams::default(),
            &labelled(&format!("cm-{i}"), &format!("app-{i}"), "v0"),
        )
        .await
        .unwrap();
    }
    let r = start(
        c.dir.path(),
        &c.kubeconfig,
        &manifest(HTTP_REFRESH),
        "bench-0",
    );
    wait_leading(&r).await;
    // 100 changes/s, round robin over the apps: write times per app.
    let mut writes: Vec<Vec<Instant>> = vec![Vec::new(); APPS];
    let tick = Duration::from_millis(10);
    let t0 = Instant::now();
    for k in 0..CHANGES {
        let due = t0 + tick * k as u32;
        tokio::time::sleep_until(due.into()).await;
        let i = k % APPS;
        let at = Instant::now();
        set_data(&cms, &format!("cm-{i}"), format!("v{}", k + 1)).await;
        writes[i].push(at);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Each write's latency: until the first POST on its app after it.
    let mut lat = Vec::new();
    let mut missing = 0;
    for (i, w) in writes.iter().enumerate() {
        let hits = pods[i].lock().unwrap().clone();
        for at in w {
            match hits.iter().find(|h| *h >= at) {
                Some(h) => lat.push(*h - *at),
                None => missing += 1,
            }
        }
    }
    lat.sort();
    let posts: usize = pods.iter().map(|p| p.lock().unwrap().len()).sum();
    println!(
        "latency: {CHANGES} changes at 100/s over {APPS} apps (debounce 0): write->POST p50 {:.2?}, p90 {:.2?}, p99 {:.2?}, max {:.2?}; {posts} POSTs, {missing} changes without a POST after them",
        percentile(&lat, 0.5),
        percentile(&lat, 0.9),
        percentile(&lat, 0.99),
        lat.last().unwrap()
    );
    drop(r);
    c.server.shutdown().await;
}

/// Writes to the state Leases (`wasmwatch-state*`) seen by a watch:
/// how many, and the bytes of every version written (as JSON).
#[derive(Default)]
struct StateWrites {
    writes: std::sync::atomic::AtomicUsize,
    bytes: std::sync::atomic::AtomicUsize,
}

impl StateWrites {
    fn writes(&self) -> usize {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn bytes(&self) -> usize {
        self.bytes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Counts writes to the state Leases by watching them from version `from`.
fn count_state_writes(client: kube::Client, from: &str) -> Arc<StateWrites> {
    let n = Arc::new(StateWrites::default());
    let count = n.clone();
    let from = from.to_string();
    tokio::spawn(async move {
        use std::sync::atomic::Ordering::Relaxed;
        let api: Api<Lease> = Api::namespaced(client, "default");
        let stream = api.watch(&WatchParams::default(), &from).await.unwrap();
        futures_util::pin_mut!(stream);
        while let Some(Ok(e)) = stream.next().await {
            if let WatchEvent::Added(l) | WatchEvent::Modified(l) = e
                && l.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("wasmwatch-state"))
            {
                count.writes.fetch_add(1, Relaxed);
                let bytes = serde_json::to_vec(&l).unwrap().len();
                count.bytes.fetch_add(bytes, Relaxed);
                if std::env::var_os("BENCH_TRACE_STATE").is_some() {
                    let a = l.metadata.annotations.unwrap_or_default();
                    let sizes: Vec<String> =
                        a.iter().map(|(k, v)| format!("{k}={}", v.len())).collect();
                    eprintln!(
                        "state write {:?} {bytes} bytes: {}",
                        l.metadata.name,
                        sizes.join(" ")
                    );
                }
            }
        }
    });
    n
}

/// Sets `application.yaml` of ConfigMap `name` with a merge patch (HTTP).
async fn set_data(cms: &Api<ConfigMap>, name: &str, value: String) {
    let patch = serde_json::json!({"data": {"application.yaml": value}});
    cms.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The plugins' entries of the three bundled plugins (bus-refresh loaded,
/// selecting nothing: no bus in these benchmarks).
fn three_plugins() -> String {
    format!(
        "{HTTP_REFRESH}  - name: rollout-restart
    module: {{module:rollout-restart}}
    sha256: {{sha256:rollout-restart}}
    events: {{kinds: [ConfigMap]}}
    capabilities: {{restart: [shop]}}
  - name: bus-refresh
    module: {{module:bus-refresh}}
    sha256: {{sha256:bus-refresh}}
    events: {{kinds: [ConfigMap], labelSelector: bus=true}}
    config: {{connection: nats}}
    capabilities: {{bus: [\"nats/*\"]}}
"
    )
}

/// Who writes the burst of changes.
#[derive(Clone, Copy)]
enum Writer {
    /// 4 concurrent streams of merge patches over HTTP (kube-rs), as
    /// clients write; on 2 cores they reach 5,900-7,700 writes/s.
    Http,
    /// In the API server's process (`ServerHandle::modify`), each change
    /// still an update with its own watch event; tens of thousands per
    /// second, so the host's decisions, not the writer, set the pace.
    InProcess,
}

async fn throughput_with(
    name: &str,
    plugins: &str,
    objects: usize,
    changes: usize,
    writer: Writer,
) {
    let c = cluster().await;
    // An app with no ready endpoints: http-refresh decides, the executor has
    // nobody to call (this measures the host, not an app).
    create(
        &c.client,
        serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "ghost", "namespace": "shop"},
        "spec": {"ports": [{"name": "http", "port": 8080}]}}),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "shop");
    for i in 0..objects {
        cms.create(
            &PostParams::default(),
            &labelled(&format!("cm-{i}"), "ghost", "v0"),
        )
        .await
        .unwrap();
    }
    let r = start(c.dir.path(), &c.kubeconfig, &manifest(plugins), "bench-0");
    wait_leading(&r).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes = count_state_writes(c.client.clone(), "0");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before_writes = writes.writes();
    let handled0 = metric(
        r.admin,
        "wasmwatch_events_handled_total{kind=\"ConfigMap\"}",
    )
    .await;
    let calls0 = metric_sum(r.admin, "wasmwatch_plugin_invocations_total").await;
    let t = Instant::now();
    let per = changes / 4;
    match writer {
        Writer::Http => {
            let mut tasks = Vec::new();
            for w in 0..4 {
                let cms = cms.clone();
                tasks.push(tokio::spawn(async move {
                    for k in 0..per {
                        let i = (w * per + k) % objects;
                        set_data(&cms, &format!("cm-{i}"), format!("w{w}k{k}")).await;
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        }
        Writer::InProcess => {
            for k in 0..per * 4 {
                let name = format!("cm-{}", k % objects);
                c.server
                    .modify("configmaps", "shop", &name, |o| {
                        o["data"]["application.yaml"] = serde_json::json!(format!("k{k}"))
                    })
                    .unwrap();
                // Let the watch streams run on this worker too.
                if k % 256 == 255 {
                    tokio::task::yield_now().await;
                }
            }
        }
    }
    let wrote = t.elapsed();
    let target = handled0 + (per * 4) as f64;
    // Plugin calls (decisions) apart from delivery, whose per-target and
    // global rate limits (5/s per target, 200/s overall) coalesce actions.
    let (mut calls, mut last_call) = (calls0, t.elapsed());
    loop {
        let c = metric_sum(r.admin, "wasmwatch_plugin_invocations_total").await;
        if c > calls {
            (calls, last_call) = (c, t.elapsed());
        }
        let h = metric(
            r.admin,
            "wasmwatch_events_handled_total{kind=\"ConfigMap\"}",
        )
        .await;
        if h >= target {
            break;
        }
        if t.elapsed() > Duration::from_secs(120) {
            // A watch that falls behind the API server's broadcast buffer is
            // ended (as kube-apiserver does); resuming past the history is a
            // 410 and a relist that delivers each object's last content once:
            // the changes in between are coalesced, never handled one by one.
            let (rss, peak) = rss_kib(r.child.id());
            let resyncs = metric_sum(r.admin, "wasmwatch_resyncs_total").await;
            let restarts = metric_sum(r.admin, "wasmwatch_watch_restarts_total").await;
            println!(
                "throughput {name}: only {} of {} handled after {:.0?} ({resyncs} resyncs, {restarts} watch restarts); RSS {:.1} MiB, peak {:.1} MiB",
                h - handled0,
                per * 4,
                t.elapsed(),
                rss as f64 / 1024.0,
                peak as f64 / 1024.0
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = t.elapsed();
    // The replica's peak RSS over the whole run (baseline list included).
    let (_, peak) = rss_kib(r.child.id());
    // Let the last checkpoint land, then count the writes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let state_writes = writes.writes() - before_writes;
    println!(
        "throughput {name}: {} changes over {objects} objects written in {wrote:.2?}, all handled after {took:.2?}: {:.0} events/s; {} plugin calls, the last after {last_call:.2?}: {:.0} calls/s; {state_writes} state Lease writes = {:.4} per event; peak RSS {:.1} MiB",
        per * 4,
        (per * 4) as f64 / took.as_secs_f64(),
        calls - calls0,
        (calls - calls0) / last_call.as_secs_f64(),
        state_writes as f64 / (per * 4) as f64,
        peak as f64 / 1024.0
    );
    if std::env::var_os("BENCH_DUMP").is_some() {
        for l in scrape(r.admin)
            .await
            .lines()
            .filter(|l| l.starts_with("wasmwatch_action") || l.starts_with("wasmwatch_dead"))
        {
            println!("  {l}");
        }
    }
    drop(r);
    c.server.shutdown().await;
}

async fn throughput() {
    let noop = "  - name: noop
    module: {module:misbehave}
    sha256: {sha256:misbehave}
    events: {kinds: [ConfigMap]}
    config: {mode: noop}
";
    throughput_with("no-op plugin", noop, 200, 4000, Writer::Http).await;
    throughput_with("http-refresh alone", HTTP_REFRESH, 200, 4000, Writer::Http).await;
    let three = three_plugins();
    throughput_with(
        "three bundled plugins (bus-refresh loaded, selecting nothing)",
        &three,
        200,
        4000,
        Writer::Http,
    )
    .await;
    throughput_with(
        "three bundled plugins, in-process writer",
        &three,
        200,
        20_000,
        Writer::InProcess,
    )
    .await;
}

async fn startup() {
    let c = cluster().await;
    let three = manifest(&three_plugins());
    let cold = start(c.dir.path(), &c.kubeconfig, &three, "cold").started_to_ready;
    let mut warm = Vec::new();
    for i in 0..7 {
        warm.push(
            start(c.dir.path(), &c.kubeconfig, &three, &format!("warm-{i}")).started_to_ready,
        );
    }
    warm.sort();
    println!(
        "startup with the three bundled plugins: spawn -> ready cold cache {cold:.2?}; warm cache median {:.2?} (min {:.2?}, max {:.2?}, 7 runs)",
        percentile(&warm, 0.5),
        warm[0],
        warm.last().unwrap()
    );
    c.server.shutdown().await;
}

/// Spawn to ready with one Python plugin (plugins/python/http-refresh).
async fn startup_python() {
    let c = cluster().await;
    let one = manifest(&HTTP_REFRESH.replace(":http-refresh}", ":python/http-refresh}"));
    let cold = start(c.dir.path(), &c.kubeconfig, &one, "cold").started_to_ready;
    let mut warm = Vec::new();
    for i in 0..7 {
        warm.push(start(c.dir.path(), &c.kubeconfig, &one, &format!("warm-{i}")).started_to_ready);
    }
    warm.sort();
    println!(
        "startup with the Python http-refresh: spawn -> ready cold cache {cold:.2?}; warm cache median {:.2?} (min {:.2?}, max {:.2?}, 7 runs; goal: under 300 ms)",
        percentile(&warm, 0.5),
        warm[0],
        warm.last().unwrap()
    );
    c.server.shutdown().await;
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn memory() {
    let objects: usize = std::env::var("BENCH_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let c = cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "shop");
    let value = "x".repeat(10 * 1024 - 20);
    let mut tasks = Vec::new();
    for w in 0..8 {
        let cms = cms.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..objects).step_by(8) {
                cms.create(
                    &PostParams::default(),
                    &labelled(&format!("cm-{i}"), "ghost", &format!("{i}{value}")),
                )
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let r = start(
        c.dir.path(),
        &c.kubeconfig,
        &manifest(&format!(
            "{HTTP_REFRESH}  - name: rollout-restart
    module: {{module:rollout-restart}}
    sha256: {{sha256:rollout-restart}}
    events: {{kinds: [ConfigMap]}}
    capabilities: {{restart: [shop]}}
"
        )),
        "mem-0",
    );
    wait_leading(&r).await;
    // The baseline list of 10,000 objects, then the index write.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (rss, hwm) = rss_kib(r.child.id());
    println!(
        "memory: {objects} ConfigMaps of 10 KiB ({} MiB raw) watched: RSS {:.1} MiB, peak {:.1} MiB",
        objects * 10 / 1024,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    drop(r);
    c.server.shutdown().await;
}

#[tokio::main]
async fn main() {
    let what = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    if what == "__baseline" {
        // The informer baseline's own process (`bench compare` starts it).
        baseline::run().await;
        return;
    }
    if what == "compare" {
        let runs = std::env::args()
            .nth(2)
            .or_else(|| std::env::var("BENCH_RUNS").ok())
            .map(|n| n.parse().expect("compare N: a number of runs"))
            .unwrap_or(3);
        compare::compare(runs).await;
        return;
    }
    if what == "state" {
        // Issue 32: the stored state of a 200k-object cluster.
        state::state().await;
        return;
    }
    let all = what == "all";
    if all || what == "startup" {
        startup().await;
    }
    if all || what == "startup-python" {
        startup_python().await;
    }
    if all || what == "latency" {
        latency().await;
    }
    if all || what == "throughput" {
        throughput().await;
    }
    if what == "throughput-in-process" {
        throughput_with(
            "three bundled plugins, in-process writer",
            &three_plugins(),
            200,
            20_000,
            Writer::InProcess,
        )
        .await;
    }
    if what == "burst" {
        // Issue 19: work in flight is bounded; the peak RSS of a 100,000-
        // change burst from the in-process writer over 1,000 objects.
        throughput_with(
            "burst of 100,000 changes, three bundled plugins",
            &three_plugins(),
            1000,
            100_000,
            Writer::InProcess,
        )
        .await;
    }
    if all || what == "memory" {
        memory().await;
    }
    if what == "workloads" {
        // Issue 20: 10,000 workloads of the three apps/v1 kinds cached,
        // then of six kinds mixed.
        workloads::workloads().await;
    }
}
