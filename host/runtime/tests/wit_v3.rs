//! WIT 0.3.0 (wit/0.3.0/plugin.wit) beside 0.2.0, with real components: a
//! 0.3.0 plugin (plugins/testing/v3-restart) loads, its workload lookups
//! carry the new fields, and its restarts come out as core restarts (the
//! apps/v1 kinds as today's, other kinds by group/version/kind, refused
//! naming the kind). The bundled plugins' behaviour (all on 0.4.0, in
//! Rust, JavaScript and Python) is covered by tests/bundled_plugins.rs;
//! here which world they load as (0.2.0 by the test components
//! plugins/testing/inert and plugins/js/testing/v2-restart), and what
//! each world makes of workloads named without a reference.
use std::path::Path;
use std::sync::Arc;

use wasmwatch_core::action::{Action, RestartStrategy, WorkloadKind, WorkloadRef};
use wasmwatch_core::lookups::{ObjectRef, ObjectUse, StaticLookups, UseVia, WorkloadInfo};
use wasmwatch_core::{ChangeEvent, ChangeType, Manifest, ObjectKind, ObjectSnapshot, Verdict};
use wasmwatch_runtime::{CheckedAction, Plugin, Runtime, RuntimeConfig};
use wasmwatch_testkit::pin;

const V2: &str = "wasmwatch:plugin/plugin@0.2.0";
const V3: &str = "wasmwatch:plugin/plugin@0.3.0";
const V4: &str = "wasmwatch:plugin/plugin@0.4.0";

/// A runtime answering lookups from `lookups`, with the shared compile cache.
fn runtime(lookups: StaticLookups) -> Runtime {
    let config = RuntimeConfig {
        cache_dir: Some(wasmwatch_testkit::artifact_cache_dir()),
        ..RuntimeConfig::default()
    };
    Runtime::new(config, Arc::new(lookups)).unwrap()
}

fn load(lookups: StaticLookups, entry: &str) -> Plugin {
    let rt = runtime(lookups);
    let yaml = format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - {}\n",
        entry.trim_start()
    );
    let m = Manifest::parse(&pin(&yaml), Path::new("/")).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    rt.load_blocking(&m.plugins[0], &m.base_dir)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// v3-restart with this config and restart grant.
fn v3(lookups: StaticLookups, config: &str, restart: &str) -> Plugin {
    load(
        lookups,
        &format!(
            "name: v3\n    module: {{module:v3-restart}}\n    sha256: {{sha256:v3-restart}}\n    config: {config}\n    capabilities: {{restart: {restart}}}"
        ),
    )
}

fn orders_changed() -> ChangeEvent {
    let obj = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1", "resourceVersion": "42"},
        "data": {"a.yaml": "x: 1", "b": "2", "c": "3"}
    });
    ChangeEvent::new(
        ChangeType::Modified,
        ObjectSnapshot::from_json(&obj).unwrap(),
        None,
    )
}

/// A use: `env:key`, `env-from`, `volume`, `volume:key`.
fn object_use(text: &str) -> ObjectUse {
    let (via, key) = match text.split_once(':') {
        Some((via, key)) => (via, Some(key.to_string())),
        None => (text, None),
    };
    let via = match via {
        "env" => UseVia::Env,
        "env-from" => UseVia::EnvFrom,
        "volume" => UseVia::Volume,
        other => panic!("{other}"),
    };
    ObjectUse { via, key }
}

/// A workload referencing Secret orders and ConfigMap orders, using the
/// latter as `uses` say.
fn workload(kind: WorkloadKind, name: &str, uses: &[&str]) -> WorkloadInfo {
    WorkloadInfo {
        workload: WorkloadRef {
            kind,
            namespace: "shop".into(),
            name: name.into(),
        },
        labels: Default::default(),
        annotations: Default::default(),
        template_annotations: Default::default(),
        references: vec![
            ObjectRef {
                kind: ObjectKind::Secret,
                name: "orders".into(),
                uses: vec![object_use("env:password")],
            },
            ObjectRef {
                kind: ObjectKind::ConfigMap,
                name: "orders".into(),
                uses: uses.iter().map(|u| object_use(u)).collect(),
            },
        ],
    }
}

fn restart(
    kind: WorkloadKind,
    name: &str,
    reason: &str,
    strategy: Option<RestartStrategy>,
) -> Action {
    let ev = orders_changed();
    Action::Restart {
        workload: WorkloadRef {
            kind,
            namespace: "shop".into(),
            name: name.into(),
        },
        reason: reason.into(),
        content_hash: format!("configmap/orders:{}", ev.digest),
        strategy,
    }
}

fn decide(plugin: &Plugin) -> Vec<CheckedAction> {
    plugin.handle_blocking(&orders_changed()).unwrap().actions
}

fn refusal(c: &CheckedAction) -> &str {
    match &c.verdict {
        Verdict::Refused { capability, reason } => {
            assert_eq!(*capability, "restart");
            reason
        }
        Verdict::Allowed => panic!("allowed: {:?}", c.action),
    }
}

#[test]
fn bundled_components_load_as_0_4_0_and_0_2_0_test_components_as_0_2_0() {
    for (module, config, world) in [
        ("rollout-restart", "{}", V4),
        ("http-refresh", "{}", V4),
        ("bus-refresh", "{connection: rabbit}", V4),
        ("js/rollout-restart", "{}", V4),
        ("python/http-refresh", "{}", V4),
        ("js/testing/v2-restart", "{}", V2),
        ("inert", "{}", V2),
    ] {
        let plugin = load(
            StaticLookups::default(),
            &format!(
                "name: p\n    module: {{module:{module}}}\n    sha256: {{sha256:{module}}}\n    config: {config}"
            ),
        );
        assert_eq!(plugin.world(), world, "{module}");
    }
    assert_eq!(v3(StaticLookups::default(), "{}", "[]").world(), V3);
}

/// A workload of kind `kind` that references nothing; a reload annotation
/// (on it or, `template`, on its pod template) names ConfigMap orders.
fn named_only(kind: WorkloadKind, name: &str, template: bool) -> WorkloadInfo {
    let annotation = [(
        "configmap.reloader.stakater.com/reload".to_string(),
        "other, ord.*".to_string(),
    )]
    .into();
    let mut w = WorkloadInfo {
        references: vec![],
        ..workload(kind, name, &[])
    };
    if template {
        w.template_annotations = annotation;
    } else {
        w.annotations = annotation;
    }
    w
}

/// The lookup answers with the workloads' group/version/kind, whether the
/// pod template references the object, and how it uses it; workloads a
/// reload annotation names come last, not referenced. The plugin's
/// restarts of what it found are today's restarts.
#[test]
fn a_0_3_0_plugin_sees_kinds_uses_and_named_workloads_and_restarts_as_before() {
    let lookups = StaticLookups {
        workloads: vec![
            workload(
                WorkloadKind::Deployment,
                "api",
                &["env:level", "volume:a.yaml", "volume:b"],
            ),
            workload(WorkloadKind::StatefulSet, "db", &["env-from", "volume"]),
            // Another object's workload is not returned.
            WorkloadInfo {
                references: vec![],
                ..workload(WorkloadKind::DaemonSet, "agent", &[])
            },
            named_only(
                WorkloadKind::from_gvk("batch", "v1", "CronJob"),
                "nightly",
                true,
            ),
        ],
        ..Default::default()
    };
    let plugin = v3(
        lookups,
        "{}",
        "{namespaces: [shop], kinds: [Deployment, StatefulSet]}",
    );
    let actions = decide(&plugin);
    let want = [
        restart(
            WorkloadKind::Deployment,
            "api",
            "ConfigMap shop/orders changed (referenced: true, uses: env:level,volume:a.yaml,volume:b)",
            None,
        ),
        restart(
            WorkloadKind::StatefulSet,
            "db",
            "ConfigMap shop/orders changed (referenced: true, uses: env-from,volume)",
            None,
        ),
        restart(
            WorkloadKind::from_gvk("batch", "v1", "CronJob"),
            "nightly",
            "ConfigMap shop/orders changed (referenced: false, uses: )",
            None,
        ),
    ];
    assert_eq!(
        actions.iter().map(|c| &c.action).collect::<Vec<_>>(),
        want.iter().collect::<Vec<_>>()
    );
    assert!(actions[..2].iter().all(|c| c.verdict == Verdict::Allowed));
    assert!(
        refusal(&actions[2]).contains("kind batch/v1/CronJob not granted"),
        "{:?}",
        actions[2].verdict
    );
}

/// A 0.2.0 plugin (plugins/js/testing/v2-restart) does not see the
/// workloads a reload annotation names without a reference: it restarts
/// what references the object, as before. The rollout-restarts (Rust and
/// JS, 0.4.0) restart them too, as Reloader does, of every kind granted.
#[test]
fn workloads_only_named_in_a_reload_annotation_restart_from_0_3_0_on() {
    let mut referencing = workload(WorkloadKind::Deployment, "api", &["env:level"]);
    referencing.annotations = [(
        "configmap.reloader.stakater.com/reload".to_string(),
        "orders".to_string(),
    )]
    .into();
    let lookups = || StaticLookups {
        workloads: vec![
            referencing.clone(),
            named_only(WorkloadKind::Deployment, "named", false),
            named_only(WorkloadKind::StatefulSet, "named-in-template", true),
            named_only(
                WorkloadKind::from_gvk("batch", "v1", "CronJob"),
                "nightly",
                false,
            ),
        ],
        ..Default::default()
    };
    let restarted = |module: &str, world: &str| -> Vec<String> {
        let plugin = load(
            lookups(),
            &format!(
                "name: p\n    module: {{module:{module}}}\n    sha256: {{sha256:{module}}}\n    config: {{}}\n    capabilities: {{restart: {{namespaces: [shop], kinds: [Deployment, StatefulSet, batch/v1/CronJob]}}}}"
            ),
        );
        assert_eq!(plugin.world(), world, "{module}");
        decide(&plugin)
            .into_iter()
            .filter_map(|c| match c.action {
                Action::Restart { workload, .. } => {
                    assert_eq!(c.verdict, Verdict::Allowed, "{workload:?}");
                    Some(workload.name)
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(restarted("js/testing/v2-restart", V2), ["api"]);
    for module in ["rollout-restart", "js/rollout-restart"] {
        assert_eq!(
            restarted(module, V4),
            ["api", "named", "named-in-template", "nightly"],
            "{module}"
        );
    }
}

/// A restart the plugin names by group/version/kind: apps/v1 is today's
/// restart, with the strategy the plugin chose.
#[test]
fn a_0_3_0_restart_of_an_apps_v1_deployment_is_todays_restart() {
    let config = "{kind: {group: apps, version: v1, kind: Deployment}, name: api}";
    let actions = decide(&v3(StaticLookups::default(), config, "[shop]"));
    assert_eq!(actions.len(), 1);
    assert_eq!(
        actions[0].action,
        restart(
            WorkloadKind::Deployment,
            "api",
            "ConfigMap shop/orders changed",
            None
        )
    );
    assert_eq!(actions[0].verdict, Verdict::Allowed);

    let config =
        "{kind: {group: apps, version: v1, kind: StatefulSet}, name: db, strategy: env-vars}";
    let actions = decide(&v3(StaticLookups::default(), config, "[shop]"));
    assert_eq!(
        actions[0].action,
        restart(
            WorkloadKind::StatefulSet,
            "db",
            "ConfigMap shop/orders changed",
            Some(RestartStrategy::EnvVars)
        )
    );
    assert_eq!(actions[0].verdict, Verdict::Allowed);

    // restart-at is refused but for Argo Rollouts, naming it.
    let config =
        "{kind: {group: apps, version: v1, kind: Deployment}, name: api, strategy: restart-at}";
    let actions = decide(&v3(StaticLookups::default(), config, "[shop]"));
    assert_eq!(
        actions[0].action,
        restart(
            WorkloadKind::Deployment,
            "api",
            "ConfigMap shop/orders changed",
            Some(RestartStrategy::RestartAt)
        )
    );
    assert_eq!(
        refusal(&actions[0]),
        "restarting Deployment shop/api: strategy restart-at restarts Argo Rollouts only \
         (argoproj.io/v1alpha1/Rollout); use annotations or env-vars"
    );
}

/// Another kind comes out by group/version/kind; it is refused unless
/// granted by name (the verdict names the kind), and allowed when granted.
#[test]
fn a_0_3_0_restart_of_another_kind_names_it() {
    for (group, version, kind, written) in [
        ("batch", "v1", "CronJob", "batch/v1/CronJob"),
        (
            "argoproj.io",
            "v1alpha1",
            "Rollout",
            "argoproj.io/v1alpha1/Rollout",
        ),
        (
            "",
            "v1",
            "ReplicationController",
            "v1/ReplicationController",
        ),
    ] {
        let config = format!(
            "{{kind: {{group: \"{group}\", version: {version}, kind: {kind}}}, name: nightly}}"
        );
        let want = restart(
            WorkloadKind::from_gvk(group, version, kind),
            "nightly",
            "ConfigMap shop/orders changed",
            None,
        );
        let Action::Restart { workload, .. } = &want else {
            unreachable!()
        };
        assert_eq!(workload.kind.to_string(), written);

        let plugin = v3(StaticLookups::default(), &config, "[shop]");
        let actions = decide(&plugin);
        assert_eq!(actions[0].action, want);
        assert_eq!(
            refusal(&actions[0]),
            format!(
                "restarting {written} shop/nightly: kind {written} not granted \
                 (restart.kinds: none given: the apps/v1 kinds)"
            )
        );
        assert_eq!(plugin.refused_actions(), 1);

        let granted = format!("{{namespaces: [shop], kinds: [Deployment, \"{written}\"]}}");
        let actions = decide(&v3(StaticLookups::default(), &config, &granted));
        assert_eq!(actions[0].action, want);
        assert_eq!(actions[0].verdict, Verdict::Allowed);
    }
}

const SPCPS: &str = "secrets-store.csi.x-k8s.io/v1/SecretProviderClassPodStatus";

/// A manifest watching the CSI driver's mount statuses, with one plugin
/// getting them.
fn csi_manifest(module: &str) -> Manifest {
    let yaml = format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nwatch: {{kinds: [ConfigMap, {SPCPS}]}}\nplugins:\n  - name: p\n    module: {{module:{module}}}\n    sha256: {{sha256:{module}}}\n    events: {{kinds: [ConfigMap, {SPCPS}]}}\n    capabilities: {{restart: {{namespaces: [shop]}}}}\n"
    );
    Manifest::parse(&pin(&yaml), Path::new("/")).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

/// A CSI mount status of pod api-1 for class vault-db, read with `m`'s
/// content of the kind, changed.
fn mount_status_rotated(m: &Manifest) -> ChangeEvent {
    let kind = ObjectKind::parse(SPCPS).unwrap();
    let spec = m.watch.custom(kind).unwrap();
    let body = serde_json::json!({"status": {
        "secretProviderClassName": "vault-db", "podName": "api-1",
        "objects": [{"id": "secret/db", "version": "v2"}]}});
    let meta = wasmwatch_core::event::Metadata {
        name: "api-1-shop-vault-db".into(),
        namespace: "shop".into(),
        resource_version: "7".into(),
        ..Default::default()
    };
    let snapshot = ObjectSnapshot::from_content(kind, meta, &body, &spec.content).unwrap();
    ChangeEvent::new(ChangeType::Modified, snapshot, None)
}

/// WIT 0.4.0: an object of a kind the manifest watches beyond ConfigMap
/// and Secret reaches a 0.4.0 plugin, with its group/version/kind and its
/// content as data, and the plugin's lookup by another such kind (the
/// SecretProviderClass) is answered; a 0.3.0 component naming such a kind
/// in `events.kinds` is refused at load, naming the kind and its world.
#[test]
fn a_watched_custom_kind_reaches_0_4_0_plugins_and_a_0_3_0_one_naming_it_is_refused() {
    let class = ObjectKind::parse(wasmwatch_core::lookups::SECRET_PROVIDER_CLASS).unwrap();
    let mounting = WorkloadInfo {
        annotations: [(
            "secretproviderclass.reloader.stakater.com/auto".to_string(),
            "true".to_string(),
        )]
        .into(),
        references: vec![ObjectRef {
            kind: class,
            name: "vault-db".into(),
            uses: vec![object_use("volume")],
        }],
        ..workload(WorkloadKind::Deployment, "api", &[])
    };
    let lookups = StaticLookups {
        workloads: vec![mounting],
        ..Default::default()
    };
    let m = csi_manifest("v3-restart");
    let err = runtime(StaticLookups::default())
        .load_blocking(&m.plugins[0], &m.base_dir)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains(&format!("its events.kinds name {SPCPS}")) && err.contains(V3),
        "{err}"
    );

    let m = csi_manifest("rollout-restart");
    let plugin = runtime(lookups)
        .load_blocking(&m.plugins[0], &m.base_dir)
        .unwrap();
    assert_eq!(plugin.world(), V4);
    let ev = mount_status_rotated(&m);
    let actions: Vec<Action> = plugin
        .handle_blocking(&ev)
        .unwrap()
        .actions
        .into_iter()
        .map(|c| c.action)
        .collect();
    assert_eq!(
        actions,
        vec![Action::Restart {
            workload: WorkloadRef {
                kind: WorkloadKind::Deployment,
                namespace: "shop".into(),
                name: "api".into(),
            },
            reason: "SecretProviderClass shop/vault-db changed".into(),
            content_hash: format!("secretproviderclass/vault-db:{}", ev.digest),
            strategy: None,
        }]
    );
}

/// The 0.4.0 fields cross a real Python and a real JavaScript component
/// (plugins/python/testing/echo and plugins/js/testing/echo, built with
/// each SDK): a CronJob and an Argo Rollout as the lookup names them,
/// `uses` with and without keys, `referenced` false for a workload only a
/// reload annotation names, a restart's strategy, and an object of a
/// custom kind with its content keys.
#[test]
fn python_and_js_plugins_see_0_4_0_workloads_uses_and_custom_kinds() {
    let lookups = || StaticLookups {
        workloads: vec![
            workload(
                WorkloadKind::from_gvk("batch", "v1", "CronJob"),
                "nightly",
                &["env:level", "volume"],
            ),
            workload(
                WorkloadKind::from_gvk("argoproj.io", "v1alpha1", "Rollout"),
                "canary",
                &["env-from"],
            ),
            named_only(WorkloadKind::Deployment, "named", false),
        ],
        ..Default::default()
    };
    for module in ["python/testing/echo", "js/testing/echo"] {
        let m = csi_manifest(module);
        let plugin = runtime(lookups())
            .load_blocking(&m.plugins[0], &m.base_dir)
            .unwrap_or_else(|e| panic!("{module}: {e}"));
        assert_eq!(plugin.world(), V4, "{module}");
        let mut said = Vec::new();
        let mut restarts = Vec::new();
        for c in plugin.handle_blocking(&orders_changed()).unwrap().actions {
            match c.action {
                Action::Event {
                    reason, message, ..
                } => said.push(format!("{reason}: {message}")),
                Action::Restart {
                    workload,
                    content_hash,
                    strategy,
                    ..
                } => {
                    assert_eq!(strategy, Some(RestartStrategy::RestartAt), "{module}");
                    restarts.push((workload.kind.to_string(), workload.name, content_hash));
                }
                other => panic!("{module}: {other:?}"),
            }
        }
        said.sort();
        assert_eq!(
            said,
            [
                "Object: /v1/ConfigMap a.yaml,b,c",
                "Workload: apps/v1 Deployment shop/named referenced=false uses=",
                "Workload: argoproj.io/v1alpha1 Rollout shop/canary referenced=true uses=env-from",
                "Workload: batch/v1 CronJob shop/nightly referenced=true uses=env:level,volume",
            ],
            "{module}"
        );
        restarts.sort();
        let hash = "echo/orders:1".to_string();
        assert_eq!(
            restarts,
            [
                ("Deployment".to_string(), "named".to_string(), hash.clone()),
                (
                    "argoproj.io/v1alpha1/Rollout".to_string(),
                    "canary".to_string(),
                    hash.clone()
                ),
                (
                    "batch/v1/CronJob".to_string(),
                    "nightly".to_string(),
                    hash.clone()
                ),
            ],
            "{module}"
        );

        // A custom kind: its group/version/kind and its content's keys.
        let ev = mount_status_rotated(&m);
        let said: Vec<String> = plugin
            .handle_blocking(&ev)
            .unwrap()
            .actions
            .into_iter()
            .map(|c| match c.action {
                Action::Event { message, .. } => message,
                other => panic!("{module}: {other:?}"),
            })
            .collect();
        assert_eq!(
            said,
            [format!(
                "{SPCPS} status.objects,status.secretProviderClassName"
            )],
            "{module}"
        );
    }
}
