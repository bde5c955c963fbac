//! `wasmwatch run --dry-run` as a process against the test API server: real
//! watches, a real plugin, decisions printed as JSON lines.
mod common;

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use wasmwatch_apiserver::{Config, Server};
use wasmwatch_testkit::pin;

fn cm(name: &str, labels: serde_json::Value, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels}, "data": {"v": value}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_shows_what_the_plugins_decide_for_each_selected_change() {
    let server = Server::start(Config::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let manifest = dir.path().join("manifest.yaml");
    std::fs::write(
        &manifest,
        pin("apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {namespaces: [default]}
plugins:
  - name: seen
    module: {module:misbehave}
    sha256: {sha256:misbehave}
    config: {mode: ok}
    events: {kinds: [ConfigMap], labelSelector: watch=me}
    capabilities: {events: true}
"),
    )
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(server.client().unwrap(), "default");
    api.create(
        &PostParams::default(),
        &cm("a", serde_json::json!({"watch": "me"}), "1"),
    )
    .await
    .unwrap();

    let (mut child, ready, lines_rx) = common::spawn_ready(
        Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
            .args(["run", "--dry-run", "--manifest", manifest.to_str().unwrap()])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn"),
        Duration::from_secs(30),
    );
    assert_eq!(ready["watches"], 2, "ConfigMaps and Secrets in `default`");
    server.wait_for_watches(2).await;

    // Baseline delivered nothing; now: a selected modification, an
    // unselected creation, a selected creation.
    let mut a = api.get("a").await.unwrap();
    a.data.as_mut().unwrap().insert("v".into(), "2".into());
    api.replace("a", &PostParams::default(), &a).await.unwrap();
    api.create(&PostParams::default(), &cm("b", serde_json::json!({}), "1"))
        .await
        .unwrap();
    api.create(
        &PostParams::default(),
        &cm("c", serde_json::json!({"watch": "me"}), "1"),
    )
    .await
    .unwrap();

    let mut seen = Vec::new();
    while seen.len() < 2 {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a decision line");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["decision"]["plugin"], "seen", "{line}");
        let action = &v["decision"]["actions"][0];
        assert_eq!(action["verdict"], "allowed", "{line}");
        seen.push((
            v["object"].as_str().unwrap().to_string(),
            v["change"].as_str().unwrap().to_string(),
        ));
        assert_eq!(action["action"]["message"], v["object"], "{line}");
    }
    assert_eq!(
        seen,
        vec![
            ("default/a".to_string(), "modified".to_string()),
            ("default/c".to_string(), "added".to_string())
        ],
        "b is not selected by the plugin's label selector"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn run_with_a_missing_manifest_names_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
        .args(["run", "--manifest", "/nonexistent.yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent.yaml"), "{err}");
}
