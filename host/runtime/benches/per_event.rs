//! Cost per event: a fresh sandbox plus one `handle` call into the real
//! http-refresh plugin, against the same decision written as a plain Rust
//! function. Run with `cargo bench -p wasmwatch-runtime` (release profile).
//!
//! Prints medians over batches, so a noisy machine moves the numbers less.
//! To profile one of the runs alone:
//! `PER_EVENT_PROFILE=handle perf record -g target/release/deps/per_event-* --bench`.
use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmwatch_core::action::{Action, HttpMethod};
use wasmwatch_core::lookups::{
    Endpoint, Lookups, ServiceEndpoints, ServiceInfo, ServicePort, StaticLookups,
};
use wasmwatch_core::{ChangeEvent, ChangeType, Manifest, ObjectKind, ObjectSnapshot};
use wasmwatch_runtime::{Runtime, RuntimeConfig};

fn lookups() -> StaticLookups {
    let svc = |name: &str, annotations: &[(&str, &str)]| ServiceInfo {
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
    };
    // http-refresh leaves the pods to the host, so it never asks for these.
    let endpoints = |name: &str| ServiceEndpoints {
        namespace: "shop".into(),
        service: name.into(),
        ready: (1..=3)
            .map(|i| Endpoint {
                address: format!("10.1.0.{i}"),
                pod: Some(format!("{name}-{i}")),
                ports: vec![ServicePort {
                    name: None,
                    port: 8080,
                }],
            })
            .collect(),
    };
    StaticLookups {
        services: vec![
            svc("orders", &[]),
            svc(
                "billing",
                &[("boot.spring.io/actuator", "http://:9090/manage")],
            ),
        ],
        endpoints: vec![endpoints("orders"), endpoints("billing")],
        workloads: vec![],
    }
}

fn event() -> ChangeEvent {
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

/// http-refresh's decision as a plain Rust function over the same inputs:
/// config JSON parsed per event, annotations read, Services looked up.
fn native_decision(ev: &ChangeEvent, config_json: &str, lookups: &dyn Lookups) -> Vec<Action> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Config {
        #[serde(default)]
        strategy: Option<String>,
        #[serde(default)]
        base_path: Option<String>,
    }
    let config: Config = serde_json::from_str(config_json).unwrap();
    let o = &ev.object;
    let prefix = match o.kind {
        ObjectKind::ConfigMap => "spring.cloud.kubernetes.configmap",
        ObjectKind::Secret => "spring.cloud.kubernetes.secret",
    };
    let services: Vec<ServiceInfo> = match o.annotations.get(&format!("{prefix}.apps")) {
        Some(apps) => apps
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .filter_map(|a| lookups.service(&o.namespace, a))
            .collect(),
        None => lookups.service(&o.namespace, &o.name).into_iter().collect(),
    };
    let endpoint = if config.strategy.as_deref() == Some("shutdown") {
        "shutdown"
    } else {
        "refresh"
    };
    services
        .into_iter()
        .map(|svc| {
            let (port, base) = match svc.annotations.get("boot.spring.io/actuator") {
                Some(v) => {
                    let rest = v.trim_start_matches("http://");
                    let (auth, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                    (
                        auth.rsplit_once(':').and_then(|(_, p)| p.parse().ok()),
                        Some(path.to_string()),
                    )
                }
                None => (None, None),
            };
            let base = base
                .or(config.base_path.clone())
                .unwrap_or_else(|| "/actuator".into());
            Action::RefreshService {
                namespace: svc.namespace,
                service: svc.name,
                method: HttpMethod::Post,
                port,
                path: format!("{base}/{endpoint}"),
                tls: false,
            }
        })
        .collect()
}

/// Median per-iteration time of each of `runs`, over `rounds` rounds of
/// `per_batch` iterations each (a run is given the batch size). The runs
/// take turns batch by batch, so a noisy neighbour slows all of them alike
/// and their ratios hold.
fn measure<const N: usize>(
    rounds: usize,
    per_batch: usize,
    mut runs: [&mut dyn FnMut(usize); N],
) -> [Duration; N] {
    for run in runs.iter_mut() {
        run(per_batch);
    }
    let mut samples: [Vec<Duration>; N] = std::array::from_fn(|_| Vec::with_capacity(rounds));
    for _ in 0..rounds {
        for (run, samples) in runs.iter_mut().zip(samples.iter_mut()) {
            let start = Instant::now();
            run(per_batch);
            samples.push(start.elapsed() / per_batch as u32);
        }
    }
    samples.map(|mut s| {
        s.sort();
        s[s.len() / 2]
    })
}

fn main() {
    let yaml = wasmwatch_testkit::pin(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - name: http-refresh\n    module: {module:http-refresh}\n    sha256: {sha256:http-refresh}\n    config: {strategy: refresh}\n    capabilities: {refresh: [shop]}\n",
    );
    let manifest = Manifest::parse(&yaml, Path::new("/")).unwrap();
    let entry = &manifest.plugins[0];
    let lookups = Arc::new(lookups());
    let rt = Runtime::new(RuntimeConfig::default(), lookups.clone()).unwrap();
    let plugin = rt.load_blocking(entry, &manifest.base_dir).unwrap();
    let ev = event();
    let config_json = entry.config.to_string();
    // Calls are futures, as in the service: each batch runs on one thread
    // (a current-thread runtime), so what is measured is the call itself.
    let tokio_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let handle = |n: usize| {
        tokio_rt.block_on(async {
            for _ in 0..n {
                black_box(plugin.handle(black_box(&ev)).await.unwrap());
            }
        })
    };
    let sandbox = |n: usize| {
        tokio_rt.block_on(async {
            for _ in 0..n {
                plugin.sandbox_only().await.unwrap();
            }
        })
    };

    // Both make the same decision.
    let wasm_actions: Vec<Action> = plugin
        .handle_blocking(&ev)
        .unwrap()
        .allowed()
        .cloned()
        .collect();
    let native_actions = native_decision(&ev, &config_json, lookups.as_ref());
    assert_eq!(wasm_actions, native_actions);
    assert_eq!(wasm_actions.len(), 2);

    let (rounds, per_batch) = (61, 1000);
    // For profilers: PER_EVENT_PROFILE=handle|sandbox runs only that, 200k times.
    if let Ok(only) = std::env::var("PER_EVENT_PROFILE") {
        if only == "sandbox" {
            sandbox(200_000);
        } else {
            handle(200_000);
        }
        return;
    }
    let [wasm, sandbox, native] = measure(
        rounds,
        per_batch,
        [&mut { handle }, &mut { sandbox }, &mut |n| {
            for _ in 0..n {
                let actions = native_decision(black_box(&ev), &config_json, lookups.as_ref());
                // The host checks capabilities either way.
                let verdicts: Vec<_> = actions
                    .iter()
                    .map(|a| entry.capabilities.check(a))
                    .collect();
                black_box(verdicts);
            }
        }],
    );
    println!("per event (median of {rounds} interleaved batches x {per_batch}):");
    println!(
        "  fresh sandbox + call, http-refresh.wasm : {:>8.2} us",
        wasm.as_secs_f64() * 1e6
    );
    println!(
        "  of which fresh sandbox + trivial call  : {:>8.2} us",
        sandbox.as_secs_f64() * 1e6
    );
    println!(
        "  same decision, plain Rust              : {:>8.2} us",
        native.as_secs_f64() * 1e6
    );
    println!(
        "  ratio                                  : {:>8.1} x",
        wasm.as_secs_f64() / native.as_secs_f64()
    );
    println!("  goal                                   : <= 25 us per event");
}
