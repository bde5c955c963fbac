//! Errors: API errors rendered as `meta/v1 Status` objects the way
//! kube-apiserver renders them, and the library's own start-up errors.

use std::borrow::Cow;

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// Errors of the library API (starting the server, writing files).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot write kubeconfig {path}: {source}")]
    Kubeconfig {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot build a kube client: {0}")]
    Client(String),
}

/// One cause in a `Status.details.causes` list.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    pub reason: &'static str,
    pub message: String,
    pub field: String,
}

/// An error answered to a client as a `Status` object.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    /// kube's `StatusReason`; a webhook's denial may carry any reason (or none).
    pub reason: Cow<'static, str>,
    pub message: String,
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header (429).
    pub retry_after: Option<u32>,
}

fn details(rt: &ResourceType, name: &str) -> Value {
    let mut d = json!({ "name": name, "kind": rt.plural });
    if !rt.group.is_empty() {
        d["group"] = json!(rt.group);
    }
    d
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: Cow::Borrowed(reason),
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    fn with_details(mut self, d: Value) -> Self {
        self.details = Some(d);
        self
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", rt.qualified()),
        )
        .with_details(details(rt, name))
    }

    /// 404 for a path that names no served resource.
    pub fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", rt.qualified()),
        )
        .with_details(details(rt, name))
    }

    pub fn conflict(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                rt.qualified()
            ),
        )
        .with_details(details(rt, name))
    }

    /// 409 Conflict with a custom explanation (e.g. a UID precondition).
    pub fn conflict_msg(rt: &ResourceType, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                rt.qualified()
            ),
        )
        .with_details(details(rt, name))
    }

    /// 410 Expired for a resourceVersion older than the kept history.
    pub fn too_old(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 410 Expired for a continue token whose snapshot is gone.
    pub fn continue_expired() -> Self {
        Self::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter.",
        )
    }

    /// 422 Invalid listing field errors.
    pub fn invalid(rt: &ResourceType, name: &str, causes: Vec<Cause>) -> Self {
        Self::invalid_kind(rt.group, rt.kind, name, causes)
    }

    /// 422 Invalid for a kind of a group (`ListOptions` of `meta.k8s.io`);
    /// kube-apiserver names the kind qualified by its group: `Deployment.apps`.
    pub fn invalid_kind(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let summary = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect::<Vec<_>>();
        let summary = if summary.len() == 1 {
            summary[0].clone()
        } else {
            format!("[{}]", summary.join(", "))
        };
        let mut d = json!({ "name": name, "kind": kind });
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            d["group"] = json!(group);
            format!("{kind}.{group}")
        };
        d["causes"] = causes
            .iter()
            .map(|c| json!({ "reason": c.reason, "message": c.message, "field": c.field }))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("{qualified} \"{name}\" is invalid: {summary}"),
        )
        .with_details(d)
    }

    /// 422 for a JSON patch that does not apply (a failed `test`, a missing
    /// path), as kube-apiserver answers it; clients do not retry it.
    pub fn unprocessable_patch(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    /// 415 for a create, update or delete body whose Content-Type kube-apiserver
    /// does not decode. Like kube-apiserver's, the message lists the accepted
    /// media types and not the one sent (`_content_type`).
    pub fn unsupported_media_type(_content_type: &str) -> Self {
        Self::unsupported(&[
            "application/json",
            "application/yaml",
            "application/vnd.kubernetes.protobuf",
        ])
    }

    /// 415 for a PATCH whose Content-Type is not a patch type. kube-apiserver
    /// lists the patch types it accepts for built-in kinds; this server has no
    /// server-side apply, so `application/apply-patch+yaml` is not among them.
    pub fn unsupported_patch_type(_content_type: &str) -> Self {
        Self::unsupported(&[
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ])
    }

    /// 415 for a strategic merge patch of a custom resource: kube-apiserver
    /// accepts only JSON and merge patches (and apply) for those.
    pub fn strategic_patch_of_custom_resource() -> Self {
        Self::unsupported(&[
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ])
    }

    fn unsupported(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    pub fn too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        )
    }

    pub fn too_many_requests(retry_after: u32) -> Self {
        let mut e = Self::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        )
        .with_details(json!({ "retryAfterSeconds": retry_after }));
        e.retry_after = Some(retry_after);
        e
    }

    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
        .with_details(json!({ "causes": [{ "message": message }] }))
    }

    /// 403 for a request RBAC denies to `user`, as kube-apiserver's
    /// authorization filter words it (the resource qualified by its group,
    /// the name the authorizer saw, if any).
    pub fn forbidden(r: &crate::audit::Request, user: &str) -> Self {
        let qualified = if r.group.is_empty() {
            r.resource.clone()
        } else {
            format!("{}.{}", r.resource, r.group)
        };
        let subject = match r.name.as_deref().filter(|n| !n.is_empty()) {
            Some(n) => format!("{qualified} \"{n}\""),
            None => qualified,
        };
        let scope = match &r.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        let mut d = json!({ "kind": r.resource });
        if let Some(n) = r.name.as_deref().filter(|n| !n.is_empty()) {
            d["name"] = json!(n);
        }
        if !r.group.is_empty() {
            d["group"] = json!(r.group);
        }
        Self::new(
            403,
            "Forbidden",
            format!(
                "{subject} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
                r.verb,
                r.rbac_resource(),
                r.group
            ),
        )
        .with_details(d)
    }

    /// 503 ServiceUnavailable, as kube-apiserver answers while it cannot
    /// serve (e.g. its storage is unavailable).
    pub fn service_unavailable() -> Self {
        Self::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )
    }

    /// 504 for a resourceVersion newer than the server has.
    pub fn too_large_rv(requested: u64, current: u64) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        )
        .with_details(json!({ "causes": [{ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" }], "retryAfterSeconds": 1 }))
    }

    /// The `Status` object for this error.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        // A webhook's denial may have no reason; kube omits it then.
        if self.reason.is_empty() {
            s.as_object_mut().expect("object").remove("reason");
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}
