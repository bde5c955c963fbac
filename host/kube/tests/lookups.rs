//! `KubeLookups` against the test API server, and the cache's memory.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Api, Client};
use serde_json::{Value, json};
use wasmwatch_apiserver::{Config, Failure, Server, ServerHandle};
use wasmwatch_core::action::{WorkloadKind, WorkloadRef};
use wasmwatch_core::lookups::{Endpoint, ObjectUse, ServicePort, UseVia, WorkloadInfo};
use wasmwatch_core::{Lookups, ObjectKind};
use wasmwatch_kube::lookups::{Cache, CustomKind, KubeLookups};

// ---- helpers -------------------------------------------------------------

/// Polls `f` until it holds, failing the test after 10 s.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ready(lookups: &KubeLookups) {
    tokio::time::timeout(Duration::from_secs(10), lookups.ready())
        .await
        .expect("initial lists applied within 10 s");
}

async fn server() -> (ServerHandle, Client) {
    let server = Server::start(Config::default()).await.unwrap();
    let client = server.client().unwrap();
    (server, client)
}

async fn namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
}

async fn create<K>(client: &Client, ns: &str, obj: Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let obj: K = serde_json::from_value(obj).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

async fn patch<K>(client: &Client, ns: &str, name: &str, patch: Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn delete<K>(client: &Client, ns: &str, name: &str)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    api.delete(name, &DeleteParams::default()).await.unwrap();
}

/// A workload (Deployment, StatefulSet or DaemonSet: the same shape here)
/// whose pod template is `pod`.
fn workload(name: &str, annotations: Value, template_annotations: Value, pod: Value) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"app": name}, "annotations": annotations},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": template_annotations},
                "spec": pod
            }
        }
    })
}

fn refs(w: &WorkloadInfo) -> Vec<(ObjectKind, &str)> {
    w.references
        .iter()
        .map(|r| (r.kind, r.name.as_str()))
        .collect()
}

fn names(ws: &[WorkloadInfo]) -> Vec<(WorkloadKind, &str)> {
    ws.iter()
        .map(|w| (w.workload.kind.clone(), w.workload.name.as_str()))
        .collect()
}

fn referencing(
    l: &KubeLookups,
    kind: ObjectKind,
    ns: &str,
    name: &str,
) -> Vec<(WorkloadKind, String)> {
    l.workloads_referencing(kind, ns, name)
        .into_iter()
        .map(|w| (w.workload.kind, w.workload.name))
        .collect()
}

fn wref(kind: WorkloadKind, ns: &str, name: &str) -> WorkloadRef {
    WorkloadRef {
        kind,
        namespace: ns.into(),
        name: name.into(),
    }
}

use ObjectKind::{ConfigMap as CM, Secret as SEC};
use WorkloadKind::{DaemonSet as DS, Deployment as DEP, StatefulSet as STS};

// ---- workloads -----------------------------------------------------------

/// Volumes (configMap, secret, projected) in a Deployment.
fn volumes_pod() -> Value {
    json!({
        "volumes": [
            {"name": "a", "configMap": {"name": "vol-cm"}},
            {"name": "b", "secret": {"secretName": "vol-secret"}},
            {"name": "c", "projected": {"sources": [
                {"configMap": {"name": "proj-cm"}},
                {"secret": {"name": "shared"}}
            ]}}
        ],
        "containers": [{"name": "app", "image": "app"}]
    })
}

/// env valueFrom in a StatefulSet.
fn env_pod() -> Value {
    json!({
        "containers": [{"name": "app", "image": "app", "env": [
            {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "k"}}},
            {"name": "B", "valueFrom": {"secretKeyRef": {"name": "shared", "key": "k"}}}
        ]}]
    })
}

/// envFrom, only in an init container, in a DaemonSet.
fn init_pod() -> Value {
    json!({
        "initContainers": [{"name": "init", "image": "init", "envFrom": [
            {"configMapRef": {"name": "init-cm"}},
            {"secretRef": {"name": "shared"}}
        ]}],
        "containers": [{"name": "app", "image": "app"}]
    })
}

#[tokio::test]
async fn workloads_referencing_answers_every_way_of_referencing_and_follows_changes() {
    let (server, client) = server().await;
    namespace(&client, "team").await;
    let auto = json!({"reloader.stakater.com/auto": "true",
        "kubectl.kubernetes.io/last-applied-configuration": "{\"big\": \"copy\"}"});
    create::<Deployment>(
        &client,
        "team",
        workload("vols", auto.clone(), json!({"t": "1"}), volumes_pod()),
    )
    .await;
    create::<StatefulSet>(
        &client,
        "team",
        workload("envs", json!({}), json!({}), env_pod()),
    )
    .await;
    create::<DaemonSet>(
        &client,
        "team",
        workload("init", json!({}), json!({}), init_pod()),
    )
    .await;
    // The same names in another namespace.
    create::<Deployment>(
        &client,
        "default",
        workload("vols", json!({}), json!({}), volumes_pod()),
    )
    .await;

    let lookups = KubeLookups::start(client.clone(), None);
    ready(&lookups).await;
    assert!(lookups.is_ready());

    let vols = lookups.workloads_referencing(CM, "team", "vol-cm");
    assert_eq!(names(&vols), [(DEP, "vols")]);
    let vols = &vols[0];
    assert_eq!(
        refs(vols),
        [
            (CM, "proj-cm"),
            (CM, "vol-cm"),
            (SEC, "shared"),
            (SEC, "vol-secret")
        ]
    );
    assert_eq!(vols.labels["app"], "vols");
    assert_eq!(
        vols.annotations,
        BTreeMap::from([("reloader.stakater.com/auto".to_string(), "true".to_string())]),
        "last-applied-configuration is not kept"
    );
    assert_eq!(vols.template_annotations["t"], "1");
    assert_eq!(
        lookups.workload(&wref(DEP, "team", "vols")).as_ref(),
        Some(vols)
    );

    assert_eq!(
        referencing(&lookups, SEC, "team", "vol-secret"),
        [(DEP, "vols".into())]
    );
    assert_eq!(
        referencing(&lookups, CM, "team", "proj-cm"),
        [(DEP, "vols".into())]
    );
    assert_eq!(
        referencing(&lookups, CM, "team", "env-cm"),
        [(STS, "envs".into())]
    );
    assert_eq!(
        referencing(&lookups, CM, "team", "init-cm"),
        [(DS, "init".into())]
    );
    assert_eq!(
        referencing(&lookups, SEC, "team", "shared"),
        [
            (DEP, "vols".into()),
            (STS, "envs".into()),
            (DS, "init".into())
        ]
    );
    // Kind and namespace matter.
    assert!(referencing(&lookups, SEC, "team", "vol-cm").is_empty());
    assert!(referencing(&lookups, CM, "team", "nothing").is_empty());
    assert_eq!(
        referencing(&lookups, CM, "default", "vol-cm"),
        [(DEP, "vols".into())]
    );
    assert!(referencing(&lookups, CM, "default", "env-cm").is_empty());

    // Created after the initial list.
    create::<Deployment>(
        &client,
        "team",
        workload(
            "late",
            json!({}),
            json!({}),
            json!({"containers": [{"name": "c", "image": "c",
            "envFrom": [{"configMapRef": {"name": "env-cm"}}]}]}),
        ),
    )
    .await;
    eventually("a new Deployment is found", || {
        referencing(&lookups, CM, "team", "env-cm") == [(DEP, "late".into()), (STS, "envs".into())]
    })
    .await;

    // Updated: the StatefulSet stops referencing env-cm, starts referencing
    // new-cm, and names Secret shared in a reload annotation instead.
    patch::<StatefulSet>(
        &client,
        "team",
        "envs",
        json!({"metadata": {"annotations": {"secret.reloader.stakater.com/reload": "shared"}},
        "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "app", "env": [
            {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "new-cm", "key": "k"}}}
        ]}]}}}}),
    )
    .await;
    eventually("an update moves the references", || {
        referencing(&lookups, CM, "team", "env-cm") == [(DEP, "late".into())]
            && referencing(&lookups, CM, "team", "new-cm") == [(STS, "envs".into())]
            && referencing(&lookups, SEC, "team", "shared")
                == [
                    (DEP, "vols".into()),
                    (DS, "init".into()),
                    (STS, "envs".into()),
                ]
    })
    .await;
    let envs = lookups.workload(&wref(STS, "team", "envs")).unwrap();
    assert_eq!(
        envs.annotations["secret.reloader.stakater.com/reload"],
        "shared"
    );
    assert_eq!(refs(&envs), [(CM, "new-cm")], "named, not referenced");

    // Deleted.
    delete::<DaemonSet>(&client, "team", "init").await;
    delete::<Deployment>(&client, "default", "vols").await;
    eventually("deleted workloads leave the cache", || {
        referencing(&lookups, CM, "team", "init-cm").is_empty()
            && referencing(&lookups, CM, "default", "vol-cm").is_empty()
            && lookups.workload(&wref(DS, "team", "init")).is_none()
    })
    .await;
    assert_eq!(
        referencing(&lookups, SEC, "team", "shared"),
        [(DEP, "vols".into()), (STS, "envs".into())]
    );
    assert_eq!(lookups.stats().workloads, 3);
    drop(server);
}

// ---- other kinds, uses, named reloads -----------------------------------

fn rollouts(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Rollout");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn cronjob_kind() -> WorkloadKind {
    WorkloadKind::from_gvk("batch", "v1", "CronJob")
}

fn job_kind() -> WorkloadKind {
    WorkloadKind::from_gvk("batch", "v1", "Job")
}

fn rollout_kind() -> WorkloadKind {
    WorkloadKind::from_gvk("argoproj.io", "v1alpha1", "Rollout")
}

/// The uses of object `kind`/`name` by `w`, written `env:key`, `env-from`,
/// `volume`, `volume:key`; `None` when `w` does not reference it.
fn uses_of(w: &WorkloadInfo, kind: ObjectKind, name: &str) -> Option<Vec<String>> {
    let r = w.reference(kind, name)?;
    Some(
        r.uses
            .iter()
            .map(|ObjectUse { via, key }| {
                let via = match via {
                    UseVia::Env => "env",
                    UseVia::EnvFrom => "env-from",
                    UseVia::Volume => "volume",
                };
                match key {
                    Some(k) => format!("{via}:{k}"),
                    None => via.to_string(),
                }
            })
            .collect(),
    )
}

/// CronJobs (at their job template), Jobs and Argo Rollouts are looked up
/// like the apps/v1 kinds, each reference with its uses (env keys, volume
/// and projected `items` keys, whole-object uses); workloads a reload
/// annotation names come after the referencing ones, without a reference.
#[tokio::test]
async fn cronjobs_jobs_and_rollouts_are_found_with_their_uses_and_named_workloads_too() {
    let (server, client) = server().await;
    namespace(&client, "batch").await;
    create::<CronJob>(
        &client,
        "batch",
        json!({
            "metadata": {"name": "nightly", "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": {
                "metadata": {"annotations": {"t": "cron"}},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "volumes": [{"name": "cfg", "configMap": {"name": "cfg",
                        "items": [{"key": "b.yaml", "path": "b"}, {"key": "a.yaml", "path": "a"}]}}],
                    "containers": [{"name": "run", "image": "run", "env": [
                        {"name": "L", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "level"}}}
                    ]}]
                }
            }}}}
        }),
    )
    .await;
    create::<Job>(
        &client,
        "batch",
        json!({
            "metadata": {"name": "once"},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "volumes": [{"name": "p", "projected": {"sources": [
                    {"secret": {"name": "creds", "items": [
                        {"key": "user", "path": "u"}, {"key": "pass", "path": "p"}]}},
                    {"configMap": {"name": "cfg"}}
                ]}}],
                "containers": [{"name": "run", "image": "run",
                    "envFrom": [{"configMapRef": {"name": "cfg"}}]}]
            }}}
        }),
    )
    .await;
    let rollout: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "canary", "labels": {"app": "canary"}},
        "spec": {
            "selector": {"matchLabels": {"app": "canary"}},
            "strategy": {"canary": {"steps": [{"setWeight": 20}]}},
            "template": {
                "metadata": {"labels": {"app": "canary"}},
                "spec": {
                    "volumes": [{"name": "creds", "secret": {"secretName": "creds"}}],
                    "containers": [{"name": "app", "image": "app", "env": [
                        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}
                    ]}]
                }
            }
        }
    }))
    .unwrap();
    rollouts(&client, "batch")
        .create(&PostParams::default(), &rollout)
        .await
        .unwrap();
    // Named in a reload annotation (the workload's; the pod template's),
    // not referenced.
    create::<Deployment>(
        &client,
        "batch",
        workload(
            "named",
            json!({"configmap.reloader.stakater.com/reload": "other, cfg"}),
            json!({}),
            json!({"containers": [{"name": "app", "image": "app"}]}),
        ),
    )
    .await;
    create::<StatefulSet>(
        &client,
        "batch",
        workload(
            "pattern",
            json!({}),
            json!({"wasmwatch.io/reload-configmaps": "c.g"}),
            json!({"containers": [{"name": "app", "image": "app"}]}),
        ),
    )
    .await;

    let lookups = KubeLookups::start(client.clone(), None);
    ready(&lookups).await;

    let cfg = lookups.workloads_referencing(CM, "batch", "cfg");
    assert_eq!(
        names(&cfg),
        [
            (cronjob_kind(), "nightly"),
            (job_kind(), "once"),
            (DEP, "named"),
            (STS, "pattern")
        ]
    );
    let nightly = &cfg[0];
    assert_eq!(
        uses_of(nightly, CM, "cfg").unwrap(),
        ["env:level", "volume:a.yaml", "volume:b.yaml"]
    );
    assert_eq!(nightly.template_annotations["t"], "cron");
    assert_eq!(nightly.annotations["reloader.stakater.com/auto"], "true");
    assert_eq!(uses_of(&cfg[1], CM, "cfg").unwrap(), ["env-from", "volume"]);
    for named in &cfg[2..] {
        assert_eq!(uses_of(named, CM, "cfg"), None, "{:?}", named.workload);
        assert!(named.references.is_empty());
    }

    let creds = lookups.workloads_referencing(SEC, "batch", "creds");
    assert_eq!(
        names(&creds),
        [(job_kind(), "once"), (rollout_kind(), "canary")]
    );
    assert_eq!(
        uses_of(&creds[0], SEC, "creds").unwrap(),
        ["volume:pass", "volume:user"]
    );
    assert_eq!(
        uses_of(&creds[1], SEC, "creds").unwrap(),
        ["env:token", "volume"]
    );
    assert_eq!(creds[1].labels["app"], "canary");
    assert_eq!(
        lookups
            .workload(&wref(rollout_kind(), "batch", "canary"))
            .as_ref(),
        Some(&creds[1])
    );
    // A named reload of the other kind does not count.
    assert!(referencing(&lookups, SEC, "batch", "cfg").is_empty());

    // Changes follow: the Rollout (a merge patch: a custom resource) moves
    // to another Secret; the Job goes; the CronJob's job template drops
    // one item.
    rollouts(&client, "batch")
        .patch(
            "canary",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {
                "volumes": [{"name": "creds", "secret": {"secretName": "creds-2",
                    "items": [{"key": "token", "path": "t"}]}}],
                "containers": [{"name": "app", "image": "app"}]
            }}}})),
        )
        .await
        .unwrap();
    delete::<Job>(&client, "batch", "once").await;
    patch::<CronJob>(
        &client,
        "batch",
        "nightly",
        json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {
            "volumes": [{"name": "cfg", "configMap": {"name": "cfg",
                "items": [{"key": "a.yaml", "path": "a"}]}}]
        }}}}}}),
    )
    .await;
    eventually("the changes reach the cache", || {
        let creds2 = lookups.workloads_referencing(SEC, "batch", "creds-2");
        let cfg = lookups.workloads_referencing(CM, "batch", "cfg");
        referencing(&lookups, SEC, "batch", "creds").is_empty()
            && creds2.len() == 1
            && uses_of(&creds2[0], SEC, "creds-2") == Some(vec!["volume:token".into()])
            && names(&cfg)
                == [
                    (cronjob_kind(), "nightly"),
                    (DEP, "named"),
                    (STS, "pattern"),
                ]
            && uses_of(&cfg[0], CM, "cfg") == Some(vec!["env:level".into(), "volume:a.yaml".into()])
    })
    .await;

    // The annotation goes: so does the named workload.
    patch::<Deployment>(
        &client,
        "batch",
        "named",
        json!({"metadata": {"annotations": {"configmap.reloader.stakater.com/reload": null}}}),
    )
    .await;
    eventually("a workload no longer named is not returned", || {
        referencing(&lookups, CM, "batch", "cfg")
            == [(cronjob_kind(), "nightly".into()), (STS, "pattern".into())]
    })
    .await;
    drop(server);
}

/// A custom kind the API server does not serve (another group, or a
/// served group without that resource) is skipped after one discovery
/// request, never listed or watched; the lookups are ready and answer as
/// usual.
#[tokio::test]
async fn custom_kinds_the_api_server_does_not_serve_are_skipped() {
    let (server, client) = server().await;
    create::<Deployment>(
        &client,
        "default",
        workload("w", json!({}), json!({}), env_pod()),
    )
    .await;
    let widget = CustomKind {
        group: "example.com".into(),
        version: "v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let analysis = CustomKind {
        group: "argoproj.io".into(),
        version: "v1alpha1".into(),
        kind: "AnalysisRun".into(),
        plural: "analysisruns".into(),
    };
    server.clear_requests();
    let lookups =
        KubeLookups::start_with_custom(client.clone(), None, None, vec![widget, analysis]);
    ready(&lookups).await;
    assert_eq!(
        referencing(&lookups, CM, "default", "env-cm"),
        [(DEP, "w".into())]
    );
    // The seven kinds of k8s-openapi, nothing else.
    server.wait_for_watches(7).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.open_watches(), 7);
    let discovery: Vec<(String, u16)> = server
        .non_resource_requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/apis/"))
        .map(|r| (r.path, r.code))
        .collect();
    assert!(
        discovery.contains(&("/apis/example.com/v1".into(), 404)),
        "{discovery:?}"
    );
    assert!(
        discovery.contains(&("/apis/argoproj.io/v1alpha1".into(), 200)),
        "{discovery:?}"
    );
    let custom: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.group == "example.com" || r.group == "argoproj.io")
        .collect();
    assert!(custom.is_empty(), "{custom:?}");
    drop(server);
}

/// Argo Rollouts' CRD as `kubectl apply` would send it.
fn rollout_crd() -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "rollouts.argoproj.io"},
        "spec": {
            "group": "argoproj.io",
            "names": {"plural": "rollouts", "singular": "rollout", "kind": "Rollout",
                "listKind": "RolloutList", "shortNames": ["ro"]},
            "scope": "Namespaced",
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap()
}

fn crds(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// Discovery is followed while running: Argo Rollouts' CRD installed after
/// the lookups started is watched within the discovery interval, and its
/// Rollouts are looked up; the CRD deleted, its Rollouts are dropped and
/// nothing asks for the kind again but discovery (no watch retried on 404
/// for ever); installed again, it is followed again.
#[tokio::test]
async fn a_custom_kind_installed_or_removed_while_running_is_followed() {
    let server = Server::start(Config::default().preinstalled_crds(false))
        .await
        .unwrap();
    let client = server.client().unwrap();
    create::<Deployment>(
        &client,
        "default",
        workload("w", json!({}), json!({}), env_pod()),
    )
    .await;
    let lookups = KubeLookups::start_following(
        client.clone(),
        None,
        None,
        vec![CustomKind::rollout()],
        Duration::from_millis(300),
    );
    ready(&lookups).await;
    server.wait_for_watches(7).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.open_watches(), 7, "Rollouts are not served yet");

    let rollout = || -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "canary"},
            "spec": {"template": {"spec": env_pod()}}
        }))
        .unwrap()
    };
    for round in 0..2 {
        crds(&client)
            .create(&PostParams::default(), &rollout_crd())
            .await
            .unwrap();
        rollouts(&client, "default")
            .create(&PostParams::default(), &rollout())
            .await
            .unwrap();
        eventually(&format!("round {round}: the Rollout is looked up"), || {
            referencing(&lookups, CM, "default", "env-cm")
                == [(DEP, "w".into()), (rollout_kind(), "canary".into())]
        })
        .await;

        crds(&client)
            .delete("rollouts.argoproj.io", &DeleteParams::default())
            .await
            .unwrap();
        eventually(&format!("round {round}: the Rollout is dropped"), || {
            referencing(&lookups, CM, "default", "env-cm") == [(DEP, "w".into())]
        })
        .await;
        // Settled: nothing but discovery asks about Rollouts any more.
        tokio::time::sleep(Duration::from_millis(500)).await;
        server.clear_requests();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let asked: Vec<_> = server
            .requests()
            .into_iter()
            .filter(|r| r.group == "argoproj.io")
            .collect();
        assert!(asked.is_empty(), "round {round}: {asked:?}");
        let discovery = server
            .non_resource_requests()
            .into_iter()
            .filter(|r| r.path == "/apis/argoproj.io/v1alpha1")
            .count();
        assert!(
            (2..=12).contains(&discovery),
            "round {round}: discovery read {discovery} times in 2 s at 300 ms"
        );
        assert_eq!(server.open_watches(), 7);
    }
    drop(server);
}

// ---- services ------------------------------------------------------------

fn service(name: &str, labels: Value, annotations: Value) -> Value {
    json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"selector": {"app": name}, "ports": [
            {"name": "http", "port": 80, "targetPort": 8080},
            {"port": 9090}
        ]}
    })
}

fn slice(name: &str, svc: &str, ports: Value, endpoints: Value) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints
    })
}

fn pod_endpoint(ip: &str, pod: &str, ready: Option<bool>) -> Value {
    let mut e = json!({"addresses": [ip], "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"}});
    if let Some(ready) = ready {
        e["conditions"] = json!({"ready": ready});
    }
    e
}

fn endpoints(ready: &[Endpoint]) -> Vec<(&str, Option<&str>, Vec<u16>)> {
    ready
        .iter()
        .map(|e| {
            (
                e.address.as_str(),
                e.pod.as_deref(),
                e.ports.iter().map(|p| p.port).collect(),
            )
        })
        .collect()
}

/// The Service's ready addresses; `None` if the Service does not exist.
fn addresses(l: &KubeLookups, ns: &str, name: &str) -> Option<Vec<String>> {
    l.service(ns, name).map(|_| {
        l.ready_endpoints(ns, name)
            .into_iter()
            .map(|e| e.address)
            .collect()
    })
}

#[tokio::test]
async fn services_have_their_ready_endpoints_from_every_slice() {
    let (server, client) = server().await;
    let actuator = json!({"boot.spring.io/actuator": "http://:9090/manage"});
    create::<Service>(
        &client,
        "default",
        service("orders", json!({"app": "orders", "tier": "web"}), actuator),
    )
    .await;
    create::<Service>(
        &client,
        "default",
        service(
            "billing",
            json!({"app": "billing", "tier": "web"}),
            json!({}),
        ),
    )
    .await;
    let http = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    create::<EndpointSlice>(
        &client,
        "default",
        slice(
            "orders-a",
            "orders",
            http.clone(),
            json!([
                pod_endpoint("10.0.0.1", "orders-1", Some(true)),
                pod_endpoint("10.0.0.2", "orders-2", Some(false)),
                pod_endpoint("10.0.0.3", "orders-3", None),
            ]),
        ),
    )
    .await;
    create::<EndpointSlice>(
        &client,
        "default",
        slice(
            "orders-b",
            "orders",
            json!([{"name": "mgmt", "port": 9090}]),
            json!([
                {"addresses": ["10.0.1.1"], "conditions": {"ready": true, "serving": true}},
            ]),
        ),
    )
    .await;

    let lookups = KubeLookups::start(client.clone(), None);
    ready(&lookups).await;

    let orders = lookups.service("default", "orders").unwrap();
    assert_eq!(
        (orders.namespace.as_str(), orders.name.as_str()),
        ("default", "orders")
    );
    assert_eq!(
        orders.annotations["boot.spring.io/actuator"],
        "http://:9090/manage"
    );
    assert_eq!(orders.labels["tier"], "web");
    assert_eq!(
        orders.ports,
        [
            ServicePort {
                name: Some("http".into()),
                port: 80
            },
            ServicePort {
                name: None,
                port: 9090
            },
        ]
    );
    let ready = lookups.ready_endpoints("default", "orders");
    assert_eq!(
        endpoints(&ready),
        [
            ("10.0.0.1", Some("orders-1"), vec![8080]),
            ("10.0.0.3", Some("orders-3"), vec![8080]),
            ("10.0.1.1", None, vec![9090]),
        ],
        "not-ready 10.0.0.2 excluded, nil ready counts as ready, slices merged"
    );
    assert_eq!(ready[0].ports[0].name.as_deref(), Some("http"));
    assert!(lookups.service("default", "billing").is_some());
    assert!(lookups.ready_endpoints("default", "billing").is_empty());
    assert!(lookups.ready_endpoints("default", "nothing").is_empty());
    assert!(lookups.service("default", "nothing").is_none());
    assert!(lookups.service("kube-system", "orders").is_none());

    let web = BTreeMap::from([("tier".to_string(), "web".to_string())]);
    let found: Vec<String> = lookups
        .services_with_labels("default", &web)
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(found, ["billing", "orders"]);
    let both = BTreeMap::from([
        ("tier".to_string(), "web".to_string()),
        ("app".to_string(), "orders".to_string()),
    ]);
    let found = lookups.services_with_labels("default", &both);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0], orders, "the same answer as service()");
    let wrong = BTreeMap::from([("tier".to_string(), "db".to_string())]);
    assert!(lookups.services_with_labels("default", &wrong).is_empty());
    assert!(lookups.services_with_labels("other", &web).is_empty());

    // 10.0.0.1 becomes not ready, 10.0.0.2 ready.
    patch::<EndpointSlice>(
        &client,
        "default",
        "orders-a",
        json!({"endpoints": [
            pod_endpoint("10.0.0.1", "orders-1", Some(false)),
            pod_endpoint("10.0.0.2", "orders-2", Some(true)),
            pod_endpoint("10.0.0.3", "orders-3", None),
        ]}),
    )
    .await;
    eventually("readiness changes are followed", || {
        addresses(&lookups, "default", "orders").unwrap() == ["10.0.0.2", "10.0.0.3", "10.0.1.1"]
    })
    .await;

    // A slice for billing appears; a Service's labels and annotations change.
    create::<EndpointSlice>(
        &client,
        "default",
        slice(
            "billing-x",
            "billing",
            http,
            json!([pod_endpoint("10.0.2.1", "billing-1", None)]),
        ),
    )
    .await;
    patch::<Service>(
        &client,
        "default",
        "billing",
        json!({"metadata": {"labels": {"tier": "api"}, "annotations": {"boot.spring.io/actuator": "http://:1/a"}}}),
    )
    .await;
    eventually("new slices and Service updates are followed", || {
        let b = lookups.service("default", "billing").unwrap();
        addresses(&lookups, "default", "billing").unwrap() == ["10.0.2.1"]
            && b.labels["tier"] == "api"
            && b.annotations.contains_key("boot.spring.io/actuator")
            && lookups.services_with_labels("default", &web).len() == 1
    })
    .await;

    // Deleting a slice removes its endpoints; deleting a Service removes it.
    delete::<EndpointSlice>(&client, "default", "orders-b").await;
    eventually("a deleted slice's endpoints are gone", || {
        addresses(&lookups, "default", "orders").unwrap() == ["10.0.0.2", "10.0.0.3"]
    })
    .await;
    delete::<Service>(&client, "default", "orders").await;
    eventually("a deleted Service is gone", || {
        lookups.service("default", "orders").is_none()
    })
    .await;
    assert!(lookups.services_with_labels("default", &web).is_empty());
    drop(server);
}

// ---- namespaces and errors -----------------------------------------------

#[tokio::test]
async fn only_the_given_namespaces_are_watched() {
    let (server, client) = server().await;
    for ns in ["a", "b", "c"] {
        namespace(&client, ns).await;
        create::<Deployment>(&client, ns, workload("w", json!({}), json!({}), env_pod())).await;
        create::<Service>(&client, ns, service("s", json!({"x": "y"}), json!({}))).await;
    }
    let lookups = KubeLookups::start(
        client.clone(),
        Some(vec!["a".into(), "b".into(), "a".into()]),
    );
    ready(&lookups).await;
    // 2 namespaces × 8 kinds (Deployments, StatefulSets, DaemonSets,
    // CronJobs, Jobs, Rollouts, Services, EndpointSlices), the duplicate "a"
    // watched once.
    server.wait_for_watches(16).await;
    assert_eq!(server.open_watches(), 16);
    for ns in ["a", "b"] {
        assert_eq!(referencing(&lookups, CM, ns, "env-cm"), [(DEP, "w".into())]);
        assert!(lookups.service(ns, "s").is_some());
    }
    assert!(referencing(&lookups, CM, "c", "env-cm").is_empty());
    assert!(lookups.service("c", "s").is_none());
    let xy = BTreeMap::from([("x".to_string(), "y".to_string())]);
    assert!(lookups.services_with_labels("c", &xy).is_empty());

    // Later objects in an unwatched namespace stay unknown.
    create::<Deployment>(
        &client,
        "c",
        workload("w2", json!({}), json!({}), env_pod()),
    )
    .await;
    create::<Deployment>(
        &client,
        "b",
        workload("w2", json!({}), json!({}), env_pod()),
    )
    .await;
    eventually("a watched namespace gets the new Deployment", || {
        referencing(&lookups, CM, "b", "env-cm").len() == 2
    })
    .await;
    assert!(lookups.workload(&wref(DEP, "c", "w2")).is_none());
    assert_eq!(lookups.stats().namespaces, 2);

    // No namespaces: nothing to list, ready at once.
    let none = KubeLookups::start(client.clone(), Some(vec![]));
    ready(&none).await;
    drop(server);
}

/// `watch.ignoreNamespaces`: the API server leaves those namespaces'
/// objects out of every cache's list and watch (a field selector).
#[tokio::test]
async fn ignored_namespaces_are_left_out_by_the_api_server() {
    let (server, client) = server().await;
    for ns in ["a", "legacy"] {
        namespace(&client, ns).await;
        create::<Deployment>(&client, ns, workload("w", json!({}), json!({}), env_pod())).await;
        create::<Service>(&client, ns, service("s", json!({"x": "y"}), json!({}))).await;
    }
    let lookups = KubeLookups::start_with(
        client.clone(),
        None,
        Some("metadata.namespace!=legacy,metadata.namespace!=other".into()),
    );
    ready(&lookups).await;
    assert_eq!(
        referencing(&lookups, CM, "a", "env-cm"),
        [(DEP, "w".into())]
    );
    assert!(referencing(&lookups, CM, "legacy", "env-cm").is_empty());
    assert!(lookups.service("legacy", "s").is_none());
    for ns in ["a", "legacy"] {
        create::<Deployment>(&client, ns, workload("w2", json!({}), json!({}), env_pod())).await;
    }
    eventually("a's new Deployment", || {
        referencing(&lookups, CM, "a", "env-cm").len() == 2
    })
    .await;
    assert!(lookups.workload(&wref(DEP, "legacy", "w2")).is_none());
    assert_eq!(lookups.stats().namespaces, 1);
    drop(server);
}

#[tokio::test]
async fn the_caches_heal_after_failures_and_expired_history() {
    let (server, client) = server().await;
    for name in ["keep", "gone"] {
        create::<Deployment>(
            &client,
            "default",
            workload(name, json!({}), json!({}), env_pod()),
        )
        .await;
    }
    let faults = server.faults().clone();
    // The first lists fail: the watches retry with backoff.
    faults.fail_next(8, Failure::Internal);
    let lookups = KubeLookups::start(client.clone(), None);
    ready(&lookups).await;
    assert_eq!(referencing(&lookups, CM, "default", "env-cm").len(), 2);
    server.wait_for_watches(8).await;

    // Watches end, their history is gone (a resume gets 410: relist) and
    // their re-watch requests (the only traffic now) fail, so they back off;
    // meanwhile "gone" is deleted. Typically only the relist's sweep can
    // tell (if a watch wins the race, it sees the delete as an event: the
    // sweep itself is unit-tested in the lib).
    faults.compact_history();
    faults.fail_next(8, Failure::Internal);
    faults.close_watches();
    eventually("the watches are closed", || server.open_watches() == 0).await;
    let api: Api<Deployment> = Api::default_namespaced(client.clone());
    let mut attempts = 0;
    // Failures the watches did not consume fail our delete: retry.
    while let Err(e) = api.delete("gone", &DeleteParams::default()).await {
        attempts += 1;
        assert!(attempts <= 5, "delete kept failing: {e}");
    }
    create::<Deployment>(
        &client,
        "default",
        workload("new", json!({}), json!({}), env_pod()),
    )
    .await;
    eventually(
        "the relist removed the missed delete and added the new one",
        || {
            referencing(&lookups, CM, "default", "env-cm")
                == [(DEP, "keep".to_string()), (DEP, "new".to_string())]
        },
    )
    .await;

    // The API server goes away for a while and comes back.
    faults.refuse_connections(Duration::from_millis(500)).await;
    let change = json!({"spec": {"template": {"spec": {"containers": [{"name": "app",
        "image": "app", "envFrom": [{"secretRef": {"name": "after-outage"}}]}]}}}});
    let deadline = Instant::now() + Duration::from_secs(10);
    // Refused until the server is back.
    while let Err(e) = api
        .patch("keep", &PatchParams::default(), &Patch::Merge(&change))
        .await
    {
        assert!(Instant::now() < deadline, "server not back: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eventually("changes after an outage arrive", || {
        referencing(&lookups, SEC, "default", "after-outage") == [(DEP, "keep".to_string())]
    })
    .await;
    drop(server);
}

#[tokio::test]
async fn dropping_the_lookups_ends_its_watches() {
    let (server, client) = server().await;
    let lookups = KubeLookups::start(client, None);
    ready(&lookups).await;
    server.wait_for_watches(8).await;
    drop(lookups);
    let mut count = server.watch_count();
    tokio::time::timeout(Duration::from_secs(10), count.wait_for(|n| *n == 0))
        .await
        .expect("watches closed")
        .unwrap();
}

// ---- memory --------------------------------------------------------------

/// Counts the bytes allocated (minus freed) on threads that opted in, so a
/// measurement is not disturbed by tests running on other threads.
struct Counting;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static NET: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    let _ = TRACKING.try_with(|t| {
        if t.get() {
            let _ = NET.try_with(|n| n.set(n.get() + delta));
        }
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// bookkeeping only touches const-initialised thread-locals without
// destructors (no allocation, no re-entrance).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Net heap bytes `f` leaves allocated (on this thread).
fn net_allocated<T>(f: impl FnOnce() -> T) -> (T, isize) {
    NET.with(|n| n.set(0));
    TRACKING.with(|t| t.set(true));
    let out = f();
    TRACKING.with(|t| t.set(false));
    (out, NET.with(Cell::get))
}

/// A realistic Deployment: 3 labels, 2 annotations plus a 2 KiB
/// last-applied-configuration, 2 template annotations, 2 containers with env,
/// envFrom, volumes, probes and resources; 3 references.
fn realistic_deployment(i: usize) -> Value {
    let name = format!("orders-service-{i:04}");
    let mut obj = workload(
        &name,
        json!({
            "reloader.stakater.com/auto": "true",
            "deployment.kubernetes.io/revision": "7",
            "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(2048),
        }),
        json!({"prometheus.io/scrape": "true", "prometheus.io/port": "9090"}),
        json!({
            "volumes": [{"name": "config", "configMap": {"name": format!("{name}-config")}}],
            "containers": [{
                "name": "app", "image": "registry.example.com/orders:1.2.3",
                "ports": [{"containerPort": 8080, "name": "http"}],
                "env": [
                    {"name": "JAVA_OPTS", "value": "-Xmx512m"},
                    {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "orders-db", "key": "password"}}}
                ],
                "envFrom": [{"secretRef": {"name": format!("{name}-secrets")}}],
                "volumeMounts": [{"name": "config", "mountPath": "/config"}],
                "readinessProbe": {"httpGet": {"path": "/actuator/health", "port": 8080}},
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}
            }, {
                "name": "sidecar", "image": "registry.example.com/proxy:2.0",
                "args": ["--port", "9090"]
            }]
        }),
    );
    obj["metadata"]["namespace"] = json!("default");
    obj["metadata"]["labels"]["team"] = json!("payments");
    obj["metadata"]["labels"]["version"] = json!("1.2.3");
    obj
}

#[test]
fn memory_of_the_workload_cache_for_2000_deployments() {
    const N: usize = 2000;
    let objects: Vec<Deployment> = (0..N)
        .map(|i| serde_json::from_value(realistic_deployment(i)).unwrap())
        .collect();
    let json_bytes: usize = objects
        .iter()
        .map(|d| serde_json::to_vec(d).unwrap().len())
        .sum();

    // Our cache: parse (done above), apply, keep only the compact form.
    let (cache, cache_bytes) = net_allocated(|| {
        let mut cache = Cache::default();
        for d in &objects {
            cache.apply(d);
        }
        cache
    });
    assert_eq!(cache.stats().workloads, N);
    let w = cache
        .workload(&wref(DEP, "default", "orders-service-0042"))
        .unwrap();
    assert_eq!(w.references.len(), 3);
    assert!(
        !w.annotations
            .contains_key("kubectl.kubernetes.io/last-applied-configuration")
    );

    // For comparison: a cache of whole objects (what a reflector Store keeps).
    let (whole, whole_bytes) = net_allocated(|| objects.to_vec());
    println!(
        "{N} Deployments: compact cache {} KiB ({} bytes/entry); whole typed objects {} KiB ({} bytes/entry); JSON {} KiB",
        cache_bytes / 1024,
        cache_bytes / N as isize,
        whole_bytes / 1024,
        whole_bytes / N as isize,
        json_bytes / 1024,
    );
    drop(whole);
    // Measured: about 1,040 bytes per entry (the strings themselves, the
    // reference index and map nodes). A bound so it cannot regress by multiples.
    assert!(
        cache_bytes / (N as isize) < 1536,
        "{} bytes per Deployment",
        cache_bytes / N as isize
    );
}

#[tokio::test]
async fn ready_after_listing_2000_deployments() {
    const N: usize = 2000;
    let (server, client) = server().await;
    let api: Api<Deployment> = Api::default_namespaced(client.clone());
    let started = Instant::now();
    // A few writers in parallel.
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let api = api.clone();
            tokio::spawn(async move {
                for i in (w..N).step_by(4) {
                    let d: Deployment = serde_json::from_value(realistic_deployment(i)).unwrap();
                    api.create(&PostParams::default(), &d).await.unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let created = started.elapsed();
    let started = Instant::now();
    let lookups = KubeLookups::start(client, None);
    ready(&lookups).await;
    println!(
        "created {N} Deployments in {created:?}; lookups ready in {:?}",
        started.elapsed()
    );
    assert_eq!(lookups.stats().workloads, N);
    assert_eq!(
        referencing(&lookups, SEC, "default", "orders-db").len(),
        N,
        "every Deployment references the shared Secret"
    );
    assert_eq!(
        referencing(&lookups, CM, "default", "orders-service-1999-config"),
        [(DEP, "orders-service-1999".to_string())]
    );
    drop(server);
}
