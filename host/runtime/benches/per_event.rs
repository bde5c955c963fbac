//! Cost per event: a fresh sandbox plus one `handle` call into the real
//! http-refresh plugin, against the same decision written as a plain Rust
//! function. Run with `cargo bench -p wasmwatch-runtime` (release profile).
//!
//! Then the same for rollout-restart in Rust and in JavaScript
//! (plugins/js/rollout-restart, componentize-js): component size, compile
//! time, cold and warm (cached artifact) load, and the per-event cost.
//!
//! Prints medians over batches, so a noisy machine moves the numbers less.
//! To profile one of the runs alone:
//! `PER_EVENT_PROFILE=handle perf record -g target/release/deps/per_event-* --bench`.
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmwatch_core::action::{Action, HttpMethod};
use wasmwatch_core::lookups::{
    Endpoint, Lookups, ServiceEndpoints, ServiceInfo, ServicePort, StaticLookups,
};
use wasmwatch_core::{ChangeEvent, Manifest, ObjectKind};
use wasmwatch_runtime::{Runtime, RuntimeConfig};

mod common;

fn lookups() -> StaticLookups {
    let svc = common::service;
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
        ObjectKind::Custom(_) => return Vec::new(),
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
    let ev = common::event();
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

    if std::env::var_os("PER_EVENT_SKIP_JS").is_none() {
        languages(&ev);
    }
}

/// The Reloader-annotated workloads of tests/fixtures/shop-reloader-lookups.yaml.
fn reloader_lookups() -> StaticLookups {
    serde_json::from_value(serde_json::json!({"workloads": [
        {"workload": {"kind": "Deployment", "namespace": "shop", "name": "orders"},
         "annotations": {"reloader.stakater.com/auto": "true"},
         "references": [{"kind": "ConfigMap", "name": "orders"}]},
        {"workload": {"kind": "StatefulSet", "namespace": "shop", "name": "billing"},
         "templateAnnotations": {"configmap.reloader.stakater.com/reload": "orders,billing-.*"},
         "references": [{"kind": "ConfigMap", "name": "orders"}]},
        {"workload": {"kind": "Deployment", "namespace": "shop", "name": "reports"},
         "annotations": {"secret.reloader.stakater.com/auto": "true"},
         "references": [{"kind": "ConfigMap", "name": "orders"}]}
    ]}))
    .unwrap()
}

/// rollout-restart in Rust and in JavaScript: size, compile, loads, per event.
fn languages(ev: &ChangeEvent) {
    let lookups: Arc<StaticLookups> = Arc::new(reloader_lookups());
    let tokio_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("rollout-restart by language (loads: median of 5; per event: median of 21 batches):");
    let mut results = Vec::new();
    for (label, module, per_batch) in [
        ("Rust", "rollout-restart", 200),
        ("JavaScript", "js/rollout-restart", 20),
    ] {
        let yaml = wasmwatch_testkit::pin(&format!(
            "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - name: restart\n    module: {{module:{module}}}\n    sha256: {{sha256:{module}}}\n    capabilities: {{restart: [shop]}}\n"
        ));
        let manifest = Manifest::parse(&yaml, Path::new("/")).unwrap();
        let entry = &manifest.plugins[0];
        let size = std::fs::metadata(wasmwatch_testkit::component(module))
            .unwrap()
            .len();
        let cache = tempfile::tempdir().unwrap();
        let runtime = || common::cached_runtime(cache.path(), lookups.clone());
        // Cold: compile (and write the artifact), instantiate, check-config.
        let cold = common::cold_loads(5, cache.path(), runtime, entry, &manifest.base_dir);
        let compile = common::compile_time(&runtime(), &wasmwatch_testkit::component(module));
        // Warm: the cached artifact, as a restarted host finds it.
        let mut warm = Vec::new();
        let mut plugin = None;
        for _ in 0..5 {
            let rt = runtime();
            let start = Instant::now();
            let p = rt.load_blocking(entry, &manifest.base_dir).unwrap();
            warm.push(start.elapsed());
            plugin = Some((rt, p));
        }
        let (_rt, plugin) = plugin.unwrap();
        let restarted = plugin.handle_blocking(ev).unwrap().allowed().count();
        assert_eq!(restarted, 2, "{module}: orders and billing restart");
        let [per_event, sandbox] = measure(
            21,
            per_batch,
            [
                &mut |n| {
                    tokio_rt.block_on(async {
                        for _ in 0..n {
                            black_box(plugin.handle(black_box(ev)).await.unwrap());
                        }
                    })
                },
                &mut |n| {
                    tokio_rt.block_on(async {
                        for _ in 0..n {
                            plugin.sandbox_only().await.unwrap();
                        }
                    })
                },
            ],
        );
        results.push((
            label,
            size,
            compile,
            common::median(cold),
            common::median(warm),
            per_event,
            sandbox,
        ));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "  {:<11} {:>10} {:>11} {:>11} {:>11} {:>13} {:>16}",
        "language", "size", "compile", "cold load", "warm load", "per event", "of which sandbox"
    );
    for (label, size, compile, cold, warm, per_event, sandbox) in results {
        println!(
            "  {label:<11} {:>7.2} MB {:>8.1} ms {:>8.1} ms {:>8.2} ms {:>10.3} ms {:>13.3} ms",
            size as f64 / 1e6,
            ms(compile),
            ms(cold),
            ms(warm),
            ms(per_event),
            ms(sandbox),
        );
    }
    println!("  goal: JavaScript per event < 2 ms (median)");
}
