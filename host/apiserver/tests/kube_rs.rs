//! kube-rs against the server: CRUD, optimistic concurrency, and
//! watcher + reflector convergence under churn, 410 relists and closed watches.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::sync::Notify;
use wasmwatch_apiserver::Config;

fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn api_err(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn crud_with_kube_rs() {
    let server = common::start().await;
    let client = server.client().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();

    let mut obj = cm("alpha", &[("k", "v1")]);
    obj.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
    let created = api.create(&pp, &obj).await.unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let rv1 = created.metadata.resource_version.clone().unwrap();

    let again = api_err(api.create(&pp, &obj).await.unwrap_err());
    assert_eq!((again.code, again.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(again.message, "configmaps \"alpha\" already exists");

    api.create(&pp, &cm("beta", &[])).await.unwrap();
    let got = api.get("alpha").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "v1");

    let list = api
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    let all = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 2);
    let list_rv: u64 = all.metadata.resource_version.unwrap().parse().unwrap();
    assert_eq!(list_rv, server.resource_version());

    // Replace with the current version succeeds and bumps the version.
    let mut upd = created.clone();
    upd.data = Some(BTreeMap::from([("k".into(), "v2".into())]));
    let replaced = api.replace("alpha", &pp, &upd).await.unwrap();
    assert_ne!(
        replaced.metadata.resource_version.as_deref(),
        Some(rv1.as_str())
    );
    // Replace with the stale version is a 409 Conflict.
    let stale = api_err(api.replace("alpha", &pp, &upd).await.unwrap_err());
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));
    assert!(stale.message.contains("the object has been modified"));
    // Replace without a version is unconditional.
    upd.metadata.resource_version = None;
    upd.data = Some(BTreeMap::from([("k".into(), "v3".into())]));
    api.replace("alpha", &pp, &upd).await.unwrap();

    // Patches: merge, strategic, JSON patch.
    let p = api
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"m": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(p.data.as_ref().unwrap()["m"], "1");
    let p = api
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"s": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.labels.as_ref().unwrap()["s"], "1");
    let p = api
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(json!([{"op": "remove", "path": "/data/m"}])).unwrap(),
            ),
        )
        .await
        .unwrap();
    assert!(!p.data.as_ref().unwrap().contains_key("m"));
    // A patch carrying a stale resourceVersion is a precondition: 409.
    let e = api_err(
        api.patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": rv1}, "data": {"x": "y"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 409);

    let deleted = api.delete("alpha", &DeleteParams::default()).await.unwrap();
    assert!(deleted.is_right(), "configmap delete answers a Status");
    let nf = api_err(api.get("alpha").await.unwrap_err());
    assert_eq!((nf.code, nf.reason.as_str()), (404, "NotFound"));
    assert_eq!(nf.message, "configmaps \"alpha\" not found");
    let nf = api_err(
        api.delete("alpha", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(nf.code, 404);

    // Objects in a namespace that does not exist: 404 for the namespace.
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    let e = api_err(other.create(&pp, &cm("x", &[])).await.unwrap_err());
    assert_eq!(e.message, "namespaces \"nope\" not found");
    let ns_api: Api<Namespace> = Api::all(client.clone());
    ns_api
        .create(
            &pp,
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("nope".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    other.create(&pp, &cm("x", &[])).await.unwrap();
    // Deleting the namespace marks it Terminating (kube-apiserver): no new
    // content, existing content can still change; the namespace controller
    // then deletes its content, and the namespace.
    ns_api
        .delete("nope", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = ns_api.get("nope").await.unwrap();
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    let e = api_err(other.create(&pp, &cm("y", &[])).await.unwrap_err());
    assert_eq!(e.code, 403);
    assert!(
        e.message.contains("because it is being terminated"),
        "{}",
        e.message
    );
    for _ in 0..200 {
        if ns_api.get_opt("nope").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        ns_api.get_opt("nope").await.unwrap().is_none(),
        "deleted at last"
    );
    assert_eq!(api_err(other.get("x").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn secrets_deployments_and_leases() {
    let server = common::start().await;
    let client = server.client().unwrap();
    let pp = PostParams::default();

    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds"},
        "stringData": {"user": "admin"},
        "data": {"pw": "c2VjcmV0"}
    }))
    .unwrap();
    let s = secrets.create(&pp, &s).await.unwrap();
    let data = s.data.unwrap();
    assert_eq!(data["user"].0, b"admin");
    assert_eq!(data["pw"].0, b"secret");
    assert_eq!(s.type_.as_deref(), Some("Opaque"));
    let typed = secrets
        .list(&ListParams::default().fields("type=Opaque"))
        .await
        .unwrap();
    assert_eq!(typed.items.len(), 1);

    let deploys: Api<Deployment> = Api::default_namespaced(client.clone());
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1"}]}
            }
        }
    }))
    .unwrap();
    let d = deploys.create(&pp, &d).await.unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    // A metadata-only change keeps the generation; a spec change bumps it.
    let d2 = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(d2.metadata.generation, Some(1));
    let d3 = deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "now"}}}}})),
        )
        .await
        .unwrap();
    assert_eq!(d3.metadata.generation, Some(2));
    // Status goes through the status subresource only.
    let st = deploys
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"readyReplicas": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(st.status.unwrap().ready_replicas, Some(1));
    assert_eq!(st.metadata.generation, Some(2));

    // Leases: MicroTime round-trips; a lost race is a 409.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let now = MicroTime(
        k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Microsecond)
            .unwrap(),
    );
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("leader".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(now.clone()),
            renew_time: Some(now.clone()),
            lease_transitions: Some(0),
            ..Default::default()
        }),
    };
    let l = leases.create(&pp, &lease).await.unwrap();
    assert_eq!(l.spec.as_ref().unwrap().renew_time, Some(now));
    let mut a = l.clone();
    let mut b = l.clone();
    a.spec.as_mut().unwrap().holder_identity = Some("a2".into());
    b.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases.replace("leader", &pp, &a).await.unwrap();
    let lost = api_err(leases.replace("leader", &pp, &b).await.unwrap_err());
    assert_eq!(lost.code, 409);
    let bad = Lease {
        metadata: ObjectMeta {
            name: Some("bad".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            lease_duration_seconds: Some(0),
            ..Default::default()
        }),
    };
    assert_eq!(
        api_err(leases.create(&pp, &bad).await.unwrap_err()).code,
        422
    );
}

/// Random writes over many objects in several namespaces.
async fn churn(
    api_for: &dyn Fn(&str) -> Api<ConfigMap>,
    rng: &mut rand::rngs::StdRng,
    writes: usize,
) {
    let namespaces = ["default", "team-a", "team-b"];
    for i in 0..writes {
        let ns = namespaces[rng.random_range(0..namespaces.len())];
        let api = api_for(ns);
        let name = format!("cm-{}", rng.random_range(0..40));
        match rng.random_range(0..10) {
            0..=3 => {
                let _ = api
                    .create(&PostParams::default(), &cm(&name, &[("i", &i.to_string())]))
                    .await;
            }
            4..=7 => {
                let _ = api
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"data": {"i": i.to_string()}})),
                    )
                    .await;
            }
            _ => {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
        }
    }
}

type Fingerprint = BTreeMap<(String, String), (String, Option<BTreeMap<String, String>>)>;

fn fingerprint<'a>(items: impl Iterator<Item = &'a ConfigMap>) -> Fingerprint {
    items
        .map(|c| {
            (
                (
                    c.metadata.namespace.clone().unwrap_or_default(),
                    c.metadata.name.clone().unwrap_or_default(),
                ),
                (
                    c.metadata.resource_version.clone().unwrap_or_default(),
                    c.data.clone(),
                ),
            )
        })
        .collect()
}

fn server_fingerprint(server: &wasmwatch_apiserver::ServerHandle) -> Fingerprint {
    let (items, _) = server.snapshot("configmaps").unwrap();
    let cms: Vec<ConfigMap> = items
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
    fingerprint(cms.iter())
}

#[tokio::test]
async fn reflector_converges_through_churn_410_and_closed_watches() {
    let server = common::start_with(Config::default().history(200)).await;
    let client = server.client().unwrap();
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for ns in ["team-a", "team-b"] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        ns_api.create(&PostParams::default(), &n).await.unwrap();
    }

    let all: Api<ConfigMap> = Api::all(client.clone());
    let (store, writer) = reflector::store();
    let notify = Arc::new(Notify::new());
    let n2 = notify.clone();
    let inits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inits2 = inits.clone();
    let driver = tokio::spawn(async move {
        let stream = reflector(
            writer,
            watcher(all, watcher::Config::default()).default_backoff(),
        );
        futures_util::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(watcher::Event::Init) = ev {
                inits2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            n2.notify_one();
        }
    });
    store.wait_until_ready().await.unwrap();

    let api_for = |ns: &str| -> Api<ConfigMap> { Api::namespaced(client.clone(), ns) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);

    let converge = |label: &'static str| {
        let store = store.clone();
        let notify = notify.clone();
        let server = &server;
        async move {
            let want = server_fingerprint(server);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let got = fingerprint(store.state().iter().map(|a| a.as_ref()));
                if got == want {
                    return;
                }
                assert!(
                    tokio::time::timeout_at(deadline, notify.notified())
                        .await
                        .is_ok(),
                    "{label}: reflector did not converge: {} objects vs {} on the server",
                    got.len(),
                    want.len()
                );
            }
        }
    };

    churn(&api_for, &mut rng, 1500).await;
    converge("after churn").await;

    // Closed watches: the watcher re-watches from its last version.
    server.faults().close_watches();
    churn(&api_for, &mut rng, 500).await;
    converge("after closed watches").await;
    let before = inits.load(std::sync::atomic::Ordering::SeqCst);

    // Forced 410: history gone and watches closed: the watcher must relist.
    server.faults().close_watches();
    server.faults().compact_history();
    churn(&api_for, &mut rng, 500).await;
    converge("after 410").await;
    assert!(
        inits.load(std::sync::atomic::Ordering::SeqCst) > before,
        "the watcher relisted after 410 Expired"
    );
    // The small history ring overflows by itself under churn too.
    churn(&api_for, &mut rng, 500).await;
    converge("final").await;
    assert!(!store.state().is_empty());
    driver.abort();
}

/// `ServerHandle::modify` (the benchmarks' in-process writer) is an update
/// like any other: a watching client sees it as MODIFIED with a new
/// resourceVersion, and a refused object changes nothing.
#[tokio::test]
async fn in_process_modify_is_seen_by_a_watching_client() {
    let server = common::start().await;
    let client = server.client().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = api
        .create(&PostParams::default(), &cm("alpha", &[("k", "v1")]))
        .await
        .unwrap();
    let rv1: u64 = created.metadata.resource_version.unwrap().parse().unwrap();
    let mut events = api
        .watch(&kube::api::WatchParams::default(), &rv1.to_string())
        .await
        .unwrap()
        .boxed();

    let rv2 = server
        .modify("configmaps", "default", "alpha", |o| {
            o["data"]["k"] = json!("v2")
        })
        .unwrap();
    assert!(rv2 > rv1);
    match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
        Ok(Some(Ok(kube::api::WatchEvent::Modified(o)))) => {
            assert_eq!(o.data.unwrap()["k"], "v2");
            assert_eq!(o.metadata.resource_version.unwrap(), rv2.to_string());
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }

    let refused = server.modify("configmaps", "default", "alpha", |o| {
        o["kind"] = json!("Secret")
    });
    assert!(refused.is_err(), "{refused:?}");
    assert!(
        server
            .modify("configmaps", "default", "nope", |_| {})
            .is_err()
    );
    assert!(
        server
            .modify("widgets", "default", "alpha", |_| {})
            .is_err()
    );
    let now = api.get("alpha").await.unwrap();
    assert_eq!(now.metadata.resource_version.unwrap(), rv2.to_string());
}
