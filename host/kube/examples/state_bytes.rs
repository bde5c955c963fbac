//! What the stored state costs under churn (issue 32): bytes and writes of
//! the state per change, with the store's real save path against the test
//! API server over HTTP.
//!
//! `cargo run --release -p wasmwatch-kube --example state_bytes -- [OBJECTS] [SAVES] [CHANGES_PER_SAVE] [both]`
//!
//! OBJECTS ConfigMaps (default 10,000) with Helm-like labels and the
//! 250-byte description annotation of `kube-root-ca.crt` are indexed and saved
//! (with `both`, half of them Secrets, and changes go to either kind);
//! then SAVES saves (default 300) of CHANGES_PER_SAVE changed objects each
//! (default 200: 100 changes/s at the default 2 s interval). Bytes are the
//! JSON of every object the saves wrote (created, or written over: the
//! state Lease at each save, each new segment); deletes count as writes of
//! no bytes.
use std::collections::BTreeSet;
use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use wasmwatch_apiserver::{Config, Server};
use wasmwatch_core::index::{ObjectIndex, Seen};
use wasmwatch_core::{ObjectKind, ObjectSnapshot, Scope};
use wasmwatch_kube::checkpoint::{CheckpointStore, Checkpoints, StreamIndex};
use wasmwatch_kube::elector::Term;

fn object(kind: ObjectKind, i: usize, version: usize) -> ObjectSnapshot {
    use base64::Engine;
    // A Secret's data is base64.
    let value = |v: String| match kind {
        ObjectKind::Secret => base64::engine::general_purpose::STANDARD.encode(v),
        _ => v,
    };
    ObjectSnapshot::from_json(&serde_json::json!({
        "kind": kind.as_str(),
        "metadata": {
            "name": format!("release-{i}-config"),
            "namespace": format!("team-{}", i % 50),
            "labels": {
                "app.kubernetes.io/managed-by": "Helm",
                "app.kubernetes.io/instance": format!("release-{i}"),
                "helm.sh/chart": "app-1.2.3",
            },
            "annotations": {
                // kube-root-ca.crt's, in every namespace of a real cluster.
                "kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.",
                "meta.helm.sh/release-name": format!("release-{i}"),
            },
        },
        "data": {"application.yaml": value(format!("v: {version}")), "extra": value("y".into())},
    }))
    .expect("an object")
}

#[tokio::main]
async fn main() {
    let both = std::env::args().any(|a| a == "both");
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|a| a != "both")
        .map(|a| a.replace(',', "").parse().expect("numbers"))
        .collect();
    // Object i is a Secret when `both` and i is odd.
    let kind_of = |i: usize| {
        if both && i % 2 == 1 {
            ObjectKind::Secret
        } else {
            ObjectKind::ConfigMap
        }
    };
    let kinds: &[ObjectKind] = if both {
        &[ObjectKind::ConfigMap, ObjectKind::Secret]
    } else {
        &[ObjectKind::ConfigMap]
    };
    let objects = args.first().copied().unwrap_or(10_000);
    let saves = args.get(1).copied().unwrap_or(300);
    let per_save = args.get(2).copied().unwrap_or(200);
    let server = Server::start(Config::default()).await.unwrap();
    let client = server.client().unwrap();
    let term = Term {
        holder: "bench".into(),
        transitions: 1,
        lease_uid: String::new(),
    };
    let mut store = CheckpointStore::new(
        client.clone(),
        "default",
        "wasmwatch-state",
        "wasmwatch-leader",
        term.clone(),
    );
    // STATE_BYTES_TAIL (bytes, packed) tries another tail limit,
    // STATE_BYTES_TIER another number of segments a tier holds.
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    let mut sizes =
        wasmwatch_kube::checkpoint::Sizes::with_segment(wasmwatch_kube::checkpoint::SHARD_BYTES);
    if let Some(tail) = env("STATE_BYTES_TAIL") {
        sizes.tail = tail;
    }
    if let Some(tier) = env("STATE_BYTES_TIER") {
        sizes.tier = tier;
    }
    store = store.sizes(sizes);
    store.claim().await.unwrap();
    let mut index: Vec<ObjectIndex> = kinds.iter().map(|&k| ObjectIndex::new(k)).collect();
    let slot = |i: usize| kinds.iter().position(|&k| k == kind_of(i)).unwrap();
    let mut versions = vec![0usize; objects];
    for i in 0..objects {
        index[slot(i)].apply(Seen::Added, object(kind_of(i), i, 0), false);
    }
    let streams = |ix: &[ObjectIndex]| -> Vec<StreamIndex> {
        ix.iter()
            .map(|ix| StreamIndex {
                kind: ix.kind(),
                scope: Scope::All,
                index: ix.clone(),
                at: None,
            })
            .collect()
    };
    let mut cps = Checkpoints::default();
    let t = Instant::now();
    store.save(&cps, &streams(&index)).await.unwrap();
    println!(
        "{objects} objects: first save {:.2?}, {} bytes stored",
        t.elapsed(),
        stored_bytes(&client).await.1
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let mut seen: BTreeSet<String> = names(&leases).await;
    let (mut bytes, mut writes, mut rewrites, mut merges) = (0usize, 0usize, 0usize, 0usize);
    let mut most_segments = 0;
    let log = || {
        let state = server
            .get("leases.coordination.k8s.io", "default", "wasmwatch-state")
            .unwrap();
        let log = state["metadata"]["annotations"]["wasmwatch.io/index-log"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        wasmwatch_kube::checkpoint::Log::parse(&log).unwrap()
    };
    let mut times = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for s in 0..saves {
        for _ in 0..per_save {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let i = (rng % objects as u64) as usize;
            versions[i] += 1;
            index[slot(i)].apply(Seen::Modified, object(kind_of(i), i, versions[i]), false);
        }
        for &k in kinds {
            cps.set(k, &Scope::All, &(1000 + s).to_string());
        }
        let before = server.requests().len();
        let base = log().base;
        let t = Instant::now();
        store.save(&cps, &streams(&index)).await.unwrap();
        times.push(t.elapsed());
        most_segments = most_segments.max(log().segments.len());
        let requests = server.requests();
        let now = names(&leases).await;
        for r in &requests[before..] {
            if r.resource == "leases" && r.is_write() {
                writes += 1;
            }
        }
        if requests[before..]
            .iter()
            .any(|r| r.resource == "leases" && r.verb == "delete")
        {
            match log().base == base {
                true => merges += 1,
                false => rewrites += 1,
            }
        }
        // Created (new names) and written over (updates, by name).
        let updated: BTreeSet<String> = requests[before..]
            .iter()
            .filter(|r| r.resource == "leases" && r.verb == "update")
            .filter_map(|r| r.name.clone())
            .collect();
        for name in now.difference(&seen).chain(updated.iter()) {
            let l = server
                .get("leases.coordination.k8s.io", "default", name)
                .unwrap();
            bytes += serde_json::to_vec(&l).unwrap().len();
        }
        seen = now;
    }
    times.sort();
    let changes = saves * per_save;
    let (segments, stored) = stored_bytes(&client).await;
    println!(
        "{saves} saves of {per_save} changes: {:.1} state bytes per change, {:.4} state writes per change, {rewrites} full rewrites, {merges} merges; save p50 {:.2?} p99 {:.2?}; now {segments} segments (at most {most_segments}), {stored} bytes stored",
        bytes as f64 / changes as f64,
        writes as f64 / changes as f64,
        times[times.len() / 2],
        times[times.len() * 99 / 100],
    );
    let state = server
        .get("leases.coordination.k8s.io", "default", "wasmwatch-state")
        .unwrap();
    let tail = state["metadata"]["annotations"]["wasmwatch.io/index-tail"]
        .as_str()
        .map_or(0, str::len);
    println!(
        "the state Lease now: {} bytes, {tail} of them the tail; log {}",
        serde_json::to_vec(&state).unwrap().len(),
        log().format()
    );
    let t = Instant::now();
    let mut next = CheckpointStore::new(
        client,
        "default",
        "wasmwatch-state",
        "wasmwatch-leader",
        Term {
            transitions: 2,
            ..term
        },
    );
    let claimed = next.claim().await.unwrap();
    let read: usize = kinds.iter().map(|k| claimed.indexes[k].len()).sum();
    assert_eq!(read, objects);
    println!("a new leader's claim reads it back in {:.2?}", t.elapsed());
}

async fn names(leases: &Api<Lease>) -> BTreeSet<String> {
    leases
        .list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|l| l.metadata.name)
        .collect()
}

/// Segment Leases and the bytes of every state Lease.
async fn stored_bytes(client: &kube::Client) -> (usize, usize) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let all = leases.list(&Default::default()).await.unwrap();
    let segments = all
        .items
        .iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.contains("-segment-"))
        })
        .count();
    let bytes = all
        .items
        .iter()
        .map(|l| serde_json::to_vec(l).unwrap().len())
        .sum();
    (segments, bytes)
}
