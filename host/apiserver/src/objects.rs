//! What the server does to an object on its way into the store: server-set
//! metadata (uid, creationTimestamp, generation), per-kind defaults, Secret
//! `stringData`, status-subresource rules, and validation (422 Invalid).

use std::sync::atomic::{AtomicU32, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use rand::Rng as _;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, Cause};
use crate::resources::{NameRule, ResourceType};
use crate::validation;

/// Maximum total size of a ConfigMap's or Secret's data.
pub const MAX_DATA_BYTES: usize = 1024 * 1024;
/// Maximum total size of an object's annotations (keys plus values).
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// Now as a `metav1.Time` (RFC 3339, seconds).
pub fn now_time() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Normalise a `metav1.MicroTime` to RFC 3339 with exactly six fractional
/// digits, as kube-apiserver re-serialises it.
fn normalise_micro_time(v: &mut Value) -> Result<(), String> {
    let Some(s) = v.as_str() else {
        return Ok(());
    };
    let ts: jiff::Timestamp = s.parse().map_err(|e| format!("{e}"))?;
    *v = json!(ts.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string());
    Ok(())
}

/// A random RFC 4122 version 4 UID.
pub fn new_uid() -> String {
    let b: [u8; 16] = rand::rng().random();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        u16::from_be_bytes([b[4], b[5]]),
        u16::from_be_bytes([b[6], b[7]]) & 0x0fff,
        (u16::from_be_bytes([b[8], b[9]]) & 0x3fff) | 0x8000,
        u64::from_be_bytes([0, 0, b[10], b[11], b[12], b[13], b[14], b[15]]),
    )
}

fn generate_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A new, active Namespace object (without a resourceVersion).
pub fn new_namespace(name: &str) -> Value {
    json!({
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": new_uid(),
            "creationTimestamp": now_time(),
            "labels": { "kubernetes.io/metadata.name": name },
        },
        "spec": { "finalizers": ["kubernetes"] },
        "status": { "phase": "Active" },
    })
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("object")
}

fn str_at<'a>(obj: &'a Value, ptr: &str) -> Option<&'a str> {
    obj.pointer(ptr).and_then(Value::as_str)
}

/// Check the body's kind and apiVersion against the path, filling them in if absent.
fn check_type(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    let api_version = rt.api_version();
    match str_at(obj, "/apiVersion") {
        Some(v) if v != api_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
        _ => {}
    }
    match str_at(obj, "/kind") {
        Some(k) if k != rt.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                rt.kind
            )));
        }
        _ => {}
    }
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(rt.kind);
    Ok(())
}

fn check_namespace(rt: &ResourceType, obj: &mut Value, ns: &str) -> Result<(), ApiError> {
    let meta = meta_mut(obj);
    if rt.namespaced {
        match meta.get("namespace").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta.insert("namespace".into(), json!(ns));
            }
        }
    } else {
        meta.remove("namespace");
    }
    Ok(())
}

/// Merge Secret `stringData` into `data` (base64) and check `data` is base64.
fn normalise_secret(obj: &mut Value) -> Result<(), ApiError> {
    if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|o| o.remove("stringData")) {
        if !obj.get("data").is_some_and(Value::is_object) {
            obj["data"] = json!({});
        }
        let data = obj["data"].as_object_mut().expect("object");
        for (k, v) in sd {
            let s = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            data.insert(k, json!(B64.encode(s.as_bytes())));
        }
    }
    if let Some(Value::Object(data)) = obj.get("data") {
        for v in data.values() {
            match v {
                Value::String(s) => {
                    B64.decode(s).map_err(|e| {
                        ApiError::bad_request(format!("illegal base64 data in Secret data: {e}"))
                    })?;
                }
                Value::Null => {}
                _ => {
                    return Err(ApiError::bad_request(
                        "Secret data values must be base64 strings",
                    ));
                }
            }
        }
    }
    if obj.get("type").is_none_or(Value::is_null) {
        obj["type"] = json!("Opaque");
    }
    Ok(())
}

/// The CustomResourceDefinition kube-apiserver would hold for a custom type
/// of the registry, as a client would send it (no server-set fields): one
/// served storage version with a schema that keeps every field, and the
/// registry's names and subresources.
pub fn crd_for(rt: &ResourceType) -> Value {
    let mut names = json!({ "plural": rt.plural, "singular": rt.singular, "kind": rt.kind });
    if !rt.short_names.is_empty() {
        names["shortNames"] = json!(rt.short_names);
    }
    if !rt.categories.is_empty() {
        names["categories"] = json!(rt.categories);
    }
    let mut version = json!({
        "name": rt.version,
        "served": true,
        "storage": true,
        "schema": { "openAPIV3Schema": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        } },
    });
    if rt.status_subresource {
        version["subresources"] = json!({ "status": {} });
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": rt.qualified() },
        "spec": {
            "group": rt.group,
            "names": names,
            "scope": rt.scope(),
            "versions": [version],
        },
    })
}

/// A CRD's defaults (its `spec.names.singular` and `listKind`, the
/// conversion strategy), on every write.
fn crd_defaults(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("conversion")
        .or_insert(json!({ "strategy": "None" }));
    let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) else {
        return;
    };
    let Some(kind) = names
        .get("kind")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return;
    };
    names
        .entry("singular")
        .or_insert(json!(kind.to_lowercase()));
    names
        .entry("listKind")
        .or_insert(json!(format!("{kind}List")));
}

/// A new CRD's status: its names accepted and the definition established at
/// once (kube-apiserver's controllers take a moment for that).
fn crd_status(obj: &Value) -> Value {
    let now = now_time();
    let condition = |ty: &str, reason: &str, message: &str| {
        json!({
            "type": ty,
            "status": "True",
            "lastTransitionTime": now,
            "reason": reason,
            "message": message,
        })
    };
    let stored: Vec<Value> = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage") == Some(&json!(true)))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    json!({
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "acceptedNames": obj.pointer("/spec/names").cloned().unwrap_or_else(|| json!({})),
        "storedVersions": stored,
    })
}

/// Per-kind normalisation done on every write.
fn normalise_kind(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    if rt.is_secret() {
        normalise_secret(obj)?;
    }
    if rt.is_crd() {
        crd_defaults(obj);
    }
    if rt.is_mutating_webhook_configuration() {
        crate::admission::configuration_defaults(obj);
    }
    if rt.group == "coordination.k8s.io" {
        for f in ["acquireTime", "renewTime"] {
            if let Some(v) = obj.get_mut("spec").and_then(|s| s.get_mut(f)) {
                normalise_micro_time(v).map_err(|e| {
                    ApiError::bad_request(format!(
                        "Lease in version \"v1\" cannot be handled as a Lease: spec.{f}: {e}"
                    ))
                })?;
            }
        }
    }
    Ok(())
}

static NEXT_CLUSTER_IP: AtomicU32 = AtomicU32::new(10);

fn kind_defaults_on_create(rt: &ResourceType, obj: &mut Value) {
    match (rt.group, rt.plural) {
        ("", "namespaces") => {
            let name = str_at(obj, "/metadata/name")
                .unwrap_or_default()
                .to_string();
            let meta = meta_mut(obj);
            if !meta.get("labels").is_some_and(Value::is_object) {
                meta.insert("labels".into(), json!({}));
            }
            meta["labels"]["kubernetes.io/metadata.name"] = json!(name);
            obj["spec"] = json!({ "finalizers": ["kubernetes"] });
            obj["status"] = json!({ "phase": "Active" });
        }
        ("", "services") => {
            if !obj.get("spec").is_some_and(Value::is_object) {
                obj["spec"] = json!({});
            }
            let spec = obj["spec"].as_object_mut().expect("object");
            spec.entry("type").or_insert(json!("ClusterIP"));
            spec.entry("sessionAffinity").or_insert(json!("None"));
            if !spec.contains_key("clusterIP") {
                let n = NEXT_CLUSTER_IP.fetch_add(1, Ordering::Relaxed);
                let ip = format!("10.96.{}.{}", (n >> 8) & 0xff, n & 0xff);
                spec.insert("clusterIP".into(), json!(ip));
                spec.insert("clusterIPs".into(), json!([ip]));
            }
            obj["status"] = json!({ "loadBalancer": {} });
        }
        ("", "pods") => {
            obj["status"] = json!({ "phase": "Pending" });
        }
        (crate::resources::CRD_GROUP, "customresourcedefinitions") => {
            let status = crd_status(obj);
            obj["status"] = status;
        }
        _ => {
            if rt.status_subresource {
                obj.as_object_mut().expect("object").remove("status");
            }
        }
    }
    if rt.group == "apps" {
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        obj["status"] = json!({});
    }
}

/// A Job without `spec.manualSelector: true` gets a selector generated from
/// its uid, and its pod template the labels that selector matches (the Job
/// strategy's PrepareForCreate); a selector of its own is refused.
fn job_selector_on_create(rt: &ResourceType, name: &str, obj: &mut Value) -> Result<(), ApiError> {
    if !(rt.group == "batch" && rt.plural == "jobs") {
        return Ok(());
    }
    if obj.pointer("/spec/manualSelector") == Some(&json!(true)) {
        return Ok(());
    }
    if let Some(sel) = obj.pointer("/spec/selector").filter(|s| !s.is_null()) {
        return Err(ApiError::invalid(
            rt,
            name,
            vec![Cause {
                reason: "FieldValueInvalid",
                message: format!("Invalid value: {sel}: `selector` not auto-generated"),
                field: "spec.selector".into(),
            }],
        ));
    }
    let uid = str_at(obj, "/metadata/uid").unwrap_or_default().to_string();
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    obj["spec"]["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
    if !obj["spec"].get("template").is_some_and(Value::is_object) {
        obj["spec"]["template"] = json!({});
    }
    let template = &mut obj["spec"]["template"];
    if !template.get("metadata").is_some_and(Value::is_object) {
        template["metadata"] = json!({});
    }
    if !template["metadata"]
        .get("labels")
        .is_some_and(Value::is_object)
    {
        template["metadata"]["labels"] = json!({});
    }
    let labels = &mut template["metadata"]["labels"];
    labels["batch.kubernetes.io/controller-uid"] = json!(uid);
    labels["batch.kubernetes.io/job-name"] = json!(name);
    labels["controller-uid"] = json!(uid);
    labels["job-name"] = json!(name);
    Ok(())
}

/// The defaults kube-apiserver fills into a Job's or a CronJob's spec.
fn batch_spec_defaults(rt: &ResourceType, obj: &mut Value) {
    if rt.group != "batch" {
        return;
    }
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    match rt.plural {
        "jobs" => {
            spec.entry("parallelism").or_insert(json!(1));
            spec.entry("completions").or_insert(json!(1));
            spec.entry("backoffLimit").or_insert(json!(6));
            spec.entry("completionMode").or_insert(json!("NonIndexed"));
            spec.entry("suspend").or_insert(json!(false));
        }
        "cronjobs" => {
            spec.entry("concurrencyPolicy").or_insert(json!("Allow"));
            spec.entry("suspend").or_insert(json!(false));
            spec.entry("successfulJobsHistoryLimit").or_insert(json!(3));
            spec.entry("failedJobsHistoryLimit").or_insert(json!(1));
        }
        _ => {}
    }
}

/// The defaults kube-apiserver fills into a workload's spec on every write
/// (`kubectl rollout status` reads the update strategy of StatefulSets and
/// DaemonSets, and refuses without one).
fn apps_spec_defaults(rt: &ResourceType, obj: &mut Value) {
    if rt.group != "apps" {
        return;
    }
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("revisionHistoryLimit").or_insert(json!(10));
    if rt.plural != "daemonsets" {
        spec.entry("replicas").or_insert(json!(1));
    }
    match rt.plural {
        "deployments" => {
            spec.entry("strategy").or_insert(json!({
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
            }));
            spec.entry("progressDeadlineSeconds").or_insert(json!(600));
        }
        "statefulsets" => {
            spec.entry("updateStrategy").or_insert(json!({
                "type": "RollingUpdate",
                "rollingUpdate": {"partition": 0},
            }));
            spec.entry("podManagementPolicy")
                .or_insert(json!("OrderedReady"));
        }
        "daemonsets" => {
            spec.entry("updateStrategy").or_insert(json!({
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
            }));
        }
        _ => {}
    }
}

/// Prepare a new object for `create`: returns its name and the object.
pub fn prepare_create(
    rt: &ResourceType,
    ns: &str,
    obj: Value,
) -> Result<(String, Value), ApiError> {
    let (name, obj) = prepare_create_unvalidated(rt, ns, obj)?;
    validate(rt, &name, &obj, Vec::new())?;
    Ok((name, obj))
}

/// [`prepare_create`] but for the validation: the object mutating
/// admission webhooks see, then [`validate`].
pub fn prepare_create_unvalidated(
    rt: &ResourceType,
    ns: &str,
    mut obj: Value,
) -> Result<(String, Value), ApiError> {
    check_type(rt, &mut obj)?;
    validation::typecheck(rt, &obj)?;
    check_namespace(rt, &mut obj, ns)?;
    let meta = meta_mut(&mut obj);
    // etcd3's store refuses a create that carries a version, as a 500.
    if meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| !v.is_empty() && v != "0")
    {
        return Err(ApiError::internal(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let mut name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if name.is_empty()
        && let Some(prefix) = meta.get("generateName").and_then(Value::as_str)
        && !prefix.is_empty()
    {
        name = format!("{prefix}{}", generate_suffix());
    }
    if name.is_empty() {
        return Err(ApiError::invalid(
            rt,
            "",
            vec![Cause {
                reason: "FieldValueRequired",
                message: "Required value: name or generateName is required".into(),
                field: "metadata.name".into(),
            }],
        ));
    }
    meta.insert("name".into(), json!(name));
    meta.insert("uid".into(), json!(new_uid()));
    meta.insert("creationTimestamp".into(), json!(now_time()));
    for k in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "selfLink",
    ] {
        meta.remove(k);
    }
    if rt.generation {
        meta.insert("generation".into(), json!(1));
    }
    normalise_kind(rt, &mut obj)?;
    job_selector_on_create(rt, &name, &mut obj)?;
    kind_defaults_on_create(rt, &mut obj);
    apps_spec_defaults(rt, &mut obj);
    batch_spec_defaults(rt, &mut obj);
    Ok((name, obj))
}

/// A new object as mutating admission webhooks left it (`mutated`), made
/// ready for [`validate`] again: what the server sets itself is taken from
/// `before` (the [`prepare_create_unvalidated`] object: name, uid,
/// creationTimestamp, generation), and the kind's defaults and create-time
/// rules are applied again, as kube-apiserver applies them after admission.
pub fn after_create_admission(
    rt: &ResourceType,
    ns: &str,
    before: &Value,
    mut obj: Value,
) -> Result<Value, ApiError> {
    check_type(rt, &mut obj)?;
    validation::typecheck(rt, &obj)?;
    check_namespace(rt, &mut obj, ns)?;
    let meta = meta_mut(&mut obj);
    for k in ["name", "uid", "creationTimestamp", "generation"] {
        match before.pointer(&format!("/metadata/{k}")) {
            Some(v) => {
                meta.insert(k.into(), v.clone());
            }
            None => {
                meta.remove(k);
            }
        }
    }
    for k in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        meta.remove(k);
    }
    normalise_kind(rt, &mut obj)?;
    kind_defaults_on_create(rt, &mut obj);
    apps_spec_defaults(rt, &mut obj);
    batch_spec_defaults(rt, &mut obj);
    Ok(obj)
}

/// Prepare a replacement of `old` by `new` through the main resource.
pub fn prepare_update(
    rt: &ResourceType,
    ns: &str,
    name: &str,
    old: &Value,
    new: Value,
) -> Result<Value, ApiError> {
    let new = prepare_update_unvalidated(rt, ns, name, old, new)?;
    validate_update_result(rt, name, old, &new)?;
    Ok(new)
}

/// [`prepare_update`] but for the validation (the object mutating
/// admission webhooks see, then [`validate_update_result`]). Running it
/// again on its own result (after a webhook's patch) gives the same
/// server-set fields: they are all taken from `old`.
pub fn prepare_update_unvalidated(
    rt: &ResourceType,
    ns: &str,
    name: &str,
    old: &Value,
    mut new: Value,
) -> Result<Value, ApiError> {
    check_type(rt, &mut new)?;
    validation::typecheck(rt, &new)?;
    check_namespace(rt, &mut new, ns)?;
    match str_at(&new, "/metadata/name") {
        Some(n) if n != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        _ => {}
    }
    let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let meta = meta_mut(&mut new);
    meta.insert("name".into(), json!(name));
    if let Some(uid) = meta.get("uid").and_then(Value::as_str)
        && Some(uid) != old_meta.get("uid").and_then(Value::as_str)
    {
        return Err(ApiError::conflict_msg(
            rt,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                old_meta
                    .get("uid")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            ),
        ));
    }
    for k in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "generateName",
    ] {
        match old_meta.get(k) {
            Some(v) => {
                meta.insert(k.into(), v.clone());
            }
            None => {
                meta.remove(k);
            }
        }
    }
    normalise_kind(rt, &mut new)?;
    apps_spec_defaults(rt, &mut new);
    batch_spec_defaults(rt, &mut new);
    if rt.is_namespace() {
        new["spec"] = old.get("spec").cloned().unwrap_or_else(|| json!({}));
    }
    if rt.status_subresource {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                new.as_object_mut().expect("object").remove("status");
            }
        }
    }
    // A CRD's changed names are accepted at once.
    if rt.is_crd()
        && new.get("status").is_some_and(Value::is_object)
        && let Some(names) = new.pointer("/spec/names").cloned()
    {
        new["status"]["acceptedNames"] = names;
    }
    // Deployments also count annotation changes as a new generation (their
    // strategy's PrepareForUpdate); StatefulSets and DaemonSets do not.
    let same = validation::semantically_equal;
    let annotations_changed = rt.plural == "deployments"
        && !same(
            new.pointer("/metadata/annotations"),
            old.pointer("/metadata/annotations"),
        );
    // A webhook configuration's generation follows its webhooks.
    let webhooks_changed =
        rt.is_mutating_webhook_configuration() && !same(new.get("webhooks"), old.get("webhooks"));
    if rt.generation
        && (!same(new.get("spec"), old.get("spec")) || annotations_changed || webhooks_changed)
    {
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        new["metadata"]["generation"] = json!(g + 1);
    }
    Ok(new)
}

/// The checks of an update through the main resource (422 Invalid): what
/// may not change, then [`validate`].
pub fn validate_update_result(
    rt: &ResourceType,
    name: &str,
    old: &Value,
    new: &Value,
) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    validation::validate_update(rt, old, new, &mut causes);
    validate(rt, name, new, causes)
}

/// Prepare an update through the `/status` subresource: only status changes.
pub fn prepare_status_update(
    rt: &ResourceType,
    old: &Value,
    new: &Value,
) -> Result<Value, ApiError> {
    validation::typecheck(rt, new)?;
    let mut out = old.clone();
    match new.get("status") {
        Some(s) => out["status"] = s.clone(),
        None => {
            out.as_object_mut().expect("object").remove("status");
        }
    }
    Ok(out)
}

pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn is_qualified_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_qualified_part(name),
        None => is_qualified_part(s),
    }
}

fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_part(s)
}

fn invalid_value(field: &str, value: &str, why: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        message: format!("Invalid value: {value:?}: {why}"),
        field: field.into(),
    }
}

fn too_long(field: &str, max: usize) -> Cause {
    Cause {
        reason: "FieldValueTooLong",
        message: format!("Too long: must have at most {max} bytes"),
        field: field.into(),
    }
}

pub(crate) const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// Validate an object about to be stored; 422 Invalid listing every problem
/// (`causes`: those already found, e.g. by the update's checks).
pub fn validate(
    rt: &ResourceType,
    name: &str,
    obj: &Value,
    mut causes: Vec<Cause>,
) -> Result<(), ApiError> {
    match rt.name_rule {
        NameRule::Subdomain if !is_dns_subdomain(name) => {
            causes.push(invalid_value("metadata.name", name, SUBDOMAIN_MSG));
        }
        NameRule::Label if !is_dns_label(name) => {
            causes.push(invalid_value("metadata.name", name, LABEL_MSG));
        }
        _ => {}
    }
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if !is_qualified_name(k) {
                causes.push(invalid_value(
                    "metadata.labels",
                    k,
                    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                ));
            }
            match v.as_str() {
                Some(s) if is_label_value(s) => {}
                _ => causes.push(invalid_value(
                    "metadata.labels",
                    &v.to_string(),
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                )),
            }
        }
    }
    if let Some(ann) = obj
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        let mut total = 0;
        for (k, v) in ann {
            if !is_qualified_name(k) {
                causes.push(invalid_value("metadata.annotations", k, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"));
            }
            total += k.len() + v.as_str().map_or(0, str::len);
        }
        if total > MAX_ANNOTATION_BYTES {
            causes.push(too_long("metadata.annotations", MAX_ANNOTATION_BYTES));
        }
    }
    if rt.has_data_limit() {
        let mut total = 0;
        for field in ["data", "binaryData"] {
            if let Some(m) = obj.get(field).and_then(Value::as_object) {
                for (k, v) in m {
                    if k.is_empty()
                        || k.len() > 253
                        || !k
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
                    {
                        causes.push(invalid_value(
                            &format!("{field}[{k}]"),
                            k,
                            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
                        ));
                    }
                    let s = v.as_str().unwrap_or_default();
                    total += k.len();
                    total += if rt.is_secret() || field == "binaryData" {
                        s.len() / 4 * 3
                    } else {
                        s.len()
                    };
                }
            }
        }
        if total > MAX_DATA_BYTES {
            let field = if rt.is_secret() { "data" } else { "[]" };
            causes.push(too_long(field, MAX_DATA_BYTES));
        }
    }
    if rt.group == "coordination.k8s.io"
        && let Some(d) = obj
            .pointer("/spec/leaseDurationSeconds")
            .and_then(Value::as_i64)
        && d <= 0
    {
        causes.push(invalid_value(
            "spec.leaseDurationSeconds",
            &d.to_string(),
            "must be greater than 0",
        ));
    }
    validation::validate_kind(rt, obj, &mut causes);
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(rt, name, causes))
    }
}

/// Mark an object as being deleted (it has finalizers).
pub fn mark_deleting(obj: &Value) -> Value {
    let mut o = obj.clone();
    let meta = meta_mut(&mut o);
    meta.entry("deletionTimestamp").or_insert(json!(now_time()));
    meta.entry("deletionGracePeriodSeconds").or_insert(json!(0));
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{RESOURCES, lookup_core};

    #[test]
    fn names() {
        assert!(is_dns_subdomain("a.b-c"));
        assert!(!is_dns_subdomain("A"));
        assert!(!is_dns_subdomain("a_b"));
        assert!(!is_dns_label("a.b"));
        assert!(is_qualified_name("kubectl.kubernetes.io/restartedAt"));
    }

    #[test]
    fn secret_string_data() {
        let rt = &RESOURCES[lookup_core("secrets").unwrap()];
        let (_, o) = prepare_create(
            rt,
            "default",
            json!({"metadata": {"name": "s"}, "stringData": {"k": "v"}, "data": {"a": "YQ=="}}),
        )
        .unwrap();
        assert_eq!(o["data"], json!({"k": "dg==", "a": "YQ=="}));
        assert!(o.get("stringData").is_none());
        assert_eq!(o["type"], json!("Opaque"));
    }

    #[test]
    fn uid_shape() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
