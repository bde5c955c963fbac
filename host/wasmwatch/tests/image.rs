//! The image and the single-file installs.
//!
//! - `deploy/image/build` (buildah, FROM scratch) builds the image from this
//!   test's debug binary and the plugins built from plugins/; its config is
//!   checked (user, entrypoint, OCI labels), it is pushed to a loopback
//!   registry (Debian's docker-registry), pulled back from there over the
//!   registry API and its root filesystem unpacked; the binary then runs
//!   from that root (chroot, as the image's user): `validate` of the image's
//!   own pinned manifest, and a short `run` against the test API server that
//!   leads, restarts a workload and stops on SIGTERM. (podman cannot run
//!   containers on these machines: crun's setrlimit is refused.)
//! - `deploy/install.yaml` and `deploy/install-single-namespace.yaml` are what
//!   `deploy/render-install` renders now, and `kubectl apply -f` takes them.
//! - `wasmwatch validate --plugin-dir IMAGE_DIR=LOCAL_DIR` checks the deploy
//!   manifest outside the image.
//!
//! The image test needs root and buildah (tests/prepare installs it); without
//! them it skips with a loud message.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const PLUGIN_DIR: &str = "/usr/lib/wasmwatch/plugins";
const BUNDLED: [&str; 3] = [
    "http_refresh.wasm",
    "bus_refresh.wasm",
    "rollout_restart.wasm",
];
const UID: u32 = 65532;

fn repo_root() -> PathBuf {
    wasmwatch_testkit::repo_root()
}

fn deploy_dir() -> PathBuf {
    repo_root().join("deploy")
}

/// The folder of the plugins built from plugins/ (all of them, the bundled
/// three among them).
fn built_plugins() -> PathBuf {
    wasmwatch_testkit::plugin("http-refresh")
        .parent()
        .unwrap()
        .to_path_buf()
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain(["/usr/sbin".into(), "/usr/bin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn text(out: &Output) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run_ok(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(out.status.success(), "{what} failed: {}", text(&out));
    out
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("a YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

// ------------------------------------------------------------ the image

/// buildah with a private vfs storage under `storage`.
fn buildah(storage: &Path) -> Command {
    let mut cmd = Command::new("buildah");
    cmd.arg("--storage-driver")
        .arg("vfs")
        .arg("--root")
        .arg(storage.join("root"))
        .arg("--runroot")
        .arg(storage.join("run"));
    cmd
}

/// Whether the image test can run here; if not, says so loudly.
fn image_tools() -> bool {
    let missing = if on_path("buildah").is_none() {
        Some("buildah is not installed (Debian package buildah; tests/prepare installs it)")
    } else if !Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
    {
        Some("not root (buildah with vfs storage and the chroot into the image need root)")
    } else if on_path("chroot").is_none() {
        Some("no chroot (coreutils)")
    } else {
        None
    };
    if let Some(why) = missing {
        eprintln!("\n!!!!!!!! SKIPPING the image test: {why} !!!!!!!!\n");
    }
    missing.is_none()
}

/// A GET on the loopback registry (plain HTTP/1.0): status, headers, body.
fn registry_get(host: &str, path: &str, accept: &str) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(host).expect("connect to the registry");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: {accept}\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read the registry's answer");
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    (status, head, buf[split + 4..].to_vec())
}

fn registry_blob(host: &str, repo: &str, digest: &str) -> Vec<u8> {
    let (status, head, body) = registry_get(host, &format!("/v2/{repo}/blobs/{digest}"), "*/*");
    assert_eq!(status, 200, "blob {digest}: {head}");
    assert_eq!(
        format!("sha256:{}", sha256_hex(&body)),
        digest,
        "the blob's content"
    );
    body
}

/// Builds the image, pushes it to a loopback registry, pulls it back over
/// the registry API, unpacks it and runs the binary from its root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_builds_pushes_unpacks_and_runs() {
    if !image_tools() {
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("storage");
    let tag = "localhost/wasmwatch:image-test";
    let revision = "0123456789abcdef0123456789abcdef01234567";
    let source = "https://example.invalid/wasmwatch";
    let plugins = built_plugins();

    // Build (the debug binary: a release build of wasmtime takes ~10 min).
    let built = run_ok(
        Command::new(deploy_dir().join("image/build"))
            .arg("--binary")
            .arg(env!("CARGO_BIN_EXE_wasmwatch"))
            .arg("--plugins")
            .arg(&plugins)
            .args(["--tag", tag, "--revision", revision, "--source", source])
            .arg("--storage")
            .arg(&storage),
        "deploy/image/build",
    );
    let image_id = String::from_utf8_lossy(&built.stdout).trim().to_string();
    assert_eq!(
        image_id.len(),
        64,
        "the image ID on stdout: {}",
        text(&built)
    );
    eprintln!("image built in {:?}", started.elapsed());

    // Its config.
    let inspect = run_ok(
        buildah(&storage).args(["inspect", "--type", "image", tag]),
        "buildah inspect",
    );
    let inspect: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let config = &inspect["OCIv1"]["config"];
    check_config(config, revision, source);
    assert_eq!(inspect["OCIv1"]["os"], "linux");

    // Push to the loopback registry and read it back over the registry API.
    let registry = wasmwatch_testkit::registry::Registry::start();
    let host = registry.host();
    run_ok(
        buildah(&storage).args([
            "push",
            "--quiet",
            "--tls-verify=false",
            tag,
            &format!("docker://{host}/wasmwatch:image-test"),
        ]),
        "buildah push",
    );
    let (status, head, body) = registry_get(
        &host,
        "/v2/wasmwatch/manifests/image-test",
        "application/vnd.oci.image.manifest.v1+json",
    );
    assert_eq!(status, 200, "the pushed manifest: {head}");
    let manifest: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json",
        "{manifest:#}"
    );
    let pushed: Value = serde_json::from_slice(&registry_blob(
        &host,
        "wasmwatch",
        manifest["config"]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    assert_eq!(&pushed["config"], config, "the pushed config");
    let root = dir.path().join("rootfs");
    std::fs::create_dir(&root).unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        let digest = layer["digest"].as_str().unwrap();
        let file = dir.path().join("layer.tar");
        std::fs::write(&file, registry_blob(&host, "wasmwatch", digest)).unwrap();
        run_ok(
            Command::new("tar")
                .args(["--same-owner", "--same-permissions", "-xf"])
                .arg(&file)
                .arg("-C")
                .arg(&root),
            "unpack a layer",
        );
    }
    eprintln!("pushed and unpacked at {:?}", started.elapsed());
    check_root(&root, &plugins);

    // The binary from the image's root: validate the image's manifest.
    let chroot = |args: &[&str]| {
        let mut cmd = Command::new(on_path("chroot").unwrap());
        cmd.arg(format!("--userspec={UID}:{UID}"))
            .arg(&root)
            .arg("/usr/bin/wasmwatch")
            .args(args)
            .env_clear()
            .env("WASMWATCH_CACHE_DIR", "/tmp/cache")
            .env("RUST_LOG", "warn");
        cmd
    };
    let out = run_ok(
        &mut chroot(&["validate", "/etc/wasmwatch/manifest.yaml"]),
        "wasmwatch validate in the image",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for name in ["http-refresh", "bus-refresh", "rollout-restart"] {
        assert!(stdout.contains(name), "validate names {name}: {stdout}");
    }
    // The same manifest outside the image, the plugin folder mapped.
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
            .arg("validate")
            .arg("--plugin-dir")
            .arg(format!(
                "{PLUGIN_DIR}={}",
                root.join(&PLUGIN_DIR[1..]).display()
            ))
            .arg(root.join("etc/wasmwatch/manifest.yaml"))
            .env("WASMWATCH_CACHE_DIR", dir.path().join("cache")),
        "wasmwatch validate --plugin-dir outside the image",
    );
    eprintln!("validated at {:?}", started.elapsed());

    // A short run from the image against the test API server, with the
    // image's manifest: it leads, restarts a Reloader-annotated Deployment
    // when its ConfigMap changes, and stops cleanly on SIGTERM.
    let server = wasmwatch_apiserver::Server::start(wasmwatch_apiserver::Config::default())
        .await
        .expect("start the test API server");
    server
        .write_kubeconfig(root.join("tmp/kubeconfig"))
        .unwrap();
    let client = server.client().unwrap();
    common::namespace(&client, "wasmwatch").await;
    common::namespace(&client, "shop").await;
    common::apply(
        &client,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app-config", "namespace": "shop"},
            "data": {"greeting": "hello"}}),
    )
    .await;
    common::workload(
        &client,
        "shop",
        "Deployment",
        "app",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({}),
        json!({"containers": [{"name": "app", "image": "app",
            "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}),
    )
    .await;
    let generation = || {
        server
            .get("deployments.apps", "shop", "app")
            .and_then(|d| d["metadata"]["generation"].as_i64())
            .unwrap_or(0)
    };
    let before = generation();

    let mut cmd = chroot(&[
        "run",
        "--manifest",
        "/etc/wasmwatch/manifest.yaml",
        "--identity",
        "image-test",
        "--admin-addr",
        "127.0.0.1:0",
        "--print-actions",
    ]);
    cmd.env("KUBECONFIG", "/tmp/kubeconfig")
        .env("POD_NAMESPACE", "wasmwatch");
    let (child, ready, lines) = tokio::task::spawn_blocking(move || {
        common::spawn_ready(&mut cmd, Duration::from_secs(120))
    })
    .await
    .unwrap();
    let mut child = KillOnDrop(child);
    let admin = common::admin_addr(&ready);
    common::eventually(Duration::from_secs(30), "the replica leads", || async {
        common::get(admin, "/leader")
            .await
            .is_some_and(|(_, b)| b.trim() == "true")
    })
    .await;
    // The leader's ConfigMap watch: a change made before it would be the
    // baseline, not a change.
    common::eventually(Duration::from_secs(30), "a ConfigMap watch", || async {
        server
            .requests()
            .iter()
            .any(|r| r.verb == "watch" && r.resource == "configmaps")
    })
    .await;
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), "shop");
    cms.patch(
        "app-config",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"data": {"greeting": "hi"}})),
    )
    .await
    .unwrap();
    // The manifest's debounce is 5 s.
    common::eventually(
        Duration::from_secs(40),
        "the Deployment restarted",
        || async { generation() > before },
    )
    .await;
    // Its report (--print-actions) follows the patch.
    let mut reports = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reports
        .iter()
        .any(|l: &String| l.contains("\"done\"") && l.contains("shop"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::task::block_in_place(|| lines.recv_timeout(left)) {
            Ok(line) => reports.push(line),
            Err(_) => panic!("no done action report: {reports:?}"),
        }
    }
    let pid = child.0.id().to_string();
    run_ok(Command::new("kill").args(["-TERM", &pid]), "kill -TERM");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit within 30 s of SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit after SIGTERM: {status}");
    server.shutdown().await;
    eprintln!("image test done in {:?}", started.elapsed());
}

/// A process killed when the test ends, also when it fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn check_config(config: &Value, revision: &str, source: &str) {
    assert_eq!(config["User"], "65532:65532", "{config:#}");
    assert_eq!(config["Entrypoint"], json!(["/usr/bin/wasmwatch"]));
    assert_eq!(
        config["Cmd"],
        json!(["run", "--manifest", "/etc/wasmwatch/manifest.yaml"])
    );
    assert!(
        config["ExposedPorts"].get("8080/tcp").is_some(),
        "{config:#}"
    );
    let labels = &config["Labels"];
    let label = |k: &str| labels[format!("org.opencontainers.image.{k}")].clone();
    assert_eq!(label("title"), "wasmwatch");
    assert_eq!(label("version"), env!("CARGO_PKG_VERSION"));
    assert_eq!(label("revision"), revision);
    assert_eq!(label("source"), source);
    assert_eq!(label("licenses"), env!("CARGO_PKG_LICENSE"));
    assert!(label("created").as_str().is_some_and(|c| c.ends_with('Z')));
}

fn check_root(root: &Path, plugins: &Path) {
    use std::os::unix::fs::MetadataExt as _;
    let meta = |p: &str| {
        std::fs::symlink_metadata(root.join(p)).unwrap_or_else(|e| panic!("/{p} in the image: {e}"))
    };
    let bin = meta("usr/bin/wasmwatch");
    assert_eq!((bin.uid(), bin.mode() & 0o7777), (0, 0o755));
    let cache = meta("var/cache/wasmwatch");
    assert_eq!((cache.uid(), cache.gid()), (UID, UID));
    assert_eq!(meta("tmp").mode() & 0o7777, 0o1777);

    // No shell, nothing executable but the binary and its libraries.
    for shell in ["bin/sh", "usr/bin/sh", "bin/bash", "bin/busybox"] {
        assert!(!root.join(shell).exists(), "/{shell} in the image");
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
            if m.is_dir() {
                stack.push(e.path());
            } else if m.mode() & 0o111 != 0 {
                let name = rel.file_name().unwrap().to_string_lossy().into_owned();
                assert!(
                    rel == Path::new("usr/bin/wasmwatch") || name.contains(".so"),
                    "executable /{} in the image",
                    rel.display()
                );
            }
        }
    }

    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with(&format!("wasmwatch:x:{UID}:{UID}:"))),
        "{passwd}"
    );
    let group = std::fs::read_to_string(root.join("etc/group")).unwrap();
    assert!(group.contains(&format!("wasmwatch:x:{UID}:")), "{group}");

    // The plugins, their sums, and the image's manifest pinned with them.
    let sums = std::fs::read_to_string(root.join(&PLUGIN_DIR[1..]).join("SHA256SUMS")).unwrap();
    let manifest = std::fs::read_to_string(root.join("etc/wasmwatch/manifest.yaml")).unwrap();
    let manifest: Value = serde_yaml::from_str(&manifest).unwrap();
    for b in BUNDLED {
        let shipped = std::fs::read(root.join(&PLUGIN_DIR[1..]).join(b)).unwrap();
        assert_eq!(
            shipped,
            std::fs::read(plugins.join(b)).unwrap(),
            "{b} is the built plugin"
        );
        let digest = sha256_hex(&shipped);
        assert!(
            sums.lines().any(|l| l == format!("{digest}  {b}")),
            "SHA256SUMS lists {b}: {sums}"
        );
        let entry = manifest["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["module"] == format!("{PLUGIN_DIR}/{b}"))
            .unwrap_or_else(|| panic!("the image's manifest names {b}"));
        assert_eq!(
            entry["sha256"], digest,
            "{b} pinned in the image's manifest"
        );
    }
}

// ------------------------------------------------- the single-file installs

const INSTALLS: [(&str, &str); 2] = [
    ("install.yaml", "cluster-wide"),
    ("install-single-namespace.yaml", "single-namespace"),
];

fn kubectl() -> Option<PathBuf> {
    let k = on_path("kubectl");
    if k.is_none() {
        eprintln!(
            "\n!!!!!!!! SKIPPING: kubectl is not installed (Debian package kubernetes-client; tests/prepare installs it) !!!!!!!!\n"
        );
    }
    k
}

/// deploy/install*.yaml are what deploy/render-install makes of the
/// overlays now: change deploy/base or an overlay, and this fails until the
/// files are rendered again.
#[test]
fn the_install_files_are_up_to_date() {
    let Some(kubectl) = kubectl() else { return };
    let dir = tempfile::tempdir().unwrap();
    run_ok(
        Command::new(deploy_dir().join("render-install"))
            .arg("--out-dir")
            .arg(dir.path())
            .env("KUBECTL", &kubectl),
        "deploy/render-install",
    );
    for (file, overlay) in INSTALLS {
        let committed = std::fs::read_to_string(deploy_dir().join(file))
            .unwrap_or_else(|e| panic!("deploy/{file}: {e}; run deploy/render-install"));
        let fresh = std::fs::read_to_string(dir.path().join(file)).unwrap();
        let (committed, fresh) = (
            common::normalised_objects(&yaml_documents(&committed)),
            common::normalised_objects(&yaml_documents(&fresh)),
        );
        assert_eq!(
            committed.keys().collect::<Vec<_>>(),
            fresh.keys().collect::<Vec<_>>(),
            "deploy/{file} is out of date with deploy/overlays/{overlay}: run deploy/render-install"
        );
        for (key, object) in &fresh {
            assert_eq!(
                &committed[key], object,
                "deploy/{file}: {key} is out of date with deploy/overlays/{overlay}: run deploy/render-install"
            );
        }
    }
}

/// Whether the server serves `apiVersion`/`kind`.
async fn served(client: &kube::Client, api_version: &str, kind: &str) -> bool {
    let list = if api_version.contains('/') {
        client.list_api_group_resources(api_version).await
    } else {
        client.list_core_api_resources(api_version).await
    };
    list.is_ok_and(|l| l.resources.iter().any(|r| r.kind == kind))
}

/// `kubectl apply -f deploy/install*.yaml` against the test API server
/// (twice: an upgrade with nothing changed), leaving out the kinds the
/// server does not serve (RBAC, PodDisruptionBudget, ServiceAccount:
/// host/wasmwatch/tests/deploy.rs checks those against what the host does).
#[tokio::test]
async fn the_install_files_apply_with_kubectl() {
    let Some(kubectl) = kubectl() else { return };
    for (file, _) in INSTALLS {
        let server = wasmwatch_apiserver::Server::start(wasmwatch_apiserver::Config::default())
            .await
            .expect("start the test API server");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let client = server.client().unwrap();
        let install = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
        let mut kept = Vec::new();
        let mut skipped = Vec::new();
        for o in yaml_documents(&install) {
            let (v, k) = (
                o["apiVersion"].as_str().unwrap().to_string(),
                o["kind"].as_str().unwrap().to_string(),
            );
            if served(&client, &v, &k).await {
                kept.push(serde_yaml::to_string(&o).unwrap());
            } else {
                skipped.push(k);
            }
        }
        let filtered = dir.path().join(file);
        std::fs::write(&filtered, kept.join("---\n")).unwrap();
        for round in ["first", "again"] {
            let (k, kc, f) = (kubectl.clone(), kubeconfig.clone(), filtered.clone());
            let out = tokio::task::spawn_blocking(move || {
                Command::new(k)
                    .arg("--kubeconfig")
                    .arg(&kc)
                    .arg("--cache-dir")
                    .arg(kc.with_file_name("cache"))
                    .arg("apply")
                    .arg("-f")
                    .arg(&f)
                    .env_remove("KUBECONFIG")
                    .stdin(Stdio::null())
                    .output()
                    .unwrap()
            })
            .await
            .unwrap();
            assert!(
                out.status.success(),
                "kubectl apply -f {file} ({round}): {}",
                text(&out)
            );
            eprintln!(
                "{file} ({round}): {}skipped (not served by the test server): {skipped:?}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let deployment = server
            .get("deployments.apps", "wasmwatch", "wasmwatch")
            .unwrap_or_else(|| panic!("{file}: no Deployment wasmwatch/wasmwatch"));
        let volumes = deployment["spec"]["template"]["spec"]["volumes"].to_string();
        let (cms, _) = server.snapshot("configmaps").unwrap();
        let manifest_cm = cms
            .iter()
            .filter_map(|c| c["metadata"]["name"].as_str())
            .find(|n| n.starts_with("wasmwatch-manifest-"))
            .unwrap_or_else(|| panic!("{file}: no manifest ConfigMap"));
        assert!(
            volumes.contains(manifest_cm),
            "{file}: the Deployment mounts {manifest_cm}: {volumes}"
        );
        assert!(
            server.get("services", "wasmwatch", "wasmwatch").is_some(),
            "{file}: Service"
        );
        server.shutdown().await;
    }
}

// ---------------------------------------- validate outside the image

/// A copy of the deploy manifest in `dir`, pinned to the plugins built in
/// `plugins` (its modules still named under the image's folder).
fn pinned_deploy_manifest(dir: &Path, plugins: &Path) -> PathBuf {
    let manifest = dir.join("deploy-manifest.yaml");
    std::fs::copy(deploy_dir().join("base/manifest.yaml"), &manifest).unwrap();
    run_ok(
        Command::new(deploy_dir().join("pin-plugins"))
            .arg("--dir")
            .arg(plugins)
            .arg(&manifest),
        "deploy/pin-plugins",
    );
    manifest
}

/// The deploy manifest names its modules under /usr/lib/wasmwatch/plugins,
/// as in the image; `--plugin-dir` reads them from a local folder.
#[test]
fn validate_maps_the_image_plugin_folder_to_a_local_one() {
    let plugins = built_plugins();
    let dir = tempfile::tempdir().unwrap();
    let manifest = pinned_deploy_manifest(dir.path(), &plugins);
    let validate = |args: &[String], cwd: &Path| {
        Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
            .arg("validate")
            .args(args)
            .arg(&manifest)
            .current_dir(cwd)
            .env(
                "WASMWATCH_CACHE_DIR",
                wasmwatch_testkit::artifact_cache_dir(),
            )
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    };

    // Without the mapping the modules are not there.
    let out = validate(&[], dir.path());
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(PLUGIN_DIR), "{}", text(&out));

    // Mapped to the local folder, absolute or relative to the current folder.
    let absolute = format!("{PLUGIN_DIR}={}", plugins.display());
    let cwd = plugins.parent().unwrap();
    let relative = format!(
        "{PLUGIN_DIR}={}",
        plugins.file_name().unwrap().to_string_lossy()
    );
    for (arg, cwd) in [(&absolute, dir.path()), (&relative, cwd)] {
        let out = validate(&["--plugin-dir".into(), arg.clone()], cwd);
        assert!(out.status.success(), "--plugin-dir {arg}: {}", text(&out));
        assert!(
            text(&out).contains(&plugins.join("http_refresh.wasm").display().to_string()),
            "validate names the module it read: {}",
            text(&out)
        );
    }

    // A mapping no module is under is pointed out; a malformed one refused.
    let out = validate(
        &[
            "--plugin-dir".into(),
            absolute.clone(),
            "--plugin-dir".into(),
            "/opt/plugins=/tmp".into(),
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/opt/plugins"),
        "{}",
        text(&out)
    );
    let out = validate(&["--plugin-dir".into(), "plugins".into()], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("IMAGE_DIR=LOCAL_DIR"),
        "{}",
        text(&out)
    );
}

/// `run --plugin-dir` runs the install's manifest outside the image: without
/// the mapping it stops at the first module, naming the image's folder;
/// with it, every plugin loads and the replica gets ready (issue 34).
/// (Threads: the test API server answers while this one waits for the
/// process.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_maps_the_image_plugin_folder_to_a_local_one() {
    let plugins = built_plugins();
    let env = common::test_env("plugins: []\n", "wasmwatch").await;
    let manifest = pinned_deploy_manifest(env.dir.path(), &plugins);
    let named = std::fs::read_to_string(&manifest)
        .unwrap()
        .matches("module:")
        .count();
    assert!(named > 0);

    let out = common::run_command(&env.kubeconfig, &manifest, "r0", "2s", "wasmwatch")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(PLUGIN_DIR),
        "{}",
        text(&out)
    );

    let mut cmd = common::run_command(&env.kubeconfig, &manifest, "r0", "2s", "wasmwatch");
    cmd.arg("--plugin-dir")
        .arg(format!("{PLUGIN_DIR}={}", plugins.display()));
    let (mut child, ready, _) = common::spawn_ready(&mut cmd, Duration::from_secs(120));
    assert_eq!(ready["plugins"], named, "{ready}");
    child.kill().unwrap();
    let _ = child.wait();
}
