//! Actions: what a plugin asks the host to do. Plain data; the host checks
//! each against the plugin's capabilities before executing it.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Header {
    pub name: String,
    pub value: String,
}

/// A workload's kind. The three apps/v1 kinds have variants of their own
/// (the kinds WIT 0.2.0 names, and the only ones restarted today); any other
/// group/version/kind (WIT 0.3.0) is [`WorkloadKind::Other`], which never
/// holds an apps/v1 Deployment, StatefulSet or DaemonSet (build it with
/// [`WorkloadKind::from_gvk`]).
///
/// Written (serde, `Display` and `Debug` alike) as `Deployment`,
/// `StatefulSet`, `DaemonSet`, or `apiVersion/Kind` for the others:
/// `batch/v1/CronJob`, `argoproj.io/v1alpha1/Rollout`, `v1/Pod` (core group).
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
    /// Any other kind.
    Other(Box<Gvk>),
}

/// An API group, version and kind (`""` is the core group).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Gvk {
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl WorkloadKind {
    /// The kind of `group`/`version`/`kind`: one of the apps/v1 variants
    /// for those, [`WorkloadKind::Other`] otherwise. Not checked: see
    /// [`WorkloadKind::problem`].
    pub fn from_gvk(group: &str, version: &str, kind: &str) -> WorkloadKind {
        match (group, version, kind) {
            ("apps", "v1", "Deployment") => WorkloadKind::Deployment,
            ("apps", "v1", "StatefulSet") => WorkloadKind::StatefulSet,
            ("apps", "v1", "DaemonSet") => WorkloadKind::DaemonSet,
            _ => WorkloadKind::Other(Box::new(Gvk {
                group: group.to_string(),
                version: version.to_string(),
                kind: kind.to_string(),
            })),
        }
    }

    /// Group, version and kind.
    pub fn gvk(&self) -> (&str, &str, &str) {
        match self {
            WorkloadKind::Deployment => ("apps", "v1", "Deployment"),
            WorkloadKind::StatefulSet => ("apps", "v1", "StatefulSet"),
            WorkloadKind::DaemonSet => ("apps", "v1", "DaemonSet"),
            WorkloadKind::Other(g) => (&g.group, &g.version, &g.kind),
        }
    }

    /// The Kubernetes kind alone (`Deployment`, `CronJob`).
    pub fn kind(&self) -> &str {
        self.gvk().2
    }

    /// The `apiVersion` of the workload: `apps/v1`, `batch/v1`, `v1`.
    pub fn api_version(&self) -> String {
        match self.gvk() {
            ("", version, _) => version.to_string(),
            (group, version, _) => format!("{group}/{version}"),
        }
    }

    /// One of the apps/v1 kinds (what a grant without `kinds` allows).
    pub fn is_apps_v1(&self) -> bool {
        !matches!(self, WorkloadKind::Other(_))
    }

    /// Why this is not a valid group/version/kind, if it is not: the group
    /// a DNS subdomain (or empty: core), the version a lowercase name
    /// (`v1`, `v1alpha1`), the kind alphanumeric starting with a letter.
    pub fn problem(&self) -> Option<String> {
        let (group, version, kind) = self.gvk();
        let lower = |s: &str, extra: &[u8]| {
            s.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || extra.contains(&c))
        };
        if group.len() > 253 || !lower(group, b".-") {
            Some(format!("group {group:?} is not a DNS subdomain"))
        } else if version.is_empty() || version.len() > 63 || !lower(version, b"") {
            Some(format!(
                "version {version:?} is not a version name (v1, v1beta1, ...)"
            ))
        } else if kind.len() > 63
            || !kind.starts_with(|c: char| c.is_ascii_alphabetic())
            || !kind.bytes().all(|c| c.is_ascii_alphanumeric())
        {
            Some(format!("kind {kind:?} is not a kind name (CronJob, ...)"))
        } else {
            None
        }
    }

    /// `Deployment`, `StatefulSet`, `DaemonSet` (apps/v1), or
    /// `group/version/Kind` (`batch/v1/CronJob`; `v1/Kind` for the core
    /// group), checked as [`WorkloadKind::problem`] does.
    pub fn parse(s: &str) -> Result<WorkloadKind, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let kind = match parts[..] {
            ["Deployment"] => return Ok(WorkloadKind::Deployment),
            ["StatefulSet"] => return Ok(WorkloadKind::StatefulSet),
            ["DaemonSet"] => return Ok(WorkloadKind::DaemonSet),
            [version, kind] => WorkloadKind::from_gvk("", version, kind),
            [group, version, kind] if !group.is_empty() => {
                WorkloadKind::from_gvk(group, version, kind)
            }
            _ => {
                return Err(format!(
                    "{s:?} is not a workload kind: write Deployment, StatefulSet, DaemonSet \
                     or group/version/Kind (batch/v1/CronJob)"
                ));
            }
        };
        match kind.problem() {
            Some(why) => Err(format!("{s:?} is not a workload kind: {why}")),
            None => Ok(kind),
        }
    }
}

impl std::fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkloadKind::Other(_) => write!(f, "{}/{}", self.api_version(), self.kind()),
            _ => f.write_str(self.kind()),
        }
    }
}

/// As `Display`: messages and logs written with `{:?}` read `Deployment`
/// (as the derived form did) or `batch/v1/CronJob`.
impl std::fmt::Debug for WorkloadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl Serialize for WorkloadKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for WorkloadKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        WorkloadKind::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// How a restart makes the workload's controller roll its pods.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum RestartStrategy {
    /// One pod-template annotation per object, holding its content hash
    /// (`config-hash.wasmwatch.io/<kind>.<name>`), and
    /// `kubectl.kubernetes.io/restartedAt`.
    #[default]
    Annotations,
    /// Reloader's default: an environment variable
    /// `STAKATER_<NAME>_<CONFIGMAP|SECRET>` in the first container that
    /// uses the object (else the first one); no annotation. It holds
    /// Reloader's SHA-1 of a ConfigMap's content (when the restart is for
    /// the host's digest of it), so a switch back to Reloader restarts
    /// nothing; the keyed digest of a Secret's (an unkeyed SHA-1 of secret
    /// values is not written where Deployments' readers see it).
    EnvVars,
    /// Argo Rollouts' `spec.restartAt` (WIT 0.3.0's `restart-at`): the
    /// Rollout restarts its pods without a new revision, and the content
    /// hash is recorded on its own annotations. Only a plugin's restart can
    /// ask for it (not the manifest, not `wasmwatch.io/reload-strategy`;
    /// Reloader's `reloader.stakater.com/rollout-strategy: restart` on the
    /// Rollout does), and only of a Rollout.
    #[serde(skip_deserializing)]
    RestartAt,
}

/// The workload annotation that chooses the restart strategy for it
/// (`annotations` or `env-vars`), over the plugin's `delivery.restartStrategy`.
/// Not Reloader's `rollout-strategy`, which is Argo Rollouts' restart mode.
pub const RESTART_STRATEGY_ANNOTATION: &str = "wasmwatch.io/reload-strategy";

impl RestartStrategy {
    /// `annotations` or `env-vars` (also Reloader's spelling of its flag).
    pub fn parse(s: &str) -> Option<RestartStrategy> {
        match s.trim() {
            "annotations" => Some(RestartStrategy::Annotations),
            "env-vars" => Some(RestartStrategy::EnvVars),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadRef {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// One action. Serialised (for `wasmwatch plugin run`) with a `type` tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Action {
    /// Call one HTTP endpoint.
    #[serde(rename_all = "camelCase")]
    Http {
        method: HttpMethod,
        url: String,
        headers: Vec<Header>,
        #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_bytes")]
        body: Option<Vec<u8>>,
    },
    /// Call `path` on every ready pod behind a Service.
    #[serde(rename_all = "camelCase")]
    RefreshService {
        namespace: String,
        service: String,
        method: HttpMethod,
        port: Option<u16>,
        path: String,
        tls: bool,
    },
    /// Publish on a named bus connection.
    #[serde(rename_all = "camelCase")]
    Publish {
        connection: String,
        destination: String,
        routing_key: String,
        headers: Vec<Header>,
        /// Printed as text when it is UTF-8 (bus messages are JSON).
        #[serde(serialize_with = "bytes")]
        payload: Vec<u8>,
    },
    /// Roll a workload's pods.
    #[serde(rename_all = "camelCase")]
    Restart {
        workload: WorkloadRef,
        reason: String,
        content_hash: String,
        /// The plugin's choice for this restart (WIT 0.3.0), over its
        /// `delivery.restartStrategy`; `None`: that one.
        #[serde(skip_serializing_if = "Option::is_none")]
        strategy: Option<RestartStrategy>,
    },
    /// Emit a Kubernetes Event on the changed object.
    #[serde(rename_all = "camelCase")]
    Event {
        event_type: EventType,
        reason: String,
        message: String,
    },
}

impl Action {
    /// A short name of the action's type, for logs and metrics.
    pub fn type_name(&self) -> &'static str {
        match self {
            Action::Http { .. } => "http",
            Action::RefreshService { .. } => "refreshService",
            Action::Publish { .. } => "publish",
            Action::Restart { .. } => "restart",
            Action::Event { .. } => "event",
        }
    }

    /// Bytes of variable-size data in the action, for output limits.
    pub fn approx_size(&self) -> usize {
        // Every element counts with its slot (a header is two strings), so
        // a million empty headers are as much output as their memory is.
        let hs = |h: &[Header]| {
            h.iter()
                .map(|h| 32 + h.name.len() + h.value.len())
                .sum::<usize>()
        };
        64 + match self {
            Action::Http {
                url, headers, body, ..
            } => url.len() + hs(headers) + body.as_ref().map_or(0, Vec::len),
            Action::RefreshService {
                namespace,
                service,
                path,
                ..
            } => namespace.len() + service.len() + path.len(),
            Action::Publish {
                connection,
                destination,
                routing_key,
                headers,
                payload,
            } => {
                connection.len()
                    + destination.len()
                    + routing_key.len()
                    + hs(headers)
                    + payload.len()
            }
            Action::Restart {
                workload,
                reason,
                content_hash,
                ..
            } => {
                // The apps/v1 kinds take no bytes (an enum in WIT 0.2.0).
                let kind = match &workload.kind {
                    WorkloadKind::Other(g) => g.group.len() + g.version.len() + g.kind.len(),
                    _ => 0,
                };
                kind + workload.namespace.len()
                    + workload.name.len()
                    + reason.len()
                    + content_hash.len()
            }
            Action::Event {
                reason, message, ..
            } => reason.len() + message.len(),
        }
    }
}

/// Bytes print as a string when they are UTF-8, else as `{"base64": ...}`.
fn bytes<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    use base64::Engine as _;
    match std::str::from_utf8(b) {
        Ok(text) => s.serialize_str(text),
        Err(_) => {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(Some(1))?;
            m.serialize_entry(
                "base64",
                &base64::engine::general_purpose::STANDARD.encode(b),
            )?;
            m.end()
        }
    }
}

fn opt_bytes<S: serde::Serializer>(b: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match b {
        Some(b) => bytes(b, s),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// WIT 0.3.0's open kinds: the apps/v1 ones are today's variants
    /// (however spelled), the others keep their group/version/kind and are
    /// written `apiVersion/Kind`.
    #[test]
    fn workload_kinds_parse_and_print_as_api_version_and_kind() {
        assert_eq!(
            WorkloadKind::from_gvk("apps", "v1", "Deployment"),
            WorkloadKind::Deployment
        );
        assert_eq!(
            WorkloadKind::parse("apps/v1/DaemonSet"),
            Ok(WorkloadKind::DaemonSet)
        );
        assert_eq!(
            WorkloadKind::parse("StatefulSet"),
            Ok(WorkloadKind::StatefulSet)
        );
        for (text, gvk, api_version) in [
            ("batch/v1/CronJob", ("batch", "v1", "CronJob"), "batch/v1"),
            (
                "argoproj.io/v1alpha1/Rollout",
                ("argoproj.io", "v1alpha1", "Rollout"),
                "argoproj.io/v1alpha1",
            ),
            (
                "v1/ReplicationController",
                ("", "v1", "ReplicationController"),
                "v1",
            ),
            // apps, but not v1: another kind.
            (
                "apps/v1beta2/Deployment",
                ("apps", "v1beta2", "Deployment"),
                "apps/v1beta2",
            ),
        ] {
            let kind = WorkloadKind::parse(text).unwrap();
            assert!(!kind.is_apps_v1(), "{text}");
            assert_eq!(kind.gvk(), gvk);
            assert_eq!(kind.api_version(), api_version);
            assert_eq!(kind.to_string(), text);
            assert_eq!(format!("{kind:?}"), text);
            assert_eq!(kind, WorkloadKind::from_gvk(gvk.0, gvk.1, gvk.2));
        }
        assert_eq!(WorkloadKind::Deployment.api_version(), "apps/v1");
        assert_eq!(format!("{:?}", WorkloadKind::Deployment), "Deployment");
        for bad in [
            "CronJob",
            "",
            "/v1/CronJob",
            "batch//CronJob",
            "batch/v1/",
            "Batch/v1/CronJob",
            "batch/V1/CronJob",
            "batch/v1/Cron-Job",
            "a/b/c/D",
        ] {
            let err = WorkloadKind::parse(bad).unwrap_err();
            assert!(err.contains("is not a workload kind"), "{bad}: {err}");
        }
        // serde: the same strings.
        let r: WorkloadRef = serde_json::from_str(
            r#"{"kind": "batch/v1/CronJob", "namespace": "shop", "name": "nightly"}"#,
        )
        .unwrap();
        assert_eq!(r.kind, WorkloadKind::from_gvk("batch", "v1", "CronJob"));
        assert_eq!(
            serde_json::to_value(&r).unwrap()["kind"],
            serde_json::json!("batch/v1/CronJob")
        );
        assert_eq!(
            serde_json::to_value(WorkloadKind::DaemonSet).unwrap(),
            serde_json::json!("DaemonSet")
        );
    }
}
