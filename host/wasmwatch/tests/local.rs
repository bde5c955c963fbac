//! `wasmwatch local --scripted`, the README's first command in its scripted
//! form: the embedded cluster, two replicas, the shipped example manifest
//! with the bundled plugins; one change must refresh every pod and roll the
//! Deployment.
use std::path::Path;
use std::process::Command;

use wasmwatch_testkit::{plugin, repo_root, sha256_file};

/// The shipped example manifest, with the built plugins copied next to it
/// and pinned (as tests/demo does).
fn example_manifest(dir: &Path, keep: impl Fn(&str) -> bool) -> std::path::PathBuf {
    let mut text =
        std::fs::read_to_string(repo_root().join("deploy/examples/manifest.yaml")).unwrap();
    for name in ["http_refresh", "rollout_restart"] {
        let built = plugin(name);
        std::fs::copy(&built, dir.join(format!("{name}.wasm"))).unwrap();
        text = text.replace(
            &format!("SHA256_OF_{}", name.to_uppercase()),
            &sha256_file(&built),
        );
    }
    // Drop plugin entries the caller does not want (split at "  - name: ").
    let (head, entries) = text.split_once("plugins:\n").unwrap();
    let kept: String = entries
        .split("  - name: ")
        .filter(|e| !e.is_empty() && keep(e.split_whitespace().next().unwrap()))
        .map(|e| format!("  - name: {e}"))
        .collect();
    let text = format!("{head}plugins:\n{kept}");
    let path = dir.join("manifest.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn local(dir: &Path, manifest: &Path, timeout: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
        .args(["local", "--scripted", "--timeout", timeout])
        .args(["--manifest", manifest.to_str().unwrap()])
        .args(["--dir", dir.join("local").to_str().unwrap()])
        .args(["--cache-dir", dir.join("cache").to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn the_scripted_local_run_sees_the_refresh_and_the_rollout_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = example_manifest(dir.path(), |_| true);
    let out = local(dir.path(), &manifest, "60s");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("export KUBECONFIG="), "{stdout}");
    assert!(
        stdout.contains("scripted: ok: 3/3 pods refreshed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("http-refresh: POST /actuator/refresh on every ready pod of Service shop/orders, for ConfigMap shop/orders: done"),
        "the leader prints the refresh as it happens: {stdout}"
    );
    assert!(
        stdout.contains("rollout-restart: rollout restart of Deployment shop/orders"),
        "{stdout}"
    );
    assert!(dir.path().join("local/kubeconfig").exists());
}

#[test]
fn the_scripted_local_run_fails_when_the_refresh_does_not_come() {
    let dir = tempfile::tempdir().unwrap();
    // Without http-refresh nobody refreshes the pods.
    let manifest = example_manifest(dir.path(), |name| name != "http-refresh");
    let out = local(dir.path(), &manifest, "3s");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("scripted: FAILED after 3s: 0/3 pods refreshed"),
        "{stderr}"
    );
}
