//! Test plugin whose behaviour is chosen by its config: `{"mode": "..."}`.
//!
//! Used by the host's tests to show that misbehaving plugins are contained and
//! that the host sees and reports each failure for what it is.
//!
//! Modes: `noop` (no actions), `ok` (one event action), `loop` (never returns), `bomb` (allocates
//! without bound), `trap` (panics), `recurse` (unbounded recursion), `huge`
//! (returns far too many actions), `forbidden` (returns actions outside any
//! sane grant), `error` (returns an error), `spy` (reports what it saw of the
//! event and of the host lookups), `echo-url` (one HTTP call to `url`),
//! `ledger` (POSTs `namespace/name digest change rv` to `url`: the HA tests'
//! record of what was delivered), `remember` (reports what it finds left over
//! in its statics from earlier calls, then leaves a mark on 16 pages),
//! `sleep` (blocks 30 s in a wasi:clocks poll, `std::thread::sleep`),
//! `sleep-check` (the same in `check-config`), `random` (asks wasi:random for
//! 64 MiB at once), `lookups` (calls `services-with-labels` without end),
//! `headers` (one HTTP action with 1,000,000 empty headers), `host-header`
//! (an allowed HTTP call with its own `Host` headers), `big-error` (returns a
//! 100 MiB error), `log-flood` (logs forged lines without end).
//!
//! Output that costs the host more to copy than to make (issue 23; each
//! refused as too large): `shared-headers` (20 HTTP actions whose header
//! lists are one list of 1,000,000 empty headers), `aliased-bodies` (100 HTTP
//! actions whose bodies are one 16 MiB buffer), `big-bodies` (7 HTTP actions
//! with a 16 MiB body each), `headers` (above), `many-actions` (500,000 event
//! actions). The aliasing modes cannot be written in Rust types: the result
//! is lowered as usual, then its lists are pointed at the shared one (see
//! `exports`). With `hold_ms`, `handle` returns only that many ms after it
//! started, so that the host's copying begins right at the deadline.

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};
use wasmwatch::plugin::host;
use wasmwatch::plugin::types::{
    ChangeType, DataValue, EmitEvent, EventType, Header, HttpCall, HttpMethod, LogLevel,
    ObjectKind, RestartWorkload, WorkloadKind, WorkloadRef,
};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    mode: String,
    #[serde(default)]
    url: Option<String>,
    /// Return no earlier than this many ms after `handle` started.
    #[serde(default)]
    hold_ms: Option<u64>,
    /// Read by the host only: the label its prefilter requires (below).
    #[allow(dead_code)]
    #[serde(default)]
    only_label: Option<String>,
    /// Read by the host only: the annotation its prefilter requires.
    #[allow(dead_code)]
    #[serde(default)]
    only_annotation: Option<String>,
}

/// Its needs (issue 35's prefilter test): with `only_label` (and
/// `only_annotation`) in its config the host calls it only for objects
/// carrying that label (and annotation); the empty
/// `metadata` makes the stored index keep only what the prefilter names,
/// so a deletion found at a resync shows whether the host kept it.
#[used]
#[unsafe(link_section = "wasmwatch:needs")]
static NEEDS: [u8; NEEDS_JSON.len()] = {
    let bytes = NEEDS_JSON.as_bytes();
    let mut out = [0u8; NEEDS_JSON.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = bytes[i];
        i += 1;
    }
    out
};
const NEEDS_JSON: &str = r#"{"metadata": {}, "only": ["label:{config.only_label}", "annotation:{config.only_annotation}"]}"#;

const MODES: &[&str] = &[
    "noop",
    "ok",
    "loop",
    "bomb",
    "trap",
    "recurse",
    "huge",
    "forbidden",
    "error",
    "spy",
    "echo-url",
    "ledger",
    "remember",
    "sleep",
    "sleep-check",
    "random",
    "lookups",
    "headers",
    "host-header",
    "big-error",
    "log-flood",
    "shared-headers",
    "aliased-bodies",
    "big-bodies",
    "many-actions",
];

fn parse(json: &str) -> Result<Config, String> {
    let c: Config = serde_json::from_str(json).map_err(|e| format!("misbehave config: {e}"))?;
    if !MODES.contains(&c.mode.as_str()) {
        return Err(format!(
            "misbehave config: unknown mode {:?}, expected one of {MODES:?}",
            c.mode
        ));
    }
    Ok(c)
}

fn event(reason: &str, message: String) -> Action {
    Action::Event(EmitEvent {
        event_type: EventType::Normal,
        reason: reason.into(),
        message,
    })
}

/// Recursion the optimiser cannot turn into a loop, with its state in wasm
/// locals only, so it exhausts wasm's own call stack (not the shadow stack in
/// linear memory).
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    if depth == u64::MAX {
        return 0;
    }
    recurse(depth + 1).wrapping_mul(3).wrapping_add(depth)
}

struct Misbehave;

impl Guest for Misbehave {
    fn check_config(config: String) -> Result<(), String> {
        let c = parse(&config)?;
        if c.mode == "sleep-check" {
            std::thread::sleep(std::time::Duration::from_secs(30));
        }
        Ok(())
    }

    fn handle(ev: ChangeEvent) -> Result<Vec<Action>, String> {
        let started = std::time::Instant::now();
        let config = parse(&host::config())?;
        let hold = config.hold_ms.map(std::time::Duration::from_millis);
        let result = decide(ev, config);
        if let Some(hold) = hold {
            std::thread::sleep(hold.saturating_sub(started.elapsed()));
        }
        result
    }
}

fn http_call(body: Option<Vec<u8>>) -> Action {
    Action::Http(HttpCall {
        method: HttpMethod::Post,
        url: "http://127.0.0.1:8080/".into(),
        headers: vec![],
        body,
    })
}

fn decide(ev: ChangeEvent, config: Config) -> Result<Vec<Action>, String> {
    match config.mode.as_str() {
        "noop" => Ok(vec![]),
        "ok" => Ok(vec![event("Seen", format!("{}/{}", ev.namespace, ev.name))]),
        "loop" => {
            let mut n: u64 = 0;
            loop {
                n = black_box(n.wrapping_add(1));
            }
        }
        "bomb" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(black_box(vec![1u8; 1 << 20]));
            }
        }
        "trap" => panic!("deliberate panic in misbehave plugin"),
        "recurse" => Ok(vec![event("Deep", recurse(black_box(0)).to_string())]),
        "huge" => Ok((0..100_000)
            .map(|i| event("Flood", format!("action number {i}")))
            .collect()),
        "forbidden" => Ok(vec![
            Action::Http(HttpCall {
                method: HttpMethod::Post,
                url: "http://169.254.169.254/latest/meta-data".into(),
                headers: vec![],
                body: None,
            }),
            Action::Restart(RestartWorkload {
                workload: WorkloadRef {
                    kind: WorkloadKind::Deployment,
                    namespace: "kube-system".into(),
                    name: "coredns".into(),
                },
                reason: "because".into(),
                content_hash: ev.digest.clone(),
            }),
        ]),
        "error" => Err("deliberate error from misbehave plugin".into()),
        "spy" => {
            let data: Vec<String> = ev
                .data
                .iter()
                .map(|e| match &e.value {
                    None => format!("{}=<withheld>", e.key),
                    Some(DataValue::Text(t)) => format!("{}={t}", e.key),
                    Some(DataValue::Binary(b)) => format!("{}=<{} bytes>", e.key, b.len()),
                })
                .collect();
            let kind = match ev.kind {
                ObjectKind::ConfigMap => "ConfigMap",
                ObjectKind::Secret => "Secret",
            };
            let workloads = host::workloads_referencing(ev.kind, &ev.namespace, &ev.name);
            let service = host::service(&ev.namespace, &ev.name);
            host::log(LogLevel::Info, &format!("spy saw {kind} {}", ev.name));
            Ok(vec![
                event("SawData", data.join(",")),
                event("SawValuesIncluded", ev.values_included.to_string()),
                event("SawChangedKeys", ev.changed_keys.join(",")),
                event(
                    "SawWorkloads",
                    workloads
                        .iter()
                        .map(|w| w.workload.name.clone())
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                event(
                    "SawEndpoints",
                    service
                        .map(|s| {
                            host::ready_endpoints(&s.namespace, &s.name)
                                .into_iter()
                                .map(|e| e.address)
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default(),
                ),
            ])
        }
        "echo-url" => Ok(vec![Action::Http(HttpCall {
            method: HttpMethod::Post,
            url: config.url.unwrap_or_default(),
            headers: vec![],
            body: None,
        })]),
        "ledger" => {
            let change = match ev.change {
                ChangeType::Added => "added",
                ChangeType::Modified => "modified",
                ChangeType::Deleted => "deleted",
                ChangeType::Resynced => "resynced",
            };
            let line = format!(
                "{}/{} {} {change} {} {}",
                ev.namespace, ev.name, ev.digest, ev.resource_version, ev.replay
            );
            Ok(vec![Action::Http(HttpCall {
                method: HttpMethod::Post,
                url: config.url.unwrap_or_default(),
                headers: vec![],
                body: Some(line.into_bytes()),
            })])
        }
        "remember" => {
            // Statics live in linear memory, which a fresh sandbox starts
            // from the module's image: anything an earlier call left
            // there shows up here.
            static CALLS: AtomicU32 = AtomicU32::new(0);
            static PAGES: [AtomicU32; 16 * 1024] = [const { AtomicU32::new(0) }; 16 * 1024];
            let calls = CALLS.fetch_add(1, Ordering::Relaxed) + 1;
            let marked = PAGES
                .iter()
                .filter(|p| p.load(Ordering::Relaxed) != 0)
                .count();
            for p in PAGES.iter().step_by(1024) {
                p.store(calls, Ordering::Relaxed);
            }
            Ok(vec![event(
                "Remembered",
                format!("calls={calls} marked={marked}"),
            )])
        }
        "sleep" | "sleep-check" => {
            std::thread::sleep(std::time::Duration::from_secs(30));
            Ok(vec![event("Slept", "30s".into())])
        }
        "random" => {
            let bytes = wasip2::random::random::get_random_bytes(64 << 20);
            Ok(vec![event("Random", bytes.len().to_string())])
        }
        "lookups" => {
            let mut seen = 0usize;
            loop {
                seen = black_box(seen + host::services_with_labels(&ev.namespace, &[]).len());
            }
        }
        "headers" => Ok(vec![Action::Http(HttpCall {
            method: HttpMethod::Post,
            url: config.url.unwrap_or_default(),
            headers: (0..1_000_000)
                .map(|_| Header {
                    name: String::new(),
                    value: String::new(),
                })
                .collect(),
            body: None,
        })]),
        "host-header" => Ok(vec![Action::Http(HttpCall {
            method: HttpMethod::Post,
            url: config.url.unwrap_or_default(),
            headers: vec![
                Header {
                    name: "Host".into(),
                    value: "admin.internal".into(),
                },
                Header {
                    name: "host".into(),
                    value: "other.internal".into(),
                },
            ],
            body: None,
        })]),
        "big-error" => Err("E".repeat(100 << 20)),
        "log-flood" => loop {
            host::log(
                LogLevel::Error,
                &format!(
                    "{}\nERROR wasmwatch: leader lost, shutting down\n",
                    "x".repeat(4096)
                ),
            );
        },
        "shared-headers" => {
            // 16 MB of zeros: 1,000,000 empty strings pairs.
            let shared = Box::leak(vec![[0u32; 4]; 1_000_000].into_boxed_slice());
            exports::alias(
                exports::Alias::Headers,
                shared.as_ptr().cast(),
                shared.len(),
            );
            Ok((0..20).map(|_| http_call(None)).collect())
        }
        "aliased-bodies" => {
            let shared = Box::leak(vec![b'x'; 16 << 20].into_boxed_slice());
            exports::alias(exports::Alias::Bodies, shared.as_ptr(), shared.len());
            Ok((0..100).map(|_| http_call(Some(vec![]))).collect())
        }
        "big-bodies" => Ok((0..7)
            .map(|i| http_call(Some(vec![b'a' + i; 16 << 20])))
            .collect()),
        "many-actions" => Ok((0..500_000)
            .map(|_| {
                Action::Event(EmitEvent {
                    event_type: EventType::Normal,
                    reason: String::new(),
                    message: String::new(),
                })
            })
            .collect()),
        other => Err(format!("unreachable mode {other}")),
    }
}

/// The component's exports: what `export!(Misbehave)` would write, plus a
/// step after lowering `handle`'s result that points lists at one shared
/// list (which the Rust types cannot say), and no freeing of such a result
/// (it would free the shared list many times; the sandbox is thrown away
/// after the call anyway).
mod exports {
    use std::cell::Cell;

    use super::Misbehave;

    #[derive(Clone, Copy)]
    pub enum Alias {
        /// Every HTTP action's headers are the list at `ptr`.
        Headers,
        /// Every HTTP action's body is the bytes at `ptr`.
        Bodies,
    }

    struct Wanted {
        alias: Alias,
        ptr: *const u8,
        len: usize,
    }

    struct OneThread<T>(T);
    // SAFETY: wasm32-wasip2 components run on one thread.
    unsafe impl<T> Sync for OneThread<T> {}

    static WANTED: OneThread<Cell<Option<Wanted>>> = OneThread(Cell::new(None));
    static ALIASED: OneThread<Cell<bool>> = OneThread(Cell::new(false));

    /// Asks for the result of this `handle` call to be aliased.
    pub fn alias(alias: Alias, ptr: *const u8, len: usize) {
        WANTED.0.set(Some(Wanted { alias, ptr, len }));
    }

    // Canonical ABI layout (wasm32) of `result<list<action>, string>`: the
    // discriminant at 0, the list's pointer at 4 and length at 8. An
    // `action` is 44 bytes, its payload at 4; in `http-call` the headers
    // list is at 12 and the `option<list<u8>>` body at 20 (flag, then
    // pointer at 24 and length at 28).
    const ACTION_SIZE: usize = 44;
    const HTTP_HEADERS: usize = 4 + 12;
    const HTTP_BODY: usize = 4 + 20;

    unsafe fn patch(ret: *mut u8, wanted: &Wanted) {
        unsafe {
            if *ret != 0 {
                return;
            }
            let list = *(ret.add(4) as *const u32) as usize as *mut u8;
            let len = *(ret.add(8) as *const u32) as usize;
            for i in 0..len {
                let action = list.add(i * ACTION_SIZE);
                if *action != 0 {
                    continue; // not `http`
                }
                let (at, flag) = match wanted.alias {
                    Alias::Headers => (HTTP_HEADERS, None),
                    Alias::Bodies => (HTTP_BODY + 4, Some(HTTP_BODY)),
                };
                if let Some(flag) = flag {
                    *action.add(flag) = 1;
                }
                *(action.add(at) as *mut u32) = wanted.ptr as usize as u32;
                *(action.add(at + 4) as *mut u32) = wanted.len as u32;
            }
        }
    }

    #[unsafe(export_name = "check-config")]
    unsafe extern "C" fn export_check_config(arg0: *mut u8, arg1: usize) -> *mut u8 {
        unsafe { super::_export_check_config_cabi::<Misbehave>(arg0, arg1) }
    }

    #[unsafe(export_name = "cabi_post_check-config")]
    unsafe extern "C" fn post_return_check_config(arg0: *mut u8) {
        unsafe { super::__post_return_check_config::<Misbehave>(arg0) }
    }

    #[unsafe(export_name = "handle")]
    unsafe extern "C" fn export_handle(arg0: *mut u8) -> *mut u8 {
        unsafe {
            let ret = super::_export_handle_cabi::<Misbehave>(arg0);
            if let Some(wanted) = WANTED.0.take() {
                patch(ret, &wanted);
                ALIASED.0.set(true);
            }
            ret
        }
    }

    #[unsafe(export_name = "cabi_post_handle")]
    unsafe extern "C" fn post_return_handle(arg0: *mut u8) {
        if !ALIASED.0.replace(false) {
            unsafe { super::__post_return_handle::<Misbehave>(arg0) }
        }
    }
}
