//! The state Lease: checkpoints round-trip, and a stale leader is fenced.
use wasmwatch_apiserver::{Config, Server, ServerHandle};
use wasmwatch_core::ObjectKind;
use wasmwatch_kube::checkpoint::{CheckpointError, CheckpointStore};
use wasmwatch_kube::elector::Term;

fn term(holder: &str, transitions: i32) -> Term {
    Term {
        holder: holder.into(),
        transitions,
    }
}

fn store(server: &ServerHandle, t: Term) -> CheckpointStore {
    CheckpointStore::new(server.client().unwrap(), "default", "wasmwatch-state", t)
}

fn annotation(server: &ServerHandle, key: &str) -> serde_json::Value {
    server
        .get("leases.coordination.k8s.io", "default", "wasmwatch-state")
        .unwrap()["metadata"]["annotations"][key]
        .clone()
}

#[tokio::test]
async fn checkpoints_round_trip_through_the_state_lease() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut a = store(&server, term("pod-a", 0));
    let mut cps = a.claim().await.unwrap();
    assert_eq!(cps, Default::default(), "first use creates an empty state");
    cps.set(ObjectKind::ConfigMap, "prod", "456");
    cps.set(ObjectKind::ConfigMap, "default", "123");
    cps.set(ObjectKind::Secret, "default", "120");
    a.save(&cps).await.unwrap();
    assert_eq!(
        annotation(&server, "wasmwatch.io/configmap-resource-version"),
        "default=123,prod=456"
    );
    assert_eq!(
        annotation(&server, "wasmwatch.io/secret-resource-version"),
        "default=120"
    );
    assert_eq!(annotation(&server, "wasmwatch.io/term"), "pod-a/0");
    // Batched writes: saving again advances in place.
    cps.set(ObjectKind::ConfigMap, "prod", "500");
    a.save(&cps).await.unwrap();
    // The next leader reads exactly that back.
    let mut b = store(&server, term("pod-b", 1));
    let read = b.claim().await.unwrap();
    assert_eq!(read.get(ObjectKind::ConfigMap, "prod"), Some("500"));
    assert_eq!(read.get(ObjectKind::ConfigMap, "default"), Some("123"));
    assert_eq!(read.get(ObjectKind::Secret, "default"), Some("120"));
    assert_eq!(annotation(&server, "wasmwatch.io/term"), "pod-b/1");
}

#[tokio::test]
async fn a_stale_leader_cannot_write_after_a_successor_claimed() {
    let server = Server::start(Config::default()).await.unwrap();
    let mut old = store(&server, term("pod-a", 3));
    let mut cps = old.claim().await.unwrap();
    cps.set(ObjectKind::ConfigMap, "default", "10");
    old.save(&cps).await.unwrap();

    let mut new = store(&server, term("pod-b", 4));
    new.claim().await.unwrap();

    // The old leader wakes up and tries to checkpoint further.
    cps.set(ObjectKind::ConfigMap, "default", "99");
    let err = old.save(&cps).await.unwrap_err();
    assert!(matches!(err, CheckpointError::Fenced(_)), "{err}");
    assert_eq!(
        annotation(&server, "wasmwatch.io/configmap-resource-version"),
        "default=10"
    );
    // Nor can it claim again: the stored term is newer.
    let err = store(&server, term("pod-a", 3)).claim().await.unwrap_err();
    assert!(err.to_string().contains("pod-b/4"), "{err}");
}

#[tokio::test]
async fn an_unreadable_state_is_reported_not_overwritten() {
    let server = Server::start(Config::default()).await.unwrap();
    let client = server.client().unwrap();
    let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client, "default");
    let lease: k8s_openapi::api::coordination::v1::Lease =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "wasmwatch-state",
                         "annotations": {"wasmwatch.io/configmap-resource-version": "default"}}
        }))
        .unwrap();
    api.create(&Default::default(), &lease).await.unwrap();
    let err = store(&server, term("pod-a", 1)).claim().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "state Lease wasmwatch-state: wasmwatch.io/configmap-resource-version: invalid entry \"default\", expected namespace=resourceVersion"
    );
    assert_eq!(
        annotation(&server, "wasmwatch.io/configmap-resource-version"),
        "default"
    );
}
