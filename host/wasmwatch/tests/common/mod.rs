//! Shared by the end-to-end tests of `wasmwatch run`: real HTTP apps counting
//! actuator calls, a cluster on the test API server (namespace, Services,
//! EndpointSlices pointing at the apps), and replicas as real processes.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{DynamicObject, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A small HTTP server standing for one pod: counts requests per
/// `METHOD path`, answers with the scripted statuses, then 200.
#[derive(Clone)]
pub struct Pod {
    pub addr: SocketAddr,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    script: Arc<Mutex<std::collections::VecDeque<u16>>>,
}

impl Pod {
    pub async fn start() -> Pod {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pod = Pod {
            addr: listener.local_addr().unwrap(),
            hits: Default::default(),
            script: Default::default(),
        };
        let p = pod.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let p = p.clone();
                tokio::spawn(async move {
                    loop {
                        let mut buf = Vec::new();
                        let mut byte = [0u8; 1024];
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut byte).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&byte[..n]),
                            }
                        }
                        let head = String::from_utf8_lossy(&buf).to_string();
                        let mut parts = head.split_whitespace();
                        let key = format!(
                            "{} {}",
                            parts.next().unwrap_or(""),
                            parts.next().unwrap_or("")
                        );
                        *p.hits.lock().unwrap().entry(key).or_default() += 1;
                        let status = p.script.lock().unwrap().pop_front().unwrap_or(200);
                        let resp = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                        if s.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        pod
    }

    pub fn hits(&self, key: &str) -> usize {
        self.hits.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.hits.lock().unwrap().values().sum()
    }

    /// The next responses' statuses.
    pub fn answer(&self, statuses: &[u16]) {
        self.script.lock().unwrap().extend(statuses);
    }
}

pub const REFRESH: &str = "POST /actuator/refresh";

pub async fn apply(client: &kube::Client, value: serde_json::Value) {
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

pub async fn namespace(client: &kube::Client, name: &str) {
    apply(
        client,
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    .await;
}

/// A test API server (a bookmark every second) with namespace `ns`, and in
/// a temporary folder a kubeconfig for it and `manifest`, pinned.
pub struct TestEnv {
    pub server: wasmwatch_apiserver::ServerHandle,
    pub client: kube::Client,
    pub dir: tempfile::TempDir,
    pub kubeconfig: std::path::PathBuf,
    pub manifest: std::path::PathBuf,
}

impl TestEnv {
    /// `kubectl --kubeconfig <this env's> ARGS`, with `stdin` fed to it;
    /// its stdout. Fails the test, with kubectl's stderr, when it fails.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl is installed (tests/prepare)");
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

pub async fn test_env(manifest: &str, ns: &str) -> TestEnv {
    test_env_with(wasmwatch_apiserver::Config::default(), manifest, ns).await
}

/// [`test_env`] with a server started from `config` (a bookmark every
/// second).
pub async fn test_env_with(
    config: wasmwatch_apiserver::Config,
    manifest: &str,
    ns: &str,
) -> TestEnv {
    let server =
        wasmwatch_apiserver::Server::start(config.bookmark_interval(Duration::from_secs(1)))
            .await
            .unwrap();
    let client = server.client().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let path = dir.path().join("manifest.yaml");
    std::fs::write(&path, wasmwatch_testkit::pin(manifest)).unwrap();
    namespace(&client, ns).await;
    TestEnv {
        server,
        client,
        dir,
        kubeconfig,
        manifest: path,
    }
}

/// A Service `name` in `ns` whose ready endpoints are the given pods (one
/// EndpointSlice per pod, each with that pod's port), plus `not_ready`
/// endpoints listed as not ready.
pub async fn service(
    client: &kube::Client,
    ns: &str,
    name: &str,
    pods: &[&Pod],
    not_ready: &[&Pod],
) {
    apply(
        client,
        serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
            "spec": {"ports": [{"name": "http", "port": 8080}], "selector": {"app": name}}}),
    )
    .await;
    for (i, (pod, ready)) in pods
        .iter()
        .map(|p| (p, true))
        .chain(not_ready.iter().map(|p| (p, false)))
        .enumerate()
    {
        apply(
            client,
            serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{name}-{i}"), "namespace": ns,
                    "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": [pod.addr.ip().to_string()],
                    "conditions": {"ready": ready},
                    "targetRef": {"kind": "Pod", "name": format!("{name}-{i}"), "namespace": ns}}],
                "ports": [{"name": "http", "port": pod.addr.port(), "protocol": "TCP"}]}),
        )
        .await;
    }
}

pub use wasmwatch_testkit::artifact_cache_dir;

/// Spawns `cmd` (a `wasmwatch run`) with its stdout piped and waits up to
/// `within` for its ready line (JSON with `"ready": true`). Returns the
/// process, the ready line, and the lines it prints after.
pub fn spawn_ready(
    cmd: &mut Command,
    within: Duration,
) -> (Child, serde_json::Value, std::sync::mpsc::Receiver<String>) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .expect("start wasmwatch run");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = lines.recv_timeout(within).expect("the ready line");
    let ready: serde_json::Value =
        serde_json::from_str(&first).unwrap_or_else(|e| panic!("ready line {first:?}: {e}"));
    assert_eq!(ready["ready"], true, "{first}");
    (child, ready, lines)
}

/// `wasmwatch run` as a test replica runs it: `--print-actions`, the
/// admin port on a free loopback port, the shared compile cache, `RUST_LOG`
/// from `TEST_LOG` (default warn).
pub fn run_command(
    kubeconfig: &std::path::Path,
    manifest: &std::path::Path,
    identity: &str,
    checkpoint_interval: &str,
    namespace: &str,
) -> Command {
    run_command_of(
        std::path::Path::new(env!("CARGO_BIN_EXE_wasmwatch")),
        kubeconfig,
        manifest,
        identity,
        checkpoint_interval,
        namespace,
    )
}

/// [`run_command`] of another build of wasmwatch (an older version).
pub fn run_command_of(
    bin: &std::path::Path,
    kubeconfig: &std::path::Path,
    manifest: &std::path::Path,
    identity: &str,
    checkpoint_interval: &str,
    namespace: &str,
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--manifest", manifest.to_str().unwrap()])
        .args(["--identity", identity, "--admin-addr", "127.0.0.1:0"])
        .args([
            "--print-actions",
            "--checkpoint-interval",
            checkpoint_interval,
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAMESPACE", namespace)
        .env("WASMWATCH_CACHE_DIR", artifact_cache_dir())
        .env(
            "RUST_LOG",
            std::env::var("TEST_LOG").unwrap_or_else(|_| "warn".into()),
        );
    cmd
}

/// The admin address of a ready line (`{"admin": "http://..."}`).
pub fn admin_addr(ready: &serde_json::Value) -> SocketAddr {
    ready["admin"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .parse()
        .unwrap()
}

/// One `wasmwatch run` process.
pub struct Replica {
    pub identity: String,
    pub child: Child,
    pub admin: SocketAddr,
    /// Lines printed after the ready line (`--print-actions` reports).
    pub lines: std::sync::mpsc::Receiver<String>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    pub fn start(
        kubeconfig: &std::path::Path,
        manifest: &std::path::Path,
        identity: &str,
    ) -> Replica {
        Replica::start_with(kubeconfig, manifest, identity, "200ms")
    }

    pub fn start_with(
        kubeconfig: &std::path::Path,
        manifest: &std::path::Path,
        identity: &str,
        checkpoint_interval: &str,
    ) -> Replica {
        Replica::start_in(
            kubeconfig,
            manifest,
            identity,
            checkpoint_interval,
            "default",
            Duration::from_secs(60),
        )
    }

    /// A replica whose POD_NAMESPACE (where the Leases go when
    /// `ha.namespace` is unset) is `namespace`, ready within `ready_within`.
    pub fn start_in(
        kubeconfig: &std::path::Path,
        manifest: &std::path::Path,
        identity: &str,
        checkpoint_interval: &str,
        namespace: &str,
        ready_within: Duration,
    ) -> Replica {
        Replica::start_env(
            kubeconfig,
            manifest,
            identity,
            checkpoint_interval,
            namespace,
            ready_within,
            &[],
        )
    }

    /// [`Replica::start_in`] with extra environment variables.
    pub fn start_env(
        kubeconfig: &std::path::Path,
        manifest: &std::path::Path,
        identity: &str,
        checkpoint_interval: &str,
        namespace: &str,
        ready_within: Duration,
        env: &[(&str, &str)],
    ) -> Replica {
        let mut cmd = run_command(
            kubeconfig,
            manifest,
            identity,
            checkpoint_interval,
            namespace,
        );
        cmd.envs(env.iter().copied());
        Replica::spawn(&mut cmd, identity, ready_within)
    }

    /// A replica from a prepared command (see [`run_command_of`]).
    pub fn spawn(cmd: &mut Command, identity: &str, ready_within: Duration) -> Replica {
        let (child, ready, lines) = spawn_ready(cmd, ready_within);
        Replica {
            identity: identity.to_string(),
            child,
            admin: admin_addr(&ready),
            lines,
        }
    }

    pub async fn leading(&self) -> bool {
        get(self.admin, "/leader")
            .await
            .is_some_and(|(_, body)| body.trim() == "true")
    }

    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status();
    }

    /// Action reports printed so far (JSON).
    pub fn reports(&self) -> Vec<serde_json::Value> {
        self.lines
            .try_iter()
            .filter_map(|l| serde_json::from_str(&l).ok())
            .collect()
    }
}

/// GET over plain HTTP/1.0; (status, body), or None if it cannot connect.
pub async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// Polls `f` until it holds or `within` passes; returns the time it took.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The configmap checkpoint of `namespace` in the state Lease, if any.
pub async fn checkpoint(client: &kube::Client, namespace: &str) -> Option<u64> {
    checkpoint_of(client, "configmap", namespace).await
}

/// The checkpoint of `kind` (`configmap`, `secret`) of `namespace`.
pub async fn checkpoint_of(client: &kube::Client, kind: &str, namespace: &str) -> Option<u64> {
    let api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "default");
    let lease = api.get_opt("wasmwatch-state").await.ok()??;
    let value = lease
        .metadata
        .annotations?
        .get(&format!("wasmwatch.io/{kind}-resource-version"))?
        .clone();
    value
        .split(',')
        .find_map(|p| p.strip_prefix(&format!("{namespace}=")))
        .and_then(|rv| rv.parse().ok())
}

impl Replica {
    /// The value of one series on `/metrics` (`name{labels}` exactly as
    /// rendered), 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        let (_, text) = get(self.admin, "/metrics").await.unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }
}

/// An apps/v1 workload in `ns` whose pod template has these annotations and
/// spec (`serviceName` added for a StatefulSet).
pub async fn workload(
    client: &kube::Client,
    ns: &str,
    kind: &str,
    name: &str,
    annotations: serde_json::Value,
    template_annotations: serde_json::Value,
    pod_spec: serde_json::Value,
) {
    let mut spec = serde_json::json!({
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}, "annotations": template_annotations},
            "spec": pod_spec,
        },
    });
    if kind == "StatefulSet" {
        spec["serviceName"] = serde_json::json!(name);
    }
    apply(
        client,
        serde_json::json!({"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": name, "namespace": ns, "annotations": annotations},
            "spec": spec}),
    )
    .await;
}

/// The objects, keyed by kind/namespace/name, without what kustomize
/// versions render differently: the generated ConfigMap's hash suffix and
/// empty maps.
pub fn normalised_objects(
    objects: &[serde_json::Value],
) -> std::collections::BTreeMap<String, serde_json::Value> {
    use serde_json::Value;
    fn clean(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.retain(|_, x| !matches!(x, Value::Object(o) if o.is_empty()));
                m.values_mut().for_each(clean);
            }
            Value::Array(a) => a.iter_mut().for_each(clean),
            Value::String(s) if s.starts_with("wasmwatch-manifest-") => {
                *s = "wasmwatch-manifest-<hash>".into();
            }
            _ => {}
        }
    }
    objects
        .iter()
        .map(|o| {
            let mut o = o.clone();
            clean(&mut o);
            let key = format!(
                "{}/{}/{}",
                o["kind"].as_str().unwrap_or(""),
                o["metadata"]["namespace"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap_or("")
            );
            (key, o)
        })
        .collect()
}

/// A replica of `e`'s manifest, started off the async threads (it blocks
/// until ready), once `watches` more watch streams are open (the lookups'
/// eight, one per watched kind and scope, the Namespaces' with a selector):
/// changes from then on are its to handle.
pub async fn replica_watching(e: &TestEnv, watches: usize) -> Replica {
    replica_named(e, "r", watches).await
}

/// [`replica_watching`] with the identity `identity` (replicas that take
/// over from one another need their own).
pub async fn replica_named(e: &TestEnv, identity: &str, watches: usize) -> Replica {
    let before = e.server.open_watches();
    let (k, m, id) = (
        e.kubeconfig.clone(),
        e.manifest.clone(),
        identity.to_string(),
    );
    let r = tokio::task::spawn_blocking(move || Replica::start(&k, &m, &id))
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(15),
        e.server.wait_for_watches(before + watches),
    )
    .await
    .expect("the watches open");
    r
}

/// (generation, pod-template annotations) of Deployment `ns/name`.
pub async fn deployment_state(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> (i64, std::collections::BTreeMap<String, String>) {
    let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), ns);
    let d = api.get(name).await.unwrap();
    let annotations = d
        .spec
        .template
        .metadata
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    (d.metadata.generation.unwrap(), annotations)
}
