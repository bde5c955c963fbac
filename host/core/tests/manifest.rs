//! Manifests, good and bad: every bad one is refused with a message that names
//! the field and the value.
use std::path::Path;

use wasmwatch_core::Manifest;
use wasmwatch_core::event::ObjectKind;

const SHA: &str = "3f0b6e1c3b0e9d8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f";

fn good() -> String {
    format!(
        r#"apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
watch:
  kinds: [ConfigMap, Secret]
  namespaces: [shop, billing]
  labelSelector: "spring.cloud.kubernetes.config=true"
ha:
  enabled: true
  namespace: wasmwatch
  leaseDuration: 15s
  renewDeadline: 10s
  retryPeriod: 2s
buses:
  - name: rabbit
    amqp: {{url: "amqp://guest:guest@127.0.0.1:5672/%2f"}}
  - name: nats
    nats: {{url: "nats://127.0.0.1:4222"}}
plugins:
  - name: http-refresh
    module: plugins/http_refresh.wasm
    sha256: {SHA}
    events:
      kinds: [ConfigMap]
      changes: [added, modified, deleted, resynced]
      labelSelector: "app in (orders, billing)"
    config:
      strategy: refresh
    capabilities:
      refresh: [shop]
      bus: [rabbit/springCloudBus, "nats/*"]
      events: true
    limits: {{timeout: 100ms, memory: 32Mi}}
    delivery: {{debounce: 2s, retries: 3, backoffInitial: 1s, backoffMax: 30s}}
"#
    )
}

fn parse(yaml: &str) -> Result<Manifest, String> {
    Manifest::parse(yaml, Path::new("/etc/wasmwatch")).map_err(|e| e.to_string())
}

#[test]
fn a_good_manifest_parses_with_defaults_filled_in() {
    let m = parse(&good()).unwrap();
    assert_eq!(m.watch.namespaces, vec!["shop", "billing"]);
    assert!(m.ha.enabled);
    let p = &m.plugins[0];
    assert_eq!(p.events.kinds, vec![ObjectKind::ConfigMap]);
    assert_eq!(p.limits.memory.0, 32 << 20);
    assert_eq!(p.limits.max_actions, 1000);
    assert_eq!(p.config, serde_json::json!({"strategy": "refresh"}));
    assert_eq!(
        p.module_path(&m.base_dir),
        Path::new("/etc/wasmwatch/plugins/http_refresh.wasm")
    );

    let minimal = format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n- name: p\n  module: p.wasm\n  sha256: {SHA}\n"
    );
    let m = parse(&minimal).unwrap();
    assert_eq!(m.watch.namespaces, vec!["*"]);
    assert!(!m.ha.enabled);
    assert_eq!(m.plugins[0].limits.timeout.0.as_millis(), 100);
    assert!(
        !m.plugins[0].capabilities.events,
        "capabilities default to nothing"
    );
}

/// Each case: (what to replace in the good manifest, with what, the expected message).
#[test]
fn bad_manifests_name_the_field_and_the_value() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "kind: PluginManifest",
            "kind: Manifest",
            "kind: \"Manifest\": expected \"PluginManifest\"",
        ),
        (
            "apiVersion: wasmwatch.io/v1alpha1",
            "apiVersion: wasmwatch.io/v2",
            "apiVersion: \"wasmwatch.io/v2\" is not supported; expected \"wasmwatch.io/v1alpha1\"",
        ),
        (
            "  retryPeriod: 2s",
            "  retryPeriod: 2s\n  leaseDurationSeconds: 15",
            "ha.leaseDurationSeconds: unknown field `leaseDurationSeconds`, expected one of `enabled`",
        ),
        (
            "      events: true",
            "      events: true\n      restart: {namespaces: [shop], kinds: [CronJob]}",
            "plugins[0].capabilities.restart.kinds[0]: \"CronJob\" is not a workload kind: write Deployment, StatefulSet, DaemonSet or group/version/Kind (batch/v1/CronJob)",
        ),
        (
            "      events: true",
            "      events: true\n      restart: {namespaces: [shop], kinds: [Batch/v1/CronJob]}",
            "plugins[0].capabilities.restart.kinds[0]: \"Batch/v1/CronJob\" is not a workload kind: group \"Batch\" is not a DNS subdomain",
        ),
        (
            "      events: true",
            "      events: true\n      restart: {namespace: [shop]}",
            "unknown field `namespace`, expected `namespaces` or `kinds`",
        ),
        (
            "memory: 32Mi",
            "memory: 32MB",
            "plugins[0].limits.memory: invalid size \"32MB\": unknown unit \"MB\"",
        ),
        (
            "timeout: 100ms",
            "timeout: 100",
            "plugins[0].limits.timeout: invalid duration \"100\": missing unit",
        ),
        (
            "timeout: 100ms",
            "timeout: 5m",
            "plugins[0].limits.timeout: 300s is out of range (1ms to 60s)",
        ),
        (
            "memory: 32Mi",
            "memory: 4Gi",
            "plugins[0].limits.memory: 4096Mi is out of range (1Mi to 1Gi)",
        ),
        (
            "kinds: [ConfigMap]\n",
            "kinds: [Configmap]\n",
            "plugins[0].events.kinds[0]: \"Configmap\" is not a kind: expected ConfigMap, Secret or apiVersion/Kind",
        ),
        (
            "changes: [added,",
            "changes: [updated,",
            "plugins[0].events.changes[0]: unknown variant `updated`",
        ),
        (
            "renewDeadline: 10s",
            "renewDeadline: 20s",
            "ha.leaseDuration: 15s must be greater than ha.renewDeadline (20s)",
        ),
        (
            "retryPeriod: 2s",
            "retryPeriod: 9s",
            "ha.renewDeadline: 10s must be greater than 1.2 x ha.retryPeriod (9s)",
        ),
        (
            SHA,
            "abc123",
            "plugins[0].sha256: \"abc123\" is not a SHA-256 (64 lowercase hex digits)",
        ),
        (
            "- name: http-refresh",
            "- name: HTTP_Refresh",
            "plugins[0].name: \"HTTP_Refresh\" is not a valid name",
        ),
        (
            "bus: [rabbit/springCloudBus",
            "bus: [kafka/springCloudBus",
            "plugins[0].capabilities.bus[0]: connection \"kafka\" is not defined in buses",
        ),
        (
            "bus: [rabbit/springCloudBus",
            "bus: [springCloudBus",
            "plugins[0].capabilities.bus[0]: invalid bus grant \"springCloudBus\": expected connection/destination",
        ),
        (
            "refresh: [shop]",
            "refresh: [shop]\n      http: [\"ftp://x/\"]",
            "plugins[0].capabilities.http[0]: invalid http grant \"ftp://x/\": scheme must be http or https",
        ),
        (
            "refresh: [shop]",
            "refresh: [shop]\n      exec: true",
            "plugins[0].capabilities.exec: unknown field `exec`",
        ),
        (
            "labelSelector: \"app in (orders, billing)\"",
            "labelSelector: \"app in orders\"",
            "plugins[0].events.labelSelector: invalid label selector \"app in orders\": expected a parenthesised set after \"in\"",
        ),
        (
            "namespaces: [shop, billing]",
            "namespaces: [\"*\", shop]",
            "watch.namespaces: \"*\" (all namespaces) cannot be combined with names",
        ),
        (
            "namespaces: [shop, billing]",
            "namespaces: [Shop]",
            "watch.namespaces[0]: \"Shop\" is not a valid namespace name",
        ),
        (
            "kinds: [ConfigMap, Secret]",
            "kinds: [Secret]",
            "plugins[0].events.kinds: ConfigMap is not watched (add it to watch.kinds)",
        ),
        (
            "    nats: {url: \"nats://127.0.0.1:4222\"}",
            "    nats: {url: \"127.0.0.1:4222\"}",
            "buses[1].nats.url: \"127.0.0.1:4222\" must start with nats://",
        ),
        (
            "  - name: nats\n",
            "  - name: rabbit\n",
            "buses[1].name: \"rabbit\" is defined twice",
        ),
        (
            "    nats: {url: \"nats://127.0.0.1:4222\"}",
            "",
            "buses[1]: must have exactly one of amqp or nats",
        ),
        (
            "delivery: {debounce: 2s,",
            "delivery: {debounce: soon,",
            "plugins[0].delivery.debounce: invalid duration \"soon\"",
        ),
        (
            "backoffInitial: 1s",
            "backoffInitial: 2m",
            "plugins[0].delivery.backoffInitial: 120s must not exceed delivery.backoffMax (30s)",
        ),
        (
            "delivery: {debounce: 2s,",
            "delivery: {debounce: 9999999999999h,",
            "plugins[0].delivery.debounce: 35999999999996400s is out of range (at most 1h)",
        ),
        (
            "  leaseDuration: 15s",
            "  leaseDuration: 15500ms",
            "ha.leaseDuration: 15500ms must be whole seconds",
        ),
        (
            "backoffMax: 30s",
            "backoffMax: 25h",
            "plugins[0].delivery.backoffMax: 90000s is out of range (at most 24h)",
        ),
        // Only a WIT 0.3.0 restart may ask for restart-at (and is refused).
        (
            "delivery: {debounce: 2s,",
            "delivery: {restartStrategy: restart-at, debounce: 2s,",
            "unknown variant `restart-at`, expected `annotations` or `env-vars`",
        ),
        (
            "    module: plugins/http_refresh.wasm\n",
            "",
            "plugins[0]: missing field `module`",
        ),
        (
            "  enabled: true",
            "  enabled: yes please",
            "ha.enabled: invalid type: string \"yes please\", expected a boolean",
        ),
    ];
    let good = good();
    for (from, to, want) in cases {
        assert!(good.contains(from), "case {from:?} does not apply");
        let yaml = good.replacen(from, to, 1);
        let Err(err) = parse(&yaml) else {
            panic!("accepted the manifest with {from:?} replaced by {to:?}");
        };
        assert!(
            err.contains(want),
            "replacing {from:?} with {to:?}:\n  got: {err}\n  want: {want}"
        );
    }
}

/// Issue 20: restart grants name kinds by their short apps/v1 names or by
/// group/version/Kind.
#[test]
fn restart_grants_may_name_kinds_by_group_version_kind() {
    let yaml = good().replace(
        "      events: true\n",
        "      events: true\n      restart: {namespaces: [shop], kinds: [Deployment, apps/v1/DaemonSet, batch/v1/CronJob, argoproj.io/v1alpha1/Rollout, '*']}\n",
    );
    let m = parse(&yaml).unwrap();
    assert_eq!(
        m.plugins[0].capabilities.restart.kinds,
        [
            "Deployment",
            "apps/v1/DaemonSet",
            "batch/v1/CronJob",
            "argoproj.io/v1alpha1/Rollout",
            "*"
        ]
    );
}

#[test]
fn semantic_problems_are_all_reported_at_once() {
    let yaml = good()
        .replace("renewDeadline: 10s", "renewDeadline: 20s")
        .replace("memory: 32Mi", "memory: 2Gi");
    let err = parse(&yaml).unwrap_err();
    assert!(err.contains("ha.leaseDuration"), "{err}");
    assert!(err.contains("plugins[0].limits.memory"), "{err}");
}

#[test]
fn duplicate_plugin_names_and_yaml_syntax_errors() {
    let dup = format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n- {{name: p, module: a.wasm, sha256: {SHA}}}\n- {{name: p, module: b.wasm, sha256: {SHA}}}\n"
    );
    assert!(
        parse(&dup)
            .unwrap_err()
            .contains("plugins[1].name: \"p\" is used by another plugin")
    );
    let broken = "apiVersion: wasmwatch.io/v1alpha1\nkind: [unclosed\n";
    let err = parse(broken).unwrap_err();
    assert!(err.starts_with("invalid manifest"), "{err}");
    assert!(
        err.contains("line"),
        "syntax errors carry a position: {err}"
    );
    let empty = "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins: []\n";
    assert!(
        parse(empty)
            .unwrap_err()
            .contains("plugins: must list at least one plugin")
    );
}

#[test]
fn from_file_names_the_file() {
    let err = Manifest::from_file(Path::new("/nonexistent/manifest.yaml")).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("invalid manifest /nonexistent/manifest.yaml"),
        "{msg}"
    );
    assert!(msg.contains("cannot read it"), "{msg}");
}

#[test]
fn oci_modules_need_an_explicit_registry_and_a_tag_or_digest() {
    let manifest = |module: &str| {
        format!(
            "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n- name: p\n  module: {module:?}\n  sha256: {SHA}\n"
        )
    };
    for good in [
        "oci://ghcr.io/acme/plugins/refresh:1.0",
        "oci://127.0.0.1:5000/refresh:v1",
        "oci://localhost/refresh:latest",
        &format!("oci://registry.example.com/refresh@sha256:{SHA}"),
        &format!("oci://registry.example.com/refresh:1@sha256:{SHA}"),
    ] {
        let m = parse(&manifest(good)).unwrap_or_else(|e| panic!("{good}: {e}"));
        assert_eq!(
            m.plugins[0].oci_reference(),
            good.strip_prefix("oci://"),
            "{good}"
        );
    }
    for (bad, says) in [
        ("oci://refresh:1", "must be oci://REGISTRY/REPOSITORY"),
        ("oci://acme/refresh:1", "is not a registry host"),
        ("oci://ghcr.io/acme/refresh", "needs a tag"),
        ("oci://ghcr.io/acme/refresh:", "tag after ':' is empty"),
        ("oci://ghcr.io/:1", "repository name is missing"),
        (
            "oci://ghcr.io/acme/refresh@sha256:abc",
            "is not a sha256:DIGEST",
        ),
    ] {
        let e = parse(&manifest(bad)).unwrap_err();
        assert!(
            e.contains("plugins[0].module") && e.contains(bad) && e.contains(says),
            "{bad}: {e}"
        );
    }
    let m = parse(&manifest("p.wasm")).unwrap();
    assert_eq!(m.plugins[0].oci_reference(), None);
}

/// A grant that could never match a URL is refused, saying what to write:
/// grants are compared with a URL's normalised host and path only.
#[test]
fn http_grants_that_can_never_match_are_refused_saying_what_to_write() {
    let good = good();
    let with_grant = |grant: &str| {
        good.replacen(
            "refresh: [shop]",
            &format!("refresh: [shop]\n      http: [\"{grant}\"]"),
            1,
        )
    };
    for (grant, want) in [
        (
            "https://allowed.example.com/hooks?x=*",
            "a grant matches the path only, never a query or fragment (any is allowed under the path): write https://allowed.example.com/hooks",
        ),
        (
            "https://allowed.example.com?x=1",
            "write https://allowed.example.com/",
        ),
        (
            "https://allowed.example.com/hooks/#top",
            "write https://allowed.example.com/hooks/",
        ),
        (
            "https://allowed.example.com/a/../hooks/",
            "the path is never seen in this form (URLs are compared normalised): write https://allowed.example.com/hooks/",
        ),
        (
            "https://allowed.example.com/caf\u{e9} menu/*",
            "write https://allowed.example.com/caf%C3%A9%20menu/",
        ),
        (
            "https://b\u{fc}cher.example/hooks/",
            "the host is never seen in this form (URLs are compared normalised): write xn--bcher-kva.example",
        ),
        ("http://0x7f.1:8080/", "write 127.0.0.1"),
    ] {
        let err = parse(&with_grant(grant)).expect_err(grant);
        assert!(
            err.contains(&format!(
                "plugins[0].capabilities.http[0]: invalid http grant {grant:?}: "
            )) && err.contains(want),
            "{grant}:\n  got: {err}\n  want: {want}"
        );
    }
    // What they should have written, and the usual forms, are accepted.
    for grant in [
        "https://allowed.example.com/hooks",
        "https://allowed.example.com/hooks/*",
        "https://allowed.example.com/caf%C3%A9%20menu/",
        "https://*.example.com/",
        "https://xn--bcher-kva.example/hooks/",
        "http://127.0.0.1:*/",
        "http://Orders.Shop.svc:8080/actuator/refresh",
    ] {
        if let Err(e) = parse(&with_grant(grant)) {
            panic!("{grant}: {e}");
        }
    }
}

#[test]
fn watch_kinds_name_any_kind_with_its_content() {
    let spcps = "secrets-store.csi.x-k8s.io/v1/SecretProviderClassPodStatus";
    let yaml = good()
        .replacen(
            "  kinds: [ConfigMap, Secret]\n",
            &format!(
                "  kinds:\n    - ConfigMap\n    - {spcps}\n    - apiVersion: example.com/v1\n      kind: Policy\n      content: [spec.rules, status.version]\n"
            ),
            1,
        )
        .replacen("      kinds: [ConfigMap]\n", &format!("      kinds: [ConfigMap, {spcps}, example.com/v1/Policy]\n"), 1);
    let m = parse(&yaml).unwrap();
    let kinds = m.watch.object_kinds();
    assert_eq!(kinds.len(), 3);
    assert_eq!(kinds[1].as_str(), spcps);
    assert_eq!(m.plugins[0].events.kinds, kinds);
    let known = m.watch.custom(kinds[1]).unwrap();
    assert_eq!(
        known.plural.as_deref(),
        Some("secretproviderclasspodstatuses")
    );
    assert_eq!(
        known.content,
        ["status.secretProviderClassName", "status.objects"]
    );
    let policy = m.watch.custom(kinds[2]).unwrap();
    assert_eq!((policy.plural.as_deref(), policy.content.len()), (None, 2));
    assert!(m.watch.custom(ObjectKind::ConfigMap).is_none());
    // Written back as read.
    let back = serde_json::to_value(&m.watch.kinds).unwrap();
    assert_eq!(back[1], spcps);
    assert_eq!(back[2]["content"][0], "spec.rules");

    let bad = |from: &str, to: &str, want: &str| {
        let yaml = yaml.replacen(from, to, 1);
        assert_ne!(yaml, self::good(), "{from:?} does not apply");
        let err = parse(&yaml)
            .err()
            .unwrap_or_else(|| panic!("accepted {to:?}"));
        assert!(err.contains(want), "{to:?}:\n  got: {err}\n  want: {want}");
    };
    bad(
        &format!("    - {spcps}\n"),
        "    - example.com/v1/Unknown\n",
        "watch.kinds[1]: wasmwatch does not know what example.com/v1/Unknown holds: write it as {apiVersion, kind, content: [field paths]}",
    );
    bad(
        "content: [spec.rules, status.version]",
        "content: []",
        "watch.kinds[2].content: must name at least one field path",
    );
    bad(
        "content: [spec.rules, status.version]",
        "content: [spec..rules]",
        "watch.kinds[2].content[0]: \"spec..rules\" is not a field path",
    );
    bad(
        "content: [spec.rules, status.version]",
        "content: [metadata.labels]",
        "watch.kinds[2].content[0]: \"metadata.labels\" is not a field path",
    );
    bad(
        "      kind: Policy\n",
        "      kind: policy\n",
        "watch.kinds[2].kind: \"example.com/v1/policy\" is not a kind",
    );
    bad(
        "      kind: Policy\n",
        "      kind: Policy\n      plurl: x\n",
        "unknown field `plurl`",
    );
    bad(
        "    - ConfigMap\n",
        &format!("    - ConfigMap\n    - {spcps}\n"),
        &format!("watch.kinds[2]: {spcps} is named twice"),
    );
    bad(
        &format!("    - {spcps}\n"),
        "",
        &format!("plugins[0].events.kinds: {spcps} is not watched (add it to watch.kinds)"),
    );
}
