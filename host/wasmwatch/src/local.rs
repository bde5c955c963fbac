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

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut replicas = Vec::new();
    for identity in ["wasmwatch-0", "wasmwatch-1"] {
        let options = RunOptions {
            manifest: options.manifest.clone(),
            cache_dir: options.cache_dir.clone(),
            registry: options.registry.clone(),
            admin_addr: "127.0.0.1:0".parse().expect("address"),
            identity: identity.to_string(),
            namespace: "default".into(),
            reports: Reports::Human,
            announce: false,
            kube_config: Some(server.kube_config()),
            checkpoint_interval: Duration::from_secs(1),
        };
        let mut stop = stop_rx.clone();
        replicas.push(tokio::spawn(async move {
            let r = crate::run::run(options, async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await;
            if let Err(e) = &r {
                eprintln!("error: {identity}: {}", crate::cli::error_chain(e));
            }
            r
        }));
    }

    // Ready when a leader has taken its baseline (its first checkpoint).
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let leader = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let state = leases.get_opt("wasmwatch-state").await.ok().flatten();
            let has_checkpoint = state
                .as_ref()
                .and_then(|l| l.metadata.annotations.as_ref())
                .is_some_and(|a| a.contains_key("wasmwatch.io/configmap-resource-version"));
            if has_checkpoint
                && let Some(l) = leases.get_opt("wasmwatch-leader").await.ok().flatten()
                && let Some(holder) = l.spec.and_then(|s| s.holder_identity)
            {
                return holder;
            }
            if replicas.iter().any(|r| r.is_finished()) {
                return String::new();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_default();
    if leader.is_empty() {
        let _ = stop_tx.send(true);
        for r in replicas {
            if let Ok(Err(e)) = r.await {
                return Err(e.context("a wasmwatch replica failed to start"));
            }
        }
        anyhow::bail!("no replica became leader within 60 s");
    }

    let kc = kubeconfig.display();
    println!(
        "wasmwatch local cluster: API server {url}, 2 replicas, {leader} leads.

  sample app shop/orders: {PODS} pods behind Service orders, Deployment orders (envFrom ConfigMap orders)

  export KUBECONFIG={kc}
  kubectl -n shop get configmap orders -o yaml
  kubectl -n shop patch configmap orders --type merge -p '{{\"data\":{{\"greeting\":\"hi\"}}}}'

Then http-refresh POSTs /actuator/refresh to every ready orders pod (Spring Cloud
Kubernetes style) and rollout-restart rolls Deployment shop/orders once per content
(Reloader style): watch `kubectl -n shop get deployment orders -o yaml`.
Ctrl-C stops.
",
        url = server.url()
    );

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
        shutdown.await;
        true
    };
    let _ = stop_tx.send(true);
    for r in replicas {
        let _ = r.await;
    }
    drop(controller);
    Ok(ok)
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
