//! `bench compare [N]` (issue 24): wasmwatch and the informer baseline
//! ([`super::baseline`]) side by side, on the same test API server, the same
//! ConfigMaps, the same apps and the same load, in one run.
//!
//! Each of the N runs (default 3; `BENCH_RUNS` or the argument) sets up two
//! clusters, one after the other:
//!
//! 1. 1,000 ConfigMaps of 10 KiB in 10 namespaces (`shop-0`..`shop-9`), all
//!    labelled `spring.cloud.kubernetes.config=true`; ConfigMap `cm-i` names
//!    app `app-(i % 50)` in `spring.cloud.kubernetes.configmap.apps`; 50 apps,
//!    each a Service with an EndpointSlice of one ready pod (an HTTP server
//!    on 127.0.0.1 recording when each POST arrives). First a control with
//!    no watcher (the API server's own cost of the load), then wasmwatch and
//!    the baseline, one at a time (the order alternates between runs), each:
//!    - paced: 1,000 changes at 100/s (each a merge patch over HTTP that
//!      keeps the ConfigMap at 10 KiB), one per ConfigMap, round robin over
//!      the apps; CPU of the watcher's process (utime + stime from
//!      /proc/PID/stat) and of the API server's threads over the writes and
//!      1 s after; write -> POST at the app, p50/p99; Events and other API
//!      writes per change (the API server's request log);
//!    - fast: the same at 1,000/s (3,000 changes; each app gets 20 a
//!      second, so rate limits and coalescing show): CPU per change,
//!      write -> POST p50/p99;
//!    - burst: 4,000 changes from 4 HTTP writers (every ConfigMap 4 times);
//!      the time from the writers' start until every app's last POST, which
//!      must come after its last change was sent (the baseline posts in
//!      order, so its last POST is for the last change; wasmwatch
//!      coalesces), waiting until no POST came for 1 s; changes/s over that
//!      time; CPU per change (watcher, API server) until then.
//! 2. `BENCH_OBJECTS` (default 10,000) such ConfigMaps, same apps: spawn ->
//!    ready line and spawn -> the ConfigMap watch open (the initial list done,
//!    seen in the request log); RSS once the process is idle, then the paced
//!    load again (CPU per change at that size) and the peak RSS.
//!
//! wasmwatch runs the bundled http-refresh and rollout-restart (debounce 0,
//! default rate limits, HA lease as in the other benchmarks) over every
//! namespace, as the baseline does. The API server runs in this process on
//! its own runtime (threads `bench-apiserver`), so its CPU is read from those
//! threads' schedstat; "caused" subtracts the control's.
//!
//! `BENCH_MIX=90` (issue 35's realistic mix): 90% of the ConfigMaps, and
//! so of the changes, concern no app (no label, no Spring annotation, no
//! Service of their name); latencies and the burst count the apps' changes.
//!
//! `BASELINE_FLOOR=1` puts a floor in the baseline's place: it reads the
//! raw ConfigMap watch stream and parses and refreshes only the labelled
//! changes (`baseline::floor`), the least any watcher of every ConfigMap
//! pays, to weigh what a watcher could save at all.
//!
//! `BENCH_PERF=DIR` records perf profiles of each phase (`BENCH_PERF_MODE=stat`:
//! counts), `BENCH_MANIFEST=FILE` replaces wasmwatch's manifest, and an idle
//! row gives each watcher's CPU per second with no change, before the load.
//!
//! Printed: one line per run, then a table of medians over the runs (range in
//! brackets) and the median of the per-run ratios wasmwatch / baseline.
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use wasmwatch_apiserver::{Config, Server, ServerHandle};

use super::{app, create, labelled, percentile, pod, rss_kib, scrape, set_data, wasmwatch_bin};

const NAMESPACES: usize = 10;
const APPS: usize = 50;
/// Objects of the first cluster.
const OBJECTS: usize = 1000;
const PACED: usize = 1000;
const PACED_TICK: Duration = Duration::from_millis(10);
/// The faster paced load: 3,000 changes at 1,000/s.
const FAST: usize = 3000;
const FAST_TICK: Duration = Duration::from_millis(1);
const BURST: usize = 4000;
/// Measured idle before the paced load.
const IDLE: Duration = Duration::from_secs(5);
const WRITERS: usize = 4;
const VALUE_BYTES: usize = 10 * 1024;
const APISERVER_THREAD: &str = "bench-apiserver";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Wasmwatch,
    Baseline,
}

impl Who {
    fn index(self) -> usize {
        match self {
            Who::Wasmwatch => 0,
            Who::Baseline => 1,
        }
    }
}

/// One run's numbers: row key -> [wasmwatch, baseline].
type Sample = HashMap<&'static str, [Option<f64>; 2]>;

fn put(s: &mut Sample, key: &'static str, who: Who, v: f64) {
    s.entry(key).or_insert([None, None])[who.index()] = Some(v);
}

/// The API server's runtime: its threads carry a name of their own.
pub(super) fn apiserver_runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(APISERVER_THREAD)
            .enable_all()
            .build()
            .unwrap()
    })
}

/// CPU time of the API server's threads (nanosecond schedstat).
fn apiserver_cpu() -> Duration {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() != APISERVER_THREAD {
            continue;
        }
        ns += std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Duration::from_nanos(ns)
}

fn clock_ticks() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
            .unwrap_or(100)
    })
}

/// `BENCH_PERF=DIR`: a cpu-clock profile (perf from Debian's linux-perf,
/// call graphs) of the watcher's process over one phase (paced, burst,
/// paced at the large size), written to
/// `DIR/<who>-<phase>.data`; stopped with SIGINT when dropped.
struct Profile(Option<Child>);

impl Profile {
    fn start(pid: u32, who: Who, phase: &str) -> Profile {
        let Some(dir) = std::env::var_os("BENCH_PERF") else {
            return Profile(None);
        };
        let name = match who {
            Who::Wasmwatch => "wasmwatch",
            Who::Baseline => "baseline",
        };
        // `BENCH_PERF_MODE=stat`: counts instead of samples (task clock,
        // context switches, page faults and the syscalls that park, wake,
        // map and move bytes), to divide by the phase's changes.
        let stat = std::env::var("BENCH_PERF_MODE").as_deref() == Ok("stat");
        let ext = if stat { "stat" } else { "data" };
        let out = Path::new(&dir).join(format!("{name}-{phase}.{ext}"));
        let mut command = Command::new("perf");
        if stat {
            command.args([
                "stat",
                "--per-thread",
                "-e",
                "task-clock,context-switches,cpu-migrations,page-faults,raw_syscalls:sys_enter,\
                 syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_mmap,\
                 syscalls:sys_enter_munmap,syscalls:sys_enter_madvise,syscalls:sys_enter_mprotect,\
                 syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_read,\
                 syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_ctl",
            ]);
        } else {
            command.args([
                "record",
                "-q",
                "-e",
                "cpu-clock",
                "-F",
                "2000",
                "--call-graph",
                "dwarf,16384",
            ]);
        }
        let child = command
            .args(["-p", &pid.to_string(), "-o"])
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("perf record (apt-get install linux-perf)");
        // perf attaches asynchronously; give it a moment before the load.
        std::thread::sleep(Duration::from_millis(300));
        Profile(Some(child))
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

/// utime + stime of a whole process (every thread, also those that ended).
pub(super) fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: field 3 (state) is index 0; utime 14, stime 15.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ticks * 1_000_000_000 / clock_ticks())
}

/// The bundled two plugins, or `BENCH_MANIFEST=FILE` (a template with
/// `{module:NAME}` / `{sha256:NAME}` pins) to weigh a variant.
fn manifest() -> String {
    if let Some(file) = std::env::var_os("BENCH_MANIFEST") {
        return wasmwatch_testkit::pin(&std::fs::read_to_string(file).expect("BENCH_MANIFEST"));
    }
    wasmwatch_testkit::pin(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap]}
ha: {enabled: true, namespace: default, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s}
plugins:
  - name: http-refresh
    module: {module:http-refresh}
    sha256: {sha256:http-refresh}
    events: {kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}
    capabilities: {refresh: [\"*\"]}
    delivery: {debounce: 0s, retries: 3, backoffInitial: 100ms, backoffMax: 1s}
  - name: rollout-restart
    module: {module:rollout-restart}
    sha256: {sha256:rollout-restart}
    events: {kinds: [ConfigMap]}
    capabilities: {restart: [\"*\"]}
    delivery: {debounce: 0s}
",
    )
}

/// A test API server with the namespaces, apps and ConfigMaps.
struct Bed {
    server: ServerHandle,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    /// One per namespace.
    cms: Vec<Api<ConfigMap>>,
    /// When each app's pod got a POST.
    pods: Vec<Arc<Mutex<Vec<Instant>>>>,
    objects: usize,
    pad: Arc<String>,
}

fn ns_of(i: usize) -> usize {
    i % NAMESPACES
}

fn app_of(i: usize) -> usize {
    // app-j lives in namespace j % NAMESPACES, as ConfigMap i does.
    i % APPS
}

/// `BENCH_MIX=P` (issue 35's realistic mix): P% of the ConfigMaps (and so
/// of the changes, which go round robin over them) are used by no app:
/// no label, no Spring annotation, no Service of their name (as Helm's
/// release objects, `kube-root-ca.crt`, other controllers' leader-election
/// ConfigMaps). Default 0: every ConfigMap is an app's (the product path).
fn unused_percent() -> usize {
    static MIX: OnceLock<usize> = OnceLock::new();
    *MIX.get_or_init(|| {
        let p: usize = std::env::var("BENCH_MIX")
            .ok()
            .map(|v| v.parse().expect("BENCH_MIX: a percentage"))
            .unwrap_or(0);
        assert!(
            p < 100 && (p == 0 || 100 % (100 - p) == 0),
            "BENCH_MIX: 0, 50, 75, 80, 90, ..."
        );
        p
    })
}

/// Whether ConfigMap `i` is an app's: one in every `100 / (100 - P)` runs
/// of `NAMESPACES` consecutive objects, so the used ones still spread over
/// the namespaces and apps (`cm-0`..`cm-9` -> `app-0`..`app-9`, ...).
fn used(i: usize) -> bool {
    let p = unused_percent();
    p == 0 || (i / NAMESPACES).is_multiple_of(100 / (100 - p))
}

fn value(k: impl std::fmt::Display, pad: &str) -> String {
    format!("{k}-{pad}")
}

async fn bed(objects: usize) -> Bed {
    let server = apiserver_runtime()
        .spawn(Server::start(
            Config::default().bookmark_interval(Duration::from_secs(5)),
        ))
        .await
        .unwrap()
        .unwrap();
    let client = server.client().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let mut cms = Vec::new();
    for n in 0..NAMESPACES {
        let ns = format!("shop-{n}");
        create(
            &client,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
        cms.push(Api::namespaced(client.clone(), &ns));
    }
    let mut pods = Vec::new();
    for j in 0..APPS {
        let (addr, hits) = pod().await;
        app(
            &client,
            &format!("shop-{}", ns_of(j)),
            &format!("app-{j}"),
            addr,
        )
        .await;
        pods.push(hits);
    }
    let pad = Arc::new("x".repeat(VALUE_BYTES - 8));
    let mut tasks = Vec::new();
    for w in 0..8 {
        let (cms, pad) = (cms.clone(), pad.clone());
        tasks.push(tokio::spawn(async move {
            for i in (w..objects).step_by(8) {
                let name = format!("cm-{i}");
                let cm = if used(i) {
                    labelled(&name, &format!("app-{}", app_of(i)), &value(i, &pad))
                } else {
                    serde_json::from_value(serde_json::json!({
                        "metadata": {"name": name},
                        "data": {"application.yaml": value(i, &pad)}
                    }))
                    .unwrap()
                };
                cms[ns_of(i)]
                    .create(&PostParams::default(), &cm)
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Bed {
        server,
        _dir: dir,
        kubeconfig,
        cms,
        pods,
        objects,
        pad,
    }
}

impl Bed {
    fn clear_pods(&self) {
        for p in &self.pods {
            p.lock().unwrap().clear();
        }
    }

    fn posts(&self) -> usize {
        self.pods.iter().map(|p| p.lock().unwrap().len()).sum()
    }

    async fn change(&self, i: usize, tag: String) {
        set_data(
            &self.cms[ns_of(i)],
            &format!("cm-{i}"),
            value(tag, &self.pad),
        )
        .await;
    }

    /// Writes by the watchers since the request log was cleared: Events
    /// (writes, of which creates), everything else but the writers'
    /// ConfigMap patches.
    fn writes(&self) -> ((usize, usize), usize) {
        let writes: Vec<_> = self
            .server
            .requests()
            .into_iter()
            .filter(|r| r.is_write())
            .collect();
        let events = writes.iter().filter(|r| r.resource == "events");
        let events = (
            events.clone().count(),
            events.filter(|r| r.verb == "create").count(),
        );
        let other = writes
            .iter()
            .filter(|r| r.resource != "events" && r.resource != "configmaps")
            .count();
        (events, other)
    }
}

/// A watcher process: wasmwatch or the baseline.
struct Proc {
    child: Child,
    admin: Option<SocketAddr>,
    to_ready: Duration,
    to_watch: Duration,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn launch(who: Who, bed: &Bed, work: &Path) -> Proc {
    bed.server.clear_requests();
    let t = Instant::now();
    let mut child = match who {
        Who::Wasmwatch => {
            let path = work.join("compare.yaml");
            std::fs::write(&path, manifest()).unwrap();
            Command::new(wasmwatch_bin())
                .args(["run", "--manifest", path.to_str().unwrap()])
                .args(["--identity", "compare-0", "--admin-addr", "127.0.0.1:0"])
                .args(["--cache-dir", work.join("cache").to_str().unwrap()])
                .args(["--checkpoint-interval", "2s"])
                .env("POD_NAMESPACE", "default")
                .env("RUST_LOG", "error")
                .env("KUBECONFIG", &bed.kubeconfig)
                .stdout(Stdio::piped())
                .spawn()
                .expect("start wasmwatch (build it: cargo build --release -p wasmwatch --bins --examples)")
        }
        Who::Baseline => Command::new(std::env::current_exe().unwrap())
            .arg("__baseline")
            .env("RUST_LOG", "error")
            .env("KUBECONFIG", &bed.kubeconfig)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    };
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        (line, Instant::now())
    });
    // The initial list is done when the ConfigMap watch opens.
    let to_watch = loop {
        if bed
            .server
            .requests()
            .iter()
            .any(|r| r.verb == "watch" && r.resource == "configmaps")
        {
            break t.elapsed();
        }
        // The list takes longer the larger the cluster (200,000 objects
        // of 10 KiB are 2 GB of JSON).
        let limit = Duration::from_secs(120).max(Duration::from_millis(3 * bed.objects as u64));
        assert!(t.elapsed() < limit, "{who:?} never watched ConfigMaps");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let (line, at) = line.await.unwrap();
    let ready: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{who:?} ready line {line:?}: {e}"));
    let admin = ready["admin"].as_str().map(|a| {
        a.trim_start_matches("http://")
            .parse()
            .expect("admin address")
    });
    let proc = Proc {
        child,
        admin,
        to_ready: at - t,
        to_watch,
    };
    // Settled: the initial list handled, the process idle.
    let t = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    loop {
        let c0 = process_cpu(proc.pid());
        tokio::time::sleep(Duration::from_millis(500)).await;
        if process_cpu(proc.pid()) - c0 <= Duration::from_millis(20)
            || t.elapsed() > Duration::from_secs(60)
        {
            break;
        }
    }
    proc
}

/// The sum and count of a plugin's call durations (seconds) from /metrics.
async fn plugin_calls(admin: SocketAddr, plugin: &str) -> (f64, f64) {
    let text = scrape(admin).await;
    let family = |name: &str| -> f64 {
        let prefix = format!("{name}{{plugin=\"{plugin}\"");
        text.lines()
            .filter(|l| l.starts_with(&prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (
        family("wasmwatch_plugin_duration_seconds_sum"),
        family("wasmwatch_plugin_duration_seconds_count"),
    )
}

struct Paced {
    cpu: Duration,
    api_cpu: Duration,
    p50: Duration,
    p99: Duration,
    missing: usize,
    events: (usize, usize),
    other_writes: usize,
}

/// 1,000 changes at 100/s, one per ConfigMap, round robin over the apps.
async fn paced(bed: &Bed, pid: Option<u32>, tag: &str) -> Paced {
    paced_at(bed, pid, tag, PACED, PACED_TICK).await
}

/// `count` changes, one every `tick`, one per ConfigMap, round robin over
/// the apps.
async fn paced_at(bed: &Bed, pid: Option<u32>, tag: &str, count: usize, tick: Duration) -> Paced {
    bed.clear_pods();
    bed.server.clear_requests();
    let cpu0 = pid.map(process_cpu).unwrap_or_default();
    let api0 = apiserver_cpu();
    let mut writes: Vec<Vec<Instant>> = vec![Vec::new(); APPS];
    let t0 = Instant::now();
    for k in 0..count {
        tokio::time::sleep_until((t0 + tick * k as u32).into()).await;
        let i = k % bed.objects;
        let at = Instant::now();
        bed.change(i, format!("{tag}{k}")).await;
        if used(i) {
            writes[app_of(i)].push(at);
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cpu = pid.map(process_cpu).unwrap_or_default() - cpu0;
    let api_cpu = apiserver_cpu() - api0;
    let (events, other_writes) = bed.writes();
    let mut lat = Vec::new();
    let mut missing = 0;
    for (j, w) in writes.iter().enumerate() {
        let hits = bed.pods[j].lock().unwrap().clone();
        for at in w {
            match hits.iter().find(|h| *h >= at) {
                Some(h) => lat.push(*h - *at),
                None => missing += 1,
            }
        }
    }
    lat.sort();
    let (p50, p99) = if lat.is_empty() {
        (Duration::ZERO, Duration::ZERO)
    } else {
        (percentile(&lat, 0.5), percentile(&lat, 0.99))
    };
    Paced {
        cpu,
        api_cpu,
        p50,
        p99,
        missing,
        events,
        other_writes,
    }
}

struct Burst {
    /// Writers' start -> every app's last POST (after its last change).
    all_refreshed: Option<Duration>,
    writers: Duration,
    cpu: Duration,
    api_cpu: Duration,
    events: (usize, usize),
    apps_missed: usize,
}

/// 4,000 changes from 4 HTTP writers, every ConfigMap 4 times.
async fn burst(bed: &Bed, pid: Option<u32>, tag: &str) -> Burst {
    bed.clear_pods();
    bed.server.clear_requests();
    let cpu0 = pid.map(process_cpu).unwrap_or_default();
    let api0 = apiserver_cpu();
    let t = Instant::now();
    let per = BURST / WRITERS;
    let objects = bed.objects;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let cms = bed.cms.clone();
        let pad = bed.pad.clone();
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move {
            let mut last = vec![None::<Instant>; APPS];
            for k in 0..per {
                let i = (k * WRITERS + w) % objects;
                // When the write was sent: a fast watcher's POST can reach
                // the app before the writer has read the response.
                let at = Instant::now();
                set_data(
                    &cms[ns_of(i)],
                    &format!("cm-{i}"),
                    value(format!("{tag}w{w}k{k}"), &pad),
                )
                .await;
                if used(i) {
                    last[app_of(i)] = Some(at);
                }
            }
            last
        }));
    }
    let mut last_write = vec![None::<Instant>; APPS];
    for task in tasks {
        for (j, at) in task.await.unwrap().into_iter().enumerate() {
            last_write[j] = last_write[j].max(at);
        }
    }
    let writers = t.elapsed();
    // Until every app had a POST after its last change and no POST came
    // for 1 s (the control, with no watcher: 1 s after the writers).
    let (mut seen, mut quiet_since) = (bed.posts(), Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let n = bed.posts();
        if n != seen {
            (seen, quiet_since) = (n, Instant::now());
        }
        let done = pid.is_none()
            || bed.pods.iter().enumerate().all(|(j, p)| {
                let last = p.lock().unwrap().last().copied();
                last_write[j].is_none()
                    || matches!((last, last_write[j]), (Some(h), Some(w)) if h >= w)
            });
        if (done && quiet_since.elapsed() >= Duration::from_secs(1))
            || t.elapsed() > Duration::from_secs(120)
        {
            break;
        }
    }
    let cpu = pid.map(process_cpu).unwrap_or_default() - cpu0;
    let api_cpu = apiserver_cpu() - api0;
    let (events, _) = bed.writes();
    let mut apps_missed = 0;
    let mut all = Duration::ZERO;
    for (j, p) in bed.pods.iter().enumerate() {
        let last = p.lock().unwrap().last().copied();
        match (last, last_write[j]) {
            (Some(h), Some(w)) if h >= w => all = all.max(h - t),
            // No change of an app's object in this mix.
            (_, None) if unused_percent() > 0 => {}
            _ => apps_missed += 1,
        }
    }
    Burst {
        all_refreshed: (apps_missed == 0).then_some(all),
        writers,
        cpu,
        api_cpu,
        events,
        apps_missed,
    }
}

fn us_per(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One run: both clusters, both watchers.
async fn run(r: usize, work: &Path, big: usize) -> (Sample, [f64; 3]) {
    let mut s = Sample::new();
    let order = if r.is_multiple_of(2) {
        [Who::Wasmwatch, Who::Baseline]
    } else {
        [Who::Baseline, Who::Wasmwatch]
    };
    // 1. 1,000 objects: control, then each watcher paced and burst.
    let b = bed(OBJECTS).await;
    let control = paced(&b, None, &format!("r{r}c")).await;
    let control_burst = burst(&b, None, &format!("r{r}c")).await;
    let api_paced0 = us_per(control.api_cpu, PACED);
    let api_burst0 = us_per(control_burst.api_cpu, BURST);
    for (n, &who) in order.iter().enumerate() {
        let p = launch(who, &b, work).await;
        let calls0 = match p.admin {
            Some(a) => Some((
                plugin_calls(a, "http-refresh").await,
                plugin_calls(a, "rollout-restart").await,
            )),
            None => None,
        };
        // Idle: no change for IDLE after the start (the list is done and
        // the term began), the process's CPU per second.
        let (c0, t0) = (process_cpu(p.pid()), Instant::now());
        tokio::time::sleep(IDLE).await;
        let idle = (process_cpu(p.pid()) - c0).as_secs_f64() * 1e3 / t0.elapsed().as_secs_f64();
        put(&mut s, "idle_1k", who, idle);
        let prof = Profile::start(p.pid(), who, &format!("paced-r{r}"));
        let m = paced(&b, Some(p.pid()), &format!("r{r}p{n}")).await;
        drop(prof);
        if let (Some(a), Some((h0, r0))) = (p.admin, calls0) {
            let (h1, r1) = (
                plugin_calls(a, "http-refresh").await,
                plugin_calls(a, "rollout-restart").await,
            );
            if h1.1 > h0.1 {
                put(
                    &mut s,
                    "call_http",
                    who,
                    (h1.0 - h0.0) / (h1.1 - h0.1) * 1e6,
                );
            }
            if r1.1 > r0.1 {
                put(
                    &mut s,
                    "call_rollout",
                    who,
                    (r1.0 - r0.0) / (r1.1 - r0.1) * 1e6,
                );
            }
        }
        put(&mut s, "cpu_1k", who, us_per(m.cpu, PACED));
        put(&mut s, "p50", who, ms(m.p50));
        put(&mut s, "p99", who, ms(m.p99));
        put(&mut s, "missing", who, m.missing as f64);
        put(
            &mut s,
            "api_paced",
            who,
            us_per(m.api_cpu, PACED) - api_paced0,
        );
        put(
            &mut s,
            "events_paced",
            who,
            m.events.0 as f64 / PACED as f64,
        );
        put(
            &mut s,
            "events_new_paced",
            who,
            m.events.1 as f64 / PACED as f64,
        );
        put(
            &mut s,
            "writes_paced",
            who,
            m.other_writes as f64 / PACED as f64,
        );
        // 1,000/s: every app gets 20 changes a second.
        let f = paced_at(&b, Some(p.pid()), &format!("r{r}f{n}"), FAST, FAST_TICK).await;
        put(&mut s, "cpu_fast", who, us_per(f.cpu, FAST));
        put(&mut s, "p50_fast", who, ms(f.p50));
        put(&mut s, "p99_fast", who, ms(f.p99));
        put(&mut s, "missing_fast", who, f.missing as f64);
        let prof = Profile::start(p.pid(), who, &format!("burst-r{r}"));
        let bu = burst(&b, Some(p.pid()), &format!("r{r}b{n}")).await;
        drop(prof);
        if let Some(all) = bu.all_refreshed {
            put(&mut s, "burst_all", who, ms(all));
            put(&mut s, "burst_rate", who, BURST as f64 / all.as_secs_f64());
        }
        put(&mut s, "burst_missed", who, bu.apps_missed as f64);
        put(&mut s, "burst_writers", who, ms(bu.writers));
        put(&mut s, "burst_cpu", who, us_per(bu.cpu, BURST));
        put(
            &mut s,
            "api_burst",
            who,
            us_per(bu.api_cpu, BURST) - api_burst0,
        );
        put(
            &mut s,
            "events_burst",
            who,
            bu.events.0 as f64 / BURST as f64,
        );
        put(
            &mut s,
            "events_new_burst",
            who,
            bu.events.1 as f64 / BURST as f64,
        );
        drop(p);
    }
    b.server.shutdown().await;
    // 2. The large cluster: start-up, memory, paced CPU at that size.
    let b = bed(big).await;
    for (n, &who) in order.iter().enumerate() {
        let p = launch(who, &b, work).await;
        put(&mut s, "to_ready", who, ms(p.to_ready));
        put(&mut s, "to_watch", who, ms(p.to_watch));
        let (rss, _) = rss_kib(p.pid());
        put(&mut s, "rss", who, rss as f64 / 1024.0);
        let prof = Profile::start(p.pid(), who, &format!("paced-big-r{r}"));
        let m = paced(&b, Some(p.pid()), &format!("r{r}q{n}")).await;
        drop(prof);
        put(&mut s, "cpu_big", who, us_per(m.cpu, PACED));
        put(&mut s, "p99_big", who, ms(m.p99));
        let (_, peak) = rss_kib(p.pid());
        put(&mut s, "rss_peak", who, peak as f64 / 1024.0);
        drop(p);
    }
    b.server.shutdown().await;
    let controls = [api_paced0, api_burst0, ms(control_burst.writers)];
    (s, controls)
}

/// Rows whose ratio means nothing (counts that should be 0, and ready
/// lines that mean different things).
const NO_RATIO: &[&str] = &["to_ready", "missing", "missing_fast", "burst_missed"];

/// (key, label, decimals)
fn rows(big: usize) -> Vec<(&'static str, String, usize)> {
    let big = if big.is_multiple_of(1000) {
        format!("{}k", big / 1000)
    } else {
        big.to_string()
    };
    vec![
        ("cpu_1k", "CPU per change at 100/s, 1k objects (µs)".into(), 0),
        ("cpu_big", format!("same, {big} objects (µs)"), 0),
        ("idle_1k", "CPU idle, 1k objects (ms per s)".into(), 1),
        ("p50", "write → POST at the app, p50 at 100/s (ms)".into(), 2),
        ("p99", "write → POST at the app, p99 at 100/s (ms)".into(), 2),
        ("p99_big", format!("same p99, {big} objects (ms)"), 2),
        ("cpu_fast", "CPU per change at 1,000/s, 1k objects (µs)".into(), 0),
        ("p50_fast", "write → POST at the app, p50 at 1,000/s (ms)".into(), 2),
        ("p99_fast", "write → POST at the app, p99 at 1,000/s (ms)".into(), 2),
        ("missing_fast", format!("changes without a POST after them at 1,000/s (of {FAST})"), 0),
        ("missing", "changes without a POST after them (of 1,000)".into(), 0),
        ("burst_all", "burst (4 HTTP writers, 4,000 changes): start → every app refreshed after its last change (ms)".into(), 0),
        ("burst_rate", "burst: changes/s over that time".into(), 0),
        ("burst_writers", "burst: the writers' own time (ms)".into(), 0),
        ("burst_missed", "burst: apps without a POST after their last change".into(), 0),
        ("burst_cpu", "burst CPU per change (µs)".into(), 0),
        ("api_paced", "API server CPU per change caused, 100/s (µs)".into(), 0),
        ("api_burst", "API server CPU per change caused, burst (µs)".into(), 0),
        ("events_paced", "Kubernetes Event writes per change, 100/s".into(), 3),
        ("events_new_paced", "of which new Event objects (creates)".into(), 3),
        ("events_burst", "Kubernetes Event writes per change, burst".into(), 3),
        ("events_new_burst", "of which new Event objects (creates)".into(), 3),
        ("writes_paced", "other API writes per change, 100/s (Leases, ...)".into(), 3),
        ("call_http", "plugin call, mean in the service: http-refresh (µs)".into(), 0),
        ("call_rollout", "plugin call, mean in the service: rollout-restart (µs)".into(), 0),
        ("rss", format!("RSS, {big} ConfigMaps of 10 KiB, idle (MiB)"), 1),
        ("rss_peak", format!("peak RSS, {big} ConfigMaps, after the paced load (MiB)"), 1),
        ("to_ready", format!("spawn → ready line, {big} objects (ms; wasmwatch's comes before its ConfigMap list, the baseline's after: no ratio)"), 0),
        ("to_watch", format!("spawn → ConfigMap watch open (list done), {big} objects (ms)"), 0),
    ]
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn cell(v: &[f64], decimals: usize) -> String {
    let Some(m) = median(v.to_vec()) else {
        return "—".into();
    };
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.len() > 1 && hi > lo {
        format!("{m:.decimals$} ({lo:.decimals$}–{hi:.decimals$})")
    } else {
        format!("{m:.decimals$}")
    }
}

pub async fn compare(runs: usize) {
    let big: usize = std::env::var("BENCH_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    // The compile cache is shared by the runs (run 1 compiles).
    let work = tempfile::tempdir().unwrap();
    let mut samples = Vec::new();
    let mut controls = Vec::new();
    for r in 0..runs {
        let t = Instant::now();
        let (s, c) = run(r, work.path(), big).await;
        let mut keys: Vec<_> = s.keys().copied().collect();
        keys.sort();
        let line: Vec<String> = keys
            .iter()
            .map(|k| {
                let [w, b] = s[k];
                let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
                format!("{k}={}/{}", f(w), f(b))
            })
            .collect();
        println!(
            "compare run {}/{runs} ({:.0?}; wasmwatch/baseline): {}; control without a watcher: API server {:.0} µs per change at 100/s, {:.0} µs in the burst, burst writers {:.0} ms",
            r + 1,
            t.elapsed(),
            line.join(" "),
            c[0],
            c[1],
            c[2]
        );
        samples.push(s);
        controls.push(c);
    }
    println!();
    println!(
        "compare: wasmwatch (http-refresh + rollout-restart, debounce 0) vs the kube-rs informer baseline; ConfigMaps of 10 KiB in {NAMESPACES} namespaces, {APPS} apps, {}% of them (and of the changes) used by no app (BENCH_MIX); medians of {runs} runs (range), ratio = median of the per-run ratios wasmwatch / baseline",
        unused_percent()
    );
    println!();
    println!("| measure | wasmwatch | baseline | ratio |");
    println!("|---|---|---|---|");
    for (key, label, decimals) in rows(big) {
        let side = |i: usize| -> Vec<f64> {
            samples
                .iter()
                .filter_map(|s| s.get(key).and_then(|v| v[i]))
                .collect()
        };
        let (w, b) = (side(0), side(1));
        if w.is_empty() && b.is_empty() {
            continue;
        }
        let ratios: Vec<f64> = samples
            .iter()
            .filter_map(|s| match s.get(key)? {
                [Some(w), Some(b)] if *b > 0.0 => Some(w / b),
                _ => None,
            })
            .collect();
        let ratio = match median(ratios) {
            Some(r) if !NO_RATIO.contains(&key) => format!("{r:.2}x"),
            _ => String::new(),
        };
        println!(
            "| {label} | {} | {} | {ratio} |",
            cell(&w, decimals),
            cell(&b, decimals)
        );
    }
    let col = |i: usize| controls.iter().map(|c: &[f64; 3]| c[i]).collect::<Vec<_>>();
    println!();
    println!(
        "control (no watcher, subtracted above): API server CPU per change {} µs at 100/s, {} µs in the burst; burst writers alone {} ms",
        cell(&col(0), 0),
        cell(&col(1), 0),
        cell(&col(2), 0)
    );
}
