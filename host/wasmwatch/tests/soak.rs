//! The HA soak, as a hostile operator runs it: random churn over hundreds
//! of ConfigMaps in three namespaces, and after every round of churn one
//! disruption, the kinds in turn: SIGKILL of the leader, SIGTERM, SIGSTOP
//! past the lease and just under it, a leaderless gap longer than the API
//! server's history (objects reverted, deleted and created in it; the next
//! leader meets 410 and relists), and a kill of the successor during its
//! replay. A ledger (a real HTTP server) records every delivery the `ledger`
//! test plugin makes, with the sender (each replica posts to its own path)
//! and the Lease holder at that moment, and answers 503 to 2% of them.
//!
//! Judged by what the app ends with: the last accepted delivery of every
//! object is its final content (or its deletion), and every content that
//! stayed for more than a second while someone led was delivered; every
//! deletion was delivered; no action came from a non-leader. Duplicates and
//! the largest replay after each kind of failover are printed.
mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmwatch_apiserver::{Config, Server};
use wasmwatch_core::DataValue;

const NAMESPACES: [&str; 3] = ["soak-a", "soak-b", "soak-c"];
const OBJECTS_PER_NAMESPACE: usize = 100;
/// Rounds of churn, each ending in one disruption (the kinds in turn).
const ROUNDS: usize = 18;
/// Share of deliveries the ledger answers with 503, per mille.
const UNAVAILABLE_PER_MILLE: u64 = 20;

struct Receipt {
    sender: String,
    line: String,
    holder: String,
    /// Answered 200 (else 503: the plugin's retry sends it again).
    accepted: bool,
}

/// Accepts `POST /<sender>` with a body; answers 200, or 503 to a fixed
/// pseudo-random share of requests.
async fn ledger(
    server: Arc<wasmwatch_apiserver::ServerHandle>,
    unavailable_per_mille: u64,
) -> (u16, Arc<Mutex<Vec<Receipt>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let receipts = Arc::new(Mutex::new(Vec::new()));
    let r = receipts.clone();
    let requests = Arc::new(std::sync::atomic::AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let r = r.clone();
            let server = server.clone();
            let requests = requests.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // Read one request: head, then content-length bytes.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    while buf.len() < head_end + len {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = String::from_utf8_lossy(&buf[head_end..head_end + len]).to_string();
                    buf.drain(..head_end + len);
                    let sender = head
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or("")
                        .trim_start_matches('/')
                        .to_string();
                    let holder = server
                        .get("leases.coordination.k8s.io", "default", "wasmwatch-leader")
                        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
                        .unwrap_or_default();
                    let n = requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let accepted = Rng(n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).next() % 1000
                        >= unavailable_per_mille;
                    r.lock().unwrap().push(Receipt {
                        sender,
                        line: body,
                        holder,
                        accepted,
                    });
                    let answer: &[u8] = if accepted {
                        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
                    } else {
                        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
                    };
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, receipts)
}

fn manifest(port: u16, identity: &str) -> String {
    format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [ConfigMap], namespaces: [soak-a, soak-b, soak-c], labelSelector: soak=true}}
ha: {{enabled: true, namespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms}}
plugins:
  - name: ledger
    module: {{module:misbehave}}
    sha256: {{sha256:misbehave}}
    events: {{kinds: [ConfigMap]}}
    config: {{mode: ledger, url: \"http://127.0.0.1:{port}/{identity}\"}}
    capabilities: {{http: [\"http://127.0.0.1:*/\"]}}
    limits: {{maxActions: 10}}
    delivery: {{debounce: 0s, retries: 10, backoffInitial: 50ms, backoffMax: 500ms}}
"
    )
}

fn digest(value: &str) -> String {
    let data: BTreeMap<String, DataValue> =
        [("v".to_string(), DataValue::Text(value.to_string()))].into();
    wasmwatch_core::event::data_digest(&data)
}

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"soak": "true"}}, "data": {"v": value}
    }))
    .unwrap()
}

/// A tiny xorshift: the churn is random but reproducible per seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Disruption {
    /// SIGKILL of the leader: no release, the successor waits out the lease.
    Kill,
    /// SIGTERM: released, handed over at once.
    Term,
    /// SIGSTOP for 4 s, past the 3 s lease: a successor takes over; the old
    /// leader wakes (SIGCONT) with buffered events and must not act.
    StopPastLease,
    /// SIGSTOP for 2.5 s: past the renew deadline, under the lease.
    StopUnderLease,
    /// SIGKILL of the leader and SIGSTOP of every follower; objects are
    /// reverted, deleted and created while nobody leads, then the history
    /// is lost: the next leader meets 410 and relists.
    GapPastHistory,
    /// SIGKILL of the leader, then of its successor as soon as it leads
    /// (during its replay).
    KillSuccessorInReplay,
}

const DISRUPTIONS: [Disruption; 6] = [
    Disruption::Kill,
    Disruption::Term,
    Disruption::StopPastLease,
    Disruption::StopUnderLease,
    Disruption::GapPastHistory,
    Disruption::KillSuccessorInReplay,
];

/// What the test did to the cluster, to judge what the apps end with.
struct World {
    apis: Vec<Api<ConfigMap>>,
    rng: Rng,
    counter: u64,
    created: usize,
    live: Vec<(usize, String)>,
    /// Per object (`ns/name`), its values so far (for reverts).
    values: HashMap<String, Vec<String>>,
    /// Every write and deletion after the baseline: when, object, digest
    /// (`None`: deleted).
    log: Vec<(Instant, String, Option<String>)>,
}

impl World {
    async fn write(&mut self, i: usize, name: &str, value: String) {
        let id = format!("{}/{name}", NAMESPACES[i]);
        if self.values.get(&id).and_then(|v| v.last()) == Some(&value) {
            return; // the same content: no change to deliver
        }
        let patch = serde_json::json!({"data": {"v": value}});
        self.apis[i]
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        self.log
            .push((Instant::now(), id.clone(), Some(digest(&value))));
        self.values.entry(id).or_default().push(value);
    }

    /// `writes` random changes at ~40/s: mostly modifications, 5% deletions,
    /// 5% creations, and with `reverts` 10% of objects set back to their
    /// previous content.
    async fn churn(&mut self, writes: usize, reverts: bool) {
        for _ in 0..writes {
            self.counter += 1;
            let value = self.counter.to_string();
            match self.rng.below(20) {
                0 if self.live.len() > 10 => {
                    let (i, name) = self.live.swap_remove(self.rng.below(self.live.len()));
                    self.apis[i]
                        .delete(&name, &DeleteParams::default())
                        .await
                        .unwrap();
                    self.log
                        .push((Instant::now(), format!("{}/{name}", NAMESPACES[i]), None));
                }
                1 => {
                    self.created += 1;
                    let i = self.rng.below(NAMESPACES.len());
                    let name = format!("new-{}", self.created);
                    self.apis[i]
                        .create(&PostParams::default(), &cm(&name, &value))
                        .await
                        .unwrap();
                    let id = format!("{}/{name}", NAMESPACES[i]);
                    self.log
                        .push((Instant::now(), id.clone(), Some(digest(&value))));
                    self.values.entry(id).or_default().push(value);
                    self.live.push((i, name));
                }
                2 | 3 if reverts => {
                    let (i, name) = self.live[self.rng.below(self.live.len())].clone();
                    let id = format!("{}/{name}", NAMESPACES[i]);
                    // Back to the content before the last (a regular write
                    // for an object that has only had one).
                    let before = self
                        .values
                        .get(&id)
                        .and_then(|v| v.iter().rev().nth(1).cloned());
                    self.write(i, &name, before.unwrap_or(value)).await;
                }
                _ => {
                    let (i, name) = self.live[self.rng.below(self.live.len())].clone();
                    self.write(i, &name, value).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// The replicas, three running (some may be stopped).
struct Replicas {
    dir: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
    port: u16,
    next_id: usize,
    list: Vec<Replica>,
    stopped: HashSet<String>,
}

impl Replicas {
    fn start(&mut self) {
        self.next_id += 1;
        let identity = format!("replica-{}", self.next_id);
        let path = self.dir.join(format!("{identity}.yaml"));
        std::fs::write(
            &path,
            wasmwatch_testkit::pin(&manifest(self.port, &identity)),
        )
        .unwrap();
        self.list
            .push(Replica::start(&self.kubeconfig, &path, &identity));
    }

    /// The running (not stopped) replica the leader Lease names.
    fn leader(&self, server: &wasmwatch_apiserver::ServerHandle) -> Option<usize> {
        let holder = holder(server);
        self.list
            .iter()
            .position(|r| r.identity == holder && !self.stopped.contains(&r.identity))
    }

    fn signal(&mut self, i: usize, sig: &str) {
        self.list[i].signal(sig);
        match sig {
            "STOP" => self.stopped.insert(self.list[i].identity.clone()),
            _ => self.stopped.remove(&self.list[i].identity),
        };
    }

    fn kill(&mut self, i: usize) {
        let mut gone = self.list.swap_remove(i);
        gone.child.kill().unwrap();
        gone.child.wait().unwrap();
    }

    /// Waits until a running replica other than `not` leads (its
    /// `/leader` says so); how long it took.
    async fn successor(
        &self,
        server: &wasmwatch_apiserver::ServerHandle,
        not: &str,
        within: Duration,
    ) -> Duration {
        let t = Instant::now();
        loop {
            if let Some(i) = self.leader(server)
                && self.list[i].identity != not
                && self.list[i].leading().await
            {
                return t.elapsed();
            }
            assert!(t.elapsed() < within, "no successor within {within:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn holder(server: &wasmwatch_apiserver::ServerHandle) -> String {
    server
        .get("leases.coordination.k8s.io", "default", "wasmwatch-leader")
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// How long `[from, to]` lies outside every window of `windows`.
fn outside(from: Instant, to: Instant, windows: &[(Instant, Instant)]) -> Duration {
    let mut covered = Duration::ZERO;
    for (a, b) in windows {
        let (s, e) = (from.max(*a), to.min(*b));
        if e > s {
            covered += e - s;
        }
    }
    (to - from).saturating_sub(covered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_hostile_disruptions_lose_nothing_end_on_the_last_content_and_no_follower_acts() {
    let server = Arc::new(
        Server::start(Config::default().bookmark_interval(Duration::from_secs(1)))
            .await
            .unwrap(),
    );
    let client = server.client().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let (port, receipts) = ledger(server.clone(), UNAVAILABLE_PER_MILLE).await;

    let mut world = World {
        apis: NAMESPACES
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect(),
        rng: Rng(0x5eed_1234_abcd_0001),
        counter: 0,
        created: 0,
        live: Vec::new(),
        values: HashMap::new(),
        log: Vec::new(),
    };
    for (i, ns) in NAMESPACES.iter().enumerate() {
        namespace(&client, ns).await;
        for j in 0..OBJECTS_PER_NAMESPACE {
            let name = format!("cm-{j}");
            world.apis[i]
                .create(&PostParams::default(), &cm(&name, "0"))
                .await
                .unwrap();
            world
                .values
                .insert(format!("{ns}/{name}"), vec!["0".to_string()]);
            world.live.push((i, name));
        }
    }
    let baseline: HashSet<String> = world.values.keys().cloned().collect();

    let mut replicas = Replicas {
        dir: dir.path().to_path_buf(),
        kubeconfig: kubeconfig.clone(),
        port,
        next_id: 0,
        list: Vec::new(),
        stopped: HashSet::new(),
    };
    for _ in 0..3 {
        replicas.start();
    }
    // Churn starts after the first leader took its baseline.
    eventually(Duration::from_secs(20), "first checkpoint", || async {
        checkpoint(&client, "soak-a").await.is_some()
    })
    .await;

    let started = Instant::now();
    // Per disruption: its kind, where the receipts stood when it began,
    // and how long until someone led again.
    let mut disruptions: Vec<(Disruption, usize, Duration)> = Vec::new();
    // When nobody could act (from a disruption to the next leader).
    let mut leaderless: Vec<(Instant, Instant)> = Vec::new();
    for round in 0..ROUNDS {
        world.churn(60, false).await;
        let kind = DISRUPTIONS[round % DISRUPTIONS.len()];
        let Some(i) = replicas.leader(&server) else {
            // Mid-failover already: the next round disrupts the next leader.
            continue;
        };
        let identity = replicas.list[i].identity.clone();
        let mark = receipts.lock().unwrap().len();
        let t0 = Instant::now();
        // When someone led again.
        let led = match kind {
            Disruption::Kill | Disruption::Term => {
                if kind == Disruption::Kill {
                    replicas.kill(i);
                } else {
                    replicas.list[i].signal("TERM");
                    let mut gone = replicas.list.swap_remove(i);
                    gone.child.wait().unwrap();
                }
                replicas.start();
                replicas
                    .successor(&server, &identity, Duration::from_secs(15))
                    .await;
                Instant::now()
            }
            Disruption::StopPastLease => {
                replicas.signal(i, "STOP");
                world.churn(40, false).await; // ~1 s
                replicas
                    .successor(&server, &identity, Duration::from_secs(15))
                    .await;
                let led = Instant::now();
                tokio::time::sleep(Duration::from_secs(4).saturating_sub(t0.elapsed())).await;
                let i = replicas
                    .list
                    .iter()
                    .position(|r| r.identity == identity)
                    .unwrap();
                replicas.signal(i, "CONT");
                led
            }
            Disruption::StopUnderLease => {
                replicas.signal(i, "STOP");
                tokio::time::sleep(Duration::from_millis(2500)).await;
                replicas.signal(i, "CONT");
                replicas
                    .successor(&server, "", Duration::from_secs(15))
                    .await;
                Instant::now()
            }
            Disruption::GapPastHistory => {
                replicas.kill(i);
                let others: Vec<usize> = (0..replicas.list.len()).collect();
                for &j in &others {
                    replicas.signal(j, "STOP");
                }
                world.churn(80, true).await; // ~2 s, reverts included
                server.faults().compact_history();
                for &j in &others {
                    replicas.signal(j, "CONT");
                }
                replicas.start();
                replicas
                    .successor(&server, &identity, Duration::from_secs(15))
                    .await;
                Instant::now()
            }
            Disruption::KillSuccessorInReplay => {
                replicas.kill(i);
                replicas.start();
                world.churn(20, false).await;
                replicas
                    .successor(&server, &identity, Duration::from_secs(15))
                    .await;
                // Its replay has just begun.
                let j = replicas.leader(&server).expect("the successor");
                let second = replicas.list[j].identity.clone();
                replicas.kill(j);
                replicas.start();
                replicas
                    .successor(&server, &second, Duration::from_secs(15))
                    .await;
                Instant::now()
            }
        };
        leaderless.push((t0, led));
        disruptions.push((kind, mark, led - t0));
    }
    let churn_over = Instant::now();

    // What the apps must end with: per object its final content (None:
    // deleted), and the contents that stayed over a second while someone led.
    let mut last: HashMap<String, Option<String>> = HashMap::new();
    let mut required: HashSet<(String, String)> = HashSet::new();
    let mut deletions: HashSet<String> = HashSet::new();
    for (n, (t, object, content)) in world.log.iter().enumerate() {
        last.insert(object.clone(), content.clone());
        let until = world.log[n + 1..]
            .iter()
            .find(|(_, o, _)| o == object)
            .map_or(churn_over, |(t, _, _)| *t);
        match content {
            Some(d) if outside(*t, until, &leaderless) > Duration::from_secs(1) => {
                required.insert((object.clone(), d.clone()));
            }
            Some(_) => {}
            None => {
                deletions.insert(object.clone());
            }
        }
    }
    let ends_right = |receipts: &[Receipt]| -> Vec<String> {
        let mut got: HashMap<&str, (&str, &str)> = HashMap::new();
        for r in receipts.iter().filter(|r| r.accepted) {
            let mut p = r.line.split(' ');
            let (Some(o), Some(d), Some(c)) = (p.next(), p.next(), p.next()) else {
                continue;
            };
            got.insert(o, (d, c));
        }
        last.iter()
            .filter_map(|(object, want)| {
                let have = got.get(object.as_str());
                let right = match (want, have) {
                    (None, Some((_, "deleted"))) => true,
                    // Created and deleted while nobody led: never seen.
                    (None, None) => !baseline.contains(object),
                    (Some(d), Some((have, c))) => *c != "deleted" && have == d,
                    _ => false,
                };
                (!right).then(|| format!("{object}: wants {want:?}, ends with {have:?}"))
            })
            .collect()
    };
    let done = eventually(
        Duration::from_secs(60),
        "every app on its last content",
        || async { ends_right(&receipts.lock().unwrap()).is_empty() },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let receipts = receipts.lock().unwrap();
    // Per kind of failover: duplicates (an accepted delivery of a change
    // already accepted) and the largest replay (objects delivered as
    // replays after it, as a share of the objects watched).
    let objects = baseline.len() + world.created;
    let mut seen: HashSet<(&str, &str, bool)> = HashSet::new();
    let mut per_kind: BTreeMap<Disruption, (usize, usize, f64, Vec<Duration>)> = BTreeMap::new();
    let mut duplicates = 0;
    for (n, r) in receipts.iter().enumerate() {
        let window = disruptions.iter().rposition(|(_, mark, _)| *mark <= n);
        // The same content (or deletion) of the same object again, whether
        // as a modification, a replay or a resync.
        let mut p = r.line.split(' ');
        let key = (
            p.next().unwrap_or(""),
            p.next().unwrap_or(""),
            p.next() == Some("deleted"),
        );
        if r.accepted && !seen.insert(key) {
            duplicates += 1;
            if let Some(w) = window {
                per_kind.entry(disruptions[w].0).or_default().1 += 1;
            }
        }
    }
    for (w, (kind, mark, took)) in disruptions.iter().enumerate() {
        let end = disruptions.get(w + 1).map_or(receipts.len(), |d| d.1);
        let replayed: HashSet<&str> = receipts[*mark..end]
            .iter()
            .filter(|r| r.line.split(' ').nth(4) == Some("true"))
            .filter_map(|r| r.line.split(' ').next())
            .collect();
        let e = per_kind.entry(*kind).or_default();
        e.0 += 1;
        e.2 = e.2.max(replayed.len() as f64 / objects as f64);
        e.3.push(*took);
    }
    let replays = receipts
        .iter()
        .filter(|r| r.line.split(' ').nth(4) == Some("true"))
        .count();
    eprintln!(
        "soak: {} writes and deletions over {objects} objects in {:?}; {} deliveries ({} answered 503, {replays} marked replay), {duplicates} duplicates; every app on its last content {done:?} after the churn",
        world.log.len(),
        started.elapsed(),
        receipts.len(),
        receipts.iter().filter(|r| !r.accepted).count(),
    );
    for (kind, (n, dups, largest, took)) in &per_kind {
        eprintln!(
            "soak: {kind:?} x{n}: {dups} duplicates, largest replay {:.1}% of the objects, led again after {took:?}",
            largest * 100.0
        );
    }
    let wrong = ends_right(&receipts);
    assert!(
        wrong.is_empty(),
        "apps not on their last content: {wrong:#?}"
    );
    let accepted: HashSet<(String, String)> = receipts
        .iter()
        .filter(|r| r.accepted)
        .filter_map(|r| {
            let mut p = r.line.split(' ');
            Some((p.next()?.to_string(), p.next()?.to_string()))
        })
        .collect();
    let missing: Vec<_> = required.difference(&accepted).collect();
    assert!(
        missing.is_empty(),
        "contents that stayed over a second while someone led, never delivered: {missing:?}"
    );
    let deleted: HashSet<&str> = receipts
        .iter()
        .filter(|r| r.accepted && r.line.split(' ').nth(2) == Some("deleted"))
        .filter_map(|r| r.line.split(' ').next())
        .collect();
    for d in &deletions {
        let seen = receipts
            .iter()
            .any(|r| r.line.starts_with(&format!("{d} ")));
        assert!(
            deleted.contains(d.as_str()) || !(seen || baseline.contains(d)),
            "deletion of {d} not delivered"
        );
    }
    let violations: Vec<String> = receipts
        .iter()
        .filter(|r| !r.holder.is_empty() && r.holder != r.sender)
        .map(|r| format!("{} delivered {:?} while {} led", r.sender, r.line, r.holder))
        .collect();
    assert!(
        violations.is_empty(),
        "actions by non-leaders: {violations:#?}"
    );

    assert!(
        disruptions.len() >= ROUNDS - 2,
        "{} disruptions",
        disruptions.len()
    );
    assert!(replays > 0, "no delivery was marked as a replay");
    for (kind, (_, _, largest, _)) in &per_kind {
        assert!(
            *largest < 0.5,
            "{kind:?}: a replay of {:.0}% of the objects is a storm",
            largest * 100.0
        );
    }
    assert!(
        duplicates <= disruptions.len() * 40,
        "{duplicates} duplicates for {} disruptions",
        disruptions.len()
    );
    // Issue 32: a SIGTERM handover drains (what is in flight finishes, the
    // final save covers everything handled): at most the one delivery in
    // flight is repeated per handover, on average.
    if let Some((n, dups, _, _)) = per_kind.get(&Disruption::Term) {
        assert!(*dups <= *n, "{dups} duplicates after {n} SIGTERM handovers");
    }
}

/// Issue 19's focused run: one object written 40 times back to back, its
/// plugin POSTing each content, 30% of the answers 503. Before contents were
/// ordered, 32 of 40 deliveries arrived after a newer one and the receiver
/// could end on an older content. Now the accepted deliveries follow the
/// object's versions and the last one is the last content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_objects_contents_reach_the_receiver_in_order_through_503s() {
    let server = Arc::new(Server::start(Config::default()).await.unwrap());
    let client = server.client().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let (port, receipts) = ledger(server.clone(), 300).await;
    namespace(&client, "soak-a").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "soak-a");
    api.create(&PostParams::default(), &cm("hot", "0"))
        .await
        .unwrap();
    let path = dir.path().join("replica-1.yaml");
    std::fs::write(&path, wasmwatch_testkit::pin(&manifest(port, "replica-1"))).unwrap();
    let replica = Replica::start(&kubeconfig, &path, "replica-1");
    eventually(Duration::from_secs(20), "first checkpoint", || async {
        checkpoint(&client, "soak-a").await.is_some()
    })
    .await;
    for i in 1..=40 {
        let patch = serde_json::json!({"data": {"v": i.to_string()}});
        api.patch("hot", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    let last = digest("40");
    eventually(
        Duration::from_secs(30),
        "the last content accepted",
        || async {
            receipts
                .lock()
                .unwrap()
                .iter()
                .any(|r| r.accepted && r.line.split(' ').nth(1) == Some(last.as_str()))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let receipts = receipts.lock().unwrap();
    let versions: Vec<u64> = receipts
        .iter()
        .filter(|r| r.accepted)
        .filter_map(|r| r.line.split(' ').nth(3)?.parse().ok())
        .collect();
    let refused = receipts.iter().filter(|r| !r.accepted).count();
    eprintln!(
        "ordering: {} deliveries accepted, {refused} answered 503",
        versions.len()
    );
    assert!(refused > 0, "the receiver refused some");
    let late: Vec<_> = versions.windows(2).filter(|w| w[1] < w[0]).collect();
    assert!(
        late.is_empty(),
        "older contents landed after newer ones: {versions:?}"
    );
    let final_line = receipts.iter().rfind(|r| r.accepted).unwrap();
    assert_eq!(
        final_line.line.split(' ').nth(1),
        Some(last.as_str()),
        "the receiver ends on the last content"
    );
    drop(replica);
}
