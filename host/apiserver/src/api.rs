//! The resource verbs: get, list, watch, create, replace, patch, delete and
//! deletecollection, on top of the store. Updates follow kube-apiserver's
//! "guaranteed update" loop: read the current object, compute the new one
//! outside the lock, commit only if the object is still at the version that
//! was read, else retry (or answer 409 when the client gave a version).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use bytes::Bytes;
use serde_json::{Value, json};

use crate::Shared;
use crate::error::{ApiError, Cause};
use crate::objects;
use crate::patch::{self, PatchType};
use crate::resources::{RESOURCES, ResourceId, ResourceType};
use crate::selector::{FieldSelector, LabelSelector, Selectors};
use crate::store::{Key, StoreError, rv_of};
use crate::table::{self, TableRequest};
use crate::watch::{self, StartAt, WatchRequest};

/// A request's target: resource, namespace, optional name and subresource.
#[derive(Debug, Clone)]
pub struct Target {
    pub resource: ResourceId,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl Target {
    pub fn rt(&self) -> &'static ResourceType {
        &RESOURCES[self.resource]
    }

    fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }

    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }

    fn is_status(&self) -> bool {
        self.subresource.as_deref() == Some("status")
    }
}

/// Query parameters, decoded.
pub type Query = HashMap<String, String>;

/// What a verb answers: a JSON document or a watch stream.
pub enum Reply {
    Json(u16, Value),
    /// A stored object, serialised without copying it.
    Stored(u16, Arc<Value>),
    /// A JSON document already serialised.
    Raw(u16, Bytes),
    Watch(watch::Chunks),
}

fn store_err(t: &Target, e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound => ApiError::not_found(t.rt(), t.name()),
        StoreError::AlreadyExists => ApiError::already_exists(t.rt(), t.name()),
        StoreError::Changed => ApiError::conflict(t.rt(), t.name()),
        StoreError::NamespaceNotFound(ns) => {
            ApiError::not_found(&RESOURCES[crate::resources::namespaces_id()], &ns)
        }
        StoreError::NamespaceTerminating(ns) => ApiError {
            code: 403,
            reason: "Forbidden",
            message: format!(
                "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                t.rt().qualified(),
                t.name()
            ),
            details: None,
            retry_after: None,
        },
    }
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))
}

fn dry_run(q: &Query) -> bool {
    q.get("dryRun").is_some_and(|v| v == "All")
}

/// kube-apiserver's checks of list and watch options (422 Invalid
/// `ListOptions.meta.k8s.io`), for the parameters this server serves.
fn check_list_options(q: &Query, watch: bool) -> Result<(), ApiError> {
    let get = |k: &str| q.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let (rv, rv_match, cont) = (
        get("resourceVersion"),
        get("resourceVersionMatch"),
        get("continue"),
    );
    let send_initial = q.get("sendInitialEvents");
    let forbidden = |field: &str, why: String| Cause {
        reason: "FieldValueForbidden",
        message: format!("Forbidden: {why}"),
        field: field.into(),
    };
    let not_supported = |m: &str, supported: &str| Cause {
        reason: "FieldValueNotSupported",
        message: format!("Unsupported value: \"{m}\": supported values: {supported}"),
        field: "resourceVersionMatch".into(),
    };
    let mut causes = Vec::new();
    if watch {
        if send_initial.is_some() && rv_match != Some("NotOlderThan") {
            causes.push(forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".into(),
            ));
        }
        if let Some(m) = rv_match {
            if send_initial.is_none() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided".into(),
                ));
            }
            if m != "NotOlderThan" {
                causes.push(not_supported(m, "\"NotOlderThan\""));
            }
            if cont.is_some() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided".into(),
                ));
            }
        }
    } else {
        if let Some(m) = rv_match {
            if rv.is_none() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
                ));
            }
            if cont.is_some() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided".into(),
                ));
            }
            if m != "Exact" && m != "NotOlderThan" {
                causes.push(not_supported(m, "\"Exact\", \"NotOlderThan\", \"\""));
            }
            if m == "Exact" && rv == Some("0") {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into(),
                ));
            }
        }
        if send_initial.is_some() {
            causes.push(forbidden(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for list".into(),
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_kind("meta.k8s.io", "ListOptions", "", causes))
    }
}

fn selectors(rt: &ResourceType, q: &Query, name: Option<&str>) -> Result<Selectors, ApiError> {
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?;
    let mut field = q.get("fieldSelector").cloned().unwrap_or_default();
    if let Some(n) = name {
        if !field.is_empty() {
            field.push(',');
        }
        field.push_str(&format!("metadata.name={n}"));
    }
    let fields = FieldSelector::parse(&field, rt)?;
    Ok(Selectors { labels, fields })
}

/// Parse a request body by its media type: JSON, YAML or Kubernetes
/// protobuf (decoded by [`crate::protobuf`]); anything else is 415.
pub fn parse_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match media.as_str() {
        "application/vnd.kubernetes.protobuf" => crate::protobuf::decode(body),
        "application/yaml" | "application/x-yaml" | "text/yaml" => parse_yaml(body),
        _ if content_type.contains("protobuf") || content_type.contains("cbor") => {
            Err(ApiError::unsupported_media_type(content_type))
        }
        _ if content_type.contains("yaml") => parse_yaml(body),
        _ => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        }),
    }
}

fn parse_yaml(body: &[u8]) -> Result<Value, ApiError> {
    serde_yaml::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

pub fn get(sh: &Shared, t: &Target, table: Option<TableRequest>) -> Result<Reply, ApiError> {
    match sh.store.get(t.resource, t.ns(), t.name()) {
        Some(o) => Ok(match table {
            None => Reply::Stored(200, o),
            Some(req) => Reply::Json(200, table::object(t.rt(), &o, req, true)),
        }),
        None => Err(ApiError::not_found(t.rt(), t.name())),
    }
}

/// The object a write is about to change: 404 if it is missing, or the
/// injected 409 if a conflict was forced on it.
fn current_for_write(sh: &Shared, t: &Target) -> Result<std::sync::Arc<Value>, ApiError> {
    let rt = t.rt();
    let cur = sh
        .store
        .get(t.resource, t.ns(), t.name())
        .ok_or_else(|| ApiError::not_found(rt, t.name()))?;
    if sh.faults.take_conflict(rt.plural, t.ns(), t.name()) {
        return Err(ApiError::conflict(rt, t.name()));
    }
    Ok(cur)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    start: (String, String),
}

fn encode_continue(rv: u64, start: &Key) -> String {
    let tok = ContinueToken {
        v: "meta.k8s.io/v1".into(),
        rv,
        start: start.clone(),
    };
    B64.encode(serde_json::to_vec(&tok).expect("serialisable"))
}

fn decode_continue(s: &str) -> Result<ContinueToken, ApiError> {
    B64.decode(s)
        .ok()
        .and_then(|b| serde_json::from_slice::<ContinueToken>(&b).ok())
        .ok_or_else(|| ApiError::bad_request("continue key is not valid: invalid token"))
}

pub fn list(
    sh: &Shared,
    t: &Target,
    q: &Query,
    table: Option<TableRequest>,
) -> Result<Reply, ApiError> {
    let rt = t.rt();
    check_list_options(q, false)?;
    let sel = selectors(rt, q, None)?;
    let rv_param = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let rv_match = q
        .get("resourceVersionMatch")
        .map(String::as_str)
        .unwrap_or("");
    let limit: usize = match q.get("limit").map(String::as_str) {
        None | Some("") => 0,
        Some(l) => l
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?
            .max(0) as usize,
    };
    let mut start_after: Option<Key> = None;
    let mut at: Option<u64> = None;
    let mut not_older_than: Option<u64> = None;
    if let Some(c) = q.get("continue").filter(|c| !c.is_empty()) {
        if !rv_param.is_empty() && rv_param != "0" {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let tok = decode_continue(c)?;
        at = Some(tok.rv);
        start_after = Some(tok.start);
    } else {
        match (rv_param, rv_match) {
            ("", "") => {}
            ("", m) => {
                return Err(ApiError::bad_request(format!(
                    "resourceVersionMatch \"{m}\" is forbidden unless resourceVersion is provided"
                )));
            }
            ("0", "Exact") => {
                return Err(ApiError::bad_request(
                    "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
            (v, "Exact") => at = Some(parse_rv(v)?),
            (v, "" | "NotOlderThan") => not_older_than = Some(parse_rv(v)?),
            (_, m) => {
                return Err(ApiError::bad_request(format!(
                    "unknown resourceVersionMatch value: {m}"
                )));
            }
        }
    }
    let ns = t.namespace.as_deref();
    let (items, rv) = match sh.store.list(t.resource, ns, at) {
        Err(e) if e.code == 410 && start_after.is_some() => {
            return Err(ApiError::continue_expired());
        }
        r => r?,
    };
    if let Some(n) = not_older_than
        && n > rv
    {
        return Err(ApiError::too_large_rv(n, rv));
    }
    let filtered = !sel.labels.is_empty() || !sel.fields.is_empty();
    let mut iter = items
        .iter()
        .filter(|(k, _)| start_after.as_ref().is_none_or(|s| k > s))
        .filter(|(_, o)| !filtered || sel.matches(o));
    let mut page: Vec<&(Key, Arc<Value>)> = Vec::new();
    let mut more = false;
    for it in iter.by_ref() {
        if limit > 0 && page.len() == limit {
            more = true;
            break;
        }
        page.push(it);
    }
    let mut meta = json!({ "resourceVersion": rv.to_string() });
    if more {
        let last = &page.last().expect("limit > 0").0;
        meta["continue"] = json!(encode_continue(rv, last));
        if !filtered {
            meta["remainingItemCount"] = json!(1 + iter.count());
        }
    }
    if let Some(req) = table {
        let items = page.iter().map(|(_, o)| o.as_ref());
        return Ok(Reply::Json(200, table::list(rt, items, meta, req)));
    }
    // Serialise by hand to avoid deep-cloning every item.
    let mut buf = Vec::with_capacity(128 + page.len() * 512);
    buf.extend_from_slice(b"{\"kind\":");
    serde_json::to_writer(&mut buf, &format!("{}List", rt.kind)).expect("string");
    buf.extend_from_slice(b",\"apiVersion\":");
    serde_json::to_writer(&mut buf, &rt.api_version()).expect("string");
    buf.extend_from_slice(b",\"metadata\":");
    serde_json::to_writer(&mut buf, &meta).expect("value");
    buf.extend_from_slice(b",\"items\":[");
    for (i, (_, o)) in page.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        serde_json::to_writer(&mut buf, o.as_ref()).expect("value");
    }
    buf.extend_from_slice(b"]}");
    Ok(Reply::Raw(200, Bytes::from(buf)))
}

pub fn watch(
    sh: &Shared,
    t: &Target,
    q: &Query,
    table: Option<TableRequest>,
) -> Result<Reply, ApiError> {
    let rt = t.rt();
    check_list_options(q, true)?;
    let sel = selectors(rt, q, t.name.as_deref())?;
    let flag = |k: &str| q.get(k).is_some_and(|v| v == "true" || v == "1");
    let rv_param = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let send_initial = q.get("sendInitialEvents").map(String::as_str);
    let start = match (send_initial, rv_param) {
        (Some("true"), _) => StartAt::Current,
        (Some("false"), "" | "0") => StartAt::CurrentNoInitial,
        (_, "" | "0") => StartAt::Current,
        (_, v) => StartAt::After(parse_rv(v)?),
    };
    let timeout = match q.get("timeoutSeconds").map(String::as_str) {
        None | Some("") => None,
        Some(s) => Some(Duration::from_secs(s.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds {s:?}"))
        })?)),
    };
    let req = WatchRequest {
        resource: t.resource,
        namespace: t.namespace.clone(),
        selectors: sel,
        start,
        bookmarks: flag("allowWatchBookmarks"),
        initial_events_end: send_initial == Some("true"),
        timeout,
        table,
    };
    let from = match start {
        StartAt::After(n) => Some(n),
        _ => None,
    };
    let close = sh.faults.watch_close_rx();
    match sh.store.watch(t.resource, from) {
        Ok(mut ws) => {
            if start == StartAt::CurrentNoInitial {
                ws.initial.clear();
            }
            Ok(Reply::Watch(watch::stream(
                req,
                ws,
                sh.config.bookmark_interval,
                close,
            )))
        }
        Err(e) => Ok(Reply::Watch(watch::error_stream(&e))),
    }
}

pub fn create(sh: &Shared, t: &Target, q: &Query, body: Value) -> Result<Reply, ApiError> {
    let rt = t.rt();
    if rt.namespaced && t.namespace.is_none() {
        return Err(ApiError::method_not_allowed());
    }
    let (name, obj) = objects::prepare_create(rt, t.ns(), body)?;
    let t = Target {
        name: Some(name.clone()),
        ..t.clone()
    };
    if dry_run(q) {
        if sh.store.get(t.resource, t.ns(), &name).is_some() {
            return Err(ApiError::already_exists(rt, &name));
        }
        return Ok(Reply::Json(201, obj));
    }
    let stored = sh
        .store
        .create(t.resource, t.ns(), &name, obj)
        .map_err(|e| store_err(&t, e))?;
    Ok(Reply::Stored(201, stored))
}

/// The shared update loop behind PUT and PATCH.
fn update_with(
    sh: &Shared,
    t: &Target,
    q: &Query,
    mut compute: impl FnMut(&Value) -> Result<Value, ApiError>,
    client_rv: bool,
) -> Result<Reply, ApiError> {
    let rt = t.rt();
    loop {
        let cur = current_for_write(sh, t)?;
        let cur_rv = rv_of(&cur);
        let desired = compute(&cur)?;
        let mut new = if t.is_status() {
            objects::prepare_status_update(rt, &cur, &desired)?
        } else {
            objects::prepare_update(rt, t.ns(), t.name(), &cur, desired)?
        };
        new["metadata"]["resourceVersion"] = json!(cur_rv.to_string());
        if new == *cur || dry_run(q) {
            return Ok(Reply::Json(200, new));
        }
        match sh.store.update(t.resource, t.ns(), t.name(), cur_rv, new) {
            Ok(o) => return Ok(Reply::Stored(200, o)),
            Err(StoreError::Changed) if !client_rv => continue,
            Err(e) => return Err(store_err(t, e)),
        }
    }
}

pub fn replace(sh: &Shared, t: &Target, q: &Query, body: Value) -> Result<Reply, ApiError> {
    let rt = t.rt();
    if sh
        .faults
        .take_replace_failure(rt.plural, t.ns(), t.name(), &body)
    {
        return Err(ApiError::internal("injected fault"));
    }
    let wanted = body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(parse_rv)
        .transpose()?;
    // Kinds whose strategy allows create-on-update (Lease, Service, Event):
    // a PUT of a missing name creates it, whatever version it carries.
    if rt.allows_create_on_update() && !t.is_status() {
        while sh.store.get(t.resource, t.ns(), t.name()).is_none() {
            let mut body = body.clone();
            if let Some(name) = body.pointer("/metadata/name").and_then(Value::as_str)
                && name != t.name()
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({name}) does not match the name on the URL ({})",
                    t.name()
                )));
            }
            if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("resourceVersion");
                meta.insert("name".into(), json!(t.name()));
            } else if body.is_object() {
                body["metadata"] = json!({ "name": t.name() });
            }
            match create(sh, t, q, body) {
                Err(e) if e.code == 409 => continue,
                r => return r,
            }
        }
    }
    if wanted.is_none() && !rt.allows_unconditional_update() {
        return Err(ApiError::invalid(
            rt,
            t.name(),
            vec![Cause {
                reason: "FieldValueInvalid",
                message: "Invalid value: 0x0: must be specified for an update".into(),
                field: "metadata.resourceVersion".into(),
            }],
        ));
    }
    update_with(
        sh,
        t,
        q,
        |cur| {
            if wanted.is_some_and(|w| w != rv_of(cur)) {
                return Err(ApiError::conflict(rt, t.name()));
            }
            Ok(body.clone())
        },
        wanted.is_some(),
    )
}

pub fn patch(
    sh: &Shared,
    t: &Target,
    q: &Query,
    ty: PatchType,
    body: Value,
) -> Result<Reply, ApiError> {
    let rt = t.rt();
    update_with(
        sh,
        t,
        q,
        |cur| {
            let patched = patch::apply(ty, cur, &body)?;
            match patched
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
            {
                Some(v) if !v.is_empty() && parse_rv(v)? != rv_of(cur) => {
                    Err(ApiError::conflict(rt, t.name()))
                }
                _ => Ok(patched),
            }
        },
        false,
    )
}

/// A label selector as the string form `Scale.status.selector` carries.
fn selector_string(sel: Option<&Value>) -> String {
    let mut parts = Vec::new();
    let Some(sel) = sel else {
        return String::new();
    };
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            parts.push(format!("{k}={}", v.as_str().unwrap_or_default()));
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match e.get("operator").and_then(Value::as_str) {
            Some("In") => format!("{key} in ({})", values.join(",")),
            Some("NotIn") => format!("{key} notin ({})", values.join(",")),
            Some("DoesNotExist") => format!("!{key}"),
            _ => key.to_string(),
        });
    }
    parts.join(",")
}

/// The `autoscaling/v1` Scale of a workload (its `/scale` subresource).
fn scale_of(obj: &Value) -> Value {
    let meta = |k: &str| obj.pointer(&format!("/metadata/{k}")).cloned();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta("name"),
            "namespace": meta("namespace"),
            "uid": meta("uid"),
            "resourceVersion": meta("resourceVersion"),
            "creationTimestamp": meta("creationTimestamp"),
        },
        "spec": { "replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(0)) },
        "status": {
            "replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector_string(obj.pointer("/spec/selector")),
        },
    })
}

/// GET of `/scale`.
pub fn scale_get(sh: &Shared, t: &Target) -> Result<Reply, ApiError> {
    match sh.store.get(t.resource, t.ns(), t.name()) {
        Some(o) => Ok(Reply::Json(200, scale_of(&o))),
        None => Err(ApiError::not_found(t.rt(), t.name())),
    }
}

/// PUT (`patch` None) or PATCH of `/scale`: only `spec.replicas` reaches the
/// workload; a resourceVersion in the Scale is a precondition.
pub fn scale_update(
    sh: &Shared,
    t: &Target,
    q: &Query,
    body: Value,
    patch: Option<PatchType>,
) -> Result<Reply, ApiError> {
    let rt = t.rt();
    let main = Target {
        subresource: None,
        ..t.clone()
    };
    let client_rv = patch.is_none()
        && body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty());
    let reply = update_with(
        sh,
        &main,
        q,
        |cur| {
            let scale = scale_of(cur);
            let desired = match patch {
                Some(ty) => patch::apply(ty, &scale, &body)?,
                None => body.clone(),
            };
            serde_path_to_error::deserialize::<_, k8s_openapi::api::autoscaling::v1::Scale>(
                &desired,
            )
            .map_err(|e| {
                ApiError::bad_request(format!(
                    "Scale in version \"v1\" cannot be handled as a Scale: {}: {}",
                    e.path(),
                    e.inner()
                ))
            })?;
            if let Some(v) = desired
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
                && parse_rv(v)? != rv_of(cur)
            {
                return Err(ApiError::conflict(rt, t.name()));
            }
            let replicas = desired
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if replicas < 0 {
                return Err(ApiError::invalid_kind(
                    "autoscaling",
                    "Scale",
                    t.name(),
                    vec![Cause {
                        reason: "FieldValueInvalid",
                        message: format!(
                            "Invalid value: {replicas}: must be greater than or equal to 0"
                        ),
                        field: "spec.replicas".into(),
                    }],
                ));
            }
            let mut new = (*cur).clone();
            new["spec"]["replicas"] = json!(replicas);
            Ok(new)
        },
        client_rv,
    )?;
    Ok(match reply {
        Reply::Stored(code, o) => Reply::Json(code, scale_of(&o)),
        Reply::Json(code, o) => Reply::Json(code, scale_of(&o)),
        other => other,
    })
}

fn success_status(rt: &ResourceType, obj: &Value) -> Value {
    let mut details = json!({
        "name": obj.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
        "kind": rt.plural,
        "uid": obj.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
    });
    if !rt.group.is_empty() {
        details["group"] = json!(rt.group);
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}

/// Whether DELETE answers with the object (kube-apiserver does for kinds with
/// graceful deletion or a lifecycle) rather than a Success Status.
fn returns_object(rt: &ResourceType) -> bool {
    rt.group.is_empty() && matches!(rt.plural, "pods" | "namespaces")
}

pub fn delete(sh: &Shared, t: &Target, q: &Query, body: Option<Value>) -> Result<Reply, ApiError> {
    let rt = t.rt();
    let pre_uid = body
        .as_ref()
        .and_then(|b| b.pointer("/preconditions/uid"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let pre_rv = body
        .as_ref()
        .and_then(|b| b.pointer("/preconditions/resourceVersion"))
        .and_then(Value::as_str)
        .map(str::to_string);
    loop {
        let cur = current_for_write(sh, t)?;
        let uid = cur
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(p) = &pre_uid
            && p != uid
        {
            return Err(ApiError::conflict_msg(
                rt,
                t.name(),
                &format!(
                    "Precondition failed: UID in precondition: {p}, UID in object meta: {uid}"
                ),
            ));
        }
        let cur_rv = rv_of(&cur);
        if let Some(p) = &pre_rv
            && *p != cur_rv.to_string()
        {
            return Err(ApiError::conflict_msg(
                rt,
                t.name(),
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {p}, ResourceVersion in object meta: {cur_rv}"
                ),
            ));
        }
        if dry_run(q) {
            return Ok(Reply::Stored(200, cur));
        }
        let has_finalizers = cur
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let result = if has_finalizers {
            if cur.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(Reply::Stored(200, cur));
            }
            sh.store
                .update(
                    t.resource,
                    t.ns(),
                    t.name(),
                    cur_rv,
                    objects::mark_deleting(&cur),
                )
                .map(|o| (o, true))
        } else {
            sh.store
                .delete(t.resource, t.ns(), t.name(), Some(cur_rv))
                .map(|o| (o, false))
        };
        match result {
            Ok((o, pending)) => {
                return Ok(if pending || returns_object(rt) {
                    Reply::Stored(200, o)
                } else {
                    Reply::Json(200, success_status(rt, &o))
                });
            }
            Err(StoreError::Changed) => continue,
            Err(e) => return Err(store_err(t, e)),
        }
    }
}

pub fn delete_collection(sh: &Shared, t: &Target, q: &Query) -> Result<Reply, ApiError> {
    let rt = t.rt();
    let sel = selectors(rt, q, None)?;
    let (items, _) = sh.store.list(t.resource, t.namespace.as_deref(), None)?;
    let mut deleted = Vec::new();
    for (key, obj) in items.iter().filter(|(_, o)| sel.matches(o)) {
        let it = Target {
            namespace: if rt.namespaced {
                Some(key.0.clone())
            } else {
                None
            },
            name: Some(key.1.clone()),
            ..t.clone()
        };
        match delete(sh, &it, q, None) {
            Ok(_) => deleted.push((**obj).clone()),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Reply::Json(
        200,
        json!({
            "kind": format!("{}List", rt.kind),
            "apiVersion": rt.api_version(),
            "metadata": { "resourceVersion": sh.store.resource_version().to_string() },
            "items": deleted,
        }),
    ))
}
