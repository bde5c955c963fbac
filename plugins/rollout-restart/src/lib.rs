//! rollout-restart: Reloader-compatible rolling restarts (WIT 0.3.0).
//!
//! For a changed ConfigMap or Secret it asks the host for the workloads whose
//! pod templates reference the object, and those a named `reload`
//! annotation selects without a reference (`workloads-referencing`: every
//! kind the host watches, Deployments, StatefulSets, DaemonSets, CronJobs,
//! Jobs and Argo Rollouts), and returns a `restart` action for each one
//! whose annotations ask for it, with the rules of Stakater Reloader:
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
//!    one is compared literally. As in Reloader, this restarts the workload
//!    also when its pod template does not reference the object (the host
//!    returns it with `referenced: false`; it finds it by Reloader's and our
//!    annotation names, not by names renamed through `annotations`).
//! 5. Search: `reloader.stakater.com/search: "true"` on the workload and
//!    `reloader.stakater.com/match: "true"` on the changed object (only
//!    workloads that reference the object).
//! 6. Auto: `reloader.stakater.com/auto: "true"` (ConfigMaps and Secrets), or
//!    `configmap.reloader.stakater.com/auto: "true"` /
//!    `secret.reloader.stakater.com/auto: "true"` (that kind only; only
//!    workloads that reference the object).
//! 7. With config `autoReloadAll: true`, every referencing workload restarts
//!    unless it says `auto: "false"` (or the kind's `auto: "false"`).
//! 8. With config `keyAware: true`, a workload whose pod template uses the
//!    object only through specific keys (env `configMapKeyRef` /
//!    `secretKeyRef`, volume `items`) restarts only when one of those keys
//!    is in the event's `changed-keys`; a use of the whole object (`envFrom`,
//!    a volume without `items`) always counts.
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
//! How each kind restarts is the host's (exec::workload): a CronJob records
//! the content on its job template and starts no Job, a Job is re-created
//! only when annotated `wasmwatch.io/recreate-job: "true"`, an Argo Rollout
//! annotated `reloader.stakater.com/rollout-strategy: restart` gets
//! `spec.restartAt`. Kinds other than the apps/v1 ones must be granted
//! (`capabilities.restart.kinds`).
//!
//! Each action carries `reason` (`ConfigMap shop/orders changed`, `created`,
//! `deleted`) and `content-hash` = `configmap/<name>:<digest>` (`secret/...`;
//! `...:deleted` for a deletion), so the host restarts a workload once per
//! content of the object.
//!
//! Config (JSON), all optional, defaults as Reloader's flags:
//! `{"reloadOnCreate": false, "reloadOnDelete": false, "autoReloadAll": false,
//! "keyAware": false, "ignoredWorkloadTypes": []}`. Modifications and
//! resyncs always count. `ignoredWorkloadTypes` is Reloader's
//! `--ignored-workload-types` (`jobs`, `cronjobs`): those kinds never
//! restart, named or not.
//!
//! `annotations` renames Reloader's annotations as its flags do
//! (`--auto-annotation`, `--configmap-auto-annotation`,
//! `--secret-auto-annotation`, `--configmap-annotation`,
//! `--secret-annotation`, `--auto-search-annotation`,
//! `--search-match-annotation`, `--ignore-annotation`):
//! `{"auto", "configmapAuto", "secretAuto", "configmapReload",
//! "secretReload", "search", "match", "ignore"}`, each a key read instead
//! of Reloader's; the `wasmwatch.io/` names stay read. A key must be a valid
//! annotation key and mean one thing only.
//!
//! `mode` picks what happens to the workloads the rules select:
//!
//! - `restart` (default): a `restart` action for each.
//! - `webhook` (Reloader's `--webhook-url`): nothing restarts; one `http`
//!   POST per change to `webhook.url` (only when a workload would have
//!   restarted, or for every change with `webhook.always`), its body per
//!   `webhook.format`: `json` (default) describes the change and the
//!   workloads, `reloader` is Reloader's constant
//!   `{"webhook":"update successful"}`. `ignore` is honoured (Reloader's
//!   webhook mode does not).
//! - `alert` (Reloader's `ALERT_ON_RELOAD`): the restarts, and one `http`
//!   POST per restarted workload to `alert.url`, in `alert.sink`'s format
//!   (`slack`, `teams`, `teams-workflow`, `gchat`, `raw`), with Reloader's
//!   message, prefixed by `alert.additionalInfo`. The plugin decides before
//!   the host restarts, so an alert says a restart was decided, not done.

use regex_lite::Regex;
use wasmwatch_plugin_sdk::{
    Action, ChangeEvent, ChangeType, EventExt, Guest, HttpMethod, KeyValue, LogLevel, ObjectKind,
    ObjectType, WorkloadExt, WorkloadInfo, WorkloadRef, action, host, log, lookup, parse_config,
};

const PLUGIN: &str = "rollout-restart";

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Config {
    #[serde(default)]
    reload_on_create: bool,
    #[serde(default)]
    reload_on_delete: bool,
    #[serde(default)]
    auto_reload_all: bool,
    /// Restart a workload that uses only some keys of the object only when
    /// one of them changed.
    #[serde(default)]
    key_aware: bool,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    webhook: Option<WebhookConfig>,
    #[serde(default)]
    alert: Option<AlertConfig>,
    #[serde(default)]
    annotations: Option<AnnotationNames>,
    /// Reloader's `--ignored-workload-types`: `jobs`, `cronjobs` (any
    /// case); workloads of those kinds never restart.
    #[serde(default)]
    ignored_workload_types: Vec<String>,
}

/// The `ignoredWorkloadTypes` values Reloader accepts, with the kind each
/// names (batch/v1).
const WORKLOAD_TYPES: [(&str, &str); 2] = [("jobs", "Job"), ("cronjobs", "CronJob")];

/// The batch/v1 kinds `ignoredWorkloadTypes` names, checked.
fn ignored_kinds(types: &[String]) -> Result<Vec<&'static str>, String> {
    types
        .iter()
        .map(|t| {
            WORKLOAD_TYPES
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(t.trim()))
                .map(|(_, kind)| *kind)
                .ok_or_else(|| {
                    format!(
                        "ignoredWorkloadTypes: {t:?} is not a workload type Reloader ignores (jobs, cronjobs)"
                    )
                })
        })
        .collect()
}

/// Reloader's custom annotation flags: each replaces Reloader's key.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AnnotationNames {
    #[serde(default)]
    auto: Option<String>,
    #[serde(default)]
    configmap_auto: Option<String>,
    #[serde(default)]
    secret_auto: Option<String>,
    #[serde(default)]
    configmap_reload: Option<String>,
    #[serde(default)]
    secret_reload: Option<String>,
    #[serde(default)]
    search: Option<String>,
    #[serde(default, rename = "match")]
    match_: Option<String>,
    #[serde(default)]
    ignore: Option<String>,
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WebhookConfig {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    always: bool,
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AlertConfig {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    sink: Option<String>,
    #[serde(default)]
    additional_info: Option<String>,
}

/// What happens to the selected workloads.
#[derive(Debug, PartialEq)]
enum Mode {
    Restart,
    Webhook {
        url: String,
        format: Format,
        always: bool,
    },
    Alert {
        url: String,
        sink: Sink,
        additional_info: Option<String>,
    },
}

/// The body of a webhook-mode notification.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    Json,
    Reloader,
}

/// Where an alert goes, and so its body.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sink {
    Slack,
    Teams,
    TeamsWorkflow,
    GChat,
    Raw,
}

/// The config, checked.
struct Settings {
    config: Config,
    mode: Mode,
    names: Names,
    /// batch/v1 kinds never restarted (`ignoredWorkloadTypes`).
    ignored: Vec<&'static str>,
}

/// The annotation keys read in Reloader's place: its defaults, or those of
/// `annotations`.
#[derive(Debug, Clone, PartialEq)]
struct Names {
    auto: String,
    configmap_auto: String,
    secret_auto: String,
    configmap_reload: String,
    secret_reload: String,
    search: String,
    match_: String,
    ignore: String,
}

/// `key` is a Kubernetes annotation key: `[prefix/]name`, the name at most
/// 63 of `[A-Za-z0-9-_.]` starting and ending alphanumeric, the prefix a
/// lower-case DNS subdomain of at most 253 characters.
fn annotation_key_ok(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let label = |l: &str| {
        !l.is_empty()
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    name_ok && prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(label))
}

/// The keys of `annotations` checked, with Reloader's defaults for the
/// others.
fn names(given: Option<&AnnotationNames>) -> Result<Names, String> {
    let none = AnnotationNames::default();
    let a = given.unwrap_or(&none);
    // (field, family, custom value, Reloader's default)
    let fields = [
        ("auto", "auto", &a.auto, "reloader.stakater.com/auto"),
        (
            "configmapAuto",
            "auto",
            &a.configmap_auto,
            "configmap.reloader.stakater.com/auto",
        ),
        (
            "secretAuto",
            "auto",
            &a.secret_auto,
            "secret.reloader.stakater.com/auto",
        ),
        (
            "configmapReload",
            "reload",
            &a.configmap_reload,
            "configmap.reloader.stakater.com/reload",
        ),
        (
            "secretReload",
            "reload",
            &a.secret_reload,
            "secret.reloader.stakater.com/reload",
        ),
        (
            "search",
            "search",
            &a.search,
            "reloader.stakater.com/search",
        ),
        ("match", "match", &a.match_, "reloader.stakater.com/match"),
        (
            "ignore",
            "ignore",
            &a.ignore,
            "reloader.stakater.com/ignore",
        ),
    ];
    for (field, _, value, _) in &fields {
        if let Some(v) = value
            && !annotation_key_ok(v)
        {
            return Err(format!(
                "annotations.{field}: {v:?} is not a valid annotation key ([prefix/]name: a name of at most 63 letters, digits, '-', '_' or '.' that starts and ends with a letter or digit, after an optional lower-case DNS subdomain and '/')"
            ));
        }
    }
    let effective: Vec<(&str, &str, &str)> = fields
        .iter()
        .map(|(field, family, value, default)| {
            (*field, *family, value.as_deref().unwrap_or(default))
        })
        .collect();
    // Every key read, with what it means: one key, one meaning.
    let mut keys: Vec<(&str, &str)> = effective
        .iter()
        .map(|(_, family, key)| (*family, *key))
        .collect();
    keys.extend([
        ("auto", "wasmwatch.io/auto"),
        ("auto", "wasmwatch.io/auto-configmaps"),
        ("auto", "wasmwatch.io/auto-secrets"),
        ("reload", "wasmwatch.io/reload-configmaps"),
        ("reload", "wasmwatch.io/reload-secrets"),
        ("exclude", "wasmwatch.io/exclude-configmaps"),
        ("exclude", "wasmwatch.io/exclude-secrets"),
        ("exclude", "configmaps.exclude.reloader.stakater.com/reload"),
        ("exclude", "secrets.exclude.reloader.stakater.com/reload"),
        ("auto", "wasmwatch.io/auto-secretproviderclasses"),
        ("auto", "secretproviderclass.reloader.stakater.com/auto"),
        ("reload", "wasmwatch.io/reload-secretproviderclasses"),
        ("reload", "secretproviderclass.reloader.stakater.com/reload"),
        ("exclude", "wasmwatch.io/exclude-secretproviderclasses"),
        (
            "exclude",
            "secretproviderclasses.exclude.reloader.stakater.com/reload",
        ),
        ("search", "wasmwatch.io/search"),
        ("match", "wasmwatch.io/match"),
        ("ignore", "wasmwatch.io/ignore"),
    ]);
    for ((field, family, value, _), (_, _, key)) in fields.iter().zip(&effective) {
        if value.is_none() {
            continue;
        }
        if let Some((other, _)) = keys.iter().find(|(f, k)| k == key && f != family) {
            return Err(format!(
                "annotations.{field}: {key:?} is already the name of the {other} annotation; each needs its own"
            ));
        }
    }
    let key = |i: usize| effective[i].2.to_string();
    Ok(Names {
        auto: key(0),
        configmap_auto: key(1),
        secret_auto: key(2),
        configmap_reload: key(3),
        secret_reload: key(4),
        search: key(5),
        match_: key(6),
        ignore: key(7),
    })
}

/// `value` is an absolute http or https URL without blanks; the error
/// names `field`.
fn check_url(field: &str, value: &str) -> Result<(), String> {
    let rest = value
        .strip_prefix("http://")
        .or_else(|| value.strip_prefix("https://"));
    let host = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or(""));
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{field}: {value:?} contains blanks or control characters"
        ));
    }
    match host {
        None => Err(format!(
            "{field}: {value:?} is not an http or https URL (it must start with http:// or https://)"
        )),
        Some(h) if h.rsplit('@').next().unwrap_or("").is_empty() => {
            Err(format!("{field}: {value:?} has no host"))
        }
        Some(_) => Ok(()),
    }
}

fn mode(config: &Config) -> Result<Mode, String> {
    let name = config.mode.as_deref().unwrap_or("restart");
    let mode = match name {
        "restart" => Mode::Restart,
        "webhook" => {
            let w = config.webhook.as_ref();
            let Some(url) = w.and_then(|w| w.url.clone()) else {
                return Err("webhook.url is required with mode: webhook".into());
            };
            check_url("webhook.url", &url)?;
            let format = match w.and_then(|w| w.format.as_deref()).unwrap_or("json") {
                "json" => Format::Json,
                "reloader" => Format::Reloader,
                other => {
                    return Err(format!(
                        "webhook.format: unknown format {other:?}, expected \"json\" or \"reloader\""
                    ));
                }
            };
            Mode::Webhook {
                url,
                format,
                always: w.is_some_and(|w| w.always),
            }
        }
        "alert" => {
            let a = config.alert.as_ref();
            let Some(url) = a.and_then(|a| a.url.clone()) else {
                return Err("alert.url is required with mode: alert".into());
            };
            check_url("alert.url", &url)?;
            let sink = match a.and_then(|a| a.sink.as_deref()).unwrap_or("raw") {
                "slack" => Sink::Slack,
                "teams" => Sink::Teams,
                "teams-workflow" => Sink::TeamsWorkflow,
                "gchat" => Sink::GChat,
                "raw" | "webhook" => Sink::Raw,
                other => {
                    return Err(format!(
                        "alert.sink: unknown sink {other:?}, expected \"slack\", \"teams\", \"teams-workflow\", \"gchat\" or \"raw\""
                    ));
                }
            };
            let additional_info = a
                .and_then(|a| a.additional_info.as_deref())
                .map(str::trim)
                .filter(|i| !i.is_empty())
                .map(str::to_string);
            Mode::Alert {
                url,
                sink,
                additional_info,
            }
        }
        other => {
            return Err(format!(
                "mode: unknown mode {other:?}, expected \"restart\", \"webhook\" or \"alert\""
            ));
        }
    };
    // A section the mode does not read is a mistake (a webhook URL set
    // without `mode: webhook` would restart instead): say so.
    for (section, set, wants) in [
        ("webhook", config.webhook.is_some(), "webhook"),
        ("alert", config.alert.is_some(), "alert"),
    ] {
        if set && name != wants {
            return Err(format!(
                "{section} is set but mode is {name:?}: set mode: {wants}, or remove {section}"
            ));
        }
    }
    Ok(mode)
}

fn settings(json: &str) -> Result<Settings, String> {
    let config: Config = parse_config(PLUGIN, json)?;
    let mode = mode(&config).map_err(|e| format!("{PLUGIN} config: {e}"))?;
    let names = names(config.annotations.as_ref()).map_err(|e| format!("{PLUGIN} config: {e}"))?;
    let ignored = ignored_kinds(&config.ignored_workload_types)
        .map_err(|e| format!("{PLUGIN} config: {e}"))?;
    Ok(Settings {
        config,
        mode,
        names,
        ignored,
    })
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

/// The kind of the object a change stands for, as the annotations name it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Of {
    ConfigMap,
    Secret,
    /// The CSI driver's SecretProviderClass, for a change of one of its
    /// SecretProviderClassPodStatuses (Reloader's CSI integration).
    SecretProviderClass,
}

const CSI_GROUP: &str = "secrets-store.csi.x-k8s.io";

impl Of {
    fn kind_name(self) -> &'static str {
        match self {
            Of::ConfigMap => "ConfigMap",
            Of::Secret => "Secret",
            Of::SecretProviderClass => "SecretProviderClass",
        }
    }

    /// Reloader's `type` of the object (alerts, `STAKATER_*_<TYPE>`).
    fn object_type(self) -> &'static str {
        match self {
            Of::ConfigMap => "CONFIGMAP",
            Of::Secret => "SECRET",
            Of::SecretProviderClass => "SECRETPROVIDERCLASS",
        }
    }

    /// The kind as the host's lookups name it.
    fn wit(self) -> ObjectKind {
        match self {
            Of::ConfigMap => ObjectKind::ConfigMap,
            Of::Secret => ObjectKind::Secret,
            Of::SecretProviderClass => ObjectKind::Other(ObjectType {
                group: CSI_GROUP.into(),
                version: "v1".into(),
                kind: "SecretProviderClass".into(),
            }),
        }
    }
}

/// What a change stands for: the changed object itself, or for a
/// SecretProviderClassPodStatus the SecretProviderClass it mounts, whose
/// annotations the plugin cannot read (Reloader reads `ignore` and `match`
/// there; here they are not honoured for CSI changes).
#[derive(Debug)]
struct Target<'a> {
    of: Of,
    name: &'a str,
    annotations: &'a [KeyValue],
}

/// The target of `event`, or why there is none (logged, nothing restarts).
fn target(event: &ChangeEvent) -> Result<Target<'_>, String> {
    let of = match &event.kind {
        ObjectKind::ConfigMap => Of::ConfigMap,
        ObjectKind::Secret => Of::Secret,
        ObjectKind::Other(_) if event.is_kind(CSI_GROUP, "SecretProviderClassPodStatus") => {
            let name = event
                .text("status.secretProviderClassName")
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    format!(
                        "SecretProviderClassPodStatus {} names no SecretProviderClass (status.secretProviderClassName; is it in the kind's content?)",
                        event.object_id()
                    )
                })?;
            return Ok(Target {
                of: Of::SecretProviderClass,
                name,
                annotations: &[],
            });
        }
        ObjectKind::Other(t) => {
            return Err(format!(
                "{}/{} {}: {PLUGIN} restarts for ConfigMaps, Secrets and SecretProviderClassPodStatuses only",
                t.group,
                t.kind,
                event.object_id()
            ));
        }
    };
    Ok(Target {
        of,
        name: &event.name,
        annotations: &event.annotations,
    })
}

impl Names {
    /// The annotation's names: ours first, then Reloader's (or the one
    /// `annotations` gives in its place).
    fn of(&self, ann: Ann, of: Of) -> [&str; 2] {
        let cm = of == Of::ConfigMap;
        let spc = of == Of::SecretProviderClass;
        match ann {
            Ann::Ignore => ["wasmwatch.io/ignore", &self.ignore],
            Ann::Match => ["wasmwatch.io/match", &self.match_],
            Ann::Search => ["wasmwatch.io/search", &self.search],
            Ann::Auto => ["wasmwatch.io/auto", &self.auto],
            Ann::TypedAuto if spc => [
                "wasmwatch.io/auto-secretproviderclasses",
                "secretproviderclass.reloader.stakater.com/auto",
            ],
            Ann::Reload if spc => [
                "wasmwatch.io/reload-secretproviderclasses",
                "secretproviderclass.reloader.stakater.com/reload",
            ],
            Ann::Exclude if spc => [
                "wasmwatch.io/exclude-secretproviderclasses",
                "secretproviderclasses.exclude.reloader.stakater.com/reload",
            ],
            Ann::TypedAuto if cm => ["wasmwatch.io/auto-configmaps", &self.configmap_auto],
            Ann::TypedAuto => ["wasmwatch.io/auto-secrets", &self.secret_auto],
            Ann::Reload if cm => ["wasmwatch.io/reload-configmaps", &self.configmap_reload],
            Ann::Reload => ["wasmwatch.io/reload-secrets", &self.secret_reload],
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

    fn get<'a>(&self, list: &'a [KeyValue], ann: Ann, kind: Of) -> Option<&'a str> {
        self.of(ann, kind).iter().find_map(|k| lookup(list, k))
    }

    fn is_true(&self, list: &[KeyValue], ann: Ann, kind: Of) -> bool {
        self.get(list, ann, kind) == Some("true")
    }

    /// Whether `list` holds any annotation that decides about `kind`.
    fn relevant(&self, list: &[KeyValue], kind: Of) -> bool {
        [Ann::Reload, Ann::Search, Ann::Auto, Ann::TypedAuto]
            .into_iter()
            .any(|a| self.get(list, a, kind).is_some())
    }
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

/// Why `workload` restarts for a change of `target`, or `None`.
fn decide(
    config: &Config,
    names: &Names,
    target: &Target,
    workload: &WorkloadInfo,
) -> Option<&'static str> {
    let kind = target.of;
    let ann: &[KeyValue] = if names.relevant(&workload.annotations, kind) {
        &workload.annotations
    } else if names.relevant(&workload.template_annotations, kind) {
        &workload.template_annotations
    } else {
        &workload.annotations
    };
    let excluded = names
        .get(ann, Ann::Exclude, kind)
        .is_some_and(|l| l.split(',').any(|e| e.trim() == target.name));
    if excluded {
        return None;
    }
    if names
        .get(ann, Ann::Reload, kind)
        .is_some_and(|l| named(l, target.name))
    {
        return Some("named");
    }
    // Search, auto and autoReloadAll need a pod template that uses the
    // object (Reloader: a container that uses it); only a named reload
    // restarts a workload that does not reference it.
    if !workload.referenced {
        return None;
    }
    if names.is_true(ann, Ann::Search, kind) && names.is_true(target.annotations, Ann::Match, kind)
    {
        return Some("search/match");
    }
    if names.is_true(ann, Ann::Auto, kind) || names.is_true(ann, Ann::TypedAuto, kind) {
        return Some("auto");
    }
    let opted_out = names.get(ann, Ann::Auto, kind) == Some("false")
        || names.get(ann, Ann::TypedAuto, kind) == Some("false");
    if config.auto_reload_all && !opted_out {
        return Some("autoReloadAll");
    }
    None
}

/// `change` as the WIT names it.
fn change_name(change: ChangeType) -> &'static str {
    match change {
        ChangeType::Added => "added",
        ChangeType::Modified => "modified",
        ChangeType::Deleted => "deleted",
        ChangeType::Resynced => "resynced",
    }
}

/// Reloader's `--webhook-url` body, byte for byte.
const RELOADER_WEBHOOK_BODY: &str = r#"{"webhook":"update successful"}"#;

/// `format: json`: the change and the workloads it selects.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Notification<'a> {
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
    uid: &'a str,
    resource_version: &'a str,
    change: &'a str,
    digest: &'a str,
    changed_keys: &'a [String],
    workloads: Vec<Workload<'a>>,
}

#[derive(serde::Serialize)]
struct Workload<'a> {
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
}

fn notification(event: &ChangeEvent, workloads: &[WorkloadRef]) -> String {
    let body = Notification {
        kind: event.kind_name(),
        namespace: &event.namespace,
        name: &event.name,
        uid: &event.uid,
        resource_version: &event.resource_version,
        change: change_name(event.change),
        digest: &event.digest,
        changed_keys: &event.changed_keys,
        workloads: workloads
            .iter()
            .map(|w| Workload {
                kind: &w.kind,
                namespace: &w.namespace,
                name: &w.name,
            })
            .collect(),
    };
    serde_json::to_string(&body).expect("a notification serialises")
}

/// A JSON string literal as Go's `encoding/json` writes it (Reloader's
/// alert bodies): serde_json's escaping plus `<`, `>`, `&`, U+2028 and
/// U+2029 as `\u` escapes.
fn go_string(s: &str) -> String {
    serde_json::to_string(s)
        .expect("a string serialises")
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// Reloader's alert message (R:internal/pkg/handler/upgrade.go), with the
/// optional `additionalInfo` prefix.
fn alert_message(
    event: &ChangeEvent,
    target: &Target,
    w: &WorkloadRef,
    info: Option<&str>,
) -> String {
    let message = format!(
        "Reloader detected changes in *{}* of type *{}* in namespace *{}*. Hence reloaded *{}* of type *{}* in namespace *{}*",
        target.name,
        target.of.object_type(),
        event.namespace,
        w.name,
        w.kind,
        w.namespace
    );
    match info {
        Some(info) => format!("{info} : {message}"),
        None => message,
    }
}

/// The alert about `message` for `sink`, as Reloader's
/// internal/pkg/alerts/alert.go sends it (`teams-workflow` is ours).
fn alert(url: &str, sink: Sink, message: &str) -> Action {
    let text = go_string(message);
    let json = match sink {
        Sink::Slack => {
            format!(
                r#"{{"attachments":[{{"author_name":"Reloader","color":"good","text":{text}}}]}}"#
            )
        }
        Sink::Teams | Sink::GChat => format!(r#"{{"text":{text}}}"#),
        Sink::TeamsWorkflow => format!(
            r#"{{"type":"message","attachments":[{{"contentType":"application/vnd.microsoft.card.adaptive","content":{{"$schema":"http://adaptivecards.io/schemas/adaptive-card.json","type":"AdaptiveCard","version":"1.2","body":[{{"type":"TextBlock","text":{text},"wrap":true}}]}}}}]}}"#
        ),
        Sink::Raw => {
            return action::http(
                HttpMethod::Post,
                url,
                &[("content-type", "text/plain")],
                Some(message.replace('*', "").into_bytes()),
            );
        }
    };
    action::http_json(HttpMethod::Post, url, json)
}

// Restart and alert modes restart workloads in the namespace of each event
// they get; webhook mode and alert mode call the URL of their config.
// `metadata`: the changed object's annotations it reads (`match`,
// `ignore`); a stored index keeps only these of each object.
wasmwatch_plugin_sdk::declare_needs!(
    r#"{"restart": ["{config.mode|restart=restart,alert}{namespace}"], "http": ["{config.mode=webhook}{config.webhook.url}", "{config.mode=alert}{config.alert.url}"], "metadata": {"annotations": ["{config.annotations.match|reloader.stakater.com/match}", "{config.annotations.ignore|reloader.stakater.com/ignore}", "wasmwatch.io/match", "wasmwatch.io/ignore"]}, "only": ["usedByWorkload{config.webhook.always|false=false}"]}"#
);

struct RolloutRestart;

impl Guest for RolloutRestart {
    fn check_config(json: String) -> Result<(), String> {
        settings(&json).map(|_| ())
    }

    fn handle(event: ChangeEvent) -> Result<Vec<Action>, String> {
        let Settings {
            config,
            mode,
            names,
            ignored,
        } = settings(&host::config())?;
        let target = match target(&event) {
            Ok(t) => t,
            Err(why) => {
                log(LogLevel::Warn, &format!("nothing to restart: {why}"));
                return Ok(vec![]);
            }
        };
        let csi = target.of == Of::SecretProviderClass;
        let what = match event.change {
            // A pod's mount status comes and goes with the pod: Reloader
            // ignores both, whatever reloadOnCreate and reloadOnDelete say.
            ChangeType::Added | ChangeType::Deleted if csi => return Ok(vec![]),
            ChangeType::Added if !config.reload_on_create => return Ok(vec![]),
            ChangeType::Deleted if !config.reload_on_delete => return Ok(vec![]),
            ChangeType::Added => "created",
            ChangeType::Deleted => "deleted",
            ChangeType::Modified | ChangeType::Resynced => "changed",
        };
        if names.is_true(target.annotations, Ann::Ignore, target.of) {
            log(
                LogLevel::Debug,
                &format!("{} {} is ignored", event.kind_name(), event.object_id()),
            );
            return Ok(vec![]);
        }
        let doing = match mode {
            Mode::Webhook { .. } => "would restart",
            _ => "restarting",
        };
        let selected: Vec<WorkloadRef> =
            host::workloads_referencing(&target.of.wit(), &event.namespace, target.name)
                .into_iter()
                .filter_map(|w| {
                    if w.workload.group == "batch" && ignored.contains(&w.workload.kind.as_str()) {
                        log(
                            LogLevel::Debug,
                            &format!("not restarting {}: ignoredWorkloadTypes", w.describe()),
                        );
                        return None;
                    }
                    let why = decide(&config, &names, &target, &w)?;
                    if config.key_aware && !w.uses_any_of(&event.changed_keys) {
                        log(
                            LogLevel::Debug,
                            &format!(
                                "not restarting {}: it uses none of the changed keys ({})",
                                w.describe(),
                                event.changed_keys.join(", ")
                            ),
                        );
                        return None;
                    }
                    log(
                        LogLevel::Debug,
                        &format!("{doing} {} ({why})", w.describe()),
                    );
                    Some(w.workload)
                })
                .collect();
        match mode {
            Mode::Webhook {
                url,
                format,
                always,
            } => {
                if selected.is_empty() && !always {
                    return Ok(vec![]);
                }
                let body = match format {
                    Format::Json => notification(&event, &selected),
                    Format::Reloader => RELOADER_WEBHOOK_BODY.to_string(),
                };
                Ok(vec![action::http_json(HttpMethod::Post, &url, body)])
            }
            Mode::Restart | Mode::Alert { .. } => {
                let reason = format!(
                    "{} {}/{} {what}",
                    target.of.kind_name(),
                    event.namespace,
                    target.name
                );
                let version = match event.change {
                    ChangeType::Deleted => "deleted",
                    _ => event.digest.as_str(),
                };
                // For CSI, keyed by the SecretProviderClass: every pod's
                // mount status of the same objects has the same content
                // (its class and `{id, version}`s), so the pods of one
                // rotation restart a workload once.
                let hash = format!(
                    "{}/{}:{version}",
                    target.of.kind_name().to_ascii_lowercase(),
                    target.name
                );
                let alerts: Vec<Action> = match &mode {
                    Mode::Alert {
                        url,
                        sink,
                        additional_info,
                    } => selected
                        .iter()
                        .map(|w| {
                            alert(
                                url,
                                *sink,
                                &alert_message(&event, &target, w, additional_info.as_deref()),
                            )
                        })
                        .collect(),
                    _ => vec![],
                };
                Ok(selected
                    .into_iter()
                    .map(|w| action::restart(w, reason.clone(), hash.clone()))
                    .chain(alerts)
                    .collect())
            }
        }
    }
}

wasmwatch_plugin_sdk::export!(RolloutRestart with_types_in wasmwatch_plugin_sdk);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmwatch_plugin_sdk::HttpCall;

    fn mode_of(json: &str) -> Result<Mode, String> {
        settings(json).map(|s| s.mode)
    }

    fn event() -> ChangeEvent {
        ChangeEvent {
            kind: ObjectKind::ConfigMap,
            change: ChangeType::Modified,
            namespace: "shop".into(),
            name: "orders".into(),
            uid: "u-1".into(),
            resource_version: "42".into(),
            labels: vec![],
            annotations: vec![],
            data: vec![],
            values_included: true,
            changed_keys: vec!["a".into(), "b".into()],
            digest: "d1".into(),
            replay: false,
        }
    }

    fn deployment(name: &str) -> WorkloadRef {
        WorkloadRef {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespace: "shop".into(),
            name: name.into(),
        }
    }

    /// (content-type, body) of an `http` POST.
    fn post(action: Action) -> (String, String) {
        match action {
            Action::Http(HttpCall {
                method: HttpMethod::Post,
                headers,
                body: Some(body),
                ..
            }) => {
                assert_eq!(headers.len(), 1);
                assert_eq!(headers[0].name, "content-type");
                (headers[0].value.clone(), String::from_utf8(body).unwrap())
            }
            _ => panic!("not a POST with a body"),
        }
    }

    #[test]
    fn modes_and_their_defaults() {
        assert_eq!(mode_of(""), Ok(Mode::Restart));
        assert_eq!(mode_of(r#"{"mode":"restart"}"#), Ok(Mode::Restart));
        assert_eq!(
            mode_of(r#"{"mode":"webhook","webhook":{"url":"http://h/x"}}"#),
            Ok(Mode::Webhook {
                url: "http://h/x".into(),
                format: Format::Json,
                always: false
            })
        );
        assert_eq!(
            mode_of(
                r#"{"mode":"webhook","webhook":{"url":"https://h","format":"reloader","always":true}}"#
            ),
            Ok(Mode::Webhook {
                url: "https://h".into(),
                format: Format::Reloader,
                always: true
            })
        );
        assert_eq!(
            mode_of(r#"{"mode":"alert","alert":{"url":"http://h","additionalInfo":"  prod  "}}"#),
            Ok(Mode::Alert {
                url: "http://h".into(),
                sink: Sink::Raw,
                additional_info: Some("prod".into())
            })
        );
        for (sink, want) in [
            ("slack", Sink::Slack),
            ("teams", Sink::Teams),
            ("teams-workflow", Sink::TeamsWorkflow),
            ("gchat", Sink::GChat),
            ("raw", Sink::Raw),
            ("webhook", Sink::Raw),
        ] {
            let json = format!(
                r#"{{"mode":"alert","alert":{{"url":"http://h","sink":"{sink}","additionalInfo":" "}}}}"#
            );
            assert_eq!(
                mode_of(&json),
                Ok(Mode::Alert {
                    url: "http://h".into(),
                    sink: want,
                    additional_info: None
                })
            );
        }
    }

    #[test]
    fn config_errors_name_the_field() {
        let err = |json: &str| mode_of(json).err().unwrap();
        assert_eq!(
            err(r#"{"mode":"notify"}"#),
            r#"rollout-restart config: mode: unknown mode "notify", expected "restart", "webhook" or "alert""#
        );
        assert_eq!(
            err(r#"{"mode":"webhook"}"#),
            "rollout-restart config: webhook.url is required with mode: webhook"
        );
        assert_eq!(
            err(r#"{"mode":"webhook","webhook":{"url":"ftp://h/x"}}"#),
            r#"rollout-restart config: webhook.url: "ftp://h/x" is not an http or https URL (it must start with http:// or https://)"#
        );
        assert_eq!(
            err(r#"{"mode":"webhook","webhook":{"url":"http:///x"}}"#),
            r#"rollout-restart config: webhook.url: "http:///x" has no host"#
        );
        assert_eq!(
            err(r#"{"mode":"webhook","webhook":{"url":"http://h/ x"}}"#),
            r#"rollout-restart config: webhook.url: "http://h/ x" contains blanks or control characters"#
        );
        assert_eq!(
            err(r#"{"mode":"webhook","webhook":{"url":"http://h","format":"xml"}}"#),
            r#"rollout-restart config: webhook.format: unknown format "xml", expected "json" or "reloader""#
        );
        assert_eq!(
            err(r#"{"mode":"alert","alert":{"url":"http://h","sink":"discord"}}"#),
            r#"rollout-restart config: alert.sink: unknown sink "discord", expected "slack", "teams", "teams-workflow", "gchat" or "raw""#
        );
        assert_eq!(
            err(r#"{"mode":"alert"}"#),
            "rollout-restart config: alert.url is required with mode: alert"
        );
        assert_eq!(
            err(r#"{"webhook":{"url":"http://h"}}"#),
            r#"rollout-restart config: webhook is set but mode is "restart": set mode: webhook, or remove webhook"#
        );
        assert_eq!(
            err(r#"{"mode":"webhook","webhook":{"url":"http://h"},"alert":{"url":"http://h"}}"#),
            r#"rollout-restart config: alert is set but mode is "webhook": set mode: alert, or remove alert"#
        );
        assert!(
            err(r#"{"mode":"webhook","webhook":{"url":"http://h","fromat":"json"}}"#)
                .starts_with("rollout-restart config: unknown field `fromat`, expected one of `url`, `format`, `always`")
        );
    }

    #[test]
    fn the_json_notification_describes_the_change_and_the_workloads() {
        assert_eq!(
            notification(&event(), &[deployment("orders"), deployment("api")]),
            r#"{"kind":"ConfigMap","namespace":"shop","name":"orders","uid":"u-1","resourceVersion":"42","change":"modified","digest":"d1","changedKeys":["a","b"],"workloads":[{"kind":"Deployment","namespace":"shop","name":"orders"},{"kind":"Deployment","namespace":"shop","name":"api"}]}"#
        );
    }

    #[test]
    fn alert_bodies_are_reloaders() {
        let ev = event();
        let t = target(&ev).unwrap();
        let msg = alert_message(&ev, &t, &deployment("api"), None);
        assert_eq!(
            msg,
            "Reloader detected changes in *orders* of type *CONFIGMAP* in namespace *shop*. Hence reloaded *api* of type *Deployment* in namespace *shop*"
        );
        let with_info = alert_message(&ev, &t, &deployment("api"), Some("prod <eu> & co"));
        assert!(with_info.starts_with("prod <eu> & co : Reloader detected"));
        let body = |sink| post(alert("http://h", sink, &with_info));
        let text = "prod \\u003ceu\\u003e \\u0026 co : Reloader detected changes in *orders* of type *CONFIGMAP* in namespace *shop*. Hence reloaded *api* of type *Deployment* in namespace *shop*";
        assert_eq!(
            body(Sink::Slack),
            (
                "application/json".into(),
                format!(
                    r#"{{"attachments":[{{"author_name":"Reloader","color":"good","text":"{text}"}}]}}"#
                )
            )
        );
        assert_eq!(
            body(Sink::Teams),
            ("application/json".into(), format!(r#"{{"text":"{text}"}}"#))
        );
        assert_eq!(body(Sink::GChat), body(Sink::Teams));
        assert!(body(Sink::TeamsWorkflow).1.contains(&format!(
            r#""body":[{{"type":"TextBlock","text":"{text}","wrap":true}}]"#
        )));
        assert_eq!(
            body(Sink::Raw),
            (
                "text/plain".into(),
                "prod <eu> & co : Reloader detected changes in orders of type CONFIGMAP in namespace shop. Hence reloaded api of type Deployment in namespace shop".into()
            )
        );
    }

    #[test]
    fn custom_annotation_names_replace_reloaders_and_are_checked() {
        let names_of = |json: &str| settings(json).map(|s| s.names);
        let defaults = names_of("{}").unwrap();
        assert_eq!(defaults.auto, "reloader.stakater.com/auto");
        assert_eq!(defaults.ignore, "reloader.stakater.com/ignore");
        let custom = names_of(
            r#"{"annotations":{"auto":"acme.io/auto","configmapReload":"acme.io/reload","secretReload":"acme.io/reload","match":"m"}}"#,
        )
        .unwrap();
        assert_eq!(custom.auto, "acme.io/auto");
        assert_eq!(custom.configmap_reload, "acme.io/reload");
        assert_eq!(custom.secret_reload, "acme.io/reload");
        assert_eq!(custom.match_, "m");
        assert_eq!(custom.search, "reloader.stakater.com/search");
        assert_eq!(
            custom.of(Ann::Auto, Of::Secret),
            ["wasmwatch.io/auto", "acme.io/auto"]
        );
        // Its own wasmwatch.io/ name: ours only, Reloader's not read.
        assert_eq!(
            names_of(r#"{"annotations":{"auto":"wasmwatch.io/auto"}}"#)
                .unwrap()
                .auto,
            "wasmwatch.io/auto"
        );
        // Reloader's default of one kind for the other's auto: both mean auto.
        assert!(names_of(r#"{"annotations":{"secretAuto":"reloader.stakater.com/auto"}}"#).is_ok());
        let err = |json: &str| names_of(json).err().unwrap();
        for bad in [
            "",
            "a b",
            "-a",
            "a/",
            "/a",
            "A.io/x",
            "a/b/c",
            &"x".repeat(64),
        ] {
            let e = err(&format!(r#"{{"annotations":{{"search":"{bad}"}}}}"#));
            assert!(
                e.starts_with(&format!(
                    "rollout-restart config: annotations.search: {bad:?} is not a valid annotation key"
                )),
                "{e}"
            );
        }
        for good in ["a", "a.b_c-D", "example.com/X_1", "a.b-c.io/n"] {
            assert!(annotation_key_ok(good), "{good}");
        }
        assert_eq!(
            err(r#"{"annotations":{"search":"reloader.stakater.com/auto"}}"#),
            r#"rollout-restart config: annotations.search: "reloader.stakater.com/auto" is already the name of the auto annotation; each needs its own"#
        );
        assert_eq!(
            err(r#"{"annotations":{"ignore":"x/y","match":"x/y"}}"#),
            r#"rollout-restart config: annotations.match: "x/y" is already the name of the ignore annotation; each needs its own"#
        );
        assert_eq!(
            err(r#"{"annotations":{"configmapReload":"wasmwatch.io/exclude-configmaps"}}"#),
            r#"rollout-restart config: annotations.configmapReload: "wasmwatch.io/exclude-configmaps" is already the name of the exclude annotation; each needs its own"#
        );
        // Once auto has its own key, Reloader's default is free.
        assert!(
            names_of(r#"{"annotations":{"auto":"a/auto","search":"reloader.stakater.com/auto"}}"#)
                .is_ok()
        );
        assert!(
            err(r#"{"annotations":{"reload":"x"}}"#).starts_with(
                "rollout-restart config: unknown field `reload`, expected one of `auto`, `configmapAuto`"
            )
        );
    }

    fn info(kind: &str, referenced: bool, annotations: &[(&str, &str)]) -> WorkloadInfo {
        WorkloadInfo {
            workload: WorkloadRef {
                kind: kind.into(),
                ..deployment("w")
            },
            labels: vec![],
            annotations: annotations
                .iter()
                .map(|(k, v)| KeyValue {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            template_annotations: vec![],
            referenced,
            uses: vec![],
        }
    }

    #[test]
    fn only_a_named_reload_restarts_a_workload_that_does_not_reference_the_object() {
        let s = settings(r#"{"autoReloadAll": true}"#).unwrap();
        let ev = event();
        let t = target(&ev).unwrap();
        let decide = |w: &WorkloadInfo| decide(&s.config, &s.names, &t, w);
        let named = [("configmap.reloader.stakater.com/reload", "ord.*")];
        let auto = [("reloader.stakater.com/auto", "true")];
        assert_eq!(decide(&info("CronJob", false, &named)), Some("named"));
        assert_eq!(decide(&info("CronJob", true, &named)), Some("named"));
        assert_eq!(decide(&info("Rollout", false, &auto)), None);
        assert_eq!(decide(&info("Rollout", true, &auto)), Some("auto"));
        assert_eq!(decide(&info("Job", false, &[])), None);
        assert_eq!(decide(&info("Job", true, &[])), Some("autoReloadAll"));
    }

    #[test]
    fn key_aware_counts_only_the_keys_a_workload_uses() {
        use wasmwatch_plugin_sdk::{ObjectUse, UseVia};
        let with = |uses: &[(UseVia, Option<&str>)]| WorkloadInfo {
            uses: uses
                .iter()
                .map(|(via, key)| ObjectUse {
                    via: *via,
                    key: key.map(str::to_string),
                })
                .collect(),
            ..info("Deployment", true, &[])
        };
        let changed = ["a".to_string(), "b".to_string()];
        let env_c = with(&[(UseVia::Env, Some("c"))]);
        assert!(env_c.uses_only_keys());
        assert!(!env_c.uses_any_of(&changed));
        assert!(
            with(&[(UseVia::Env, Some("c")), (UseVia::Volume, Some("b"))]).uses_any_of(&changed)
        );
        assert!(with(&[(UseVia::Env, Some("c")), (UseVia::EnvFrom, None)]).uses_any_of(&changed));
        assert!(with(&[(UseVia::Volume, None)]).uses_any_of(&changed));
        // Uses not known, or selected by name only: the whole object.
        assert!(with(&[]).uses_any_of(&changed));
        assert!(
            WorkloadInfo {
                referenced: false,
                ..env_c.clone()
            }
            .uses_any_of(&changed)
        );
    }

    #[test]
    fn go_escapes_what_serde_json_does_not() {
        assert_eq!(
            go_string("a\"b\\c\n\u{1}<>&\u{2028}\u{2029}é"),
            r#""a\"b\\c\n\u0001\u003c\u003e\u0026\u2028\u2029é""#
        );
    }

    fn spcps(spc: Option<&str>) -> ChangeEvent {
        let mut ev = event();
        ev.kind = ObjectKind::Other(ObjectType {
            group: CSI_GROUP.into(),
            version: "v1".into(),
            kind: "SecretProviderClassPodStatus".into(),
        });
        ev.name = "api-7d9-shop-vault-db".into();
        ev.data = spc
            .map(|spc| wasmwatch_plugin_sdk::DataEntry {
                key: "status.secretProviderClassName".into(),
                value: Some(wasmwatch_plugin_sdk::DataValue::Text(spc.into())),
            })
            .into_iter()
            .collect();
        ev
    }

    #[test]
    fn a_csi_mount_status_stands_for_its_secret_provider_class() {
        let ev = spcps(Some("vault-db"));
        let t = target(&ev).unwrap();
        assert_eq!((t.of, t.name), (Of::SecretProviderClass, "vault-db"));
        assert!(
            t.annotations.is_empty(),
            "the class's annotations are not the status's"
        );
        assert!(
            target(&spcps(None))
                .unwrap_err()
                .contains("names no SecretProviderClass")
        );
        let mut other = spcps(Some("x"));
        other.kind = ObjectKind::Other(ObjectType {
            group: "example.com".into(),
            version: "v1".into(),
            kind: "Policy".into(),
        });
        assert!(target(&other).unwrap_err().contains("example.com/Policy"));
    }

    #[test]
    fn csi_restarts_follow_reloaders_secret_provider_class_annotations() {
        let s = settings("{}").unwrap();
        let ev = spcps(Some("vault-db"));
        let t = target(&ev).unwrap();
        let decide = |w: &WorkloadInfo| decide(&s.config, &s.names, &t, w);
        let typed = [("secretproviderclass.reloader.stakater.com/auto", "true")];
        let generic = [("reloader.stakater.com/auto", "true")];
        let secret_auto = [("secret.reloader.stakater.com/auto", "true")];
        let named = [(
            "secretproviderclass.reloader.stakater.com/reload",
            "vault-.*",
        )];
        let excluded = [
            ("reloader.stakater.com/auto", "true"),
            (
                "secretproviderclasses.exclude.reloader.stakater.com/reload",
                "vault-db",
            ),
        ];
        assert_eq!(decide(&info("Deployment", true, &typed)), Some("auto"));
        // Reloader's generic auto covers SecretProviderClasses too.
        assert_eq!(decide(&info("Deployment", true, &generic)), Some("auto"));
        // The Secret kind's auto does not.
        assert_eq!(decide(&info("Deployment", true, &secret_auto)), None);
        // Mounting is needed for auto, not for a named reload.
        assert_eq!(decide(&info("Deployment", false, &typed)), None);
        assert_eq!(decide(&info("Deployment", false, &named)), Some("named"));
        assert_eq!(decide(&info("Deployment", true, &excluded)), None);
    }
}
