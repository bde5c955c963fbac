//! Issue 34 §1 end to end: a watched kind beyond ConfigMap and Secret, the
//! CSI driver's SecretProviderClassPodStatus, through `wasmwatch run`
//! replicas against the test API server with the bundled rollout-restart
//! (WIT 0.4.0), as Reloader's `--enable-csi-integration` users have it:
//! - a pod's mount status appearing restarts nothing (Reloader ignores
//!   creations and deletions of these);
//! - a rotation (the mounted versions change) restarts each workload that
//!   mounts the class with `secretproviderclass.reloader.stakater.com/auto`
//!   or names it in `.../reload`, once for all the pods' statuses, and
//!   leaves alone workloads that exclude it, mount another class or only
//!   carry a Secret's auto annotation;
//! - a change of labels only is not a change;
//! - a rotation while nobody leads, with the watch history gone, is
//!   replayed by the next leader from the stored checkpoints and index:
//!   the changed statuses only, each workload restarted once more.
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use wasmwatch_core::digest::data_digest;
use wasmwatch_core::manifest::SECRET_PROVIDER_CLASS_POD_STATUS;
use wasmwatch_core::{DataValue, ObjectKind};
use wasmwatch_exec::workload::hash_annotation_key;

const NS: &str = "shop";
const WITHIN: Duration = Duration::from_secs(60);

const MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch:
  kinds: [ConfigMap, secrets-store.csi.x-k8s.io/v1/SecretProviderClassPodStatus]
  namespaces: [shop]
ha: {enabled: true, namespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms}
plugins:
  - name: rollout-restart
    module: {module:rollout-restart}
    sha256: {sha256:rollout-restart}
    events: {kinds: [ConfigMap, secrets-store.csi.x-k8s.io/v1/SecretProviderClassPodStatus]}
    capabilities: {restart: {namespaces: [shop]}}
    delivery: {debounce: 0s}
";

fn statuses(c: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "secrets-store.csi.x-k8s.io",
        "v1",
        "SecretProviderClassPodStatus",
    ));
    Api::namespaced_with(c.clone(), NS, &ar)
}

fn objects(version: &str) -> Value {
    json!([{"id": "secret/db-password", "version": version},
           {"id": "secret/db-user", "version": "u1"}])
}

/// The mount status the driver writes for `pod` mounting `class`.
async fn mount_status(c: &kube::Client, pod: &str, class: &str, version: &str) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "secrets-store.csi.x-k8s.io/v1",
        "kind": "SecretProviderClassPodStatus",
        "metadata": {"name": format!("{pod}-{NS}-{class}"), "namespace": NS,
            "labels": {"internal.secrets-store.csi.k8s.io/node-name": "node-1"}},
        "status": {"podName": pod, "secretProviderClassName": class, "mounted": true,
            "targetPath": format!("/var/lib/kubelet/pods/{pod}/volumes/csi/secrets"),
            "objects": objects(version)},
    }))
    .unwrap();
    statuses(c)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
}

/// The driver's rotation: every pod's status of `class` gets `version`.
async fn rotate(c: &kube::Client, pods: &[&str], class: &str, version: &str) {
    for pod in pods {
        statuses(c)
            .patch(
                &format!("{pod}-{NS}-{class}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"objects": objects(version)}})),
            )
            .await
            .unwrap();
    }
}

/// What a restart for `class` at `version` records.
fn content_hash(class: &str, version: &str) -> String {
    let data: BTreeMap<String, DataValue> = [
        (
            "status.secretProviderClassName".to_string(),
            class.to_string(),
        ),
        ("status.objects".to_string(), objects(version).to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k, DataValue::Text(v)))
    .collect();
    format!("secretproviderclass/{class}:{}", data_digest(&data, None))
}

fn csi_pod(class: Option<&str>) -> Value {
    let mut spec = json!({"containers": [{"name": "app", "image": "example/app:1",
        "volumeMounts": [{"name": "secrets", "mountPath": "/mnt/secrets"}]}]});
    if let Some(class) = class {
        spec["volumes"] = json!([{"name": "secrets", "csi": {
            "driver": "secrets-store.csi.k8s.io", "readOnly": true,
            "volumeAttributes": {"secretProviderClass": class}}}]);
    } else {
        spec["containers"][0]["volumeMounts"] = json!([]);
    }
    spec
}

/// (generation, the restart record for `class`) of Deployment `name`.
async fn state(c: &kube::Client, name: &str, class: &str) -> (i64, Option<String>) {
    let (generation, annotations) = deployment_state(c, NS, name).await;
    let key = hash_annotation_key(&content_hash(class, "-"));
    (generation, annotations.get(&key).cloned())
}

fn csi_kind() -> ObjectKind {
    ObjectKind::parse(SECRET_PROVIDER_CLASS_POD_STATUS).unwrap()
}

/// The stored checkpoint of the mount statuses in `shop`.
async fn csi_checkpoint(c: &kube::Client) -> Option<u64> {
    checkpoint_of(c, csi_kind().stem(), NS).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_rotations_restart_reloaders_workloads_once_and_a_gap_past_the_history_is_replayed() {
    let e = test_env(MANIFEST, NS).await;
    let c = &e.client;
    let auto = json!({"secretproviderclass.reloader.stakater.com/auto": "true"});
    workload(
        c,
        NS,
        "Deployment",
        "api",
        auto.clone(),
        json!({}),
        csi_pod(Some("vault-db")),
    )
    .await;
    workload(
        c,
        NS,
        "Deployment",
        "named",
        json!({"secretproviderclass.reloader.stakater.com/reload": "vault-.*"}),
        json!({}),
        csi_pod(None),
    )
    .await;
    workload(
        c,
        NS,
        "Deployment",
        "excluded",
        json!({"reloader.stakater.com/auto": "true",
            "secretproviderclasses.exclude.reloader.stakater.com/reload": "vault-db"}),
        json!({}),
        csi_pod(Some("vault-db")),
    )
    .await;
    workload(
        c,
        NS,
        "Deployment",
        "cache",
        auto,
        json!({}),
        csi_pod(Some("vault-cache")),
    )
    .await;
    workload(
        c,
        NS,
        "Deployment",
        "secret-auto",
        json!({"secret.reloader.stakater.com/auto": "true"}),
        json!({}),
        csi_pod(Some("vault-db")),
    )
    .await;
    let all = ["api", "named", "excluded", "cache", "secret-auto"];
    let untouched = ["excluded", "cache", "secret-auto"];
    for pod in ["api-1", "api-2"] {
        mount_status(c, pod, "vault-db", "v1").await;
    }

    let a = Replica::start(&e.kubeconfig, &e.manifest, "replica-a");
    eventually(Duration::from_secs(15), "replica-a leads", || a.leading()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A new pod's mount status is not a change (nor, being new, for Reloader).
    mount_status(c, "cache-1", "vault-cache", "v1").await;

    // 1. A rotation: both pods' statuses change alike; one restart each.
    rotate(c, &["api-1", "api-2"], "vault-db", "v2").await;
    let v2 = content_hash("vault-db", "v2");
    for name in ["api", "named"] {
        eventually(WITHIN, &format!("{name} restarted for v2"), || async {
            state(c, name, "vault-db").await.1.as_deref() == Some(v2.as_str())
        })
        .await;
    }
    // A label-only change of a status is not a change.
    statuses(c)
        .patch(
            "api-1-shop-vault-db",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"extra": "x"}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["api", "named"] {
        assert_eq!(
            state(c, name, "vault-db").await.0,
            2,
            "{name}: one restart for two pods"
        );
    }
    for name in untouched {
        assert_eq!(state(c, name, "vault-db").await, (1, None), "{name}");
    }
    assert_eq!(state(c, "cache", "vault-cache").await, (1, None));

    // 2. The checkpoints pass the rotation; the leader is killed; while
    //    nobody leads the class rotates again and the history is lost.
    let rv: u64 = statuses(c)
        .get("api-2-shop-vault-db")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "the CSI checkpoint passes v2",
        || async { csi_checkpoint(c).await.is_some_and(|v| v >= rv) },
    )
    .await;
    // The stored index is saved every few seconds, with what it may be
    // trusted for (issue 33) for the statuses as for ConfigMaps.
    eventually(
        Duration::from_secs(15),
        "the statuses' index trusted",
        || async {
            let api: Api<k8s_openapi::api::coordination::v1::Lease> =
                Api::namespaced(c.clone(), "default");
            let lease = api.get_opt("wasmwatch-state").await.unwrap();
            lease
                .and_then(|l| l.metadata.annotations)
                .and_then(|a| a.get(wasmwatch_kube::checkpoint::TRUST_ANNOTATION).cloned())
                .is_some_and(|t| {
                    wasmwatch_kube::checkpoint::Trust::parse(&t).is_ok_and(|t| {
                        t.trusted(csi_kind(), &wasmwatch_core::Scope::from_key(NS))
                            .is_some()
                    })
                })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let b = Replica::start(&e.kubeconfig, &e.manifest, "replica-b");
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    rotate(c, &["api-1", "api-2"], "vault-db", "v3").await;
    e.server.faults().compact_history();

    // 3. The next leader replays exactly the rotation.
    eventually(Duration::from_secs(15), "replica-b leads", || b.leading()).await;
    let v3 = content_hash("vault-db", "v3");
    for name in ["api", "named"] {
        eventually(WITHIN, &format!("{name} restarted for v3"), || async {
            state(c, name, "vault-db").await.1.as_deref() == Some(v3.as_str())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["api", "named"] {
        assert_eq!(state(c, name, "vault-db").await.0, 3, "{name}: once more");
    }
    for name in untouched {
        assert_eq!(state(c, name, "vault-db").await, (1, None), "{name}");
    }
    let delivered: Vec<String> = b
        .reports()
        .iter()
        .filter(|r| r["outcome"] == "done")
        .flat_map(|r| r["objects"].as_array().cloned().unwrap_or_default())
        .filter_map(|o| o.as_str().map(str::to_string))
        .collect();
    assert!(
        delivered.iter().all(|o| o.contains("vault-db")),
        "only the statuses that changed in the gap: {delivered:?}"
    );
    assert!(!delivered.is_empty());
    eprintln!("delivered after the failover: {delivered:?}");
    for name in all {
        let (generation, _) = deployment_state(c, NS, name).await;
        eprintln!("{name}: generation {generation}");
    }
}

/// Watching the mount statuses in a cluster without the CSI driver's CRD
/// must not hold up ConfigMaps: their changes still restart workloads and
/// are checkpointed. Once the driver is installed, its statuses are
/// watched without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_drivers_crd_configmaps_are_handled_and_a_later_install_is_followed() {
    let e = test_env_with(
        wasmwatch_apiserver::Config::default().preinstalled_crds(false),
        MANIFEST,
        NS,
    )
    .await;
    let c = &e.client;
    apply(
        c,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "orders", "namespace": NS}, "data": {"a": "1"}}),
    )
    .await;
    let pod = json!({"containers": [{"name": "app", "image": "example/app:1",
        "envFrom": [{"configMapRef": {"name": "orders"}}]}]});
    workload(
        c,
        NS,
        "Deployment",
        "orders",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({}),
        pod,
    )
    .await;
    let a = Replica::start(&e.kubeconfig, &e.manifest, "replica-a");
    eventually(Duration::from_secs(15), "replica-a leads", || a.leading()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.clone(), NS)
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": "2"}})),
        )
        .await
        .unwrap();
    eventually(WITHIN, "orders restarted", || async {
        deployment_state(c, NS, "orders").await.0 == 2
    })
    .await;
    // And its checkpoint is stored, so that a successor does not deliver
    // the ConfigMaps again.
    eventually(
        Duration::from_secs(10),
        "the ConfigMap checkpoint",
        || async { checkpoint(c, NS).await.is_some() },
    )
    .await;

    // The driver is installed: its statuses are watched from then on.
    apply(
        c,
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "secretproviderclasspodstatuses.secrets-store.csi.x-k8s.io"},
            "spec": {"group": "secrets-store.csi.x-k8s.io", "scope": "Namespaced",
                "names": {"kind": "SecretProviderClassPodStatus",
                    "listKind": "SecretProviderClassPodStatusList",
                    "plural": "secretproviderclasspodstatuses",
                    "singular": "secretproviderclasspodstatus"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}]}}),
    )
    .await;
    workload(
        c,
        NS,
        "Deployment",
        "api",
        json!({"secretproviderclass.reloader.stakater.com/auto": "true"}),
        json!({}),
        csi_pod(Some("vault-db")),
    )
    .await;
    mount_status(c, "api-1", "vault-db", "v1").await;
    // Rotated until the watch (retrying with backoff) has its baseline
    // before a rotation: the first rotation after it restarts `api`.
    let mut version = 1;
    eventually(WITHIN, "api restarted after the driver's install", || {
        version += 1;
        let v = format!("v{version}");
        async move {
            rotate(c, &["api-1"], "vault-db", &v).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            deployment_state(c, NS, "api").await.0 >= 2
        }
    })
    .await;
}
