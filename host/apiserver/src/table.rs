//! Server-side printing: the `meta.k8s.io` `Table` kube-apiserver answers
//! when a client asks for one in its Accept header (kubectl does for every
//! `get` printed as columns). The columns and cells follow kube-apiserver's
//! printers for the kinds this server stores; anything else gets its default
//! table (Name, Created At).
//!
//! A Table carries list metadata (resourceVersion, continue,
//! remainingItemCount), `columnDefinitions` (left out, as `null`, in watch
//! events after the first one) and one row per object: its cells, and the
//! object itself as `PartialObjectMetadata` (default, `includeObject=Metadata`),
//! in full (`includeObject=Object`) or not at all (`includeObject=None`).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::api::Query;
use crate::error::ApiError;
use crate::resources::ResourceType;

/// What goes into each row's `object`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Include {
    Metadata,
    Object,
    None,
}

/// A request for a Table instead of the object or list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableRequest {
    /// `meta.k8s.io/v1` or `meta.k8s.io/v1beta1`, as the client asked.
    pub api_version: &'static str,
    pub include: Include,
}

/// Whether the Accept header asks for a Table, and with which options.
///
/// Media ranges are taken in the client's order: the first one this server
/// can answer decides. `application/json;as=Table;g=meta.k8s.io;v=v1` (or
/// `v1beta1`) is a Table; a plain JSON (or wildcard) range is the object or
/// list as always; other conversions (`as=PartialObjectMetadata...`) are not
/// served and skipped. No Accept header, or nothing recognised: no Table.
pub fn requested(accept: Option<&str>, q: &Query) -> Result<Option<TableRequest>, ApiError> {
    let Some(accept) = accept else {
        return Ok(None);
    };
    let mut api_version = None;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        if !matches!(media.as_str(), "application/json" | "application/*" | "*/*") {
            continue;
        }
        let params: BTreeMap<String, &str> = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim()))
            .collect();
        match params.get("as").copied() {
            None => break,
            Some("Table") if params.get("g").copied() == Some("meta.k8s.io") => {
                match params.get("v").copied() {
                    Some("v1") => api_version = Some("meta.k8s.io/v1"),
                    Some("v1beta1") => api_version = Some("meta.k8s.io/v1beta1"),
                    _ => continue,
                }
                break;
            }
            Some(_) => continue,
        }
    }
    let Some(api_version) = api_version else {
        return Ok(None);
    };
    let include = match q.get("includeObject").map(String::as_str) {
        None | Some("") | Some("Metadata") => Include::Metadata,
        Some("Object") => Include::Object,
        Some("None") => Include::None,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Unable to convert to Table as requested: includeObject: Invalid value: {other:?}: must be 'Metadata', 'Object', 'None', or empty"
            )));
        }
    };
    Ok(Some(TableRequest {
        api_version,
        include,
    }))
}

/// One column definition.
struct Column {
    name: &'static str,
    ty: &'static str,
    format: &'static str,
    description: &'static str,
    priority: i32,
}

const fn col(name: &'static str, ty: &'static str, description: &'static str) -> Column {
    Column {
        name,
        ty,
        format: "",
        description,
        priority: 0,
    }
}

const fn wide(name: &'static str, ty: &'static str, description: &'static str) -> Column {
    Column {
        priority: 1,
        ..col(name, ty, description)
    }
}

const NAME_DOC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DOC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const CONTAINERS_DOC: &str = "Names of each container in the template.";
const IMAGES_DOC: &str = "Images referenced by each container in the template.";

const NAME: Column = Column {
    format: "name",
    ..col("Name", "string", NAME_DOC)
};
const AGE: Column = col("Age", "string", AGE_DOC);

/// Which of kube-apiserver's printers a resource uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Printer {
    Namespace,
    ConfigMap,
    Secret,
    Service,
    Pod,
    Event,
    EndpointSlice,
    Deployment,
    StatefulSet,
    DaemonSet,
    Lease,
    MutatingWebhookConfiguration,
    /// The generic registry's default: Name and Created At.
    Default,
}

fn printer(rt: &ResourceType) -> Printer {
    match (rt.group, rt.plural) {
        ("", "namespaces") => Printer::Namespace,
        ("", "configmaps") => Printer::ConfigMap,
        ("", "secrets") => Printer::Secret,
        ("", "services") => Printer::Service,
        ("", "pods") => Printer::Pod,
        ("" | "events.k8s.io", "events") => Printer::Event,
        ("discovery.k8s.io", "endpointslices") => Printer::EndpointSlice,
        ("apps", "deployments") => Printer::Deployment,
        ("apps", "statefulsets") => Printer::StatefulSet,
        ("apps", "daemonsets") => Printer::DaemonSet,
        ("coordination.k8s.io", "leases") => Printer::Lease,
        (crate::resources::ADMISSION_GROUP, "mutatingwebhookconfigurations") => {
            Printer::MutatingWebhookConfiguration
        }
        _ => Printer::Default,
    }
}

fn columns(p: Printer) -> &'static [Column] {
    match p {
        Printer::Namespace => {
            const C: &[Column] = &[
                NAME,
                col("Status", "string", "The status of the namespace"),
                AGE,
            ];
            C
        }
        Printer::ConfigMap => {
            const C: &[Column] = &[
                NAME,
                col(
                    "Data",
                    "string",
                    "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.",
                ),
                AGE,
            ];
            C
        }
        Printer::Secret => {
            const C: &[Column] = &[
                NAME,
                col(
                    "Type",
                    "string",
                    "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types",
                ),
                col(
                    "Data",
                    "string",
                    "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4",
                ),
                AGE,
            ];
            C
        }
        Printer::Service => {
            const C: &[Column] = &[
                NAME,
                col(
                    "Type",
                    "string",
                    "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer.",
                ),
                col(
                    "Cluster-IP",
                    "string",
                    "clusterIP is the IP address of the service and is usually assigned randomly.",
                ),
                col(
                    "External-IP",
                    "string",
                    "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.  These IPs are not managed by Kubernetes.  The user is responsible for ensuring that traffic arrives at a node with this IP.  A common example is external load-balancers that are not part of the Kubernetes system.",
                ),
                col(
                    "Port(s)",
                    "string",
                    "The list of ports that are exposed by this service. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies",
                ),
                AGE,
                wide(
                    "Selector",
                    "string",
                    "Route service traffic to pods with label keys and values matching this selector. If empty or not present, the service is assumed to have an external process managing its endpoints, which Kubernetes will not modify. Only applies to types ClusterIP, NodePort, and LoadBalancer. Ignored if type is ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/",
                ),
            ];
            C
        }
        Printer::Pod => {
            const C: &[Column] = &[
                NAME,
                col(
                    "Ready",
                    "string",
                    "The aggregate readiness state of this pod for accepting traffic.",
                ),
                col(
                    "Status",
                    "string",
                    "The aggregate status of the containers in this pod.",
                ),
                col(
                    "Restarts",
                    "string",
                    "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                ),
                AGE,
                wide(
                    "IP",
                    "string",
                    "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
                ),
                wide(
                    "Node",
                    "string",
                    "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName.",
                ),
                wide(
                    "Nominated Node",
                    "string",
                    "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods.",
                ),
                wide(
                    "Readiness Gates",
                    "string",
                    "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates",
                ),
            ];
            C
        }
        Printer::Event => {
            const C: &[Column] = &[
                col(
                    "Last Seen",
                    "string",
                    "The time at which the most recent occurrence of this event was recorded.",
                ),
                col(
                    "Type",
                    "string",
                    "Type of this event (Normal, Warning), new types could be added in the future",
                ),
                col(
                    "Reason",
                    "string",
                    "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
                ),
                col("Object", "string", "The object that this event is about."),
                wide(
                    "Subobject",
                    "string",
                    "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2].",
                ),
                wide(
                    "Source",
                    "string",
                    "The component reporting this event. Should be a short machine understandable string.",
                ),
                col(
                    "Message",
                    "string",
                    "A human-readable description of the status of this operation.",
                ),
                wide(
                    "First Seen",
                    "string",
                    "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
                ),
                wide(
                    "Count",
                    "string",
                    "The number of times this event has occurred.",
                ),
                Column {
                    priority: 1,
                    ..NAME
                },
            ];
            C
        }
        Printer::EndpointSlice => {
            const C: &[Column] = &[
                NAME,
                col(
                    "AddressType",
                    "string",
                    "addressType specifies the type of address carried by this EndpointSlice. All addresses in this slice must be the same type.",
                ),
                col(
                    "Ports",
                    "string",
                    "ports specifies the list of network ports exposed by each endpoint in this slice.",
                ),
                col(
                    "Endpoints",
                    "string",
                    "endpoints is a list of unique endpoints in this slice. Each slice may include a maximum of 1000 endpoints.",
                ),
                AGE,
            ];
            C
        }
        Printer::Deployment => {
            const C: &[Column] = &[
                NAME,
                col("Ready", "string", "Number of the pod with ready state"),
                col(
                    "Up-to-date",
                    "string",
                    "Total number of non-terminating pods targeted by this deployment that have the desired template spec.",
                ),
                col(
                    "Available",
                    "string",
                    "Total number of available non-terminating pods (ready for at least minReadySeconds) targeted by this deployment.",
                ),
                AGE,
                wide("Containers", "string", CONTAINERS_DOC),
                wide("Images", "string", IMAGES_DOC),
                wide(
                    "Selector",
                    "string",
                    "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment. It must match the pod template's labels.",
                ),
            ];
            C
        }
        Printer::StatefulSet => {
            const C: &[Column] = &[
                NAME,
                col("Ready", "string", "Number of the pod with ready state"),
                AGE,
                wide("Containers", "string", CONTAINERS_DOC),
                wide("Images", "string", IMAGES_DOC),
            ];
            C
        }
        Printer::DaemonSet => {
            const C: &[Column] = &[
                NAME,
                col(
                    "Desired",
                    "integer",
                    "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod). More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
                ),
                col(
                    "Current",
                    "integer",
                    "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod. More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
                ),
                col(
                    "Ready",
                    "integer",
                    "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition.",
                ),
                col(
                    "Up-to-date",
                    "integer",
                    "The total number of nodes that are running updated daemon pod",
                ),
                col(
                    "Available",
                    "integer",
                    "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
                ),
                col(
                    "Node Selector",
                    "string",
                    "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/",
                ),
                AGE,
                wide("Containers", "string", CONTAINERS_DOC),
                wide("Images", "string", IMAGES_DOC),
                wide(
                    "Selector",
                    "string",
                    "A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
                ),
            ];
            C
        }
        Printer::Lease => {
            const C: &[Column] = &[
                NAME,
                col(
                    "Holder",
                    "string",
                    "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.",
                ),
                AGE,
            ];
            C
        }
        Printer::MutatingWebhookConfiguration => {
            const C: &[Column] = &[
                NAME,
                col(
                    "Webhooks",
                    "integer",
                    "Webhooks indicates the number of webhooks in the configuration.",
                ),
                AGE,
            ];
            C
        }
        Printer::Default => {
            const C: &[Column] = &[NAME, col("Created At", "date", AGE_DOC)];
            C
        }
    }
}

fn column_definitions(p: Printer) -> Value {
    Value::Array(
        columns(p)
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "type": c.ty,
                    "format": c.format,
                    "description": c.description,
                    "priority": c.priority,
                })
            })
            .collect(),
    )
}

/// A Table of the objects of one list page. `meta` is the list's metadata
/// (resourceVersion, continue, remainingItemCount).
pub fn list<'a>(
    rt: &ResourceType,
    items: impl IntoIterator<Item = &'a Value>,
    meta: Value,
    req: TableRequest,
) -> Value {
    let p = printer(rt);
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = items.into_iter().map(|o| row(p, o, req, now)).collect();
    table(p, meta, rows, req, true)
}

/// A Table of one object (a GET on a name, or one watch event's object).
/// `headers: false` leaves the column definitions out (`null`), as
/// kube-apiserver does for every watch event after the first.
pub fn object(rt: &ResourceType, obj: &Value, req: TableRequest, headers: bool) -> Value {
    let p = printer(rt);
    let rv = obj
        .pointer("/metadata/resourceVersion")
        .cloned()
        .unwrap_or(Value::Null);
    let mut meta = Map::new();
    if !rv.is_null() {
        meta.insert("resourceVersion".into(), rv);
    }
    let rows = vec![row(p, obj, req, jiff::Timestamp::now())];
    table(p, Value::Object(meta), rows, req, headers)
}

fn table(p: Printer, meta: Value, rows: Vec<Value>, req: TableRequest, headers: bool) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": req.api_version,
        "metadata": meta,
        "columnDefinitions": if headers { column_definitions(p) } else { Value::Null },
        "rows": rows,
    })
}

fn row(p: Printer, obj: &Value, req: TableRequest, now: jiff::Timestamp) -> Value {
    let (cells, conditions) = cells(p, obj, now);
    let object = match req.include {
        Include::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": req.api_version,
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        }),
        Include::Object => obj.clone(),
        Include::None => Value::Null,
    };
    let mut r = json!({ "cells": cells });
    if let Some(c) = conditions {
        r["conditions"] = c;
    }
    r["object"] = object;
    r
}

// --- reading fields ---------------------------------------------------------

fn s<'a>(o: &'a Value, ptr: &str) -> &'a str {
    o.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn i(o: &Value, ptr: &str) -> i64 {
    o.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

fn arr<'a>(o: &'a Value, ptr: &str) -> &'a [Value] {
    o.pointer(ptr)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn len_of(o: &Value, ptr: &str) -> usize {
    match o.pointer(ptr) {
        Some(Value::Object(m)) => m.len(),
        Some(Value::Array(a)) => a.len(),
        _ => 0,
    }
}

fn name(o: &Value) -> Value {
    json!(s(o, "/metadata/name"))
}

/// A timestamp field (RFC 3339, with or without fraction); None when absent,
/// null, unparseable or Go's zero time.
fn time(o: &Value, ptr: &str) -> Option<jiff::Timestamp> {
    let t: jiff::Timestamp = s(o, ptr).parse().ok()?;
    (t.as_second() > ZERO_TIME).then_some(t)
}

/// 0001-01-01T00:00:00Z, Go's zero time, in Unix seconds.
const ZERO_TIME: i64 = -62_135_596_800;

/// Time since `t` the way kube-apiserver prints it, `<unknown>` for none.
fn since(t: Option<jiff::Timestamp>, now: jiff::Timestamp) -> String {
    match t {
        Some(t) => human_duration(now.duration_since(t).as_nanos()),
        None => "<unknown>".into(),
    }
}

fn age(o: &Value, now: jiff::Timestamp) -> Value {
    json!(since(time(o, "/metadata/creationTimestamp"), now))
}

/// kube's `HumanDuration`: two or three significant figures (`45s`, `3m10s`,
/// `25m`, `5h2m`, `20h`, `3d4h`, `40d`, `2y10d`, `9y`).
pub fn human_duration(nanos: i128) -> String {
    const SEC: i128 = 1_000_000_000;
    let seconds = nanos / SEC;
    if seconds < -1 {
        return "<invalid>".into();
    } else if seconds < 0 {
        return "0s".into();
    } else if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = nanos / (60 * SEC);
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    } else if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = nanos / (3600 * SEC);
    if hours < 8 {
        let m = minutes % 60;
        if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        let h = hours % 24;
        if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        }
    } else if hours < 24 * 365 * 2 {
        format!("{}d", hours / 24)
    } else if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        }
    } else {
        format!("{}y", hours / 24 / 365)
    }
}

/// `k=v,k2=v2` sorted by key, `<none>` when empty (labels.FormatLabels).
fn format_labels(m: Option<&Value>) -> String {
    let s = label_set(m);
    if s.is_empty() { "<none>".into() } else { s }
}

fn label_set(m: Option<&Value>) -> String {
    let Some(Value::Object(m)) = m else {
        return String::new();
    };
    let sorted: BTreeMap<&String, &str> = m
        .iter()
        .map(|(k, v)| (k, v.as_str().unwrap_or("")))
        .collect();
    sorted
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A LabelSelector as a selector string (requirements sorted by key), empty
/// for none.
fn label_selector(sel: Option<&Value>) -> String {
    let Some(sel) = sel.filter(|v| v.is_object()) else {
        return String::new();
    };
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(Value::Object(m)) = sel.get("matchLabels") {
        for (k, v) in m {
            reqs.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))));
        }
    }
    for e in arr(sel, "/matchExpressions") {
        let key = s(e, "/key");
        let mut values: Vec<&str> = arr(e, "/values").iter().filter_map(Value::as_str).collect();
        values.sort_unstable();
        let text = match s(e, "/operator") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            _ => return "<invalid>".into(),
        };
        reqs.push((key.to_string(), text));
    }
    reqs.sort_by(|a, b| a.0.cmp(&b.0));
    reqs.into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join(",")
}

/// metav1.FormatLabelSelector: `<none>` for an empty result.
fn format_label_selector(sel: Option<&Value>) -> String {
    let s = label_selector(sel);
    if s.is_empty() { "<none>".into() } else { s }
}

/// Container names and images of a pod template, comma separated.
fn containers(o: &Value, ptr: &str) -> (Value, Value) {
    let cs = arr(o, ptr);
    let names: Vec<&str> = cs.iter().map(|c| s(c, "/name")).collect();
    let images: Vec<&str> = cs.iter().map(|c| s(c, "/image")).collect();
    (json!(names.join(",")), json!(images.join(",")))
}

fn list_with_more(list: Vec<String>, count: usize, max: usize) -> String {
    let joined = list.join(",");
    if count > max {
        format!("{joined} + {} more...", count - max)
    } else if joined.is_empty() {
        "<unset>".into()
    } else {
        joined
    }
}

// --- cells per printer -------------------------------------------------------

fn cells(p: Printer, o: &Value, now: jiff::Timestamp) -> (Vec<Value>, Option<Value>) {
    let cells = match p {
        Printer::Namespace => vec![name(o), json!(s(o, "/status/phase")), age(o, now)],
        Printer::ConfigMap => vec![
            name(o),
            json!(len_of(o, "/data") + len_of(o, "/binaryData")),
            age(o, now),
        ],
        Printer::Secret => vec![
            name(o),
            json!(s(o, "/type")),
            json!(len_of(o, "/data")),
            age(o, now),
        ],
        Printer::Service => service(o, now),
        Printer::Pod => return pod(o, now),
        Printer::Event => event(o, now),
        Printer::EndpointSlice => {
            let ports = arr(o, "/ports");
            let port_list = ports
                .iter()
                .take(3)
                .map(|p| match p.get("port").and_then(Value::as_i64) {
                    Some(n) => n.to_string(),
                    None => p
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("*")
                        .to_string(),
                })
                .collect();
            let addresses: Vec<&str> = arr(o, "/endpoints")
                .iter()
                .flat_map(|e| arr(e, "/addresses"))
                .filter_map(Value::as_str)
                .collect();
            let count = addresses.len();
            let addr_list = addresses.into_iter().take(3).map(str::to_string).collect();
            vec![
                name(o),
                json!(s(o, "/addressType")),
                json!(list_with_more(port_list, ports.len(), 3)),
                json!(list_with_more(addr_list, count, 3)),
                age(o, now),
            ]
        }
        Printer::Deployment => {
            let (names, images) = containers(o, "/spec/template/spec/containers");
            vec![
                name(o),
                json!(format!("{}/{}", i(o, "/status/readyReplicas"), replicas(o))),
                json!(i(o, "/status/updatedReplicas")),
                json!(i(o, "/status/availableReplicas")),
                age(o, now),
                names,
                images,
                json!(label_selector(o.pointer("/spec/selector"))),
            ]
        }
        Printer::StatefulSet => {
            let (names, images) = containers(o, "/spec/template/spec/containers");
            vec![
                name(o),
                json!(format!("{}/{}", i(o, "/status/readyReplicas"), replicas(o))),
                age(o, now),
                names,
                images,
            ]
        }
        Printer::DaemonSet => {
            let (names, images) = containers(o, "/spec/template/spec/containers");
            vec![
                name(o),
                json!(i(o, "/status/desiredNumberScheduled")),
                json!(i(o, "/status/currentNumberScheduled")),
                json!(i(o, "/status/numberReady")),
                json!(i(o, "/status/updatedNumberScheduled")),
                json!(i(o, "/status/numberAvailable")),
                json!(format_labels(o.pointer("/spec/template/spec/nodeSelector"))),
                age(o, now),
                names,
                images,
                json!(format_label_selector(o.pointer("/spec/selector"))),
            ]
        }
        Printer::Lease => vec![name(o), json!(s(o, "/spec/holderIdentity")), age(o, now)],
        Printer::MutatingWebhookConfiguration => {
            vec![name(o), json!(arr(o, "/webhooks").len()), age(o, now)]
        }
        Printer::Default => {
            let created = time(o, "/metadata/creationTimestamp")
                .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_else(|| "0001-01-01T00:00:00Z".into());
            vec![name(o), json!(created)]
        }
    };
    (cells, None)
}

/// spec.replicas, defaulted to 1 as the API server defaults it.
fn replicas(o: &Value) -> i64 {
    o.pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

fn service(o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let ty = s(o, "/spec/type");
    let cluster_ip = arr(o, "/spec/clusterIPs")
        .first()
        .and_then(Value::as_str)
        .or_else(|| Some(s(o, "/spec/clusterIP")).filter(|s| !s.is_empty()))
        .unwrap_or("<none>");
    let external: Vec<&str> = arr(o, "/spec/externalIPs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let external_ip = match ty {
        "ClusterIP" | "NodePort" | "" if !external.is_empty() => external.join(","),
        "ClusterIP" | "NodePort" | "" => "<none>".into(),
        "LoadBalancer" => {
            let mut lb: Vec<&str> = arr(o, "/status/loadBalancer/ingress")
                .iter()
                .filter_map(|i| {
                    [i.get("ip"), i.get("hostname")]
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .find(|s| !s.is_empty())
                })
                .collect();
            lb.sort_unstable();
            lb.dedup();
            // The table is printed wide on the server: not clipped.
            let mut all: Vec<&str> = lb;
            all.extend(external);
            if all.is_empty() {
                "<pending>".into()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => s(o, "/spec/externalName").to_string(),
        _ => "<unknown>".into(),
    };
    let ports: Vec<String> = arr(o, "/spec/ports")
        .iter()
        .map(|p| {
            let proto = Some(s(p, "/protocol"))
                .filter(|s| !s.is_empty())
                .unwrap_or("TCP");
            match i(p, "/nodePort") {
                0 => format!("{}/{proto}", i(p, "/port")),
                np => format!("{}:{np}/{proto}", i(p, "/port")),
            }
        })
        .collect();
    let ports = if ports.is_empty() {
        "<none>".into()
    } else {
        ports.join(",")
    };
    vec![
        name(o),
        json!(ty),
        json!(cluster_ip),
        json!(external_ip),
        json!(ports),
        age(o, now),
        json!(format_labels(o.pointer("/spec/selector"))),
    ]
}

fn event(o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    // events.k8s.io/v1 names the core/v1 fields differently; kube-apiserver
    // prints both through the same internal type.
    let core = o.get("involvedObject").is_some() || o.get("regarding").is_none();
    let (regarding, message, first_ts, last_ts, count, source) = if core {
        (
            "/involvedObject",
            "/message",
            "/firstTimestamp",
            "/lastTimestamp",
            "/count",
            "/source",
        )
    } else {
        (
            "/regarding",
            "/note",
            "/deprecatedFirstTimestamp",
            "/deprecatedLastTimestamp",
            "/deprecatedCount",
            "/deprecatedSource",
        )
    };
    let reporting_controller = if core {
        s(o, "/reportingComponent")
    } else {
        s(o, "/reportingController")
    };
    let first = match time(o, first_ts) {
        Some(t) => since(Some(t), now),
        None => since(time(o, "/eventTime"), now),
    };
    let mut last = match time(o, last_ts) {
        Some(t) => since(Some(t), now),
        None => first.clone(),
    };
    let mut n = i(o, count);
    if let Some(series) = o.get("series").filter(|v| v.is_object()) {
        last = since(time(series, "/lastObservedTime"), now);
        n = i(series, "/count");
    } else if n == 0 {
        n = 1;
    }
    let kind = s(o, &format!("{regarding}/kind")).to_lowercase();
    let obj_name = s(o, &format!("{regarding}/name"));
    let target = if obj_name.is_empty() {
        kind
    } else {
        format!("{kind}/{obj_name}")
    };
    let component = Some(s(o, &format!("{source}/component")))
        .filter(|s| !s.is_empty())
        .unwrap_or(reporting_controller);
    let host = Some(s(o, &format!("{source}/host")))
        .filter(|s| !s.is_empty())
        .unwrap_or(s(o, "/reportingInstance"));
    let source = if host.is_empty() {
        component.to_string()
    } else {
        format!("{component}, {host}")
    };
    vec![
        json!(last),
        json!(s(o, "/type")),
        json!(s(o, "/reason")),
        json!(target),
        json!(s(o, &format!("{regarding}/fieldPath"))),
        json!(source),
        json!(s(o, message).trim()),
        json!(first),
        json!(n),
        name(o),
    ]
}

/// The pod printer: READY, STATUS (phase, or the reason a container is
/// waiting or terminated, init progress, Terminating), RESTARTS (with the
/// time of the last one).
fn pod(o: &Value, now: jiff::Timestamp) -> (Vec<Value>, Option<Value>) {
    let phase = s(o, "/status/phase");
    let mut reason = Some(s(o, "/status/reason"))
        .filter(|r| !r.is_empty())
        .unwrap_or(phase)
        .to_string();
    if arr(o, "/status/conditions")
        .iter()
        .any(|c| s(c, "/type") == "PodScheduled" && s(c, "/reason") == "SchedulingGated")
    {
        reason = "SchedulingGated".into();
    }
    let init_specs = arr(o, "/spec/initContainers");
    let restartable = |name: &str| {
        init_specs
            .iter()
            .any(|c| s(c, "/name") == name && s(c, "/restartPolicy") == "Always")
    };
    let total = arr(o, "/spec/containers").len()
        + init_specs
            .iter()
            .filter(|c| s(c, "/restartPolicy") == "Always")
            .count();
    let mut ready = 0;
    let mut restarts = 0;
    let mut sidecar_restarts = 0;
    let mut last_restart: Option<jiff::Timestamp> = None;
    let mut last_sidecar_restart: Option<jiff::Timestamp> = None;
    let later = |a: Option<jiff::Timestamp>, b: Option<jiff::Timestamp>| match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let mut initializing = false;
    let init_statuses = arr(o, "/status/initContainerStatuses");
    for (idx, c) in init_statuses.iter().enumerate() {
        restarts += i(c, "/restartCount");
        let finished = time(c, "/lastState/terminated/finishedAt");
        last_restart = later(last_restart, finished);
        let sidecar = restartable(s(c, "/name"));
        if sidecar {
            sidecar_restarts += i(c, "/restartCount");
            last_sidecar_restart = later(last_sidecar_restart, finished);
        }
        let terminated = c.pointer("/state/terminated").filter(|t| t.is_object());
        let waiting_reason = s(c, "/state/waiting/reason");
        if terminated.is_some_and(|t| i(t, "/exitCode") == 0) {
            continue;
        }
        if sidecar && c.get("started").and_then(Value::as_bool) == Some(true) {
            if c.get("ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        }
        reason = if let Some(t) = terminated {
            match s(t, "/reason") {
                "" if i(t, "/signal") != 0 => format!("Init:Signal:{}", i(t, "/signal")),
                "" => format!("Init:ExitCode:{}", i(t, "/exitCode")),
                r => format!("Init:{r}"),
            }
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            format!("Init:{waiting_reason}")
        } else {
            format!("Init:{idx}/{}", init_specs.len())
        };
        initializing = true;
        break;
    }
    let initialized = arr(o, "/status/conditions")
        .iter()
        .any(|c| s(c, "/type") == "Initialized" && s(c, "/status") == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        for c in arr(o, "/status/containerStatuses").iter().rev() {
            restarts += i(c, "/restartCount");
            last_restart = later(last_restart, time(c, "/lastState/terminated/finishedAt"));
            let waiting = s(c, "/state/waiting/reason");
            let terminated = c.pointer("/state/terminated").filter(|t| t.is_object());
            if !waiting.is_empty() {
                reason = waiting.to_string();
            } else if let Some(t) = terminated {
                reason = match s(t, "/reason") {
                    "" if i(t, "/signal") != 0 => format!("Signal:{}", i(t, "/signal")),
                    "" => format!("ExitCode:{}", i(t, "/exitCode")),
                    r => r.to_string(),
                };
            } else if c.get("ready").and_then(Value::as_bool) == Some(true)
                && c.pointer("/state/running").is_some_and(Value::is_object)
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = arr(o, "/status/conditions")
                .iter()
                .any(|c| s(c, "/type") == "Ready" && s(c, "/status") == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.into();
        }
    }
    let deleting = o
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    if deleting && s(o, "/status/reason") == "NodeLost" {
        reason = "Unknown".into();
    } else if deleting && !matches!(phase, "Succeeded" | "Failed") {
        reason = "Terminating".into();
    }
    let restarts = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", since(Some(t), now)),
        _ => restarts.to_string(),
    };
    let ip = arr(o, "/status/podIPs")
        .first()
        .map(|p| s(p, "/ip"))
        .filter(|s| !s.is_empty())
        .unwrap_or("<none>");
    let or_none = |v: &str| {
        if v.is_empty() {
            "<none>".to_string()
        } else {
            v.to_string()
        }
    };
    let gates = arr(o, "/spec/readinessGates");
    let readiness_gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let conditions = arr(o, "/status/conditions");
        let true_count = gates
            .iter()
            .filter(|g| {
                let ty = s(g, "/conditionType");
                conditions
                    .iter()
                    .find(|c| s(c, "/type") == ty)
                    .is_some_and(|c| s(c, "/status") == "True")
            })
            .count();
        format!("{true_count}/{}", gates.len())
    };
    let conditions = match phase {
        "Succeeded" => Some(json!([{
            "type": "Completed", "status": "True", "reason": "Succeeded",
            "message": "The pod has completed successfully.",
        }])),
        "Failed" => Some(json!([{
            "type": "Completed", "status": "True", "reason": "Failed",
            "message": "The pod failed.",
        }])),
        _ => None,
    };
    (
        vec![
            name(o),
            json!(format!("{ready}/{total}")),
            json!(reason),
            json!(restarts),
            age(o, now),
            json!(ip),
            json!(or_none(s(o, "/spec/nodeName"))),
            json!(or_none(s(o, "/status/nominatedNodeName"))),
            json!(readiness_gates),
        ],
        conditions,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_match_kubernetes() {
        let s = |secs: i128| human_duration(secs * 1_000_000_000);
        assert_eq!(s(-5), "<invalid>");
        assert_eq!(human_duration(-1_500_000_000), "0s");
        assert_eq!(s(0), "0s");
        assert_eq!(s(5), "5s");
        assert_eq!(s(119), "119s");
        assert_eq!(s(120), "2m");
        assert_eq!(s(190), "3m10s");
        assert_eq!(s(25 * 60 + 7), "25m");
        assert_eq!(s(3 * 3600 + 5 * 60), "3h5m");
        assert_eq!(s(8 * 3600), "8h");
        assert_eq!(s(47 * 3600), "47h");
        assert_eq!(s(2 * 86400), "2d");
        assert_eq!(s(3 * 86400 + 4 * 3600), "3d4h");
        assert_eq!(s(40 * 86400), "40d");
        assert_eq!(s(2 * 365 * 86400 + 10 * 86400), "2y10d");
        assert_eq!(s(9 * 365 * 86400), "9y");
    }

    #[test]
    fn accept_negotiation() {
        let q = Query::new();
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        let t = requested(Some(kubectl), &q).unwrap().unwrap();
        assert_eq!(t.api_version, "meta.k8s.io/v1");
        assert_eq!(t.include, Include::Metadata);
        let t = requested(
            Some("application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json"),
            &q,
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.api_version, "meta.k8s.io/v1beta1");
        for plain in [
            None,
            Some("application/json"),
            Some("*/*"),
            Some("application/json, application/json;as=Table;v=v1;g=meta.k8s.io"),
            Some("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"),
            Some("application/json;as=Table;v=v2;g=meta.k8s.io"),
            Some("application/yaml"),
        ] {
            assert_eq!(requested(plain, &q).unwrap(), None, "{plain:?}");
        }
        let mut q = Query::new();
        q.insert("includeObject".into(), "Object".into());
        assert_eq!(
            requested(Some(kubectl), &q).unwrap().unwrap().include,
            Include::Object
        );
        q.insert("includeObject".into(), "All".into());
        let e = requested(Some(kubectl), &q).unwrap_err();
        assert_eq!(e.code, 400);
        // Not asked for a Table: the option is not looked at.
        assert_eq!(requested(Some("application/json"), &q).unwrap(), None);
    }

    #[test]
    fn selectors_print_like_kubernetes() {
        let sel = json!({
            "matchLabels": {"tier": "web", "app": "shop"},
            "matchExpressions": [
                {"key": "env", "operator": "In", "values": ["prod", "canary"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        });
        assert_eq!(
            label_selector(Some(&sel)),
            "app=shop,env in (canary,prod),!legacy,tier=web"
        );
        assert_eq!(label_selector(None), "");
        assert_eq!(format_label_selector(Some(&json!({}))), "<none>");
        assert_eq!(format_labels(Some(&json!({"b": "2", "a": "1"}))), "a=1,b=2");
    }

    #[test]
    fn event_cells_from_both_apis() {
        let now: jiff::Timestamp = "2025-01-01T00:10:00Z".parse().unwrap();
        let core = json!({
            "metadata": {"name": "orders.1"},
            "involvedObject": {"kind": "Deployment", "name": "orders"},
            "reason": "Restarted", "message": " rolled \n", "type": "Normal",
            "firstTimestamp": "2025-01-01T00:00:00Z", "lastTimestamp": "2025-01-01T00:09:55Z",
            "count": 3, "source": {"component": "wasmwatch"},
        });
        assert_eq!(
            event(&core, now),
            vec![
                json!("5s"),
                json!("Normal"),
                json!("Restarted"),
                json!("deployment/orders"),
                json!(""),
                json!("wasmwatch"),
                json!("rolled"),
                json!("10m"),
                json!(3),
                json!("orders.1"),
            ]
        );
        let new = json!({
            "metadata": {"name": "e"},
            "regarding": {"kind": "ConfigMap", "name": "cfg"},
            "reason": "Reloaded", "note": "ok", "type": "Warning",
            "eventTime": "2025-01-01T00:07:00.000000Z",
            "reportingController": "wasmwatch.io/host", "reportingInstance": "pod-a",
        });
        let c = event(&new, now);
        assert_eq!(c[0], json!("3m"));
        assert_eq!(c[3], json!("configmap/cfg"));
        assert_eq!(c[5], json!("wasmwatch.io/host, pod-a"));
        assert_eq!(c[6], json!("ok"));
        assert_eq!(c[8], json!(1));
    }

    #[test]
    fn pod_status_and_restarts() {
        let now: jiff::Timestamp = "2025-01-01T01:00:00Z".parse().unwrap();
        let p = json!({
            "metadata": {"name": "p", "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {
                "phase": "Running",
                "podIPs": [{"ip": "10.0.0.7"}],
                "containerStatuses": [
                    {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}},
                     "lastState": {"terminated": {"finishedAt": "2025-01-01T00:59:30Z"}}},
                    {"name": "b", "ready": false, "restartCount": 0,
                     "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
                ],
            },
        });
        let (c, cond) = pod(&p, now);
        assert_eq!(
            &c[..6],
            &[
                json!("p"),
                json!("1/2"),
                json!("CrashLoopBackOff"),
                json!("2 (30s ago)"),
                json!("60m"),
                json!("10.0.0.7"),
            ]
        );
        assert!(cond.is_none());
        let pending = json!({"metadata": {"name": "q"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Pending"}});
        let (c, _) = pod(&pending, now);
        assert_eq!(
            &c[1..5],
            &[
                json!("0/1"),
                json!("Pending"),
                json!("0"),
                json!("<unknown>")
            ]
        );
    }
}
