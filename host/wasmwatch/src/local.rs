//! `wasmwatch local`: the whole main job on an embedded local cluster.
//!
//! In one process: the test API server (real HTTP; kubectl works against the
//! kubeconfig it writes), a sample app `shop/orders` (three pods, real HTTP
//! servers answering the actuator refresh, behind a Service with
//! EndpointSlices), a Deployment `shop/orders` that takes its environment
//! from the ConfigMap (Reloader's `auto` annotation), the ConfigMap itself
//! (labelled for Spring Cloud Kubernetes), and two wasmwatch replicas
//! electing a leader and running the plugins of the given manifest.
//!
//! No controllers run in the test API server: [`crate::local_controller`]
//! stands in for the Deployment, StatefulSet and DaemonSet controllers, so
//! `kubectl rollout status` and `kubectl wait --for=condition=Available`
//! work (for the sample app and for workloads applied with kubectl).
//!
//! With `--scripted` it makes one change, waits for every pod's refresh and
//! the Deployment's rollout, and exits 0 — or 1 when they do not come.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use tokio::sync::watch;

use crate::run::{Reports, RunOptions};

#[derive(Debug, Clone)]
pub struct LocalOptions {
    pub manifest: PathBuf,
    /// Where the kubeconfig is written.
    pub dir: PathBuf,
    pub cache_dir: Option<PathBuf>,
    /// How to reach registries for `oci://` modules.
    pub registry: wasmwatch_oci::RegistryOptions,
    /// Make one change, wait for its effects, exit.
    pub scripted: bool,
    /// How long the scripted run waits for the refresh and the rollout.
    pub timeout: Duration,
    /// Port of the API server (0: any free one).
    pub port: u16,
}

const NAMESPACE: &str = "shop";
const PODS: usize = 3;

/// One pod of the sample app: counts actuator refreshes.
struct SamplePod {
    name: String,
    addr: SocketAddr,
    refreshes: Arc<AtomicUsize>,
}

async fn start_pod(name: String) -> anyhow::Result<SamplePod> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let refreshes = Arc::new(AtomicUsize::new(0));
    let count = refreshes.clone();
    let pod = name.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let count = count.clone();
            let pod = pod.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let refresh = req.method() == hyper::Method::POST
                        && req.uri().path() == "/actuator/refresh";
                    if refresh {
                        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                        println!(
                            "  pod {NAMESPACE}/{pod}: POST /actuator/refresh (refresh #{n}): configuration reloaded"
                        );
                    }
                    let body = if refresh {
                        "[\"greeting\"]"
                    } else {
                        "not found"
                    };
                    let status = if refresh { 200 } else { 404 };
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .status(status)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body)))
                                .expect("static response"),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(SamplePod {
        name,
        addr,
        refreshes,
    })
}

async fn create(client: &kube::Client, value: serde_json::Value) -> anyhow::Result<()> {
    let obj: DynamicObject = serde_json::from_value(value)?;
    let types = obj
        .types
        .clone()
        .context("object without apiVersion/kind")?;
    let gvk = kube::api::GroupVersionKind::try_from(&types)?;
    let (ar, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match (&obj.metadata.namespace, caps.scope) {
        (Some(ns), kube::discovery::Scope::Namespaced) => {
            Api::namespaced_with(client.clone(), ns, &ar)
        }
        _ => Api::all_with(client.clone(), &ar),
    };
    api.create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("cannot create {} {:?}", types.kind, obj.metadata.name))?;
    Ok(())
}

/// Namespace, pods, Service, EndpointSlice, ConfigMap, Deployment.
async fn sample_app(client: &kube::Client) -> anyhow::Result<Vec<SamplePod>> {
    use serde_json::json;
    create(
        client,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
    )
    .await?;
    let mut pods = Vec::new();
    for i in 0..PODS {
        pods.push(start_pod(format!("orders-{i}")).await?);
    }
    create(
        client,
        json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "orders", "namespace": NAMESPACE, "labels": {"app": "orders"}},
        "spec": {"selector": {"app": "orders"}, "ports": [{"name": "http", "port": 8080}]}}),
    )
    .await?;
    // One slice per pod: each local "pod" listens on its own loopback port.
    for pod in &pods {
        create(
            client,
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": pod.name, "namespace": NAMESPACE,
                "labels": {"kubernetes.io/service-name": "orders"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [pod.addr.ip().to_string()], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "name": pod.name, "namespace": NAMESPACE}}],
            "ports": [{"name": "http", "port": pod.addr.port(), "protocol": "TCP"}]}),
        )
        .await?;
    }
    create(
        client,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "orders", "namespace": NAMESPACE,
            "labels": {"spring.cloud.kubernetes.config": "true"}},
        "data": {"greeting": "hello"}}),
    )
    .await?;
    create(
        client,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "orders", "namespace": NAMESPACE,
            "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"replicas": PODS, "selector": {"matchLabels": {"app": "orders"}},
            "template": {"metadata": {"labels": {"app": "orders"}},
                "spec": {"containers": [{"name": "orders", "image": "example/orders:1",
                    "envFrom": [{"configMapRef": {"name": "orders"}}]}]}}}}),
    )
    .await?;
    Ok(pods)
}

/// Runs the local cluster until `shutdown` (or the scripted change is
/// through). Returns whether the scripted change had its effects.
pub async fn run(
    options: LocalOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<bool> {
    let server = wasmwatch_apiserver::Server::start(
        wasmwatch_apiserver::Config::default()
            .port(options.port)
            .bookmark_interval(Duration::from_secs(5)),
    )
    .await
    .context("cannot start the local API server")?;
    std::fs::create_dir_all(&options.dir)
        .with_context(|| format!("cannot create {}", options.dir.display()))?;
    let kubeconfig = options.dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    let client = server.client()?;
    // The workload controllers a real cluster runs, for the simulated pods:
    // they keep Deployment, StatefulSet and DaemonSet status current.
    let controller = AbortOnDrop(tokio::spawn(crate::local_controller::run(client.clone())));
    let pods = sample_app(&client).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    tokio::time::timeout(Duration::from_secs(10), async {
        while !deployments
            .get_opt("orders")
            .await
            .ok()
            .flatten()
            .is_some_and(|d| rolled_out(&d))
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .context("the local controller did not report the status of Deployment shop/orders")?;

    let manifest = wasmwatch_core::Manifest::from_file(&options.manifest)?;
    // Whatever the manifest says, the two replicas elect a leader (both
    // acting would double every refresh); its Lease names are used.
    let lease_ns = manifest
        .ha
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    let (lease_name, state_name) = (
        manifest.ha.lease_name.clone(),
        manifest.ha.state_lease_name.clone(),
    );
    let run_options = |identity: &str, admin_addr| RunOptions {
        manifest: options.manifest.clone(),
        cache_dir: options.cache_dir.clone(),
        registry: options.registry.clone(),
        admin_addr,
        identity: identity.to_string(),
        namespace: "default".into(),
        reports: Reports::Human,
        announce: false,
        kube_config: Some(server.kube_config()),
        checkpoint_interval: Duration::from_secs(1),
        force_ha: true,
        plugin_dirs: Vec::new(),
        discovery_interval: wasmwatch_kube::lookups::DISCOVERY_INTERVAL,
        webhook: None,
    };
    let mut replicas = Vec::new();
    for identity in ["wasmwatch-0", "wasmwatch-1"] {
        let admin = free_port().await?;
        replicas.push(Replica::start(run_options(identity, admin)));
    }

    // Ready when a leader has taken its baseline (its first checkpoint).
    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_ns);
    let leader = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let state = leases.get_opt(&state_name).await.ok().flatten();
            let has_checkpoint = state
                .as_ref()
                .and_then(|l| l.metadata.annotations.as_ref())
                .is_some_and(|a| a.keys().any(|k| k.ends_with("-resource-version")));
            if has_checkpoint && let Some(holder) = holder(&leases, &lease_name).await {
                return holder;
            }
            if replicas.iter().any(|r| r.task.is_finished()) {
                return String::new();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_default();
    if leader.is_empty() {
        for r in replicas {
            if let Err(e) = r.stop().await {
                return Err(e.context("a wasmwatch replica failed to start"));
            }
        }
        anyhow::bail!(
            "no replica became leader within 60 s (the Lease {lease_ns}/{lease_name} has no holder)"
        );
    }

    let kc = kubeconfig.display();
    let admins: Vec<String> = replicas
        .iter()
        .map(|r| {
            format!(
                "  {}: http://{}/leader  /metrics  /readyz",
                r.identity, r.admin
            )
        })
        .collect();
    println!(
        "wasmwatch local cluster: API server {url}, 2 replicas, {leader} leads.
{admins}

  sample app shop/orders: {PODS} pods behind Service orders, Deployment orders (envFrom ConfigMap orders)

  export KUBECONFIG={kc}
  kubectl -n shop get configmap orders -o yaml
  kubectl -n shop patch configmap orders --type merge -p '{{\"data\":{{\"greeting\":\"hi\"}}}}'

{plugins}",
        url = server.url(),
        admins = admins.join("\n"),
        plugins = describe_plugins(&manifest),
    );
    if !options.scripted {
        println!(
            "Type `stop 0` / `start 0` (or 1) and Enter to stop and restart a replica and see
the other take over and replay what changed; `status` shows who leads. Ctrl-C stops."
        );
    }
    // Leadership changes, as the Lease shows them, with the checkpoint a new
    // leader replays from.
    let watcher = AbortOnDrop(tokio::spawn(watch_leadership(
        leases.clone(),
        lease_name.clone(),
        state_name.clone(),
        leader.clone(),
    )));

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let generation =
        |d: &Option<Deployment>| d.as_ref().and_then(|d| d.metadata.generation).unwrap_or(0);
    let observed = |d: &Option<Deployment>| {
        d.as_ref()
            .and_then(|d| d.status.as_ref())
            .and_then(|s| s.observed_generation)
            .unwrap_or(0)
    };
    let ok = if options.scripted {
        let before = generation(&deployments.get_opt("orders").await?);
        println!("scripted: changing ConfigMap shop/orders (greeting: hello -> hi)");
        cms.patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"greeting": "hi"}})),
        )
        .await?;
        let waited = tokio::time::timeout(options.timeout, async {
            loop {
                let refreshed = pods.iter().all(|p| p.refreshes.load(Ordering::SeqCst) >= 1);
                // Restarted by the plugin, and rolled out (the local
                // controller's status, as `kubectl rollout status` reads it).
                let d = deployments.get_opt("orders").await.ok().flatten();
                let rolled = generation(&d) > before && d.as_ref().is_some_and(rolled_out);
                if refreshed && rolled {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let refreshed = pods
            .iter()
            .filter(|p| p.refreshes.load(Ordering::SeqCst) >= 1)
            .count();
        let d = deployments.get_opt("orders").await?;
        let (after, seen) = (generation(&d), observed(&d));
        match waited {
            Ok(()) => {
                println!(
                    "scripted: ok: {refreshed}/{PODS} pods refreshed, Deployment shop/orders rolled out (generation {before} -> {after}, observed {seen})"
                );
                true
            }
            Err(_) => {
                eprintln!(
                    "scripted: FAILED after {:?}: {refreshed}/{PODS} pods refreshed, Deployment generation {before} -> {after}, observed {seen}",
                    options.timeout
                );
                false
            }
        }
    } else {
        commands(&mut replicas, run_options, &leases, &lease_name, shutdown).await;
        true
    };
    drop(watcher);
    let holder = holder(&leases, &lease_name).await;
    for r in replicas {
        let was = if holder.as_deref() == Some(r.identity.as_str()) {
            " (the leader: it saved its checkpoint and released the Lease)"
        } else {
            ""
        };
        let identity = r.identity.clone();
        if r.stop().await.is_ok() && !options.scripted {
            println!("stopped replica {identity}{was}");
        }
    }
    drop(controller);
    if !options.scripted {
        println!(
            "stopped the sample app's {PODS} pods and the local API server ({}); the kubeconfig stays in {}",
            server.url(),
            options.dir.display()
        );
    }
    Ok(ok)
}

/// A free loopback port for a replica's admin server (so its URL can be
/// printed before it starts).
async fn free_port() -> anyhow::Result<SocketAddr> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    Ok(l.local_addr()?)
}

/// One wasmwatch replica of the local run, stoppable and restartable.
struct Replica {
    identity: String,
    admin: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Replica {
    fn start(options: RunOptions) -> Replica {
        let (stop, mut stopped) = watch::channel(false);
        let identity = options.identity.clone();
        let admin = options.admin_addr;
        let name = identity.clone();
        let task = tokio::spawn(async move {
            let r = crate::run::run(options, async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await;
            if let Err(e) = &r {
                eprintln!("error: {name}: {}", crate::cli::error_chain(e));
            }
            r
        });
        Replica {
            identity,
            admin,
            stop,
            task,
        }
    }

    /// Stops it as SIGTERM does (a leader saves and releases its Lease).
    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        self.task.await?
    }
}

/// The holder of the leader Lease, if any.
async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// Prints each change of leader, and the checkpoints a new leader resumes
/// (replays) from.
async fn watch_leadership(leases: Api<Lease>, lease: String, state: String, mut last: String) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = holder(&leases, &lease).await.unwrap_or_default();
        if now == last {
            continue;
        }
        if now.is_empty() {
            println!("leadership: {last} gave up the Lease; nobody leads");
        } else {
            let checkpoints: Vec<String> = leases
                .get_opt(&state)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.metadata.annotations)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| {
                    let kind = k
                        .strip_prefix("wasmwatch.io/")?
                        .strip_suffix("-resource-version")?;
                    Some(format!("{kind} {v}"))
                })
                .collect();
            println!(
                "leadership: {now} leads{}; it replays what changed after the checkpoints ({})",
                if last.is_empty() {
                    String::new()
                } else {
                    format!(" (was {last})")
                },
                checkpoints.join("; ")
            );
        }
        last = now;
    }
}

/// Reads `stop N`, `start N` and `status` lines from stdin until `shutdown`.
async fn commands(
    replicas: &mut [Replica],
    run_options: impl Fn(&str, SocketAddr) -> RunOptions,
    leases: &Api<Lease>,
    lease_name: &str,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use tokio::io::AsyncBufReadExt as _;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut stdin_open = true;
    tokio::pin!(shutdown);
    loop {
        let line = tokio::select! {
            _ = &mut shutdown => return,
            line = lines.next_line(), if stdin_open => line,
        };
        let Ok(Some(line)) = line else {
            stdin_open = false;
            continue;
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        let replica = |n: Option<&&str>| -> Option<usize> {
            n.and_then(|n| n.parse::<usize>().ok())
                .filter(|n| *n < replicas.len())
        };
        match words.as_slice() {
            ["status"] => {
                let leader = holder(leases, lease_name).await.unwrap_or_default();
                for r in replicas.iter() {
                    let state = if r.task.is_finished() {
                        "stopped"
                    } else if r.identity == leader {
                        "leading"
                    } else {
                        "standing by"
                    };
                    println!("  {} ({}): {state}", r.identity, r.admin);
                }
            }
            ["stop", n] => match replica(Some(n)) {
                Some(i) if !replicas[i].task.is_finished() => {
                    let r = &replicas[i];
                    let _ = r.stop.send(true);
                    println!("stopping replica {} (as SIGTERM does)", r.identity);
                }
                Some(i) => println!("replica {} is already stopped", replicas[i].identity),
                None => println!("no replica {n}: 0 or 1"),
            },
            ["start", n] => match replica(Some(n)) {
                Some(i) if replicas[i].task.is_finished() => {
                    let (identity, admin) = (replicas[i].identity.clone(), replicas[i].admin);
                    replicas[i] = Replica::start(run_options(&identity, admin));
                    println!("started replica {identity}");
                }
                Some(i) => println!("replica {} is running", replicas[i].identity),
                None => println!("no replica {n}: 0 or 1"),
            },
            [] => {}
            _ => println!("commands: stop N, start N, status (N: 0 or 1); Ctrl-C stops"),
        }
    }
}

/// What the manifest's plugins do here: one line per plugin, the bundled
/// ones described as the tour shows them.
fn describe_plugins(manifest: &wasmwatch_core::Manifest) -> String {
    let mut out = String::from("Plugins of the manifest:\n");
    for p in &manifest.plugins {
        let module = p.module.display().to_string();
        let what = if module.contains("http_refresh") || module.contains("http-refresh") {
            "POSTs /actuator/refresh to every ready pod of the apps using a changed ConfigMap (Spring Cloud Kubernetes style)"
        } else if module.contains("rollout_restart") || module.contains("rollout-restart") {
            "rolls the Deployments using a changed ConfigMap once per content (Reloader style): watch `kubectl -n shop get deployment orders -o yaml`"
        } else if module.contains("bus_refresh") || module.contains("bus-refresh") {
            "publishes a refresh message on a bus (Spring Cloud Bus style)"
        } else {
            "decides for every change it selects; its actions are printed as they run"
        };
        out.push_str(&format!("  {} ({module}): {what}\n", p.name));
    }
    out
}

/// Whether a Deployment's status says its current generation is rolled
/// out, as `kubectl rollout status` decides it.
fn rolled_out(d: &Deployment) -> bool {
    let Some(status) = d.status.as_ref() else {
        return false;
    };
    let wanted = d.spec.replicas.unwrap_or(1);
    let updated = status.updated_replicas.unwrap_or(0);
    d.metadata.generation.unwrap_or(0) <= status.observed_generation.unwrap_or(0)
        && updated >= wanted
        && status.replicas.unwrap_or(0) <= updated
        && status.available_replicas.unwrap_or(0) >= updated
}

/// Aborts the task when dropped (on every return path of [`run`]).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
