//! What the benchmarks share.
use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmwatch_core::lookups::{ServiceInfo, ServicePort};
use wasmwatch_core::manifest::PluginEntry;
use wasmwatch_core::{ChangeEvent, ChangeType, Lookups, ObjectSnapshot};
use wasmwatch_runtime::{Runtime, RuntimeConfig};

/// Service `shop/NAME` labelled `app=NAME`, port 8080, with `annotations`.
pub fn service(name: &str, annotations: &[(&str, &str)]) -> ServiceInfo {
    ServiceInfo {
        namespace: "shop".into(),
        name: name.into(),
        labels: BTreeMap::from([("app".to_string(), name.to_string())]),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ports: vec![ServicePort {
            name: None,
            port: 8080,
        }],
    }
}

/// The ConfigMap change the benchmarks decide: `shop/orders`, Spring
/// apps `orders` and `billing` named by annotation.
pub fn event() -> ChangeEvent {
    let obj = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "6f1c2d3e", "resourceVersion": "4711",
                     "labels": {"spring.cloud.kubernetes.config": "true", "team": "checkout"},
                     "annotations": {"spring.cloud.kubernetes.configmap.apps": "orders, billing"}},
        "data": {"application.yaml": "greeting: hello\nfeature.x: on\n", "logback.xml": "<configuration/>"}
    });
    ChangeEvent::new(
        ChangeType::Modified,
        ObjectSnapshot::from_json(&obj).unwrap(),
        None,
    )
}

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A runtime whose compiled artifacts go to `cache` (the load benchmarks).
pub fn cached_runtime(cache: &Path, lookups: Arc<dyn Lookups>) -> Runtime {
    let config = RuntimeConfig {
        cache_dir: Some(cache.to_path_buf()),
        ..RuntimeConfig::default()
    };
    Runtime::new(config, lookups).unwrap()
}

/// Compiling `component` alone, without loading it.
pub fn compile_time(runtime: &Runtime, component: &Path) -> Duration {
    let bytes = std::fs::read(component).unwrap();
    let start = Instant::now();
    black_box(runtime.engine().precompile_component(&bytes).unwrap());
    start.elapsed()
}

/// `n` cold loads of `entry` (compile, write the artifact, instantiate,
/// check-config), `cache` emptied before each.
pub fn cold_loads(
    n: usize,
    cache: &Path,
    runtime: impl Fn() -> Runtime,
    entry: &PluginEntry,
    base_dir: &Path,
) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            for f in std::fs::read_dir(cache).unwrap() {
                std::fs::remove_file(f.unwrap().path()).unwrap();
            }
            let rt = runtime();
            let start = Instant::now();
            rt.load_blocking(entry, base_dir).unwrap();
            start.elapsed()
        })
        .collect()
}

/// This process's minor page faults so far (`/proc/self/stat`).
#[allow(dead_code)]
pub fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(7).unwrap().parse().unwrap()
}
