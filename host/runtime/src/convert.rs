//! Conversions between the core types and the generated WIT types of each
//! world ([`v2`], [`v3`]). The worlds share most types (as distinct Rust
//! types): `shared!` writes their conversions once per world; each world's
//! module adds its workload types.
use std::collections::BTreeMap;

use wasmwatch_core::lookups as core_lookups;

/// The conversions of the types the worlds have alike. A world's module
/// defines `restart_from_wit` for its `restart-workload`, and `kind_to_wit`
/// and `kind_from_wit` for its `object-kind`.
macro_rules! shared {
    () => {
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

        /// The event as the plugin sees it: Secret values only with `secret_values`.
        pub fn event_to_wit(ev: &ChangeEvent, secret_values: bool) -> wit::ChangeEvent {
            let o = &ev.object;
            // Only Secrets' values are withheld without `secret_values`
            // (a custom kind's content is what the manifest chose to watch).
            let values_included = o.kind != ObjectKind::Secret || secret_values;
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
                wit::Action::Restart(r) => restart_from_wit(r),
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

        pub fn labels_from_wit(l: Vec<wit::KeyValue>) -> BTreeMap<String, String> {
            l.into_iter().map(|kv| (kv.key, kv.value)).collect()
        }
    };
}

/// `object-kind` of 0.2.0 and 0.3.0: ConfigMap and Secret only.
macro_rules! closed_kinds {
    () => {
        /// Only ConfigMaps and Secrets reach a plugin of this world:
        /// `Plugin::handle` refuses objects of other kinds before this.
        pub fn kind_to_wit(k: ObjectKind) -> wit::ObjectKind {
            match k {
                ObjectKind::ConfigMap => wit::ObjectKind::ConfigMap,
                ObjectKind::Secret => wit::ObjectKind::Secret,
                ObjectKind::Custom(k) => unreachable!("{k:?} given to a plugin of a closed world"),
            }
        }

        pub fn kind_from_wit(k: wit::ObjectKind) -> Option<ObjectKind> {
            Some(match k {
                wit::ObjectKind::ConfigMap => ObjectKind::ConfigMap,
                wit::ObjectKind::Secret => ObjectKind::Secret,
            })
        }
    };
}

/// What 0.3.0 and 0.4.0 have alike beyond `shared!`: workloads by
/// group/version/kind, how they use the object, a restart's strategy.
macro_rules! open_workloads {
    () => {
        fn restart_from_wit(r: wit::RestartWorkload) -> Action {
            let w = r.workload;
            Action::Restart {
                workload: core_action::WorkloadRef {
                    kind: WorkloadKind::from_gvk(&w.group, &w.version, &w.kind),
                    namespace: w.namespace,
                    name: w.name,
                },
                reason: r.reason,
                content_hash: r.content_hash,
                strategy: r.strategy.map(|s| match s {
                    wit::RestartStrategy::Annotations => RestartStrategy::Annotations,
                    wit::RestartStrategy::EnvVars => RestartStrategy::EnvVars,
                    wit::RestartStrategy::RestartAt => RestartStrategy::RestartAt,
                }),
            }
        }

        /// Every workload of a lookup's answer (0.3.0 tells the named-only
        /// ones apart by `referenced`).
        pub fn visible(
            found: Vec<core_lookups::WorkloadInfo>,
            _kind: ObjectKind,
            _name: &str,
        ) -> Vec<core_lookups::WorkloadInfo> {
            found
        }

        /// The workloads referencing object `kind`/`name` (or naming it in a
        /// reload annotation: `referenced` false), with how each uses it.
        pub fn workloads_to_wit(
            found: Vec<core_lookups::WorkloadInfo>,
            kind: ObjectKind,
            name: &str,
        ) -> Vec<wit::WorkloadInfo> {
            found
                .into_iter()
                .map(|w| {
                    let reference = w
                        .references
                        .iter()
                        .find(|r| r.kind == kind && r.name == name);
                    // Not referenced: selected by a reload annotation naming
                    // the object.
                    let referenced = reference.is_some();
                    let uses = reference
                        .map(|r| r.uses.iter().map(use_to_wit).collect())
                        .unwrap_or_default();
                    let (group, version, kind) = w.workload.kind.gvk();
                    wit::WorkloadInfo {
                        workload: wit::WorkloadRef {
                            group: group.to_string(),
                            version: version.to_string(),
                            kind: kind.to_string(),
                            namespace: w.workload.namespace,
                            name: w.workload.name,
                        },
                        labels: key_values_owned(w.labels),
                        annotations: key_values_owned(w.annotations),
                        template_annotations: key_values_owned(w.template_annotations),
                        referenced,
                        uses,
                    }
                })
                .collect()
        }

        fn use_to_wit(u: &core_lookups::ObjectUse) -> wit::ObjectUse {
            wit::ObjectUse {
                via: match u.via {
                    core_lookups::UseVia::Env => wit::UseVia::Env,
                    core_lookups::UseVia::EnvFrom => wit::UseVia::EnvFrom,
                    core_lookups::UseVia::Volume => wit::UseVia::Volume,
                },
                key: u.key.clone(),
            }
        }

        /// [`super::workload_size`] with the kind's strings and the uses (an
        /// upper bound: only the object's reference is copied).
        pub fn workload_size(w: &core_lookups::WorkloadInfo) -> usize {
            let (group, version, kind) = w.workload.kind.gvk();
            let keys: usize = w
                .references
                .iter()
                .flat_map(|r| &r.uses)
                .map(|u| 16 + u.key.as_ref().map_or(0, String::len))
                .sum();
            super::workload_size(w) + group.len() + version.len() + kind.len() + keys
        }
    };
}

/// WIT 0.2.0: the three apps/v1 kinds as an enum.
pub mod v2 {
    use super::*;
    use crate::bindings::v2::wit;
    use wasmwatch_core::action::{self as core_action, Action, WorkloadKind};
    use wasmwatch_core::event::{ChangeEvent, ChangeType, DataValue, ObjectKind};

    shared!();
    closed_kinds!();

    fn restart_from_wit(r: wit::RestartWorkload) -> Action {
        let w = r.workload;
        Action::Restart {
            workload: core_action::WorkloadRef {
                kind: match w.kind {
                    wit::WorkloadKind::Deployment => WorkloadKind::Deployment,
                    wit::WorkloadKind::StatefulSet => WorkloadKind::StatefulSet,
                    wit::WorkloadKind::DaemonSet => WorkloadKind::DaemonSet,
                },
                namespace: w.namespace,
                name: w.name,
            },
            reason: r.reason,
            content_hash: r.content_hash,
            strategy: None,
        }
    }

    /// The workloads a 0.2.0 plugin sees of a lookup's answer: those
    /// whose pod templates reference the object (not those only a reload
    /// annotation names, which 0.2.0 cannot tell apart), of the apps/v1
    /// kinds (the only ones 0.2.0 can name).
    pub fn visible(
        found: Vec<core_lookups::WorkloadInfo>,
        kind: ObjectKind,
        name: &str,
    ) -> Vec<core_lookups::WorkloadInfo> {
        found
            .into_iter()
            .filter(|w| w.workload.kind.is_apps_v1() && w.reference(kind, name).is_some())
            .collect()
    }

    /// The workloads as 0.2.0 has them ([`visible`] ones only).
    pub fn workloads_to_wit(
        found: Vec<core_lookups::WorkloadInfo>,
        kind: ObjectKind,
        name: &str,
    ) -> Vec<wit::WorkloadInfo> {
        visible(found, kind, name)
            .into_iter()
            .filter_map(|w| {
                let kind = match w.workload.kind {
                    WorkloadKind::Deployment => wit::WorkloadKind::Deployment,
                    WorkloadKind::StatefulSet => wit::WorkloadKind::StatefulSet,
                    WorkloadKind::DaemonSet => wit::WorkloadKind::DaemonSet,
                    WorkloadKind::Other(_) => return None,
                };
                Some(wit::WorkloadInfo {
                    labels: key_values_owned(w.labels),
                    annotations: key_values_owned(w.annotations),
                    template_annotations: key_values_owned(w.template_annotations),
                    workload: wit::WorkloadRef {
                        kind,
                        namespace: w.workload.namespace,
                        name: w.workload.name,
                    },
                })
            })
            .collect()
    }

    pub fn workload_size(w: &core_lookups::WorkloadInfo) -> usize {
        super::workload_size(w)
    }
}

/// WIT 0.3.0: workloads by group/version/kind, how they use the object, a
/// restart's strategy.
pub mod v3 {
    use super::*;
    use crate::bindings::v3::wit;
    use wasmwatch_core::action::{self as core_action, Action, RestartStrategy, WorkloadKind};
    use wasmwatch_core::event::{ChangeEvent, ChangeType, DataValue, ObjectKind};

    shared!();
    closed_kinds!();
    open_workloads!();
}

/// WIT 0.4.0: 0.3.0 with open watched kinds.
pub mod v4 {
    use super::*;
    use crate::bindings::v4::wit;
    use wasmwatch_core::action::{self as core_action, Action, RestartStrategy, WorkloadKind};
    use wasmwatch_core::event::{ChangeEvent, ChangeType, DataValue, ObjectKind};
    use wasmwatch_core::kind::CustomKind;

    shared!();
    open_workloads!();

    pub fn kind_to_wit(k: ObjectKind) -> wit::ObjectKind {
        match k {
            ObjectKind::ConfigMap => wit::ObjectKind::ConfigMap,
            ObjectKind::Secret => wit::ObjectKind::Secret,
            ObjectKind::Custom(k) => wit::ObjectKind::Other(wit::ObjectType {
                group: k.group().to_string(),
                version: k.version().to_string(),
                kind: k.kind().to_string(),
            }),
        }
    }

    /// A kind the host knows, `None` for any other: a plugin's strings are
    /// never interned (the registry would grow with every name it makes up).
    pub fn kind_from_wit(k: wit::ObjectKind) -> Option<ObjectKind> {
        match k {
            wit::ObjectKind::ConfigMap => Some(ObjectKind::ConfigMap),
            wit::ObjectKind::Secret => Some(ObjectKind::Secret),
            wit::ObjectKind::Other(t) => {
                CustomKind::find(&t.group, &t.version, &t.kind).map(ObjectKind::Custom)
            }
        }
    }
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
