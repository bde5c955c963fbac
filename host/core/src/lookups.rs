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
    /// The reference of the pod template to object `kind`/`name`, if any.
    pub fn reference(&self, kind: ObjectKind, name: &str) -> Option<&ObjectRef> {
        self.references
            .iter()
            .find(|r| r.kind == kind && r.name == name)
    }

    /// Whether a reload annotation ([`reload_annotations`]) on the
    /// workload or on its pod template names object `kind`/`name`.
    pub fn names_for_reload(&self, kind: ObjectKind, name: &str) -> bool {
        reload_annotations(kind).iter().any(|key| {
            [&self.annotations, &self.template_annotations]
                .iter()
                .filter_map(|m| m.get(*key))
                .any(|v| reload_value_names(v, name))
        })
    }

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

/// A ConfigMap or Secret a workload's pod template references, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    pub name: String,
    /// How the pod template uses the object, sorted and without
    /// duplicates (WIT 0.3.0's `workload-info.uses`). The kube lookups
    /// always fill it; empty in lookups written by hand means not known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uses: Vec<ObjectUse>,
}

/// One way a pod template uses a ConfigMap or Secret.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectUse {
    pub via: UseVia,
    /// The key used: env `configMapKeyRef`/`secretKeyRef.key`, or a volume's
    /// (or projected volume source's) `items[].key`. `None`: the whole
    /// object (`envFrom`, a volume without `items`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Where a pod template uses an object. A volume's files change in place
/// when the object changes (unless mounted with `subPath`); environment
/// variables only when the pods restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UseVia {
    /// An env var's `valueFrom.configMapKeyRef` / `secretKeyRef`.
    Env,
    /// `envFrom` `configMapRef` / `secretRef` (always the whole object).
    EnvFrom,
    /// A `configMap` / `secret` volume or a projected volume's source.
    Volume,
}

/// The CSI driver's SecretProviderClass: the kind a pod template's CSI
/// volume (`csi.volumeAttributes.secretProviderClass`) uses, and what a
/// SecretProviderClassPodStatus change stands for (Reloader keys its CSI
/// reloads by it: `plugins/reloader-spec.md` §7).
pub const SECRET_PROVIDER_CLASS: &str = "secrets-store.csi.x-k8s.io/v1/SecretProviderClass";

/// The workload annotations whose comma-separated entries name the
/// ConfigMaps (or Secrets, or SecretProviderClasses) that restart the
/// workload even when its pod template does not reference them: ours, then
/// Stakater Reloader's. None for other kinds.
pub fn reload_annotations(kind: ObjectKind) -> &'static [&'static str] {
    match kind {
        ObjectKind::ConfigMap => &[
            "wasmwatch.io/reload-configmaps",
            "configmap.reloader.stakater.com/reload",
        ],
        ObjectKind::Secret => &[
            "wasmwatch.io/reload-secrets",
            "secret.reloader.stakater.com/reload",
        ],
        ObjectKind::Custom(k) if k.name() == SECRET_PROVIDER_CLASS => &[
            "wasmwatch.io/reload-secretproviderclasses",
            "secretproviderclass.reloader.stakater.com/reload",
        ],
        ObjectKind::Custom(_) => &[],
    }
}

/// Whether a `reload` annotation's value names `name`: one of its
/// comma-separated entries (trimmed, empty ones skipped) matches the whole
/// name as a regular expression (`^(?:entry)$`, as the bundled
/// rollout-restart reads it); an entry that is not a valid expression is
/// compared literally.
pub fn reload_value_names(value: &str, name: &str) -> bool {
    value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|entry| entry_matches(entry, name))
}

fn entry_matches(entry: &str, name: &str) -> bool {
    // Most entries are names: letters, digits, '-' and '.', where only '.'
    // means something to a regex (any one character). No regex needed.
    if entry
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'.' || c == b'_')
    {
        return entry.len() == name.len()
            && entry
                .bytes()
                .zip(name.bytes())
                .all(|(e, n)| e == n || (e == b'.' && n != b'\n'));
    }
    match regex::Regex::new(&format!("^(?:{entry})$")) {
        Ok(re) => re.is_match(name),
        Err(_) => entry == name,
    }
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
    /// The workloads in `namespace` whose pod templates reference object
    /// `kind`/`name`, and those a reload annotation names it in
    /// ([`WorkloadInfo::names_for_reload`]) without a reference (then the
    /// object is not in their `references`). WIT 0.2.0 plugins see only
    /// the former.
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

    /// Whether [`Lookups::workloads_referencing`] would find any (a
    /// host-side prefilter asks this per change: no copies needed).
    fn used_by_workload(&self, kind: ObjectKind, namespace: &str, name: &str) -> bool {
        !self.workloads_referencing(kind, namespace, name).is_empty()
    }

    /// Whether Service `namespace/name` exists.
    fn has_service(&self, namespace: &str, name: &str) -> bool {
        self.service(namespace, name).is_some()
    }

    /// The uid of Service `namespace/name`, when known (for Events about
    /// it: `kubectl describe` finds an object's Events by its uid).
    fn service_uid(&self, _namespace: &str, _name: &str) -> Option<String> {
        None
    }
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
            .filter(|w| w.reference(kind, name).is_some() || w.names_for_reload(kind, name))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::WorkloadKind;

    #[test]
    fn reload_entries_are_whole_name_regexes_or_literal_when_invalid() {
        let names = |v: &str, n: &str| reload_value_names(v, n);
        assert!(names("orders", "orders"));
        assert!(names(" a , orders ,", "orders"));
        assert!(!names("orders", "orders-2"), "the whole name");
        assert!(!names("order", "orders"));
        assert!(names("app.config", "app.config"));
        assert!(names("app.config", "app-config"), "'.' is any character");
        assert!(!names("app.config", "app.configs"));
        assert!(names("billing-.*", "billing-eu"));
        assert!(!names("billing-.*", "x-billing-eu"));
        assert!(names("a|b", "b"), "grouped: ^(?:a|b)$");
        assert!(!names("a|b", "ab"));
        assert!(names("[", "["), "an invalid entry is compared literally");
        assert!(!names("", "orders"));
        assert!(!names(",,", "orders"));
    }

    #[test]
    fn static_lookups_return_named_workloads_beside_referencing_ones() {
        let w = |name: &str, refs: Vec<ObjectRef>, ann: &[(&str, &str)], tmpl: &[(&str, &str)]| {
            let map = |l: &[(&str, &str)]| {
                l.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            };
            WorkloadInfo {
                workload: WorkloadRef {
                    kind: WorkloadKind::Deployment,
                    namespace: "shop".into(),
                    name: name.into(),
                },
                labels: BTreeMap::new(),
                annotations: map(ann),
                template_annotations: map(tmpl),
                references: refs,
            }
        };
        let orders = ObjectRef {
            kind: ObjectKind::ConfigMap,
            name: "orders".into(),
            uses: vec![ObjectUse {
                via: UseVia::Env,
                key: Some("a".into()),
            }],
        };
        let lookups = StaticLookups {
            workloads: vec![
                w("uses", vec![orders], &[], &[]),
                w(
                    "named",
                    vec![],
                    &[("configmap.reloader.stakater.com/reload", "x,ord.*")],
                    &[],
                ),
                w(
                    "template",
                    vec![],
                    &[],
                    &[("wasmwatch.io/reload-configmaps", "orders")],
                ),
                w(
                    "secret",
                    vec![],
                    &[("secret.reloader.stakater.com/reload", "orders")],
                    &[],
                ),
                w("none", vec![], &[], &[]),
            ],
            ..Default::default()
        };
        let found: Vec<String> = lookups
            .workloads_referencing(ObjectKind::ConfigMap, "shop", "orders")
            .into_iter()
            .map(|w| w.workload.name)
            .collect();
        assert_eq!(found, ["uses", "named", "template"]);
        assert_eq!(
            lookups
                .workloads_referencing(ObjectKind::Secret, "shop", "orders")
                .len(),
            1
        );
        let yaml = serde_yaml::to_string(&lookups.workloads[0].references).unwrap();
        assert_eq!(
            yaml,
            "- kind: ConfigMap\n  name: orders\n  uses:\n  - via: env\n    key: a\n"
        );
        let back: Vec<ObjectRef> = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(back, lookups.workloads[0].references);
    }
}
