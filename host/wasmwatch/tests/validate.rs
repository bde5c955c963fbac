//! `wasmwatch validate` reports every problem of a manifest in one run,
//! errors and warnings each naming its field, and the manifests that can
//! never work are warned about; `wasmwatch manifest schema` prints the
//! published schema.
use std::path::{Path, PathBuf};
use std::process::Output;

use wasmwatch_core::needs::{MetadataReads, Needs};
use wasmwatch_testkit::{pin, plugin, repo_root, sha256_file};

fn wasmwatch(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
        .args(args)
        .env(
            "WASMWATCH_CACHE_DIR",
            wasmwatch_testkit::artifact_cache_dir(),
        )
        .env("RUST_LOG", "warn")
        .output()
        .expect("run wasmwatch")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn validate(dir: &Path, name: &str, manifest: &str, strict: bool) -> Output {
    let p = dir.join(name);
    std::fs::write(&p, manifest).unwrap();
    let mut args = vec!["validate", p.to_str().unwrap()];
    if strict {
        args.push("--strict");
    }
    wasmwatch(&args)
}

const HEAD: &str = "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\n";

/// The four manifests of issue 21 that `validate` used to call valid: each
/// is now a warning naming the fields, exit code 0, and 1 with --strict.
#[test]
fn manifests_that_can_never_work_are_warned_about_naming_the_fields() {
    let dir = tempfile::tempdir().unwrap();
    let http_refresh = "  - name: http-refresh
    module: {module:http-refresh}
    sha256: {sha256:http-refresh}
";
    let cases = [
        (
            "no-grant",
            format!("{HEAD}plugins:\n{http_refresh}    capabilities: {{}}\n"),
            "warning: plugins[0].capabilities.refresh: not granted, but the plugin refreshes Services in the namespace of each event it gets, from any namespace",
        ),
        (
            "unwatched-namespace",
            format!(
                "{HEAD}watch: {{namespaces: [shop]}}\nplugins:\n{http_refresh}    events: {{namespaces: [billing]}}\n    capabilities: {{refresh: [billing]}}\n"
            ),
            "warning: plugins[0].events.namespaces[0]: \"billing\" is not in watch.namespaces (shop): the plugin never gets events from it",
        ),
        (
            "contradiction",
            format!(
                "{HEAD}plugins:\n{http_refresh}    events: {{labelSelector: \"a=true,a=false\"}}\n    capabilities: {{refresh: [\"*\"]}}\n"
            ),
            "warning: plugins[0].events.labelSelector: \"a=true,a=false\" never matches: label \"a\" cannot satisfy \"a=true\" and \"a=false\" at once",
        ),
        (
            "other-team",
            format!(
                "{HEAD}watch: {{labelSelector: team=shop}}\nplugins:\n{http_refresh}    events: {{labelSelector: team=billing}}\n    capabilities: {{refresh: [\"*\"]}}\n"
            ),
            "warning: plugins[0].events.labelSelector: \"team=billing\" never matches an object that watch.labelSelector \"team=shop\" lets through",
        ),
    ];
    for (name, manifest, want) in cases {
        let manifest = pin(&manifest);
        let out = validate(dir.path(), &format!("{name}.yaml"), &manifest, false);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{name}: {stdout}{stderr}");
        assert!(stderr.contains(want), "{name}: want {want:?} in:\n{stderr}");
        assert_eq!(stderr.matches("warning: ").count(), 1, "{name}: {stderr}");
        assert!(
            stdout.contains("valid, 1 plugin(s), 1 warning (--strict makes warnings fail)"),
            "{name}: {stdout}"
        );
        // Its prefilter, as the plugin declares it (issue 35).
        assert!(
            stdout.contains(
                "plugin http-refresh: called only for objects that meet its prefilter: usedBySpringService"
            ),
            "{name}: {stdout}"
        );
        let out = validate(dir.path(), &format!("{name}.yaml"), &manifest, true);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{name} --strict: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("(--strict fails on warnings)"),
            "{name}: {}",
            text(&out.stderr)
        );
    }
}

/// A field misspelt in one plugin, a config the next plugin's own check
/// rejects and a bad size in the third: all three in one run, each naming
/// its field, while the sound parts are still checked.
#[test]
fn three_independent_mistakes_are_reported_in_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = pin(&format!(
        "{HEAD}buses: [{{name: rabbit, amqp: {{url: \"amqp://rabbitmq:5672/%2f\"}}}}]
plugins:
  - name: http-refresh
    module: {{module:http-refresh}}
    sha256: {{sha256:http-refresh}}
    capabilites: {{refresh: [\"*\"]}}
  - name: bus-refresh
    module: {{module:bus-refresh}}
    sha256: {{sha256:bus-refresh}}
    config: {{destination: springCloudBus}}
    capabilities: {{bus: [rabbit/springCloudBus]}}
  - name: rollout-restart
    module: {{module:rollout-restart}}
    sha256: {{sha256:rollout-restart}}
    capabilities: {{restart: [\"*\"]}}
    limits: {{memory: 32MB}}
"
    ));
    let out = validate(dir.path(), "three.yaml", &manifest, false);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    for want in [
        "error: plugins[0].capabilites: unknown field `capabilites`",
        "error: plugins[1].config: plugin `bus-refresh`: rejected its config: bus-refresh config: missing field `connection`",
        "error: plugins[2].limits.memory: invalid size \"32MB\": unknown unit \"MB\"",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(want)),
            "want {want:?} in:\n{stderr}"
        );
    }
    assert_eq!(errors.len(), 3, "{stderr}");
    assert!(
        stderr.contains("three.yaml: invalid: 3 errors, 0 warnings"),
        "{stderr}"
    );
}

/// The bundled plugins carry their needs in the `wasmwatch:needs` section.
#[test]
fn the_bundled_plugins_declare_what_they_need() {
    let needs = |c: &str| {
        Needs::from_wasm(&std::fs::read(plugin(c)).unwrap())
            .unwrap()
            .unwrap_or_else(|| panic!("{c} declares no needs"))
    };
    // The object's annotations the Spring plugins read (`target_apps`).
    let spring = || {
        Some(MetadataReads {
            labels: vec![],
            annotations: [
                "spring.cloud.kubernetes.configmap.apps",
                "spring.cloud.kubernetes.secret.apps",
                "spring.cloud.kubernetes.configmap.labels",
                "spring.cloud.kubernetes.secret.labels",
            ]
            .map(String::from)
            .to_vec(),
        })
    };
    let http_refresh = Needs {
        refresh: vec!["{namespace}".into()],
        metadata: spring(),
        only: vec!["usedBySpringService".into()],
        ..Needs::default()
    };
    assert_eq!(needs("http-refresh"), http_refresh);
    // The Python and JavaScript builds append the same (their needs.json).
    let section = |path: std::path::PathBuf| {
        Needs::from_wasm(&std::fs::read(&path).unwrap())
            .unwrap()
            .unwrap_or_else(|| panic!("{} declares no needs", path.display()))
    };
    assert_eq!(
        section(wasmwatch_testkit::python_plugin("http-refresh")),
        http_refresh
    );
    assert_eq!(
        section(wasmwatch_testkit::js_plugin("rollout-restart")),
        needs("rollout-restart")
    );
    assert_eq!(
        needs("rollout-restart"),
        Needs {
            restart: vec!["{config.mode|restart=restart,alert}{namespace}".into()],
            http: vec![
                "{config.mode=webhook}{config.webhook.url}".into(),
                "{config.mode=alert}{config.alert.url}".into()
            ],
            metadata: Some(MetadataReads {
                labels: vec![],
                annotations: [
                    "{config.annotations.match|reloader.stakater.com/match}",
                    "{config.annotations.ignore|reloader.stakater.com/ignore}",
                    "wasmwatch.io/match",
                    "wasmwatch.io/ignore",
                ]
                .map(String::from)
                .to_vec(),
            }),
            only: vec!["usedByWorkload{config.webhook.always|false=false}".into()],
            ..Needs::default()
        }
    );
    assert_eq!(
        needs("bus-refresh"),
        Needs {
            bus: vec!["{config.connection}/{config.destination|springCloudBus}".into()],
            metadata: spring(),
            ..Needs::default()
        }
    );
    // A bus grant other than the config's destination is named.
    let dir = tempfile::tempdir().unwrap();
    let manifest = pin(&format!(
        "{HEAD}buses: [{{name: rabbit, amqp: {{url: \"amqp://rabbitmq:5672/%2f\"}}}}]
plugins:
  - name: bus-refresh
    module: {{module:bus-refresh}}
    sha256: {{sha256:bus-refresh}}
    config: {{connection: rabbit, destination: orders}}
    capabilities: {{bus: [rabbit/springCloudBus]}}
"
    ));
    let out = validate(dir.path(), "bus.yaml", &manifest, false);
    assert!(
        text(&out.stderr).contains(
            "warning: plugins[0].capabilities.bus: grants only [\"rabbit/springCloudBus\"], but the plugin publishes to rabbit/orders (per its config)"
        ),
        "{}",
        text(&out.stderr)
    );
}

/// rollout-restart's needs follow its mode: restarts in restart and alert
/// mode, a call to the configured URL in webhook and alert mode; a bad
/// mode config is an error naming the field.
#[test]
fn rollout_restart_needs_follow_its_mode() {
    let dir = tempfile::tempdir().unwrap();
    let entry = |config: &str, capabilities: &str| {
        pin(&format!(
            "{HEAD}watch: {{namespaces: [shop]}}
plugins:
  - name: rollout-restart
    module: {{module:rollout-restart}}
    sha256: {{sha256:rollout-restart}}
    config: {config}
    capabilities: {capabilities}
"
        ))
    };
    let hook = "http://hooks.shop.svc:8080/reload";
    let webhook = format!("{{mode: webhook, webhook: {{url: \"{hook}\"}}}}");
    let alert = format!("{{mode: alert, alert: {{url: \"{hook}\", sink: slack}}}}");
    let http_warning = format!(
        "warning: plugins[0].capabilities.http: no grant matches {hook}, which the plugin calls: those calls would be refused"
    );
    let restart_warning =
        "warning: plugins[0].capabilities.restart: not granted, but the plugin restarts workloads";
    for (name, config, capabilities, warnings) in [
        ("restart", "{}".to_string(), "{restart: [shop]}", vec![]),
        (
            "restart-ungranted",
            "{mode: restart}".to_string(),
            "{}",
            vec![restart_warning.to_string()],
        ),
        // Webhook mode restarts nothing: no restart grant needed.
        (
            "webhook",
            webhook.clone(),
            "{http: [\"http://hooks.shop.svc:8080/\"]}",
            vec![],
        ),
        (
            "webhook-ungranted",
            webhook.clone(),
            "{restart: [shop]}",
            vec![http_warning.clone()],
        ),
        (
            "alert",
            alert.clone(),
            "{restart: [shop], http: [\"http://hooks.shop.svc:8080/\"]}",
            vec![],
        ),
        (
            "alert-ungranted",
            alert.clone(),
            "{}",
            vec![restart_warning.to_string(), http_warning.clone()],
        ),
    ] {
        let out = validate(
            dir.path(),
            &format!("{name}.yaml"),
            &entry(&config, capabilities),
            false,
        );
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        let got: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("warning: "))
            .collect();
        assert_eq!(got.len(), warnings.len(), "{name}: {stderr}");
        for want in &warnings {
            assert!(
                got.iter().any(|w| w.starts_with(want.as_str())),
                "{name}: want {want:?} in:\n{stderr}"
            );
        }
    }
    let bad = entry(
        "{mode: webhook, webhook: {url: \"hooks.shop.svc/reload\"}}",
        "{http: [\"http://hooks.shop.svc:8080/\"]}",
    );
    let out = validate(dir.path(), "bad-url.yaml", &bad, false);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "error: plugins[0].config: plugin `rollout-restart`: rejected its config: rollout-restart config: webhook.url: \"hooks.shop.svc/reload\" is not an http or https URL"
        ),
        "{stderr}"
    );
    let bad = entry(
        "{mode: alert, alert: {url: \"http://hooks.shop.svc:8080/\", sink: pagerduty}}",
        "{restart: [shop], http: [\"http://hooks.shop.svc:8080/\"]}",
    );
    let stderr = text(&validate(dir.path(), "bad-sink.yaml", &bad, false).stderr);
    assert!(
        stderr.contains("rollout-restart config: alert.sink: unknown sink \"pagerduty\""),
        "{stderr}"
    );
}

/// The manifests the repository ships validate without a warning (with
/// the bundled plugins in place of the image's and real pins).
#[test]
fn the_shipped_manifests_validate_with_no_warning_under_strict() {
    let root = repo_root();
    let dir = tempfile::tempdir().unwrap();
    for file in [
        "deploy/base/manifest.yaml",
        "deploy/overlays/single-namespace/manifest.yaml",
        "deploy/examples/manifest.yaml",
        "tests/fixtures/bundled-plugins-manifest.yaml",
    ] {
        let mut m = std::fs::read_to_string(root.join(file)).unwrap();
        for c in ["http-refresh", "bus-refresh", "rollout-restart"] {
            let module: PathBuf = plugin(c);
            let wasm = format!("{}.wasm", c.replace('-', "_"));
            let abs = module.display().to_string();
            m = m
                .replace(&format!("/usr/lib/wasmwatch/plugins/{wasm}"), &abs)
                .replace(&format!("module: {wasm}"), &format!("module: {abs}"))
                .replace(
                    &format!("SHA256_OF_{}", c.replace('-', "_").to_uppercase()),
                    &sha256_file(&module),
                );
        }
        let name = file.replace('/', "-");
        let out = validate(dir.path(), &name, &m, true);
        assert!(
            out.status.success(),
            "{file}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
}

#[test]
fn manifest_schema_prints_the_published_schema() {
    let out = wasmwatch(&["manifest", "schema"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let published =
        std::fs::read_to_string(repo_root().join("deploy/manifest.schema.json")).unwrap();
    assert_eq!(text(&out.stdout), published);
}
