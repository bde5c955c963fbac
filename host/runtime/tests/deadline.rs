//! Deadlines hold whatever the plugin does: a loop, a blocking sleep in a
//! host call (in `handle` and in `check-config`), a flood of host lookups.
//! Alone in its test binary so that no other test's compilation or plugins
//! compete for the CPU while it is timed; the median of several runs is
//! asserted.
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmwatch_core::lookups::{ServiceInfo, ServicePort, StaticLookups};
use wasmwatch_core::{ChangeEvent, ChangeType, Manifest, ObjectSnapshot};
use wasmwatch_runtime::{LoadError, PluginError, Runtime, RuntimeConfig};

fn manifest(mode: &str, timeout: &str) -> Manifest {
    let yaml = wasmwatch_testkit::pin(&format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - name: slow\n    module: {{module:misbehave}}\n    sha256: {{sha256:misbehave}}\n    config: {{mode: {mode}}}\n    limits: {{timeout: {timeout}}}\n"
    ));
    Manifest::parse(&yaml, Path::new("/")).unwrap()
}

fn event() -> ChangeEvent {
    let obj = serde_json::json!({"kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns"}, "data": {}});
    ChangeEvent::new(
        ChangeType::Modified,
        ObjectSnapshot::from_json(&obj).unwrap(),
        None,
    )
}

/// Runs `call` 7 times; asserts each is a timeout and the median took
/// between the deadline - 5 ms and the deadline + 20 ms.
fn assert_stopped_at(deadline: Duration, mut call: impl FnMut() -> Result<(), String>) {
    let mut took: Vec<Duration> = (0..7)
        .map(|_| {
            let start = Instant::now();
            let err = call().unwrap_err();
            assert!(err.contains("exceeded its time limit"), "{err}");
            start.elapsed()
        })
        .collect();
    took.sort();
    let median = took[took.len() / 2];
    assert!(
        median >= deadline - Duration::from_millis(5),
        "stopped too early: {took:?}"
    );
    assert!(
        median <= deadline + Duration::from_millis(20),
        "stopped too late: {took:?}"
    );
}

fn handle_stopped_at(mode: &str, lookups: StaticLookups) {
    let manifest = manifest(mode, "50ms");
    let rt = Runtime::new(RuntimeConfig::default(), Arc::new(lookups)).unwrap();
    let plugin = rt
        .load_blocking(&manifest.plugins[0], &manifest.base_dir)
        .unwrap();
    let event = event();
    assert_stopped_at(Duration::from_millis(50), || {
        plugin.handle_blocking(&event).map(|_| ()).map_err(|e| {
            assert!(matches!(e, PluginError::Timeout { .. }), "{e}");
            e.to_string()
        })
    });
}

#[test]
fn an_infinite_loop_is_stopped_within_its_deadline_plus_20ms() {
    handle_stopped_at("loop", StaticLookups::default());
}

#[test]
fn a_sleep_in_handle_is_stopped_within_its_deadline_plus_20ms() {
    handle_stopped_at("sleep", StaticLookups::default());
}

#[test]
fn endless_lookups_are_stopped_within_their_deadline_plus_20ms() {
    // 3,500 Services of ~1 KiB: each answer is 3.5 MiB, under what a lookup
    // may answer, so the plugin asks again and again.
    let services = (0..3_500)
        .map(|i| ServiceInfo {
            namespace: "ns".into(),
            name: format!("service-{i}"),
            labels: [("app".to_string(), "x".repeat(1000))].into(),
            annotations: Default::default(),
            ports: vec![ServicePort {
                name: None,
                port: 80,
            }],
        })
        .collect();
    handle_stopped_at(
        "lookups",
        StaticLookups {
            services,
            ..Default::default()
        },
    );
}

#[test]
fn a_sleep_in_check_config_is_stopped_within_its_deadline_plus_20ms() {
    let manifest = manifest("sleep-check", "50ms");
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        cache_dir: Some(cache.path().join("c")),
        ..Default::default()
    };
    let rt = Runtime::new(config, Arc::new(StaticLookups::default())).unwrap();
    // Compiled once into the cache, so that the timing is the call's.
    let _ = rt.load_blocking(&manifest.plugins[0], &manifest.base_dir);
    assert_stopped_at(Duration::from_millis(50), || {
        match rt.load_blocking(&manifest.plugins[0], &manifest.base_dir) {
            Ok(_) => Ok(()),
            Err(LoadError::ConfigCheck { source, .. }) => {
                assert!(matches!(*source, PluginError::Timeout { .. }), "{source}");
                Err(source.to_string())
            }
            Err(e) => panic!("{e}"),
        }
    });
}
