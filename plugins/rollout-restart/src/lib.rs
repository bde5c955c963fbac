//! rollout-restart: Reloader-compatible rolling restarts.
//!
//! For a changed ConfigMap or Secret it asks the host for the Deployments,
//! StatefulSets and DaemonSets whose pod templates reference the object
//! (`workloads-referencing`) and returns a `restart` action for each one whose
//! annotations ask for it, with the rules of Stakater Reloader:
//!
//! 1. `reloader.stakater.com/ignore: "true"` on the changed object: nothing
//!    restarts.
//! 2. The workload's own annotations are read when they hold any of the
//!    annotations below (for the changed object's kind), else the pod
//!    template's when those do, as Reloader does.
//! 3. An object named in the exclude list (`configmaps.exclude.reloader.stakater.com/reload`
//!    / `secrets.exclude.reloader.stakater.com/reload`, exact names) never
//!    restarts the workload.
//! 4. Named: `configmap.reloader.stakater.com/reload: "a,b"` /
//!    `secret.reloader.stakater.com/reload`. Each entry is a regular
//!    expression matched against the whole name (`^(?:entry)$`); an invalid
//!    one is compared literally.
//! 5. Search: `reloader.stakater.com/search: "true"` on the workload and
//!    `reloader.stakater.com/match: "true"` on the changed object.
//! 6. Auto: `reloader.stakater.com/auto: "true"` (ConfigMaps and Secrets), or
//!    `configmap.reloader.stakater.com/auto: "true"` /
//!    `secret.reloader.stakater.com/auto: "true"` (that kind only).
//! 7. With config `autoReloadAll: true`, every referencing workload restarts
//!    unless it says `auto: "false"` (or the kind's `auto: "false"`).
//!
//! The same annotations under `wasmwatch.io/` (these win when both are set):
//!
//! | wasmwatch.io/        | Reloader                                          |
//! |----------------------|---------------------------------------------------|
//! | `ignore`             | `reloader.stakater.com/ignore` (on the object)     |
//! | `match`              | `reloader.stakater.com/match` (on the object)      |
//! | `search`             | `reloader.stakater.com/search`                     |
//! | `auto`               | `reloader.stakater.com/auto`                       |
//! | `auto-configmaps`    | `configmap.reloader.stakater.com/auto`             |
//! | `auto-secrets`       | `secret.reloader.stakater.com/auto`                |
//! | `reload-configmaps`  | `configmap.reloader.stakater.com/reload`           |
//! | `reload-secrets`     | `secret.reloader.stakater.com/reload`              |
//! | `exclude-configmaps` | `configmaps.exclude.reloader.stakater.com/reload`  |
//! | `exclude-secrets`    | `secrets.exclude.reloader.stakater.com/reload`     |
//!
//! Limitation: `workloads-referencing` returns only workloads whose pod
//! templates reference the object, so a named reload annotation restarts a
//! workload only if it also references the object (Reloader likewise updates
//! only containers that use it). Kinds other than Deployment, StatefulSet and
//! DaemonSet (CronJob, Argo Rollout) are not covered.
//!
//! Each action carries `reason` (`ConfigMap shop/orders changed`, `created`,
//! `deleted`) and `content-hash` = `configmap/<name>:<digest>` (`secret/...`;
//! `...:deleted` for a deletion), so the host restarts a workload once per
//! content of the object.
//!
//! Config (JSON), all optional, defaults as Reloader's flags:
//! `{"reloadOnCreate": false, "reloadOnDelete": false, "autoReloadAll": false}`.
//! Modifications and resyncs always count.

use regex_lite::Regex;
use wasmwatch_plugin_sdk::{
    Action, ChangeEvent, ChangeType, EventExt, Guest, KeyValue, LogLevel, ObjectKind, WorkloadInfo,
    WorkloadKind, action, host, log, lookup, parse_config,
};

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Config {
    #[serde(default)]
    reload_on_create: bool,
    #[serde(default)]
    reload_on_delete: bool,
    #[serde(default)]
    auto_reload_all: bool,
}

#[derive(Clone, Copy)]
enum Ann {
    Ignore,
    Match,
    Search,
    Auto,
    TypedAuto,
    Reload,
    Exclude,
}

/// The annotation's names: ours first, then Reloader's.
fn names(ann: Ann, kind: ObjectKind) -> [&'static str; 2] {
    let cm = matches!(kind, ObjectKind::ConfigMap);
    match ann {
        Ann::Ignore => ["wasmwatch.io/ignore", "reloader.stakater.com/ignore"],
        Ann::Match => ["wasmwatch.io/match", "reloader.stakater.com/match"],
        Ann::Search => ["wasmwatch.io/search", "reloader.stakater.com/search"],
        Ann::Auto => ["wasmwatch.io/auto", "reloader.stakater.com/auto"],
        Ann::TypedAuto if cm => [
            "wasmwatch.io/auto-configmaps",
            "configmap.reloader.stakater.com/auto",
        ],
        Ann::TypedAuto => [
            "wasmwatch.io/auto-secrets",
            "secret.reloader.stakater.com/auto",
        ],
        Ann::Reload if cm => [
            "wasmwatch.io/reload-configmaps",
            "configmap.reloader.stakater.com/reload",
        ],
        Ann::Reload => [
            "wasmwatch.io/reload-secrets",
            "secret.reloader.stakater.com/reload",
        ],
        Ann::Exclude if cm => [
            "wasmwatch.io/exclude-configmaps",
            "configmaps.exclude.reloader.stakater.com/reload",
        ],
        Ann::Exclude => [
            "wasmwatch.io/exclude-secrets",
            "secrets.exclude.reloader.stakater.com/reload",
        ],
    }
}

fn get(list: &[KeyValue], ann: Ann, kind: ObjectKind) -> Option<&str> {
    names(ann, kind).iter().find_map(|k| lookup(list, k))
}

fn is_true(list: &[KeyValue], ann: Ann, kind: ObjectKind) -> bool {
    get(list, ann, kind) == Some("true")
}

/// Whether `list` holds any annotation that decides about `kind`.
fn relevant(list: &[KeyValue], kind: ObjectKind) -> bool {
    [Ann::Reload, Ann::Search, Ann::Auto, Ann::TypedAuto]
        .into_iter()
        .any(|a| get(list, a, kind).is_some())
}

/// `name` matches one comma-separated entry, each a whole-name regex.
fn named(list: &str, name: &str) -> bool {
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|entry| match Regex::new(&format!("^(?:{entry})$")) {
            Ok(re) => re.is_match(name),
            Err(_) => entry == name,
        })
}

/// Why `workload` restarts for `event`, or `None`.
fn decide(config: &Config, event: &ChangeEvent, workload: &WorkloadInfo) -> Option<&'static str> {
    let kind = event.kind;
    let ann: &[KeyValue] = if relevant(&workload.annotations, kind) {
        &workload.annotations
    } else if relevant(&workload.template_annotations, kind) {
        &workload.template_annotations
    } else {
        &workload.annotations
    };
    let excluded =
        get(ann, Ann::Exclude, kind).is_some_and(|l| l.split(',').any(|e| e.trim() == event.name));
    if excluded {
        return None;
    }
    if get(ann, Ann::Reload, kind).is_some_and(|l| named(l, &event.name)) {
        return Some("named");
    }
    if is_true(ann, Ann::Search, kind) && is_true(&event.annotations, Ann::Match, kind) {
        return Some("search/match");
    }
    if is_true(ann, Ann::Auto, kind) || is_true(ann, Ann::TypedAuto, kind) {
        return Some("auto");
    }
    let opted_out = get(ann, Ann::Auto, kind) == Some("false")
        || get(ann, Ann::TypedAuto, kind) == Some("false");
    if config.auto_reload_all && !opted_out {
        return Some("autoReloadAll");
    }
    None
}

fn workload_kind(kind: WorkloadKind) -> &'static str {
    match kind {
        WorkloadKind::Deployment => "Deployment",
        WorkloadKind::StatefulSet => "StatefulSet",
        WorkloadKind::DaemonSet => "DaemonSet",
    }
}

// It restarts workloads in the namespace of each event it gets.
wasmwatch_plugin_sdk::declare_needs!(r#"{"restart": ["{namespace}"]}"#);

struct RolloutRestart;

impl Guest for RolloutRestart {
    fn check_config(json: String) -> Result<(), String> {
        parse_config::<Config>("rollout-restart", &json).map(|_| ())
    }

    fn handle(event: ChangeEvent) -> Result<Vec<Action>, String> {
        let config: Config = parse_config("rollout-restart", &host::config())?;
        let what = match event.change {
            ChangeType::Added if !config.reload_on_create => return Ok(vec![]),
            ChangeType::Deleted if !config.reload_on_delete => return Ok(vec![]),
            ChangeType::Added => "created",
            ChangeType::Deleted => "deleted",
            ChangeType::Modified | ChangeType::Resynced => "changed",
        };
        if is_true(&event.annotations, Ann::Ignore, event.kind) {
            log(
                LogLevel::Debug,
                &format!("{} {} is ignored", event.kind_name(), event.object_id()),
            );
            return Ok(vec![]);
        }
        let reason = format!("{} {} {what}", event.kind_name(), event.object_id());
        let version = match event.change {
            ChangeType::Deleted => "deleted",
            _ => event.digest.as_str(),
        };
        let hash = format!(
            "{}/{}:{version}",
            event.kind_name().to_ascii_lowercase(),
            event.name
        );
        let workloads = host::workloads_referencing(event.kind, &event.namespace, &event.name);
        Ok(workloads
            .into_iter()
            .filter(|w| match decide(&config, &event, w) {
                Some(why) => {
                    log(
                        LogLevel::Debug,
                        &format!(
                            "restarting {} {}/{} ({why})",
                            workload_kind(w.workload.kind),
                            w.workload.namespace,
                            w.workload.name
                        ),
                    );
                    true
                }
                None => false,
            })
            .map(|w| action::restart(w.workload, reason.clone(), hash.clone()))
            .collect())
    }
}

wasmwatch_plugin_sdk::export!(RolloutRestart with_types_in wasmwatch_plugin_sdk);
