//! Issue 34 §4, end to end: `wasmwatch run --webhook-addr ...
//! --webhook-generate-cert` against the test API server, which calls
//! mutating webhooks as kube-apiserver does (HTTPS, the caBundle,
//! objectSelector, failurePolicy).
//! - wasmwatch generates its CA and certificate, keeps them in a Secret and
//!   writes the CA into the MutatingWebhookConfiguration;
//! - a change restarts a Deployment (its records on the pod template); a
//!   `kubectl replace` of the Deployment from its file (what a GitOps tool
//!   does, without the records) keeps the records and rolls nothing;
//! - with wasmwatch down and `failurePolicy: Ignore`, the replace goes
//!   through (the records go, and the Deployment rolls once, as without the
//!   webhook).
mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use wasmwatch_core::digest::data_digest;

const NS: &str = "shop";
const WITHIN: Duration = Duration::from_secs(30);

const MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {kinds: [ConfigMap], namespaces: [shop]}
ha: {enabled: false}
plugins:
  - name: rollout-restart
    module: {module:rollout-restart}
    sha256: {sha256:rollout-restart}
    events: {kinds: [ConfigMap]}
    capabilities: {restart: [shop]}
    delivery: {debounce: 0s}
";

/// The Deployment as git has it: opted in, no records.
const WEB: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
  labels: {app: web, wasmwatch.io/webhook: enabled}
  annotations: {reloader.stakater.com/auto: \"true\"}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
        - name: app
          image: example/app:1
          envFrom: [{configMapRef: {name: cfg}}]
";

async fn free_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// (generation, pod-template annotations) of `web`.
async fn web(c: &kube::Client) -> (i64, Value) {
    let api: Api<Deployment> = Api::namespaced(c.clone(), NS);
    let d = serde_json::to_value(api.get("web").await.unwrap()).unwrap();
    (
        d["metadata"]["generation"].as_i64().unwrap(),
        d.pointer("/spec/template/metadata/annotations")
            .cloned()
            .unwrap_or(json!({})),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replace_without_the_records_keeps_them_and_rolls_nothing() {
    let e = test_env(MANIFEST, NS).await;
    let c = &e.client;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), NS);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"v": "1"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let file = e.dir.path().join("web.yaml");
    std::fs::write(&file, WEB).unwrap();
    let file = file.to_str().unwrap().to_string();
    e.kubectl(&["create", "-f", &file], None);

    // The webhook as deploy/overlays/webhook has it, at a loopback URL
    // (no caBundle: wasmwatch writes it).
    let port = free_port().await;
    let configs: Api<MutatingWebhookConfiguration> = Api::all(c.clone());
    let config = serde_json::from_value(json!({
        "metadata": {"name": "wasmwatch"},
        "webhooks": [{
            "name": "restore.wasmwatch.io",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/mutate")},
            "rules": [{"operations": ["UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"],
                "resources": ["deployments", "statefulsets", "daemonsets"], "scope": "Namespaced"}],
            "objectSelector": {"matchLabels": {"wasmwatch.io/webhook": "enabled"}},
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5
        }]
    }))
    .unwrap();
    configs
        .create(&PostParams::default(), &config)
        .await
        .unwrap();

    let addr = format!("127.0.0.1:{port}");
    let before = e.server.open_watches();
    let (k, m) = (e.kubeconfig.clone(), e.manifest.clone());
    let replica = tokio::task::spawn_blocking(move || {
        let mut cmd = run_command(&k, &m, "r", "200ms", "default");
        cmd.args(["--webhook-addr", &addr, "--webhook-generate-cert"])
            .args(["--webhook-dns-name", "127.0.0.1"]);
        Replica::spawn(&mut cmd, "r", Duration::from_secs(60))
    })
    .await
    .unwrap();
    // The lookups' eight watches and the ConfigMaps'.
    tokio::time::timeout(WITHIN, e.server.wait_for_watches(before + 9))
        .await
        .expect("the watches open");
    // The CA is kept in a Secret and written into the configuration.
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "default");
    eventually(WITHIN, "the generated certificate's Secret", || async {
        secrets
            .get_opt("wasmwatch-webhook-tls")
            .await
            .unwrap()
            .is_some()
    })
    .await;
    let secret = secrets.get("wasmwatch-webhook-tls").await.unwrap();
    let ca = secret.data.unwrap()["ca.crt"].clone();
    eventually(WITHIN, "the caBundle written", || async {
        let config = configs.get("wasmwatch").await.unwrap();
        config.webhooks.unwrap()[0].client_config.ca_bundle.as_ref() == Some(&ca)
    })
    .await;

    // A change restarts the Deployment: its records on the template.
    let (g0, _) = web(c).await;
    cms.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"v": "2"}})),
    )
    .await
    .unwrap();
    let data2 = [("v".to_string(), wasmwatch_core::DataValue::Text("2".into()))].into();
    let hash = format!("configmap/cfg:{}", data_digest(&data2, None));
    let key = "config-hash.wasmwatch.io/configmap.cfg";
    eventually(WITHIN, "the restart for v2", || async {
        web(c).await.1.get(key) == Some(&json!(hash))
    })
    .await;
    let (g1, records) = web(c).await;
    assert_eq!(g1, g0 + 1);
    assert!(records.get("kubectl.kubernetes.io/restartedAt").is_some());

    // GitOps replaces it from git: the records stay, nothing rolls.
    e.kubectl(&["replace", "-f", &file], None);
    let (g2, after) = web(c).await;
    assert_eq!((g2, &after), (g1, &records), "kept as it was");
    let calls: Vec<_> = e
        .server
        .webhook_calls()
        .into_iter()
        .filter(|call| call.name == "web")
        .collect();
    assert!(!calls.is_empty(), "the webhook was called");

    // Down, with failurePolicy Ignore: the replace goes through, as
    // without a webhook.
    drop(replica);
    e.kubectl(&["replace", "-f", &file], None);
    let (g3, dropped) = web(c).await;
    assert_eq!(g3, g1 + 1, "{dropped}");
    assert!(dropped.get(key).is_none(), "{dropped}");
}
