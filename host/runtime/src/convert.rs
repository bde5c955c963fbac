//! Conversions between the core types and the generated WIT types.
use std::collections::BTreeMap;

use wasmwatch_core::action::{self as core_action, Action};
use wasmwatch_core::event::{ChangeEvent, ChangeType, DataValue, ObjectKind};
use wasmwatch_core::lookups as core_lookups;

use crate::bindings::wit;

fn key_values(map: &BTreeMap<String, String>) -> Vec<wit::KeyValue> {
    map.iter()
        .map(|(k, v)| wit::KeyValue {
            key: k.clone(),
            value: v.clone(),
        })
        .collect()
}

fn key_values_owned(map: BTreeMap<String, String>) -> Vec<wit::KeyValue> {
    map.into_iter()
        .map(|(key, value)| wit::KeyValue { key, value })
        .collect()
}

pub fn kind_to_wit(k: ObjectKind) -> wit::ObjectKind {
    match k {
        ObjectKind::ConfigMap => wit::ObjectKind::ConfigMap,
        ObjectKind::Secret => wit::ObjectKind::Secret,
    }
}

pub fn kind_from_wit(k: wit::ObjectKind) -> ObjectKind {
    match k {
        wit::ObjectKind::ConfigMap => ObjectKind::ConfigMap,
        wit::ObjectKind::Secret => ObjectKind::Secret,
    }
}

/// The event as the plugin sees it: Secret values only with `secret_values`.
pub fn event_to_wit(ev: &ChangeEvent, secret_values: bool) -> wit::ChangeEvent {
    let o = &ev.object;
    let values_included = o.kind == ObjectKind::ConfigMap || secret_values;
    wit::ChangeEvent {
        kind: kind_to_wit(o.kind),
        change: match ev.change {
            ChangeType::Added => wit::ChangeType::Added,
            ChangeType::Modified => wit::ChangeType::Modified,
            ChangeType::Deleted => wit::ChangeType::Deleted,
            ChangeType::Resynced => wit::ChangeType::Resynced,
        },
        namespace: o.namespace.clone(),
        name: o.name.clone(),
        uid: o.uid.clone(),
        resource_version: o.resource_version.clone(),
        labels: key_values(&o.labels),
        annotations: key_values(&o.annotations),
        data: o
            .data
            .iter()
            .map(|(k, v)| wit::DataEntry {
                key: k.clone(),
                value: values_included.then(|| match v {
                    DataValue::Text(t) => wit::DataValue::Text(t.clone()),
                    DataValue::Binary(b) => wit::DataValue::Binary(b.clone()),
                }),
            })
            .collect(),
        values_included,
        changed_keys: ev.changed_keys.clone(),
        digest: ev.digest.clone(),
        replay: ev.replay,
    }
}

fn method(m: wit::HttpMethod) -> core_action::HttpMethod {
    match m {
        wit::HttpMethod::Get => core_action::HttpMethod::Get,
        wit::HttpMethod::Post => core_action::HttpMethod::Post,
        wit::HttpMethod::Put => core_action::HttpMethod::Put,
        wit::HttpMethod::Patch => core_action::HttpMethod::Patch,
        wit::HttpMethod::Delete => core_action::HttpMethod::Delete,
    }
}

fn headers(h: Vec<wit::Header>) -> Vec<core_action::Header> {
    h.into_iter()
        .map(|h| core_action::Header {
            name: h.name,
            value: h.value,
        })
        .collect()
}

fn workload_kind_to_wit(k: core_action::WorkloadKind) -> wit::WorkloadKind {
    match k {
        core_action::WorkloadKind::Deployment => wit::WorkloadKind::Deployment,
        core_action::WorkloadKind::StatefulSet => wit::WorkloadKind::StatefulSet,
        core_action::WorkloadKind::DaemonSet => wit::WorkloadKind::DaemonSet,
    }
}

fn workload_from_wit(w: wit::WorkloadRef) -> core_action::WorkloadRef {
    core_action::WorkloadRef {
        kind: match w.kind {
            wit::WorkloadKind::Deployment => core_action::WorkloadKind::Deployment,
            wit::WorkloadKind::StatefulSet => core_action::WorkloadKind::StatefulSet,
            wit::WorkloadKind::DaemonSet => core_action::WorkloadKind::DaemonSet,
        },
        namespace: w.namespace,
        name: w.name,
    }
}

pub fn action_from_wit(a: wit::Action) -> Action {
    match a {
        wit::Action::Http(c) => Action::Http {
            method: method(c.method),
            url: c.url,
            headers: headers(c.headers),
            body: c.body,
        },
        wit::Action::RefreshService(r) => Action::RefreshService {
            namespace: r.namespace,
            service: r.service,
            method: method(r.method),
            port: r.port,
            path: r.path,
            tls: r.tls,
        },
        wit::Action::Publish(p) => Action::Publish {
            connection: p.connection,
            destination: p.destination,
            routing_key: p.routing_key,
            headers: headers(p.headers),
            payload: p.payload,
        },
        wit::Action::Restart(r) => Action::Restart {
            workload: workload_from_wit(r.workload),
            reason: r.reason,
            content_hash: r.content_hash,
        },
        wit::Action::Event(e) => Action::Event {
            event_type: match e.event_type {
                wit::EventType::Normal => core_action::EventType::Normal,
                wit::EventType::Warning => core_action::EventType::Warning,
            },
            reason: e.reason,
            message: e.message,
        },
    }
}

fn ports(p: Vec<core_lookups::ServicePort>) -> Vec<wit::ServicePort> {
    p.into_iter()
        .map(|p| wit::ServicePort {
            name: p.name,
            port: p.port,
        })
        .collect()
}

pub fn service_to_wit(s: core_lookups::ServiceInfo) -> wit::ServiceInfo {
    wit::ServiceInfo {
        labels: key_values_owned(s.labels),
        annotations: key_values_owned(s.annotations),
        ports: ports(s.ports),
        namespace: s.namespace,
        name: s.name,
    }
}

pub fn endpoint_to_wit(e: core_lookups::Endpoint) -> wit::Endpoint {
    wit::Endpoint {
        address: e.address,
        pod: e.pod,
        ports: ports(e.ports),
    }
}

pub fn workload_to_wit(w: core_lookups::WorkloadInfo) -> wit::WorkloadInfo {
    wit::WorkloadInfo {
        labels: key_values_owned(w.labels),
        annotations: key_values_owned(w.annotations),
        template_annotations: key_values_owned(w.template_annotations),
        workload: wit::WorkloadRef {
            kind: workload_kind_to_wit(w.workload.kind),
            namespace: w.workload.namespace,
            name: w.workload.name,
        },
    }
}

pub fn labels_from_wit(l: Vec<wit::KeyValue>) -> BTreeMap<String, String> {
    l.into_iter().map(|kv| (kv.key, kv.value)).collect()
}

/// Roughly the bytes a lookup answer takes once copied into the sandbox:
/// the strings plus each list element's slot (a string is 8 bytes there).
fn map_size(m: &BTreeMap<String, String>) -> usize {
    m.iter().map(|(k, v)| 16 + k.len() + v.len()).sum()
}

fn ports_size(p: &[core_lookups::ServicePort]) -> usize {
    p.iter()
        .map(|p| 16 + p.name.as_ref().map_or(0, String::len))
        .sum()
}

pub fn service_size(s: &core_lookups::ServiceInfo) -> usize {
    64 + s.namespace.len()
        + s.name.len()
        + map_size(&s.labels)
        + map_size(&s.annotations)
        + ports_size(&s.ports)
}

pub fn endpoint_size(e: &core_lookups::Endpoint) -> usize {
    32 + e.address.len() + e.pod.as_ref().map_or(0, String::len) + ports_size(&e.ports)
}

pub fn workload_size(w: &core_lookups::WorkloadInfo) -> usize {
    64 + w.workload.namespace.len()
        + w.workload.name.len()
        + map_size(&w.labels)
        + map_size(&w.annotations)
        + map_size(&w.template_annotations)
}
