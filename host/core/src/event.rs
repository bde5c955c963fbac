//! Change events: what the host tells a plugin about one change of a watched
//! ConfigMap or Secret.
use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The kinds wasmwatch watches: ConfigMaps, Secrets, and kinds a manifest
/// names by group, version and kind (issue 34 §1). Written `ConfigMap`,
/// `Secret` or `apiVersion/Kind`; ordered ConfigMap, Secret, then custom
/// kinds by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    ConfigMap,
    Secret,
    Custom(crate::kind::CustomKind),
}

impl ObjectKind {
    /// `ConfigMap`, `Secret`, or a custom kind's `apiVersion/Kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::ConfigMap => "ConfigMap",
            ObjectKind::Secret => "Secret",
            ObjectKind::Custom(k) => k.name(),
        }
    }

    /// The `kind` field of its objects.
    pub fn kind_name(self) -> &'static str {
        match self {
            ObjectKind::Custom(k) => k.kind(),
            other => other.as_str(),
        }
    }

    /// The lowercase part of its annotation keys: `configmap`, `secret`,
    /// or a custom kind's [`crate::kind::CustomKind::stem`].
    pub fn stem(self) -> &'static str {
        match self {
            ObjectKind::ConfigMap => "configmap",
            ObjectKind::Secret => "secret",
            ObjectKind::Custom(k) => k.stem(),
        }
    }

    /// Reads [`ObjectKind::as_str`]'s forms (`v1/ConfigMap` and
    /// `v1/Secret` too).
    pub fn parse(name: &str) -> Result<ObjectKind, String> {
        match name {
            "ConfigMap" | "v1/ConfigMap" => Ok(ObjectKind::ConfigMap),
            "Secret" | "v1/Secret" => Ok(ObjectKind::Secret),
            other => crate::kind::CustomKind::parse(other)
                .map(ObjectKind::Custom)
                .map_err(|e| {
                    let near = other.to_ascii_lowercase();
                    let near = near.strip_suffix('s').unwrap_or(&near);
                    match near {
                        "configmap" => format!("{e}; did you mean ConfigMap?"),
                        "secret" => format!("{e}; did you mean Secret?"),
                        _ => e,
                    }
                }),
        }
    }

    /// ConfigMap, Secret and every custom kind named so far in this
    /// process: the kinds stored state may hold.
    pub fn known() -> Vec<ObjectKind> {
        [ObjectKind::ConfigMap, ObjectKind::Secret]
            .into_iter()
            .chain(
                crate::kind::CustomKind::all()
                    .into_iter()
                    .map(ObjectKind::Custom),
            )
            .collect()
    }
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ObjectKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ObjectKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        ObjectKind::parse(&name).map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for ObjectKind {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ObjectKind".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "ConfigMap, Secret, or apiVersion/Kind of a kind in watch.kinds",
            "pattern": "^(ConfigMap|Secret|([a-z0-9.-]+/)?[a-z0-9]+/[A-Z][A-Za-z0-9]*)$"
        })
    }
}

/// What happened to the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
    /// Found changed while resynchronising after a 410: the history in
    /// between is unknown.
    Resynced,
}

impl std::str::FromStr for ChangeType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "added" => Ok(ChangeType::Added),
            "modified" => Ok(ChangeType::Modified),
            "deleted" => Ok(ChangeType::Deleted),
            "resynced" => Ok(ChangeType::Resynced),
            _ => Err(format!(
                "unknown change type {s:?}: expected added, modified, deleted or resynced"
            )),
        }
    }
}

/// One value of a ConfigMap or Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum DataValue {
    Text(String),
    Binary(Vec<u8>),
}

impl DataValue {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            DataValue::Text(s) => s.as_bytes(),
            DataValue::Binary(b) => b,
        }
    }

    fn from_bytes(bytes: Vec<u8>) -> Self {
        match String::from_utf8(bytes) {
            Ok(s) => DataValue::Text(s),
            Err(e) => DataValue::Binary(e.into_bytes()),
        }
    }
}

/// Why an object could not be read as a ConfigMap or Secret.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ObjectError {
    #[error("object has kind {0:?}; expected ConfigMap or Secret")]
    WrongKind(String),
    #[error("object has no {0}")]
    Missing(&'static str),
    #[error("{field} must be {expected}")]
    WrongType {
        field: String,
        expected: &'static str,
    },
    #[error("{field} is not valid base64")]
    BadBase64 { field: String },
}

/// The parts of a ConfigMap or Secret that wasmwatch cares about, read from
/// its JSON (as the API server sends it, or as `kubectl get -o yaml` prints it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectSnapshot {
    pub kind: ObjectKind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub data: BTreeMap<String, DataValue>,
}

fn string_map(v: Option<&Value>, field: &str) -> Result<BTreeMap<String, String>, ObjectError> {
    string_map_owned(v.cloned(), field)
}

/// [`string_map`] taking the value: its strings are moved, not copied (a
/// watched object's data is read once, issue 24).
fn string_map_owned(
    v: Option<Value>,
    field: &str,
) -> Result<BTreeMap<String, String>, ObjectError> {
    let obj = match v {
        None | Some(Value::Null) => return Ok(BTreeMap::new()),
        Some(Value::Object(obj)) => obj,
        Some(_) => {
            return Err(ObjectError::WrongType {
                field: field.to_string(),
                expected: "a map of strings",
            });
        }
    };
    obj.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            _ => Err(ObjectError::WrongType {
                field: format!("{field}.{k}"),
                expected: "a string",
            }),
        })
        .collect()
}

/// The metadata wasmwatch reads of an object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    pub name: String,
    /// Empty: `default`.
    pub namespace: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl ObjectSnapshot {
    /// Reads a ConfigMap or Secret. Secret `data` and ConfigMap `binaryData`
    /// are base64 on the wire and decoded here; Secret `stringData` (as written
    /// by a user, before the API server merges it) is taken as is.
    pub fn from_json(obj: &Value) -> Result<Self, ObjectError> {
        let kind = match obj.get("kind").and_then(Value::as_str) {
            Some("ConfigMap") => ObjectKind::ConfigMap,
            Some("Secret") => ObjectKind::Secret,
            Some(other) => return Err(ObjectError::WrongKind(other.to_string())),
            None => return Err(ObjectError::Missing("kind")),
        };
        let meta = obj
            .get("metadata")
            .ok_or(ObjectError::Missing("metadata"))?;
        let text = |k: &str| {
            meta.get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let metadata = Metadata {
            name: text("name"),
            namespace: text("namespace"),
            uid: text("uid"),
            resource_version: text("resourceVersion"),
            labels: string_map(meta.get("labels"), "metadata.labels")?,
            annotations: string_map(meta.get("annotations"), "metadata.annotations")?,
        };
        let mut body = serde_json::Map::new();
        for field in ["data", "binaryData", "stringData"] {
            if let Some(v) = obj.get(field) {
                body.insert(field.to_string(), v.clone());
            }
        }
        ObjectSnapshot::from_parts(kind, metadata, Value::Object(body))
    }

    /// Reads an object of `kind` from its metadata and the rest of its
    /// body (`data`, `binaryData`, `stringData`), moving their strings: the
    /// watch loop's path, from kube's `DynamicObject`, without a copy of
    /// the whole object as JSON (issue 24).
    pub fn from_parts(
        kind: ObjectKind,
        meta: Metadata,
        mut body: Value,
    ) -> Result<Self, ObjectError> {
        if let ObjectKind::Custom(_) = kind {
            // Without content paths: a custom kind's `data`, if any.
            return ObjectSnapshot::from_content(kind, meta, &body, &["data".to_string()]);
        }
        if meta.name.is_empty() {
            return Err(ObjectError::Missing("metadata.name"));
        }
        let (text_field, b64_field) = match kind {
            ObjectKind::ConfigMap => ("data", "binaryData"),
            ObjectKind::Secret => ("stringData", "data"),
            ObjectKind::Custom(_) => unreachable!("read above"),
        };
        let mut take = |field: &str| body.as_object_mut().and_then(|o| o.remove(field));
        let (b64, text) = (take(b64_field), take(text_field));
        let mut data = BTreeMap::new();
        for (k, v) in string_map_owned(b64, b64_field)? {
            let bytes = BASE64
                .decode(v.trim())
                .map_err(|_| ObjectError::BadBase64 {
                    field: format!("{b64_field}.{k}"),
                })?;
            let value = match kind {
                ObjectKind::Secret => DataValue::from_bytes(bytes),
                _ => DataValue::Binary(bytes),
            };
            data.insert(k, value);
        }
        for (k, v) in string_map_owned(text, text_field)? {
            data.insert(k, DataValue::Text(v));
        }
        Ok(ObjectSnapshot::assemble(kind, meta, data))
    }

    /// The snapshot of `meta` and `data` (an empty namespace is `default`).
    fn assemble(kind: ObjectKind, meta: Metadata, data: BTreeMap<String, DataValue>) -> Self {
        ObjectSnapshot {
            kind,
            namespace: match meta.namespace {
                ns if ns.is_empty() => "default".to_string(),
                ns => ns,
            },
            name: meta.name,
            uid: meta.uid,
            resource_version: meta.resource_version,
            labels: meta.labels,
            annotations: meta.annotations,
            data,
        }
    }

    /// Reads an object of a custom kind (issue 34 §1): its data is the
    /// value at each of the `content` field paths (dotted, from the top of
    /// the object: `status.objects`), keyed by the path; a string as it
    /// is, anything else as compact JSON (its keys in the order the object
    /// has them, which the API server keeps); a path with no value (or
    /// null) is no key. `body` is the object without its metadata.
    pub fn from_content(
        kind: ObjectKind,
        meta: Metadata,
        body: &Value,
        content: &[String],
    ) -> Result<Self, ObjectError> {
        if meta.name.is_empty() {
            return Err(ObjectError::Missing("metadata.name"));
        }
        let mut data = BTreeMap::new();
        for path in content {
            let value = path
                .split('.')
                .try_fold(body, |v, field| v.get(field))
                .filter(|v| !v.is_null());
            let text = match value {
                None => continue,
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            data.insert(path.clone(), DataValue::Text(text));
        }
        Ok(ObjectSnapshot::assemble(kind, meta, data))
    }

    /// Hex SHA-256 of the data: keys and values, length-prefixed, in key order.
    /// Equal content gives an equal digest whatever the object's history.
    pub fn digest(&self) -> String {
        data_digest(&self.data)
    }

    /// [`ObjectSnapshot::digest`], HMAC-SHA-256 under `key` when given
    /// (see [`crate::digest`]).
    pub fn digest_with(&self, key: Option<&crate::digest::DigestKey>) -> String {
        crate::digest::data_digest(&self.data, key)
    }
}

/// See [`ObjectSnapshot::digest`].
pub fn data_digest(data: &BTreeMap<String, DataValue>) -> String {
    crate::digest::data_digest(data, None)
}

/// One change of a watched object, as handed to plugins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeEvent {
    pub change: ChangeType,
    pub object: ObjectSnapshot,
    /// Keys added, removed or changed against the previously handled version.
    pub changed_keys: Vec<String>,
    /// Hex digest of the data: SHA-256 for ConfigMaps, HMAC-SHA-256 under
    /// the cluster's digest key for Secrets when the host has one (see
    /// [`crate::digest`]).
    pub digest: String,
    /// When `digest` is keyed (a Secret): the plain SHA-256 digest of the
    /// same data, as versions before keys wrote it on pod templates. A
    /// restart accepts a template recording it as this content, so an
    /// upgrade restarts nothing by itself. Never given to plugins.
    pub unkeyed_digest: Option<String>,
    /// Delivered again by a new leader replaying a leaderless gap.
    pub replay: bool,
}

impl ChangeEvent {
    /// Builds the event for `object`, diffing its data against `previous`
    /// (the last handled version) when there is one.
    pub fn new(
        change: ChangeType,
        object: ObjectSnapshot,
        previous: Option<&ObjectSnapshot>,
    ) -> Self {
        let changed_keys = match (change, previous) {
            (ChangeType::Modified | ChangeType::Resynced, Some(prev)) => {
                let mut keys: Vec<String> = object
                    .data
                    .iter()
                    .filter(|(k, v)| prev.data.get(*k) != Some(*v))
                    .map(|(k, _)| k.clone())
                    .chain(
                        prev.data
                            .keys()
                            .filter(|k| !object.data.contains_key(*k))
                            .cloned(),
                    )
                    .collect();
                keys.sort();
                keys
            }
            _ => object.data.keys().cloned().collect(),
        };
        let digest = object.digest();
        ChangeEvent {
            change,
            object,
            changed_keys,
            digest,
            unkeyed_digest: None,
            replay: false,
        }
    }

    /// The event for `object` whose digest the caller computed (the index
    /// has, possibly keyed), every key counted as changed.
    pub fn with_digest(change: ChangeType, object: ObjectSnapshot, digest: String) -> Self {
        ChangeEvent {
            change,
            changed_keys: object.data.keys().cloned().collect(),
            object,
            digest,
            unkeyed_digest: None,
            replay: false,
        }
    }
}

/// How a change folds into an earlier change of the same object that no
/// plugin has decided yet ([`ChangeEvent::folded`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Folded {
    /// They stay two changes: another object (or another uid of it), or a
    /// deletion on either side.
    Apart,
    /// The newer change, as it is, stands for both.
    AsNewer,
    /// The newer change with another change type or more changed keys.
    Changed(Box<ChangeEvent>),
}

impl ChangeEvent {
    /// The one change that stands for `older` (not decided yet) followed
    /// by `newer`, as a controller's work queue folds a key queued twice
    /// (client-go's `workqueue`): the newer content, the union of both
    /// changes' keys (a key changed and changed back is still listed, so a
    /// plugin acting only on changed keys misses none), `Added` when the
    /// older was (the plugin never saw the object), `Resynced` when either
    /// was (the history in between is unknown), a replay when either was.
    /// A deletion is never folded, on either side: a plugin sees an object
    /// go, and a re-created object (another uid) is another object.
    pub fn folded(older: &ChangeEvent, newer: &ChangeEvent) -> Folded {
        let (a, b) = (&older.object, &newer.object);
        if a.kind != b.kind
            || a.namespace != b.namespace
            || a.name != b.name
            || a.uid != b.uid
            || matches!(older.change, ChangeType::Deleted)
            || matches!(newer.change, ChangeType::Deleted | ChangeType::Added)
        {
            return Folded::Apart;
        }
        let change = match (older.change, newer.change) {
            (ChangeType::Added, _) => ChangeType::Added,
            (ChangeType::Resynced, _) | (_, ChangeType::Resynced) => ChangeType::Resynced,
            _ => ChangeType::Modified,
        };
        let changed_keys = if change == ChangeType::Added {
            b.data.keys().cloned().collect()
        } else {
            let mut keys: Vec<String> = older
                .changed_keys
                .iter()
                .chain(&newer.changed_keys)
                .cloned()
                .collect();
            keys.sort();
            keys.dedup();
            keys
        };
        let replay = older.replay || newer.replay;
        if change == newer.change && changed_keys == newer.changed_keys && replay == newer.replay {
            return Folded::AsNewer;
        }
        Folded::Changed(Box::new(ChangeEvent {
            change,
            changed_keys,
            replay,
            ..newer.clone()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "app", "namespace": "prod", "uid": "u1", "resourceVersion": "7",
                            "labels": {"a": "b"}},
               "data": data})
    }

    #[test]
    fn reads_configmap_and_diffs_keys() {
        let old = ObjectSnapshot::from_json(&cm(json!({"x": "1", "y": "2"}))).unwrap();
        let new = ObjectSnapshot::from_json(&cm(json!({"x": "1", "y": "3", "z": "4"}))).unwrap();
        assert_eq!(new.namespace, "prod");
        assert_eq!(new.labels["a"], "b");
        let ev = ChangeEvent::new(ChangeType::Modified, new.clone(), Some(&old));
        assert_eq!(ev.changed_keys, vec!["y", "z"]);
        let gone = ObjectSnapshot::from_json(&cm(json!({"x": "1"}))).unwrap();
        let ev = ChangeEvent::new(ChangeType::Modified, gone, Some(&old));
        assert_eq!(ev.changed_keys, vec!["y"]);
        let ev = ChangeEvent::new(ChangeType::Added, new, None);
        assert_eq!(ev.changed_keys, vec!["x", "y", "z"]);
    }

    #[test]
    fn secret_values_are_decoded() {
        let s = json!({"kind": "Secret", "metadata": {"name": "s"},
                       "data": {"pw": "aHVudGVyMg==", "bin": "/wA="}, "stringData": {"user": "bob"}});
        let snap = ObjectSnapshot::from_json(&s).unwrap();
        assert_eq!(snap.namespace, "default");
        assert_eq!(snap.data["pw"], DataValue::Text("hunter2".into()));
        assert_eq!(snap.data["bin"], DataValue::Binary(vec![0xff, 0]));
        assert_eq!(snap.data["user"], DataValue::Text("bob".into()));
    }

    #[test]
    fn digest_depends_on_content_only() {
        let a = ObjectSnapshot::from_json(&cm(json!({"x": "1"}))).unwrap();
        let mut b = a.clone();
        b.resource_version = "99".into();
        b.labels.clear();
        assert_eq!(a.digest(), b.digest());
        // Moving a byte between key and value changes the digest.
        let c = ObjectSnapshot::from_json(&cm(json!({"x1": ""}))).unwrap();
        assert_ne!(a.digest(), c.digest());
    }

    #[test]
    fn bad_objects_are_named() {
        let e = ObjectSnapshot::from_json(&json!({"kind": "Pod", "metadata": {"name": "p"}}))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "object has kind \"Pod\"; expected ConfigMap or Secret"
        );
        let e = ObjectSnapshot::from_json(
            &json!({"kind": "Secret", "metadata": {"name": "s"}, "data": {"k": "!!"}}),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "data.k is not valid base64");
        let e = ObjectSnapshot::from_json(&cm(json!({"x": 1}))).unwrap_err();
        assert_eq!(e.to_string(), "data.x must be a string");
    }

    fn change(change: ChangeType, uid: &str, data: Value, keys: &[&str]) -> ChangeEvent {
        let mut o = cm(data);
        o["metadata"]["uid"] = json!(uid);
        let mut e = ChangeEvent::new(change, ObjectSnapshot::from_json(&o).unwrap(), None);
        e.changed_keys = keys.iter().map(|k| k.to_string()).collect();
        e
    }

    #[test]
    fn a_waiting_change_folds_into_the_next_with_the_newer_content_and_every_key() {
        use ChangeType::*;
        let older = change(Modified, "u1", json!({"x": "2", "y": "1"}), &["x"]);
        let newer = change(Modified, "u1", json!({"x": "2", "y": "2"}), &["y"]);
        let Folded::Changed(f) = ChangeEvent::folded(&older, &newer) else {
            panic!("not folded")
        };
        assert_eq!(f.change, Modified);
        assert_eq!(f.changed_keys, vec!["x", "y"]);
        assert_eq!(f.object, newer.object);
        assert_eq!(f.digest, newer.digest);
        // The same key again: the newer change stands for both, no copy.
        let again = change(Modified, "u1", json!({"x": "3", "y": "1"}), &["x"]);
        assert_eq!(ChangeEvent::folded(&older, &again), Folded::AsNewer);
        // Added then changed: still an addition, of the newer content.
        let added = change(Added, "u1", json!({"x": "1", "gone": "1"}), &["x", "gone"]);
        let Folded::Changed(f) = ChangeEvent::folded(&added, &again) else {
            panic!("not folded")
        };
        assert_eq!(
            (f.change, f.changed_keys),
            (Added, vec!["x".into(), "y".into()])
        );
        // A relist's change keeps saying the history is unknown.
        let resynced = change(Resynced, "u1", json!({"x": "2"}), &["x"]);
        let Folded::Changed(f) = ChangeEvent::folded(&resynced, &again) else {
            panic!("not folded")
        };
        assert_eq!(f.change, Resynced);
        // A replayed change makes the fold a replay.
        let mut replayed = older.clone();
        replayed.replay = true;
        let Folded::Changed(f) = ChangeEvent::folded(&replayed, &again) else {
            panic!("not folded")
        };
        assert!(f.replay);
    }

    #[test]
    fn deletions_and_other_objects_are_never_folded() {
        use ChangeType::*;
        let m = change(Modified, "u1", json!({"x": "1"}), &["x"]);
        let deleted = change(Deleted, "u1", json!({"x": "1"}), &["x"]);
        let recreated = change(Added, "u2", json!({"x": "1"}), &["x"]);
        let other_uid = change(Modified, "u2", json!({"x": "1"}), &["x"]);
        assert_eq!(ChangeEvent::folded(&m, &deleted), Folded::Apart);
        assert_eq!(ChangeEvent::folded(&deleted, &recreated), Folded::Apart);
        assert_eq!(ChangeEvent::folded(&m, &other_uid), Folded::Apart);
        assert_eq!(ChangeEvent::folded(&m, &recreated), Folded::Apart);
        let mut other_name = m.clone();
        other_name.object.name = "other".into();
        assert_eq!(ChangeEvent::folded(&m, &other_name), Folded::Apart);
    }
}
