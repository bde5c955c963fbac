//! The HA soak: random churn over hundreds of ConfigMaps in three
//! namespaces while leaders are killed 20 times, half without release
//! (SIGKILL), half with (SIGTERM). A ledger (a real HTTP server) records
//! every delivery the `ledger` test plugin makes, with the sender (each
//! replica posts to its own path) and the Lease holder at that moment.
//! Afterwards: every content change and every deletion was delivered at
//! least once; duplicates are counted; no action came from a non-leader.
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
const KILLS: usize = 20;

struct Receipt {
    sender: String,
    line: String,
    holder: String,
}

/// Accepts `POST /<sender>` with a body; answers 200.
async fn ledger(server: Arc<wasmwatch_apiserver::ServerHandle>) -> (u16, Arc<Mutex<Vec<Receipt>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let receipts = Arc::new(Mutex::new(Vec::new()));
    let r = receipts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let r = r.clone();
            let server = server.clone();
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
                    r.lock().unwrap().push(Receipt {
                        sender,
                        line: body,
                        holder,
                    });
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_random_churn_with_20_leader_kills_loses_nothing_and_no_follower_acts() {
    let server = Arc::new(
        Server::start(Config::default().bookmark_interval(Duration::from_secs(1)))
            .await
            .unwrap(),
    );
    let client = server.client().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let (port, receipts) = ledger(server.clone()).await;

    // Expected deliveries: (object, digest) for every write, and deletions.
    let mut writes: Vec<(String, String)> = Vec::new();
    let mut deletions: Vec<String> = Vec::new();
    let mut live: Vec<(usize, String)> = Vec::new();
    let apis: Vec<Api<ConfigMap>> = NAMESPACES
        .iter()
        .map(|ns| Api::namespaced(client.clone(), ns))
        .collect();
    for (i, ns) in NAMESPACES.iter().enumerate() {
        namespace(&client, ns).await;
        for j in 0..OBJECTS_PER_NAMESPACE {
            let name = format!("cm-{j}");
            apis[i]
                .create(&PostParams::default(), &cm(&name, "0"))
                .await
                .unwrap();
            live.push((i, name));
        }
    }

    let mut next_id = 0;
    let mut start_replica = |replicas: &mut Vec<Replica>| {
        next_id += 1;
        let identity = format!("replica-{next_id}");
        let path = dir.path().join(format!("{identity}.yaml"));
        std::fs::write(&path, wasmwatch_testkit::pin(&manifest(port, &identity))).unwrap();
        replicas.push(Replica::start(&kubeconfig, &path, &identity));
    };
    let mut replicas = Vec::new();
    for _ in 0..3 {
        start_replica(&mut replicas);
    }
    // Churn starts after the first leader took its baseline.
    eventually(Duration::from_secs(20), "first checkpoint", || async {
        checkpoint(&client, "soak-a").await.is_some()
    })
    .await;

    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut counter = 0u64;
    let mut created = 0usize;
    let started = Instant::now();
    let mut failovers = Vec::new();
    for kill in 0..KILLS {
        // ~1.5 s of churn at ~40 writes/s across the namespaces.
        for _ in 0..60 {
            counter += 1;
            let value = counter.to_string();
            match rng.below(20) {
                0 if live.len() > 10 => {
                    let (i, name) = live.swap_remove(rng.below(live.len()));
                    apis[i]
                        .delete(&name, &DeleteParams::default())
                        .await
                        .unwrap();
                    deletions.push(format!("{}/{name}", NAMESPACES[i]));
                }
                1 => {
                    created += 1;
                    let i = rng.below(NAMESPACES.len());
                    let name = format!("new-{created}");
                    apis[i]
                        .create(&PostParams::default(), &cm(&name, &value))
                        .await
                        .unwrap();
                    writes.push((format!("{}/{name}", NAMESPACES[i]), digest(&value)));
                    live.push((i, name));
                }
                _ => {
                    let (i, name) = live[rng.below(live.len())].clone();
                    let patch = serde_json::json!({"data": {"v": value}});
                    apis[i]
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .unwrap();
                    writes.push((format!("{}/{name}", NAMESPACES[i]), digest(&value)));
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        // Kill the leader mid-stream, with or without release.
        let mut leader = None;
        for (i, r) in replicas.iter().enumerate() {
            if r.leading().await {
                leader = Some(i);
            }
        }
        let Some(i) = leader else {
            // Mid-failover already: the next round kills the next leader.
            continue;
        };
        let mut gone = replicas.swap_remove(i);
        let t = Instant::now();
        if kill % 2 == 0 {
            gone.child.kill().unwrap();
        } else {
            gone.signal("TERM");
        }
        gone.child.wait().unwrap();
        start_replica(&mut replicas);
        // Wait for a successor before the next round.
        let mut took = None;
        while t.elapsed() < Duration::from_secs(15) {
            let mut any = false;
            for r in &replicas {
                any |= r.leading().await;
            }
            if any {
                took = Some(t.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        failovers.push((kill % 2 == 0, took.expect("a successor leads")));
    }

    // Quiesce: every write and deletion delivered.
    let expected: HashSet<(String, String)> = writes.iter().cloned().collect();
    let done = eventually(
        Duration::from_secs(60),
        "every change delivered",
        || async {
            let seen: HashSet<(String, String)> = receipts
                .lock()
                .unwrap()
                .iter()
                .filter_map(|r| {
                    let mut p = r.line.split(' ');
                    Some((p.next()?.to_string(), p.next()?.to_string()))
                })
                .collect();
            expected.is_subset(&seen)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let receipts = receipts.lock().unwrap();
    let deleted: HashSet<&str> = receipts
        .iter()
        .filter(|r| r.line.split(' ').nth(2) == Some("deleted"))
        .filter_map(|r| r.line.split(' ').next())
        .collect();
    for d in &deletions {
        assert!(
            deleted.contains(d.as_str()),
            "deletion of {d} not delivered"
        );
    }
    let mut per_line: HashMap<(&str, &str, &str), usize> = HashMap::new();
    for r in receipts.iter() {
        let mut p = r.line.split(' ');
        let key = (
            p.next().unwrap_or(""),
            p.next().unwrap_or(""),
            p.next().unwrap_or(""),
        );
        *per_line.entry(key).or_default() += 1;
    }
    let duplicates: usize = per_line.values().map(|n| n - 1).sum();
    let violations: Vec<String> = receipts
        .iter()
        .filter(|r| !r.holder.is_empty() && r.holder != r.sender)
        .map(|r| format!("{} delivered {:?} while {} led", r.sender, r.line, r.holder))
        .collect();
    // Changes in flight at a kill are replayed by the successor, marked so.
    let replays = receipts
        .iter()
        .filter(|r| r.line.split(' ').nth(4) == Some("true"))
        .count();
    let kills: Vec<_> = failovers.iter().filter(|f| f.0).map(|f| f.1).collect();
    let terms: Vec<_> = failovers.iter().filter(|f| !f.0).map(|f| f.1).collect();
    eprintln!(
        "soak: {} writes + {} deletions over {} objects in {:?}; {} deliveries ({replays} marked replay), {} duplicates; {} failovers (kill: {:?}; SIGTERM: {:?}); all delivered {:?} after the churn",
        writes.len(),
        deletions.len(),
        NAMESPACES.len() * OBJECTS_PER_NAMESPACE + created,
        started.elapsed(),
        receipts.len(),
        duplicates,
        failovers.len(),
        kills,
        terms,
        done
    );
    assert!(
        violations.is_empty(),
        "actions by non-leaders: {violations:#?}"
    );
    assert!(
        replays > 0,
        "no delivery was marked as a replay after {} failovers",
        failovers.len()
    );
    assert!(
        replays < receipts.len() / 2,
        "{replays} of {} deliveries marked replay: only what a successor catches up on is",
        receipts.len()
    );
    assert!(
        failovers.len() >= KILLS - 2,
        "leaders were killed {} times",
        failovers.len()
    );
    // Duplicates come only from changes in flight at a kill: at most what
    // arrives in a checkpoint interval plus the pipeline's latency, per kill.
    assert!(
        duplicates <= failovers.len() * 20,
        "{duplicates} duplicates for {} failovers",
        failovers.len()
    );
}
