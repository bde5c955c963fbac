//! `bench state [OBJECTS]` (issue 32): the stored state of a large cluster
//! with the real binary, HA on.
//!
//! OBJECTS (default 200,000; `BENCH_OBJECTS`) objects in 50 namespaces, half
//! ConfigMaps and half Secrets, with the metadata real clusters have:
//! ConfigMaps with Helm's labels and annotations and `kube-root-ca.crt`'s
//! 250-byte description, Secrets shaped like Helm's release Secrets
//! (`sh.helm.release.v1.<release>.v<n>`, type `helm.sh/release.v1`, labels
//! `name`, `owner`, `status`, `version`, a 4 KiB `release` value).
//! wasmwatch watches both kinds with the bundled rollout-restart (every
//! change is a plugin call), checkpoints every 2 s. Measured:
//!
//! 1. leader A: spawn → both watches open (the lists done), → the first
//!    stored state holding both kinds' indexes, RSS idle, what is stored
//!    (bytes of the state Lease and its segments, as JSON);
//! 2. 3,000 changes at 100/s, both kinds: state writes and bytes per change
//!    (every write to a state Lease from the request log, deletes
//!    included; the bytes of every version written, as JSON, from a
//!    watch);
//! 3. SIGTERM to A with a standby B: B's takeover (SIGTERM → both watches
//!    open → first save), the changes B delivers doing so (0: no storm),
//!    B's RSS;
//! 4. a leaderless gap past the history: B stopped, 20 objects deleted, 20
//!    changed, 20 created, the history dropped (410 on resume); C's changes
//!    delivered (exactly 60) and its RSS;
//! 5. the informer baseline (`bench __baseline` with a Secret reflector
//!    too): spawn → lists done, RSS idle, for the RSS ratio.
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use wasmwatch_apiserver::{Config, Server, ServerHandle};

use super::compare::{apiserver_runtime, process_cpu};
use super::{Replica, count_state_writes, create, metric, metric_sum, rss_kib, start};

const NAMESPACES: usize = 50;
const CHURN: usize = 6000;
const GAP: usize = 20;
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

/// rollout-restart declares which labels and annotations it reads, so the
/// index keeps only those; `BENCH_KEEP_ALL_METADATA=1` adds a plugin that
/// declares nothing (and gets no event: only `resynced` changes), so that
/// every label and annotation is kept, as before declarations.
fn manifest() -> String {
    let mut m = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap, Secret]}
ha: {enabled: true, namespace: default, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s}
plugins:
  - name: rollout-restart
    module: {module:rollout-restart}
    sha256: {sha256:rollout-restart}
    events: {kinds: [ConfigMap, Secret]}
    capabilities: {restart: [\"*\"]}
    delivery: {debounce: 0s}
"
    .to_string();
    if std::env::var_os("BENCH_KEEP_ALL_METADATA").is_some() {
        m.push_str(
            "  - name: undeclared
    module: {module:v3-restart}
    sha256: {sha256:v3-restart}
    events: {kinds: [ConfigMap, Secret], changes: [resynced]}
    capabilities: {restart: [\"*\"]}
",
        );
    }
    wasmwatch_testkit::pin(&m)
}

fn config_map(i: usize, version: usize) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("release-{i}-config"),
            "labels": {
                "app.kubernetes.io/managed-by": "Helm",
                "app.kubernetes.io/instance": format!("release-{i}"),
                "app.kubernetes.io/name": "app",
                "helm.sh/chart": "app-1.2.3",
            },
            "annotations": {
                "kubernetes.io/description": DESCRIPTION,
                "meta.helm.sh/release-name": format!("release-{i}"),
                "meta.helm.sh/release-namespace": format!("team-{}", i % NAMESPACES),
            },
        },
        "data": {
            "application.yaml": format!("server:\n  port: 8080\nfeature:\n  version: {version}\n"),
            "logback.xml": "<configuration><root level=\"INFO\"/></configuration>",
        },
    }))
    .unwrap()
}

fn release_secret(i: usize, version: usize) -> Secret {
    // Helm's release value is a gzipped, base64 JSON; random-looking bytes.
    let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version as u64;
    let release: String = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
                    [(x % 64) as usize],
            )
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("sh.helm.release.v1.release-{i}.v1"),
            "labels": {
                "name": format!("release-{i}"),
                "owner": "helm",
                "status": "deployed",
                "version": "1",
            },
        },
        "type": "helm.sh/release.v1",
        "stringData": {"release": release},
    }))
    .unwrap()
}

/// SIGTERM, then waits until the replica is gone.
fn term(r: &mut Replica) {
    let _ = Command::new("kill")
        .args(["-TERM", &r.child.id().to_string()])
        .status();
    let _ = r.child.wait();
}

fn spawn(work: &Path, kubeconfig: &Path, identity: &str) -> Replica {
    start(work, kubeconfig, &manifest(), identity)
}

/// Waits until both kinds' watches were opened since the request log was
/// last cleared; the time it took from `t`.
async fn watches_open(server: &ServerHandle, t: Instant, limit: Duration) -> Duration {
    loop {
        let requests = server.requests();
        let open = |resource: &str| {
            requests
                .iter()
                .any(|r| r.verb == "watch" && r.resource == resource)
        };
        if open("configmaps") && open("secrets") {
            return t.elapsed();
        }
        assert!(t.elapsed() < limit, "both watches never opened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the state Lease holds both kinds' indexes and was written
/// since the request log was last cleared, and the leader has nothing
/// unsaved.
async fn stored(server: &ServerHandle, admin: SocketAddr, t: Instant, limit: Duration) -> Duration {
    loop {
        let lease = server.get("leases.coordination.k8s.io", "default", "wasmwatch-state");
        let a = lease
            .as_ref()
            .map(|l| l["metadata"]["annotations"].clone())
            .unwrap_or_default();
        // A save after both watches opened (the claim writes it too).
        let requests = server.requests();
        let opened = ["configmaps", "secrets"].map(|resource| {
            requests
                .iter()
                .position(|r| r.verb == "watch" && r.resource == resource)
        });
        let written = match opened {
            [Some(x), Some(y)] => requests[x.max(y)..].iter().any(|r| {
                r.verb == "update"
                    && r.resource == "leases"
                    && r.name.as_deref() == Some("wasmwatch-state")
            }),
            _ => false,
        };
        if written
            && a["wasmwatch.io/index-log"]
                .as_str()
                .is_some_and(|l| l.contains("kinds=ConfigMap,Secret"))
            && metric(admin, "wasmwatch_checkpoint_lag_versions").await == 0.0
        {
            return t.elapsed();
        }
        assert!(t.elapsed() < limit, "the state was never stored");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the process used under 20 ms of CPU in 500 ms.
async fn settle(pid: u32) {
    let t = Instant::now();
    loop {
        let c0 = process_cpu(pid);
        tokio::time::sleep(Duration::from_millis(500)).await;
        if process_cpu(pid) - c0 <= Duration::from_millis(20)
            || t.elapsed() > Duration::from_secs(120)
        {
            return;
        }
    }
}

/// (Leases of the stored state, their bytes as JSON).
async fn stored_bytes(client: &kube::Client) -> (usize, usize) {
    let api: Api<Lease> = Api::namespaced(client.clone(), "default");
    let leases: Vec<Lease> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("wasmwatch-state"))
        })
        .collect();
    let bytes = leases
        .iter()
        .map(|l| serde_json::to_vec(l).unwrap().len())
        .sum();
    (leases.len(), bytes)
}

async fn received(admin: SocketAddr) -> f64 {
    metric_sum(admin, "wasmwatch_events_received_total").await
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

pub async fn state() {
    let objects: usize = std::env::args()
        .nth(2)
        .or_else(|| std::env::var("BENCH_OBJECTS").ok())
        .map(|n| {
            n.replace(',', "")
                .parse()
                .expect("state N: a number of objects")
        })
        .unwrap_or(200_000);
    let half = objects / 2;
    let server = apiserver_runtime()
        .spawn(Server::start(
            Config::default().bookmark_interval(Duration::from_secs(5)),
        ))
        .await
        .unwrap()
        .unwrap();
    let client = server.client().unwrap();
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = work.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let t = Instant::now();
    for n in 0..NAMESPACES {
        create(
            &client,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("team-{n}")}}),
        )
        .await;
    }
    let mut tasks = Vec::new();
    for w in 0..16 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..half).step_by(16) {
                let ns = format!("team-{}", i % NAMESPACES);
                Api::<ConfigMap>::namespaced(client.clone(), &ns)
                    .create(&PostParams::default(), &config_map(i, 0))
                    .await
                    .unwrap();
                Api::<Secret>::namespaced(client.clone(), &ns)
                    .create(&PostParams::default(), &release_secret(i, 0))
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    println!(
        "state: {half} ConfigMaps and {half} Secrets in {NAMESPACES} namespaces created in {:.0?}",
        t.elapsed()
    );
    let limit = Duration::from_secs(120).max(Duration::from_millis(3 * objects as u64));

    // 1. Leader A.
    server.clear_requests();
    let t = Instant::now();
    let mut a = spawn(work.path(), &kubeconfig, "state-a");
    let a_watch = watches_open(&server, t, limit).await;
    let a_stored = stored(&server, a.admin, t, limit).await;
    settle(a.child.id()).await;
    let (a_rss, _) = rss_kib(a.child.id());
    let (leases, bytes) = stored_bytes(&client).await;
    println!(
        "state: A: spawn -> both watches open {a_watch:.1?}, -> state stored {a_stored:.1?}; RSS idle {:.1} MiB; stored: {leases} Leases, {:.2} MB ({:.1} bytes per object)",
        mib(a_rss),
        bytes as f64 / 1e6,
        bytes as f64 / objects as f64
    );

    // 2. Churn at 100/s over both kinds; the bytes of every state Lease
    //    version written, from a watch.
    let written = count_state_writes(client.clone(), &server.resource_version().to_string());
    server.clear_requests();
    let t = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    for c in 0..CHURN {
        tick.tick().await;
        let i = (c * 7919) % half;
        let ns = format!("team-{}", i % NAMESPACES);
        if c % 2 == 0 {
            let patch = serde_json::json!({"data": {"application.yaml": format!("v: {c}")}});
            Api::<ConfigMap>::namespaced(client.clone(), &ns)
                .patch(
                    &format!("release-{i}-config"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .unwrap();
        } else {
            let patch = serde_json::json!({"stringData": {"release": format!("r{c}")}});
            Api::<Secret>::namespaced(client.clone(), &ns)
                .patch(
                    &format!("sh.helm.release.v1.release-{i}.v1"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .unwrap();
        }
    }
    // Two checkpoint intervals: the last changes are saved.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let churn_time = t.elapsed();
    // Creates and writes of the state's Leases, from the watch (a create's
    // request names no Lease); deletes are writes too, of no bytes.
    let deletes = server
        .requests()
        .into_iter()
        .filter(|r| {
            r.verb == "delete"
                && r.resource == "leases"
                && r.name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("wasmwatch-state"))
        })
        .count();
    let writes = written.writes() + deletes;
    let written_bytes = written.bytes();
    let state = server
        .get("leases.coordination.k8s.io", "default", "wasmwatch-state")
        .unwrap();
    let tail = state["metadata"]["annotations"]["wasmwatch.io/index-tail"]
        .as_str()
        .map_or(0, str::len);
    println!(
        "state: churn {CHURN} changes in {churn_time:.1?}: {writes} state writes ({:.4} per change, {deletes} of them deletes), ~{:.0} state bytes per change; the state Lease now {} bytes, {tail} of them the tail",
        writes as f64 / CHURN as f64,
        written_bytes as f64 / CHURN as f64,
        serde_json::to_vec(&state).unwrap().len(),
    );
    let (_, a_peak) = rss_kib(a.child.id());

    // 3. Handover to a standby.
    let mut b = spawn(work.path(), &kubeconfig, "state-b");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b0 = received(b.admin).await;
    server.clear_requests();
    let t = Instant::now();
    term(&mut a);
    let b_watch = watches_open(&server, t, limit).await;
    let b_stored = stored(&server, b.admin, t, limit).await;
    settle(b.child.id()).await;
    let b_delivered = received(b.admin).await - b0;
    let (b_rss, b_peak) = rss_kib(b.child.id());
    println!(
        "state: SIGTERM A -> B: both watches open {b_watch:.1?}, state stored {b_stored:.1?}; changes B delivered {b_delivered}; B RSS idle {:.1} MiB, peak {:.1}; A's peak was {:.1}",
        mib(b_rss),
        mib(b_peak),
        mib(a_peak)
    );

    // 4. A leaderless gap past the history.
    term(&mut b);
    for g in 0..GAP {
        let i = g * (half / GAP);
        let ns = format!("team-{}", i % NAMESPACES);
        let (cms, secrets) = (
            Api::<ConfigMap>::namespaced(client.clone(), &ns),
            Api::<Secret>::namespaced(client.clone(), &ns),
        );
        if g % 2 == 0 {
            cms.delete(&format!("release-{i}-config"), &DeleteParams::default())
                .await
                .unwrap();
            secrets
                .delete(
                    &format!("sh.helm.release.v1.release-{i}.v1"),
                    &DeleteParams::default(),
                )
                .await
                .unwrap();
        } else {
            let patch = serde_json::json!({"data": {"application.yaml": format!("gap {g}")}});
            cms.patch(
                &format!("release-{i}-config"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();
            let patch = serde_json::json!({"stringData": {"release": format!("gap {g}")}});
            secrets
                .patch(
                    &format!("sh.helm.release.v1.release-{i}.v1"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .unwrap();
        }
        let new = half + g;
        cms.create(&PostParams::default(), &config_map(new, 0))
            .await
            .unwrap();
        secrets
            .create(&PostParams::default(), &release_secret(new, 0))
            .await
            .unwrap();
    }
    // Deletions and changes count once per object, both kinds: GAP / 2
    // deleted and GAP / 2 changed of each kind, GAP created of each.
    let expected = 2 * (GAP + GAP);
    server.set_history(1);
    let mut c = spawn(work.path(), &kubeconfig, "state-c");
    server.clear_requests();
    let t = Instant::now();
    let c_watch = watches_open(&server, t, limit).await;
    let c_stored = stored(&server, c.admin, t, limit).await;
    settle(c.child.id()).await;
    let c_delivered = received(c.admin).await;
    let (c_rss, _) = rss_kib(c.child.id());
    println!(
        "state: gap past the history -> C: both watches open {c_watch:.1?}, state stored {c_stored:.1?}; changes C delivered {c_delivered} (of {expected} made in the gap); C RSS idle {:.1} MiB",
        mib(c_rss)
    );
    term(&mut c);

    // 5. The informer baseline over both kinds.
    server.clear_requests();
    let t = Instant::now();
    let mut baseline = Command::new(std::env::current_exe().unwrap())
        .arg("__baseline")
        .env("RUST_LOG", "error")
        .env("BASELINE_SECRETS", "1")
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(baseline.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base_ready = t.elapsed();
    settle(baseline.id()).await;
    let (base_rss, base_peak) = rss_kib(baseline.id());
    let _ = baseline.kill();
    let _ = baseline.wait();
    println!(
        "state: informer baseline (ConfigMaps and Secrets): lists done {base_ready:.1?}; RSS idle {:.1} MiB, peak {:.1}",
        mib(base_rss),
        mib(base_peak)
    );
    println!(
        "state: RSS wasmwatch / baseline, idle: A {:.2}x, B {:.2}x, C {:.2}x; A's peak / baseline's peak {:.2}x",
        a_rss as f64 / base_rss as f64,
        b_rss as f64 / base_rss as f64,
        c_rss as f64 / base_rss as f64,
        a_peak as f64 / base_peak as f64
    );
    server.shutdown().await;
}
