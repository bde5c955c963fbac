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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
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
    /// `STAKATER_<NAME>_<CONFIGMAP|SECRET>` holding the content digest, in
    /// the first container that uses the object (else the first one); no
    /// annotation.
    EnvVars,
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
            } => workload.namespace.len() + workload.name.len() + reason.len() + content_hash.len(),
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
