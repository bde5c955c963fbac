//! Kubernetes protobuf request and response bodies
//! (`application/vnd.kubernetes.protobuf`): the `k8s\0` envelope around a
//! `runtime.Unknown`, converted to and from the JSON objects the store keeps.
//!
//! The messages are `k8s-pb`'s prost types; the conversion to and from JSON
//! is written per kind, field by field, following the Go types' JSON tags
//! (`omitempty` values are left out when empty, pointers are kept when set).
//! Only kinds converted completely are listed in [`KINDS`]: a request body of
//! any other kind is refused with 415, and a response whose object has a
//! field the conversion does not know is answered as JSON instead, so nothing
//! is ever dropped silently.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_pb::api::autoscaling::v1 as autoscaling;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use prost::Message;
use serde_json::{Map, Value};

use crate::api::Reply;
use crate::error::ApiError;

/// The media type of Kubernetes protobuf bodies.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The four bytes every Kubernetes protobuf body starts with.
const MAGIC: [u8; 4] = *b"k8s\0";

/// Decode a protobuf request body into the JSON object it stands for.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let rest = body.strip_prefix(&MAGIC[..]).ok_or_else(|| {
        ApiError::bad_request(format!(
            "provided data does not appear to be a protobuf message, expected prefix {:?}",
            MAGIC
        ))
    })?;
    let unknown = Unknown::decode(rest).map_err(|e| {
        ApiError::bad_request(format!("unable to decode the protobuf request body: {e}"))
    })?;
    if let Some(enc) = unknown
        .content_encoding
        .as_deref()
        .filter(|e| !e.is_empty())
    {
        return Err(unsupported(format!(
            "protobuf request bodies with contentEncoding {enc:?} are not supported by this \
             server; send the object unencoded or as JSON (Content-Type: application/json)"
        )));
    }
    let tm = unknown.type_meta.unwrap_or_default();
    let api_version = tm.api_version.unwrap_or_default();
    let kind = tm.kind.unwrap_or_default();
    if kind.is_empty() {
        return Err(ApiError::bad_request(
            "Object 'Kind' is missing in the protobuf request body",
        ));
    }
    let Some(conv) = converter(&api_version, &kind) else {
        return Err(unsupported(format!(
            "protobuf request bodies of kind {kind} ({api_version}) are not supported by this \
             server; send the {kind} as JSON (Content-Type: application/json)"
        )));
    };
    let raw = unknown.raw.unwrap_or_default();
    let mut obj = (conv.decode)(&raw).map_err(|e| {
        ApiError::bad_request(format!(
            "unable to decode the protobuf body as {kind} ({api_version}): {e}"
        ))
    })?;
    let o = obj.as_object_mut().expect("conversions produce objects");
    o.insert("apiVersion".into(), Value::String(api_version));
    o.insert("kind".into(), Value::String(kind));
    Ok(obj)
}

/// Encode a JSON object (with `apiVersion` and `kind`) as a protobuf body, or
/// `None` when its kind is not converted or it holds anything the conversion
/// would lose (the caller then answers JSON).
pub fn encode(v: &Value) -> Option<Vec<u8>> {
    let api_version = v.get("apiVersion")?.as_str()?;
    let kind = v.get("kind")?.as_str()?;
    let conv = converter(api_version, kind)?;
    let raw = (conv.encode)(v).ok()?;
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_string()),
            kind: Some(kind.to_string()),
        }),
        raw: Some(raw),
        // kube-apiserver sends these (empty) too.
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = Vec::with_capacity(MAGIC.len() + unknown.encoded_len());
    out.extend_from_slice(&MAGIC);
    unknown.encode(&mut out).expect("a Vec grows as needed");
    Some(out)
}

/// A verb's reply as a protobuf body (status code and bytes), if it can be
/// one: watches and kinds not converted (Tables among them) cannot.
pub fn encode_reply(reply: &Reply) -> Option<(u16, Vec<u8>)> {
    match reply {
        Reply::Json(code, v) => Some((*code, encode(v)?)),
        Reply::Stored(code, v) => Some((*code, encode(v)?)),
        Reply::Raw(code, b) => Some((*code, encode(&serde_json::from_slice(b).ok()?)?)),
        Reply::Watch(_) => None,
    }
}

/// Whether an `Accept` header prefers protobuf over JSON, as kube-apiserver
/// negotiates: the acceptable media range with the highest `q` (the first of
/// equals) among those served. Ranges with `as=` ask for a conversion (a
/// Table), which is never protobuf here; `*/*` and `application/*` mean JSON.
pub fn prefers_protobuf(accept: Option<&str>) -> bool {
    let Some(accept) = accept else {
        return false;
    };
    let mut best: Option<(f32, bool)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let mut q = 1.0f32;
        let mut conversion = false;
        for p in parts {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            match k.trim().to_ascii_lowercase().as_str() {
                "q" => q = v.trim().parse().unwrap_or(0.0),
                "as" => conversion = true,
                _ => {}
            }
        }
        let protobuf = match media.as_str() {
            MEDIA_TYPE => true,
            "application/json" | "application/yaml" | "application/*" | "*/*" => false,
            _ => continue,
        };
        if conversion || q <= 0.0 {
            continue;
        }
        if best.is_none_or(|(bq, _)| q > bq) {
            best = Some((q, protobuf));
        }
    }
    best.is_some_and(|(_, protobuf)| protobuf)
}

fn unsupported(message: String) -> ApiError {
    ApiError {
        code: 415,
        reason: "UnsupportedMediaType".into(),
        message,
        details: None,
        retry_after: None,
    }
}

// ---------------------------------------------------------------------------
// The kinds converted.

/// How one kind converts.
struct Kind {
    kind: &'static str,
    /// `None`: any (DeleteOptions is registered in every group version).
    api_version: Option<&'static str>,
    decode: fn(&[u8]) -> Result<Value, String>,
    encode: fn(&Value) -> Enc<Vec<u8>>,
}

/// Every kind converted completely, both ways.
static KINDS: &[Kind] = &[
    Kind {
        kind: "ConfigMap",
        api_version: Some("v1"),
        decode: dec::<core::ConfigMap>,
        encode: enc::<core::ConfigMap>,
    },
    Kind {
        kind: "ConfigMapList",
        api_version: Some("v1"),
        decode: dec::<core::ConfigMapList>,
        encode: enc::<core::ConfigMapList>,
    },
    Kind {
        kind: "Secret",
        api_version: Some("v1"),
        decode: dec::<core::Secret>,
        encode: enc::<core::Secret>,
    },
    Kind {
        kind: "SecretList",
        api_version: Some("v1"),
        decode: dec::<core::SecretList>,
        encode: enc::<core::SecretList>,
    },
    Kind {
        kind: "Namespace",
        api_version: Some("v1"),
        decode: dec::<core::Namespace>,
        encode: enc::<core::Namespace>,
    },
    Kind {
        kind: "NamespaceList",
        api_version: Some("v1"),
        decode: dec::<core::NamespaceList>,
        encode: enc::<core::NamespaceList>,
    },
    Kind {
        kind: "Scale",
        api_version: Some("autoscaling/v1"),
        decode: dec::<autoscaling::Scale>,
        encode: enc::<autoscaling::Scale>,
    },
    Kind {
        kind: "Status",
        api_version: Some("v1"),
        decode: dec::<meta::Status>,
        encode: enc::<meta::Status>,
    },
    Kind {
        kind: "DeleteOptions",
        api_version: None,
        decode: dec::<meta::DeleteOptions>,
        encode: enc::<meta::DeleteOptions>,
    },
];

fn converter(api_version: &str, kind: &str) -> Option<&'static Kind> {
    KINDS
        .iter()
        .find(|k| k.kind == kind && k.api_version.is_none_or(|v| v == api_version))
}

fn dec<T: Convert>(raw: &[u8]) -> Result<Value, String> {
    T::decode(raw).map_err(|e| e.to_string())?.to_json()
}

fn enc<T: Convert>(v: &Value) -> Enc<Vec<u8>> {
    Ok(T::from_json(v)?.encode_to_vec())
}

/// A JSON value the protobuf message cannot hold without losing something.
#[derive(Debug)]
struct Lossy;

type Enc<T> = Result<T, Lossy>;

/// A message converted to and from its JSON form (without `apiVersion` and
/// `kind`, which the envelope carries).
trait Convert: Message + Default + Sized {
    fn to_json(&self) -> Result<Value, String>;
    fn from_json(v: &Value) -> Enc<Self>;
}

// ---------------------------------------------------------------------------
// Building JSON from messages.

/// A JSON object under construction, following Go's JSON tags.
#[derive(Default)]
struct Out(Map<String, Value>);

impl Out {
    fn put(&mut self, k: &str, v: Value) -> &mut Self {
        self.0.insert(k.to_string(), v);
        self
    }

    /// A string with `omitempty`.
    fn str(&mut self, k: &str, v: &Option<String>) -> &mut Self {
        match v.as_deref() {
            Some(s) if !s.is_empty() => self.put(k, Value::String(s.to_string())),
            _ => self,
        }
    }

    /// A string without `omitempty`.
    fn str_always(&mut self, k: &str, v: &Option<String>) -> &mut Self {
        self.put(k, Value::String(v.clone().unwrap_or_default()))
    }

    /// A `*string`: kept when set, even empty.
    fn str_ptr(&mut self, k: &str, v: &Option<String>) -> &mut Self {
        match v {
            Some(s) => self.put(k, Value::String(s.clone())),
            None => self,
        }
    }

    /// An integer with `omitempty`.
    fn int(&mut self, k: &str, v: Option<i64>) -> &mut Self {
        match v {
            Some(n) if n != 0 => self.put(k, n.into()),
            _ => self,
        }
    }

    /// A `*int64` or `*bool`: kept when set.
    fn ptr(&mut self, k: &str, v: Option<impl Into<Value>>) -> &mut Self {
        match v {
            Some(x) => self.put(k, x.into()),
            None => self,
        }
    }

    fn time(&mut self, k: &str, v: &Option<meta::Time>) -> Result<&mut Self, String> {
        Ok(match time_to_json(v)? {
            Some(t) => self.put(k, Value::String(t)),
            None => self,
        })
    }

    fn strings(&mut self, k: &str, v: &[String]) -> &mut Self {
        if v.is_empty() {
            return self;
        }
        self.put(k, v.iter().cloned().map(Value::String).collect())
    }

    fn map(&mut self, k: &str, v: &BTreeMap<String, String>) -> &mut Self {
        if v.is_empty() {
            return self;
        }
        let m = v
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        self.put(k, Value::Object(m))
    }

    fn bytes_map(&mut self, k: &str, v: &BTreeMap<String, Vec<u8>>) -> &mut Self {
        if v.is_empty() {
            return self;
        }
        let m = v
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(B64.encode(v))))
            .collect();
        self.put(k, Value::Object(m))
    }

    fn list<T>(
        &mut self,
        k: &str,
        v: &[T],
        f: impl Fn(&T) -> Result<Value, String>,
    ) -> Result<&mut Self, String> {
        if v.is_empty() {
            return Ok(self);
        }
        let items = v.iter().map(f).collect::<Result<Vec<_>, _>>()?;
        Ok(self.put(k, Value::Array(items)))
    }

    fn done(&mut self) -> Value {
        Value::Object(std::mem::take(&mut self.0))
    }
}

/// `metav1.Time` as JSON: RFC 3339 in seconds; the zero time (an empty
/// message) is absent.
fn time_to_json(t: &Option<meta::Time>) -> Result<Option<String>, String> {
    let Some(t) = t else {
        return Ok(None);
    };
    if t.seconds.is_none() && t.nanos.is_none() {
        return Ok(None);
    }
    let secs = t.seconds.unwrap_or(0);
    let ts = jiff::Timestamp::from_second(secs).map_err(|e| format!("time {secs}: {e}"))?;
    Ok(Some(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
}

// ---------------------------------------------------------------------------
// Reading JSON into messages.

/// The object's fields, if it has none but `known` (nulls count as absent).
fn fields<'a>(v: &'a Value, known: &[&str]) -> Enc<&'a Map<String, Value>> {
    let o = v.as_object().ok_or(Lossy)?;
    if o.iter()
        .any(|(k, v)| !v.is_null() && !known.contains(&k.as_str()))
    {
        return Err(Lossy);
    }
    Ok(o)
}

fn get<'a>(o: &'a Map<String, Value>, k: &str) -> Option<&'a Value> {
    o.get(k).filter(|v| !v.is_null())
}

fn string(o: &Map<String, Value>, k: &str) -> Enc<Option<String>> {
    match get(o, k) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Lossy),
    }
}

fn int64(o: &Map<String, Value>, k: &str) -> Enc<Option<i64>> {
    get(o, k).map(|v| v.as_i64().ok_or(Lossy)).transpose()
}

fn int32(o: &Map<String, Value>, k: &str) -> Enc<Option<i32>> {
    int64(o, k)?
        .map(|n| i32::try_from(n).map_err(|_| Lossy))
        .transpose()
}

fn boolean(o: &Map<String, Value>, k: &str) -> Enc<Option<bool>> {
    get(o, k).map(|v| v.as_bool().ok_or(Lossy)).transpose()
}

fn array<'a>(o: &'a Map<String, Value>, k: &str) -> Enc<&'a [Value]> {
    match get(o, k) {
        None => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(Lossy),
    }
}

fn strings(o: &Map<String, Value>, k: &str) -> Enc<Vec<String>> {
    array(o, k)?
        .iter()
        .map(|v| v.as_str().map(str::to_string).ok_or(Lossy))
        .collect()
}

fn messages<T>(o: &Map<String, Value>, k: &str, f: impl Fn(&Value) -> Enc<T>) -> Enc<Vec<T>> {
    array(o, k)?.iter().map(f).collect()
}

fn message<T>(o: &Map<String, Value>, k: &str, f: impl Fn(&Value) -> Enc<T>) -> Enc<Option<T>> {
    get(o, k).map(f).transpose()
}

fn entries<'a>(o: &'a Map<String, Value>, k: &str) -> Enc<Vec<(&'a String, &'a str)>> {
    match get(o, k) {
        None => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| Ok((k, v.as_str().ok_or(Lossy)?)))
            .collect(),
        Some(_) => Err(Lossy),
    }
}

fn string_map(o: &Map<String, Value>, k: &str) -> Enc<BTreeMap<String, String>> {
    Ok(entries(o, k)?
        .into_iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect())
}

/// A map of base64 strings (Secret `data`, ConfigMap `binaryData`).
fn bytes_map(o: &Map<String, Value>, k: &str) -> Enc<BTreeMap<String, Vec<u8>>> {
    entries(o, k)?
        .into_iter()
        .map(|(k, v)| Ok((k.clone(), B64.decode(v).map_err(|_| Lossy)?)))
        .collect()
}

fn time(o: &Map<String, Value>, k: &str) -> Enc<Option<meta::Time>> {
    let Some(s) = string(o, k)? else {
        return Ok(None);
    };
    let ts: jiff::Timestamp = s.parse().map_err(|_| Lossy)?;
    Ok(Some(meta::Time {
        seconds: Some(ts.as_second()),
        nanos: Some(ts.subsec_nanosecond()),
    }))
}

/// `apiVersion`/`kind` of an item inside a list, when present, must be the
/// item kind's (a protobuf list item has no type of its own).
fn item_type(o: &Map<String, Value>, api_version: &str, kind: &str) -> Enc<()> {
    let ok = |k: &str, want: &str| string(o, k).map(|v| v.is_none_or(|v| v == want));
    if ok("apiVersion", api_version)? && ok("kind", kind)? {
        Ok(())
    } else {
        Err(Lossy)
    }
}

// ---------------------------------------------------------------------------
// meta/v1

fn object_meta_to_json(m: &Option<meta::ObjectMeta>) -> Result<Value, String> {
    let Some(m) = m else {
        return Ok(Value::Object(Map::new()));
    };
    let mut o = Out::default();
    o.str("name", &m.name)
        .str("generateName", &m.generate_name)
        .str("namespace", &m.namespace)
        .str("selfLink", &m.self_link)
        .str("uid", &m.uid)
        .str("resourceVersion", &m.resource_version)
        .int("generation", m.generation)
        .time("creationTimestamp", &m.creation_timestamp)?
        .time("deletionTimestamp", &m.deletion_timestamp)?
        .ptr(
            "deletionGracePeriodSeconds",
            m.deletion_grace_period_seconds,
        )
        .map("labels", &m.labels)
        .map("annotations", &m.annotations)
        .list("ownerReferences", &m.owner_references, owner_ref_to_json)?
        .strings("finalizers", &m.finalizers)
        .list("managedFields", &m.managed_fields, managed_fields_to_json)?;
    Ok(o.done())
}

fn owner_ref_to_json(r: &meta::OwnerReference) -> Result<Value, String> {
    Ok(Out::default()
        .str_always("apiVersion", &r.api_version)
        .str_always("kind", &r.kind)
        .str_always("name", &r.name)
        .str_always("uid", &r.uid)
        .ptr("controller", r.controller)
        .ptr("blockOwnerDeletion", r.block_owner_deletion)
        .done())
}

fn managed_fields_to_json(e: &meta::ManagedFieldsEntry) -> Result<Value, String> {
    let mut o = Out::default();
    o.str("manager", &e.manager)
        .str("operation", &e.operation)
        .str("apiVersion", &e.api_version)
        .time("time", &e.time)?
        .str("fieldsType", &e.fields_type);
    if let Some(f) = &e.fields_v1 {
        let raw = f.raw.as_deref().unwrap_or(b"{}");
        let v: Value = serde_json::from_slice(raw)
            .map_err(|e| format!("managedFields fieldsV1 is not JSON: {e}"))?;
        o.put("fieldsV1", v);
    }
    o.str("subresource", &e.subresource);
    Ok(o.done())
}

fn object_meta_from_json(v: &Value) -> Enc<meta::ObjectMeta> {
    let o = fields(
        v,
        &[
            "name",
            "generateName",
            "namespace",
            "selfLink",
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "labels",
            "annotations",
            "ownerReferences",
            "finalizers",
            "managedFields",
        ],
    )?;
    Ok(meta::ObjectMeta {
        name: string(o, "name")?,
        generate_name: string(o, "generateName")?,
        namespace: string(o, "namespace")?,
        self_link: string(o, "selfLink")?,
        uid: string(o, "uid")?,
        resource_version: string(o, "resourceVersion")?,
        generation: int64(o, "generation")?,
        creation_timestamp: time(o, "creationTimestamp")?,
        deletion_timestamp: time(o, "deletionTimestamp")?,
        deletion_grace_period_seconds: int64(o, "deletionGracePeriodSeconds")?,
        labels: string_map(o, "labels")?,
        annotations: string_map(o, "annotations")?,
        owner_references: messages(o, "ownerReferences", owner_ref_from_json)?,
        finalizers: strings(o, "finalizers")?,
        managed_fields: messages(o, "managedFields", managed_fields_from_json)?,
    })
}

fn owner_ref_from_json(v: &Value) -> Enc<meta::OwnerReference> {
    let o = fields(
        v,
        &[
            "apiVersion",
            "kind",
            "name",
            "uid",
            "controller",
            "blockOwnerDeletion",
        ],
    )?;
    Ok(meta::OwnerReference {
        api_version: string(o, "apiVersion")?,
        kind: string(o, "kind")?,
        name: string(o, "name")?,
        uid: string(o, "uid")?,
        controller: boolean(o, "controller")?,
        block_owner_deletion: boolean(o, "blockOwnerDeletion")?,
    })
}

fn managed_fields_from_json(v: &Value) -> Enc<meta::ManagedFieldsEntry> {
    let o = fields(
        v,
        &[
            "manager",
            "operation",
            "apiVersion",
            "time",
            "fieldsType",
            "fieldsV1",
            "subresource",
        ],
    )?;
    let fields_v1 = match get(o, "fieldsV1") {
        None => None,
        Some(f @ Value::Object(_)) => Some(meta::FieldsV1 {
            raw: Some(serde_json::to_vec(f).map_err(|_| Lossy)?),
        }),
        Some(_) => return Err(Lossy),
    };
    Ok(meta::ManagedFieldsEntry {
        manager: string(o, "manager")?,
        operation: string(o, "operation")?,
        api_version: string(o, "apiVersion")?,
        time: time(o, "time")?,
        fields_type: string(o, "fieldsType")?,
        fields_v1,
        subresource: string(o, "subresource")?,
    })
}

fn list_meta_to_json(m: &Option<meta::ListMeta>) -> Value {
    let Some(m) = m else {
        return Value::Object(Map::new());
    };
    Out::default()
        .str("selfLink", &m.self_link)
        .str("resourceVersion", &m.resource_version)
        .str("continue", &m.r#continue)
        .ptr("remainingItemCount", m.remaining_item_count)
        .done()
}

fn list_meta_from_json(v: &Value) -> Enc<meta::ListMeta> {
    let o = fields(
        v,
        &[
            "selfLink",
            "resourceVersion",
            "continue",
            "remainingItemCount",
        ],
    )?;
    Ok(meta::ListMeta {
        self_link: string(o, "selfLink")?,
        resource_version: string(o, "resourceVersion")?,
        r#continue: string(o, "continue")?,
        remaining_item_count: int64(o, "remainingItemCount")?,
    })
}

impl Convert for meta::Status {
    fn to_json(&self) -> Result<Value, String> {
        let mut o = Out::default();
        o.put("metadata", list_meta_to_json(&self.metadata))
            .str("status", &self.status)
            .str("message", &self.message)
            .str("reason", &self.reason);
        if let Some(d) = &self.details {
            let mut details = Out::default();
            details
                .str("name", &d.name)
                .str("group", &d.group)
                .str("kind", &d.kind)
                .str("uid", &d.uid)
                .list("causes", &d.causes, |c| {
                    Ok(Out::default()
                        .str("reason", &c.reason)
                        .str("message", &c.message)
                        .str("field", &c.field)
                        .done())
                })?
                .int("retryAfterSeconds", d.retry_after_seconds.map(i64::from));
            o.put("details", details.done());
        }
        o.int("code", self.code.map(i64::from));
        Ok(o.done())
    }

    fn from_json(v: &Value) -> Enc<Self> {
        let o = fields(
            v,
            &[
                "apiVersion",
                "kind",
                "metadata",
                "status",
                "message",
                "reason",
                "details",
                "code",
            ],
        )?;
        let details = |v: &Value| {
            let d = fields(
                v,
                &[
                    "name",
                    "group",
                    "kind",
                    "uid",
                    "causes",
                    "retryAfterSeconds",
                ],
            )?;
            Ok(meta::StatusDetails {
                name: string(d, "name")?,
                group: string(d, "group")?,
                kind: string(d, "kind")?,
                uid: string(d, "uid")?,
                causes: messages(d, "causes", |c| {
                    let c = fields(c, &["reason", "message", "field"])?;
                    Ok(meta::StatusCause {
                        reason: string(c, "reason")?,
                        message: string(c, "message")?,
                        field: string(c, "field")?,
                    })
                })?,
                retry_after_seconds: int32(d, "retryAfterSeconds")?,
            })
        };
        Ok(meta::Status {
            metadata: message(o, "metadata", list_meta_from_json)?,
            status: string(o, "status")?,
            message: string(o, "message")?,
            reason: string(o, "reason")?,
            details: message(o, "details", details)?,
            code: int32(o, "code")?,
        })
    }
}

impl Convert for meta::DeleteOptions {
    fn to_json(&self) -> Result<Value, String> {
        let mut o = Out::default();
        o.ptr("gracePeriodSeconds", self.grace_period_seconds);
        if let Some(p) = &self.preconditions {
            let p = Out::default()
                .str_ptr("uid", &p.uid)
                .str_ptr("resourceVersion", &p.resource_version)
                .done();
            o.put("preconditions", p);
        }
        o.ptr("orphanDependents", self.orphan_dependents)
            .str_ptr("propagationPolicy", &self.propagation_policy)
            .strings("dryRun", &self.dry_run)
            .ptr(
                "ignoreStoreReadErrorWithClusterBreakingPotential",
                self.ignore_store_read_error_with_cluster_breaking_potential,
            );
        Ok(o.done())
    }

    fn from_json(v: &Value) -> Enc<Self> {
        let o = fields(
            v,
            &[
                "apiVersion",
                "kind",
                "gracePeriodSeconds",
                "preconditions",
                "orphanDependents",
                "propagationPolicy",
                "dryRun",
                "ignoreStoreReadErrorWithClusterBreakingPotential",
            ],
        )?;
        Ok(meta::DeleteOptions {
            grace_period_seconds: int64(o, "gracePeriodSeconds")?,
            preconditions: message(o, "preconditions", |p| {
                let p = fields(p, &["uid", "resourceVersion"])?;
                Ok(meta::Preconditions {
                    uid: string(p, "uid")?,
                    resource_version: string(p, "resourceVersion")?,
                })
            })?,
            orphan_dependents: boolean(o, "orphanDependents")?,
            propagation_policy: string(o, "propagationPolicy")?,
            dry_run: strings(o, "dryRun")?,
            ignore_store_read_error_with_cluster_breaking_potential: boolean(
                o,
                "ignoreStoreReadErrorWithClusterBreakingPotential",
            )?,
        })
    }
}

// ---------------------------------------------------------------------------
// core/v1

impl Convert for core::ConfigMap {
    fn to_json(&self) -> Result<Value, String> {
        Ok(Out::default()
            .put("metadata", object_meta_to_json(&self.metadata)?)
            .ptr("immutable", self.immutable)
            .map("data", &self.data)
            .bytes_map("binaryData", &self.binary_data)
            .done())
    }

    fn from_json(v: &Value) -> Enc<Self> {
        let o = fields(
            v,
            &[
                "apiVersion",
                "kind",
                "metadata",
                "immutable",
                "data",
                "binaryData",
            ],
        )?;
        Ok(core::ConfigMap {
            metadata: message(o, "metadata", object_meta_from_json)?,
            immutable: boolean(o, "immutable")?,
            data: string_map(o, "data")?,
            binary_data: bytes_map(o, "binaryData")?,
        })
    }
}

impl Convert for core::Secret {
    fn to_json(&self) -> Result<Value, String> {
        Ok(Out::default()
            .put("metadata", object_meta_to_json(&self.metadata)?)
            .ptr("immutable", self.immutable)
            .bytes_map("data", &self.data)
            .map("stringData", &self.string_data)
            .str("type", &self.r#type)
            .done())
    }

    fn from_json(v: &Value) -> Enc<Self> {
        let o = fields(
            v,
            &[
                "apiVersion",
                "kind",
                "metadata",
                "immutable",
                "data",
                "stringData",
                "type",
            ],
        )?;
        Ok(core::Secret {
            metadata: message(o, "metadata", object_meta_from_json)?,
            immutable: boolean(o, "immutable")?,
            data: bytes_map(o, "data")?,
            string_data: string_map(o, "stringData")?,
            r#type: string(o, "type")?,
        })
    }
}

impl Convert for core::Namespace {
    fn to_json(&self) -> Result<Value, String> {
        // Go's spec and status are structs, always present in its JSON.
        let spec = self.spec.clone().unwrap_or_default();
        let status = self.status.clone().unwrap_or_default();
        let mut st = Out::default();
        st.str("phase", &status.phase)
            .list("conditions", &status.conditions, |c| {
                let mut o = Out::default();
                o.str("type", &c.r#type)
                    .str("status", &c.status)
                    .time("lastTransitionTime", &c.last_transition_time)?
                    .str("reason", &c.reason)
                    .str("message", &c.message);
                Ok(o.done())
            })?;
        Ok(Out::default()
            .put("metadata", object_meta_to_json(&self.metadata)?)
            .put(
                "spec",
                Out::default()
                    .strings("finalizers", &spec.finalizers)
                    .done(),
            )
            .put("status", st.done())
            .done())
    }

    fn from_json(v: &Value) -> Enc<Self> {
        let o = fields(v, &["apiVersion", "kind", "metadata", "spec", "status"])?;
        let spec = |v: &Value| {
            let s = fields(v, &["finalizers"])?;
            Ok(core::NamespaceSpec {
                finalizers: strings(s, "finalizers")?,
            })
        };
        let condition = |v: &Value| {
            let c = fields(
                v,
                &["type", "status", "lastTransitionTime", "reason", "message"],
            )?;
            Ok(core::NamespaceCondition {
                r#type: string(c, "type")?,
                status: string(c, "status")?,
                last_transition_time: time(c, "lastTransitionTime")?,
                reason: string(c, "reason")?,
                message: string(c, "message")?,
            })
        };
        let status = |v: &Value| {
            let s = fields(v, &["phase", "conditions"])?;
            Ok(core::NamespaceStatus {
                phase: string(s, "phase")?,
                conditions: messages(s, "conditions", condition)?,
            })
        };
        Ok(core::Namespace {
            metadata: message(o, "metadata", object_meta_from_json)?,
            spec: message(o, "spec", spec)?,
            status: message(o, "status", status)?,
        })
    }
}

// ---------------------------------------------------------------------------
// autoscaling/v1

impl Convert for autoscaling::Scale {
    fn to_json(&self) -> Result<Value, String> {
        // Go's spec and status are structs, always present; status.replicas
        // has no omitempty.
        let spec = self.spec.unwrap_or_default();
        let status = self.status.clone().unwrap_or_default();
        Ok(Out::default()
            .put("metadata", object_meta_to_json(&self.metadata)?)
            .put(
                "spec",
                Out::default()
                    .int("replicas", spec.replicas.map(i64::from))
                    .done(),
            )
            .put(
                "status",
                Out::default()
                    .put("replicas", status.replicas.unwrap_or(0).into())
                    .str("selector", &status.selector)
                    .done(),
            )
            .done())
    }

    fn from_json(v: &Value) -> Enc<Self> {
        let o = fields(v, &["apiVersion", "kind", "metadata", "spec", "status"])?;
        let spec = |v: &Value| {
            let s = fields(v, &["replicas"])?;
            Ok(autoscaling::ScaleSpec {
                replicas: int32(s, "replicas")?,
            })
        };
        let status = |v: &Value| {
            let s = fields(v, &["replicas", "selector"])?;
            Ok(autoscaling::ScaleStatus {
                replicas: int32(s, "replicas")?,
                selector: string(s, "selector")?,
            })
        };
        Ok(autoscaling::Scale {
            metadata: message(o, "metadata", object_meta_from_json)?,
            spec: message(o, "spec", spec)?,
            status: message(o, "status", status)?,
        })
    }
}

/// Lists: `metadata` (ListMeta) and `items` of a converted kind.
macro_rules! list_kind {
    ($list:ty, $item:ty, $item_kind:literal) => {
        impl Convert for $list {
            fn to_json(&self) -> Result<Value, String> {
                let items = self
                    .items
                    .iter()
                    .map(Convert::to_json)
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Out::default()
                    .put("metadata", list_meta_to_json(&self.metadata))
                    .put("items", Value::Array(items))
                    .done())
            }

            fn from_json(v: &Value) -> Enc<Self> {
                let o = fields(v, &["apiVersion", "kind", "metadata", "items"])?;
                Ok(Self {
                    metadata: message(o, "metadata", list_meta_from_json)?,
                    items: messages(o, "items", |item| {
                        item_type(item.as_object().ok_or(Lossy)?, "v1", $item_kind)?;
                        <$item>::from_json(item)
                    })?,
                })
            }
        }
    };
}

list_kind!(core::ConfigMapList, core::ConfigMap, "ConfigMap");
list_kind!(core::SecretList, core::Secret, "Secret");
list_kind!(core::NamespaceList, core::Namespace, "Namespace");

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn round_trip(v: &Value) -> Value {
        decode(&encode(v).expect("converted")).expect("decodes")
    }

    #[test]
    fn accept_negotiation() {
        assert!(prefers_protobuf(Some(
            "application/vnd.kubernetes.protobuf,application/json"
        )));
        assert!(prefers_protobuf(Some(
            "application/json;q=0.5, application/vnd.kubernetes.protobuf"
        )));
        assert!(!prefers_protobuf(None));
        assert!(!prefers_protobuf(Some("application/json, */*")));
        assert!(!prefers_protobuf(Some(
            "application/json, application/vnd.kubernetes.protobuf"
        )));
        assert!(!prefers_protobuf(Some("*/*")));
        assert!(!prefers_protobuf(Some(
            "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json"
        )));
        assert!(!prefers_protobuf(Some(
            "application/vnd.kubernetes.protobuf;q=0,application/json"
        )));
    }

    #[test]
    fn config_map_round_trip() {
        let cm = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "a", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                "generateName": "a-", "generation": 3,
                "creationTimestamp": "2024-05-06T07:08:09Z",
                "deletionTimestamp": "2024-05-06T07:09:00Z",
                "deletionGracePeriodSeconds": 0,
                "labels": {"l": "1"}, "annotations": {"a": ""},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d",
                    "uid": "u-2", "controller": true, "blockOwnerDeletion": false}],
                "finalizers": ["x/y"],
                "managedFields": [{"manager": "m", "operation": "Update", "apiVersion": "v1",
                    "time": "2024-05-06T07:08:09Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:data": {}}}],
            },
            "data": {"k": "v", "empty": ""},
            "binaryData": {"b": "AAEC/w=="},
            "immutable": false,
        });
        assert_eq!(round_trip(&cm), cm);
    }

    #[test]
    fn secret_namespace_status_lists_round_trip() {
        let s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "data": {"k": "dg=="}, "stringData": {"x": "y"}, "type": "Opaque", "immutable": true});
        assert_eq!(round_trip(&s), s);
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Terminating", "conditions": [{"type": "T", "status": "True",
                "lastTransitionTime": "2024-01-01T00:00:00Z", "reason": "R", "message": "M"}]}});
        assert_eq!(round_trip(&ns), ns);
        let st = json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "message": "m", "reason": "NotFound", "code": 404,
            "details": {"name": "x", "kind": "configmaps", "uid": "u",
                "causes": [{"reason": "r", "message": "m", "field": "f"}], "retryAfterSeconds": 1}});
        assert_eq!(round_trip(&st), st);
        let list = json!({"apiVersion": "v1", "kind": "SecretList",
            "metadata": {"resourceVersion": "9", "continue": "c", "remainingItemCount": 0},
            "items": [{"metadata": {"name": "s"}, "type": "Opaque"}]});
        assert_eq!(round_trip(&list), list);
        let sc = json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": "d", "namespace": "n"},
            "spec": {"replicas": 3}, "status": {"replicas": 0, "selector": "app=d"}});
        assert_eq!(round_trip(&sc), sc);
        let d = json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
            "preconditions": {"uid": "u", "resourceVersion": ""}, "propagationPolicy": "Foreground",
            "dryRun": ["All"], "orphanDependents": false});
        assert_eq!(round_trip(&d), d);
    }

    #[test]
    fn lossy_objects_are_not_encoded() {
        let unknown_field = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a"}, "extra": 1});
        assert!(encode(&unknown_field).is_none());
        let unknown_meta = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "clusterName": "x"}});
        assert!(encode(&unknown_meta).is_none());
        let wrong_type = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": 1}});
        assert!(encode(&wrong_type).is_none());
        let item_kind = json!({"apiVersion": "v1", "kind": "SecretList",
            "items": [{"kind": "ConfigMap", "metadata": {}}]});
        assert!(encode(&item_kind).is_none());
        let other_kind = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {}});
        assert!(encode(&other_kind).is_none());
        // Items carry apiVersion/kind in the store: implied by the list.
        let typed_items = json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {},
            "items": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}]});
        assert!(encode(&typed_items).is_some());
    }

    #[test]
    fn bad_bodies() {
        assert_eq!(decode(b"{}").unwrap_err().code, 400);
        assert_eq!(decode(b"k8s\0\xff\xff\xff").unwrap_err().code, 400);
        let deploy = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("apps/v1".into()),
                kind: Some("Deployment".into()),
            }),
            raw: Some(Vec::new()),
            content_encoding: None,
            content_type: None,
        };
        let mut body = MAGIC.to_vec();
        body.extend(deploy.encode_to_vec());
        let e = decode(&body).unwrap_err();
        assert_eq!(e.code, 415);
        assert!(e.message.contains("Deployment"), "{}", e.message);
    }
}
