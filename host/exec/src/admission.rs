//! What the optional mutating admission webhook answers (issue 34 §4): the
//! records of a restart survive a GitOps apply.
//!
//! A restart records its content on the workload: `config-hash.wasmwatch.io/*`
//! and `kubectl.kubernetes.io/restartedAt` on the pod template (strategy
//! annotations), Reloader's `STAKATER_*` variables in the containers
//! (env-vars), the hash keys on a Rollout's own annotations (restart-at).
//! Argo CD or Flux re-applying the workload from git drops what git does
//! not have; the template then changes (a rollout nobody asked for) and the
//! record is gone (the next delivery of the same content restarts again).
//!
//! [`restore_records`] is the answer to an UPDATE: every record the old
//! object had and the new one lacks is put back, as a JSON Patch (RFC 6902)
//! on the new object. A record the new object sets itself (another value)
//! is left as the new object has it; nothing else is touched. A CREATE is
//! not changed: a new workload's pods start with the content of now, and
//! there is no old object to read a record from.
//!
//! It reads nothing but the request, so every replica answers the same
//! whether it leads or not, and never waits on a plugin or the API server.
use serde_json::{Map, Value, json};

use crate::workload::{HASH_ANNOTATION_PREFIX, RESTARTED_AT_ANNOTATION, template_pointer};

/// The prefix of Reloader's (and the env-vars strategy's) variables.
const ENV_PREFIX: &str = "STAKATER_";

/// Whether `key` is an annotation a restart writes.
fn is_record_annotation(key: &str) -> bool {
    key == RESTARTED_AT_ANNOTATION
        || key
            .strip_prefix(HASH_ANNOTATION_PREFIX)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// A JSON Pointer token (RFC 6901).
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// The JSON Patch that puts back, on `new` (an UPDATE's object), the restart
/// records `old` (the stored object) had and `new` lacks. `group` and
/// `kind` say where the pod template is. Empty: nothing to restore.
pub fn restore_records(group: &str, kind: &str, old: &Value, new: &Value) -> Vec<Value> {
    let mut patch = Vec::new();
    let template = template_pointer(group, kind);
    restore_annotations(
        &mut patch,
        &format!("{template}/metadata"),
        old.pointer(template),
        new.pointer(template),
    );
    // restart-at's records on the object's own annotations.
    restore_annotations(&mut patch, "/metadata", Some(old), Some(new));
    restore_env(
        &mut patch,
        &format!("{template}/spec"),
        old.pointer(&format!("{template}/spec")),
        new.pointer(&format!("{template}/spec")),
    );
    patch
}

/// Record annotations of `old`'s `metadata.annotations` missing from
/// `new`'s; `metadata` is the JSON Pointer of `new`'s metadata.
fn restore_annotations(
    patch: &mut Vec<Value>,
    metadata: &str,
    old: Option<&Value>,
    new: Option<&Value>,
) {
    let Some(old) = old
        .and_then(|o| o.pointer("/metadata/annotations"))
        .and_then(Value::as_object)
    else {
        return;
    };
    let Some(new) = new else {
        return;
    };
    let present = new
        .pointer("/metadata/annotations")
        .and_then(Value::as_object);
    let missing: Map<String, Value> = old
        .iter()
        .filter(|(k, _)| is_record_annotation(k))
        .filter(|(k, _)| present.is_none_or(|p| !p.contains_key(*k)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if missing.is_empty() {
        return;
    }
    match (new.get("metadata").is_some_and(Value::is_object), present) {
        (_, Some(_)) => {
            for (k, v) in missing {
                patch.push(json!({
                    "op": "add",
                    "path": format!("{metadata}/annotations/{}", escape(&k)),
                    "value": v,
                }));
            }
        }
        (true, None) => patch.push(json!({
            "op": "add", "path": format!("{metadata}/annotations"), "value": missing,
        })),
        (false, None) => patch.push(json!({
            "op": "add", "path": metadata, "value": {"annotations": missing},
        })),
    }
}

/// `STAKATER_*` variables of `old`'s containers missing from the
/// same-named containers of `new` (a pod spec each); `spec` is the JSON
/// Pointer of `new`'s pod spec.
fn restore_env(patch: &mut Vec<Value>, spec: &str, old: Option<&Value>, new: Option<&Value>) {
    let containers = |s: Option<&Value>| {
        s.and_then(|s| s.get("containers"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (old, new) = (containers(old), containers(new));
    for (i, container) in new.iter().enumerate() {
        let name = container.get("name").and_then(Value::as_str);
        let Some(before) = old
            .iter()
            .find(|c| c.get("name").and_then(Value::as_str) == name)
        else {
            continue;
        };
        let vars = |c: &Value| -> Vec<Value> {
            c.get("env")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let now = vars(container);
        let has = |n: &str| {
            now.iter()
                .any(|e| e.get("name").and_then(Value::as_str) == Some(n))
        };
        let missing: Vec<Value> = vars(before)
            .into_iter()
            .filter(|e| {
                e.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| n.starts_with(ENV_PREFIX) && !has(n))
            })
            .collect();
        if missing.is_empty() {
            continue;
        }
        if container.get("env").is_some_and(Value::is_array) {
            for e in missing {
                patch.push(json!({
                    "op": "add", "path": format!("{spec}/containers/{i}/env/-"), "value": e,
                }));
            }
        } else {
            patch.push(json!({
                "op": "add", "path": format!("{spec}/containers/{i}/env"), "value": missing,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies a JSON Patch of `add` operations (what [`restore_records`]
    /// makes) the way RFC 6902 does.
    fn apply(mut doc: Value, patch: &[Value]) -> Value {
        for op in patch {
            assert_eq!(op["op"], "add");
            let path = op["path"].as_str().unwrap();
            let (parent, last) = path.rsplit_once('/').unwrap();
            let last = last.replace("~1", "/").replace("~0", "~");
            let target = doc.pointer_mut(parent).expect("parent exists");
            match target {
                Value::Object(m) => {
                    m.insert(last, op["value"].clone());
                }
                Value::Array(a) if last == "-" => a.push(op["value"].clone()),
                other => panic!("cannot add at {path} in {other}"),
            }
        }
        doc
    }

    fn deployment(template_annotations: Value, env: Value) -> Value {
        json!({
            "metadata": {"name": "web", "annotations": {"team": "shop"}},
            "spec": {"template": {
                "metadata": {"labels": {"app": "web"}, "annotations": template_annotations},
                "spec": {"containers": [
                    {"name": "proxy", "image": "proxy"},
                    {"name": "app", "image": "app", "env": env},
                ]}
            }}
        })
    }

    #[test]
    fn an_apply_that_drops_the_records_gets_them_back_and_nothing_else() {
        let old = deployment(
            json!({
                "config-hash.wasmwatch.io/configmap.orders": "configmap/orders:1",
                "kubectl.kubernetes.io/restartedAt": "2026-12-07T10:00:00Z",
                "team": "shop",
            }),
            json!([{"name": "STAKATER_ORDERS_CONFIGMAP", "value": "a9"}, {"name": "X", "value": "1"}]),
        );
        // Git has neither the records nor the `team` template annotation.
        let new = deployment(json!({}), json!([{"name": "X", "value": "2"}]));
        let patch = restore_records("apps", "Deployment", &old, &new);
        let restored = apply(new, &patch);
        assert_eq!(
            restored.pointer("/spec/template/metadata/annotations"),
            Some(&json!({
                "config-hash.wasmwatch.io/configmap.orders": "configmap/orders:1",
                "kubectl.kubernetes.io/restartedAt": "2026-12-07T10:00:00Z",
            }))
        );
        assert_eq!(
            restored.pointer("/spec/template/spec/containers/1/env"),
            Some(
                &json!([{"name": "X", "value": "2"}, {"name": "STAKATER_ORDERS_CONFIGMAP", "value": "a9"}])
            )
        );
        // Applied again: nothing left to restore.
        assert!(restore_records("apps", "Deployment", &old, &restored).is_empty());
    }

    #[test]
    fn a_record_the_new_object_sets_itself_is_left_as_it_is() {
        let old = deployment(
            json!({"config-hash.wasmwatch.io/configmap.orders": "configmap/orders:1"}),
            json!([{"name": "STAKATER_ORDERS_CONFIGMAP", "value": "a9"}]),
        );
        let new = deployment(
            json!({"config-hash.wasmwatch.io/configmap.orders": "configmap/orders:2"}),
            json!([{"name": "STAKATER_ORDERS_CONFIGMAP", "value": "b0"}]),
        );
        assert!(restore_records("apps", "Deployment", &old, &new).is_empty());
    }

    #[test]
    fn missing_maps_are_created_and_cronjobs_are_read_at_their_job_template() {
        let old = json!({"metadata": {"name": "nightly"}, "spec": {"jobTemplate": {"spec": {"template": {
            "metadata": {"annotations": {"config-hash.wasmwatch.io/secret.creds": "secret/creds:9"}},
            "spec": {"containers": [{"name": "run", "env": [{"name": "STAKATER_CREDS_SECRET", "value": "9"}]}]}
        }}}}});
        let new = json!({"metadata": {"name": "nightly"}, "spec": {"jobTemplate": {"spec": {"template": {
            "spec": {"containers": [{"name": "run"}]}
        }}}}});
        let patch = restore_records("batch", "CronJob", &old, &new);
        let restored = apply(new, &patch);
        let template = "/spec/jobTemplate/spec/template";
        assert_eq!(
            restored.pointer(&format!(
                "{template}/metadata/annotations/config-hash.wasmwatch.io~1secret.creds"
            )),
            Some(&json!("secret/creds:9"))
        );
        assert_eq!(
            restored.pointer(&format!("{template}/spec/containers/0/env")),
            Some(&json!([{"name": "STAKATER_CREDS_SECRET", "value": "9"}]))
        );
    }

    #[test]
    fn a_rollouts_own_records_are_restored_too() {
        let old = json!({"metadata": {"name": "canary", "annotations": {
            "config-hash.wasmwatch.io/configmap.cfg": "configmap/cfg:1", "note": "x"}},
            "spec": {"template": {"spec": {"containers": []}}}});
        let new = json!({"metadata": {"name": "canary"}, "spec": {"template": {"spec": {"containers": []}}}});
        let patch = restore_records("argoproj.io", "Rollout", &old, &new);
        assert_eq!(
            patch,
            [json!({"op": "add", "path": "/metadata/annotations",
                "value": {"config-hash.wasmwatch.io/configmap.cfg": "configmap/cfg:1"}})]
        );
    }
}
