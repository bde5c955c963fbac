//! Issue 21, point 3: digests of Secret data are keyed (HMAC-SHA-256 under
//! a key in a Secret of wasmwatch's namespace), and upgrading from versions
//! that wrote plain SHA-256 digests acts on nothing by itself. End to end:
//! `wasmwatch run` replicas as processes against the test API server, the
//! bundled rollout-restart restarting a Deployment that uses a Secret.
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use wasmwatch_core::DataValue;
use wasmwatch_core::digest::{DigestKey, data_digest};

const MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [Secret], namespaces: [shop]}
ha: {enabled: true, namespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms}
plugins:
  - name: rollout-restart
    module: {module:rollout-restart}
    sha256: {sha256:rollout-restart}
    events: {kinds: [Secret]}
    config: {reloadOnCreate: false, reloadOnDelete: false}
    capabilities: {restart: [shop]}
    delivery: {debounce: 0s, retries: 3, backoffInitial: 100ms, backoffMax: 1s}
";

const ANNOTATION: &str = "config-hash.wasmwatch.io/secret.db";

fn pin_data(pin: &str) -> BTreeMap<String, DataValue> {
    BTreeMap::from([("pin".to_string(), DataValue::Text(pin.to_string()))])
}

async fn set_pin(secrets: &Api<Secret>, pin: &str) -> u64 {
    set(secrets, "db", pin).await
}

async fn set(secrets: &Api<Secret>, name: &str, pin: &str) -> u64 {
    let patch = serde_json::json!({"stringData": {"pin": pin}});
    let s = secrets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    s.metadata.resource_version.unwrap().parse().unwrap()
}

/// (generation, the content-hash annotation) of Deployment `shop/orders`.
async fn orders(client: &kube::Client) -> (i64, Option<String>) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), "shop");
    let d = api.get("orders").await.unwrap();
    let annotation = d
        .spec
        .template
        .metadata
        .and_then(|m| m.annotations)
        .and_then(|a| a.get(ANNOTATION).cloned());
    (d.metadata.generation.unwrap(), annotation)
}

/// The pod-template annotations of Deployment `shop/orders`.
async fn template(client: &kube::Client) -> serde_json::Value {
    let api: Api<Deployment> = Api::namespaced(client.clone(), "shop");
    let d = serde_json::to_value(api.get("orders").await.unwrap()).unwrap();
    d.pointer("/spec/template/metadata/annotations")
        .cloned()
        .unwrap_or_default()
}

/// The stored Secret index, as a new leader reads it (the segments the
/// state Lease names, then its tail), one line per object.
async fn stored_index(client: &kube::Client) -> String {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let annotation = |l: &Lease, key: &str| {
        l.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key).cloned())
    };
    let Some(state) = leases.get_opt("wasmwatch-state").await.unwrap() else {
        return String::new();
    };
    let Some(log) = annotation(&state, "wasmwatch.io/index-log") else {
        return String::new();
    };
    let log = wasmwatch_kube::checkpoint::Log::parse(&log).unwrap();
    let secret = wasmwatch_core::ObjectKind::Secret;
    let mut index = wasmwatch_core::index::ObjectIndex::new(secret);
    let mut apply = |text: &str| {
        let text = wasmwatch_kube::checkpoint::unpack(text).unwrap();
        let mut kinds = wasmwatch_kube::checkpoint::split_kinds(&text, &log.kinds).unwrap();
        index
            .apply_text(&kinds.remove(&secret).unwrap_or_default())
            .unwrap();
    };
    for &n in &log.segments {
        let segment = leases
            .get(&wasmwatch_kube::checkpoint::segment_name(
                "wasmwatch-state",
                n,
            ))
            .await
            .unwrap();
        apply(&annotation(&segment, "wasmwatch.io/index").unwrap());
    }
    if let Some(tail) = annotation(&state, "wasmwatch.io/index-tail") {
        apply(&tail);
    }
    index.encode()
}

/// The plain per-key hash versions before keys stored (the first 8 bytes of
/// SHA-256, little endian, as hex).
fn plain_key_hash(value: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(value.as_bytes());
    format!("{:016x}", u64::from_le_bytes(d[..8].try_into().unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_across_a_failover_and_a_410_restarts_nothing_then_keys_every_digest() {
    let e = test_env(MANIFEST, "shop").await;
    let c = &e.client;
    workload(
        c,
        "shop",
        "Deployment",
        "orders",
        serde_json::json!({"reloader.stakater.com/auto": "true"}),
        serde_json::json!({}),
        serde_json::json!({"containers": [{"name": "app", "image": "example/app:1",
            "envFrom": [{"secretRef": {"name": "db"}}, {"secretRef": {"name": "cache"}}]}]}),
    )
    .await;
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "shop");
    for name in ["db", "cache"] {
        let s: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": {
                "meta.helm.sh/release-name": "shop",
                "reloader.stakater.com/match": "false"}},
            "stringData": {"pin": "1234"}
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }

    // 1. The version before keys (plain digests) handles a change.
    let old = Replica::start_env(
        &e.kubeconfig,
        &e.manifest,
        "old",
        "200ms",
        "default",
        Duration::from_secs(60),
        &[("WASMWATCH_UNKEYED_DIGESTS", "1")],
    );
    eventually(Duration::from_secs(10), "the old version leads", || {
        old.leading()
    })
    .await;
    // Its baseline is stored before it handles changes: a change made
    // before the baseline list would be part of it, not an event.
    eventually(Duration::from_secs(10), "the baseline", || async {
        checkpoint_of(c, "secret", "shop").await.is_some()
    })
    .await;
    set(&secrets, "cache", "1111").await;
    let rv = set_pin(&secrets, "1111").await;
    let plain = format!("secret/db:{}", data_digest(&pin_data("1111"), None));
    eventually(Duration::from_secs(30), "the plain restarts", || async {
        orders(c).await.1.as_deref() == Some(plain.as_str())
            && template(c)
                .await
                .get("config-hash.wasmwatch.io/secret.cache")
                == Some(&serde_json::json!(format!(
                    "secret/cache:{}",
                    data_digest(&pin_data("1111"), None)
                )))
    })
    .await;
    let restarted = orders(c).await;
    // Its checkpoint and index (the index at most every checkpoint round).
    eventually(Duration::from_secs(10), "the checkpoint", || async {
        checkpoint_of(c, "secret", "shop")
            .await
            .is_some_and(|v| v >= rv)
    })
    .await;
    eventually(Duration::from_secs(10), "the plain index", || async {
        stored_index(c)
            .await
            .contains(&format!("pin={}", plain_key_hash("1111")))
    })
    .await;
    let keys: Api<Secret> = Api::namespaced(c.clone(), "default");
    assert!(
        keys.get_opt("wasmwatch-digest-key")
            .await
            .unwrap()
            .is_none(),
        "the old version has no key"
    );

    // 2. It dies; while nobody leads, db is relabelled (written after the
    // checkpoint, same content) and the history is lost (410).
    drop(old);
    let patch = serde_json::json!({"metadata": {"labels": {"tier": "db"}}});
    secrets
        .patch("db", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    e.server.faults().compact_history();

    // 3. The upgraded version takes over: it creates the key, resyncs, and
    // restarts nothing (db's content is what the template records).
    let new = Replica::start(&e.kubeconfig, &e.manifest, "new");
    eventually(Duration::from_secs(15), "the new version leads", || {
        new.leading()
    })
    .await;
    let key = keys.get("wasmwatch-digest-key").await.unwrap();
    let key_bytes = key.data.as_ref().unwrap()["key"].0.clone();
    assert_eq!(key_bytes.len(), 32, "32 random bytes");
    assert_eq!(key.immutable, Some(true));
    let key = DigestKey::new(&key_bytes).unwrap();
    // The resync rewrites every line keyed: no plain hash is left.
    eventually(Duration::from_secs(15), "the keyed index", || async {
        let text = stored_index(c).await;
        text.contains("shop/db ") && !text.contains(&plain_key_hash("1111"))
    })
    .await;
    let text = stored_index(c).await;
    assert!(
        text.contains(r#""k":true"#),
        "keyed lines are marked: {text}"
    );
    // rollout-restart declares the annotations it reads: only those are
    // kept of each object.
    assert!(
        text.contains("reloader.stakater.com/match") && !text.contains("meta.helm.sh"),
        "{text}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        orders(c).await,
        restarted,
        "the upgrade restarted nothing by itself"
    );
    let reports = serde_json::to_string(&new.reports()).unwrap();
    assert!(
        reports.contains("Secret/shop/db"),
        "db was delivered (written after the checkpoint), and the restart found its \
         content already there: {reports}"
    );
    assert!(
        !reports.contains("Secret/shop/cache"),
        "cache, unchanged, compares equal to its plain index line: {reports}"
    );

    // 4. A real change restarts, with the keyed digest on the template.
    set_pin(&secrets, "2222").await;
    let keyed = format!("secret/db:{}", data_digest(&pin_data("2222"), Some(&key)));
    assert_ne!(
        keyed,
        format!("secret/db:{}", data_digest(&pin_data("2222"), None))
    );
    eventually(Duration::from_secs(10), "the keyed restart", || async {
        orders(c).await.1.as_deref() == Some(keyed.as_str())
    })
    .await;
    assert_eq!(orders(c).await.0, restarted.0 + 1);
}

/// Every replica ends with the same key, whoever creates it; a key the
/// operator put there is used as is; a Secret without a usable key stops
/// the run with a message naming it and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_key_and_a_bad_key_secret_is_named() {
    let e = test_env(MANIFEST, "shop").await;
    let c = e.client.clone();
    let loads = (0..4).map(|_| {
        let c = c.clone();
        tokio::spawn(async move {
            wasmwatch_kube::digest_key::load(c, "default", "wasmwatch-digest-key", true)
                .await
                .unwrap()
                .unwrap()
        })
    });
    let keys: Vec<DigestKey> = futures_util::future::join_all(loads)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "one key for all");
    assert_eq!(
        wasmwatch_kube::digest_key::load(c.clone(), "default", "absent", false)
            .await
            .unwrap(),
        None,
        "without `create`, an absent Secret is no key"
    );

    let secrets: Api<Secret> = Api::namespaced(c.clone(), "default");
    let short: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "short-key"}, "stringData": {"key": "tooshort"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &short)
        .await
        .unwrap();
    let manifest = std::fs::read_to_string(&e.manifest).unwrap().replace(
        "watch: {kinds: [Secret], namespaces: [shop]}",
        "watch: {kinds: [Secret], namespaces: [shop], digestKeySecret: short-key}",
    );
    std::fs::write(&e.manifest, manifest).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
        .args(["run", "--manifest"])
        .arg(&e.manifest)
        .args(["--admin-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", &e.kubeconfig)
        .env("POD_NAMESPACE", "default")
        .env("WASMWATCH_CACHE_DIR", artifact_cache_dir())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("digest key Secret default/short-key")
            && stderr.contains("8 bytes; at least 16"),
        "{stderr}"
    );
}
