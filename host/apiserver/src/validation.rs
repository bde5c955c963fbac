//! What kube-apiserver checks of built-in kinds beyond names, labels and
//! sizes (those are in `objects::validate`): the body decodes as the kind's
//! type (400 "cannot be handled as a ..."), the fields each kind requires
//! (422 Required value), and the fields an update may not change (422
//! "field is immutable", no new finalizers while deleting).
//!
//! The type check decodes into k8s-openapi's types, which are lenient about
//! missing fields and ignore unknown ones as kube does; a wrong JSON type
//! anywhere is refused with its path.

use k8s_openapi::api::{admissionregistration, apps, batch, coordination, core, discovery, events};
use serde_json::Value;

use crate::error::{ApiError, Cause};
use crate::resources::{RESOURCES, ResourceType};

fn decodes_as<T: serde::de::DeserializeOwned>(obj: &Value) -> Result<(), String> {
    serde_path_to_error::deserialize::<_, T>(obj)
        .map(|_| ())
        .map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                e.into_inner().to_string()
            } else {
                format!("{path}: {}", e.into_inner())
            }
        })
}

/// 400 BadRequest when the body does not decode as the kind's type.
pub fn typecheck(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    let checked = match (rt.group, rt.plural) {
        ("", "namespaces") => decodes_as::<core::v1::Namespace>(obj),
        ("", "configmaps") => decodes_as::<core::v1::ConfigMap>(obj),
        ("", "secrets") => decodes_as::<core::v1::Secret>(obj),
        ("", "services") => decodes_as::<core::v1::Service>(obj),
        ("", "pods") => decodes_as::<core::v1::Pod>(obj),
        ("", "events") => decodes_as::<core::v1::Event>(obj),
        ("discovery.k8s.io", "endpointslices") => decodes_as::<discovery::v1::EndpointSlice>(obj),
        ("apps", "deployments") => decodes_as::<apps::v1::Deployment>(obj),
        ("apps", "statefulsets") => decodes_as::<apps::v1::StatefulSet>(obj),
        ("apps", "daemonsets") => decodes_as::<apps::v1::DaemonSet>(obj),
        ("batch", "jobs") => decodes_as::<batch::v1::Job>(obj),
        ("batch", "cronjobs") => decodes_as::<batch::v1::CronJob>(obj),
        ("coordination.k8s.io", "leases") => decodes_as::<coordination::v1::Lease>(obj),
        ("events.k8s.io", "events") => decodes_as::<events::v1::Event>(obj),
        (crate::resources::ADMISSION_GROUP, "mutatingwebhookconfigurations") => {
            decodes_as::<admissionregistration::v1::MutatingWebhookConfiguration>(obj)
        }
        _ => Ok(()),
    };
    checked.map_err(|why| {
        ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {why}",
            kind = rt.kind,
            version = rt.version
        ))
    })
}

fn required(field: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired",
        message: "Required value".into(),
        field: field.into(),
    }
}

fn forbidden(field: &str, why: &str) -> Cause {
    Cause {
        reason: "FieldValueForbidden",
        message: format!("Forbidden: {why}"),
        field: field.into(),
    }
}

/// An invalid value shown as JSON (kube shows Go values; the field and the
/// explanation are what clients read).
fn invalid_json(field: &str, value: Option<&Value>, why: &str) -> Cause {
    let shown = value.map_or_else(|| "null".to_string(), Value::to_string);
    Cause {
        reason: "FieldValueInvalid",
        message: format!("Invalid value: {shown}: {why}"),
        field: field.into(),
    }
}

fn empty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        Some(_) => false,
    }
}

/// Containers (or a pod template's) need a name and an image, and at least one.
fn containers(spec: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
    let list = spec.and_then(|s| s.get("containers"));
    if empty(list) {
        causes.push(required(&format!("{path}.containers")));
        return;
    }
    for (i, c) in list
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        for f in ["name", "image"] {
            if empty(c.get(f)) {
                causes.push(required(&format!("{path}.containers[{i}].{f}")));
            }
        }
    }
}

/// A Job's pods must not restart on their own: restartPolicy OnFailure or Never.
fn restart_policy(spec: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
    let field = format!("{path}.restartPolicy");
    match spec.and_then(|s| s.get("restartPolicy")) {
        None | Some(Value::Null) => causes.push(Cause {
            reason: "FieldValueRequired",
            message: "Required value: valid values: \"OnFailure\", \"Never\"".into(),
            field,
        }),
        Some(Value::String(p)) if p == "OnFailure" || p == "Never" => {}
        Some(v) => causes.push(Cause {
            reason: "FieldValueNotSupported",
            message: format!("Unsupported value: {v}: supported values: \"OnFailure\", \"Never\""),
            field,
        }),
    }
}

/// Whether a `metav1.LabelSelector` selects a set of labels.
fn selector_matches(sel: &Value, labels: Option<&Value>) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let match_labels = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .all(|(k, v)| get(k) == v.as_str());
    let expressions = sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
            let values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let got = get(key);
            match e.get("operator").and_then(Value::as_str) {
                Some("In") => got.is_some_and(|g| values.contains(&g)),
                Some("NotIn") => got.is_none_or(|g| !values.contains(&g)),
                Some("Exists") => got.is_some(),
                Some("DoesNotExist") => got.is_none(),
                _ => false,
            }
        });
    match_labels && expressions
}

/// A workload's selector and pod template (Deployment, StatefulSet, DaemonSet).
fn workload(rt: &ResourceType, obj: &Value, causes: &mut Vec<Cause>) {
    let sel = obj.pointer("/spec/selector");
    let labels = obj.pointer("/spec/template/metadata/labels");
    match sel {
        None | Some(Value::Null) => causes.push(required("spec.selector")),
        Some(s) if empty(s.get("matchLabels")) && empty(s.get("matchExpressions")) => {
            causes.push(invalid_json(
                "spec.selector",
                Some(s),
                &format!("empty selector is invalid for {}", rt.singular),
            ))
        }
        Some(s) if !selector_matches(s, labels) => causes.push(invalid_json(
            "spec.template.metadata.labels",
            labels,
            "`selector` does not match template `labels`",
        )),
        Some(_) => {}
    }
    containers(
        obj.pointer("/spec/template/spec"),
        "spec.template.spec",
        causes,
    );
}

fn unsupported(field: &str, value: &str, why: &str) -> Cause {
    Cause {
        reason: "FieldValueNotSupported",
        message: format!("Unsupported value: {value:?}: {why}"),
        field: field.into(),
    }
}

/// A CustomResourceDefinition: kube-apiserver's checks of the fields this
/// server reads (group, names, scope, versions, the name
/// `<plural>.<group>`), then that it defines a custom type of the registry
/// (this server can serve no other) with the registry's kind and scope.
fn crd(obj: &Value, causes: &mut Vec<Cause>) {
    let before = causes.len();
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default();
    let (name, group, plural, kind, scope) = (
        s("/metadata/name"),
        s("/spec/group"),
        s("/spec/names/plural"),
        s("/spec/names/kind"),
        s("/spec/scope"),
    );
    if group.is_empty() {
        causes.push(required("spec.group"));
    } else if !group.contains('.') {
        causes.push(invalid_json(
            "spec.group",
            obj.pointer("/spec/group"),
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        causes.push(required("spec.names.plural"));
    }
    if kind.is_empty() {
        causes.push(required("spec.names.kind"));
    }
    match scope {
        "" => causes.push(required("spec.scope")),
        "Cluster" | "Namespaced" => {}
        other => causes.push(unsupported(
            "spec.scope",
            other,
            "supported values: \"Cluster\", \"Namespaced\"",
        )),
    }
    let versions: Vec<&Value> = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let storage = versions
        .iter()
        .filter(|v| v.get("storage") == Some(&Value::Bool(true)))
        .count();
    if storage != 1 {
        causes.push(invalid_json(
            "spec.versions",
            obj.pointer("/spec/versions"),
            "must have exactly one version marked as storage version",
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        if empty(v.get("name")) {
            causes.push(required(&format!("spec.versions[{i}].name")));
        }
        if empty(v.pointer("/schema/openAPIV3Schema")) {
            causes.push(Cause {
                reason: "FieldValueRequired",
                message: "Required value: schemas are required".into(),
                field: format!("spec.versions[{i}].schema.openAPIV3Schema"),
            });
        }
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
            field: "metadata.name".into(),
        });
    }
    if causes.len() > before {
        return;
    }
    let known = crate::resources::custom_list();
    let served = |want: &str| {
        versions.iter().any(|v| {
            v.get("name").and_then(Value::as_str) == Some(want)
                && v.get("served") != Some(&Value::Bool(false))
        })
    };
    let Some(rt) = RESOURCES
        .iter()
        .find(|r| r.custom && r.group == group && r.plural == plural && served(r.version))
    else {
        let listed: Vec<&str> = versions
            .iter()
            .filter(|v| v.get("served") != Some(&Value::Bool(false)))
            .filter_map(|v| v.get("name").and_then(Value::as_str))
            .collect();
        causes.push(unsupported(
            "spec",
            &format!("{plural}.{group}/{}", listed.join(",")),
            &format!("the test API server can serve only the custom resources {known}"),
        ));
        return;
    };
    let gvr = format!("{}/{}", rt.qualified(), rt.version);
    if kind != rt.kind {
        causes.push(unsupported(
            "spec.names.kind",
            kind,
            &format!("the test API server serves {gvr} as kind {:?}", rt.kind),
        ));
    }
    if scope != rt.scope() {
        causes.push(unsupported(
            "spec.scope",
            scope,
            &format!(
                "the test API server serves {gvr} with scope {:?}",
                rt.scope()
            ),
        ));
    }
}

/// The fields each built-in kind requires (kube-apiserver's 422s).
pub fn validate_kind(rt: &ResourceType, obj: &Value, causes: &mut Vec<Cause>) {
    if rt.is_crd() {
        crd(obj, causes);
        return;
    }
    if rt.is_mutating_webhook_configuration() {
        crate::admission::validate_configuration(obj, causes);
        return;
    }
    match (rt.group, rt.plural) {
        ("apps", _) => workload(rt, obj, causes),
        ("batch", "jobs") => {
            workload(rt, obj, causes);
            restart_policy(
                obj.pointer("/spec/template/spec"),
                "spec.template.spec",
                causes,
            );
        }
        ("batch", "cronjobs") => {
            if empty(obj.pointer("/spec/schedule")) {
                causes.push(required("spec.schedule"));
            }
            let spec = obj.pointer("/spec/jobTemplate/spec/template/spec");
            let path = "spec.jobTemplate.spec.template.spec";
            containers(spec, path, causes);
            restart_policy(spec, path, causes);
        }
        ("", "pods") => containers(obj.get("spec"), "spec", causes),
        ("discovery.k8s.io", "endpointslices") => match obj.get("addressType") {
            None => causes.push(required("addressType")),
            Some(v) if empty(Some(v)) => causes.push(required("addressType")),
            Some(Value::String(t)) if ["IPv4", "IPv6", "FQDN"].contains(&t.as_str()) => {}
            Some(v) => causes.push(Cause {
                reason: "FieldValueNotSupported",
                message: format!(
                    "Unsupported value: {v}: supported values: \"FQDN\", \"IPv4\", \"IPv6\""
                ),
                field: "addressType".into(),
            }),
        },
        ("events.k8s.io", "events") => {
            for f in [
                "eventTime",
                "reportingController",
                "reportingInstance",
                "action",
                "reason",
            ] {
                if empty(obj.get(f)) {
                    causes.push(required(f));
                }
            }
            match obj.get("type").and_then(Value::as_str) {
                Some("Normal" | "Warning") => {}
                t => causes.push(invalid_json(
                    "type",
                    obj.get("type"),
                    &format!("has invalid value: {}", t.unwrap_or_default()),
                )),
            }
        }
        _ => {}
    }
}

/// Equal as kube's `Semantic.DeepEqual` sees JSON: an absent field, null,
/// `{}` and `[]` are all empty (a client that sends `matchExpressions: []`
/// changes nothing).
pub fn semantically_equal(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => x
            .keys()
            .chain(y.keys())
            .all(|k| semantically_equal(x.get(k), y.get(k))),
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|(p, q)| semantically_equal(Some(p), Some(q)))
        }
        (a, b) if empty(a) && empty(b) => true,
        (a, b) => a == b,
    }
}

const IMMUTABLE: &str = "field is immutable";
const IMMUTABLE_WHEN_SET: &str = "field is immutable when `immutable` is set";

fn finalizers(obj: &Value) -> Vec<&str> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// What an update may not change (through the main resource).
pub fn validate_update(rt: &ResourceType, old: &Value, new: &Value, causes: &mut Vec<Cause>) {
    if old.pointer("/metadata/deletionTimestamp").is_some() {
        let before = finalizers(old);
        let added: Vec<&str> = finalizers(new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            causes.push(forbidden(
                "metadata.finalizers",
                &format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                ),
            ));
        }
    }
    // A Job's pod template cannot change (kube-apiserver allows a few
    // scheduling fields of a suspended Job; this server allows none).
    if rt.group == "batch"
        && rt.plural == "jobs"
        && !semantically_equal(old.pointer("/spec/template"), new.pointer("/spec/template"))
    {
        causes.push(invalid_json(
            "spec.template",
            new.pointer("/spec/template"),
            IMMUTABLE,
        ));
    }
    if (rt.group == "apps" || (rt.group == "batch" && rt.plural == "jobs"))
        && !semantically_equal(old.pointer("/spec/selector"), new.pointer("/spec/selector"))
    {
        causes.push(invalid_json(
            "spec.selector",
            new.pointer("/spec/selector"),
            IMMUTABLE,
        ));
    }
    if rt.has_data_limit() && old.get("immutable") == Some(&Value::Bool(true)) {
        if new.get("immutable") != Some(&Value::Bool(true)) {
            causes.push(forbidden("immutable", IMMUTABLE_WHEN_SET));
        }
        for f in ["data", "binaryData"] {
            let (a, b) = (old.get(f), new.get(f));
            if a != b && !(empty(a) && empty(b)) {
                causes.push(forbidden(f, IMMUTABLE_WHEN_SET));
            }
        }
    }
    if rt.is_secret() && old.get("type") != new.get("type") {
        causes.push(invalid_json("type", new.get("type"), IMMUTABLE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_and_absent_are_equal_as_kube_compares() {
        let eq = |a: Value, b: Value| semantically_equal(Some(&a), Some(&b));
        assert!(eq(
            json!({"matchLabels": {"a": "b"}, "matchExpressions": []}),
            json!({"matchLabels": {"a": "b"}})
        ));
        assert!(semantically_equal(None, Some(&json!({}))));
        assert!(!eq(
            json!({"matchLabels": {"a": "b"}}),
            json!({"matchLabels": {"a": "c"}})
        ));
        assert!(!eq(json!(["a"]), json!(["a", "b"])));
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels = json!({"app": "web", "tier": "a"});
        assert!(selector_matches(
            &json!({"matchLabels": {"app": "web"}}),
            Some(&labels)
        ));
        assert!(!selector_matches(
            &json!({"matchLabels": {"app": "api"}}),
            Some(&labels)
        ));
        let ex = |op: &str, values: Value| json!({"matchExpressions": [{"key": "tier", "operator": op, "values": values}]});
        assert!(selector_matches(
            &ex("In", json!(["a", "b"])),
            Some(&labels)
        ));
        assert!(!selector_matches(&ex("NotIn", json!(["a"])), Some(&labels)));
        assert!(selector_matches(&ex("Exists", json!([])), Some(&labels)));
        assert!(!selector_matches(
            &ex("DoesNotExist", json!([])),
            Some(&labels)
        ));
        assert!(!selector_matches(&ex("Bogus", json!([])), Some(&labels)));
    }
}
