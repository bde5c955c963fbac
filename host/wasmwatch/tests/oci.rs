//! Plugins from an OCI registry, end to end through the `wasmwatch` binary
//! against a real registry (the CNCF distribution registry, started on
//! loopback per test): push, pull, cache reuse without the registry, digest
//! mismatch, registry down, basic auth.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use wasmwatch_testkit::registry::{FakeRegistry, Misbehaviour, Registry};
use wasmwatch_testkit::{plugin, repo_root, sha256_file};

/// Runs `wasmwatch` with `args` and the given environment, nothing else
/// from the caller's registry settings.
fn wasmwatch_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasmwatch"));
    cmd.args(args).env("RUST_LOG", "warn");
    for var in [
        "WASMWATCH_CACHE_DIR",
        "WASMWATCH_INSECURE_REGISTRIES",
        "WASMWATCH_REGISTRY_CA_FILE",
        "WASMWATCH_REGISTRY_CONFIG",
        "WASMWATCH_REGISTRY_USERNAME",
        "WASMWATCH_REGISTRY_PASSWORD",
        "WASMWATCH_PULL_TIMEOUT",
    ] {
        cmd.env_remove(var);
    }
    // No ~/.docker/config.json of whoever runs the tests.
    cmd.env("DOCKER_CONFIG", "/nonexistent");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run wasmwatch")
}

fn wasmwatch(args: &[&str]) -> Output {
    wasmwatch_env(args, &[])
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What `plugin push` printed to pin: (`module:`, `sha256:`).
fn pushed_pin(out: &Output) -> (String, String) {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "push failed: {}{stdout}",
        text(&out.stderr)
    );
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} line in {stdout}"))
            .trim()
            .to_string()
    };
    (field("module:"), field("sha256:"))
}

fn push(registry: &Registry, crate_name: &str, repository_and_tag: &str) -> (String, String) {
    let file = plugin(crate_name);
    let reference = registry.reference(repository_and_tag);
    let out = wasmwatch(&[
        "plugin",
        "push",
        file.to_str().unwrap(),
        &reference,
        "--insecure-registry",
        &registry.host(),
    ]);
    pushed_pin(&out)
}

fn manifest(dir: &Path, module: &str, sha256: &str) -> PathBuf {
    let path = dir.join("manifest.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
plugins:
  - name: http-refresh
    module: {module}
    sha256: {sha256}
    events: {{kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}}
    capabilities: {{refresh: [shop]}}
"
        ),
    )
    .unwrap();
    path
}

fn plugin_run(m: &Path, cache: &Path, extra: &[&str]) -> Output {
    let fixtures = repo_root().join("tests/fixtures");
    let mut args = vec![
        "plugin",
        "run",
        "--manifest",
        m.to_str().unwrap(),
        "--plugin",
        "http-refresh",
        "--event",
    ];
    let event = fixtures.join("orders-configmap.yaml");
    let lookups = fixtures.join("shop-lookups.yaml");
    args.push(event.to_str().unwrap());
    args.extend(["--lookups", lookups.to_str().unwrap()]);
    args.extend(["--cache-dir", cache.to_str().unwrap()]);
    args.extend(extra);
    wasmwatch(&args)
}

/// The refresh the plugin decides for the fixture event.
fn assert_refreshes_orders(out: &Output) {
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["plugin"], "http-refresh");
    assert_eq!(json["actions"][0]["action"]["service"], "orders", "{json}");
    assert_eq!(json["actions"][0]["verdict"], "allowed", "{json}");
}

fn requests(registry: &Registry) -> usize {
    registry.log().matches("HTTP/1.1\"").count()
}

#[test]
fn push_then_pull_then_run_from_the_cache_without_the_registry() {
    let mut registry = Registry::start();
    let file = plugin("http-refresh");
    let (module, sha256) = push(&registry, "http-refresh", "plugins/http-refresh:1.0");
    assert_eq!(module, registry.reference("plugins/http-refresh:1.0"));
    assert_eq!(
        sha256,
        sha256_file(&file),
        "the pin is the component's sha256"
    );

    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let m = manifest(dir.path(), &module, &sha256);
    let host = registry.host();
    let validate = || {
        wasmwatch(&[
            "validate",
            m.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
            "--insecure-registry",
            &host,
        ])
    };

    // First: pulled, verified, cached.
    let started = Instant::now();
    let out = validate();
    let cold = started.elapsed();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let cached = cache.join("oci/sha256").join(format!("{sha256}.wasm"));
    assert!(
        stdout.contains(&format!(
            "plugin http-refresh: ok ({module}, pulled to {})",
            cached.display()
        )),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read(&cached).unwrap(),
        std::fs::read(&file).unwrap()
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for d in [cache.join("oci"), cache.join("oci/sha256")] {
            let mode = std::fs::metadata(&d).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", d.display());
        }
        let mode = std::fs::metadata(&cached).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    // Later runs take the cached copy and do not contact the registry,
    // even while it is up.
    let before = requests(&registry);
    assert!(
        before > 0,
        "the access log counts requests: {}",
        registry.log()
    );
    let started = Instant::now();
    let out = validate();
    let warm = started.elapsed();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("cached at"),
        "{}",
        text(&out.stdout)
    );
    assert_refreshes_orders(&plugin_run(&m, &cache, &["--insecure-registry", &host]));
    assert_eq!(requests(&registry), before, "{}", registry.log());
    eprintln!(
        "validate with a pull: {} ms; from the cache: {} ms",
        cold.as_millis(),
        warm.as_millis()
    );

    // And with the registry gone.
    registry.stop();
    let out = validate();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_refreshes_orders(&plugin_run(&m, &cache, &["--insecure-registry", &host]));

    // `plugin run` pulls by itself too, into an empty cache.
    registry.resume();
    let fresh = dir.path().join("fresh");
    assert_refreshes_orders(&plugin_run(&m, &fresh, &["--insecure-registry", &host]));
    assert!(
        fresh
            .join("oci/sha256")
            .join(format!("{sha256}.wasm"))
            .is_file()
    );
}

#[test]
fn a_pin_by_registry_digest_pulls_the_same_component() {
    let registry = Registry::start();
    let file = plugin("http-refresh");
    let out = wasmwatch(&[
        "plugin",
        "push",
        file.to_str().unwrap(),
        &registry.reference("plugins/http-refresh:1.0"),
        "--insecure-registry",
        &registry.host(),
    ]);
    let (_, sha256) = pushed_pin(&out);
    let stdout = text(&out.stdout);
    let by_digest = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("#   module: "))
        .unwrap_or_else(|| panic!("no digest reference in {stdout}"));
    assert!(by_digest.contains("@sha256:"), "{by_digest}");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let m = manifest(dir.path(), by_digest, &sha256);
    let out = wasmwatch(&[
        "validate",
        m.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--insecure-registry",
        &registry.host(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("pulled to"));
}

#[test]
fn a_digest_mismatch_is_refused_and_nothing_is_cached_or_run() {
    let registry = Registry::start();
    let (module, good) = push(&registry, "http-refresh", "plugins/refresh:1");
    // Pinned to other content than the registry holds.
    let wrong = sha256_file(&plugin("rollout-restart"));
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let m = manifest(dir.path(), &module, &wrong);
    let out = plugin_run(&m, &cache, &["--insecure-registry", &registry.host()]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing ran: {}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains("plugin http-refresh")
            && err.contains(&module)
            && err.contains("digest mismatch")
            && err.contains(&good)
            && err.contains(&wrong),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    let stored = cache.join("oci/sha256");
    assert!(
        !stored.exists() || std::fs::read_dir(&stored).unwrap().next().is_none(),
        "nothing cached"
    );

    // A tag moved to other content: the pin refuses it on a fresh pull; a
    // cache that holds the pinned copy keeps running it.
    let m = manifest(dir.path(), &module, &good);
    let warm = dir.path().join("warm");
    let host = registry.host();
    let validate = |cache: &Path| {
        wasmwatch(&[
            "validate",
            m.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
            "--insecure-registry",
            &host,
        ])
    };
    assert!(validate(&warm).status.success());
    push(&registry, "rollout-restart", "plugins/refresh:1");
    let out = validate(&dir.path().join("cold"));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("digest mismatch"),
        "{}",
        text(&out.stderr)
    );
    let out = validate(&warm);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn registry_down_without_a_cached_copy_is_one_clear_error() {
    let mut registry = Registry::start();
    let (module, sha256) = push(&registry, "http-refresh", "plugins/refresh:1");
    registry.stop();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let m = manifest(dir.path(), &module, &sha256);
    let started = Instant::now();
    let out = wasmwatch(&[
        "validate",
        m.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--insecure-registry",
        &registry.host(),
    ]);
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("error: plugin http-refresh: cannot pull ")
            && err.contains(&module)
            && err.contains("Connection refused"),
        "{err}"
    );
    assert!(!out.stdout.starts_with(b"plugin"), "nothing loaded");

    // The service stops before it starts anything (no cluster needed to
    // see it: the modules are resolved first).
    let out = wasmwatch(&[
        "run",
        "--manifest",
        m.to_str().unwrap(),
        "--admin-addr",
        "127.0.0.1:0",
        "--cache-dir",
        cache.to_str().unwrap(),
        "--insecure-registry",
        &registry.host(),
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("plugin http-refresh: cannot pull") && err.contains("Connection refused"),
        "{err}"
    );

    // Plain HTTP is only for registries listed as insecure.
    registry.resume();
    let out = wasmwatch(&[
        "validate",
        m.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("--insecure-registry {}", registry.host())),
        "{err}"
    );
}

#[test]
fn basic_auth_takes_the_right_credentials_and_refuses_others_clearly() {
    let registry = Registry::with_basic_auth("alice", "s3cret");
    let file = plugin("http-refresh");
    let reference = registry.reference("team/refresh:2");
    let host = registry.host();
    let dir = tempfile::tempdir().unwrap();
    let push_args = [
        "plugin",
        "push",
        file.to_str().unwrap(),
        reference.as_str(),
        "--insecure-registry",
        host.as_str(),
    ];

    // No credentials.
    let out = wasmwatch(&push_args);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&reference) && err.contains("refused anonymous access"),
        "{err}"
    );

    // Wrong ones, from a docker config.json (as an imagePullSecret holds it).
    let wrong = dir.path().join("wrong.json");
    std::fs::write(
        &wrong,
        format!(r#"{{"auths": {{"{host}": {{"username": "alice", "password": "wrong"}}}}}}"#),
    )
    .unwrap();
    let mut args = push_args.to_vec();
    args.extend(["--registry-config", wrong.to_str().unwrap()]);
    let out = wasmwatch(&args);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(r#"refused user "alice" from"#) && err.contains("wrong.json"),
        "{err}"
    );
    assert!(!err.contains("wrong\""), "no password in messages: {err}");

    // The right ones from the environment.
    let out = wasmwatch_env(
        &push_args,
        &[
            ("WASMWATCH_REGISTRY_USERNAME", "alice"),
            ("WASMWATCH_REGISTRY_PASSWORD", "s3cret"),
        ],
    );
    let (module, sha256) = pushed_pin(&out);

    // Pull with $DOCKER_CONFIG/config.json (`auth`: base64 of alice:s3cret).
    let docker = dir.path().join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    std::fs::write(
        docker.join("config.json"),
        format!(r#"{{"auths": {{"http://{host}": {{"auth": "YWxpY2U6czNjcmV0"}}}}}}"#),
    )
    .unwrap();
    let m = manifest(dir.path(), &module, &sha256);
    let validate = |cache: &str, env: &[(&str, &str)], extra: &[&str]| {
        let mut args = vec![
            "validate",
            m.to_str().unwrap(),
            "--cache-dir",
            cache,
            "--insecure-registry",
            &host,
        ];
        args.extend(extra);
        wasmwatch_env(&args, env)
    };
    let cache = dir.path().join("cache");
    let out = validate(
        cache.to_str().unwrap(),
        &[("DOCKER_CONFIG", docker.to_str().unwrap())],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("pulled to"));

    // Without credentials, or with wrong ones, a fresh cache gets nothing.
    let other = dir.path().join("other");
    let out = validate(other.to_str().unwrap(), &[], &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("plugin http-refresh")
            && err.contains(&module)
            && err.contains("refused anonymous access"),
        "{err}"
    );
    let out = validate(
        other.to_str().unwrap(),
        &[],
        &["--registry-config", wrong.to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(r#"refused user "alice""#));
    assert!(
        !other
            .join("oci/sha256")
            .join(format!("{sha256}.wasm"))
            .exists()
    );
}

/// A CA and a server certificate for 127.0.0.1 signed by it.
fn certificates() -> wasmwatch_testkit::brokers::Tls {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "wasmwatch test registry CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let cert = leaf.signed_by(&key, &ca).unwrap();
    wasmwatch_testkit::brokers::Tls {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

#[test]
fn tls_with_a_private_ca_and_basic_auth() {
    let tls = certificates();
    let registry = Registry::with_tls(&tls, Some(("alice", "s3cret")));
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &tls.ca_pem).unwrap();
    let file = plugin("http-refresh");
    let reference = registry.reference("secure/refresh:1");
    let creds = [
        ("WASMWATCH_REGISTRY_USERNAME", "alice"),
        ("WASMWATCH_REGISTRY_PASSWORD", "s3cret"),
    ];

    // An unknown CA is refused.
    let out = wasmwatch_env(
        &["plugin", "push", file.to_str().unwrap(), &reference],
        &creds,
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&reference) && err.to_lowercase().contains("certificate"),
        "{err}"
    );

    // Trusted through --registry-ca-file (or WASMWATCH_REGISTRY_CA_FILE).
    let out = wasmwatch_env(
        &[
            "plugin",
            "push",
            file.to_str().unwrap(),
            &reference,
            "--registry-ca-file",
            ca.to_str().unwrap(),
        ],
        &creds,
    );
    let (module, sha256) = pushed_pin(&out);
    let m = manifest(dir.path(), &module, &sha256);
    let cache = dir.path().join("cache");
    let mut env = creds.to_vec();
    env.push(("WASMWATCH_REGISTRY_CA_FILE", ca.to_str().unwrap()));
    let out = wasmwatch_env(
        &[
            "validate",
            m.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("pulled to"));
}

/// The service path: `run --dry-run` against the test API server pulls the
/// module at start, then decides with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_pulls_at_start_then_decides_with_the_pulled_plugin() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube::api::PostParams;
    use wasmwatch_apiserver::{Config, Server};

    let registry = Registry::start();
    let (module, sha256) = push(&registry, "misbehave", "testing/misbehave:1");
    let server = Server::start(Config::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let manifest = dir.path().join("manifest.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch: {{namespaces: [default], kinds: [ConfigMap]}}
plugins:
  - name: seen
    module: {module}
    sha256: {sha256}
    config: {{mode: ok}}
    events: {{kinds: [ConfigMap]}}
    capabilities: {{events: true}}
"
        ),
    )
    .unwrap();
    let cache = dir.path().join("cache");
    let (mut child, _, lines_rx) = common::spawn_ready(
        Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
            .args([
                "run",
                "--dry-run",
                "--manifest",
                manifest.to_str().unwrap(),
                "--cache-dir",
                cache.to_str().unwrap(),
            ])
            .env("WASMWATCH_INSECURE_REGISTRIES", registry.host())
            .env("DOCKER_CONFIG", "/nonexistent")
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn"),
        Duration::from_secs(30),
    );
    assert!(
        cache
            .join("oci/sha256")
            .join(format!("{sha256}.wasm"))
            .is_file()
    );
    server.wait_for_watches(1).await;
    let api: Api<ConfigMap> = Api::namespaced(server.client().unwrap(), "default");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "a"}, "data": {"v": "1"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    let line = lines_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a decision line");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["decision"]["plugin"], "seen", "{line}");
    assert_eq!(v["object"], "default/a", "{line}");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_stalling_registry_is_named_at_start_up_and_given_up_at_the_pull_timeout() {
    let registry = FakeRegistry::start(Misbehaviour::Silent, b"\0asm".to_vec());
    let module = registry.reference("plugins/refresh:1");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let m = manifest(dir.path(), &module, &registry.sha256());
    let host = registry.host();
    let common = [
        "--cache-dir",
        cache.to_str().unwrap(),
        "--insecure-registry",
        &host,
        "--pull-timeout",
        "3s",
    ];
    for command in [
        vec!["validate", m.to_str().unwrap()],
        vec![
            "run",
            "--manifest",
            m.to_str().unwrap(),
            "--admin-addr",
            "127.0.0.1:0",
        ],
    ] {
        let mut args = command.clone();
        args.extend(common);
        let started = Instant::now();
        let out = wasmwatch(&args);
        let took = started.elapsed();
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert!(
            took >= Duration::from_secs(3) && took < Duration::from_secs(8),
            "{command:?}: {took:?}"
        );
        // Start-up says whose module it waits for, before giving up.
        let waiting = err
            .lines()
            .find(|l| l.contains("still pulling the plugin's module"))
            .unwrap_or_else(|| panic!("{command:?}: no waiting line in {err}"));
        assert!(
            waiting.contains("http-refresh") && waiting.contains(&module),
            "{waiting}"
        );
        let last = err.trim().lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: plugin http-refresh: cannot pull ")
                && last.contains(&module)
                && last.contains("within 3s (--pull-timeout)"),
            "{command:?}: {err}"
        );
        eprintln!(
            "{command:?} against a silent registry: {} ms",
            took.as_millis()
        );
    }

    // The flag's range.
    let out = wasmwatch(&["validate", m.to_str().unwrap(), "--pull-timeout", "0s"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("out of range (1s to 1h)"));
}

#[test]
fn a_huge_error_answer_is_one_bounded_line_on_stderr() {
    let registry = FakeRegistry::start(Misbehaviour::HugeError(32 << 20), b"\0asm".to_vec());
    let module = registry.reference("plugins/refresh:1");
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(dir.path(), &module, &registry.sha256());
    let out = wasmwatch(&[
        "validate",
        m.to_str().unwrap(),
        "--cache-dir",
        dir.path().join("cache").to_str().unwrap(),
        "--insecure-registry",
        &registry.host(),
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(
        err.trim().lines().count(),
        1,
        "one line: {} bytes",
        err.len()
    );
    assert!(err.len() < 6 * 1024, "{} bytes", err.len());
    assert!(
        err.starts_with("error: plugin http-refresh: cannot pull ")
            && err.contains("500 Internal Server Error: oops\\n2026-01-01"),
        "{err}"
    );
}
