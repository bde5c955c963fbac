//! Issue 20's workload kinds, end to end: `wasmwatch run` against the test
//! API server (which serves batch/v1 CronJobs and Jobs, and Argo Rollouts
//! and OpenKruise CloneSets as custom resources).
//! - the bundled rollout-restart (WIT 0.3.0) restarts a CronJob (its job
//!   template; no Job started), a Job annotated `wasmwatch.io/recreate-job`
//!   (re-created: a new uid), an Argo Rollout (its template) and one
//!   annotated `rollout-strategy: restart` (`spec.restartAt`), and a
//!   Deployment whose named `reload` annotation selects the ConfigMap
//!   without a reference;
//! - with `keyAware`, a change to a key a workload does not use leaves a
//!   workload that uses only keys (env `configMapKeyRef`) alone, and
//!   restarts one that uses the whole object (`envFrom`);
//! - a 0.3.0 test plugin (plugins/testing/v3-restart) restarts a CloneSet
//!   granted by kind, and is refused naming the kind without the grant; a
//!   0.2.0 component (plugins/js/testing/v2-restart) still restarts a Deployment.
mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use wasmwatch_core::DataValue;
use wasmwatch_core::digest::data_digest;
use wasmwatch_exec::workload::hash_annotation_key;

const NS: &str = "shop";
/// Generous: CI machines are shared and slow.
const WITHIN: Duration = Duration::from_secs(60);

const ALL_KINDS: &str = "[Deployment, StatefulSet, DaemonSet, batch/v1/CronJob, batch/v1/Job, argoproj.io/v1alpha1/Rollout]";

fn rollout_restart_manifest(config: &str) -> String {
    format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{kinds: [ConfigMap], namespaces: [shop]}}
ha: {{enabled: false}}
plugins:
  - name: rollout-restart
    module: {{module:rollout-restart}}
    sha256: {{sha256:rollout-restart}}
    config: {config}
    events: {{kinds: [ConfigMap]}}
    capabilities: {{restart: {{namespaces: [shop], kinds: {ALL_KINDS}}}}}
    delivery: {{debounce: 0s}}
"
    )
}

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, DataValue> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), DataValue::Text(v.to_string())))
        .collect()
}

/// What a restart records for ConfigMap `name` holding `pairs`.
fn content_hash(name: &str, pairs: &[(&str, &str)]) -> String {
    format!("configmap/{name}:{}", data_digest(&data(pairs), None))
}

async fn config_map(c: &kube::Client, name: &str, pairs: &[(&str, &str)]) {
    let data: serde_json::Map<String, Value> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    apply(
        c,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": NS}, "data": data}),
    )
    .await;
}

async fn set(c: &kube::Client, name: &str, pairs: &[(&str, &str)]) {
    let data: serde_json::Map<String, Value> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(c.clone(), NS);
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": data})),
    )
    .await
    .unwrap();
}

/// The API of `group/version/Kind` in the namespace.
fn api(c: &kube::Client, group: &str, version: &str, kind: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    Api::namespaced_with(c.clone(), NS, &ar)
}

/// Object `name` of `group/version/Kind`, as JSON (None when absent).
async fn get(c: &kube::Client, gvk: (&str, &str, &str), name: &str) -> Option<Value> {
    let (group, version, kind) = gvk;
    api(c, group, version, kind)
        .get_opt(name)
        .await
        .unwrap()
        .map(|o| serde_json::to_value(o).unwrap())
}

const DEPLOYMENT: (&str, &str, &str) = ("apps", "v1", "Deployment");
const CRONJOB: (&str, &str, &str) = ("batch", "v1", "CronJob");
const JOB: (&str, &str, &str) = ("batch", "v1", "Job");
const ROLLOUT: (&str, &str, &str) = ("argoproj.io", "v1alpha1", "Rollout");
const CLONESET: (&str, &str, &str) = ("apps.kruise.io", "v1alpha1", "CloneSet");

/// The annotation recording `hash` in the object's `pointer` (an
/// annotations map), if any.
fn recorded(obj: &Value, pointer: &str, hash: &str) -> Option<String> {
    obj.pointer(pointer)?
        .get(hash_annotation_key(hash))?
        .as_str()
        .map(str::to_string)
}

/// Waits until `gvk/name` records `hash` at `pointer`; returns the object.
async fn wait_recorded(
    c: &kube::Client,
    gvk: (&str, &str, &str),
    name: &str,
    pointer: &str,
    hash: &str,
) -> Value {
    let found = Arc::new(Mutex::new(None));
    eventually(
        WITHIN,
        &format!("{} {name} records {hash} at {pointer}", gvk.2),
        || {
            let found = found.clone();
            async move {
                let Some(obj) = get(c, gvk, name).await else {
                    return false;
                };
                let done = recorded(&obj, pointer, hash).as_deref() == Some(hash);
                *found.lock().unwrap() = Some(obj);
                done
            }
        },
    )
    .await;
    found.lock().unwrap().take().unwrap()
}

const TEMPLATE: &str = "/spec/template/metadata/annotations";
const JOB_TEMPLATE: &str = "/spec/jobTemplate/spec/template/metadata/annotations";
const METADATA: &str = "/metadata/annotations";

fn pod_spec(name: &str, containers: Value) -> Value {
    json!({
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": containers, "restartPolicy": "Never"},
    })
}

fn env_from(cm: &str) -> Value {
    json!([{"name": "app", "image": "example/app:1",
        "envFrom": [{"configMapRef": {"name": cm}}]}])
}

fn generation(obj: &Value) -> i64 {
    obj["metadata"]["generation"].as_i64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_restart_restarts_cronjobs_jobs_rollouts_and_named_only_workloads() {
    let e = test_env(&rollout_restart_manifest("{}"), NS).await;
    let c = &e.client;
    let v1 = [("v", "1")];
    config_map(c, "orders-config", &v1).await;
    let auto = json!({"reloader.stakater.com/auto": "true"});
    apply(
        c,
        json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": NS, "annotations": auto},
            "spec": {"schedule": "0 3 * * *",
                "jobTemplate": {"spec": {"template": pod_spec("nightly", env_from("orders-config"))}}}}),
    )
    .await;
    apply(
        c,
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "migrate", "namespace": NS, "annotations": {
                "reloader.stakater.com/auto": "true", "wasmwatch.io/recreate-job": "true"}},
            "spec": {"template": pod_spec("migrate", env_from("orders-config"))}}),
    )
    .await;
    for (name, annotations) in [
        ("web", auto.clone()),
        (
            "canary",
            json!({"reloader.stakater.com/auto": "true",
                "reloader.stakater.com/rollout-strategy": "restart"}),
        ),
    ] {
        apply(
            c,
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                "metadata": {"name": name, "namespace": NS, "annotations": annotations},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                    "template": pod_spec(name, env_from("orders-config"))}}),
        )
        .await;
    }
    // Names the ConfigMap in Reloader's reload annotation, references nothing.
    let nothing = json!({"containers": [{"name": "app", "image": "example/app:1"}]});
    workload(
        c,
        NS,
        "Deployment",
        "named",
        json!({"configmap.reloader.stakater.com/reload": "orders-.*"}),
        json!({}),
        nothing.clone(),
    )
    .await;
    // Neither references nor names it.
    workload(
        c,
        NS,
        "Deployment",
        "bystander",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({}),
        nothing,
    )
    .await;
    let job_uid = get(c, JOB, "migrate").await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let canary_before = get(c, ROLLOUT, "canary").await.unwrap();
    let r = replica_watching(&e, 9).await;

    let v2 = [("v", "2")];
    set(c, "orders-config", &v2).await;
    let h2 = content_hash("orders-config", &v2);

    // CronJob: recorded on the job template, no Job started.
    let cronjob = wait_recorded(c, CRONJOB, "nightly", JOB_TEMPLATE, &h2).await;
    assert_eq!(generation(&cronjob), 2, "one patch");
    // Job: deleted and created again (a new uid), the content on its template.
    let found = Arc::new(Mutex::new(Value::Null));
    eventually(WITHIN, "Job migrate is re-created with the content", || {
        let found = found.clone();
        let job_uid = job_uid.clone();
        let h2 = h2.clone();
        async move {
            let Some(job) = get(c, JOB, "migrate").await else {
                return false;
            };
            let done = job["metadata"]["uid"].as_str() != Some(job_uid.as_str())
                && recorded(&job, TEMPLATE, &h2).as_deref() == Some(h2.as_str());
            *found.lock().unwrap() = job;
            done
        }
    })
    .await;
    // Rollout: its template.
    let web = wait_recorded(c, ROLLOUT, "web", TEMPLATE, &h2).await;
    assert!(web["spec"].get("restartAt").is_none(), "{web}");
    // Rollout with rollout-strategy restart: spec.restartAt, the content on
    // its own annotations, the template untouched.
    let canary = wait_recorded(c, ROLLOUT, "canary", METADATA, &h2).await;
    assert!(
        canary["spec"]["restartAt"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{canary}"
    );
    assert_eq!(
        canary["spec"]["template"],
        canary_before["spec"]["template"]
    );
    // The named-only Deployment.
    let named = wait_recorded(c, DEPLOYMENT, "named", TEMPLATE, &h2).await;
    assert_eq!(generation(&named), 2);

    // Every restart is done now: the reports say so, and nothing else
    // happened (no Job from the CronJob, the bystander untouched).
    let mut reports = Vec::new();
    eventually(WITHIN, "five restarts reported done", || {
        reports.extend(r.reports());
        let done = reports
            .iter()
            .filter(|x| x["action"]["type"] == "restart" && x["outcome"] == "done")
            .count();
        async move { done >= 5 }
    })
    .await;
    let mut restarted: Vec<&str> = reports
        .iter()
        .filter(|x| x["action"]["type"] == "restart")
        .filter_map(|x| x["action"]["workload"]["name"].as_str())
        .collect();
    restarted.sort();
    assert_eq!(
        restarted,
        ["canary", "migrate", "named", "nightly", "web"],
        "{reports:#?}"
    );
    let jobs = api(c, "batch", "v1", "Job")
        .list(&Default::default())
        .await
        .unwrap();
    let names: Vec<_> = jobs
        .items
        .iter()
        .filter_map(|j| j.metadata.name.clone())
        .collect();
    assert_eq!(names, ["migrate"], "no Job started from the CronJob");
    let bystander = get(c, DEPLOYMENT, "bystander").await.unwrap();
    assert_eq!(generation(&bystander), 1, "{bystander}");
    drop(r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_aware_restarts_only_workloads_using_a_changed_key_or_the_whole_object() {
    let e = test_env(&rollout_restart_manifest("{keyAware: true}"), NS).await;
    let c = &e.client;
    let v1 = [("other", "1"), ("used", "1")];
    config_map(c, "settings", &v1).await;
    let auto = json!({"reloader.stakater.com/auto": "true"});
    workload(
        c,
        NS,
        "Deployment",
        "keyref",
        auto.clone(),
        json!({}),
        json!({"containers": [{"name": "app", "image": "example/app:1",
            "env": [{"name": "USED", "valueFrom":
                {"configMapKeyRef": {"name": "settings", "key": "used"}}}]}]}),
    )
    .await;
    workload(
        c,
        NS,
        "Deployment",
        "whole",
        auto,
        json!({}),
        json!({"containers": [{"name": "app", "image": "example/app:1",
            "envFrom": [{"configMapRef": {"name": "settings"}}]}]}),
    )
    .await;
    let r = replica_watching(&e, 9).await;

    // 1. A key `keyref` does not use: only `whole` restarts.
    let v2 = [("other", "2"), ("used", "1")];
    set(c, "settings", &v2).await;
    let h2 = content_hash("settings", &v2);
    wait_recorded(c, DEPLOYMENT, "whole", TEMPLATE, &h2).await;

    // 2. The key it uses: both restart.
    let v3 = [("other", "2"), ("used", "2")];
    set(c, "settings", &v3).await;
    let h3 = content_hash("settings", &v3);
    wait_recorded(c, DEPLOYMENT, "whole", TEMPLATE, &h3).await;
    let keyref = wait_recorded(c, DEPLOYMENT, "keyref", TEMPLATE, &h3).await;
    // The plugin decides an object's changes in order, so the restart for
    // the first change would have come before: `keyref` rolled once.
    assert_eq!(generation(&keyref), 2, "{keyref}");
    let mut reports = Vec::new();
    eventually(WITHIN, "three restarts reported done", || {
        reports.extend(r.reports());
        let done = reports
            .iter()
            .filter(|x| x["action"]["type"] == "restart" && x["outcome"] == "done")
            .count();
        async move { done >= 3 }
    })
    .await;
    assert!(
        !reports
            .iter()
            .any(|x| x["action"]["workload"]["name"] == "keyref"
                && x["action"]["contentHash"] == h2.as_str()),
        "{reports:#?}"
    );
    drop(r);
}

/// A `wasmwatch run` whose stderr lines are kept, as [`Replica`] with
/// `--print-actions`.
struct Logged {
    replica: Replica,
    stderr: Arc<Mutex<Vec<String>>>,
}

async fn replica_logging(e: &TestEnv, watches: usize) -> Logged {
    replica_logging_with(e, watches, &[]).await
}

/// [`replica_logging`] with extra environment variables.
async fn replica_logging_with(e: &TestEnv, watches: usize, env: &[(&str, &str)]) -> Logged {
    let before = e.server.open_watches();
    let (k, m) = (e.kubeconfig.clone(), e.manifest.clone());
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let lines = stderr.clone();
    let replica = tokio::task::spawn_blocking(move || {
        let mut cmd = run_command(&k, &m, "r", "200ms", "default");
        cmd.env("NO_COLOR", "1").envs(env).stderr(Stdio::piped());
        let (mut child, ready, out) = spawn_ready(&mut cmd, Duration::from_secs(60));
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        Replica {
            identity: "r".into(),
            child,
            admin: admin_addr(&ready),
            lines: out,
        }
    })
    .await
    .unwrap();
    tokio::time::timeout(WITHIN, e.server.wait_for_watches(before + watches))
        .await
        .expect("the watches open");
    Logged { replica, stderr }
}

const BOTH_WORLDS: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: false}
plugins:
  - name: granted
    module: {module:v3-restart}
    sha256: {sha256:v3-restart}
    config: {kind: {group: apps.kruise.io, version: v1alpha1, kind: CloneSet}, name: web}
    events: {kinds: [ConfigMap]}
    capabilities: {restart: {namespaces: [shop], kinds: [apps.kruise.io/v1alpha1/CloneSet]}}
    delivery: {debounce: 0s}
  - name: ungranted
    module: {module:v3-restart}
    sha256: {sha256:v3-restart}
    config: {kind: {group: apps.kruise.io, version: v1alpha1, kind: CloneSet}, name: web}
    events: {kinds: [ConfigMap]}
    capabilities: {restart: {namespaces: [shop], kinds: [Deployment]}}
    delivery: {debounce: 0s}
  - name: js-v2-restart
    module: {module:js/testing/v2-restart}
    sha256: {sha256:js/testing/v2-restart}
    events: {kinds: [ConfigMap]}
    capabilities: {restart: [shop]}
    delivery: {debounce: 0s}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_3_0_plugin_restarts_a_granted_kind_and_a_0_2_0_component_a_deployment() {
    let e = test_env(BOTH_WORLDS, NS).await;
    let c = &e.client;
    let v1 = [("v", "1")];
    config_map(c, "orders-config", &v1).await;
    apply(
        c,
        json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
            "metadata": {"name": "web", "namespace": NS},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": "example/app:1"}]}}}}),
    )
    .await;
    workload(
        c,
        NS,
        "Deployment",
        "api",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({}),
        json!({"containers": env_from("orders-config")}),
    )
    .await;
    let l = replica_logging(&e, 9).await;

    let v2 = [("v", "2")];
    set(c, "orders-config", &v2).await;
    let h2 = content_hash("orders-config", &v2);
    // The 0.3.0 plugin with the grant: the CloneSet's template.
    let web = wait_recorded(c, CLONESET, "web", TEMPLATE, &h2).await;
    assert_eq!(generation(&web), 2, "{web}");
    // The 0.2.0 component: the Deployment, as before.
    let api = wait_recorded(c, DEPLOYMENT, "api", TEMPLATE, &h2).await;
    assert_eq!(generation(&api), 2, "{api}");
    // The 0.3.0 plugin without the grant: refused, naming the kind.
    let stderr = l.stderr.clone();
    eventually(
        WITHIN,
        "the ungranted restart is refused naming the kind",
        || {
            let seen = stderr.lock().unwrap().iter().any(|line| {
                line.contains("refused action")
                    && line.contains("ungranted")
                    && line.contains("kind apps.kruise.io/v1alpha1/CloneSet not granted")
            });
            async move { seen }
        },
    )
    .await;
    // Two restarts done, both reported by the plugin that made them.
    let mut reports = Vec::new();
    eventually(WITHIN, "two restarts reported done", || {
        reports.extend(l.replica.reports());
        let done = reports
            .iter()
            .filter(|x| x["action"]["type"] == "restart" && x["outcome"] == "done")
            .count();
        async move { done >= 2 }
    })
    .await;
    let mut by: Vec<(String, String)> = reports
        .iter()
        .filter(|x| x["action"]["type"] == "restart")
        .map(|x| {
            (
                x["plugin"].as_str().unwrap_or("").to_string(),
                x["action"]["workload"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect();
    by.sort();
    assert_eq!(
        by,
        [
            ("granted".to_string(), "web".to_string()),
            ("js-v2-restart".to_string(), "api".to_string())
        ],
        "{reports:#?}"
    );
    drop(l);
}

/// Argo Rollouts' CRD as its install manifest has it (trimmed to what
/// kube-apiserver requires).
const ROLLOUT_CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: rollouts.argoproj.io
spec:
  group: argoproj.io
  names: {kind: Rollout, listKind: RolloutList, plural: rollouts, singular: rollout, shortNames: [ro]}
  scope: Namespaced
  versions:
    - name: v1alpha1
      served: true
      storage: true
      subresources: {status: {}}
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
";

/// Issue 34 §2: discovery is followed while running. Argo Rollouts' CRD
/// installed (by kubectl) after `wasmwatch run` started: its Rollouts are
/// looked up within the discovery interval (1 s here, 30 s by default) and
/// a change restarts one. The CRD deleted: the Rollouts are dropped with
/// one log line, nothing asks for the kind again but discovery (no watch
/// retried on 404 for ever), and changes go on being handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_installed_while_running_is_used_and_one_deleted_is_dropped() {
    let e = test_env_with(
        wasmwatch_apiserver::Config::default().preinstalled_crds(false),
        &rollout_restart_manifest("{}"),
        NS,
    )
    .await;
    let c = &e.client;
    config_map(c, "cfg", &[("v", "1")]).await;
    workload(
        c,
        NS,
        "Deployment",
        "web",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({}),
        json!({"containers": env_from("cfg")}),
    )
    .await;
    // The lookups' seven built-in kinds and the ConfigMaps.
    let r = replica_logging_with(
        &e,
        8,
        &[
            ("WASMWATCH_DISCOVERY_INTERVAL", "1s"),
            ("RUST_LOG", "warn,wasmwatch_kube::lookups=info"),
        ],
    )
    .await;
    let before = e.server.open_watches();

    e.kubectl(&["apply", "-f", "-"], Some(ROLLOUT_CRD));
    apply(
        c,
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "canary", "namespace": NS,
                "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"selector": {"matchLabels": {"app": "canary"}},
                "template": pod_spec("canary", env_from("cfg"))}}),
    )
    .await;
    tokio::time::timeout(WITHIN, e.server.wait_for_watches(before + 1))
        .await
        .expect("the Rollouts are watched once the CRD is installed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    set(c, "cfg", &[("v", "2")]).await;
    let h2 = content_hash("cfg", &[("v", "2")]);
    wait_recorded(c, ROLLOUT, "canary", TEMPLATE, &h2).await;
    wait_recorded(c, DEPLOYMENT, "web", TEMPLATE, &h2).await;

    e.kubectl(&["delete", "crd", "rollouts.argoproj.io"], None);
    eventually(WITHIN, "the Rollouts' watch ends", || async {
        e.server.open_watches() == before
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    e.server.clear_requests();
    set(c, "cfg", &[("v", "3")]).await;
    let h3 = content_hash("cfg", &[("v", "3")]);
    wait_recorded(c, DEPLOYMENT, "web", TEMPLATE, &h3).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let asked: Vec<_> = e
        .server
        .requests()
        .into_iter()
        .filter(|q| q.group == "argoproj.io")
        .collect();
    assert!(asked.is_empty(), "{asked:?}");
    assert_eq!(e.server.open_watches(), before);
    let logs = r.stderr.lock().unwrap().clone();
    let about: Vec<&String> = logs
        .iter()
        .filter(|l| l.contains("rollouts.argoproj.io"))
        .collect();
    assert_eq!(about.len(), 3, "{logs:#?}");
    assert!(about[0].contains("does not serve"), "{about:?}");
    assert!(about[1].contains("now serves"), "{about:?}");
    assert!(about[2].contains("no longer serves"), "{about:?}");
    drop(r);
}
