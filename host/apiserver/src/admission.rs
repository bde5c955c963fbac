//! Mutating admission webhooks, called the way kube-apiserver 1.32's
//! `MutatingAdmissionWebhook` plugin calls them.
//!
//! Every create and update of an object (POST, PUT, every PATCH, and the
//! `status` and `scale` subresources when a rule names them) goes through
//! [`admit`] after the server's defaults and before validation and storage.
//! The webhooks of every `MutatingWebhookConfiguration`
//! (`admissionregistration.k8s.io/v1`) are considered in order,
//! configurations by name and webhooks in list order; each one whose
//! `namespaceSelector`, `objectSelector` and `rules` match is sent an
//! `AdmissionReview` over HTTPS and may deny the request or return a JSON
//! Patch, which the next webhook sees applied.
//!
//! - Only `clientConfig.url` is reachable; a `service` reference is a call
//!   failure. TLS is verified against `clientConfig.caBundle` alone (no
//!   system roots). `timeoutSeconds` (default 10) bounds the whole call.
//! - A denial is answered with the webhook's status (code 400 unless it
//!   gives one of at least 400) and `admission webhook "<name>" denied the
//!   request: <message>`. A call that fails (connection, TLS, timeout, a
//!   status other than 2xx, an answer that is not a valid AdmissionReview
//!   for this request) is a 500 `failed calling webhook "<name>": ...` under
//!   `failurePolicy: Fail` (the default) and is skipped under `Ignore`. A
//!   patch that does not apply, or leaves something that is not the kind,
//!   is a 500 whatever the policy.
//! - Not implemented: `reinvocationPolicy` (no second round),
//!   `matchPolicy: Equivalent` (every kind is served in one version, so
//!   rules match as `Exact`), `matchConditions` (CEL; not evaluated: the
//!   webhook is called as if they matched). `sideEffects` only matters for
//!   dry runs, as in kube: a webhook without `None`/`NoneOnDryRun` refuses
//!   them with 400.
//!
//! No store lock is held while a webhook is called: the verbs compute the
//! object, call the webhooks, then commit with the resourceVersion they read
//! (retrying on a race), so a webhook may call back into the server.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{ACCEPT, CONTENT_TYPE, HOST, USER_AGENT};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

use crate::Shared;
use crate::audit::WebhookCall;
use crate::error::{ApiError, Cause};
use crate::objects::{SUBDOMAIN_MSG, is_dns_subdomain};
use crate::resources::{self, ResourceType};
use crate::selector::LabelSelector;

/// kube's default `timeoutSeconds` for `admissionregistration.k8s.io/v1`.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 10;

/// Who the server says made a request: this server has no authentication.
const USER: &str = "system:admin";

/// An admission operation this server calls webhooks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
        }
    }
}

/// One write, as admission sees it.
pub struct Attributes<'a> {
    pub operation: Operation,
    pub rt: &'static ResourceType,
    /// `status` or `scale`, for writes through a subresource.
    pub subresource: Option<&'a str>,
    /// The request's namespace: empty for cluster-scoped kinds, the name for
    /// an update of a Namespace (as kube's request info has it).
    pub namespace: &'a str,
    /// Empty for a create with `generateName`.
    pub name: &'a str,
    pub dry_run: bool,
    /// `CreateOptions`, `UpdateOptions` or `PatchOptions`.
    pub options_kind: &'static str,
    /// The request's `fieldManager`, if any.
    pub field_manager: Option<&'a str>,
}

impl Attributes<'_> {
    /// `(group, version, kind)` of the object sent: autoscaling/v1 Scale for
    /// `/scale`, else the resource's kind.
    fn kind(&self) -> (&'static str, &'static str, &'static str) {
        if self.subresource == Some("scale") {
            ("autoscaling", "v1", "Scale")
        } else {
            (self.rt.group, self.rt.version, self.rt.kind)
        }
    }

    fn options(&self) -> Value {
        let mut o = json!({ "kind": self.options_kind, "apiVersion": "meta.k8s.io/v1" });
        if let Some(m) = self.field_manager.filter(|m| !m.is_empty()) {
            o["fieldManager"] = json!(m);
        }
        if self.dry_run {
            o["dryRun"] = json!(["All"]);
        }
        o
    }
}

/// Whether any webhook configuration exists (nothing to do otherwise).
pub fn configured(sh: &Shared) -> bool {
    sh.store.len(resources::mutating_webhooks_id()) > 0
}

/// Call every matching webhook for a write of `object` (`old`: the stored
/// object, for an update). `Some`: the object as the webhooks' patches left
/// it; `None`: no webhook changed it. An error is the answer to the request.
pub async fn admit(
    sh: &Shared,
    attr: &Attributes<'_>,
    object: &Value,
    old: Option<&Value>,
) -> Result<Option<Value>, ApiError> {
    // kube never sends webhook configurations to webhooks.
    if attr.rt.is_mutating_webhook_configuration() || !configured(sh) {
        return Ok(None);
    }
    let Ok((configs, _)) = sh.store.list(resources::mutating_webhooks_id(), None, None) else {
        return Ok(None);
    };
    let mut current = object.clone();
    let mut changed = false;
    let mut namespace_labels: Option<Option<Value>> = None;
    for (_, config) in &configs {
        let config_name = config
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let hooks = config
            .get("webhooks")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for hook in &hooks {
            if !should_call(sh, hook, attr, object, old, &mut namespace_labels)? {
                continue;
            }
            let name = hook.get("name").and_then(Value::as_str).unwrap_or_default();
            let mut call = WebhookCall {
                configuration: config_name.to_string(),
                webhook: name.to_string(),
                operation: attr.operation.as_str().to_string(),
                group: attr.rt.group.to_string(),
                resource: attr.rt.plural.to_string(),
                subresource: attr.subresource.map(str::to_string),
                namespace: attr.namespace.to_string(),
                name: attr.name.to_string(),
                dry_run: attr.dry_run,
                outcome: String::new(),
                error: None,
            };
            let result = call_hook(hook, attr, &current, old).await;
            let outcome = match result {
                Ok(Answer::Allowed(None)) => Ok(None),
                Ok(Answer::Allowed(Some(ops))) => apply_patch(attr, &current, &ops).map(Some),
                Ok(Answer::Denied(status)) => Err(Failure::Denied(denial(name, status))),
                Err(e) => Err(e),
            };
            match outcome {
                Ok(None) => call.outcome = "allowed".into(),
                Ok(Some(patched)) => {
                    call.outcome = "patched".into();
                    if patched != current {
                        changed = true;
                        current = patched;
                    }
                }
                Err(Failure::Denied(e)) => {
                    call.outcome = "denied".into();
                    call.error = Some(e.message.clone());
                    sh.requests.record_webhook(call);
                    return Err(e);
                }
                Err(Failure::Call(cause)) => {
                    let why = format!("failed calling webhook \"{name}\": {cause}");
                    call.error = Some(why.clone());
                    if hook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore") {
                        tracing::warn!(webhook = name, error = %why, "failed calling webhook, failing open");
                        call.outcome = "ignored".into();
                        sh.requests.record_webhook(call);
                        continue;
                    }
                    call.outcome = "failed".into();
                    sh.requests.record_webhook(call);
                    return Err(ApiError::internal(why));
                }
                Err(Failure::Status(e)) => {
                    call.outcome = "failed".into();
                    call.error = Some(e.message.clone());
                    sh.requests.record_webhook(call);
                    return Err(e);
                }
            }
            sh.requests.record_webhook(call);
        }
    }
    Ok(changed.then_some(current))
}

/// Why a webhook did not let a request through.
enum Failure {
    /// It said no.
    Denied(ApiError),
    /// It could not be called, or its answer was not valid: the failure
    /// policy decides (kube's `ErrCallingWebhook`).
    Call(String),
    /// An error that fails the request whatever the policy.
    Status(ApiError),
}

/// A webhook's valid answer.
enum Answer {
    /// Allowed, with the JSON Patch operations to apply, if any.
    Allowed(Option<Value>),
    /// Denied, with the `response.status` it gave.
    Denied(Option<Value>),
}

/// kube's `ShouldCallHook`: namespace selector, object selector, rules.
fn should_call(
    sh: &Shared,
    hook: &Value,
    attr: &Attributes<'_>,
    object: &Value,
    old: Option<&Value>,
    namespace_labels: &mut Option<Option<Value>>,
) -> Result<bool, ApiError> {
    let name = hook.get("name").and_then(Value::as_str).unwrap_or_default();
    let parse = |field: &str| {
        LabelSelector::from_object(hook.get(field))
            .map_err(|e| ApiError::internal(format!("{field} of webhook \"{name}\": {e}")))
    };
    // Evaluated first, as kube does, but an error only counts when the
    // rules match.
    let ns_match = match_namespace(
        sh,
        attr,
        object,
        parse("namespaceSelector"),
        namespace_labels,
    );
    if let Ok(false) = ns_match {
        return Ok(false);
    }
    let obj_match = parse("objectSelector")
        .map(|sel| sel.is_empty() || sel.matches(object) || old.is_some_and(|o| sel.matches(o)));
    if let Ok(false) = obj_match {
        return Ok(false);
    }
    let rules_match = hook
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| rule_matches(r, attr));
    if !rules_match {
        return Ok(false);
    }
    ns_match?;
    obj_match?;
    Ok(true)
}

fn match_namespace(
    sh: &Shared,
    attr: &Attributes<'_>,
    object: &Value,
    selector: Result<LabelSelector, ApiError>,
    cache: &mut Option<Option<Value>>,
) -> Result<bool, ApiError> {
    let is_namespace = attr.rt.is_namespace();
    if attr.namespace.is_empty() && !is_namespace {
        // Cluster-scoped objects are never exempted.
        return Ok(true);
    }
    let selector = selector?;
    if selector.is_empty() {
        return Ok(true);
    }
    if is_namespace && attr.subresource.is_none() {
        return Ok(selector.matches(object));
    }
    let labels = cache.get_or_insert_with(|| {
        sh.store
            .get(resources::namespaces_id(), "", attr.namespace)
            .map(|ns| {
                ns.pointer("/metadata/labels")
                    .cloned()
                    .unwrap_or(Value::Null)
            })
    });
    match labels {
        Some(labels) => Ok(selector.matches_labels(Some(labels))),
        None => Err(ApiError::not_found(
            &resources::RESOURCES[resources::namespaces_id()],
            attr.namespace,
        )),
    }
}

fn strings(v: Option<&Value>) -> impl Iterator<Item = &str> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// kube's `rules.Matcher`: scope, operation, group, version, resource.
fn rule_matches(rule: &Value, attr: &Attributes<'_>) -> bool {
    let exact_or_wildcard =
        |field: &str, requested: &str| strings(rule.get(field)).any(|v| v == "*" || v == requested);
    let is_namespace = attr.rt.is_namespace();
    let scope = match rule.get("scope").and_then(Value::as_str) {
        None | Some("*") => true,
        Some("Namespaced") => !is_namespace && !attr.namespace.is_empty(),
        Some("Cluster") => is_namespace || attr.namespace.is_empty(),
        Some(_) => false,
    };
    let sub = attr.subresource.unwrap_or("");
    let resource = strings(rule.get("resources")).any(|r| {
        let (res, s) = r.split_once('/').unwrap_or((r, ""));
        (res == "*" || res == attr.rt.plural) && (s == "*" || s == sub)
    });
    scope
        && exact_or_wildcard("operations", attr.operation.as_str())
        && exact_or_wildcard("apiGroups", attr.rt.group)
        && exact_or_wildcard("apiVersions", attr.rt.version)
        && resource
}

/// The 4xx a denial is answered with (kube 1.32's `ToStatusErr`).
fn denial(webhook: &str, status: Option<Value>) -> ApiError {
    let status = status.filter(Value::is_object).unwrap_or_else(|| json!({}));
    let text = |k: &str| status.get(k).and_then(Value::as_str).unwrap_or_default();
    let code = status
        .get("code")
        .and_then(Value::as_u64)
        .filter(|&c| (400..600).contains(&c))
        .unwrap_or(400) as u16;
    let denied_by = format!("admission webhook \"{webhook}\" denied the request");
    let message = match (text("message"), text("reason")) {
        ("", "") => format!("{denied_by} without explanation"),
        ("", reason) => format!("{denied_by}: {reason}"),
        (message, _) => format!("{denied_by}: {message}"),
    };
    ApiError {
        code,
        reason: text("reason").to_string().into(),
        message,
        details: status.get("details").filter(|d| !d.is_null()).cloned(),
        retry_after: None,
    }
}

/// Apply an allowed answer's JSON Patch to the object the webhook was sent.
fn apply_patch(attr: &Attributes<'_>, object: &Value, ops: &Value) -> Result<Value, Failure> {
    let patched = crate::patch::json_patch(object, ops)
        .map_err(|e| Failure::Status(ApiError::internal(e.message)))?;
    if attr.subresource != Some("scale") {
        crate::validation::typecheck(attr.rt, &patched)
            .map_err(|e| Failure::Status(ApiError::internal(e.message)))?;
    }
    Ok(patched)
}

/// Send one AdmissionReview and check the answer
/// (kube's `callAttrMutatingHook` and `VerifyAdmissionResponse`).
async fn call_hook(
    hook: &Value,
    attr: &Attributes<'_>,
    object: &Value,
    old: Option<&Value>,
) -> Result<Answer, Failure> {
    let name = hook.get("name").and_then(Value::as_str).unwrap_or_default();
    if attr.dry_run
        && !matches!(
            hook.get("sideEffects").and_then(Value::as_str),
            Some("None" | "NoneOnDryRun")
        )
    {
        return Err(Failure::Status(ApiError::bad_request(format!(
            "admission webhook \"{name}\" does not support dry run"
        ))));
    }
    let version = if strings(hook.get("admissionReviewVersions")).any(|v| v == "v1") {
        "admission.k8s.io/v1"
    } else {
        "admission.k8s.io/v1beta1"
    };
    let timeout = Duration::from_secs(
        hook.get("timeoutSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_TIMEOUT_SECONDS)
            .clamp(1, 30),
    );
    let uid = crate::objects::new_uid();
    let (group, kind_version, kind) = attr.kind();
    let rt = attr.rt;
    let mut request = json!({
        "uid": uid,
        "kind": { "group": group, "version": kind_version, "kind": kind },
        "resource": { "group": rt.group, "version": rt.version, "resource": rt.plural },
        "requestKind": { "group": group, "version": kind_version, "kind": kind },
        "requestResource": { "group": rt.group, "version": rt.version, "resource": rt.plural },
        "operation": attr.operation.as_str(),
        "userInfo": { "username": USER, "groups": ["system:masters", "system:authenticated"] },
        "object": object,
        "oldObject": old,
        "dryRun": attr.dry_run,
        "options": attr.options(),
    });
    if let Some(sub) = attr.subresource {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    if !attr.name.is_empty() {
        request["name"] = json!(attr.name);
    }
    if !attr.namespace.is_empty() {
        request["namespace"] = json!(attr.namespace);
    }
    let review = json!({ "apiVersion": version, "kind": "AdmissionReview", "request": request });
    let body = serde_json::to_vec(&review).expect("a Value serialises");
    let answer = post(hook.get("clientConfig"), timeout, body)
        .await
        .map_err(Failure::Call)?;
    verify(&answer, version, &uid).map_err(|why| match why {
        Invalid::Response(why) => {
            Failure::Call(format!("received invalid webhook response: {why}"))
        }
        Invalid::Decode(why) => Failure::Call(format!("failed to call webhook: {why}")),
        Invalid::Patch(why) => Failure::Status(ApiError::internal(why)),
    })
}

enum Invalid {
    /// Decoded, but not an answer to this review.
    Response(String),
    /// Not decodable as an AdmissionReview.
    Decode(String),
    /// The patch is not a JSON Patch document.
    Patch(String),
}

fn verify(body: &[u8], version: &str, uid: &str) -> Result<Answer, Invalid> {
    let review: Value = serde_json::from_slice(body).map_err(|e| {
        Invalid::Decode(format!("couldn't get version/kind; json parse error: {e}"))
    })?;
    let api_version = review
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = review.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind.is_empty() {
        return Err(Invalid::Decode(format!(
            "Object 'Kind' is missing in '{}'",
            String::from_utf8_lossy(body)
        )));
    }
    if api_version != version || kind != "AdmissionReview" {
        let (g, v) = api_version.split_once('/').unwrap_or(("", api_version));
        return Err(Invalid::Response(format!(
            "expected webhook response of {version}, Kind=AdmissionReview, got {g}/{v}, Kind={kind}"
        )));
    }
    let Some(response) = review.get("response").filter(|r| !r.is_null()) else {
        return Err(Invalid::Response("webhook response was absent".into()));
    };
    let got = response.get("uid").and_then(Value::as_str).unwrap_or("");
    if got != uid {
        return Err(Invalid::Response(format!(
            "expected response.uid=\"{uid}\", got \"{got}\""
        )));
    }
    let patch = match response.get("patch") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => B64
            .decode(s)
            .map_err(|e| Invalid::Decode(format!("illegal base64 data in response.patch: {e}")))?,
        // Go's decoder also reads a `[]byte` from an array of numbers
        // (kube-rs's `AdmissionResponse` writes the patch so).
        Some(Value::Array(bytes)) => bytes
            .iter()
            .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| {
                Invalid::Decode(
                    "response.patch: an array that is not of bytes (0 to 255)".to_string(),
                )
            })?,
        Some(other) => {
            return Err(Invalid::Decode(format!(
                "response.patch: expected a base64 string, got {other}"
            )));
        }
    };
    let patch_type = response
        .get("patchType")
        .and_then(Value::as_str)
        .unwrap_or("");
    match (patch.is_empty(), patch_type.is_empty()) {
        (false, true) => {
            return Err(Invalid::Response(
                "webhook returned response.patch but not response.patchType".into(),
            ));
        }
        (true, false) => {
            return Err(Invalid::Response(
                "webhook returned response.patchType but not response.patch".into(),
            ));
        }
        _ => {}
    }
    if !patch_type.is_empty() && patch_type != "JSONPatch" {
        return Err(Invalid::Response(format!(
            "invalid response.patchType \"{patch_type}\", only JSONPatch is supported"
        )));
    }
    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        return Ok(Answer::Denied(response.get("status").cloned()));
    }
    if patch.is_empty() {
        return Ok(Answer::Allowed(None));
    }
    let ops: Value = serde_json::from_slice(&patch).map_err(|e| Invalid::Patch(e.to_string()))?;
    match ops {
        Value::Array(a) if a.is_empty() => Ok(Answer::Allowed(None)),
        Value::Array(_) => Ok(Answer::Allowed(Some(ops))),
        other => Err(Invalid::Patch(format!(
            "json: cannot unmarshal {} into Go value of type jsonpatch.Patch",
            match other {
                Value::Object(_) => "object",
                Value::String(_) => "string",
                Value::Number(_) => "number",
                Value::Bool(_) => "bool",
                _ => "value",
            }
        ))),
    }
}

// --- the HTTPS client ---------------------------------------------------------

/// The most of an answer read.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// POST `body` to the webhook of `client_config`; the 2xx answer's body, or
/// why not, worded as kube's `ErrCallingWebhook` reasons.
async fn post(
    client_config: Option<&Value>,
    timeout: Duration,
    body: Vec<u8>,
) -> Result<Vec<u8>, String> {
    let cc = client_config.cloned().unwrap_or(Value::Null);
    let secs = timeout.as_secs();
    let Some(url) = cc.get("url").and_then(Value::as_str) else {
        let svc = cc.get("service").cloned().unwrap_or(Value::Null);
        let s = |k: &str| {
            svc.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let port = svc.get("port").and_then(Value::as_i64).unwrap_or(443);
        return Err(format!(
            "failed to call webhook: Post \"https://{}.{}.svc:{port}{}?timeout={secs}s\": service references are not reachable from this test API server (give clientConfig.url)",
            s("name"),
            s("namespace"),
            s("path"),
        ));
    };
    let tls = tls_config(cc.get("caBundle").and_then(Value::as_str))
        .map_err(|e| format!("could not get REST client: {e}"))?;
    let mut url = url::Url::parse(url)
        .map_err(|e| format!("could not get REST client: invalid URL {url:?}: {e}"))?;
    url.set_query(Some(&format!("timeout={secs}s")));
    let shown = url.to_string();
    let call = send(&url, tls, body);
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(why)) => Err(format!("failed to call webhook: {why}")),
        Err(_) => Err(format!(
            "failed to call webhook: Post \"{shown}\": context deadline exceeded"
        )),
    }
}

/// A rustls client configuration trusting only the PEM certificates of
/// `ca_bundle` (base64, as the API carries it).
fn tls_config(ca_bundle: Option<&str>) -> Result<rustls::ClientConfig, String> {
    const NOT_PEM: &str = "unable to load root certificates: unable to parse bytes as PEM block";
    let mut roots = rustls::RootCertStore::empty();
    if let Some(b) = ca_bundle.filter(|b| !b.is_empty()) {
        let pem = B64.decode(b).map_err(|_| NOT_PEM.to_string())?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .map_err(|_| NOT_PEM.to_string())?;
        if certs.is_empty() {
            return Err(NOT_PEM.into());
        }
        for c in certs {
            roots
                .add(c)
                .map_err(|e| format!("unable to load root certificates: {e}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Go's wording of a TLS handshake error, where it has one.
fn tls_error(e: &std::io::Error) -> String {
    use rustls::CertificateError as C;
    let Some(r) = e.get_ref().and_then(|r| r.downcast_ref::<rustls::Error>()) else {
        return format!("tls: {e}");
    };
    let x509 = |why: &str| format!("tls: failed to verify certificate: x509: {why}");
    match r {
        rustls::Error::InvalidCertificate(C::UnknownIssuer) => {
            x509("certificate signed by unknown authority")
        }
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => x509("certificate is not valid for the requested host"),
        rustls::Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => x509("certificate has expired or is not yet valid"),
        other => format!("tls: {other}"),
    }
}

/// Connect, handshake and POST; errors are worded as Go's `net/http` client
/// words them (`Post "<url>": ...`).
async fn send(url: &url::Url, tls: rustls::ClientConfig, body: Vec<u8>) -> Result<Vec<u8>, String> {
    let shown = url.to_string();
    let fail = |why: String| format!("Post \"{shown}\": {why}");
    if url.scheme() != "https" {
        return Err(fail(format!(
            "unsupported protocol scheme {:?}",
            url.scheme()
        )));
    }
    let host = url.host_str().unwrap_or_default();
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = url.port_or_known_default().unwrap_or(443);
    let addr = if bare.contains(':') {
        format!("[{bare}]:{port}")
    } else {
        format!("{bare}:{port}")
    };
    let tcp = tokio::net::TcpStream::connect((bare.as_str(), port))
        .await
        .map_err(|e| {
            let why = match e.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                _ => e.to_string(),
            };
            fail(format!("dial tcp {addr}: connect: {why}"))
        })?;
    let _ = tcp.set_nodelay(true);
    let server_name = ServerName::try_from(bare.clone())
        .map_err(|e| fail(format!("invalid server name {bare:?}: {e}")))?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(server_name, tcp)
        .await
        .map_err(|e| fail(tls_error(&e)))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| fail(e.to_string()))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let authority = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let req = hyper::Request::post(path)
        .header(HOST, authority)
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json, */*")
        .header(USER_AGENT, "kube-apiserver-admission")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| fail(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let status = resp.status().as_u16();
    let text_response = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/"));
    let answer = Limited::new(resp.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| fail(e.to_string()))?
        .to_bytes()
        .to_vec();
    driver.abort();
    if (200..=206).contains(&status) {
        return Ok(answer);
    }
    Err(unsuccessful(status, &answer, text_response))
}

/// client-go's error for a response that is not a success: the message of
/// a `Status` body, else its generic message for the code.
fn unsuccessful(code: u16, body: &[u8], text: bool) -> String {
    if let Ok(status) = serde_json::from_slice::<Value>(body)
        && status.get("kind").and_then(Value::as_str) == Some("Status")
        && let Some(m) = status.get("message").and_then(Value::as_str)
    {
        return m.to_string();
    }
    let server_message = if text || serde_json::from_slice::<Value>(body).is_err() {
        String::from_utf8_lossy(body).trim().to_string()
    } else {
        "unknown".to_string()
    };
    match code {
        400 => "the server rejected our request for an unknown reason".into(),
        401 => "the server has asked for the client to provide credentials".into(),
        403 => server_message,
        404 => "the server could not find the requested resource".into(),
        405 => "the server does not allow this method on the requested resource".into(),
        409 => "the server reported a conflict".into(),
        422 => "the server rejected our request due to an error in our request".into(),
        429 => "the server has received too many requests and has asked us to try again later"
            .into(),
        503 => "the server is currently unable to handle the request".into(),
        504 => "the server was unable to return a response in the time allotted, but may still be processing the request".into(),
        c if c >= 500 => format!(
            "an error on the server ({server_message:?}) has prevented the request from succeeding"
        ),
        c => format!("the server responded with the status code {c} but did not return more information"),
    }
}

// --- the configurations ---------------------------------------------------------

/// kube's defaults for `admissionregistration.k8s.io/v1` mutating webhooks,
/// applied on every write of a configuration.
pub fn configuration_defaults(obj: &mut Value) {
    let Some(hooks) = obj.get_mut("webhooks").and_then(Value::as_array_mut) else {
        return;
    };
    for hook in hooks.iter_mut().filter_map(Value::as_object_mut) {
        hook.entry("failurePolicy").or_insert(json!("Fail"));
        hook.entry("matchPolicy").or_insert(json!("Equivalent"));
        hook.entry("namespaceSelector").or_insert(json!({}));
        hook.entry("objectSelector").or_insert(json!({}));
        hook.entry("timeoutSeconds")
            .or_insert(json!(DEFAULT_TIMEOUT_SECONDS));
        hook.entry("reinvocationPolicy").or_insert(json!("Never"));
        for k in [
            "failurePolicy",
            "matchPolicy",
            "namespaceSelector",
            "objectSelector",
        ] {
            if hook.get(k).is_some_and(Value::is_null) {
                hook.remove(k);
            }
        }
        if let Some(rules) = hook.get_mut("rules").and_then(Value::as_array_mut) {
            for rule in rules.iter_mut().filter_map(Value::as_object_mut) {
                rule.entry("scope").or_insert(json!("*"));
            }
        }
        if let Some(svc) = hook
            .get_mut("clientConfig")
            .and_then(|c| c.get_mut("service"))
            .and_then(Value::as_object_mut)
        {
            svc.entry("port").or_insert(json!(443));
        }
    }
}

fn cause(reason: &'static str, field: String, message: String) -> Cause {
    Cause {
        reason,
        message,
        field,
    }
}

fn required(field: String, detail: &str) -> Cause {
    let message = if detail.is_empty() {
        "Required value".to_string()
    } else {
        format!("Required value: {detail}")
    };
    cause("FieldValueRequired", field, message)
}

/// A value as Go's `%#v` shows it in kube's field errors.
fn go_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => format!(
            "[]string{{{}}}",
            a.iter().map(go_value).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

fn invalid(field: String, value: &Value, why: &str) -> Cause {
    cause(
        "FieldValueInvalid",
        field,
        format!("Invalid value: {}: {why}", go_value(value)),
    )
}

fn not_supported(field: String, value: &Value, supported: &[&str]) -> Cause {
    let list = supported
        .iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    cause(
        "FieldValueNotSupported",
        field,
        format!(
            "Unsupported value: {}: supported values: {list}",
            go_value(value)
        ),
    )
}

/// kube-apiserver's `ValidateMutatingWebhookConfiguration` (for a create;
/// an update is held to the same rules), for the fields this server reads.
pub fn validate_configuration(obj: &Value, causes: &mut Vec<Cause>) {
    let mut names: Vec<&str> = Vec::new();
    let hooks = obj
        .get("webhooks")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (i, hook) in hooks.iter().enumerate() {
        let path = format!("webhooks[{i}]");
        let field = |f: &str| format!("{path}.{f}");
        let get = |f: &str| hook.get(f).filter(|v| !v.is_null());
        // The name: a fully qualified domain name, unique in the list.
        let name = get("name").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() {
            causes.push(required(field("name"), ""));
        } else if !is_dns_subdomain(name) {
            causes.push(invalid(field("name"), &json!(name), SUBDOMAIN_MSG));
        } else if name.split('.').count() < 3 {
            causes.push(invalid(
                field("name"),
                &json!(name),
                "should be a domain with at least three segments separated by dots",
            ));
        }
        if !name.is_empty() {
            if names.contains(&name) {
                causes.push(cause(
                    "FieldValueDuplicate",
                    field("name"),
                    format!("Duplicate value: {name:?}"),
                ));
            } else {
                names.push(name);
            }
        }
        for (j, rule) in get("rules")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            validate_rule(rule, &format!("{path}.rules[{j}]"), causes);
        }
        let one_of = |f: &str, supported: &[&str], causes: &mut Vec<Cause>| {
            if let Some(v) = get(f)
                && !v.as_str().is_some_and(|s| supported.contains(&s))
            {
                causes.push(not_supported(field(f), v, supported));
            }
        };
        one_of("failurePolicy", &["Fail", "Ignore"], causes);
        one_of("matchPolicy", &["Equivalent", "Exact"], causes);
        one_of("reinvocationPolicy", &["IfNeeded", "Never"], causes);
        match get("sideEffects") {
            None => causes.push(required(
                field("sideEffects"),
                "must specify one of None, NoneOnDryRun",
            )),
            Some(_) => one_of("sideEffects", &["None", "NoneOnDryRun"], causes),
        }
        if let Some(t) = get("timeoutSeconds")
            && !t.as_i64().is_some_and(|t| (1..=30).contains(&t))
        {
            causes.push(invalid(
                field("timeoutSeconds"),
                t,
                "the timeout value must be between 1 and 30 seconds",
            ));
        }
        for sel in ["namespaceSelector", "objectSelector"] {
            if let Err(e) = LabelSelector::from_object(get(sel)) {
                causes.push(cause(
                    "FieldValueInvalid",
                    field(sel),
                    format!(
                        "Invalid value: {}: {e}",
                        get(sel).map_or("null".into(), Value::to_string)
                    ),
                ));
            }
        }
        validate_client_config(get("clientConfig"), &field("clientConfig"), causes);
        validate_review_versions(
            get("admissionReviewVersions"),
            &field("admissionReviewVersions"),
            causes,
        );
    }
}

fn validate_rule(rule: &Value, path: &str, causes: &mut Vec<Cause>) {
    let field = |f: &str| format!("{path}.{f}");
    let list = |f: &str| -> Vec<Value> {
        rule.get(f)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let has_wildcard = |l: &[Value]| l.iter().any(|v| v == "*");
    let ops = list("operations");
    if ops.is_empty() {
        causes.push(required(field("operations"), ""));
    }
    if ops.len() > 1 && has_wildcard(&ops) {
        causes.push(invalid(
            field("operations"),
            &json!(ops),
            "if '*' is present, must not specify other operations",
        ));
    }
    for (k, op) in ops.iter().enumerate() {
        let supported = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
        if !op.as_str().is_some_and(|o| supported.contains(&o)) {
            causes.push(not_supported(
                format!("{path}.operations[{k}]"),
                op,
                &supported,
            ));
        }
    }
    for (f, what) in [("apiGroups", "API groups"), ("apiVersions", "API versions")] {
        let l = list(f);
        if l.is_empty() {
            causes.push(required(field(f), ""));
        }
        if l.len() > 1 && has_wildcard(&l) {
            causes.push(invalid(
                field(f),
                &json!(l),
                &format!("if '*' is present, must not specify other {what}"),
            ));
        }
    }
    for (k, v) in list("apiVersions").iter().enumerate() {
        if v.as_str().is_none_or(str::is_empty) {
            causes.push(required(format!("{path}.apiVersions[{k}]"), ""));
        }
    }
    let resources = list("resources");
    if resources.is_empty() {
        causes.push(required(field("resources"), ""));
    }
    for (k, r) in resources.iter().enumerate() {
        if r.as_str().is_none_or(str::is_empty) {
            causes.push(required(format!("{path}.resources[{k}]"), ""));
        }
    }
    if resources.len() > 1 && resources.iter().any(|r| r == "*/*") {
        causes.push(invalid(
            field("resources"),
            &json!(resources),
            "if '*/*' is present, must not specify other resources",
        ));
    }
    if resources.iter().any(|r| r == "*")
        && resources
            .iter()
            .filter_map(Value::as_str)
            .any(|r| r != "*" && !r.contains('/'))
    {
        causes.push(invalid(
            field("resources"),
            &json!(resources),
            "if '*' is present, must not specify other resources without subresources",
        ));
    }
    if let Some(s) = rule.get("scope").filter(|s| !s.is_null()) {
        let supported = ["*", "Cluster", "Namespaced"];
        if !s.as_str().is_some_and(|v| supported.contains(&v)) {
            causes.push(not_supported(field("scope"), s, &supported));
        }
    }
}

fn validate_client_config(cc: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
    let get = |f: &str| cc.and_then(|c| c.get(f)).filter(|v| !v.is_null());
    match (get("url"), get("service")) {
        (Some(_), Some(_)) | (None, None) => {
            causes.push(required(
                path.to_string(),
                "exactly one of url or service is required",
            ));
        }
        (Some(url), None) => {
            let field = format!("{path}.url");
            let form = "; desired format: https://host[/path]";
            let text = url.as_str().unwrap_or_default();
            match url::Url::parse(text) {
                Err(e) => causes.push(required(
                    field,
                    &format!("url must be a valid URL: {e}{form}"),
                )),
                Ok(u) => {
                    if u.scheme() != "https" {
                        causes.push(invalid(
                            field.clone(),
                            &json!(u.scheme()),
                            &format!("'https' is the only allowed URL scheme{form}"),
                        ));
                    }
                    if u.host_str().is_none_or(str::is_empty) {
                        causes.push(invalid(
                            field.clone(),
                            &json!(""),
                            &format!("host must be specified{form}"),
                        ));
                    }
                    if !u.username().is_empty() || u.password().is_some() {
                        causes.push(invalid(
                            field.clone(),
                            &json!(u.username()),
                            "user information is not permitted in the URL",
                        ));
                    }
                    if let Some(f) = u.fragment() {
                        causes.push(invalid(
                            field.clone(),
                            &json!(f),
                            "fragments are not permitted in the URL",
                        ));
                    }
                    if let Some(q) = u.query() {
                        causes.push(invalid(
                            field,
                            &json!(q),
                            "query parameters are not permitted in the URL",
                        ));
                    }
                }
            }
        }
        (None, Some(svc)) => {
            let field = |f: &str| format!("{path}.service.{f}");
            let s = |f: &str| svc.get(f).and_then(Value::as_str).unwrap_or_default();
            if s("name").is_empty() {
                causes.push(required(field("name"), "service name is required"));
            }
            if s("namespace").is_empty() {
                causes.push(required(
                    field("namespace"),
                    "service namespace is required",
                ));
            }
            if let Some(p) = svc.get("port").filter(|p| !p.is_null())
                && !p.as_i64().is_some_and(|p| (1..=65535).contains(&p))
            {
                causes.push(invalid(
                    field("port"),
                    p,
                    "port is not valid: must be between 1 and 65535, inclusive",
                ));
            }
        }
    }
}

fn validate_review_versions(versions: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
    let versions: Vec<Value> = versions
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        causes.push(required(
            path.to_string(),
            "must specify one of v1, v1beta1",
        ));
        return;
    }
    let mut seen = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let s = v.as_str().unwrap_or_default();
        if seen.contains(&s) {
            causes.push(invalid(format!("{path}[{i}]"), v, "duplicate version"));
            continue;
        }
        seen.push(s);
    }
    if !seen.iter().any(|v| *v == "v1" || *v == "v1beta1") {
        causes.push(invalid(
            path.to_string(),
            &json!(versions),
            "must include at least one of v1, v1beta1",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(
        rt: &'static ResourceType,
        ns: &'static str,
        sub: Option<&'static str>,
    ) -> Attributes<'static> {
        Attributes {
            operation: Operation::Update,
            rt,
            subresource: sub,
            namespace: ns,
            name: "x",
            dry_run: false,
            options_kind: "UpdateOptions",
            field_manager: None,
        }
    }

    #[test]
    fn rules_match_as_kube_matches_them() {
        let deploy = &resources::RESOURCES[resources::lookup("apps", "v1", "deployments").unwrap()];
        let ns = &resources::RESOURCES[resources::namespaces_id()];
        let rule = |resources: Value, scope: &str| json!({"operations": ["UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": resources, "scope": scope});
        let main = attr(deploy, "default", None);
        let status = attr(deploy, "default", Some("status"));
        assert!(rule_matches(&rule(json!(["deployments"]), "*"), &main));
        assert!(!rule_matches(&rule(json!(["deployments"]), "*"), &status));
        assert!(rule_matches(
            &rule(json!(["deployments/status"]), "*"),
            &status
        ));
        assert!(rule_matches(&rule(json!(["*"]), "Namespaced"), &main));
        assert!(!rule_matches(&rule(json!(["*"]), "*"), &status));
        assert!(rule_matches(&rule(json!(["*/*"]), "*"), &status));
        assert!(rule_matches(&rule(json!(["deployments/*"]), "*"), &main));
        assert!(!rule_matches(
            &rule(json!(["deployments"]), "Cluster"),
            &main
        ));
        let mut create = attr(deploy, "default", None);
        create.operation = Operation::Create;
        assert!(!rule_matches(&rule(json!(["deployments"]), "*"), &create));
        let ns_rule = json!({"operations": ["*"], "apiGroups": [""], "apiVersions": ["*"], "resources": ["namespaces"], "scope": "Namespaced"});
        assert!(!rule_matches(&ns_rule, &attr(ns, "x", None)));
    }

    /// `response.patch` as kube documents it (base64) or as Go also reads
    /// a `[]byte` (an array of numbers, what kube-rs writes).
    #[test]
    fn a_patch_is_read_from_base64_or_from_an_array_of_bytes() {
        let ops = br#"[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]"#;
        let review = |patch: Value| {
            serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": "u", "allowed": true, "patchType": "JSONPatch", "patch": patch}}))
            .unwrap()
        };
        let want = serde_json::from_slice::<Value>(ops).unwrap();
        for patch in [json!(B64.encode(ops)), json!(ops.to_vec())] {
            match verify(&review(patch.clone()), "admission.k8s.io/v1", "u") {
                Ok(Answer::Allowed(Some(got))) => assert_eq!(got, want, "{patch}"),
                _ => panic!("{patch}: not read"),
            }
        }
        assert!(verify(&review(json!([1, 256])), "admission.k8s.io/v1", "u").is_err());
    }

    #[test]
    fn denials_read_like_kube_1_32() {
        let e = denial("a.b.c", None);
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "admission webhook \"a.b.c\" denied the request without explanation"
        );
        let e = denial(
            "a.b.c",
            Some(json!({"code": 403, "reason": "Forbidden", "message": "no"})),
        );
        assert_eq!((e.code, e.reason.as_ref()), (403, "Forbidden"));
        assert_eq!(
            e.message,
            "admission webhook \"a.b.c\" denied the request: no"
        );
        let e = denial(
            "a.b.c",
            Some(json!({"code": 200, "reason": "just because"})),
        );
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "admission webhook \"a.b.c\" denied the request: just because"
        );
    }
}
