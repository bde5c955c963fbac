//! The Kubernetes executor against the in-memory API server over real HTTP:
//! rollout restarts recorded on the workloads, failure classes, Events (read
//! back with kube and with kubectl).
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::{Value, json};
use wasmwatch_apiserver::{Config, Failure, Server, ServerHandle};
use wasmwatch_core::ObjectKind;
use wasmwatch_core::action::{EventType, RestartStrategy, WorkloadKind, WorkloadRef};
use wasmwatch_exec::recorder::{DEFAULT_CAPACITY, DEFAULT_CONCURRENCY, EventRecorder};
use wasmwatch_exec::workload::{
    Content, KubeExecutor, RESTARTED_AT_ANNOTATION, RestartOutcome, hash_annotation_key,
};
use wasmwatch_exec::{ExecError, Origin};

const NS: &str = "shop";

async fn start() -> (ServerHandle, Client) {
    start_with(Config::default()).await
}

async fn start_with(config: Config) -> (ServerHandle, Client) {
    let server = Server::start(config).await.expect("server starts");
    let client = server.client().expect("client");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    (server, client)
}

fn executor(client: &Client) -> KubeExecutor {
    KubeExecutor::new(client.clone(), "wasmwatch", "wasmwatch-7d9f-abcde")
}

fn workload(kind: WorkloadKind, name: &str) -> WorkloadRef {
    WorkloadRef {
        kind,
        namespace: NS.into(),
        name: name.into(),
    }
}

fn plural(kind: &WorkloadKind) -> &'static str {
    match kind {
        WorkloadKind::Deployment => "deployments",
        WorkloadKind::StatefulSet => "statefulsets",
        WorkloadKind::DaemonSet => "daemonsets",
        WorkloadKind::Other(_) => unreachable!("apps/v1 workloads only"),
    }
}

/// Creates a minimal workload of `kind` and returns its JSON.
async fn create(client: &Client, w: &WorkloadRef) -> Value {
    let kind = format!("{:?}", w.kind);
    let mut spec = json!({
        "selector": {"matchLabels": {"app": w.name}},
        "template": {
            "metadata": {"labels": {"app": w.name}, "annotations": {"team": "shop"}},
            "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
        },
    });
    if w.kind != WorkloadKind::DaemonSet {
        spec["replicas"] = json!(2);
    }
    if w.kind == WorkloadKind::StatefulSet {
        spec["serviceName"] = json!(w.name);
    }
    let obj = json!({
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": w.name, "namespace": w.namespace},
        "spec": spec,
    });
    let pp = PostParams::default();
    let created = match w.kind {
        WorkloadKind::Deployment => serde_json::to_value(
            Api::<Deployment>::namespaced(client.clone(), NS)
                .create(&pp, &serde_json::from_value(obj).unwrap())
                .await
                .unwrap(),
        ),
        WorkloadKind::StatefulSet => serde_json::to_value(
            Api::<StatefulSet>::namespaced(client.clone(), NS)
                .create(&pp, &serde_json::from_value(obj).unwrap())
                .await
                .unwrap(),
        ),
        WorkloadKind::DaemonSet => serde_json::to_value(
            Api::<DaemonSet>::namespaced(client.clone(), NS)
                .create(&pp, &serde_json::from_value(obj).unwrap())
                .await
                .unwrap(),
        ),
        WorkloadKind::Other(_) => unreachable!("apps/v1 workloads only"),
    };
    created.unwrap()
}

/// The workload as stored now.
fn stored(server: &ServerHandle, w: &WorkloadRef) -> Value {
    server
        .get(&format!("{}.apps", plural(&w.kind)), &w.namespace, &w.name)
        .expect("workload exists")
}

fn template_annotation(obj: &Value, key: &str) -> Option<String> {
    obj.pointer("/spec/template/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn rv(obj: &Value) -> String {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

fn generation(obj: &Value) -> i64 {
    obj["metadata"]["generation"].as_i64().unwrap()
}

/// Restarted for h1, not again for h1, restarted for h2: the record lives
/// on the workload, the API server bumps its generation on each restart.
async fn restarts_once_per_content(server: &ServerHandle, exec: &KubeExecutor, w: &WorkloadRef) {
    let h1 = format!("configmap/app-config:{}", "1".repeat(64));
    let h2 = format!("configmap/app-config:{}", "2".repeat(64));
    let key = hash_annotation_key(&h1);
    assert_eq!(key, "config-hash.wasmwatch.io/configmap.app-config");
    let before = stored(server, w);
    assert_eq!(generation(&before), 1);

    let started = Timestamp::now();
    let outcome = exec
        .restart(w, &h1, "ConfigMap shop/app-config changed")
        .await;
    assert_eq!(outcome, Ok(RestartOutcome::Restarted), "{w:?}");
    let after1 = stored(server, w);
    assert_eq!(
        template_annotation(&after1, &key).as_deref(),
        Some(h1.as_str())
    );
    assert_eq!(generation(&after1), 2, "a template change is a spec change");
    let restarted_at = template_annotation(&after1, RESTARTED_AT_ANNOTATION).expect("restartedAt");
    let at: Timestamp = restarted_at.parse().expect("RFC 3339");
    assert!(
        at.as_second() >= started.as_second() && at.as_second() <= Timestamp::now().as_second(),
        "{restarted_at}"
    );
    assert_eq!(
        template_annotation(&after1, "team").as_deref(),
        Some("shop"),
        "other annotations are kept"
    );

    let outcome = exec.restart(w, &h1, "resync").await;
    assert_eq!(outcome, Ok(RestartOutcome::AlreadyAtContent));
    let again = stored(server, w);
    assert_eq!(rv(&again), rv(&after1), "nothing written");
    assert_eq!(generation(&again), 2);

    // Another executor (another replica, after a failover) agrees.
    let other = KubeExecutor::new(server.client().unwrap(), "wasmwatch", "other-replica");
    assert_eq!(
        other.restart(w, &h1, "redelivered").await,
        Ok(RestartOutcome::AlreadyAtContent)
    );

    let outcome = exec.restart(w, &h2, "changed again").await;
    assert_eq!(outcome, Ok(RestartOutcome::Restarted));
    let after2 = stored(server, w);
    assert_eq!(
        template_annotation(&after2, &key).as_deref(),
        Some(h2.as_str())
    );
    assert_eq!(generation(&after2), 3);
    // Content changing back restarts again.
    assert_eq!(
        exec.restart(w, &h1, "back").await,
        Ok(RestartOutcome::Restarted)
    );
    assert_eq!(generation(&stored(server, w)), 4);
}

#[tokio::test]
async fn deployment_restarts_once_per_content() {
    let (server, client) = start().await;
    let w = workload(WorkloadKind::Deployment, "web");
    create(&client, &w).await;
    restarts_once_per_content(&server, &executor(&client), &w).await;
}

/// Issue 20: several contents in one restart are one patch (one rollout),
/// and only what the template does not record yet is written; a template
/// recording the plain digest older versions wrote counts as the content.
#[tokio::test]
async fn one_restart_for_several_contents_is_one_patch() {
    let (server, client) = start().await;
    let w = workload(WorkloadKind::Deployment, "web");
    create(&client, &w).await;
    let exec = executor(&client);
    let a1 = format!("configmap/a:{}", "1".repeat(64));
    let b1 = format!("secret/b:{}", "1".repeat(64));
    let b2 = format!("secret/b:{}", "2".repeat(64));
    let both = [(a1.as_str(), None), (b1.as_str(), None)];
    assert_eq!(
        exec.restart_for_all(&w, &both, "a; b").await,
        Ok(RestartOutcome::Restarted)
    );
    let after = stored(&server, &w);
    assert_eq!(generation(&after), 2, "one rollout for both");
    assert_eq!(
        template_annotation(&after, &hash_annotation_key(&a1)).as_deref(),
        Some(a1.as_str())
    );
    assert_eq!(
        template_annotation(&after, &hash_annotation_key(&b1)).as_deref(),
        Some(b1.as_str())
    );
    assert_eq!(
        exec.restart_for_all(&w, &both, "again").await,
        Ok(RestartOutcome::AlreadyAtContent)
    );
    // b's content is keyed now (b2); the template records its plain digest
    // (b1, as before keys): nothing to do for b, and a is recorded.
    let upgraded = [(a1.as_str(), None), (b2.as_str(), Some(b1.as_str()))];
    assert_eq!(
        exec.restart_for_all(&w, &upgraded, "upgrade").await,
        Ok(RestartOutcome::AlreadyAtContent)
    );
    assert_eq!(generation(&stored(&server, &w)), 2);
    assert_eq!(
        exec.restart_for_all(&w, &[(a1.as_str(), None), (b2.as_str(), None)], "b")
            .await,
        Ok(RestartOutcome::Restarted)
    );
    let last = stored(&server, &w);
    assert_eq!(generation(&last), 3);
    assert_eq!(
        template_annotation(&last, &hash_annotation_key(&b2)).as_deref(),
        Some(b2.as_str())
    );
}

/// Reloader's records of a content (issue 34 §3): `last-reloaded-from`
/// counts only when it names this object, in this namespace, with
/// Reloader's hash of this content; the `STAKATER_*` variable when it holds
/// that hash. With env-vars, a ConfigMap's variable gets Reloader's hash
/// (a switch back to Reloader restarts nothing), a Secret's keeps the
/// keyed digest (an unkeyed SHA-1 of secret values is not written on a pod
/// template; a switch back to Reloader restarts it once).
#[tokio::test]
async fn reloaders_records_of_the_content_count_only_for_that_object_and_hash() {
    let (server, client) = start().await;
    let exec = executor(&client);
    let sha = "a9252138a1296257fa1f4ceb32cc6af0e2dfe373";
    let hash = format!("configmap/orders:{}", "1".repeat(64));
    let content = |reloader| Content {
        hash: &hash,
        unkeyed: None,
        reloader,
    };
    let record = |name: &str, ns: &str, hash: &str| {
        json!(format!(
            r#"{{"type":"CONFIGMAP","name":"{name}","namespace":"{ns}","hash":"{hash}","containerRefs":["app"],"observedAt":1733155200}}"#
        ))
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    for (name, recorded, at_content) in [
        ("same", record("orders", NS, sha), true),
        ("other-object", record("billing", NS, sha), false),
        ("other-namespace", record("orders", "default", sha), false),
        ("other-hash", record("orders", NS, &"f".repeat(40)), false),
        ("not-json", json!("{oops"), false),
    ] {
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name},
                    "annotations": {"reloader.stakater.com/last-reloaded-from": recorded}},
                "spec": {"containers": [{"name": "app", "image": "example/app:1"}]}}}
        }))
        .unwrap();
        deployments
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
        let w = workload(WorkloadKind::Deployment, name);
        let written = exec
            .restart_contents(&w, &[content(Some(sha))], "r", RestartStrategy::Annotations)
            .await
            .unwrap();
        assert_eq!(written, [!at_content], "{name}");
        assert_eq!(
            generation(&stored(&server, &w)),
            1 + i64::from(!at_content),
            "{name}"
        );
    }
    // Without Reloader's hash (a plugin's own content hash), a record of
    // it proves nothing.
    let w = workload(WorkloadKind::Deployment, "same");
    assert_eq!(
        exec.restart_contents(&w, &[content(None)], "r", RestartStrategy::Annotations)
            .await
            .unwrap(),
        [true]
    );

    // env-vars: Reloader's value for a ConfigMap, the digest for a Secret.
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "env"},
        "spec": {"selector": {"matchLabels": {"app": "env"}}, "template": {
            "metadata": {"labels": {"app": "env"}},
            "spec": {"containers": [{"name": "app", "image": "example/app:1",
                "envFrom": [{"configMapRef": {"name": "orders"}}, {"secretRef": {"name": "creds"}}]}]}}}
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    let w = workload(WorkloadKind::Deployment, "env");
    let secret = format!("secret/creds:{}", "2".repeat(64));
    let contents = [
        content(Some(sha)),
        Content {
            hash: &secret,
            unkeyed: None,
            reloader: Some("0123456789abcdef0123456789abcdef01234567"),
        },
    ];
    assert_eq!(
        exec.restart_contents(&w, &contents, "r", RestartStrategy::EnvVars)
            .await
            .unwrap(),
        [true, true]
    );
    let after = stored(&server, &w);
    assert_eq!(
        after.pointer("/spec/template/spec/containers/0/env"),
        Some(&json!([
            {"name": "STAKATER_ORDERS_CONFIGMAP", "value": sha},
            {"name": "STAKATER_CREDS_SECRET", "value": "2".repeat(64)},
        ]))
    );
    // Both read as at their content again, whichever form they hold.
    assert_eq!(
        exec.restart_contents(&w, &contents, "r", RestartStrategy::EnvVars)
            .await
            .unwrap(),
        [false, false]
    );
    assert_eq!(generation(&stored(&server, &w)), 2);
}

/// The newest record decides (review of issue 34 §3): Reloader's variable
/// left at content A after we restarted for B (our annotation) must not
/// hide a change back to A; that restart keeps the variable in step, and
/// then both records agree.
#[tokio::test]
async fn a_record_only_an_older_writer_kept_does_not_hide_a_change_back() {
    let (server, client) = start().await;
    let exec = executor(&client);
    let sha_a = "a9252138a1296257fa1f4ceb32cc6af0e2dfe373";
    let a = format!("configmap/flags:{}", "a".repeat(64));
    let b = format!("configmap/flags:{}", "b".repeat(64));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}, "annotations": {
                "config-hash.wasmwatch.io/configmap.flags": b}},
            "spec": {"containers": [{"name": "app", "image": "example/app:1",
                "env": [{"name": "STAKATER_FLAGS_CONFIGMAP", "value": sha_a}],
                "envFrom": [{"configMapRef": {"name": "flags"}}]}]}}}
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    let w = workload(WorkloadKind::Deployment, "web");
    let back_to_a = [Content {
        hash: &a,
        unkeyed: None,
        reloader: Some(sha_a),
    }];
    assert_eq!(
        exec.restart_contents(&w, &back_to_a, "r", RestartStrategy::Annotations)
            .await
            .unwrap(),
        [true],
        "our record says B: the change back to A restarts"
    );
    let after = stored(&server, &w);
    assert_eq!(generation(&after), 2);
    assert_eq!(
        template_annotation(&after, "config-hash.wasmwatch.io/configmap.flags").as_deref(),
        Some(a.as_str())
    );
    assert!(template_annotation(&after, RESTARTED_AT_ANNOTATION).is_some());
    assert_eq!(
        after.pointer("/spec/template/spec/containers/0/env"),
        Some(&json!([{"name": "STAKATER_FLAGS_CONFIGMAP", "value": sha_a}])),
        "the variable kept in step (Reloader's hash of A)"
    );
    // Now a change to B: both records move; B again is at content.
    let to_b = [Content {
        hash: &b,
        unkeyed: None,
        reloader: Some("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"),
    }];
    for strategy in [RestartStrategy::EnvVars, RestartStrategy::Annotations] {
        let written = exec
            .restart_contents(&w, &to_b, "r", strategy)
            .await
            .unwrap();
        assert_eq!(
            written,
            [strategy == RestartStrategy::EnvVars],
            "{strategy:?}"
        );
    }
    let last = stored(&server, &w);
    assert_eq!(generation(&last), 3);
    assert_eq!(
        template_annotation(&last, "config-hash.wasmwatch.io/configmap.flags").as_deref(),
        Some(b.as_str()),
        "env-vars kept our annotation in step"
    );
    assert_eq!(
        last.pointer("/spec/template/spec/containers/0/env/0/value"),
        Some(&json!("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"))
    );
}

/// Reloader's default strategy: a `STAKATER_<NAME>_<KIND>` variable in the
/// container that uses the object, no annotation; once per content; a
/// workload's `wasmwatch.io/reload-strategy` annotation wins over the
/// plugin's strategy, and content recorded either way is not restarted
/// again when the strategy changes.
#[tokio::test]
async fn the_env_vars_strategy_sets_reloaders_variable_in_the_using_container() {
    let (server, client) = start().await;
    let w = workload(WorkloadKind::Deployment, "web");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [
                    {"name": "proxy", "image": "example/proxy:1"},
                    {"name": "app", "image": "example/app:1",
                     "env": [{"name": "KEEP", "value": "me"}],
                     "envFrom": [{"configMapRef": {"name": "app-config"}}]},
                ]},
            },
        },
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    let exec = executor(&client);
    let h1 = format!("configmap/app-config:{}", "1".repeat(64));
    let h2 = format!("configmap/app-config:{}", "2".repeat(64));
    let env = |obj: &Value, container: usize| {
        obj["spec"]["template"]["spec"]["containers"][container]["env"].clone()
    };
    assert_eq!(
        exec.restart_with(&w, &[(h1.as_str(), None)], "r", RestartStrategy::EnvVars)
            .await,
        Ok(vec![true])
    );
    let after = stored(&server, &w);
    assert_eq!(generation(&after), 2);
    assert_eq!(
        env(&after, 1),
        json!([{"name": "KEEP", "value": "me"},
               {"name": "STAKATER_APP_CONFIG_CONFIGMAP", "value": "1".repeat(64)}]),
        "merged by name into the container that uses it"
    );
    assert_eq!(
        env(&after, 0),
        Value::Null,
        "the other container is untouched"
    );
    assert_eq!(
        template_annotation(&after, &hash_annotation_key(&h1)),
        None,
        "no annotation with env-vars"
    );
    assert_eq!(
        exec.restart_with(
            &w,
            &[(h1.as_str(), None)],
            "again",
            RestartStrategy::EnvVars
        )
        .await,
        Ok(vec![false])
    );
    // The variable records h1: the annotations strategy does not roll again.
    assert_eq!(
        exec.restart_with(
            &w,
            &[(h1.as_str(), None)],
            "switch",
            RestartStrategy::Annotations
        )
        .await,
        Ok(vec![false])
    );
    assert_eq!(generation(&stored(&server, &w)), 2);
    // The workload asks for annotations: they win over the plugin's env-vars.
    let patch =
        json!({"metadata": {"annotations": {"wasmwatch.io/reload-strategy": "annotations"}}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(
        exec.restart_with(&w, &[(h2.as_str(), None)], "h2", RestartStrategy::EnvVars)
            .await,
        Ok(vec![true])
    );
    let last = stored(&server, &w);
    assert_eq!(
        template_annotation(&last, &hash_annotation_key(&h2)).as_deref(),
        Some(h2.as_str())
    );
    assert_eq!(
        env(&last, 1)[1]["value"],
        json!("2".repeat(64)),
        "the variable is kept in step with the annotation (the newest record)"
    );
}

#[tokio::test]
async fn statefulset_and_daemonset_restart_once_per_content() {
    let (server, client) = start().await;
    let exec = executor(&client);
    for w in [
        workload(WorkloadKind::StatefulSet, "db"),
        workload(WorkloadKind::DaemonSet, "agent"),
    ] {
        create(&client, &w).await;
        restarts_once_per_content(&server, &exec, &w).await;
    }
}

#[tokio::test]
async fn each_referenced_object_keeps_its_own_annotation() {
    let (server, client) = start().await;
    let exec = executor(&client);
    let w = workload(WorkloadKind::Deployment, "web");
    create(&client, &w).await;
    let a = "configmap/app-config:aaaa";
    let b = "configmap/feature-flags:bbbb";
    let s = "secret/app-config:aaaa";
    let long = format!("configmap/{}:cccc", "very-long-name.".repeat(16) + "end");
    for hash in [a, b, s, long.as_str()] {
        assert_eq!(
            exec.restart(&w, hash, "changed").await,
            Ok(RestartOutcome::Restarted),
            "{hash}"
        );
    }
    let obj = stored(&server, &w);
    for hash in [a, b, s, long.as_str()] {
        assert_eq!(
            template_annotation(&obj, &hash_annotation_key(hash)).as_deref(),
            Some(hash)
        );
    }
    let annotations = obj["spec"]["template"]["metadata"]["annotations"]
        .as_object()
        .unwrap();
    // team, restartedAt and four hashes.
    assert_eq!(annotations.len(), 6, "{annotations:?}");
    assert!(hash_annotation_key(&long).len() <= "config-hash.wasmwatch.io/".len() + 63);
    for hash in [a, b, s, long.as_str()] {
        assert_eq!(
            exec.restart(&w, hash, "resync").await,
            Ok(RestartOutcome::AlreadyAtContent),
            "{hash}"
        );
    }
}

#[tokio::test]
async fn a_missing_workload_is_permanent_and_named() {
    let (_server, client) = start().await;
    let exec = executor(&client);
    for (kind, name) in [
        (WorkloadKind::Deployment, "Deployment shop/ghost"),
        (WorkloadKind::StatefulSet, "StatefulSet shop/ghost"),
        (WorkloadKind::DaemonSet, "DaemonSet shop/ghost"),
    ] {
        let err = exec
            .restart(&workload(kind, "ghost"), "configmap/c:1", "changed")
            .await
            .unwrap_err();
        assert!(matches!(err, ExecError::Permanent(_)), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(name) && text.contains("not found"), "{text}");
    }
    let elsewhere = WorkloadRef {
        kind: WorkloadKind::Deployment,
        namespace: "nowhere".into(),
        name: "web".into(),
    };
    let err = exec
        .restart(&elsewhere, "configmap/c:1", "changed")
        .await
        .unwrap_err();
    assert!(matches!(err, ExecError::Permanent(_)), "{err:?}");
    assert!(err.to_string().contains("Deployment nowhere/web"), "{err}");
}

/// Creates an object of any kind through the dynamic API; returns it.
async fn create_dyn(client: &Client, kind: &WorkloadKind, name: &str, spec: Value) -> Value {
    let (group, version, k) = kind.gvk();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, k));
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": kind.api_version(),
        "kind": k,
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }))
    .unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ar);
    serde_json::to_value(api.create(&PostParams::default(), &obj).await.unwrap()).unwrap()
}

/// Annotates an object of any kind (merge patch of its metadata).
async fn annotate(client: &Client, kind: &WorkloadKind, name: &str, key: &str, value: &str) {
    let (group, version, k) = kind.gvk();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, k));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ar);
    let patch = json!({"metadata": {"annotations": {key: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

fn pod_template(name: &str, containers: Value) -> Value {
    json!({
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": containers},
    })
}

fn cronjob() -> WorkloadKind {
    WorkloadKind::from_gvk("batch", "v1", "CronJob")
}

fn job() -> WorkloadKind {
    WorkloadKind::from_gvk("batch", "v1", "Job")
}

fn rollout() -> WorkloadKind {
    WorkloadKind::from_gvk("argoproj.io", "v1alpha1", "Rollout")
}

fn annotation_at(obj: &Value, pointer: &str, key: &str) -> Option<String> {
    obj.pointer(pointer)
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// Issue 20: a CronJob records the content on its job template (the Jobs
/// it starts from now on get it), once per content, and no Job is started.
#[tokio::test]
async fn a_cronjob_records_the_content_on_its_job_template_and_starts_no_job() {
    let (server, client) = start().await;
    let exec = executor(&client);
    let w = workload(cronjob(), "nightly");
    let mut template = pod_template(
        "nightly",
        json!([{"name": "app", "image": "example/app:1",
                "envFrom": [{"configMapRef": {"name": "orders"}}]}]),
    );
    template["spec"]["restartPolicy"] = json!("Never");
    create_dyn(
        &client,
        &w.kind,
        "nightly",
        json!({"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template}}}),
    )
    .await;
    let h1 = format!("configmap/orders:{}", "1".repeat(64));
    assert_eq!(
        exec.restart(&w, &h1, "changed").await,
        Ok(RestartOutcome::Restarted)
    );
    let after = server.get("cronjobs.batch", NS, "nightly").unwrap();
    assert_eq!(generation(&after), 2);
    let annotations = "/spec/jobTemplate/spec/template/metadata/annotations";
    assert_eq!(
        annotation_at(&after, annotations, &hash_annotation_key(&h1)).as_deref(),
        Some(h1.as_str())
    );
    assert!(annotation_at(&after, annotations, RESTARTED_AT_ANNOTATION).is_some());
    assert_eq!(
        exec.restart(&w, &h1, "again").await,
        Ok(RestartOutcome::AlreadyAtContent)
    );
    assert_eq!(
        generation(&server.get("cronjobs.batch", NS, "nightly").unwrap()),
        2
    );
    // env-vars: Reloader's variable in the job template's container
    // (a strategic merge patch: CronJob is built in).
    let h2 = format!("configmap/orders:{}", "2".repeat(64));
    assert_eq!(
        exec.restart_with(&w, &[(h2.as_str(), None)], "r", RestartStrategy::EnvVars)
            .await,
        Ok(vec![true])
    );
    let after = server.get("cronjobs.batch", NS, "nightly").unwrap();
    let container = &after["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["env"],
        json!([{"name": "STAKATER_ORDERS_CONFIGMAP", "value": "2".repeat(64)}])
    );
    assert_eq!(container["envFrom"][0]["configMapRef"]["name"], "orders");
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    assert!(
        jobs.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no Job started"
    );
}

/// A Job's pod template is immutable: without `wasmwatch.io/recreate-job:
/// "true"` its restart fails for good saying how to opt in; with it, the
/// Job is deleted and created again (a new uid, the content on its
/// template, a selector the API server generated anew), once per content.
#[tokio::test]
async fn a_job_is_re_created_only_when_it_opts_in() {
    let (server, client) = start().await;
    let exec = executor(&client);
    let w = workload(job(), "migrate");
    let mut template = pod_template(
        "migrate",
        json!([{"name": "app", "image": "example/app:1"}]),
    );
    template["spec"]["restartPolicy"] = json!("Never");
    let created = create_dyn(&client, &w.kind, "migrate", json!({"template": template})).await;
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let h1 = format!("configmap/orders:{}", "1".repeat(64));
    let err = exec.restart(&w, &h1, "changed").await.unwrap_err();
    assert_eq!(
        err,
        ExecError::Permanent(
            "restart of batch/v1/Job shop/migrate: a Job's pod template cannot change, so \
             restarting it means deleting the Job (and its pods) and creating it again; \
             wasmwatch does that only for Jobs annotated wasmwatch.io/recreate-job: \"true\""
                .into()
        )
    );
    let unchanged = server.get("jobs.batch", NS, "migrate").unwrap();
    assert_eq!(unchanged["metadata"]["uid"], uid.as_str());

    annotate(
        &client,
        &w.kind,
        "migrate",
        "wasmwatch.io/recreate-job",
        "true",
    )
    .await;
    assert_eq!(
        exec.restart(&w, &h1, "changed").await,
        Ok(RestartOutcome::Restarted)
    );
    let again = server.get("jobs.batch", NS, "migrate").unwrap();
    let new_uid = again["metadata"]["uid"].as_str().unwrap();
    assert_ne!(new_uid, uid, "a new Job");
    assert_eq!(
        template_annotation(&again, &hash_annotation_key(&h1)).as_deref(),
        Some(h1.as_str())
    );
    assert_eq!(
        again["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"], new_uid,
        "the selector is generated for the new Job"
    );
    assert_eq!(
        again["metadata"]["annotations"]["wasmwatch.io/recreate-job"],
        "true"
    );
    assert_eq!(
        exec.restart(&w, &h1, "again").await,
        Ok(RestartOutcome::AlreadyAtContent)
    );
    assert_eq!(
        server.get("jobs.batch", NS, "migrate").unwrap()["metadata"]["uid"],
        new_uid
    );
}

async fn create_rollout(client: &Client, name: &str, containers: Value) -> WorkloadRef {
    let w = workload(rollout(), name);
    create_dyn(
        client,
        &w.kind,
        name,
        json!({
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template(name, containers),
        }),
    )
    .await;
    w
}

/// An Argo Rollout (a custom resource: a merge patch, since strategic
/// merge patches are refused) gets the content on its pod template, once.
#[tokio::test]
async fn a_rollout_restarts_once_per_content() {
    let (server, client) = start().await;
    let exec = executor(&client);
    let w = create_rollout(
        &client,
        "web",
        json!([{"name": "app", "image": "example/app:1"}]),
    )
    .await;
    let h1 = format!("configmap/orders:{}", "1".repeat(64));
    let h2 = format!("configmap/orders:{}", "2".repeat(64));
    let stored = || server.get("rollouts.argoproj.io", NS, "web").unwrap();
    assert_eq!(
        exec.restart(&w, &h1, "changed").await,
        Ok(RestartOutcome::Restarted)
    );
    assert_eq!(generation(&stored()), 2);
    assert_eq!(
        template_annotation(&stored(), &hash_annotation_key(&h1)).as_deref(),
        Some(h1.as_str())
    );
    assert_eq!(
        exec.restart(&w, &h1, "again").await,
        Ok(RestartOutcome::AlreadyAtContent)
    );
    assert_eq!(generation(&stored()), 2);
    assert_eq!(
        exec.restart(&w, &h2, "changed").await,
        Ok(RestartOutcome::Restarted)
    );
    assert_eq!(generation(&stored()), 3);
    assert!(stored()["spec"].get("restartAt").is_none());
}

/// restart-at (a plugin's choice, or Reloader's `rollout-strategy:
/// restart` on the Rollout): `spec.restartAt`, the content on the
/// Rollout's own annotations, the template untouched; once per content.
#[tokio::test]
async fn restart_at_sets_a_rollouts_restart_time_once_per_content() {
    let (server, client) = start().await;
    let exec = executor(&client);
    let w = create_rollout(
        &client,
        "web",
        json!([{"name": "app", "image": "example/app:1"}]),
    )
    .await;
    let stored = || server.get("rollouts.argoproj.io", NS, "web").unwrap();
    let before = stored();
    let h1 = format!("configmap/orders:{}", "1".repeat(64));
    let key = hash_annotation_key(&h1);
    let restart_at = |h: &str| {
        let h = h.to_string();
        let exec = &exec;
        let w = &w;
        async move {
            exec.restart_with(w, &[(h.as_str(), None)], "r", RestartStrategy::RestartAt)
                .await
        }
    };
    assert_eq!(restart_at(&h1).await, Ok(vec![true]));
    let after = stored();
    let at = after["spec"]["restartAt"].as_str().unwrap().to_string();
    assert!(at.parse::<Timestamp>().is_ok(), "{at}");
    assert_eq!(
        after["metadata"]["annotations"][&key].as_str(),
        Some(h1.as_str())
    );
    assert_eq!(after["spec"]["template"], before["spec"]["template"]);
    assert_eq!(restart_at(&h1).await, Ok(vec![false]), "the same content");
    // A template restart of the same content is not needed either.
    assert_eq!(
        exec.restart(&w, &h1, "r").await,
        Ok(RestartOutcome::AlreadyAtContent)
    );
    assert_eq!(
        stored()["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );

    // Reloader's annotation on the Rollout chooses restart-at.
    annotate(
        &client,
        &w.kind,
        "web",
        "reloader.stakater.com/rollout-strategy",
        "restart",
    )
    .await;
    let h2 = format!("configmap/orders:{}", "2".repeat(64));
    assert_eq!(
        exec.restart(&w, &h2, "changed").await,
        Ok(RestartOutcome::Restarted)
    );
    let last = stored();
    assert_eq!(
        last["metadata"]["annotations"][&key].as_str(),
        Some(h2.as_str())
    );
    assert_eq!(last["spec"]["template"], before["spec"]["template"]);

    // restart-at of another kind fails for good, naming it.
    let d = workload(WorkloadKind::Deployment, "api");
    create(&client, &d).await;
    let err = exec
        .restart_with(&d, &[(h1.as_str(), None)], "r", RestartStrategy::RestartAt)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ExecError::Permanent(
            "restart of Deployment shop/api: strategy restart-at restarts Argo Rollouts only \
             (argoproj.io/v1alpha1/Rollout); use annotations or env-vars"
                .into()
        )
    );
}

/// env-vars on a custom resource: the variable set in its container, every
/// other container and variable kept (the whole list read, changed and
/// written with the version read as a precondition).
#[tokio::test]
async fn env_vars_on_a_rollout_keeps_the_other_containers_env() {
    let (server, client) = start().await;
    let exec = executor(&client);
    let w = create_rollout(
        &client,
        "web",
        json!([
            {"name": "sidecar", "image": "example/proxy:1",
             "env": [{"name": "A", "value": "1"}]},
            {"name": "app", "image": "example/app:1",
             "envFrom": [{"configMapRef": {"name": "orders"}}],
             "env": [{"name": "B", "value": "2"}]},
        ]),
    )
    .await;
    let containers = || {
        server.get("rollouts.argoproj.io", NS, "web").unwrap()["spec"]["template"]["spec"]
            ["containers"]
            .clone()
    };
    let before = containers();
    for digest in ["1", "2"] {
        let h = format!("configmap/orders:{}", digest.repeat(64));
        assert_eq!(
            exec.restart_with(&w, &[(h.as_str(), None)], "r", RestartStrategy::EnvVars)
                .await,
            Ok(vec![true])
        );
        let after = containers();
        assert_eq!(after[0], before[0], "the sidecar is untouched");
        assert_eq!(
            after[1]["env"],
            json!([{"name": "B", "value": "2"},
                   {"name": "STAKATER_ORDERS_CONFIGMAP", "value": digest.repeat(64)}])
        );
        assert_eq!(after[1]["envFrom"], before[1]["envFrom"]);
        assert_eq!(
            exec.restart_with(&w, &[(h.as_str(), None)], "r", RestartStrategy::EnvVars)
                .await,
            Ok(vec![false])
        );
    }
}

/// A kind the executor knows nothing about is found through discovery and
/// restarted at `spec.template`; one without a pod template there, and one
/// the API server does not serve, fail for good, naming why.
#[tokio::test]
async fn other_kinds_restart_at_spec_template_or_fail_naming_it() {
    let (server, client) = start().await;
    let exec = executor(&client);
    let kind = WorkloadKind::from_gvk("apps.kruise.io", "v1alpha1", "CloneSet");
    let w = workload(kind.clone(), "web");
    create_dyn(
        &client,
        &kind,
        "web",
        json!({
            "selector": {"matchLabels": {"app": "web"}},
            "template": pod_template("web", json!([{"name": "app", "image": "example/app:1"}])),
        }),
    )
    .await;
    let h1 = format!("configmap/orders:{}", "1".repeat(64));
    for _ in 0..2 {
        // The second time the kind's resource is remembered.
        let stored = || server.get("clonesets.apps.kruise.io", NS, "web").unwrap();
        let first = template_annotation(&stored(), &hash_annotation_key(&h1)).is_none();
        assert_eq!(
            exec.restart(&w, &h1, "changed").await,
            Ok(if first {
                RestartOutcome::Restarted
            } else {
                RestartOutcome::AlreadyAtContent
            })
        );
        assert_eq!(generation(&stored()), 2);
        assert_eq!(
            template_annotation(&stored(), &hash_annotation_key(&h1)).as_deref(),
            Some(h1.as_str())
        );
    }

    let pod = WorkloadKind::from_gvk("", "v1", "Pod");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "solo"},
            "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let err = exec
        .restart(&workload(pod, "solo"), &h1, "changed")
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ExecError::Permanent(
            "restart of v1/Pod shop/solo: it has no pod template at spec.template".into()
        )
    );
    let thing = WorkloadKind::from_gvk("example.com", "v1", "Thing");
    let err = exec
        .restart(&workload(thing, "x"), &h1, "changed")
        .await
        .unwrap_err();
    assert!(matches!(err, ExecError::Permanent(_)), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("restart of example.com/v1/Thing shop/x: "),
        "{err}"
    );
    let ns = WorkloadKind::from_gvk("", "v1", "Namespace");
    let err = exec
        .restart(&workload(ns, "x"), &h1, "changed")
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ExecError::Permanent(
            "restart of v1/Namespace shop/x: kind Namespace is not namespaced, so it is not a \
             workload"
                .into()
        )
    );
}

#[tokio::test]
async fn api_server_faults_are_retryable() {
    let (server, client) = start().await;
    let exec = executor(&client).with_timeout(Duration::from_millis(300));
    let w = workload(WorkloadKind::Deployment, "web");
    create(&client, &w).await;
    let key = hash_annotation_key("configmap/c:1");

    // 500 on the read.
    server.faults().fail_next(1, Failure::Internal);
    let err = exec.restart(&w, "configmap/c:1", "x").await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("Deployment shop/web"), "{err}");
    assert!(err.to_string().contains("500"), "{err}");

    // 409 on the write (on a real cluster, the controller's status write
    // after the last rollout): read again and restart at once.
    server
        .faults()
        .conflict_next_write("deployments", NS, "web");
    assert_eq!(
        exec.restart(&w, "configmap/c:0", "x").await,
        Ok(RestartOutcome::Restarted)
    );
    // A 409 on every re-read too: nothing recorded, the retry restarts.
    for _ in 0..=wasmwatch_exec::workload::CONFLICT_REREADS {
        server
            .faults()
            .conflict_next_write("deployments", NS, "web");
    }
    let err = exec.restart(&w, "configmap/c:1", "x").await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("Deployment shop/web"), "{err}");
    assert!(err.to_string().contains("409"), "{err}");
    assert_eq!(
        template_annotation(&stored(&server, &w), &key).as_deref(),
        Some("configmap/c:0"),
        "c:1 not recorded"
    );
    assert_eq!(
        exec.restart(&w, "configmap/c:1", "x").await,
        Ok(RestartOutcome::Restarted)
    );

    // No answer within the timeout.
    server.faults().set_latency(Duration::from_secs(2));
    let t = std::time::Instant::now();
    let err = exec.restart(&w, "configmap/c:2", "x").await.unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("Deployment shop/web"), "{err}");
    server.faults().reset();

    // The API server is down (connection refused).
    server
        .faults()
        .refuse_connections(Duration::from_millis(1500))
        .await;
    let err = exec.restart(&w, "configmap/c:2", "x").await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("Deployment shop/web"), "{err}");
}

/// Two restarts of one content racing on one workload (an old leader's
/// request landing after its successor's): both read the same version;
/// the resourceVersion in the patch lets only one write, and the other,
/// reading again, finds the content recorded and writes nothing. Without
/// the precondition the workload rolls twice (issue 34 §5: why it stays).
#[tokio::test]
async fn two_restarts_of_one_content_racing_roll_the_workload_once() {
    let (server, client) = start().await;
    let exec = executor(&client);
    let w = workload(WorkloadKind::Deployment, "web");
    create(&client, &w).await;
    // Both GETs are answered before either PATCH is.
    server.faults().set_latency(Duration::from_millis(150));
    let (a, b) = tokio::join!(
        exec.restart(&w, "configmap/c:1", "x"),
        exec.restart(&w, "configmap/c:1", "x"),
    );
    server.faults().reset();
    let mut results = [a, b];
    results.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(
        results,
        [
            Ok(RestartOutcome::AlreadyAtContent),
            Ok(RestartOutcome::Restarted)
        ]
    );
    assert_eq!(generation(&stored(&server, &w)), 2, "one rollout");
}

fn origin(cm: &ConfigMap) -> Origin {
    Origin {
        kind: ObjectKind::ConfigMap,
        namespace: NS.into(),
        name: cm.metadata.name.clone().unwrap(),
        uid: cm.metadata.uid.clone().unwrap(),
        resource_version: cm.metadata.resource_version.clone().unwrap(),
        plugin: "http-refresh".into(),
        unkeyed_digest: None,
        reloader_hash: None,
    }
}

async fn config_map(client: &Client, name: &str) -> ConfigMap {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "data": {"k": "v"},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap()
}

async fn events_about(client: &Client, name: &str) -> Vec<Event> {
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    Api::<Event>::namespaced(client.clone(), NS)
        .list(&lp)
        .await
        .unwrap()
        .items
}

#[tokio::test]
async fn events_on_the_changed_object() {
    let (_server, client) = start().await;
    let exec = executor(&client);
    let cm = config_map(&client, "app-config").await;
    let origin = origin(&cm);
    let before = Timestamp::now().as_second();
    exec.event(
        &origin,
        EventType::Warning,
        "RefreshFailed",
        "POST http://10.0.0.1:8080/actuator/refresh: 500",
    )
    .await
    .unwrap();
    exec.event(&origin, EventType::Normal, "Refreshed", "3 pods refreshed")
        .await
        .unwrap();

    let events = events_about(&client, "app-config").await;
    assert_eq!(events.len(), 2, "{events:#?}");
    let warning = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("RefreshFailed"))
        .expect("the warning");
    let o = &warning.involved_object;
    assert_eq!(o.api_version.as_deref(), Some("v1"));
    assert_eq!(o.kind.as_deref(), Some("ConfigMap"));
    assert_eq!(o.name.as_deref(), Some("app-config"));
    assert_eq!(o.namespace.as_deref(), Some(NS));
    assert_eq!(o.uid, cm.metadata.uid);
    assert_eq!(o.resource_version, cm.metadata.resource_version);
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert_eq!(
        warning.message.as_deref(),
        Some("POST http://10.0.0.1:8080/actuator/refresh: 500")
    );
    assert_eq!(warning.metadata.namespace.as_deref(), Some(NS));
    let name = warning.metadata.name.as_deref().unwrap();
    assert!(name.starts_with("app-config."), "{name}");
    assert_eq!(
        warning.source.as_ref().and_then(|s| s.component.as_deref()),
        Some("wasmwatch")
    );
    assert_eq!(warning.reporting_component.as_deref(), Some("wasmwatch"));
    assert_eq!(
        warning.reporting_instance.as_deref(),
        Some("wasmwatch-7d9f-abcde")
    );
    assert_eq!(warning.action.as_deref(), Some("RefreshFailed"));
    assert_eq!(warning.count, Some(1));
    let first = warning.first_timestamp.as_ref().unwrap().0.as_second();
    assert!(first >= before && first <= Timestamp::now().as_second());
    assert_eq!(warning.first_timestamp, warning.last_timestamp);
    assert!(warning.event_time.is_some());
    assert_eq!(
        warning
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("wasmwatch.io/plugin"))
            .map(String::as_str),
        Some("http-refresh")
    );
    let normal = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("Refreshed"))
        .expect("the normal event");
    assert_eq!(normal.type_.as_deref(), Some("Normal"));
    assert_ne!(normal.metadata.name, warning.metadata.name);
}

#[tokio::test]
async fn long_event_messages_are_cut_on_a_character_boundary() {
    let (_server, client) = start().await;
    let exec = executor(&client);
    let cm = config_map(&client, "app-config").await;
    let message = "é".repeat(3000);
    exec.event(&origin(&cm), EventType::Warning, "Failed", &message)
        .await
        .unwrap();
    let events = events_about(&client, "app-config").await;
    let stored = events[0].message.as_deref().unwrap();
    assert!(stored.len() <= 1024, "{}", stored.len());
    assert!(stored.len() >= 1000, "{}", stored.len());
    let body = stored.strip_suffix('…').expect("marked as cut");
    assert!(message.starts_with(body));
}

#[tokio::test]
async fn an_event_in_a_missing_namespace_is_permanent() {
    let (_server, client) = start().await;
    let exec = executor(&client);
    let origin = Origin {
        kind: ObjectKind::Secret,
        namespace: "nowhere".into(),
        name: "db".into(),
        uid: String::new(),
        resource_version: String::new(),
        plugin: "p".into(),
        unkeyed_digest: None,
        reloader_hash: None,
    };
    let err = exec
        .event(&origin, EventType::Normal, "Seen", "m")
        .await
        .unwrap_err();
    assert!(matches!(err, ExecError::Permanent(_)), "{err:?}");
    assert!(err.to_string().contains("Secret nowhere/db"), "{err}");
}

#[tokio::test]
async fn workload_events_carry_the_workload_and_its_uid() {
    let (server, client) = start().await;
    let exec = executor(&client);
    let w = workload(WorkloadKind::Deployment, "web");
    let created = create(&client, &w).await;
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();

    // Without a restart first, the uid is not known: left out.
    exec.workload_event(&w, EventType::Normal, "Noticed", "before")
        .await
        .unwrap();
    assert_eq!(
        exec.restart(&w, "configmap/c:1", "x").await,
        Ok(RestartOutcome::Restarted)
    );
    exec.workload_event(
        &w,
        EventType::Normal,
        "Reloaded",
        "ConfigMap shop/c changed (plugin rollout-restart)",
    )
    .await
    .unwrap();

    let events = events_about(&client, "web").await;
    assert_eq!(events.len(), 2);
    let before = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("Noticed"))
        .unwrap();
    assert_eq!(before.involved_object.uid, None);
    let reloaded = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("Reloaded"))
        .unwrap();
    let o = &reloaded.involved_object;
    assert_eq!(o.api_version.as_deref(), Some("apps/v1"));
    assert_eq!(o.kind.as_deref(), Some("Deployment"));
    assert_eq!(o.name.as_deref(), Some("web"));
    assert_eq!(o.namespace.as_deref(), Some(NS));
    assert_eq!(o.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(reloaded.type_.as_deref(), Some("Normal"));
    assert_eq!(
        reloaded.message.as_deref(),
        Some("ConfigMap shop/c changed (plugin rollout-restart)")
    );
    assert!(reloaded.metadata.annotations.is_none());

    // Found the way `kubectl describe` finds a workload's Events.
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=Deployment,involvedObject.name=web,involvedObject.uid={uid}"
    ));
    let found = Api::<Event>::namespaced(client.clone(), NS)
        .list(&lp)
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1);
    drop(server);
}

fn kubectl_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

#[tokio::test]
async fn kubectl_lists_the_events() {
    let Some(kubectl) = kubectl_path() else {
        eprintln!(
            "\n!!!!!!!! SKIPPING kubectl_lists_the_events: kubectl is not installed (tests/prepare installs it) !!!!!!!!\n"
        );
        return;
    };
    let (server, client) = start().await;
    let exec = executor(&client);
    let cm = config_map(&client, "app-config").await;
    exec.event(
        &origin(&cm),
        EventType::Warning,
        "RefreshFailed",
        "pod down",
    )
    .await
    .unwrap();
    let w = workload(WorkloadKind::Deployment, "web");
    create(&client, &w).await;
    exec.restart(&w, "configmap/app-config:1", "x")
        .await
        .unwrap();
    exec.workload_event(&w, EventType::Normal, "Reloaded", "restarted")
        .await
        .unwrap();

    let dir = std::env::temp_dir().join(format!(
        "wasmwatch-exec-kubectl-{}-{}",
        std::process::id(),
        server.addr().port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let run = |args: Vec<String>| {
        let kubectl = kubectl.clone();
        let kubeconfig = kubeconfig.clone();
        let cache = dir.join("cache");
        async move {
            let out = tokio::time::timeout(
                Duration::from_secs(30),
                tokio::process::Command::new(&kubectl)
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .arg("--cache-dir")
                    .arg(&cache)
                    .args(&args)
                    .env_remove("KUBECONFIG")
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .expect("kubectl finished in time")
            .expect("kubectl runs");
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "kubectl {args:?}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            stdout
        }
    };
    let names = run(vec!["get".into(), "events".into(), "-n".into(), NS.into()]).await;
    let columns = run(vec![
        "get".into(),
        "events".into(),
        "-n".into(),
        NS.into(),
        "-o".into(),
        "custom-columns=KIND:.involvedObject.kind,OBJECT:.involvedObject.name,TYPE:.type,REASON:.reason,FROM:.source.component,MESSAGE:.message".into(),
    ])
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    // The test API server answers kubectl's Table request like a cluster:
    // LAST SEEN, TYPE, REASON, OBJECT, MESSAGE.
    assert!(names.contains("configmap/app-config"), "{names}");
    assert!(names.contains("deployment/web"), "{names}");
    assert!(names.contains("RefreshFailed"), "{names}");
    let rows: Vec<Vec<&str>> = columns
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        rows.iter().any(|r| r[..5]
            == [
                "ConfigMap",
                "app-config",
                "Warning",
                "RefreshFailed",
                "wasmwatch"
            ]),
        "{columns}"
    );
    assert!(
        rows.iter()
            .any(|r| r[..5] == ["Deployment", "web", "Normal", "Reloaded", "wasmwatch"]),
        "{columns}"
    );
}

/// A typed client reads the restarted workload back with both annotations.
#[tokio::test]
async fn restart_is_visible_to_other_clients() {
    let (_server, client) = start().await;
    let exec = executor(&client);
    let w = workload(WorkloadKind::StatefulSet, "db");
    create(&client, &w).await;
    exec.restart(&w, "secret/db-creds:abc", "x").await.unwrap();
    let sts = Api::<StatefulSet>::namespaced(client.clone(), NS)
        .get("db")
        .await
        .unwrap();
    let annotations = sts.spec.template.metadata.unwrap().annotations.unwrap();
    assert_eq!(
        annotations
            .get("config-hash.wasmwatch.io/secret.db-creds")
            .map(String::as_str),
        Some("secret/db-creds:abc")
    );
    assert!(annotations.contains_key(RESTARTED_AT_ANNOTATION));
}

#[tokio::test]
async fn the_recorder_writes_queued_events_in_the_background() {
    let (_server, client) = start().await;
    let cm = config_map(&client, "orders").await;
    let recorder = EventRecorder::start(
        std::sync::Arc::new(executor(&client)),
        DEFAULT_CAPACITY,
        DEFAULT_CONCURRENCY,
        || panic!("nothing is dropped"),
    );
    for i in 0..50 {
        assert!(recorder.record(
            &origin(&cm),
            EventType::Normal,
            "Refreshed",
            format!("refresh {i}")
        ));
    }
    // Nothing was written yet (this runtime has one thread and the loop
    // did not yield): each Event must carry the time it was recorded.
    let recorded_by = Timestamp::now();
    // Written when flush returns.
    assert!(recorder.flush(Duration::from_secs(10)).await);
    let events = events_about(&client, "orders").await;
    // Aggregated (see the recorder's docs): ten messages keep their own
    // Event, the other 40 share one combined Event; every one is counted.
    assert_eq!(events.len(), 11);
    assert_eq!(events.iter().map(|e| e.count.unwrap_or(1)).sum::<i32>(), 50);
    let mut messages: Vec<_> = events.iter().filter_map(|e| e.message.clone()).collect();
    messages.sort();
    messages.dedup();
    assert_eq!(messages.len(), 11, "{messages:?}");
    assert!(
        events
            .iter()
            .all(|e| e.reason.as_deref() == Some("Refreshed"))
    );
    for e in &events {
        let at = e.event_time.as_ref().expect("eventTime").0;
        assert!(at <= recorded_by, "{at} is after {recorded_by}");
    }
    assert_eq!(recorder.dropped(), 0);
}

/// An API server that accepts connections and never answers: the queue
/// fills, and what does not fit is dropped and counted, never waited for.
#[tokio::test]
async fn a_full_event_queue_drops_and_counts_instead_of_waiting() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            open.push(conn);
        }
    });
    let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let counted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let c = counted.clone();
    let recorder = EventRecorder::start(std::sync::Arc::new(executor(&client)), 4, 1, move || {
        c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "orders", "namespace": NS, "uid": "u1", "resourceVersion": "7"},
    }))
    .unwrap();
    let started = std::time::Instant::now();
    let mut refused = 0;
    for i in 0..20 {
        if !recorder.record(&origin(&cm), EventType::Normal, "Refreshed", format!("{i}")) {
            refused += 1;
        }
        // Let the writer take the first one off the queue.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    // One in flight (unanswered), four queued.
    assert_eq!(refused, 15);
    assert_eq!(recorder.dropped(), 15);
    assert_eq!(counted.load(std::sync::atomic::Ordering::SeqCst), 15);
    // Shutdown does not wait for an API server that never answers.
    assert!(!recorder.flush(Duration::from_millis(100)).await);
    held.abort();
}

/// Issue 34 §5: a namespace being deleted (kube-apiserver marks it
/// Terminating, then its controller deletes the content, ConfigMaps
/// before Deployments). A restart there writes nothing (kube-apiserver
/// would still accept the patch and roll a dying workload), and an Event
/// refused there says why, not RBAC.
#[tokio::test]
async fn nothing_is_restarted_in_a_namespace_being_deleted_and_its_refusal_is_not_rbac() {
    // The namespace controller takes its time: the Deployment is still there.
    let (server, client) =
        start_with(Config::default().namespace_teardown_step(Duration::from_secs(30))).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let exec = executor(&client).reading_namespaces(true);
    let w = workload(WorkloadKind::Deployment, "web");
    create(&client, &w).await;
    let cm = config_map(&client, "settings").await;
    assert_eq!(
        exec.restart(&w, "configmap/settings:1", "x").await,
        Ok(RestartOutcome::Restarted),
        "a live namespace"
    );
    namespaces
        .delete(NS, &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        exec.restart(&w, "configmap/settings:2", "x").await,
        Ok(RestartOutcome::AlreadyAtContent),
        "nothing written"
    );
    assert_eq!(generation(&stored(&server, &w)), 2, "no second rollout");
    let err = exec
        .event(&origin(&cm), EventType::Normal, "Refreshed", "1 pod")
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("the namespace is being deleted") && text.contains("not RBAC"),
        "{text}"
    );
}
