//! The plugin runtime against real components built from plugins/.
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmwatch_core::action::{Action, HttpMethod, WorkloadKind, WorkloadRef};
use wasmwatch_core::lookups::{
    Endpoint, ObjectRef, ServiceEndpoints, ServiceInfo, ServicePort, StaticLookups, WorkloadInfo,
};
use wasmwatch_core::{ChangeEvent, ChangeType, Manifest, ObjectKind, ObjectSnapshot, Verdict};
use wasmwatch_runtime::{LoadError, Plugin, PluginError, Runtime, RuntimeConfig};
use wasmwatch_testkit::pin;

fn runtime_with(lookups: StaticLookups) -> Runtime {
    Runtime::new(RuntimeConfig::default(), Arc::new(lookups)).unwrap()
}

fn runtime() -> Runtime {
    runtime_with(StaticLookups::default())
}

/// A manifest with one plugin entry; `entry` is YAML indented by four spaces.
fn manifest(entry: &str) -> Manifest {
    let yaml = format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - {}\n",
        entry.trim_start()
    );
    Manifest::parse(&pin(&yaml), Path::new("/")).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn load(rt: &Runtime, entry: &str) -> Result<Plugin, LoadError> {
    let m = manifest(entry);
    rt.load_blocking(&m.plugins[0], &m.base_dir)
}

fn misbehave(rt: &Runtime, mode: &str, extra: &str) -> Plugin {
    load(
        rt,
        &format!(
            "name: bad\n    module: {{module:misbehave}}\n    sha256: {{sha256:misbehave}}\n    config: {{mode: {mode}}}\n{extra}"
        ),
    )
    .unwrap()
}

fn configmap_event() -> ChangeEvent {
    let obj = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1", "resourceVersion": "42",
                     "annotations": {"spring.cloud.kubernetes.configmap.apps": "orders, billing"}},
        "data": {"application.yaml": "greeting: hi"}
    });
    ChangeEvent::new(
        ChangeType::Modified,
        ObjectSnapshot::from_json(&obj).unwrap(),
        None,
    )
}

fn secret_event() -> ChangeEvent {
    let obj = serde_json::json!({
        "kind": "Secret", "metadata": {"name": "db", "namespace": "shop"},
        "data": {"password": "aHVudGVyMg=="}
    });
    ChangeEvent::new(
        ChangeType::Modified,
        ObjectSnapshot::from_json(&obj).unwrap(),
        None,
    )
}

fn messages(plugin: &Plugin, ev: &ChangeEvent) -> Vec<(String, String)> {
    plugin
        .handle_blocking(ev)
        .unwrap()
        .actions
        .into_iter()
        .map(|c| match c.action {
            Action::Event {
                reason, message, ..
            } => (reason, message),
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

/// http-refresh and its twins in other languages: every http-refresh test
/// runs over each of them (testkit component names).
const HTTP_REFRESH: [&str; 2] = ["http-refresh", "python/http-refresh"];

/// A runtime whose compiled artifacts are cached in a folder that lives as
/// long as the runtime is used: loading a Python component several times
/// then compiles it once (~20 s each in a debug build).
fn cached_runtime(lookups: StaticLookups) -> (Runtime, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::new(
        RuntimeConfig {
            cache_dir: Some(dir.path().join("cache")),
            ..Default::default()
        },
        Arc::new(lookups),
    )
    .unwrap();
    (rt, dir)
}

fn http_refresh(rt: &Runtime, component: &str, config: &str) -> Plugin {
    load(
        rt,
        &format!(
            "name: http-refresh\n    module: {{module:{component}}}\n    sha256: {{sha256:{component}}}\n    config: {config}\n    capabilities: {{refresh: [shop]}}\n    limits: {{timeout: 5s}}"
        ),
    )
    .unwrap_or_else(|e| panic!("{component}: {e}"))
}

fn shop_service(name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ServiceInfo {
    let map = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    ServiceInfo {
        namespace: "shop".into(),
        name: name.into(),
        labels: map(labels),
        annotations: map(annotations),
        ports: vec![ServicePort {
            name: None,
            port: 80,
        }],
    }
}

fn refresh(service: &str, port: Option<u16>, path: &str) -> Action {
    Action::RefreshService {
        namespace: "shop".into(),
        service: service.into(),
        method: HttpMethod::Post,
        port,
        path: path.into(),
        tls: false,
    }
}

#[test]
fn http_refresh_targets_the_apps_services() {
    let lookups = StaticLookups {
        services: vec![
            shop_service("orders", &[], &[]),
            shop_service(
                "billing",
                &[],
                &[("boot.spring.io/actuator", "http://:9090/manage")],
            ),
            shop_service("unrelated", &[], &[]),
        ],
        ..Default::default()
    };
    let rt = runtime_with(lookups);
    for component in HTTP_REFRESH {
        let plugin = http_refresh(&rt, component, "{}");
        let decision = plugin.handle_blocking(&configmap_event()).unwrap();
        let got: Vec<_> = decision
            .actions
            .iter()
            .map(|c| (c.action.clone(), c.verdict.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    refresh("orders", None, "/actuator/refresh"),
                    Verdict::Allowed
                ),
                (
                    refresh("billing", Some(9090), "/manage/refresh"),
                    Verdict::Allowed
                ),
            ],
            "{component}"
        );
    }
}

/// A change of `kind` `shop/name` with these annotations.
fn annotated_event(kind: &str, name: &str, annotations: serde_json::Value) -> ChangeEvent {
    let obj = serde_json::json!({
        "kind": kind, "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
        "data": {"k": "dg=="}
    });
    ChangeEvent::new(
        ChangeType::Modified,
        ObjectSnapshot::from_json(&obj).unwrap(),
        None,
    )
}

#[test]
fn http_refresh_resolves_apps_and_reads_config_and_actuator_annotations() {
    let lookups = StaticLookups {
        services: vec![
            shop_service("orders", &[("tier", "front")], &[]),
            shop_service(
                "inventory",
                &[("tier", "backend")],
                &[("boot.spring.io/actuator", "https://:8443/mgmt/")],
            ),
            shop_service(
                "payments",
                &[("tier", "backend"), ("team", "pay")],
                &[("boot.spring.io/actuator", "http://host:none/x")],
            ),
            shop_service("db", &[], &[("boot.spring.io/actuator", " http://:7070 ")]),
            shop_service("root", &[], &[("boot.spring.io/actuator", "http://:81/")]),
        ],
        ..Default::default()
    };
    let cm = "spring.cloud.kubernetes.configmap";
    let secret = "spring.cloud.kubernetes.secret";
    let cases: Vec<(&str, ChangeEvent, Vec<Action>)> = vec![
        (
            "labels select every Service carrying all of them",
            annotated_event(
                "ConfigMap",
                "x",
                serde_json::json!({format!("{cm}.labels"): "tier=backend"}),
            ),
            vec![
                refresh("inventory", Some(8443), "/mgmt/refresh"),
                refresh("payments", None, "/x/refresh"),
            ],
        ),
        (
            "two labels",
            annotated_event(
                "ConfigMap",
                "x",
                serde_json::json!({format!("{cm}.labels"): " tier = backend , team=pay,junk"}),
            ),
            vec![refresh("payments", None, "/x/refresh")],
        ),
        (
            "no Service matches the labels",
            annotated_event(
                "ConfigMap",
                "x",
                serde_json::json!({format!("{cm}.labels"): "tier=none"}),
            ),
            vec![],
        ),
        (
            "named like the object",
            annotated_event("ConfigMap", "orders", serde_json::json!({})),
            vec![refresh("orders", None, "/base/shutdown")],
        ),
        (
            "no Service named like the object",
            annotated_event("ConfigMap", "ghost", serde_json::json!({})),
            vec![],
        ),
        (
            "apps annotation: missing apps skipped, the base path without a port, no path",
            annotated_event(
                "ConfigMap",
                "x",
                serde_json::json!({format!("{cm}.apps"): "ghost, db,,root "}),
            ),
            vec![
                refresh("db", Some(7070), "/base/shutdown"),
                refresh("root", Some(81), "/base/shutdown"),
            ],
        ),
        (
            "a Secret reads the secret annotations, not the ConfigMap ones",
            annotated_event(
                "Secret",
                "x",
                serde_json::json!({format!("{cm}.apps"): "db", format!("{secret}.apps"): "orders"}),
            ),
            vec![refresh("orders", None, "/base/shutdown")],
        ),
    ];
    let (rt, _cache) = cached_runtime(lookups);
    for component in HTTP_REFRESH {
        let refreshing = http_refresh(&rt, component, "{}");
        let shutting_down = http_refresh(&rt, component, "{strategy: shutdown, basePath: /base/}");
        for (what, event, want) in &cases {
            // The label cases come from the refresh plugin (default base
            // path), the others from the shutdown one.
            let plugin = if what.contains("label") {
                &refreshing
            } else {
                &shutting_down
            };
            let got: Vec<Action> = plugin
                .handle_blocking(event)
                .unwrap_or_else(|e| panic!("{component}: {what}: {e}"))
                .actions
                .into_iter()
                .map(|c| {
                    assert_eq!(c.verdict, Verdict::Allowed, "{component}: {what}");
                    c.action
                })
                .collect();
            assert_eq!(&got, want, "{component}: {what}");
        }
    }
}

#[test]
fn infinite_loop_is_stopped_and_the_host_goes_on() {
    // The timing (deadline + 20 ms) is asserted in tests/deadline.rs, a test
    // binary of its own, away from the CPU load of the tests here.
    let rt = runtime();
    let looping = misbehave(&rt, "loop", "    limits: {timeout: 50ms}");
    let start = Instant::now();
    let err = looping.handle_blocking(&configmap_event()).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, PluginError::Timeout { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "plugin `bad` exceeded its time limit of 50ms"
    );
    assert!(
        took >= Duration::from_millis(45),
        "stopped too early: {took:?}"
    );
    assert!(took < Duration::from_secs(2), "not stopped: {took:?}");
    // The next event is served, by another plugin and by the same one.
    let ok = misbehave(&rt, "ok", "    capabilities: {events: true}");
    assert_eq!(
        messages(&ok, &configmap_event()),
        vec![("Seen".to_string(), "shop/orders".to_string())]
    );
    assert!(matches!(
        looping.handle_blocking(&configmap_event()),
        Err(PluginError::Timeout { .. })
    ));
}

#[test]
fn memory_bomb_hits_its_limit() {
    let rt = runtime();
    let bomb = misbehave(&rt, "bomb", "    limits: {memory: 8Mi, timeout: 5s}");
    let err = bomb.handle_blocking(&configmap_event()).unwrap_err();
    assert!(
        matches!(err, PluginError::MemoryLimit { limit, .. } if limit == 8 << 20),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("plugin `bad` exceeded its memory limit of 8388608 bytes"),
        "{err}"
    );
}

#[test]
fn panic_is_a_trap_with_the_plugins_message() {
    let rt = runtime();
    let err = misbehave(&rt, "trap", "")
        .handle_blocking(&configmap_event())
        .unwrap_err();
    assert!(matches!(err, PluginError::Trap { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.starts_with("plugin `bad` trapped:"), "{msg}");
    assert!(
        msg.contains("deliberate panic in misbehave plugin"),
        "{msg}"
    );
}

#[test]
fn deep_recursion_overflows_the_stack_safely() {
    let rt = runtime();
    let err = misbehave(&rt, "recurse", "    limits: {timeout: 5s}")
        .handle_blocking(&configmap_event())
        .unwrap_err();
    assert!(matches!(err, PluginError::StackOverflow { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "plugin `bad` overflowed its stack (unbounded recursion?)"
    );
}

#[test]
fn huge_output_is_refused() {
    let rt = runtime();
    let err = misbehave(&rt, "huge", "    limits: {timeout: 5s}")
        .handle_blocking(&configmap_event())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "plugin `bad` returned too much: 100000 actions, the limit is 1000"
    );
}

#[test]
fn plugin_errors_are_reported() {
    let rt = runtime();
    let err = misbehave(&rt, "error", "")
        .handle_blocking(&configmap_event())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "plugin `bad` returned an error: deliberate error from misbehave plugin"
    );
}

#[test]
fn actions_outside_the_capabilities_are_refused_and_named() {
    let rt = runtime();
    let plugin = misbehave(
        &rt,
        "forbidden",
        "    capabilities: {http: [\"http://127.0.0.1:*/\"], restart: [shop]}",
    );
    let decision = plugin.handle_blocking(&configmap_event()).unwrap();
    let verdicts: Vec<_> = decision.actions.iter().map(|c| c.verdict.clone()).collect();
    assert_eq!(
        verdicts,
        vec![
            Verdict::Refused {
                capability: "http",
                reason: "URL http://169.254.169.254/latest/meta-data matches no granted http pattern".into()
            },
            Verdict::Refused {
                capability: "restart",
                reason: "restarting Deployment kube-system/coredns: namespace \"kube-system\" not granted"
                    .into()
            },
        ]
    );
    assert_eq!(decision.allowed().count(), 0);
    assert_eq!(plugin.refused_actions(), 2);
}

#[test]
fn secret_values_reach_a_plugin_only_with_the_grant() {
    let rt = runtime();
    let without = misbehave(&rt, "spy", "    capabilities: {events: true}");
    let seen = messages(&without, &secret_event());
    assert_eq!(seen[0], ("SawData".into(), "password=<withheld>".into()));
    assert_eq!(seen[1], ("SawValuesIncluded".into(), "false".into()));
    assert_eq!(seen[2], ("SawChangedKeys".into(), "password".into()));
    let with = misbehave(
        &rt,
        "spy",
        "    capabilities: {events: true, secretValues: true}",
    );
    let seen = messages(&with, &secret_event());
    assert_eq!(seen[0], ("SawData".into(), "password=hunter2".into()));
    assert_eq!(seen[1], ("SawValuesIncluded".into(), "true".into()));
    // ConfigMap values always reach it.
    let seen = messages(&without, &configmap_event());
    assert_eq!(
        seen[0],
        ("SawData".into(), "application.yaml=greeting: hi".into())
    );
}

#[test]
fn every_event_starts_from_a_fresh_memory() {
    // Memory slots are reused, reset by the pooling allocator (memset of the
    // pages found resident, the rest given back to the kernel): nothing one
    // call leaves in linear memory may reach the next, whichever plugin had
    // the slot in between.
    let rt = runtime();
    let remember = misbehave(&rt, "remember", "    capabilities: {events: true}");
    let other = misbehave(&rt, "spy", "    capabilities: {events: true}");
    for i in 0..50 {
        let seen = messages(&remember, &configmap_event());
        assert_eq!(
            seen,
            [("Remembered".to_string(), "calls=1 marked=0".to_string())],
            "call {i}"
        );
        if i % 3 == 0 {
            messages(&other, &secret_event());
        }
    }
}

#[test]
fn host_lookups_reach_the_plugin() {
    let service = |name: &str| ServiceInfo {
        namespace: "shop".into(),
        name: name.into(),
        labels: Default::default(),
        annotations: Default::default(),
        ports: vec![],
    };
    let endpoint = |address: &str| Endpoint {
        address: address.into(),
        pod: None,
        ports: vec![],
    };
    let lookups = StaticLookups {
        workloads: vec![WorkloadInfo {
            workload: WorkloadRef {
                kind: WorkloadKind::Deployment,
                namespace: "shop".into(),
                name: "orders-api".into(),
            },
            labels: Default::default(),
            annotations: Default::default(),
            template_annotations: Default::default(),
            references: vec![ObjectRef {
                kind: ObjectKind::ConfigMap,
                name: "orders".into(),
                uses: vec![],
            }],
        }],
        services: vec![service("orders"), service("db")],
        endpoints: vec![
            ServiceEndpoints {
                namespace: "shop".into(),
                service: "orders".into(),
                ready: vec![endpoint("10.0.0.1"), endpoint("10.0.0.2")],
            },
            // Another namespace's Service of the same name is not asked for.
            ServiceEndpoints {
                namespace: "other".into(),
                service: "orders".into(),
                ready: vec![endpoint("10.9.9.9")],
            },
        ],
    };
    let rt = runtime_with(lookups);
    let spy = misbehave(&rt, "spy", "    capabilities: {events: true}");
    // The spy reports the workloads referencing the object, then the ready
    // endpoints of the Service named like it.
    let seen = messages(&spy, &configmap_event());
    assert_eq!(seen[3], ("SawWorkloads".into(), "orders-api".into()));
    assert_eq!(seen[4], ("SawEndpoints".into(), "10.0.0.1,10.0.0.2".into()));
    // A Service without endpoints: none.
    let seen = messages(&spy, &secret_event());
    assert_eq!(seen[3], ("SawWorkloads".into(), "".into()));
    assert_eq!(seen[4], ("SawEndpoints".into(), "".into()));
}

#[test]
fn a_plugin_importing_wasi_http_fails_to_load() {
    // Files, sockets and the environment link with zero authority (see
    // tests/inert.rs); making requests itself stays refused.
    let rt = runtime();
    let err = load(
        &rt,
        "name: wasi-http\n    module: {module:wasi-http}\n    sha256: {sha256:wasi-http}",
    )
    .err()
    .expect("wasi-http loaded");
    assert!(
        matches!(&err, LoadError::ForbiddenImport { import, .. } if import.starts_with("wasi:http/")),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with("plugin `wasi-http`: imports `wasi:http/"),
        "{msg}"
    );
}

#[test]
fn a_component_of_another_world_fails_to_load() {
    let rt = runtime();
    let err = load(
        &rt,
        "name: other\n    module: {module:wrong-world}\n    sha256: {sha256:wrong-world}",
    )
    .err()
    .unwrap();
    assert!(matches!(err, LoadError::WrongWorld { .. }), "{err}");
    // No world: the message names each, and why each does not fit.
    let msg = err.to_string();
    assert!(
        msg.starts_with(
            "plugin `other`: is not a component of the wasmwatch:plugin/plugin@0.2.0, \
             @0.3.0 or @0.4.0 world: wasmwatch:plugin/plugin@0.2.0: "
        ),
        "{msg}"
    );
    assert!(msg.contains("; wasmwatch:plugin/plugin@0.3.0: "), "{msg}");
    assert!(msg.contains("; wasmwatch:plugin/plugin@0.4.0: "), "{msg}");
}

#[test]
fn a_module_whose_sha256_does_not_match_fails_to_load() {
    let rt = runtime();
    let wrong = "0".repeat(64);
    let err = load(
        &rt,
        &format!("name: p\n    module: {{module:http-refresh}}\n    sha256: {wrong}"),
    )
    .err()
    .unwrap();
    let msg = err.to_string();
    assert!(msg.starts_with("plugin `p`: module "), "{msg}");
    assert!(
        msg.ends_with(&format!("but the manifest pins {wrong}")),
        "{msg}"
    );
}

fn load_file(rt: &Runtime, bytes: &[u8]) -> LoadError {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plugin.wasm");
    std::fs::write(&path, bytes).unwrap();
    let sha = wasmwatch_testkit::sha256_file(&path);
    load(
        rt,
        &format!("name: p\n    module: {}\n    sha256: {sha}", path.display()),
    )
    .err()
    .unwrap()
}

#[test]
fn files_that_are_not_components_fail_to_load() {
    let rt = runtime();
    let err = load_file(&rt, b"#!/bin/sh\necho not wasm\n");
    assert!(matches!(err, LoadError::NotWasm { .. }), "{err}");
    assert!(
        err.to_string()
            .ends_with("plugin.wasm is not a WebAssembly file"),
        "{err}"
    );
    // The smallest valid core module: a module, not a component.
    let err = load_file(&rt, b"\0asm\x01\0\0\0");
    assert!(matches!(err, LoadError::CoreModule { .. }), "{err}");
    // A truncated component.
    let mut bytes = std::fs::read(wasmwatch_testkit::plugin("http-refresh")).unwrap();
    bytes.truncate(bytes.len() / 2);
    let err = load_file(&rt, &bytes);
    assert!(matches!(err, LoadError::Compile { .. }), "{err}");
    let missing = load(
        &rt,
        &format!(
            "name: p\n    module: /nonexistent/p.wasm\n    sha256: {}",
            "a".repeat(64)
        ),
    )
    .err()
    .unwrap();
    assert!(
        missing
            .to_string()
            .starts_with("plugin `p`: cannot read module /nonexistent/p.wasm:"),
        "{missing}"
    );
}

#[test]
fn a_bad_plugin_config_fails_at_load_with_the_plugins_message() {
    let rt = runtime();
    let err = load(&rt, "name: bad\n    module: {module:misbehave}\n    sha256: {sha256:misbehave}\n    config: {mode: sideways}")
        .err()
        .unwrap();
    assert!(matches!(err, LoadError::ConfigRejected { .. }), "{err}");
    assert!(
        err.to_string().starts_with(
            "plugin `bad`: rejected its config: misbehave config: unknown mode \"sideways\""
        ),
        "{err}"
    );
    let (rt, _cache) = cached_runtime(StaticLookups::default());
    for component in HTTP_REFRESH {
        let rejected = |config: &str| {
            let err = load(&rt, &format!("name: hr\n    module: {{module:{component}}}\n    sha256: {{sha256:{component}}}\n    config: {config}\n    limits: {{timeout: 5s}}"))
                .err()
                .unwrap_or_else(|| panic!("{component} accepted {config}"));
            assert!(
                matches!(err, LoadError::ConfigRejected { .. }),
                "{component}: {err}"
            );
            err.to_string()
        };
        assert_eq!(
            rejected("{basePath: nope}"),
            "plugin `hr`: rejected its config: http-refresh config: basePath must start with '/', got \"nope\"",
            "{component}"
        );
        // The exact wording of parse errors differs between serde and the
        // Python SDK; the plugin and what is wrong are named in both.
        for (config, says) in [
            (
                "{extra: 1}",
                "unknown field `extra`, expected `strategy` or `basePath`",
            ),
            (
                "{strategy: bogus}",
                "unknown variant `bogus`, expected `refresh` or `shutdown`",
            ),
            ("{basePath: 3}", "invalid type"),
        ] {
            let err = rejected(config);
            assert!(
                err.starts_with("plugin `hr`: rejected its config: http-refresh config: ")
                    && err.contains(says),
                "{component}: {config}: {err}"
            );
        }
    }
}

#[test]
fn compiled_artifacts_are_cached_by_digest_and_engine() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // The operator's folder keeps its mode; the artifacts' own is private.
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
    let rt = Runtime::new(
        RuntimeConfig {
            cache_dir: Some(cache.clone()),
            ..Default::default()
        },
        Arc::new(StaticLookups::default()),
    )
    .unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cache), 0o755, "the cache folder was changed");
    assert_eq!(mode(&cache.join("compiled")), 0o700);
    let entry = "name: ok\n    module: {module:misbehave}\n    sha256: {sha256:misbehave}\n    config: {mode: ok}\n    capabilities: {events: true}";
    load(&rt, entry).unwrap();
    let files: Vec<_> = std::fs::read_dir(cache.join("compiled"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().to_string();
    let sha = wasmwatch_testkit::sha256_file(&wasmwatch_testkit::plugin("misbehave"));
    assert!(name.starts_with(&sha) && name.ends_with(".cwasm"), "{name}");
    let modified = std::fs::metadata(&files[0]).unwrap().modified().unwrap();
    // A second load uses the artifact as it is.
    let plugin = load(&rt, entry).unwrap();
    assert_eq!(
        std::fs::metadata(&files[0]).unwrap().modified().unwrap(),
        modified
    );
    assert_eq!(messages(&plugin, &configmap_event()).len(), 1);
    // A damaged artifact is replaced, not trusted.
    std::fs::write(&files[0], b"garbage").unwrap();
    let plugin = load(&rt, entry).unwrap();
    assert_eq!(messages(&plugin, &configmap_event()).len(), 1);
    assert_ne!(std::fs::read(&files[0]).unwrap(), b"garbage");
}

#[test]
fn runtimes_sharing_a_cache_compile_the_same_plugin_at_once() {
    // Two replicas in one process (the local run) start together: each
    // round, four runtimes on one empty cache load the same module at once.
    // (A smoke test: the race it guards against, a temp file shared by
    // writers, needed overlapping writes and rarely showed here.)
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (cache, barrier) = (cache.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let rt = Runtime::new(
                        RuntimeConfig {
                            cache_dir: Some(cache),
                            ..Default::default()
                        },
                        Arc::new(StaticLookups::default()),
                    )
                    .unwrap();
                    barrier.wait();
                    load(&rt, "name: ok\n    module: {module:misbehave}\n    sha256: {sha256:misbehave}\n    config: {mode: noop}")
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        for t in threads {
            t.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        let files = std::fs::read_dir(&cache).unwrap().count();
        assert_eq!(files, 1, "one artifact, no temp files left");
    }
}

#[test]
fn concurrent_calls_are_bounded_and_all_served() {
    let rt = Runtime::new(
        RuntimeConfig {
            max_concurrency: 2,
            ..Default::default()
        },
        Arc::new(StaticLookups::default()),
    )
    .unwrap();
    let plugin = Arc::new(misbehave(&rt, "ok", "    capabilities: {events: true}"));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let p = plugin.clone();
            std::thread::spawn(move || {
                (0..20)
                    .map(|_| p.handle_blocking(&configmap_event()).unwrap().actions.len())
                    .sum::<usize>()
            })
        })
        .collect();
    let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, 8 * 20);
}

/// A Python component built with componentize-py's `--stub-wasi` has 38
/// core module instances (a plain build 14): the pool takes it (it took 32
/// before), and it runs. With the limit set lower, the load is refused
/// naming the count and the variable that raises it.
#[test]
fn a_stub_wasi_python_component_loads_and_runs_and_a_lower_limit_is_named() {
    let entry = "name: stub\n    module: {module:python/testing/stub-wasi}\n    sha256: {sha256:python/testing/stub-wasi}";
    let plugin = load(&runtime(), entry).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        messages(&plugin, &configmap_event()),
        [(
            "Seen".to_string(),
            "ConfigMap shop/orders: application.yaml".to_string()
        )]
    );
    let small = Runtime::new(
        RuntimeConfig {
            max_core_instances: 32,
            ..RuntimeConfig::default()
        },
        Arc::new(StaticLookups::default()),
    )
    .unwrap();
    let err = load(&small, entry).err().unwrap().to_string();
    assert!(
        err.contains("38 core module instances")
            && err.contains("maximum of 32")
            && err.contains("WASMWATCH_MAX_CORE_INSTANCES"),
        "{err}"
    );
}
