//! The `wasmwatch` binary, run as a user would.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use wasmwatch_testkit::{pin, repo_root};

/// Runs the binary with the compiled-artifact cache the other tests share,
/// the Python and JS twins compiled into it first, once: otherwise every
/// test compiled the Python plugin at once (~10 s of all cores each), and a
/// config check starved by the others' compiles missed its 100 ms deadline
/// in CI.
fn wasmwatch(args: &[&str]) -> Output {
    wasmwatch_testkit::wasmwatch_command(Path::new(env!("CARGO_BIN_EXE_wasmwatch")))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run wasmwatch")
}

/// `wasmwatch plugin run --manifest M --plugin P --event E EXTRA...`.
fn plugin_run(manifest: &Path, plugin: &str, event: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "plugin",
        "run",
        "--manifest",
        manifest.to_str().unwrap(),
        "--plugin",
        plugin,
        "--event",
        event.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    wasmwatch(&args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write(dir: &Path, name: &str, content: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

const MANIFEST: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
plugins:
  - name: http-refresh
    module: {module:http-refresh}
    sha256: {sha256:http-refresh}
    events: {kinds: [ConfigMap], labelSelector: spring.cloud.kubernetes.config=true}
    capabilities: {refresh: [shop]}
  - name: spy
    module: {module:misbehave}
    sha256: {sha256:misbehave}
    config: {mode: spy}
    capabilities: {events: true}
";

#[test]
fn validate_accepts_a_good_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(dir.path(), "m.yaml", &pin(MANIFEST));
    let out = wasmwatch(&["validate", m.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("plugin http-refresh: ok"), "{stdout}");
    assert!(stdout.contains("valid, 2 plugin(s)"), "{stdout}");
}

#[test]
fn validate_refuses_bad_manifests_and_bad_plugins_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let bad_field = write(
        dir.path(),
        "a.yaml",
        &pin(MANIFEST).replace("refresh: [shop]", "refresh: [shop], root: true"),
    );
    let out = wasmwatch(&["validate", bad_field.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("a.yaml"), "{err}");
    assert!(
        err.contains("plugins[0].capabilities.root: unknown field `root`"),
        "{err}"
    );

    let bad_plugin = pin(&MANIFEST
        .replace("{module:misbehave}", "{module:wasi-http}")
        .replace("{sha256:misbehave}", "{sha256:wasi-http}"));
    let m = write(dir.path(), "b.yaml", &bad_plugin);
    let out = wasmwatch(&["validate", m.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("plugin `spy`: imports `wasi:http/"), "{err}");

    let bad_config = pin(MANIFEST).replace("config: {mode: spy}", "config: {mode: spy, extra: 1}");
    let m = write(dir.path(), "c.yaml", &bad_config);
    let out = wasmwatch(&["validate", m.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("plugin `spy`: rejected its config: misbehave config: unknown field `extra`"),
        "{err}"
    );
}

/// The manifest with http-refresh built as `component` (a testkit name:
/// `http-refresh` or a twin in another language, `python/http-refresh`).
fn manifest_with_http_refresh(component: &str) -> String {
    pin(&MANIFEST
        .replace("{module:http-refresh}", &format!("{{module:{component}}}"))
        .replace("{sha256:http-refresh}", &format!("{{sha256:{component}}}")))
}

#[test]
fn plugin_run_prints_the_actions_with_verdicts() {
    for component in ["http-refresh", "python/http-refresh"] {
        let dir = tempfile::tempdir().unwrap();
        let m = write(dir.path(), "m.yaml", &manifest_with_http_refresh(component));
        let fixtures = repo_root().join("tests/fixtures");
        let out = plugin_run(
            &m,
            "http-refresh",
            &fixtures.join("orders-configmap.yaml"),
            &[
                "--lookups",
                fixtures.join("shop-lookups.yaml").to_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "{component}: {}", text(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "plugin": "http-refresh",
                "actions": [
                    {"action": {"type": "refreshService", "namespace": "shop", "service": "orders", "method": "POST",
                                "port": null, "path": "/actuator/refresh", "tls": false},
                     "verdict": "allowed"},
                    {"action": {"type": "refreshService", "namespace": "shop", "service": "billing", "method": "POST",
                                "port": 9090, "path": "/manage/refresh", "tls": false},
                     "verdict": "allowed"}
                ]
            }),
            "{component}"
        );
    }
}

#[test]
fn validate_runs_the_python_http_refresh_config_check() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        dir.path(),
        "good.yaml",
        &manifest_with_http_refresh("python/http-refresh"),
    );
    let out = wasmwatch(&["validate", good.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("plugin http-refresh: ok"));
    let bad = write(
        dir.path(),
        "bad.yaml",
        &manifest_with_http_refresh("python/http-refresh").replace(
            "capabilities: {refresh: [shop]}",
            "config: {basePath: nope}\n    capabilities: {refresh: [shop]}",
        ),
    );
    let out = wasmwatch(&["validate", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("plugin `http-refresh`: rejected its config: http-refresh config: basePath must start with '/', got \"nope\""),
        "{err}"
    );
}

#[test]
fn plugin_run_on_a_secret_event_withholds_values_and_shows_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.yaml",
        &pin(MANIFEST).replace("capabilities: {events: true}", "capabilities: {}"),
    );
    let ev = write(
        dir.path(),
        "ev.yaml",
        "change: added\nobject:\n  kind: Secret\n  metadata: {name: db, namespace: shop}\n  data: {password: aHVudGVyMg==}\n",
    );
    let out = plugin_run(&m, "spy", &ev, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let first = &json["actions"][0];
    assert_eq!(first["action"]["message"], "password=<withheld>");
    assert_eq!(first["verdict"], "refused");
    assert_eq!(first["capability"], "events");
    assert!(!text(&out.stdout).contains("hunter2"));
}

#[test]
fn plugin_run_names_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(dir.path(), "m.yaml", &pin(MANIFEST));
    let ev = repo_root().join("tests/fixtures/orders-configmap.yaml");
    let out = plugin_run(&m, "nope", &ev, &[]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no plugin named \"nope\""),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("it has: http-refresh, spy"),
        "{}",
        text(&out.stderr)
    );

    let bad_ev = write(
        dir.path(),
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n",
    );
    let out = plugin_run(&m, "spy", &bad_ev, &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("invalid event file") && err.contains("kind \"Pod\""),
        "{err}"
    );
}

#[test]
fn a_zero_checkpoint_interval_is_refused_naming_the_flag() {
    let out = wasmwatch(&[
        "run",
        "--manifest",
        "/nonexistent.yaml",
        "--checkpoint-interval",
        "0s",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--checkpoint-interval") && err.contains("0s is out of range (1ms to 1h)"),
        "{err}"
    );
}

const SPY_ONLY: &str = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
plugins:
  - name: spy
    module: {module:misbehave}
    sha256: {sha256:misbehave}
    config: {mode: ok}
    capabilities: {events: true}
";

/// `wasmwatch run` with this kubeconfig and no in-cluster environment.
fn run_with_kubeconfig(manifest: &Path, kubeconfig: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
        .args(["run", "--manifest", manifest.to_str().unwrap()])
        .args(["--admin-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .expect("run wasmwatch")
}

#[test]
fn a_kubernetes_client_that_cannot_be_configured_is_one_plain_line() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(dir.path(), "m.yaml", &pin(SPY_ONLY));
    let bad_url = write(
        dir.path(),
        "kubeconfig",
        "apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: 'http://bad host:6443'}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
",
    );
    for (kubeconfig, problem) in [
        (
            Path::new("/nonexistent/kubeconfig"),
            "failed to read kubeconfig from '\"/nonexistent/kubeconfig\"': No such file or directory",
        ),
        (bad_url.as_path(), "failed to parse cluster url"),
    ] {
        let out = run_with_kubeconfig(&m, kubeconfig);
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert!(!err.contains("\x1b["), "no colour codes: {err:?}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        assert!(
            lines[0].starts_with("error: cannot configure the Kubernetes client: "),
            "{err}"
        );
        assert_eq!(lines[0].matches(problem).count(), 1, "named once: {err}");
        assert_eq!(
            lines[0].matches("failed to infer config").count(),
            1,
            "no cause repeated: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_to_a_pipe_carry_no_colour_codes() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let server = wasmwatch_apiserver::Server::start(Default::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let m = write(dir.path(), "m.yaml", &pin(SPY_ONLY));
    let mut child = Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
        .args(["run", "--manifest", m.to_str().unwrap()])
        .args(["--admin-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !seen
        .iter()
        .any(|l: &String| l.contains("admin port listening"))
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("no startup log in time: {seen:?}"),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = seen.join("\n");
    assert!(log.contains(" INFO "), "{log}");
    assert!(!log.contains('\x1b'), "no colour codes: {log:?}");
}

/// `plugin run` over rollout-restart `module` (a testkit component name)
/// with the Reloader-annotated workloads of the fixtures; the JSON printed.
fn run_rollout_restart(module: &str, config: &str, change: &str) -> serde_json::Value {
    run_rollout_restart_granted(module, config, change, "{restart: [shop]}")
}

/// [`run_rollout_restart`] with these `capabilities`.
fn run_rollout_restart_granted(
    module: &str,
    config: &str,
    change: &str,
    capabilities: &str,
) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let manifest = format!(
        "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
plugins:
  - name: rollout-restart
    module: {{module:{module}}}
    sha256: {{sha256:{module}}}
    config: {config}
    capabilities: {capabilities}
"
    );
    let m = write(dir.path(), "m.yaml", &pin(&manifest));
    let fixtures = repo_root().join("tests/fixtures");
    let out = plugin_run(
        &m,
        "rollout-restart",
        &fixtures.join("orders-configmap.yaml"),
        &[
            "--lookups",
            fixtures
                .join("shop-reloader-lookups.yaml")
                .to_str()
                .unwrap(),
            "--change",
            change,
        ],
    );
    assert!(out.status.success(), "{module}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn plugin_run_gives_the_same_restarts_from_the_rust_and_the_js_rollout_restart() {
    for module in ["rollout-restart", "js/rollout-restart"] {
        let json = run_rollout_restart(module, "{}", "modified");
        let actions = json["actions"].as_array().unwrap();
        let restarted: Vec<(&str, &str)> = actions
            .iter()
            .map(|a| {
                assert_eq!(a["verdict"], "allowed", "{module}: {a}");
                assert_eq!(a["action"]["type"], "restart", "{module}: {a}");
                assert_eq!(a["action"]["reason"], "ConfigMap shop/orders changed");
                let hash = a["action"]["contentHash"].as_str().unwrap();
                let digest = hash.strip_prefix("configmap/orders:").unwrap_or("");
                assert!(
                    digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{module}: {hash}"
                );
                let w = &a["action"]["workload"];
                assert_eq!(w["namespace"], "shop", "{module}: {a}");
                (w["kind"].as_str().unwrap(), w["name"].as_str().unwrap())
            })
            .collect();
        // `reports` asks for Secrets only.
        assert_eq!(
            restarted,
            [("Deployment", "orders"), ("StatefulSet", "billing")],
            "{module}"
        );
        assert_eq!(json["plugin"], "rollout-restart");
        assert_eq!(
            json,
            run_rollout_restart("rollout-restart", "{}", "modified"),
            "{module} differs from the Rust plugin"
        );

        // Reloader's defaults: no restart on create or delete; on request,
        // a deletion restarts with the `deleted` hash.
        for change in ["added", "deleted"] {
            let json = run_rollout_restart(module, "{}", change);
            assert_eq!(json["actions"], serde_json::json!([]), "{module}: {change}");
        }
        let json = run_rollout_restart(module, "{reloadOnDelete: true}", "deleted");
        let hashes: Vec<&str> = json["actions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["action"]["contentHash"].as_str().unwrap())
            .collect();
        assert_eq!(hashes, ["configmap/orders:deleted"; 2], "{module}");
    }
}

/// Webhook mode (Reloader's `--webhook-url`) and alert mode
/// (`ALERT_ON_RELOAD`) of rollout-restart on the fixtures: the exact
/// actions, the same from the Rust and the JavaScript plugin.
#[test]
fn plugin_run_shows_the_webhook_and_alert_modes_exact_requests() {
    const HOOK: &str = "https://hooks.example.com/services/T0/B0/x";
    let grant = "{restart: [shop], http: [\"https://hooks.example.com/\"]}";
    // The content digest, from the restart mode's hash.
    let restarts = run_rollout_restart("rollout-restart", "{}", "modified");
    let digest = restarts["actions"][0]["action"]["contentHash"]
        .as_str()
        .unwrap()
        .strip_prefix("configmap/orders:")
        .unwrap()
        .to_string();
    let post = |content_type: &str, body: &str| {
        serde_json::json!({"action": {"type": "http", "method": "POST", "url": HOOK,
            "headers": [{"name": "content-type", "value": content_type}], "body": body},
            "verdict": "allowed"})
    };
    let message = |kind: &str, name: &str| {
        format!(
            "cluster eu-1 : Reloader detected changes in *orders* of type *CONFIGMAP* in namespace *shop*. Hence reloaded *{name}* of type *{kind}* in namespace *shop*"
        )
    };
    let slack = |kind: &str, name: &str| {
        post(
            "application/json",
            &format!(
                r#"{{"attachments":[{{"author_name":"Reloader","color":"good","text":"{}"}}]}}"#,
                message(kind, name)
            ),
        )
    };
    let cases = [
        (
            format!("{{mode: webhook, webhook: {{url: \"{HOOK}\"}}}}"),
            vec![post(
                "application/json",
                &format!(
                    r#"{{"kind":"ConfigMap","namespace":"shop","name":"orders","uid":"6f1c2d3e-0000-4000-8000-000000000001","resourceVersion":"4711","change":"modified","digest":"{digest}","changedKeys":["application.yaml"],"workloads":[{{"kind":"Deployment","namespace":"shop","name":"orders"}},{{"kind":"StatefulSet","namespace":"shop","name":"billing"}}]}}"#
                ),
            )],
        ),
        (
            format!("{{mode: webhook, webhook: {{url: \"{HOOK}\", format: reloader}}}}"),
            vec![post(
                "application/json",
                r#"{"webhook":"update successful"}"#,
            )],
        ),
        (
            format!(
                "{{mode: alert, alert: {{url: \"{HOOK}\", sink: slack, additionalInfo: cluster eu-1}}}}"
            ),
            vec![
                restarts["actions"][0].clone(),
                restarts["actions"][1].clone(),
                slack("Deployment", "orders"),
                slack("StatefulSet", "billing"),
            ],
        ),
        (
            format!(
                "{{mode: alert, alert: {{url: \"{HOOK}\", sink: raw, additionalInfo: cluster eu-1}}}}"
            ),
            vec![
                restarts["actions"][0].clone(),
                restarts["actions"][1].clone(),
                post(
                    "text/plain",
                    &message("Deployment", "orders").replace('*', ""),
                ),
                post(
                    "text/plain",
                    &message("StatefulSet", "billing").replace('*', ""),
                ),
            ],
        ),
    ];
    for (config, want) in &cases {
        let rust = run_rollout_restart_granted("rollout-restart", config, "modified", grant);
        assert_eq!(
            rust,
            serde_json::json!({"plugin": "rollout-restart", "actions": want}),
            "{config}"
        );
        let js = run_rollout_restart_granted("js/rollout-restart", config, "modified", grant);
        assert_eq!(js, rust, "{config}: the JavaScript plugin differs");
    }
    // Without the http grant, the calls are refused and the restarts of
    // alert mode still allowed.
    let alert = &cases[2].0;
    let refused =
        run_rollout_restart_granted("rollout-restart", alert, "modified", "{restart: [shop]}");
    let verdicts: Vec<&str> = refused["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["allowed", "allowed", "refused", "refused"]);
    assert_eq!(refused["actions"][2]["capability"], "http");
}

#[test]
fn validate_refuses_bad_config_of_the_js_rollout_restart() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
plugins:
  - name: rollout-restart
    module: {module:js/rollout-restart}
    sha256: {sha256:js/rollout-restart}
    config: {reloadOnCreate: true, reloadOnUpdate: true}
    capabilities: {restart: [shop]}
";
    let m = write(dir.path(), "m.yaml", &pin(manifest));
    let out = wasmwatch(&["validate", m.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "plugin `rollout-restart`: rejected its config: rollout-restart config: unknown field `reloadOnUpdate`"
        ),
        "{err}"
    );
}

/// Without `--cache-dir`, every command uses the default compile cache
/// (`$XDG_CACHE_HOME/wasmwatch`): the second `plugin run` loads the
/// compiled artifact instead of compiling again; `--no-cache` writes none.
#[test]
fn plugin_run_uses_the_default_compile_cache() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.yaml",
        &manifest_with_http_refresh("http-refresh"),
    );
    let fixtures = repo_root().join("tests/fixtures");
    let cache = dir.path().join("xdg");
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
            .args(["plugin", "run", "--manifest", m.to_str().unwrap()])
            .args(["--plugin", "http-refresh", "--event"])
            .arg(fixtures.join("orders-configmap.yaml"))
            .args(extra)
            .env_remove("WASMWATCH_CACHE_DIR")
            .env("XDG_CACHE_HOME", &cache)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    let artifacts = || -> Vec<PathBuf> {
        std::fs::read_dir(cache.join("wasmwatch/compiled"))
            .map(|d| {
                d.map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
                    .collect()
            })
            .unwrap_or_default()
    };
    run(&["--no-cache"]);
    assert!(artifacts().is_empty(), "--no-cache compiled into the cache");
    run(&[]);
    let first = artifacts();
    assert_eq!(first.len(), 1, "the plugin compiled into the default cache");
    let written = std::fs::metadata(&first[0]).unwrap().modified().unwrap();
    run(&[]);
    assert_eq!(artifacts(), first);
    assert_eq!(
        std::fs::metadata(&first[0]).unwrap().modified().unwrap(),
        written,
        "the second run loaded the artifact instead of compiling again"
    );
}
