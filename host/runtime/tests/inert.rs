//! Zero authority: the WASI imports that plugin toolchains bring (files,
//! sockets, name lookup, environment) link, and every attempt to use them
//! fails. One test plugin per language (plugins/testing/inert,
//! plugins/python/testing/inert, plugins/js/testing/inert) tries each and
//! reports the outcome as five `event` actions; see the Rust one for the
//! protocol.
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;

use wasmwatch_core::action::Action;
use wasmwatch_core::lookups::StaticLookups;
use wasmwatch_core::{ChangeEvent, ChangeType, Manifest, ObjectSnapshot};
use wasmwatch_runtime::{Runtime, RuntimeConfig};
use wasmwatch_testkit::pin;

const ATTEMPTS: [&str; 5] = ["OpenFile", "ListDir", "Connect", "Resolve", "Environment"];

fn event() -> ChangeEvent {
    let obj = serde_json::json!({
        "kind": "ConfigMap", "metadata": {"name": "orders", "namespace": "shop"},
        "data": {"application.yaml": "greeting: hi"}
    });
    ChangeEvent::new(
        ChangeType::Modified,
        ObjectSnapshot::from_json(&obj).unwrap(),
        None,
    )
}

/// Loads the inert plugin `component` (a testkit component name), points
/// its connection attempt at a real listener, and checks that every attempt
/// was denied and nothing connected. Returns each attempt's reason and
/// message.
pub fn assert_inert(component: &str) -> Vec<(String, String)> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let yaml = format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - name: inert\n    module: {{module:{component}}}\n    sha256: {{sha256:{component}}}\n    config: {{connect: \"{addr}\", resolve: localhost}}\n    capabilities: {{events: true}}\n    limits: {{memory: 256Mi, timeout: 5s}}\n"
    );
    let m = Manifest::parse(&pin(&yaml), Path::new("/")).unwrap();
    let rt = Runtime::new(RuntimeConfig::default(), Arc::new(StaticLookups::default())).unwrap();
    let plugin = rt
        .load_blocking(&m.plugins[0], &m.base_dir)
        .unwrap_or_else(|e| panic!("{component}: {e}"));
    let out = plugin
        .handle_blocking(&event())
        .unwrap_or_else(|e| panic!("{component}: {e}"));
    let seen: Vec<(String, String)> = out
        .actions
        .iter()
        .map(|c| match &c.action {
            Action::Event {
                reason, message, ..
            } => (reason.clone(), message.clone()),
            other => panic!("{component}: unexpected action {other:?}"),
        })
        .collect();
    eprintln!("{component}: {seen:#?}");
    let reasons: Vec<&str> = seen.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(reasons, ATTEMPTS, "{component}: {seen:?}");
    for (reason, message) in &seen {
        assert!(
            message.starts_with("denied: "),
            "{component}: {reason} was not denied: {message}"
        );
    }
    assert!(
        listener.accept().is_err(),
        "{component}: a connection reached the listener"
    );
    seen
}

#[test]
fn rust_plugins_get_no_files_sockets_names_or_environment() {
    assert_inert("inert");
}

/// plugins/README.md tells plugin authors which error each denial gives;
/// checked against what the Rust plugin sees through wasi-libc: a socket
/// gets `access-denied` (EACCES, "Permission denied"), a name lookup
/// `permanent-resolver-failure` (wasmtime-wasi's answer when lookups are not
/// allowed; EAI_FAIL, "Non-recoverable error").
#[test]
fn the_plugin_guide_names_the_errors_denied_sockets_and_lookups_give() {
    let seen = assert_inert("inert");
    let message = |reason: &str| {
        seen.iter()
            .find(|(r, _)| r == reason)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    };
    assert!(message("Connect").contains("Permission denied"), "{seen:?}");
    assert!(
        message("Resolve").contains("Non-recoverable error"),
        "{seen:?}"
    );
    let guide =
        std::fs::read_to_string(wasmwatch_testkit::repo_root().join("plugins/README.md")).unwrap();
    let guide = guide.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        guide.contains(
            "denies every TCP/UDP socket (`access-denied`) and name lookup (`permanent-resolver-failure`)"
        ),
        "plugins/README.md does not say which error sockets and name lookups get"
    );
}

#[test]
fn python_plugins_get_no_files_sockets_names_or_environment() {
    assert_inert("python/testing/inert");
}

#[test]
fn js_plugins_get_no_files_sockets_names_or_environment() {
    assert_inert("js/testing/inert");
}
