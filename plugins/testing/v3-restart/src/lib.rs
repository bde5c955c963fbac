//! Test plugin of WIT 0.3.0 (wit/0.3.0/plugin.wit, world
//! `wasmwatch:plugin/plugin@0.3.0`). For every change it asks
//! `workloads-referencing` and restarts each workload found, as the lookup
//! named it (group, version, kind), with the reason
//! `<Kind> <namespace>/<name> changed (referenced: <bool>, uses: <uses>)`,
//! `<uses>` each use as `env:<key>`, `env-from` or `volume[:<key>]`
//! (without a key: the whole object), comma-separated, so that a test sees
//! what the lookup answered, and the content hash `<kind>/<name>:<digest>`
//! (`:deleted` for a deletion, as rollout-restart). Being 0.3.0, it is also
//! the restarting plugin of host/wasmwatch/tests/upgrade.rs, whose previous
//! version knows no 0.4.0. Config (JSON, all optional):
//!
//! - `{"kind": {"group": "batch", "version": "v1", "kind": "CronJob"},
//!   "name": "nightly"}`: restart that workload (in the event's namespace)
//!   instead, without a lookup;
//! - `"strategy"`: `annotations`, `env-vars` or `restart-at`, set on every
//!   restart (default: none).
wit_bindgen::generate!({ path: "../../../wit/0.3.0", world: "plugin" });

use serde_json::Value;
use wasmwatch::plugin::host;
use wasmwatch::plugin::types::{
    ChangeType, ObjectKind, ObjectUse, RestartStrategy, RestartWorkload, UseVia, WorkloadRef,
};

struct P;

/// The restart the config names, if it names one.
struct Fixed {
    group: String,
    version: String,
    kind: String,
    name: String,
}

struct Config {
    fixed: Option<Fixed>,
    strategy: Option<RestartStrategy>,
}

fn parse(json: &str) -> Result<Config, String> {
    let config: Value = match json.trim() {
        "" | "null" => Value::Object(Default::default()),
        text => serde_json::from_str(text).map_err(|e| format!("v3-restart config: {e}"))?,
    };
    let text = |v: &Value, key: &str| -> Result<String, String> {
        v.get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("v3-restart config: `{key}` must be a string"))
    };
    let fixed = match config.get("kind") {
        None => None,
        Some(kind) => Some(Fixed {
            group: text(kind, "group")?,
            version: text(kind, "version")?,
            kind: text(kind, "kind")?,
            name: text(&config, "name")?,
        }),
    };
    let strategy = match config.get("strategy").map(Value::as_str) {
        None => None,
        Some(Some("annotations")) => Some(RestartStrategy::Annotations),
        Some(Some("env-vars")) => Some(RestartStrategy::EnvVars),
        Some(Some("restart-at")) => Some(RestartStrategy::RestartAt),
        Some(other) => {
            return Err(format!("v3-restart config: unknown strategy {other:?}"));
        }
    };
    Ok(Config { fixed, strategy })
}

/// `env:key`, `env-from`, `volume` or `volume:key`.
fn use_text(u: &ObjectUse) -> String {
    let via = match u.via {
        UseVia::Env => "env",
        UseVia::EnvFrom => "env-from",
        UseVia::Volume => "volume",
    };
    match &u.key {
        Some(key) => format!("{via}:{key}"),
        None => via.to_string(),
    }
}

impl Guest for P {
    fn check_config(config: String) -> Result<(), String> {
        parse(&config).map(drop)
    }

    fn handle(event: ChangeEvent) -> Result<Vec<Action>, String> {
        let config = parse(&host::config())?;
        let kind = match event.kind {
            ObjectKind::ConfigMap => "ConfigMap",
            ObjectKind::Secret => "Secret",
        };
        let object = format!("{kind} {}/{}", event.namespace, event.name);
        // As rollout-restart: a deletion is a content of its own.
        let version = match event.change {
            ChangeType::Deleted => "deleted",
            _ => event.digest.as_str(),
        };
        let content_hash = format!("{}/{}:{version}", kind.to_lowercase(), event.name);
        let restart = |workload: WorkloadRef, reason: String| {
            Action::Restart(RestartWorkload {
                workload,
                reason,
                content_hash: content_hash.clone(),
                strategy: config.strategy,
            })
        };
        if let Some(f) = &config.fixed {
            let workload = WorkloadRef {
                group: f.group.clone(),
                version: f.version.clone(),
                kind: f.kind.clone(),
                namespace: event.namespace.clone(),
                name: f.name.clone(),
            };
            return Ok(vec![restart(workload, format!("{object} changed"))]);
        }
        Ok(
            host::workloads_referencing(event.kind, &event.namespace, &event.name)
                .into_iter()
                .map(|w| {
                    let uses: Vec<String> = w.uses.iter().map(use_text).collect();
                    let reason = format!(
                        "{object} changed (referenced: {}, uses: {})",
                        w.referenced,
                        uses.join(",")
                    );
                    restart(w.workload, reason)
                })
                .collect(),
        )
    }
}

export!(P);
