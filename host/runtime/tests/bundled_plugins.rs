//! The bundled plugins (plugins/bus-refresh, plugins/rollout-restart) in the
//! real runtime: exact actions and verdicts for each documented behaviour.
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use wasmwatch_core::action::{Action, Header, WorkloadKind, WorkloadRef};
use wasmwatch_core::lookups::{ObjectRef, ServiceInfo, StaticLookups, WorkloadInfo};
use wasmwatch_core::{ChangeEvent, ChangeType, Manifest, ObjectKind, ObjectSnapshot, Verdict};
use wasmwatch_runtime::{LoadError, Plugin, Runtime, RuntimeConfig};
use wasmwatch_testkit::pin;

/// A manifest with two bus connections and one plugin entry; `entry` is YAML
/// indented by four spaces.
fn manifest(entry: &str) -> Manifest {
    let yaml = format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nbuses:\n  - name: rabbit\n    amqp: {{url: \"amqp://guest:guest@rabbitmq:5672/%2f\"}}\n  - name: nats\n    nats: {{url: \"nats://nats:4222\"}}\nplugins:\n  - {}\n",
        entry.trim_start()
    );
    Manifest::parse(&pin(&yaml), Path::new("/")).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

/// Loads through an artifact cache shared by the tests (and by later runs),
/// one load at a time: the first compiles a module, the others reuse it. A
/// JavaScript component takes tens of seconds to compile in a debug build.
fn try_load(lookups: StaticLookups, entry: &str) -> Result<Plugin, LoadError> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let config = RuntimeConfig {
        cache_dir: Some(wasmwatch_testkit::artifact_cache_dir()),
        ..RuntimeConfig::default()
    };
    let rt = Runtime::new(config, Arc::new(lookups)).unwrap();
    let m = manifest(entry);
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    rt.load_blocking(&m.plugins[0], &m.base_dir)
}

fn load(lookups: StaticLookups, entry: &str) -> Plugin {
    try_load(lookups, entry).unwrap_or_else(|e| panic!("{e}"))
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

struct Obj<'a> {
    kind: ObjectKind,
    namespace: &'a str,
    name: &'a str,
    uid: &'a str,
    rv: &'a str,
    annotations: &'a [(&'a str, &'a str)],
    value: &'a str,
}

const ORDERS: Obj<'static> = Obj {
    kind: ObjectKind::ConfigMap,
    namespace: "shop",
    name: "orders",
    uid: "u-1",
    rv: "42",
    annotations: &[],
    value: "greeting: hi",
};

fn event(change: ChangeType, o: &Obj) -> ChangeEvent {
    let mut meta = serde_json::json!({
        "name": o.name, "namespace": o.namespace, "resourceVersion": o.rv,
        "annotations": map(o.annotations),
    });
    if !o.uid.is_empty() {
        meta["uid"] = o.uid.into();
    }
    let obj = match o.kind {
        ObjectKind::ConfigMap => serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {"application.yaml": o.value}
        }),
        ObjectKind::Secret => serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": meta,
            "stringData": {"password": o.value}
        }),
        ObjectKind::Custom(k) => panic!("{k:?}: no such fixture"),
    };
    ChangeEvent::new(change, ObjectSnapshot::from_json(&obj).unwrap(), None)
}

fn modified(o: &Obj) -> ChangeEvent {
    event(ChangeType::Modified, o)
}

fn service(namespace: &str, name: &str, labels: &[(&str, &str)]) -> ServiceInfo {
    ServiceInfo {
        namespace: namespace.into(),
        name: name.into(),
        labels: map(labels),
        annotations: Default::default(),
        ports: vec![],
    }
}

// ---------------------------------------------------------------- bus-refresh

fn bus_refresh(lookups: StaticLookups, config: &str, bus: &str) -> Plugin {
    load(
        lookups,
        &format!(
            "name: bus\n    module: {{module:bus-refresh}}\n    sha256: {{sha256:bus-refresh}}\n    config: {config}\n    capabilities: {{bus: [{bus}]}}"
        ),
    )
}

/// One published message, its payload parsed.
#[derive(Debug)]
struct Published {
    connection: String,
    destination: String,
    routing_key: String,
    headers: Vec<Header>,
    raw: String,
    json: serde_json::Map<String, serde_json::Value>,
    verdict: Verdict,
}

impl Published {
    fn str(&self, field: &str) -> &str {
        self.json[field]
            .as_str()
            .unwrap_or_else(|| panic!("{field} in {}", self.raw))
    }
}

fn published(plugin: &Plugin, ev: &ChangeEvent) -> Vec<Published> {
    plugin
        .handle_blocking(ev)
        .unwrap()
        .actions
        .into_iter()
        .map(|c| match c.action {
            Action::Publish {
                connection,
                destination,
                routing_key,
                headers,
                payload,
            } => {
                let raw = String::from_utf8(payload).unwrap();
                let json = match serde_json::from_str(&raw).unwrap() {
                    serde_json::Value::Object(m) => m,
                    other => panic!("payload is not an object: {other}"),
                };
                Published {
                    connection,
                    destination,
                    routing_key,
                    headers,
                    raw,
                    json,
                    verdict: c.verdict,
                }
            }
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

fn destinations(msgs: &[Published]) -> Vec<&str> {
    msgs.iter().map(|m| m.str("destinationService")).collect()
}

fn ids(msgs: &[Published]) -> Vec<String> {
    msgs.iter().map(|m| m.str("id").to_string()).collect()
}

fn assert_uuid(id: &str) {
    let b = id.as_bytes();
    assert_eq!(b.len(), 36, "{id}");
    for (i, c) in id.chars().enumerate() {
        if [8, 13, 18, 23].contains(&i) {
            assert_eq!(c, '-', "{id}");
        } else {
            assert!(c.is_ascii_hexdigit() && !c.is_ascii_uppercase(), "{id}");
        }
    }
    assert_eq!(b[14], b'8', "version 8: {id}");
    assert!(b"89ab".contains(&b[19]), "RFC 9562 variant: {id}");
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn bus_refresh_publishes_springs_remote_event_per_app() {
    let plugin = bus_refresh(
        StaticLookups::default(),
        "{connection: rabbit}",
        "rabbit/springCloudBus",
    );
    let ev = modified(&Obj {
        annotations: &[("spring.cloud.kubernetes.configmap.apps", "orders, billing")],
        ..ORDERS
    });
    let before = now_ms();
    let msgs = published(&plugin, &ev);
    let after = now_ms();
    assert_eq!(destinations(&msgs), ["orders:**", "billing:**"]);
    for m in &msgs {
        assert_eq!(m.verdict, Verdict::Allowed);
        assert_eq!(m.connection, "rabbit");
        assert_eq!(m.destination, "springCloudBus");
        // Spring Cloud Stream's RabbitMQ binder publishes with the destination
        // as routing key when no routingKeyExpression is set.
        assert_eq!(m.routing_key, "springCloudBus");
        assert_eq!(
            m.headers,
            vec![Header {
                name: "content-type".into(),
                value: "application/json".into()
            }]
        );
        // Exactly Spring's fields, in Spring's order.
        let keys: Vec<&str> = m.json.keys().map(String::as_str).collect();
        let mut expected = vec![
            "type",
            "timestamp",
            "originService",
            "destinationService",
            "id",
        ];
        expected.sort();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(sorted, expected, "{}", m.raw);
        assert!(
            m.raw
                .starts_with("{\"type\":\"RefreshRemoteApplicationEvent\",\"timestamp\":"),
            "{}",
            m.raw
        );
        assert_eq!(m.str("type"), "RefreshRemoteApplicationEvent");
        assert_eq!(m.str("originService"), "wasmwatch");
        let ts = m.json["timestamp"]
            .as_u64()
            .expect("timestamp is an integer");
        assert!(
            before <= ts && ts <= after,
            "{ts} not in {before}..={after}"
        );
        assert!(m.str("destinationService").ends_with(":**"));
        assert_uuid(m.str("id"));
    }
    let ids = ids(&msgs);
    assert_ne!(ids[0], ids[1], "each app's message has its own id");
}

#[test]
fn bus_refresh_ids_are_stable_per_change_and_differ_between_changes() {
    let plugin = bus_refresh(
        StaticLookups::default(),
        "{connection: rabbit}",
        "rabbit/springCloudBus",
    );
    let first = ids(&published(&plugin, &modified(&ORDERS)));
    // A redelivery of the same change (a fresh instance, later) carries the same id.
    assert_eq!(ids(&published(&plugin, &modified(&ORDERS))), first);
    let mut replay = modified(&ORDERS);
    replay.replay = true;
    assert_eq!(ids(&published(&plugin, &replay)), first);
    // Another resourceVersion, another content, another object: other ids.
    let other_rv = ids(&published(&plugin, &modified(&Obj { rv: "43", ..ORDERS })));
    let other_content = ids(&published(
        &plugin,
        &modified(&Obj {
            value: "greeting: hello",
            ..ORDERS
        }),
    ));
    let other_uid = ids(&published(
        &plugin,
        &modified(&Obj {
            uid: "u-2",
            ..ORDERS
        }),
    ));
    for other in [&other_rv, &other_content, &other_uid] {
        assert_eq!(other.len(), 1);
        assert_ne!(other, &first);
    }
    // Without a uid, namespace/name identifies the object: still stable.
    let no_uid = Obj { uid: "", ..ORDERS };
    let a = ids(&published(&plugin, &modified(&no_uid)));
    assert_eq!(ids(&published(&plugin, &modified(&no_uid))), a);
    assert_ne!(a, first);
    // The shutdown event of the same change has its own id.
    let shutdown = bus_refresh(
        StaticLookups::default(),
        "{connection: rabbit, strategy: shutdown}",
        "rabbit/springCloudBus",
    );
    assert_ne!(ids(&published(&shutdown, &modified(&ORDERS))), first);
}

#[test]
fn bus_refresh_shutdown_and_custom_destination() {
    let plugin = bus_refresh(
        StaticLookups::default(),
        "{connection: nats, destination: bus.events, strategy: shutdown, originService: config-watcher}",
        "\"nats/*\"",
    );
    let msgs = published(&plugin, &modified(&ORDERS));
    assert_eq!(msgs.len(), 1);
    let m = &msgs[0];
    assert_eq!(m.verdict, Verdict::Allowed);
    assert_eq!(
        (
            m.connection.as_str(),
            m.destination.as_str(),
            m.routing_key.as_str()
        ),
        ("nats", "bus.events", "bus.events")
    );
    assert_eq!(m.str("type"), "ShutdownRemoteApplicationEvent");
    assert!(
        m.raw
            .starts_with("{\"type\":\"ShutdownRemoteApplicationEvent\",\"timestamp\":")
    );
    assert_eq!(m.str("originService"), "config-watcher");
    assert_eq!(m.str("destinationService"), "orders:**");
    // An explicit routing key.
    let plugin = bus_refresh(
        StaticLookups::default(),
        "{connection: rabbit, routingKey: \"#\"}",
        "rabbit/springCloudBus",
    );
    assert_eq!(published(&plugin, &modified(&ORDERS))[0].routing_key, "#");
}

#[test]
fn bus_refresh_resolves_apps_like_spring_cloud_kubernetes() {
    let lookups = StaticLookups {
        services: vec![
            service("shop", "web", &[("team", "shop"), ("tier", "web")]),
            service("shop", "batch", &[("team", "shop")]),
            service("other", "web2", &[("team", "shop"), ("tier", "web")]),
            service("shop", "web3", &[("team", "shop"), ("tier", "web")]),
        ],
        ..Default::default()
    };
    let plugin = bus_refresh(lookups, "{connection: rabbit}", "rabbit/springCloudBus");
    // Labels annotation: the matching Services in the object's namespace.
    let ev = modified(&Obj {
        annotations: &[(
            "spring.cloud.kubernetes.configmap.labels",
            "team=shop, tier=web",
        )],
        ..ORDERS
    });
    assert_eq!(
        destinations(&published(&plugin, &ev)),
        ["web:**", "web3:**"]
    );
    // Labels matching no Service: nothing to address.
    let ev = modified(&Obj {
        annotations: &[("spring.cloud.kubernetes.configmap.labels", "team=none")],
        ..ORDERS
    });
    assert!(published(&plugin, &ev).is_empty());
    // The apps annotation wins over labels; names need no Service; duplicates once.
    let ev = modified(&Obj {
        annotations: &[
            ("spring.cloud.kubernetes.configmap.apps", "a,b, a,"),
            ("spring.cloud.kubernetes.configmap.labels", "team=shop"),
        ],
        ..ORDERS
    });
    assert_eq!(destinations(&published(&plugin, &ev)), ["a:**", "b:**"]);
    // No annotation: the object's name, even without a Service of that name.
    assert_eq!(
        destinations(&published(&plugin, &modified(&ORDERS))),
        ["orders:**"]
    );
    // Secrets read the secret annotations, not the configmap ones.
    let secret = Obj {
        kind: ObjectKind::Secret,
        name: "db",
        annotations: &[
            ("spring.cloud.kubernetes.secret.apps", "payments"),
            ("spring.cloud.kubernetes.configmap.apps", "wrong"),
        ],
        ..ORDERS
    };
    assert_eq!(
        destinations(&published(&plugin, &modified(&secret))),
        ["payments:**"]
    );
    let secret = Obj {
        kind: ObjectKind::Secret,
        name: "db",
        annotations: &[("spring.cloud.kubernetes.configmap.apps", "wrong")],
        ..ORDERS
    };
    assert_eq!(
        destinations(&published(&plugin, &modified(&secret))),
        ["db:**"]
    );
}

#[test]
fn bus_refresh_publishing_outside_the_grant_is_refused() {
    let plugin = bus_refresh(
        StaticLookups::default(),
        "{connection: rabbit}",
        "rabbit/otherExchange",
    );
    let msgs = published(&plugin, &modified(&ORDERS));
    assert_eq!(
        msgs[0].verdict,
        Verdict::Refused {
            capability: "bus",
            reason: "publishing to rabbit/springCloudBus not granted".into()
        }
    );
    assert_eq!(plugin.refused_actions(), 1);
}

#[test]
fn bus_refresh_config_is_checked_at_load() {
    let load_with = |config: &str| {
        try_load(
            StaticLookups::default(),
            &format!(
                "name: bus\n    module: {{module:bus-refresh}}\n    sha256: {{sha256:bus-refresh}}\n    config: {config}"
            ),
        )
        .err()
        .map(|e| e.to_string())
    };
    let err = load_with("{}").unwrap();
    assert!(
        err.starts_with(
            "plugin `bus`: rejected its config: bus-refresh config: missing field `connection`"
        ),
        "{err}"
    );
    let err = load_with("{connection: rabbit, strategy: reboot}").unwrap();
    assert!(
        err.starts_with(
            "plugin `bus`: rejected its config: bus-refresh config: unknown variant `reboot`"
        ),
        "{err}"
    );
    let err = load_with("{connection: rabbit, exchange: x}").unwrap();
    assert!(err.contains("unknown field `exchange`"), "{err}");
    assert_eq!(
        load_with("{connection: \" \"}").unwrap(),
        "plugin `bus`: rejected its config: bus-refresh config: connection must not be empty"
    );
    assert_eq!(load_with("{connection: nats}"), None);
}

// ------------------------------------------------------------ rollout-restart

fn workload(
    kind: WorkloadKind,
    name: &str,
    annotations: &[(&str, &str)],
    template_annotations: &[(&str, &str)],
    references: &[(ObjectKind, &str)],
) -> WorkloadInfo {
    WorkloadInfo {
        workload: WorkloadRef {
            kind,
            namespace: "shop".into(),
            name: name.into(),
        },
        labels: Default::default(),
        annotations: map(annotations),
        template_annotations: map(template_annotations),
        references: references
            .iter()
            .map(|(kind, name)| ObjectRef {
                kind: *kind,
                name: name.to_string(),
                uses: vec![],
            })
            .collect(),
    }
}

fn deploy(name: &str, annotations: &[(&str, &str)], refs: &[(ObjectKind, &str)]) -> WorkloadInfo {
    workload(WorkloadKind::Deployment, name, annotations, &[], refs)
}

const CM: ObjectKind = ObjectKind::ConfigMap;
const SECRET: ObjectKind = ObjectKind::Secret;

/// The two implementations of rollout-restart (testkit component names):
/// every rollout-restart test below runs over each, as `rust::NAME` and
/// `js::NAME`.
macro_rules! over_both_rollout_restarts {
    ($($test:ident),* $(,)?) => {
        mod rust {
            $(#[test]
            fn $test() {
                super::$test("rollout-restart")
            })*
        }
        mod js {
            $(#[test]
            fn $test() {
                super::$test("js/rollout-restart")
            })*
        }
    };
}

over_both_rollout_restarts!(
    rollout_restart_auto_restarts_referencing_workloads,
    rollout_restart_the_hash_identifies_the_content,
    rollout_restart_kind_specific_auto_fires_only_for_its_kind,
    rollout_restart_named_reload_entries_are_anchored_regexes,
    rollout_restart_reads_the_pod_template_when_the_workload_says_nothing,
    rollout_restart_search_needs_match_on_the_object,
    rollout_restart_ignore_and_exclude,
    rollout_restart_create_and_delete_follow_reloaders_defaults,
    rollout_restart_auto_reload_all_respects_opt_outs,
    rollout_restart_outside_the_granted_namespaces_is_refused,
    rollout_restart_rejects_unknown_config,
    rollout_restart_rejects_config_of_the_wrong_type,
    rollout_restart_webhook_mode_posts_one_notification_instead_of_restarting,
    rollout_restart_webhook_mode_can_post_reloaders_body_for_every_change,
    rollout_restart_alert_mode_restarts_and_alerts_once_per_workload,
    rollout_restart_alert_sinks_are_reloaders_formats,
    rollout_restart_mode_config_errors_name_the_field,
    rollout_restart_custom_annotation_names_replace_reloaders,
    rollout_restart_custom_annotation_names_are_checked,
    rollout_restart_ignored_workload_types_skip_jobs_and_cronjobs,
);

/// rollout-restart `module` (a testkit component name) with these workloads.
fn rollout(module: &str, workloads: Vec<WorkloadInfo>, config: &str) -> Plugin {
    load(
        StaticLookups {
            workloads,
            ..Default::default()
        },
        &format!(
            "name: restart\n    module: {{module:{module}}}\n    sha256: {{sha256:{module}}}\n    config: {config}\n    capabilities: {{restart: [shop]}}"
        ),
    )
}

/// The names of the restarted workloads, checking every action's reason,
/// hash and verdict.
fn restarted(plugin: &Plugin, ev: &ChangeEvent) -> Vec<String> {
    let what = match ev.change {
        ChangeType::Added => "created",
        ChangeType::Deleted => "deleted",
        _ => "changed",
    };
    let o = &ev.object;
    let hash = match ev.change {
        ChangeType::Deleted => "deleted",
        _ => ev.digest.as_str(),
    };
    plugin
        .handle_blocking(ev)
        .unwrap()
        .actions
        .into_iter()
        .map(|c| match c.action {
            Action::Restart {
                workload,
                reason,
                content_hash,
                strategy: None,
            } => {
                assert_eq!(
                    reason,
                    format!("{} {}/{} {what}", o.kind.as_str(), o.namespace, o.name)
                );
                assert_eq!(
                    content_hash,
                    format!("{}/{}:{hash}", o.kind.as_str().to_lowercase(), o.name)
                );
                assert_eq!(c.verdict, Verdict::Allowed);
                assert_eq!(workload.namespace, o.namespace);
                workload.name
            }
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

fn secret(name: &'static str) -> Obj<'static> {
    Obj {
        kind: SECRET,
        name,
        ..ORDERS
    }
}

fn rollout_restart_auto_restarts_referencing_workloads(module: &str) {
    let plugin = rollout(
        module,
        vec![
            deploy(
                "api",
                &[("reloader.stakater.com/auto", "true")],
                &[(CM, "orders")],
            ),
            deploy("plain", &[], &[(CM, "orders")]),
            deploy(
                "off",
                &[("reloader.stakater.com/auto", "false")],
                &[(CM, "orders")],
            ),
            deploy(
                "elsewhere",
                &[("reloader.stakater.com/auto", "true")],
                &[(CM, "billing")],
            ),
            workload(
                WorkloadKind::StatefulSet,
                "db",
                &[("reloader.stakater.com/auto", "true")],
                &[],
                &[(SECRET, "orders"), (CM, "orders")],
            ),
            workload(
                WorkloadKind::DaemonSet,
                "agent",
                &[("wasmwatch.io/auto", "true")],
                &[],
                &[(CM, "orders")],
            ),
        ],
        "{}",
    );
    let ev = modified(&ORDERS);
    let decision = plugin.handle_blocking(&ev).unwrap();
    let kinds: Vec<_> = decision
        .actions
        .iter()
        .map(|c| match &c.action {
            Action::Restart { workload, .. } => (workload.kind.clone(), workload.name.as_str()),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (WorkloadKind::Deployment, "api"),
            (WorkloadKind::StatefulSet, "db"),
            (WorkloadKind::DaemonSet, "agent"),
        ]
    );
    assert_eq!(restarted(&plugin, &ev), ["api", "db", "agent"]);
    // Any referenced Secret too.
    assert_eq!(restarted(&plugin, &modified(&secret("orders"))), ["db"]);
    // A resync counts as a change.
    assert_eq!(
        restarted(&plugin, &event(ChangeType::Resynced, &ORDERS)),
        ["api", "db", "agent"]
    );
}

fn rollout_restart_the_hash_identifies_the_content(module: &str) {
    let plugin = rollout(
        module,
        vec![deploy(
            "api",
            &[("reloader.stakater.com/auto", "true")],
            &[(CM, "orders")],
        )],
        "{}",
    );
    let hash = |ev: &ChangeEvent| match &plugin.handle_blocking(ev).unwrap().actions[0].action {
        Action::Restart { content_hash, .. } => content_hash.clone(),
        other => panic!("unexpected {other:?}"),
    };
    let a = hash(&modified(&ORDERS));
    assert_eq!(a, format!("configmap/orders:{}", modified(&ORDERS).digest));
    // Same content at another resourceVersion: same hash, the host skips it.
    assert_eq!(hash(&modified(&Obj { rv: "99", ..ORDERS })), a);
    assert_ne!(
        hash(&modified(&Obj {
            value: "greeting: hello",
            ..ORDERS
        })),
        a
    );
}

fn rollout_restart_kind_specific_auto_fires_only_for_its_kind(module: &str) {
    let refs = [(CM, "orders"), (SECRET, "orders")];
    let plugin = rollout(
        module,
        vec![
            deploy(
                "cm-only",
                &[("configmap.reloader.stakater.com/auto", "true")],
                &refs,
            ),
            deploy(
                "secret-only",
                &[("secret.reloader.stakater.com/auto", "true")],
                &refs,
            ),
            deploy("ww-cm", &[("wasmwatch.io/auto-configmaps", "true")], &refs),
            deploy("ww-secret", &[("wasmwatch.io/auto-secrets", "true")], &refs),
        ],
        "{}",
    );
    assert_eq!(restarted(&plugin, &modified(&ORDERS)), ["cm-only", "ww-cm"]);
    // configmaps.exclude names ConfigMaps only.
    assert_eq!(
        restarted(&plugin, &modified(&secret("orders"))),
        ["secret-only", "ww-secret"]
    );
}

fn rollout_restart_named_reload_entries_are_anchored_regexes(module: &str) {
    let refs = [
        (CM, "orders"),
        (CM, "orders-v2"),
        (CM, "my-orders"),
        (SECRET, "db-password"),
    ];
    let plugin = rollout(
        module,
        vec![
            deploy(
                "exact",
                &[("configmap.reloader.stakater.com/reload", "billing, orders")],
                &refs,
            ),
            deploy(
                "regex",
                &[("configmap.reloader.stakater.com/reload", "orders-.*")],
                &refs,
            ),
            deploy(
                "partial",
                &[("configmap.reloader.stakater.com/reload", "order")],
                &refs,
            ),
            deploy(
                "secrets",
                &[("secret.reloader.stakater.com/reload", "db-.+")],
                &refs,
            ),
            deploy(
                "ours",
                &[("wasmwatch.io/reload-configmaps", "(my-)?orders")],
                &refs,
            ),
            deploy(
                "ours-secret",
                &[("wasmwatch.io/reload-secrets", "db-password")],
                &refs,
            ),
            deploy(
                "invalid",
                &[("configmap.reloader.stakater.com/reload", "orders-v2, [")],
                &refs,
            ),
        ],
        "{}",
    );
    assert_eq!(restarted(&plugin, &modified(&ORDERS)), ["exact", "ours"]);
    let v2 = Obj {
        name: "orders-v2",
        ..ORDERS
    };
    assert_eq!(restarted(&plugin, &modified(&v2)), ["regex", "invalid"]);
    let mine = Obj {
        name: "my-orders",
        ..ORDERS
    };
    assert_eq!(restarted(&plugin, &modified(&mine)), ["ours"]);
    // A ConfigMap annotation never names a Secret.
    assert_eq!(
        restarted(&plugin, &modified(&secret("db-password"))),
        ["secrets", "ours-secret"]
    );
}

fn rollout_restart_reads_the_pod_template_when_the_workload_says_nothing(module: &str) {
    let refs = [(CM, "orders")];
    let plugin = rollout(
        module,
        vec![
            workload(
                WorkloadKind::Deployment,
                "template-auto",
                &[("team", "shop")],
                &[("reloader.stakater.com/auto", "true")],
                &refs,
            ),
            workload(
                WorkloadKind::Deployment,
                "template-named",
                &[],
                &[("configmap.reloader.stakater.com/reload", "orders")],
                &refs,
            ),
            // The workload's own annotations decide when they hold any.
            workload(
                WorkloadKind::Deployment,
                "workload-wins",
                &[("configmap.reloader.stakater.com/reload", "billing")],
                &[("reloader.stakater.com/auto", "true")],
                &refs,
            ),
        ],
        "{}",
    );
    assert_eq!(
        restarted(&plugin, &modified(&ORDERS)),
        ["template-auto", "template-named"]
    );
}

fn rollout_restart_search_needs_match_on_the_object(module: &str) {
    let refs = [(CM, "orders")];
    let plugin = rollout(
        module,
        vec![
            deploy(
                "searching",
                &[("reloader.stakater.com/search", "true")],
                &refs,
            ),
            deploy("ours", &[("wasmwatch.io/search", "true")], &refs),
            deploy("plain", &[], &refs),
        ],
        "{}",
    );
    assert!(restarted(&plugin, &modified(&ORDERS)).is_empty());
    let matching = Obj {
        annotations: &[("reloader.stakater.com/match", "true")],
        ..ORDERS
    };
    assert_eq!(
        restarted(&plugin, &modified(&matching)),
        ["searching", "ours"]
    );
    let ours = Obj {
        annotations: &[("wasmwatch.io/match", "true")],
        ..ORDERS
    };
    assert_eq!(restarted(&plugin, &modified(&ours)), ["searching", "ours"]);
    let no = Obj {
        annotations: &[("reloader.stakater.com/match", "false")],
        ..ORDERS
    };
    assert!(restarted(&plugin, &modified(&no)).is_empty());
}

fn rollout_restart_ignore_and_exclude(module: &str) {
    let refs = [(CM, "orders"), (CM, "billing")];
    let plugin = rollout(
        module,
        vec![
            deploy("auto", &[("reloader.stakater.com/auto", "true")], &refs),
            deploy(
                "named",
                &[("configmap.reloader.stakater.com/reload", "orders,billing")],
                &refs,
            ),
            deploy(
                "excludes-orders",
                &[
                    ("reloader.stakater.com/auto", "true"),
                    ("configmaps.exclude.reloader.stakater.com/reload", "orders"),
                ],
                &refs,
            ),
            deploy(
                "ours-excludes-orders",
                &[
                    ("wasmwatch.io/auto", "true"),
                    ("wasmwatch.io/exclude-configmaps", "x, orders"),
                ],
                &refs,
            ),
        ],
        "{}",
    );
    assert_eq!(restarted(&plugin, &modified(&ORDERS)), ["auto", "named"]);
    let billing = Obj {
        name: "billing",
        ..ORDERS
    };
    assert_eq!(
        restarted(&plugin, &modified(&billing)),
        ["auto", "named", "excludes-orders", "ours-excludes-orders"]
    );
    for ignore in ["reloader.stakater.com/ignore", "wasmwatch.io/ignore"] {
        let ignored = Obj {
            annotations: &[(ignore, "true")],
            ..ORDERS
        };
        assert!(
            restarted(&plugin, &modified(&ignored)).is_empty(),
            "{ignore}"
        );
    }
    let not_ignored = Obj {
        annotations: &[("reloader.stakater.com/ignore", "false")],
        ..ORDERS
    };
    assert_eq!(
        restarted(&plugin, &modified(&not_ignored)),
        ["auto", "named"]
    );
}

fn rollout_restart_create_and_delete_follow_reloaders_defaults(module: &str) {
    let workloads = || {
        vec![deploy(
            "api",
            &[("reloader.stakater.com/auto", "true")],
            &[(CM, "orders")],
        )]
    };
    // Reloader: --reload-on-create=false, --reload-on-delete=false.
    let defaults = rollout(module, workloads(), "null");
    assert!(restarted(&defaults, &event(ChangeType::Added, &ORDERS)).is_empty());
    assert!(restarted(&defaults, &event(ChangeType::Deleted, &ORDERS)).is_empty());
    assert_eq!(restarted(&defaults, &modified(&ORDERS)), ["api"]);
    let both = rollout(
        module,
        workloads(),
        "{reloadOnCreate: true, reloadOnDelete: true}",
    );
    // `restarted` checks the reasons (`created`, `deleted`) and the deletion's
    // hash `configmap/orders:deleted`.
    assert_eq!(
        restarted(&both, &event(ChangeType::Added, &ORDERS)),
        ["api"]
    );
    assert_eq!(
        restarted(&both, &event(ChangeType::Deleted, &ORDERS)),
        ["api"]
    );
}

fn rollout_restart_auto_reload_all_respects_opt_outs(module: &str) {
    let refs = [(CM, "orders")];
    let plugin = rollout(
        module,
        vec![
            deploy("plain", &[], &refs),
            deploy(
                "opted-out",
                &[("reloader.stakater.com/auto", "false")],
                &refs,
            ),
            deploy(
                "cm-opted-out",
                &[("configmap.reloader.stakater.com/auto", "false")],
                &refs,
            ),
        ],
        "{autoReloadAll: true}",
    );
    assert_eq!(restarted(&plugin, &modified(&ORDERS)), ["plain"]);
}

fn rollout_restart_outside_the_granted_namespaces_is_refused(module: &str) {
    let mut w = deploy(
        "api",
        &[("reloader.stakater.com/auto", "true")],
        &[(CM, "orders")],
    );
    w.workload.namespace = "payments".into();
    let plugin = rollout(module, vec![w], "{}");
    let ev = modified(&Obj {
        namespace: "payments",
        ..ORDERS
    });
    let decision = plugin.handle_blocking(&ev).unwrap();
    assert_eq!(decision.actions.len(), 1);
    assert_eq!(
        decision.actions[0].verdict,
        Verdict::Refused {
            capability: "restart",
            reason: "restarting Deployment payments/api: namespace \"payments\" not granted".into()
        }
    );
    assert_eq!(decision.allowed().count(), 0);
    assert_eq!(plugin.refused_actions(), 1);
}

/// The error `check-config` gives for `config` (YAML) at load.
fn rollout_config_error(module: &str, config: &str) -> String {
    try_load(
        StaticLookups::default(),
        &format!(
            "name: restart\n    module: {{module:{module}}}\n    sha256: {{sha256:{module}}}\n    config: {config}"
        ),
    )
    .err()
    .unwrap_or_else(|| panic!("{module} accepted config {config}"))
    .to_string()
}

fn rollout_restart_rejects_unknown_config(module: &str) {
    let err = rollout_config_error(module, "{reloadOnUpdate: true}");
    assert!(
        err.starts_with(
            "plugin `restart`: rejected its config: rollout-restart config: unknown field `reloadOnUpdate`"
        ),
        "{err}"
    );
}

fn rollout_restart_rejects_config_of_the_wrong_type(module: &str) {
    let err = rollout_config_error(module, "{reloadOnCreate: \"yes\"}");
    assert!(
        err.starts_with(
            "plugin `restart`: rejected its config: rollout-restart config: invalid type: string \"yes\", expected a boolean"
        ),
        "{err}"
    );
}

// ------------------------------------------ rollout-restart webhook / alert

const HOOK: &str = "http://hooks.example/reload";

/// rollout-restart `module` in `config`'s mode, granted restarts in `shop`
/// and calls to [`HOOK`].
fn rollout_calling(module: &str, workloads: Vec<WorkloadInfo>, config: &str) -> Plugin {
    load(
        StaticLookups {
            workloads,
            ..Default::default()
        },
        &format!(
            "name: restart\n    module: {{module:{module}}}\n    sha256: {{sha256:{module}}}\n    config: {config}\n    capabilities: {{restart: [shop], http: [\"{HOOK}\"]}}"
        ),
    )
}

/// The decision's actions as `plugin run` prints them (action and verdict).
fn printed(plugin: &Plugin, ev: &ChangeEvent) -> serde_json::Value {
    serde_json::to_value(plugin.handle_blocking(ev).unwrap().actions).unwrap()
}

/// Workloads of `shop` using ConfigMap `orders`: `api` (auto), `billing`
/// (a StatefulSet naming it) and `plain` (no annotation).
fn shop_workloads() -> Vec<WorkloadInfo> {
    vec![
        deploy(
            "api",
            &[("reloader.stakater.com/auto", "true")],
            &[(CM, "orders")],
        ),
        workload(
            WorkloadKind::StatefulSet,
            "billing",
            &[],
            &[("configmap.reloader.stakater.com/reload", "orders")],
            &[(CM, "orders")],
        ),
        deploy("plain", &[], &[(CM, "orders")]),
    ]
}

fn post(url: &str, content_type: &str, body: &str) -> serde_json::Value {
    serde_json::json!({"action": {"type": "http", "method": "POST", "url": url,
        "headers": [{"name": "content-type", "value": content_type}], "body": body},
        "verdict": "allowed"})
}

fn rollout_restart_webhook_mode_posts_one_notification_instead_of_restarting(module: &str) {
    let plugin = rollout_calling(
        module,
        shop_workloads(),
        &format!("{{mode: webhook, webhook: {{url: \"{HOOK}\"}}}}"),
    );
    let ev = modified(&ORDERS);
    let mut actions = printed(&plugin, &ev);
    let body = actions[0]["action"]["body"].take();
    let mut want = serde_json::json!([post(HOOK, "application/json", "")]);
    want[0]["action"]["body"] = serde_json::Value::Null;
    assert_eq!(actions, want, "one POST, no restart");
    let body = body.as_str().unwrap();
    assert_eq!(
        body,
        format!(
            r#"{{"kind":"ConfigMap","namespace":"shop","name":"orders","uid":"u-1","resourceVersion":"42","change":"modified","digest":"{}","changedKeys":["application.yaml"],"workloads":[{{"kind":"Deployment","namespace":"shop","name":"api"}},{{"kind":"StatefulSet","namespace":"shop","name":"billing"}}]}}"#,
            ev.digest
        )
    );
    // The same selection as restarts: nothing selected, nothing sent;
    // `ignore` is honoured (Reloader's webhook mode posts anyway).
    let unused = Obj {
        name: "unused",
        ..ORDERS
    };
    assert_eq!(printed(&plugin, &modified(&unused)), serde_json::json!([]));
    let ignored = Obj {
        annotations: &[("reloader.stakater.com/ignore", "true")],
        ..ORDERS
    };
    assert_eq!(printed(&plugin, &modified(&ignored)), serde_json::json!([]));
    // Reloader's defaults for create and delete hold in webhook mode too.
    assert_eq!(
        printed(&plugin, &event(ChangeType::Deleted, &ORDERS)),
        serde_json::json!([])
    );
}

fn rollout_restart_webhook_mode_can_post_reloaders_body_for_every_change(module: &str) {
    let plugin = rollout_calling(
        module,
        shop_workloads(),
        &format!(
            "{{mode: webhook, reloadOnDelete: true, webhook: {{url: \"{HOOK}\", format: reloader, always: true}}}}"
        ),
    );
    let reloader = serde_json::json!([post(
        HOOK,
        "application/json",
        r#"{"webhook":"update successful"}"#
    )]);
    assert_eq!(printed(&plugin, &modified(&ORDERS)), reloader);
    // `always`: an object no workload uses is posted about too.
    let unused = Obj {
        name: "unused",
        ..ORDERS
    };
    assert_eq!(printed(&plugin, &modified(&unused)), reloader);
    assert_eq!(
        printed(&plugin, &event(ChangeType::Deleted, &ORDERS)),
        reloader
    );
    // The JSON format lists no workload then.
    let json = rollout_calling(
        module,
        vec![],
        &format!("{{mode: webhook, webhook: {{url: \"{HOOK}\", always: true}}}}"),
    );
    let printed = printed(&json, &modified(&unused));
    let body: serde_json::Value =
        serde_json::from_str(printed[0]["action"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["name"], "unused");
    assert_eq!(body["workloads"], serde_json::json!([]));
}

fn rollout_restart_alert_mode_restarts_and_alerts_once_per_workload(module: &str) {
    let plugin = rollout_calling(
        module,
        shop_workloads(),
        &format!(
            "{{mode: alert, alert: {{url: \"{HOOK}\", sink: slack, additionalInfo: \" prod-eu \"}}}}"
        ),
    );
    let ev = modified(&ORDERS);
    let hash = format!("configmap/orders:{}", ev.digest);
    let restart = |kind: &str, name: &str| {
        serde_json::json!({"action": {"type": "restart",
            "workload": {"kind": kind, "namespace": "shop", "name": name},
            "reason": "ConfigMap shop/orders changed", "contentHash": hash},
            "verdict": "allowed"})
    };
    let slack = |kind: &str, name: &str| {
        post(
            HOOK,
            "application/json",
            &format!(
                r#"{{"attachments":[{{"author_name":"Reloader","color":"good","text":"prod-eu : Reloader detected changes in *orders* of type *CONFIGMAP* in namespace *shop*. Hence reloaded *{name}* of type *{kind}* in namespace *shop*"}}]}}"#
            ),
        )
    };
    assert_eq!(
        printed(&plugin, &ev),
        serde_json::json!([
            restart("Deployment", "api"),
            restart("StatefulSet", "billing"),
            slack("Deployment", "api"),
            slack("StatefulSet", "billing"),
        ])
    );
    let secret_ev = modified(&secret("orders"));
    assert_eq!(printed(&plugin, &secret_ev), serde_json::json!([]));
}

fn rollout_restart_alert_sinks_are_reloaders_formats(module: &str) {
    let workloads = || {
        vec![deploy(
            "api",
            &[("reloader.stakater.com/auto", "true")],
            &[(SECRET, "db")],
        )]
    };
    let db = secret("db");
    let message = "Reloader detected changes in *db* of type *SECRET* in namespace *shop*. Hence reloaded *api* of type *Deployment* in namespace *shop*";
    for (sink, content_type, body) in [
        (
            "teams",
            "application/json",
            format!(r#"{{"text":"{message}"}}"#),
        ),
        (
            "gchat",
            "application/json",
            format!(r#"{{"text":"{message}"}}"#),
        ),
        (
            "teams-workflow",
            "application/json",
            format!(
                r#"{{"type":"message","attachments":[{{"contentType":"application/vnd.microsoft.card.adaptive","content":{{"$schema":"http://adaptivecards.io/schemas/adaptive-card.json","type":"AdaptiveCard","version":"1.2","body":[{{"type":"TextBlock","text":"{message}","wrap":true}}]}}}}]}}"#
            ),
        ),
        ("raw", "text/plain", message.replace('*', "")),
    ] {
        let plugin = rollout_calling(
            module,
            workloads(),
            &format!("{{mode: alert, alert: {{url: \"{HOOK}\", sink: {sink}}}}}"),
        );
        let printed = printed(&plugin, &modified(&db));
        assert_eq!(printed[0]["action"]["type"], "restart", "{sink}");
        assert_eq!(printed[1], post(HOOK, content_type, &body), "{sink}");
        assert_eq!(printed.as_array().unwrap().len(), 2, "{sink}");
    }
    // Go's JSON escapes `<`, `>` and `&`; the raw text keeps them.
    let plugin = rollout_calling(
        module,
        workloads(),
        &format!(
            "{{mode: alert, alert: {{url: \"{HOOK}\", sink: gchat, additionalInfo: \"<eu> & co\"}}}}"
        ),
    );
    let printed = printed(&plugin, &modified(&db));
    assert_eq!(
        printed[1]["action"]["body"],
        format!(r#"{{"text":"\u003ceu\u003e \u0026 co : {message}"}}"#)
    );
}

fn rollout_restart_mode_config_errors_name_the_field(module: &str) {
    for (config, want) in [
        (
            "{mode: notify}",
            r#"mode: unknown mode "notify", expected "restart", "webhook" or "alert""#,
        ),
        (
            "{mode: webhook}",
            "webhook.url is required with mode: webhook",
        ),
        (
            "{mode: webhook, webhook: {url: \"ftp://hooks/x\"}}",
            r#"webhook.url: "ftp://hooks/x" is not an http or https URL (it must start with http:// or https://)"#,
        ),
        (
            "{mode: webhook, webhook: {url: \"http://hooks/x\", format: xml}}",
            r#"webhook.format: unknown format "xml", expected "json" or "reloader""#,
        ),
        (
            "{mode: alert, alert: {url: \"https://\"}}",
            r#"alert.url: "https://" has no host"#,
        ),
        (
            "{mode: alert, alert: {url: \"http://hooks/x\", sink: discord}}",
            r#"alert.sink: unknown sink "discord", expected "slack", "teams", "teams-workflow", "gchat" or "raw""#,
        ),
        (
            "{webhook: {url: \"http://hooks/x\"}}",
            r#"webhook is set but mode is "restart": set mode: webhook, or remove webhook"#,
        ),
        (
            "{mode: webhook, webhook: {url: \"http://hooks/x\", fromat: json}}",
            "unknown field `fromat`, expected one of `url`, `format`, `always`",
        ),
    ] {
        let err = rollout_config_error(module, config);
        let want = format!("plugin `restart`: rejected its config: rollout-restart config: {want}");
        assert!(
            err.starts_with(&want),
            "{module} {config}:\n{err}\nwant\n{want}"
        );
    }
}

// ------------------------------------- rollout-restart custom annotations

/// Reloader's custom annotation flags (`--auto-annotation`, ...) as config
/// `annotations`: each key is read instead of Reloader's, ours stay read,
/// the exclude keys (no flag in Reloader) stay.
fn rollout_restart_custom_annotation_names_replace_reloaders(module: &str) {
    let refs = [(CM, "orders"), (SECRET, "orders")];
    let plugin = rollout(
        module,
        vec![
            deploy("custom-auto", &[("acme.io/auto", "true")], &refs),
            deploy(
                "reloader-auto",
                &[("reloader.stakater.com/auto", "true")],
                &refs,
            ),
            deploy("ours-auto", &[("wasmwatch.io/auto", "true")], &refs),
            deploy("custom-typed", &[("acme.io/auto-cm", "true")], &refs),
            deploy("custom-named", &[("acme.io/reload-cm", "ord.*")], &refs),
            deploy(
                "reloader-named",
                &[("configmap.reloader.stakater.com/reload", "orders")],
                &refs,
            ),
            deploy("custom-search", &[("acme.io/search", "true")], &refs),
            deploy(
                "excluded",
                &[
                    ("acme.io/auto", "true"),
                    ("configmaps.exclude.reloader.stakater.com/reload", "orders"),
                ],
                &refs,
            ),
            // The pod template is read when the workload holds none of
            // the (renamed) keys.
            workload(
                WorkloadKind::Deployment,
                "template-custom",
                &[("reloader.stakater.com/auto", "false")],
                &[("acme.io/auto", "true")],
                &refs,
            ),
            // Not renamed: Reloader's default key.
            deploy(
                "secret-auto",
                &[("secret.reloader.stakater.com/auto", "true")],
                &refs,
            ),
        ],
        "{annotations: {auto: acme.io/auto, configmapAuto: acme.io/auto-cm, configmapReload: acme.io/reload-cm, search: acme.io/search, match: acme.io/match, ignore: acme.io/ignore}}",
    );
    let changed = [
        "custom-auto",
        "ours-auto",
        "custom-typed",
        "custom-named",
        "template-custom",
    ];
    assert_eq!(restarted(&plugin, &modified(&ORDERS)), changed);
    let matching = Obj {
        annotations: &[("acme.io/match", "true")],
        ..ORDERS
    };
    assert_eq!(
        restarted(&plugin, &modified(&matching)),
        [
            "custom-auto",
            "ours-auto",
            "custom-typed",
            "custom-named",
            "custom-search",
            "template-custom",
        ]
    );
    let reloader_match = Obj {
        annotations: &[("reloader.stakater.com/match", "true")],
        ..ORDERS
    };
    assert_eq!(restarted(&plugin, &modified(&reloader_match)), changed);
    for (key, ignored) in [
        ("acme.io/ignore", true),
        ("wasmwatch.io/ignore", true),
        ("reloader.stakater.com/ignore", false),
    ] {
        let o = Obj {
            annotations: &[(key, "true")],
            ..ORDERS
        };
        let got = restarted(&plugin, &modified(&o));
        assert_eq!(got.is_empty(), ignored, "{key}: {got:?}");
    }
    // configmaps.exclude names ConfigMaps only.
    assert_eq!(
        restarted(&plugin, &modified(&secret("orders"))),
        [
            "custom-auto",
            "ours-auto",
            "excluded",
            "template-custom",
            "secret-auto"
        ]
    );
    // A key renamed to its own wasmwatch.io/ name: only ours is read
    // (wasmwatch beside a Reloader that keeps Reloader's annotations).
    let ours_only = rollout(
        module,
        vec![
            deploy(
                "reloader-auto",
                &[("reloader.stakater.com/auto", "true")],
                &refs,
            ),
            deploy("ours-auto", &[("wasmwatch.io/auto", "true")], &refs),
        ],
        "{annotations: {auto: wasmwatch.io/auto}}",
    );
    assert_eq!(restarted(&ours_only, &modified(&ORDERS)), ["ours-auto"]);
}

fn rollout_restart_custom_annotation_names_are_checked(module: &str) {
    for (config, want) in [
        (
            "{annotations: {auto: \"acme.io/auto x\"}}",
            r#"annotations.auto: "acme.io/auto x" is not a valid annotation key ([prefix/]name: a name of at most 63 letters, digits, '-', '_' or '.' that starts and ends with a letter or digit, after an optional lower-case DNS subdomain and '/')"#,
        ),
        (
            "{annotations: {ignore: \"Acme.io/ignore\"}}",
            r#"annotations.ignore: "Acme.io/ignore" is not a valid annotation key"#,
        ),
        (
            "{annotations: {search: reloader.stakater.com/auto}}",
            r#"annotations.search: "reloader.stakater.com/auto" is already the name of the auto annotation; each needs its own"#,
        ),
        (
            "{annotations: {match: acme.io/x, ignore: acme.io/x}}",
            r#"annotations.match: "acme.io/x" is already the name of the ignore annotation; each needs its own"#,
        ),
        (
            "{annotations: {secretReload: wasmwatch.io/exclude-secrets}}",
            r#"annotations.secretReload: "wasmwatch.io/exclude-secrets" is already the name of the exclude annotation; each needs its own"#,
        ),
        (
            "{annotations: {reload: acme.io/reload}}",
            "unknown field `reload`, expected one of `auto`, `configmapAuto`, `secretAuto`, `configmapReload`, `secretReload`, `search`, `match`, `ignore`",
        ),
        (
            "{annotations: {auto: 5}}",
            "invalid type: integer `5`, expected a string",
        ),
    ] {
        let err = rollout_config_error(module, config);
        let want = format!("plugin `restart`: rejected its config: rollout-restart config: {want}");
        assert!(
            err.starts_with(&want),
            "{module} {config}:\n{err}\nwant\n{want}"
        );
    }
    // Both kinds' named reloads under one key, and typed auto under
    // Reloader's untyped key: each still means one thing.
    rollout(
        module,
        vec![],
        "{annotations: {configmapReload: acme.io/reload, secretReload: acme.io/reload, secretAuto: reloader.stakater.com/auto}}",
    );
}

/// Reloader's `--ignored-workload-types` as rollout-restart's
/// `ignoredWorkloadTypes` (WIT 0.4.0, which sees CronJobs and Jobs): those
/// kinds never restart, named or auto; an unknown type is a config error
/// naming the accepted ones.
fn rollout_restart_ignored_workload_types_skip_jobs_and_cronjobs(module: &str) {
    let auto = [("reloader.stakater.com/auto", "true")];
    let named = [("configmap.reloader.stakater.com/reload", "orders")];
    let refs = [(CM, "orders")];
    let workloads = || {
        vec![
            deploy("api", &auto, &refs),
            workload(
                WorkloadKind::from_gvk("batch", "v1", "CronJob"),
                "nightly",
                &auto,
                &[],
                &refs,
            ),
            workload(
                WorkloadKind::from_gvk("batch", "v1", "Job"),
                "once",
                &named,
                &[],
                &[],
            ),
        ]
    };
    let plugin = |config: &str| {
        load(
            StaticLookups {
                workloads: workloads(),
                ..Default::default()
            },
            &format!(
                "name: restart\n    module: {{module:{module}}}\n    sha256: {{sha256:{module}}}\n    config: {config}\n    capabilities: {{restart: {{namespaces: [shop], kinds: [Deployment, batch/v1/CronJob, batch/v1/Job]}}}}"
            ),
        )
    };
    let mut all = restarted(&plugin("{}"), &modified(&ORDERS));
    all.sort();
    assert_eq!(all, ["api", "nightly", "once"]);
    assert_eq!(
        restarted(
            &plugin("{ignoredWorkloadTypes: [jobs, CronJobs]}"),
            &modified(&ORDERS)
        ),
        ["api"]
    );
    let mut some = restarted(
        &plugin("{ignoredWorkloadTypes: [jobs]}"),
        &modified(&ORDERS),
    );
    some.sort();
    assert_eq!(some, ["api", "nightly"]);
    let error = rollout_config_error(module, "{ignoredWorkloadTypes: [deployments]}");
    assert!(
        error.contains(
            "ignoredWorkloadTypes: \"deployments\" is not a workload type Reloader ignores (jobs, cronjobs)"
        ),
        "{error}"
    );
}
