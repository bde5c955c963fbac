//! `Manifest::check` reports every problem in one pass; `warnings` and
//! `needs::shortfalls` name what a valid manifest can never do.
use std::path::Path;

use wasmwatch_core::Manifest;
use wasmwatch_core::manifest::Problem;
use wasmwatch_core::needs::{Needs, shortfalls};

fn sha() -> String {
    "ab".repeat(32)
}

fn manifest(plugins: &str) -> String {
    format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nwatch:\n  namespaces: [shop]\n  labelSelector: team=shop\nplugins:\n{}",
        plugins.replace("SHA", &sha())
    )
}

fn shown(problems: &[Problem]) -> Vec<String> {
    problems.iter().map(|p| p.to_string()).collect()
}

#[test]
fn three_independent_mistakes_are_reported_in_one_pass() {
    let yaml = manifest(
        "  - name: a
    module: a.wasm
    sha256: SHA
    capabilites: {refresh: [shop]}
  - name: b
    module: b.wasm
    sha256: SHA
    events: {kinds: [ConfigMap, Secrets], changes: [modified]}
    limits: {memory: 32MB}
  - name: c
    module: c.wasm
    sha256: SHA
    delivery: {retries: 1000}
",
    );
    let checked = Manifest::check(&yaml, Path::new("."));
    let errors = shown(&checked.errors);
    for want in [
        "plugins[0].capabilites: unknown field `capabilites`",
        "plugins[1].events.kinds[1]: \"Secrets\" is not a kind",
        "plugins[1].limits.memory: invalid size \"32MB\"",
        "plugins[2].delivery.retries: 1000 is out of range (0 to 100)",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(want)),
            "no {want:?} in {errors:#?}"
        );
    }
    assert_eq!(errors.len(), 4, "{errors:#?}");
    // parse says the same.
    let err = Manifest::parse(&yaml, Path::new(".")).unwrap_err();
    assert_eq!(err.problems, checked.errors);
}

#[test]
fn list_elements_taken_out_keep_their_place_and_required_fields_are_named() {
    let yaml = manifest(
        "  - name: a
    module: a.wasm
    sha256: SHA
    events: {kinds: [Configmap, ConfigMap, Secrett], changes: [added, updated]}
  - module: b.wasm
    sha256: SHA
    limits: {timeout: soon}
",
    );
    let errors = shown(&Manifest::check(&yaml, Path::new(".")).errors);
    for want in [
        "plugins[0].events.kinds[0]: \"Configmap\" is not a kind",
        "plugins[0].events.kinds[2]: \"Secrett\" is not a kind",
        "plugins[0].events.changes[1]: unknown variant `updated`",
        "plugins[1]: missing field `name`",
        "plugins[1].limits.timeout: invalid duration \"soon\"",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(want)),
            "no {want:?} in {errors:#?}"
        );
    }
    // The empty name filled in is not reported again as an invalid name.
    assert_eq!(errors.len(), 5, "{errors:#?}");
}

#[test]
fn filters_that_can_never_match_are_warnings_naming_the_fields() {
    let yaml = manifest(
        "  - name: elsewhere
    module: a.wasm
    sha256: SHA
    events: {namespaces: [shop, billing]}
  - name: nowhere
    module: a.wasm
    sha256: SHA
    events: {namespaces: [billing]}
  - name: contradiction
    module: a.wasm
    sha256: SHA
    events: {labelSelector: \"a=true,a=false\"}
  - name: other-team
    module: a.wasm
    sha256: SHA
    events: {labelSelector: team=billing}
  - name: fine
    module: a.wasm
    sha256: SHA
    events: {namespaces: [shop], labelSelector: \"team,tier in (web)\"}
",
    );
    let m = Manifest::parse(&yaml, Path::new(".")).expect("valid");
    let warnings = shown(&m.warnings());
    assert_eq!(
        warnings,
        [
            "plugins[0].events.namespaces[1]: \"billing\" is not in watch.namespaces (shop): the plugin never gets events from it",
            "plugins[1].events.namespaces[0]: \"billing\" is not in watch.namespaces (shop): the plugin never gets events from it, nor from any of its namespaces",
            "plugins[2].events.labelSelector: \"a=true,a=false\" never matches: label \"a\" cannot satisfy \"a=true\" and \"a=false\" at once; the plugin never gets any event",
            "plugins[3].events.labelSelector: \"team=billing\" never matches an object that watch.labelSelector \"team=shop\" lets through: label \"team\" cannot satisfy \"team=shop\" and \"team=billing\" at once; the plugin never gets any event",
        ]
    );
}

#[test]
fn grants_short_of_what_a_plugin_declares_are_named() {
    let yaml = "apiVersion: wasmwatch.io/v1alpha1
kind: PluginManifest
buses: [{name: rabbit, amqp: {url: \"amqp://r/\"}}]
plugins:
  - name: http-refresh
    module: a.wasm
    sha256: SHA
    capabilities: {}
  - name: partly
    module: a.wasm
    sha256: SHA
    capabilities: {refresh: [shop]}
  - name: bus-refresh
    module: a.wasm
    sha256: SHA
    config: {connection: rabbit}
    capabilities: {bus: [rabbit/other]}
  - name: granted
    module: a.wasm
    sha256: SHA
    events: {namespaces: [shop]}
    config: {connection: rabbit, destination: x}
    capabilities: {refresh: [shop], bus: [\"rabbit/*\"], events: true}
"
    .replace("SHA", &sha());
    let m = Manifest::parse(&yaml, Path::new(".")).expect("valid");
    let refresh = Needs {
        refresh: vec!["{namespace}".into()],
        ..Needs::default()
    };
    let bus = Needs {
        bus: vec!["{config.connection}/{config.destination|springCloudBus}".into()],
        events: true,
        ..Needs::default()
    };
    let s0 = shown(&shortfalls(&m, 0, &refresh));
    assert_eq!(s0.len(), 1, "{s0:?}");
    assert!(
        s0[0].starts_with("plugins[0].capabilities.refresh: not granted, but the plugin refreshes Services in the namespace of each event it gets, from any namespace"),
        "{s0:?}"
    );
    let s1 = shown(&shortfalls(&m, 1, &refresh));
    assert!(
        s1[0].starts_with("plugins[1].capabilities.refresh: grants only [\"shop\"], but"),
        "{s1:?}"
    );
    let s2 = shown(&shortfalls(&m, 2, &bus));
    assert_eq!(
        s2,
        [
            "plugins[2].capabilities.bus: grants only [\"rabbit/other\"], but the plugin publishes to rabbit/springCloudBus (per its config): that would be refused; add rabbit/springCloudBus to bus",
            "plugins[2].capabilities.events: not granted, but the plugin emits Kubernetes Events: they would be refused; grant events: true",
        ]
    );
    assert!(shortfalls(&m, 3, &refresh).is_empty());
    assert!(shortfalls(&m, 3, &bus).is_empty());
}

/// `watch.ignoreNamespaces` and `watch.namespaceSelector` (Reloader's
/// `--namespaces-to-ignore` and `--namespace-selector`): names checked,
/// the overlaps and contradictions warned about, the API server's field
/// selector and Reloader's legacy selector forms.
#[test]
fn ignored_namespaces_and_the_namespace_selector() {
    let yaml = |watch: &str, events: &str| {
        format!(
            "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nwatch: {watch}\nplugins:\n  - name: a\n    module: a.wasm\n    sha256: {}\n    events: {events}\n",
            sha()
        )
    };
    let checked = Manifest::check(
        &yaml(
            "{ignoreNamespaces: [kube-system, Bad_Name, \"*\"], namespaceSelector: \"team in (a\"}",
            "{}",
        ),
        Path::new("."),
    );
    assert_eq!(
        shown(&checked.errors),
        [
            "watch.namespaceSelector: invalid label selector \"team in (a\": unbalanced parentheses",
            "watch.ignoreNamespaces[1]: \"Bad_Name\" is not a valid namespace name",
            "watch.ignoreNamespaces[2]: \"*\" is not a valid namespace name",
        ]
    );

    let m = Manifest::parse(
        &yaml(
            "{namespaces: [shop, billing], ignoreNamespaces: [billing, kube-system, billing], namespaceSelector: \"env=prod,env=dev\"}",
            "{namespaces: [kube-system, shop]}",
        ),
        Path::new("."),
    )
    .expect("valid");
    assert_eq!(
        shown(&m.warnings()),
        [
            "watch.ignoreNamespaces[0]: \"billing\" is also in watch.namespaces: it is watched, but none of its objects is ever delivered",
            "watch.ignoreNamespaces[2]: \"billing\" is also in watch.namespaces: it is watched, but none of its objects is ever delivered",
            "watch.namespaceSelector: \"env=prod,env=dev\" never matches: label \"env\" cannot satisfy \"env=prod\" and \"env=dev\" at once; no namespace is ever in scope",
            "plugins[0].events.namespaces[0]: \"kube-system\" is in watch.ignoreNamespaces: the plugin never gets events from it",
            "plugins[0].events.namespaces[0]: \"kube-system\" is not in watch.namespaces (shop, billing): the plugin never gets events from it",
        ]
    );
    assert_eq!(
        m.watch.field_selector().as_deref(),
        Some("metadata.namespace!=billing,metadata.namespace!=kube-system")
    );

    let m = Manifest::parse(
        &yaml("{namespaces: [shop], ignoreNamespaces: [shop]}", "{}"),
        Path::new("."),
    )
    .unwrap();
    assert_eq!(
        shown(&m.warnings()),
        [
            "watch.ignoreNamespaces[0]: \"shop\" is also in watch.namespaces: it is watched, but none of its objects is ever delivered",
            "watch.ignoreNamespaces: ignores every namespace of watch.namespaces: nothing is ever delivered",
        ]
    );

    // Reloader's legacy forms, converted as Reloader converts them.
    let m = Manifest::parse(
        &yaml(
            "{namespaceSelector: \"reloader:enabled, team:*\", labelSelector: \"reloader=*\"}",
            "{}",
        ),
        Path::new("."),
    )
    .unwrap();
    let sel = m.watch.namespace_selector.as_ref().unwrap();
    assert_eq!(sel.as_str(), "reloader=enabled,team");
    assert_eq!(
        m.watch.label_selector.as_ref().unwrap().as_str(),
        "reloader"
    );
    assert!(m.warnings().is_empty(), "{:?}", m.warnings());
    assert_eq!(m.watch.field_selector(), None);
}
