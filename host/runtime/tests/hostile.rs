//! Hostile plugins (plugins/testing/misbehave): each way a plugin could
//! freeze, flood or mislead the host is contained, and reported for what it
//! is. Timings against the deadline are in tests/deadline.rs.
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmwatch_core::lookups::{ServiceInfo, StaticLookups};
use wasmwatch_core::{ChangeEvent, ChangeType, Manifest, ObjectSnapshot, Verdict};
use wasmwatch_runtime::{LoadError, Plugin, PluginError, Runtime, RuntimeConfig};

fn runtime_with(config: RuntimeConfig, lookups: StaticLookups) -> Runtime {
    Runtime::new(config, Arc::new(lookups)).unwrap()
}

fn runtime() -> Runtime {
    runtime_with(RuntimeConfig::default(), StaticLookups::default())
}

fn entry(name: &str, module: &str, config: &str, extra: &str) -> Manifest {
    let yaml = format!(
        "apiVersion: wasmwatch.io/v1alpha1\nkind: PluginManifest\nplugins:\n  - name: {name}\n    module: {{module:{module}}}\n    sha256: {{sha256:{module}}}\n    config: {config}\n{extra}"
    );
    Manifest::parse(&wasmwatch_testkit::pin(&yaml), Path::new("/"))
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn load(rt: &Runtime, mode: &str, extra: &str) -> Plugin {
    let m = entry("bad", "misbehave", &format!("{{mode: {mode}}}"), extra);
    rt.load_blocking(&m.plugins[0], &m.base_dir).unwrap()
}

fn event() -> ChangeEvent {
    let obj = serde_json::json!({"kind": "ConfigMap", "metadata": {"name": "orders", "namespace": "shop"}, "data": {"k": "v"}});
    ChangeEvent::new(
        ChangeType::Modified,
        ObjectSnapshot::from_json(&obj).unwrap(),
        None,
    )
}

#[test]
fn a_huge_random_request_is_refused_not_served() {
    let rt = runtime();
    let plugin = load(&rt, "random", "    limits: {timeout: 2s, memory: 256Mi}");
    let start = Instant::now();
    let err = plugin.handle_blocking(&event()).unwrap_err();
    assert!(matches!(err, PluginError::Trap { .. }), "{err}");
    assert!(err.to_string().contains("exceeds limit 65536"), "{err}");
    // 64 MiB of random bytes took ~230 ms; refusing takes nothing.
    assert!(
        start.elapsed() < Duration::from_millis(200),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_lookup_answer_larger_than_the_plugins_memory_ends_the_call() {
    let services = (0..100)
        .map(|i| ServiceInfo {
            namespace: "shop".into(),
            name: format!("s{i}"),
            labels: Default::default(),
            annotations: [("big".to_string(), "x".repeat(100 << 10))].into(),
            ports: vec![],
        })
        .collect();
    let rt = runtime_with(
        RuntimeConfig::default(),
        StaticLookups {
            services,
            ..Default::default()
        },
    );
    let plugin = load(&rt, "lookups", "    limits: {timeout: 2s, memory: 8Mi}");
    let err = plugin.handle_blocking(&event()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("host lookup `services-with-labels` answered 100 items")
            && text.contains("more than the 4194304 bytes a lookup may answer"),
        "{text}"
    );
}

#[test]
fn a_million_empty_headers_are_too_much_output() {
    let rt = runtime();
    let plugin = load(
        &rt,
        "headers",
        "    limits: {timeout: 5s, memory: 256Mi}\n    capabilities: {http: [\"http://127.0.0.1:*/\"]}",
    );
    let err = match plugin.handle_blocking(&event()) {
        Ok(d) => panic!("accepted {} actions", d.actions.len()),
        Err(e) => e,
    };
    assert!(matches!(err, PluginError::OutputTooLarge { .. }), "{err}");
    assert!(err.to_string().contains("the limit is 1048576"), "{err}");
}

#[test]
fn a_plugin_may_not_set_host_or_framing_headers() {
    let rt = runtime();
    let m = entry(
        "bad",
        "misbehave",
        "{mode: host-header, url: \"http://127.0.0.1:8080/hooks/refresh\"}",
        "    capabilities: {http: [\"http://127.0.0.1:*/hooks/*\"]}",
    );
    let plugin = rt.load_blocking(&m.plugins[0], &m.base_dir).unwrap();
    let decision = plugin.handle_blocking(&event()).unwrap();
    assert_eq!(decision.allowed().count(), 0);
    match &decision.actions[0].verdict {
        Verdict::Refused { capability, reason } => {
            assert_eq!(*capability, "http");
            assert!(reason.contains("\"Host\""), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_100_mib_error_is_cut_to_a_bounded_line() {
    let rt = runtime();
    let plugin = load(&rt, "big-error", "    limits: {timeout: 5s, memory: 512Mi}");
    let err = plugin.handle_blocking(&event()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, PluginError::Returned { .. }),
        "{}",
        &text[..200]
    );
    assert!(text.len() < 4096 + 200, "{} bytes", text.len());
    // Only the start of it was copied out of the sandbox, but the whole
    // length is told.
    assert!(
        text.ends_with("(truncated, 104857600 bytes in all)"),
        "{}",
        &text[text.len() - 100..]
    );
}

/// Collects what the host logs on this thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn host_log_is_bounded_per_call_and_cannot_forge_lines() {
    let rt = runtime();
    let plugin = load(&rt, "log-flood", "    limits: {timeout: 100ms}");
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let err = tracing::subscriber::with_default(subscriber, || {
        plugin.handle_blocking(&event()).unwrap_err()
    });
    assert!(matches!(err, PluginError::Timeout { .. }), "{err}");
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    // 16 KiB of messages (each cut to 4 KiB), then one line saying the
    // rest is dropped; the flood went on until the deadline.
    assert!(
        (2..=33).contains(&lines.len()),
        "{} lines, {} bytes",
        lines.len(),
        log.len()
    );
    assert!(log.len() < 32 << 10, "{} bytes of log", log.len());
    assert!(
        lines
            .iter()
            .all(|l| l.contains("plugin=\"bad\"") || l.contains("plugin=bad")),
        "{}",
        lines[0]
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("ERROR wasmwatch")),
        "a forged line"
    );
    let last = lines.last().unwrap();
    assert!(last.contains("log limit"), "{last}");
}

#[test]
fn a_forbidden_import_is_refused_before_compiling() {
    let cache = tempfile::tempdir().unwrap();
    let rt = runtime_with(
        RuntimeConfig {
            cache_dir: Some(cache.path().join("c")),
            ..Default::default()
        },
        StaticLookups::default(),
    );
    let m = entry("net", "wasi-http", "{}", "");
    let err = rt.load_blocking(&m.plugins[0], &m.base_dir).err().unwrap();
    assert!(matches!(err, LoadError::ForbiddenImport { .. }), "{err}");
    assert!(err.to_string().contains("wasi:http"), "{err}");
    // Nothing was compiled: the cache holds no artifact.
    let artifacts = std::fs::read_dir(cache.path().join("c/compiled"))
        .unwrap()
        .count();
    assert_eq!(artifacts, 0);
}

#[test]
fn a_blocked_plugin_does_not_delay_another() {
    let rt = runtime();
    let sleeper = Arc::new(load(&rt, "sleep", "    limits: {timeout: 3s}"));
    let ok = load(&rt, "ok", "    capabilities: {events: true}");
    let ev = event();
    ok.handle_blocking(&ev).unwrap();
    // More blocked calls than the sleeper's share of sandboxes.
    let blocked: Vec<_> = (0..12)
        .map(|_| {
            let (p, ev) = (sleeper.clone(), ev.clone());
            std::thread::spawn(move || p.handle_blocking(&ev))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    for _ in 0..10 {
        assert_eq!(ok.handle_blocking(&ev).unwrap().actions.len(), 1);
    }
    let took = start.elapsed();
    assert!(took < Duration::from_millis(500), "10 calls took {took:?}");
    for t in blocked {
        assert!(matches!(
            t.join().unwrap(),
            Err(PluginError::Timeout { .. })
        ));
    }
}

/// The plugin's time limit in the output tests below.
const OUTPUT_TIMEOUT: Duration = Duration::from_millis(1000);
/// When the plugin returns its output: early enough to lower it (in its own
/// time) before the deadline, late enough that copying it out the old way
/// ran far past the deadline (issue 23).
const OUTPUT_HOLD: Duration = Duration::from_millis(900);

fn output_plugin(rt: &Runtime, mode: &str) -> Plugin {
    let m = entry(
        "bad",
        "misbehave",
        &format!("{{mode: {mode}, hold_ms: {}}}", OUTPUT_HOLD.as_millis()),
        &format!(
            "    limits: {{timeout: {}ms, memory: 512Mi}}",
            OUTPUT_TIMEOUT.as_millis()
        ),
    );
    rt.load_blocking(&m.plugins[0], &m.base_dir).unwrap()
}

/// Output that costs the host far more to copy than the plugin to make is
/// refused as too large, and before the deadline: the host counts it while
/// copying (issue 23). The plugin returns 100 ms before its deadline.
fn refused_before_the_deadline(mode: &str) {
    let rt = runtime();
    let plugin = output_plugin(&rt, mode);
    let start = Instant::now();
    let result = plugin.handle_blocking(&event());
    let took = start.elapsed();
    eprintln!(
        "{mode}: returned {} ms after the deadline",
        took.as_secs_f64() * 1e3 - OUTPUT_TIMEOUT.as_secs_f64() * 1e3
    );
    let err = match result {
        Ok(d) => panic!("accepted {} actions", d.actions.len()),
        Err(e) => e,
    };
    assert!(matches!(err, PluginError::OutputTooLarge { .. }), "{err}");
    // Generous for a loaded machine: the refusal itself takes well under
    // a millisecond, lowering the output in the sandbox a few.
    assert!(
        took <= OUTPUT_TIMEOUT + Duration::from_millis(50),
        "{mode}: refused {took:?} after the call began, the limit is {OUTPUT_TIMEOUT:?}: {err}"
    );
}

#[test]
fn twenty_actions_sharing_a_million_headers_are_refused_in_time() {
    refused_before_the_deadline("shared-headers");
}

#[test]
fn a_hundred_bodies_aliasing_16_mib_are_refused_in_time() {
    refused_before_the_deadline("aliased-bodies");
}

#[test]
fn seven_16_mib_bodies_are_refused_in_time() {
    refused_before_the_deadline("big-bodies");
}

#[test]
fn a_million_empty_headers_are_refused_in_time() {
    refused_before_the_deadline("headers");
}

#[test]
fn half_a_million_actions_are_refused_in_time() {
    refused_before_the_deadline("many-actions");
}

/// While a plugin's oversized output is refused, a well-behaved plugin's
/// calls on the same (single) tokio worker go on as usual.
#[test]
fn oversized_output_does_not_delay_another_plugin() {
    let rt = runtime();
    let hostile = Arc::new(output_plugin(&rt, "aliased-bodies"));
    let ok = Arc::new(load(&rt, "ok", "    capabilities: {events: true}"));
    let worker = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (slowest, refused) = worker.block_on(async move {
        let ev = event();
        ok.handle(&ev).await.unwrap();
        let call = {
            let (hostile, ev) = (hostile.clone(), ev.clone());
            tokio::spawn(async move { hostile.handle(&ev).await })
        };
        let mut slowest = Duration::ZERO;
        let mut calls = 0;
        // Until well after the hostile call's deadline.
        let until = Instant::now() + OUTPUT_TIMEOUT + Duration::from_millis(300);
        while Instant::now() < until {
            let (ok, ev) = (ok.clone(), ev.clone());
            let start = Instant::now();
            // Through the worker, like the service's calls.
            tokio::spawn(async move { ok.handle(&ev).await })
                .await
                .unwrap()
                .unwrap();
            slowest = slowest.max(start.elapsed());
            calls += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        eprintln!("{calls} calls, the slowest took {slowest:?}");
        (slowest, call.await.unwrap().unwrap_err())
    });
    assert!(
        slowest < Duration::from_millis(100),
        "a well-behaved call took {slowest:?}"
    );
    assert!(
        matches!(refused, PluginError::OutputTooLarge { .. }),
        "{refused}"
    );
}
