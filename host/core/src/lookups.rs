//! The read-only lookups plugins may make through the host: workloads that
//! reference an object, Services, and the ready endpoints of a Service.
//!
//! The kube layer answers them from its caches; tests and `wasmwatch plugin
//! run` use [`StaticLookups`], filled by hand or from a YAML file.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::action::WorkloadRef;
use crate::event::ObjectKind;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadInfo {
    pub workload: WorkloadRef,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub template_annotations: BTreeMap<String, String>,
    /// The ConfigMaps and Secrets the pod template references.
    #[serde(default)]
    pub references: Vec<ObjectRef>,
}

/// The workload annotations that set a pause period, first found wins:
/// ours, then Reloader's (`deployment.reloader.stakater.com/pause-period`,
/// which Reloader honours on Deployments only; we honour it, and the same
/// name for the other kinds, on every kind).
pub const PAUSE_PERIOD_ANNOTATIONS: [&str; 4] = [
    "wasmwatch.io/pause-period",
    "deployment.reloader.stakater.com/pause-period",
    "statefulset.reloader.stakater.com/pause-period",
    "daemonset.reloader.stakater.com/pause-period",
];

impl WorkloadInfo {
    /// The workload's pause period (a Go duration in one of
    /// [`PAUSE_PERIOD_ANNOTATIONS`] on its metadata): after a restart, the
    /// next one waits until it has passed, what changes meanwhile merging
    /// into it. `None` without the annotation; an error names the
    /// annotation and the value.
    pub fn pause_period(&self) -> Option<Result<std::time::Duration, String>> {
        PAUSE_PERIOD_ANNOTATIONS.iter().find_map(|key| {
            let value = self.annotations.get(*key)?;
            Some(crate::units::parse_go_duration(value).map_err(|e| {
                let w = &self.workload;
                format!(
                    "{:?} {}/{}: annotation {key}: {e}",
                    w.kind, w.namespace, w.name
                )
            }))
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    pub name: String,
    /// The keys of the object the pod template uses (env `*KeyRef.key`,
    /// volume `items[].key`), sorted; empty: the whole object. WIT 0.3.0's
    /// `workload-info.referenced-keys`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePort {
    #[serde(default)]
    pub name: Option<String>,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub address: String,
    #[serde(default)]
    pub pod: Option<String>,
    #[serde(default)]
    pub ports: Vec<ServicePort>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceInfo {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub ports: Vec<ServicePort>,
}

/// The ready endpoints of one Service, as [`StaticLookups`] holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceEndpoints {
    pub namespace: String,
    pub service: String,
    #[serde(default)]
    pub ready: Vec<Endpoint>,
}

/// The data source behind the plugin host interface.
pub trait Lookups: Send + Sync {
    fn workloads_referencing(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> Vec<WorkloadInfo>;
    fn service(&self, namespace: &str, name: &str) -> Option<ServiceInfo>;
    fn services_with_labels(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<ServiceInfo>;
    /// The ready endpoints of a Service; empty if it has none or does not exist.
    fn ready_endpoints(&self, namespace: &str, service: &str) -> Vec<Endpoint>;
}

/// Lookups from fixed lists.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticLookups {
    #[serde(default)]
    pub workloads: Vec<WorkloadInfo>,
    #[serde(default)]
    pub services: Vec<ServiceInfo>,
    /// Ready endpoints per Service (like EndpointSlices, apart from the Services).
    #[serde(default)]
    pub endpoints: Vec<ServiceEndpoints>,
}

impl Lookups for StaticLookups {
    fn workloads_referencing(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> Vec<WorkloadInfo> {
        self.workloads
            .iter()
            .filter(|w| w.workload.namespace == namespace)
            .filter(|w| {
                w.references
                    .iter()
                    .any(|r| r.kind == kind && r.name == name)
            })
            .cloned()
            .collect()
    }

    fn service(&self, namespace: &str, name: &str) -> Option<ServiceInfo> {
        self.services
            .iter()
            .find(|s| s.namespace == namespace && s.name == name)
            .cloned()
    }

    fn services_with_labels(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<ServiceInfo> {
        self.services
            .iter()
            .filter(|s| s.namespace == namespace)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .cloned()
            .collect()
    }

    fn ready_endpoints(&self, namespace: &str, service: &str) -> Vec<Endpoint> {
        self.endpoints
            .iter()
            .filter(|e| e.namespace == namespace && e.service == service)
            .flat_map(|e| e.ready.iter().cloned())
            .collect()
    }
}
