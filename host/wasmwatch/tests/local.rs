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

/// kubectl, an independent client, against the local run (not scripted):
/// after the README's patch, `kubectl get events,cm,deploy,lease` shows
/// the columns a real cluster's API server gives it (Table responses).
#[test]
fn kubectl_get_shows_a_clusters_columns_against_the_local_run() {
    use std::io::{BufRead, BufReader};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let manifest = example_manifest(dir.path(), |_| true);
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
        .args(["local", "--manifest", manifest.to_str().unwrap()])
        .args(["--dir", dir.path().join("local").to_str().unwrap()])
        .args(["--cache-dir", dir.path().join("cache").to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let _stop = Stop(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("export KUBECONFIG=") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("the local run did not print its kubeconfig");
    let kubeconfig = dir.path().join("local/kubeconfig");
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .expect("run kubectl (tests/prepare installs it)");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    kubectl(&[
        "-n",
        "shop",
        "patch",
        "configmap",
        "orders",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"greeting":"hi"}}"#,
    ]);
    let start = Instant::now();
    let events = loop {
        let events = kubectl(&["-n", "shop", "get", "events"]);
        if ["Refreshed", "Restarted", "Reloaded"]
            .iter()
            .all(|r| events.contains(r))
            || start.elapsed() > Duration::from_secs(60)
        {
            break events;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let header = |table: &str, columns: &[&str]| {
        let first = table.lines().next().unwrap_or("");
        let names: Vec<&str> = first.split_whitespace().collect();
        assert_eq!(names, columns, "{table}");
    };
    header(
        &events,
        &["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
    );
    let refreshed = events
        .lines()
        .find(|l| l.contains("Refreshed"))
        .unwrap_or_else(|| panic!("no Refreshed event: {events}"));
    assert!(
        refreshed.contains("Normal") && refreshed.contains("configmap/orders"),
        "{events}"
    );
    let all = kubectl(&["get", "events,cm,deploy,lease", "-A"]);
    let tables: Vec<&str> = all.split("\n\n").collect();
    assert_eq!(tables.len(), 4, "{all}");
    header(
        tables[0],
        &[
            "NAMESPACE",
            "LAST",
            "SEEN",
            "TYPE",
            "REASON",
            "OBJECT",
            "MESSAGE",
        ],
    );
    header(tables[1], &["NAMESPACE", "NAME", "DATA", "AGE"]);
    header(
        tables[2],
        &[
            "NAMESPACE",
            "NAME",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "AGE",
        ],
    );
    let deploy: Vec<&str> = tables[2]
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        &deploy[..5],
        ["shop", "deployment.apps/orders", "3/3", "3", "3"],
        "{all}"
    );
    header(tables[3], &["NAMESPACE", "NAME", "HOLDER", "AGE"]);
    let leader = tables[3]
        .lines()
        .find(|l| l.contains("wasmwatch-leader"))
        .unwrap_or_else(|| panic!("no leader Lease: {all}"));
    assert!(
        leader.contains("wasmwatch-0") || leader.contains("wasmwatch-1"),
        "{all}"
    );
}
