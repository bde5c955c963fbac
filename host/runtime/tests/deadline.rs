//! A looping plugin is stopped within its deadline + 20 ms. Alone in its
//! test binary so that no other test's compilation or plugins compete for
//! the CPU while it is timed; the median of several runs is asserted.
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmwatch_core::{ChangeEvent, ChangeType, Manifest, ObjectSnapshot, StaticLookups};
use wasmwatch_runtime::{PluginError, Runtime, RuntimeConfig};

#[test]
fn an_infinite_loop_is_stopped_within_its_deadline_plus_20ms() {
    let yaml = wasmwatch_testkit::pin(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - name: looping\n    module: {module:misbehave}\n    sha256: {sha256:misbehave}\n    config: {mode: loop}\n    limits: {timeout: 50ms}\n",
    );
    let manifest = Manifest::parse(&yaml, Path::new("/")).unwrap();
    let rt = Runtime::new(RuntimeConfig::default(), Arc::new(StaticLookups::default())).unwrap();
    let plugin = rt.load(&manifest.plugins[0], &manifest.base_dir).unwrap();
    let obj = serde_json::json!({"kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns"}, "data": {}});
    let event = ChangeEvent::new(
        ChangeType::Modified,
        ObjectSnapshot::from_json(&obj).unwrap(),
        None,
    );
    let mut took: Vec<Duration> = (0..7)
        .map(|_| {
            let start = Instant::now();
            let err = plugin.handle(&event).unwrap_err();
            assert!(matches!(err, PluginError::Timeout { .. }), "{err}");
            start.elapsed()
        })
        .collect();
    took.sort();
    let median = took[took.len() / 2];
    assert!(
        median >= Duration::from_millis(45),
        "stopped too early: {took:?}"
    );
    assert!(
        median <= Duration::from_millis(50 + 20),
        "stopped too late: {took:?}"
    );
}
