//! The Python http-refresh (plugins/python/http-refresh, componentize-py)
//! against the Rust one: component size, compile time, cold load (compile,
//! write the artifact, instantiate, check-config), warm load (the cached
//! artifact, as a restarted host finds it), the first call after a load,
//! and the per-event cost (fresh sandbox + call) with the part a trivial
//! call costs. Run with `cargo bench -p wasmwatch-runtime --bench
//! python_plugin` (release profile). Goals (issue 12): under 2 ms per event
//! (median). The last column, minor page faults per event, does not move
//! with the machine's noise (the times do, up to 1.5x on a shared VM).
//!
//! `PYTHON_BENCH_PROFILE=handle|sandbox` loads the Python plugin once and
//! runs only 5,000 calls (for perf), printing the mean time and minor page
//! faults per call; `PYTHON_BENCH_MODULE=python/NAME` profiles another
//! plugin of plugins/python (an empty one shows the floor of the toolchain).
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmwatch_core::Manifest;
use wasmwatch_core::lookups::StaticLookups;
use wasmwatch_runtime::{Runtime, RuntimeConfig};

mod common;

fn lookups() -> StaticLookups {
    let svc = common::service;
    StaticLookups {
        services: vec![
            svc("orders", &[]),
            svc(
                "billing",
                &[("boot.spring.io/actuator", "http://:9090/manage")],
            ),
        ],
        ..Default::default()
    }
}

struct Row {
    label: &'static str,
    size: u64,
    compile: Duration,
    cold: Duration,
    warm: Duration,
    first_call: Duration,
    per_event: Duration,
    sandbox: Duration,
    p90: Duration,
    /// Minor page faults per event (mean; steadier than the times).
    faults: u64,
}

fn bench(label: &'static str, module: &str, per_batch: usize) -> Row {
    let lookups = Arc::new(lookups());
    let yaml = wasmwatch_testkit::pin(&format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - name: http-refresh\n    module: {{module:{module}}}\n    sha256: {{sha256:{module}}}\n    config: {{strategy: refresh}}\n    capabilities: {{refresh: [shop]}}\n    limits: {{memory: 32Mi, timeout: 1s}}\n"
    ));
    let manifest = Manifest::parse(&yaml, Path::new("/")).unwrap();
    let entry = &manifest.plugins[0];
    let path = wasmwatch_testkit::component(module);
    let size = std::fs::metadata(&path).unwrap().len();
    let cache = tempfile::tempdir().unwrap();
    let runtime = || common::cached_runtime(cache.path(), lookups.clone());
    let compile = common::compile_time(&runtime(), &path);
    let cold = common::cold_loads(3, cache.path(), runtime, entry, &manifest.base_dir);
    let ev = common::event();
    let mut warm = Vec::new();
    let mut first = Vec::new();
    let mut last = None;
    for _ in 0..7 {
        let rt = runtime();
        let start = Instant::now();
        let p = rt.load_blocking(entry, &manifest.base_dir).unwrap();
        warm.push(start.elapsed());
        let start = Instant::now();
        let d = p.handle_blocking(&ev).unwrap();
        first.push(start.elapsed());
        assert_eq!(d.allowed().count(), 2, "{module}: orders and billing");
        last = Some((rt, p));
    }
    let (_rt, plugin) = last.unwrap();
    let tokio_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Single calls, for the median and the 90th percentile.
    let mut calls = Vec::new();
    let mut sandboxes = Vec::new();
    let mut faults = 0;
    for _ in 0..per_batch * 20 {
        let before = common::minor_faults();
        let start = Instant::now();
        tokio_rt.block_on(async { black_box(plugin.handle(black_box(&ev)).await.unwrap()) });
        calls.push(start.elapsed());
        faults += common::minor_faults() - before;
        let start = Instant::now();
        tokio_rt.block_on(async { plugin.sandbox_only().await.unwrap() });
        sandboxes.push(start.elapsed());
    }
    let faults = faults / calls.len() as u64;
    calls.sort();
    let p90 = calls[calls.len() * 9 / 10];
    Row {
        label,
        size,
        compile,
        cold: common::median(cold),
        warm: common::median(warm),
        first_call: common::median(first),
        per_event: common::median(calls),
        sandbox: common::median(sandboxes),
        p90,
        faults,
    }
}

fn main() {
    if std::env::var_os("PYTHON_BENCH_PROFILE").is_some() {
        profile();
        return;
    }
    let rows = [
        bench("Rust", "http-refresh", 100),
        bench("Python", "python/http-refresh", 20),
    ];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "http-refresh by language (loads: median of 3 cold / 7 warm; calls: median of 400-2000 single calls):"
    );
    println!(
        "  {:<8} {:>10} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>16} {:>7}",
        "language",
        "size",
        "compile",
        "cold load",
        "warm load",
        "1st call",
        "per event",
        "p90",
        "of which sandbox",
        "faults"
    );
    for r in rows {
        println!(
            "  {:<8} {:>7.2} MB {:>8.1} ms {:>8.1} ms {:>8.2} ms {:>8.2} ms {:>8.3} ms {:>8.3} ms {:>13.3} ms {:>7}",
            r.label,
            r.size as f64 / 1e6,
            ms(r.compile),
            ms(r.cold),
            ms(r.warm),
            ms(r.first_call),
            ms(r.per_event),
            ms(r.p90),
            ms(r.sandbox),
            r.faults,
        );
    }
    println!("  goal: Python per event < 2 ms (median)");
}

/// One load of the Python plugin, then 5,000 calls of one kind, for perf.
fn profile() {
    let module =
        std::env::var("PYTHON_BENCH_MODULE").unwrap_or_else(|_| "python/http-refresh".into());
    let module = module.as_str();
    let yaml = wasmwatch_testkit::pin(&format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - name: http-refresh\n    module: {{module:{module}}}\n    sha256: {{sha256:{module}}}\n    capabilities: {{refresh: [shop]}}\n    limits: {{memory: 32Mi, timeout: 1s}}\n"
    ));
    let manifest = Manifest::parse(&yaml, Path::new("/")).unwrap();
    let rt = Runtime::new(RuntimeConfig::default(), Arc::new(lookups())).unwrap();
    let plugin = rt
        .load_blocking(&manifest.plugins[0], &manifest.base_dir)
        .unwrap();
    let ev = common::event();
    let tokio_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sandbox = std::env::var("PYTHON_BENCH_PROFILE").is_ok_and(|p| p == "sandbox");
    let minflt = common::minor_faults;
    let faults = minflt();
    let start = Instant::now();
    tokio_rt.block_on(async {
        for _ in 0..5_000 {
            if sandbox {
                plugin.sandbox_only().await.unwrap();
            } else {
                black_box(plugin.handle(&ev).await.unwrap());
            }
        }
    });
    eprintln!(
        "5,000 calls: {:?} each, {} minor faults each",
        start.elapsed() / 5_000,
        (minflt() - faults) / 5_000
    );
}
