//! What parsing one watched object costs: kube's `DynamicObject` (its
//! `#[serde(flatten)]` buffers the object and parses it twice) against
//! [`Parsed`] (one pass), on a watch event of a 10 KiB ConfigMap and on a
//! list page of 500 of them; the typed `ConfigMap` an informer parses is
//! the yardstick. Run with `cargo bench -p wasmwatch-kube --bench parse`;
//! prints medians over batches, so a noisy machine moves them less.
use std::hint::black_box;
use std::time::Instant;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DynamicObject, ObjectList, WatchEvent};
use wasmwatch_kube::parsed::{Page, Parsed};

fn object(i: usize) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": format!("cm-{i}"),
            "namespace": "shop-0",
            "uid": format!("2f0c7a9e-0000-4000-8000-{i:012}"),
            "resourceVersion": format!("{}", 1000 + i),
            "creationTimestamp": "2026-12-07T10:00:00Z",
            "labels": {"spring.cloud.kubernetes.config": "true"},
            "annotations": {"spring.cloud.kubernetes.configmap.apps": format!("app-{}", i % 50)},
            "managedFields": [{"manager": "bench", "operation": "Update", "apiVersion": "v1",
                "time": "2026-12-07T10:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:data": {"f:application.properties": {}}}}]
        },
        "data": {"application.properties": format!("value={i}\n{}", "x".repeat(10 * 1024))}
    })
}

/// Median µs per call of `f` over 31 batches of `n` calls.
fn median_us(n: usize, mut f: impl FnMut()) -> f64 {
    let mut batches: Vec<f64> = (0..31)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / n as f64
        })
        .collect();
    batches.sort_by(f64::total_cmp);
    batches[batches.len() / 2]
}

fn main() {
    let event =
        serde_json::to_vec(&serde_json::json!({"type": "MODIFIED", "object": object(7)})).unwrap();
    let page = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMapList",
        "metadata": {"resourceVersion": "5000", "continue": "next"},
        "items": (0..500).map(object).collect::<Vec<_>>(),
    }))
    .unwrap();

    let typed = median_us(2000, || {
        black_box(serde_json::from_slice::<WatchEvent<ConfigMap>>(black_box(&event)).unwrap());
    });
    let kube = median_us(2000, || {
        black_box(serde_json::from_slice::<WatchEvent<DynamicObject>>(black_box(&event)).unwrap());
    });
    let ours = median_us(2000, || {
        black_box(serde_json::from_slice::<WatchEvent<Parsed>>(black_box(&event)).unwrap());
    });
    println!(
        "watch event, 10 KiB ConfigMap: typed ConfigMap {typed:.2} µs, DynamicObject {kube:.2} µs, Parsed {ours:.2} µs ({:.2}x kube's, {:.2}x typed)",
        ours / kube,
        ours / typed
    );

    let kube = median_us(5, || {
        black_box(serde_json::from_slice::<ObjectList<DynamicObject>>(black_box(&page)).unwrap());
    });
    let ours = median_us(5, || {
        black_box(serde_json::from_slice::<Page>(black_box(&page)).unwrap());
    });
    println!(
        "list page of 500: ObjectList<DynamicObject> {:.2} ms, Parsed items {:.2} ms ({:.2}x)",
        kube / 1000.0,
        ours / 1000.0,
        ours / kube
    );
}
