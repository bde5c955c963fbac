//! Patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a
//! practical strategic merge patch.
//!
//! The strategic merge patch knows the merge keys of the lists that matter
//! for the served kinds (containers, volumes, env, ports, volumeMounts, ...)
//! by field name instead of from OpenAPI schemas, and understands the
//! directives kubectl sends: `$patch: replace|delete|merge`, `$retainKeys`,
//! `$setElementOrder/<field>` and `$deleteFromPrimitiveList/<field>`.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// A supported patch content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Strategic,
    Json,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/json-patch+json" => Some(PatchType::Json),
            _ => None,
        }
    }
}

/// Apply `patch` of type `ty` to `target`.
pub fn apply(ty: PatchType, target: &Value, patch: &Value) -> Result<Value, ApiError> {
    match ty {
        PatchType::Merge => {
            let mut out = target.clone();
            merge_patch(&mut out, patch);
            Ok(out)
        }
        PatchType::Strategic => {
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "strategic merge patch must be a JSON object",
                ));
            }
            let mut out = target.clone();
            strategic_merge(&mut out, patch, "");
            Ok(out)
        }
        PatchType::Json => json_patch(target, patch),
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The merge key of a list field, by field name (and parent path for `ports`).
fn merge_key(field: &str, items: &[Value]) -> Option<&'static str> {
    let has = |k: &str| {
        items
            .iter()
            .filter(|i| i.is_object())
            .all(|i| i.get(k).is_some() || i.get("$patch").is_some())
    };
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "hostAliases" => Some("ip"),
        "topologySpreadConstraints" => Some("topologyKey"),
        "ports" => {
            if has("containerPort") {
                Some("containerPort")
            } else {
                Some("port")
            }
        }
        _ => None,
    }
}

/// Lists of scalars merged as sets (patchStrategy merge without a key).
fn is_primitive_merge_list(field: &str) -> bool {
    matches!(field, "finalizers")
}

fn strategic_merge(target: &mut Value, patch: &Value, _path: &str) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    // `$patch: replace` replaces the whole map; `$patch: delete` removes it
    // (handled by the parent).
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut m = p.clone();
            m.remove("$patch");
            *target = Value::Object(m);
            return;
        }
        Some("delete") => {
            *target = Value::Object(Map::new());
            return;
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    let retain: Option<Vec<String>> = p.get("$retainKeys").and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    });
    for (k, v) in p {
        if k.starts_with('$') {
            if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/")
                && let (Some(Value::Array(list)), Some(del)) = (t.get_mut(field), v.as_array())
            {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match v {
            Value::Object(_) => {
                if v.get("$patch").and_then(Value::as_str) == Some("delete") {
                    t.remove(k);
                } else {
                    strategic_merge(t.entry(k.clone()).or_insert(Value::Null), v, k);
                }
            }
            Value::Array(items) => {
                let merged = merge_list(k, t.get(k), items);
                t.insert(k.clone(), merged);
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(keep) = retain {
        t.retain(|k, _| keep.iter().any(|r| r == k));
    }
}

fn merge_list(field: &str, current: Option<&Value>, items: &[Value]) -> Value {
    let cur: Vec<Value> = current
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // A `{"$patch": "replace"}` element means: replace the list with the rest.
    if items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Value::Array(
            items
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .cloned()
                .collect(),
        );
    }
    if is_primitive_merge_list(field) {
        let mut out = cur;
        for i in items {
            if !out.contains(i) {
                out.push(i.clone());
            }
        }
        return Value::Array(out);
    }
    let Some(key) = merge_key(field, items) else {
        return Value::Array(items.to_vec());
    };
    let mut out = cur;
    for item in items {
        let Some(kv) = item.get(key) else {
            continue;
        };
        let pos = out.iter().position(|c| c.get(key) == Some(kv));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                out.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut out[i], item, field),
            (None, false) => {
                let mut fresh = Value::Object(Map::new());
                strategic_merge(&mut fresh, item, field);
                out.push(fresh);
            }
        }
    }
    Value::Array(out)
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn pointer_parent<'a>(doc: &'a mut Value, path: &str) -> Result<(&'a mut Value, String), ApiError> {
    let idx = path
        .rfind('/')
        .ok_or_else(|| ApiError::bad_request(format!("invalid JSON pointer {path:?}")))?;
    let (parent, last) = path.split_at(idx);
    let parent = doc.pointer_mut(parent).ok_or_else(|| {
        ApiError::unprocessable_patch(format!("jsonpatch: path {path:?} does not exist"))
    })?;
    Ok((parent, unescape(&last[1..])))
}

fn json_add(doc: &mut Value, path: &str, value: Value) -> Result<(), ApiError> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, key) = pointer_parent(doc, path)?;
    match parent {
        Value::Object(m) => {
            m.insert(key, value);
            Ok(())
        }
        Value::Array(a) => {
            if key == "-" {
                a.push(value);
                return Ok(());
            }
            let i: usize = key
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid array index {key:?}")))?;
            if i > a.len() {
                return Err(ApiError::unprocessable_patch(format!(
                    "jsonpatch add operation: index {i} out of bounds"
                )));
            }
            a.insert(i, value);
            Ok(())
        }
        _ => Err(ApiError::unprocessable_patch(format!(
            "jsonpatch: cannot add at {path:?}"
        ))),
    }
}

fn json_remove(doc: &mut Value, path: &str) -> Result<Value, ApiError> {
    let (parent, key) = pointer_parent(doc, path)?;
    let missing = || {
        ApiError::unprocessable_patch(format!(
            "jsonpatch remove operation does not apply: doc is missing path: {path:?}"
        ))
    };
    match parent {
        Value::Object(m) => m.remove(&key).ok_or_else(missing),
        Value::Array(a) => {
            let i: usize = key.parse().map_err(|_| missing())?;
            if i < a.len() {
                Ok(a.remove(i))
            } else {
                Err(missing())
            }
        }
        _ => Err(missing()),
    }
}

/// RFC 6902 JSON patch.
pub fn json_patch(target: &Value, patch: &Value) -> Result<Value, ApiError> {
    let ops = patch
        .as_array()
        .ok_or_else(|| ApiError::bad_request("json patch must be an array of operations"))?;
    let mut doc = target.clone();
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad_request("json patch operation without a path"))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| ApiError::bad_request(format!("json patch {kind} without a value")))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad_request(format!("json patch {kind} without from")))
        };
        match kind {
            "add" => json_add(&mut doc, path, value()?)?,
            "remove" => {
                json_remove(&mut doc, path)?;
            }
            "replace" => {
                if doc.pointer(path).is_none() {
                    return Err(ApiError::unprocessable_patch(format!(
                        "jsonpatch replace operation does not apply: doc is missing key: {path}"
                    )));
                }
                *doc.pointer_mut(path).expect("checked") = value()?;
            }
            "move" => {
                let v = json_remove(&mut doc, from()?)?;
                json_add(&mut doc, path, v)?;
            }
            "copy" => {
                let v = doc.pointer(from()?).cloned().ok_or_else(|| {
                    ApiError::unprocessable_patch(
                        "jsonpatch copy operation does not apply: missing from",
                    )
                })?;
                json_add(&mut doc, path, v)?;
            }
            "test" => {
                if doc.pointer(path) != Some(&value()?) {
                    return Err(ApiError::unprocessable_patch(format!(
                        "testing value {path} failed: test failed"
                    )));
                }
            }
            other => {
                return Err(ApiError::bad_request(format!("Unexpected kind: {other}")));
            }
        }
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        let p = json!({"a": "z", "c": {"f": null}});
        assert_eq!(
            apply(PatchType::Merge, &t, &p).unwrap(),
            json!({"a": "z", "c": {"d": "e"}})
        );
    }

    #[test]
    fn strategic_merges_containers_by_name() {
        let t = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}
        ]}}}});
        let p = json!({"spec": {"template": {
        "metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "now"}},
        "spec": {"containers": [
            {"name": "a", "env": [{"name": "Y", "value": "2"}]},
            {"name": "b", "$patch": "delete"},
            {"name": "c", "image": "c:1"}
        ]}}}});
        let out = apply(PatchType::Strategic, &t, &p).unwrap();
        let cs = out.pointer("/spec/template/spec/containers").unwrap();
        assert_eq!(
            cs,
            &json!([
                {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
                {"name": "c", "image": "c:1"}
            ])
        );
        assert_eq!(
            out.pointer("/spec/template/metadata/annotations/kubectl.kubernetes.io~1restartedAt"),
            Some(&json!("now"))
        );
    }

    #[test]
    fn strategic_replaces_unkeyed_lists_and_honours_directives() {
        let t =
            json!({"args": ["a", "b"], "m": {"x": 1, "y": 2}, "metadata": {"finalizers": ["f1"]}});
        let p = json!({"args": ["c"], "m": {"$retainKeys": ["x"], "x": 3},
                       "metadata": {"finalizers": ["f2"], "$deleteFromPrimitiveList/finalizers": ["f1"]},
                       "$setElementOrder/args": ["c"]});
        let out = apply(PatchType::Strategic, &t, &p).unwrap();
        assert_eq!(out["args"], json!(["c"]));
        assert_eq!(out["m"], json!({"x": 3}));
        assert_eq!(out["metadata"]["finalizers"], json!(["f2"]));
    }

    #[test]
    fn json_patch_ops() {
        let t = json!({"a": [1, 2], "b": {"c": 1}});
        let p = json!([
            {"op": "add", "path": "/a/-", "value": 3},
            {"op": "replace", "path": "/b/c", "value": 2},
            {"op": "test", "path": "/b/c", "value": 2},
            {"op": "copy", "from": "/b", "path": "/d"},
            {"op": "move", "from": "/d", "path": "/e"},
            {"op": "remove", "path": "/a/0"}
        ]);
        let out = apply(PatchType::Json, &t, &p).unwrap();
        assert_eq!(out, json!({"a": [2, 3], "b": {"c": 2}, "e": {"c": 2}}));
        assert!(
            apply(
                PatchType::Json,
                &t,
                &json!([{"op": "test", "path": "/b/c", "value": 9}])
            )
            .is_err()
        );
    }
}
