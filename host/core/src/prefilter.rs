//! Host-side prefilters a plugin declares (issue 35): what can never
//! interest it, in terms the host evaluates without calling it.
//!
//! A plugin lists them under `only` in its `wasmwatch:needs` section
//! ([`crate::needs`]), every one of them a necessary condition:
//!
//! ```json
//! {"only": ["usedByWorkload{config.webhook.always|false=false}"]}
//! ```
//!
//! - `usedByWorkload`: some workload in the object's namespace references
//!   it in its pod template, or names it in a reload annotation (what
//!   `workloads-referencing` answers the plugin). Only ConfigMaps and
//!   Secrets are judged: another kind (the CSI driver's pod statuses, say)
//!   is mapped to what workloads reference by the plugin itself, so it
//!   passes;
//! - `usedBySpringService`: the object's Spring Cloud Kubernetes target
//!   apps have a Service in its namespace, found as the Spring watcher
//!   (and the SDK's `spring::target_apps(..).services(..)`) finds them:
//!   the `spring.cloud.kubernetes.{configmap,secret}.apps` annotation,
//!   else the Services matching its `...labels` annotation, else the
//!   Service named like the object. Kinds other than ConfigMap and Secret
//!   have no target app;
//! - `label:KEY` / `label:KEY=VALUE`: the object carries the label (with
//!   that value); `annotation:KEY` / `annotation:KEY=VALUE` likewise.
//!
//! Placeholders are those of the other needs (`{config.KEY|DEFAULT}`, and
//! guards, so that a condition can hold only in some mode of the plugin);
//! a condition whose placeholder has no value, or whose guard is not met,
//! is left out. A condition this host does not know is left out too (a
//! newer plugin may declare more; leaving one out only calls the plugin
//! more often); `wasmwatch validate` warns about it.
//!
//! A skipped call is not a decision: it is the plugin's own rule, and the
//! change is handled (its checkpoint moves) as one no plugin selects. The
//! labels and annotations a condition names are kept in the stored index
//! (they join the plugin's `metadata` reads), so a deletion found at a
//! resync is judged on what the object carried, with one limit: the index
//! never keeps an annotation value over 512 bytes (nor
//! `last-applied-configuration`), so an `annotation:` condition on such an
//! annotation rejects the deletions found at a resync. And an index line
//! written before a plugin declared a new condition keeps its old keys
//! until the object is seen again.
use std::collections::BTreeMap;
use std::fmt;

use crate::event::{ChangeEvent, ObjectKind};
use crate::lookups::Lookups;
use crate::needs::MetadataReads;

/// One condition of a [`Prefilter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    UsedByWorkload,
    UsedBySpringService,
    Label(String, Option<String>),
    Annotation(String, Option<String>),
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pair = |f: &mut fmt::Formatter<'_>, what: &str, k: &str, v: &Option<String>| match v {
            Some(v) => write!(f, "{what}:{k}={v}"),
            None => write!(f, "{what}:{k}"),
        };
        match self {
            Condition::UsedByWorkload => f.write_str("usedByWorkload"),
            Condition::UsedBySpringService => f.write_str("usedBySpringService"),
            Condition::Label(k, v) => pair(f, "label", k, v),
            Condition::Annotation(k, v) => pair(f, "annotation", k, v),
        }
    }
}

impl Condition {
    /// One condition as written (placeholders filled); an error names
    /// what is wrong with it.
    pub fn parse(text: &str) -> Result<Condition, String> {
        let pair = |rest: &str| -> Result<(String, Option<String>), String> {
            let (k, v) = match rest.split_once('=') {
                Some((k, v)) => (k, Some(v.to_string())),
                None => (rest, None),
            };
            if k.is_empty() {
                return Err(format!("{text:?} names no key"));
            }
            Ok((k.to_string(), v))
        };
        match text {
            "usedByWorkload" => Ok(Condition::UsedByWorkload),
            "usedBySpringService" => Ok(Condition::UsedBySpringService),
            _ => {
                if let Some(rest) = text.strip_prefix("label:") {
                    let (k, v) = pair(rest)?;
                    Ok(Condition::Label(k, v))
                } else if let Some(rest) = text.strip_prefix("annotation:") {
                    let (k, v) = pair(rest)?;
                    Ok(Condition::Annotation(k, v))
                } else {
                    Err(format!(
                        "unknown condition {text:?} (known: usedByWorkload, usedBySpringService, \
                         label:KEY[=VALUE], annotation:KEY[=VALUE])"
                    ))
                }
            }
        }
    }

    /// Whether `event`'s object meets it.
    pub fn admits(&self, event: &ChangeEvent, lookups: &dyn Lookups) -> bool {
        let o = &event.object;
        let has = |map: &BTreeMap<String, String>, k: &str, v: &Option<String>| {
            map.get(k)
                .is_some_and(|actual| v.as_ref().is_none_or(|v| v == actual))
        };
        match self {
            Condition::Label(k, v) => has(&o.labels, k, v),
            Condition::Annotation(k, v) => has(&o.annotations, k, v),
            Condition::UsedByWorkload => match o.kind {
                ObjectKind::ConfigMap | ObjectKind::Secret => {
                    lookups.used_by_workload(o.kind, &o.namespace, &o.name)
                }
                ObjectKind::Custom(_) => true,
            },
            Condition::UsedBySpringService => spring_service(event, lookups),
        }
    }
}

/// Whether the Spring target apps of `event` have a Service (the SDK's
/// `spring::target_apps(&event).services(ns)` is not empty).
fn spring_service(event: &ChangeEvent, lookups: &dyn Lookups) -> bool {
    let o = &event.object;
    let prefix = match o.kind {
        ObjectKind::ConfigMap => "spring.cloud.kubernetes.configmap",
        ObjectKind::Secret => "spring.cloud.kubernetes.secret",
        ObjectKind::Custom(_) => return false,
    };
    if let Some(apps) = o.annotations.get(&format!("{prefix}.apps")) {
        apps.split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .any(|app| lookups.has_service(&o.namespace, app))
    } else if let Some(selector) = o.annotations.get(&format!("{prefix}.labels")) {
        let labels: BTreeMap<String, String> = selector
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        !lookups
            .services_with_labels(&o.namespace, &labels)
            .is_empty()
    } else {
        lookups.has_service(&o.namespace, &o.name)
    }
}

/// The conditions a plugin declared, every one necessary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefilter {
    pub conditions: Vec<Condition>,
}

impl Prefilter {
    /// The conditions of `only` with placeholders filled from `config`:
    /// those left out (a missing value, an unmet guard) are skipped, and
    /// those that cannot be read are returned apart (each with why), so
    /// that `validate` can warn and `run` can go on without them.
    pub fn of(only: &[String], config: &serde_json::Value) -> (Prefilter, Vec<String>) {
        let mut conditions = Vec::new();
        let mut unknown = Vec::new();
        for text in only {
            let Some(text) = crate::needs::expand(text, config) else {
                continue;
            };
            match Condition::parse(&text) {
                Ok(c) if !conditions.contains(&c) => conditions.push(c),
                Ok(_) => {}
                Err(e) => unknown.push(e),
            }
        }
        (Prefilter { conditions }, unknown)
    }

    pub fn is_empty(&self) -> bool {
        self.conditions.is_empty()
    }

    /// The first condition `event` does not meet; `None`: the plugin is
    /// called.
    pub fn rejects(&self, event: &ChangeEvent, lookups: &dyn Lookups) -> Option<&Condition> {
        self.conditions.iter().find(|c| !c.admits(event, lookups))
    }

    /// The labels and annotations the conditions read, joined to `reads`
    /// (so the stored index keeps them); `None` stays `None` (everything
    /// is kept then).
    pub fn join_reads(&self, reads: Option<MetadataReads>) -> Option<MetadataReads> {
        let mut reads = reads?;
        for c in &self.conditions {
            let (list, key) = match c {
                Condition::Label(k, _) => (&mut reads.labels, k),
                Condition::Annotation(k, _) => (&mut reads.annotations, k),
                Condition::UsedBySpringService => {
                    for k in SPRING_ANNOTATIONS {
                        if !reads.annotations.iter().any(|a| a == k) {
                            reads.annotations.push(k.to_string());
                        }
                    }
                    continue;
                }
                Condition::UsedByWorkload => continue,
            };
            if !list.contains(key) {
                list.push(key.clone());
            }
        }
        Some(reads)
    }
}

impl fmt::Display for Prefilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all: Vec<String> = self.conditions.iter().map(|c| c.to_string()).collect();
        f.write_str(&all.join(" and "))
    }
}

/// The annotations `usedBySpringService` reads.
const SPRING_ANNOTATIONS: [&str; 4] = [
    "spring.cloud.kubernetes.configmap.apps",
    "spring.cloud.kubernetes.configmap.labels",
    "spring.cloud.kubernetes.secret.apps",
    "spring.cloud.kubernetes.secret.labels",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::{WorkloadKind, WorkloadRef};
    use crate::event::{ChangeType, ObjectSnapshot};
    use crate::lookups::{ObjectRef, ServiceInfo, StaticLookups, WorkloadInfo};

    fn event(kind: ObjectKind, name: &str, annotations: &[(&str, &str)]) -> ChangeEvent {
        let object = ObjectSnapshot {
            kind,
            namespace: "shop".into(),
            name: name.into(),
            uid: "u".into(),
            resource_version: "1".into(),
            labels: [("team".to_string(), "a".to_string())].into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            data: Default::default(),
        };
        ChangeEvent::new(ChangeType::Modified, object, None)
    }

    fn service(name: &str, labels: &[(&str, &str)]) -> ServiceInfo {
        ServiceInfo {
            namespace: "shop".into(),
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: Default::default(),
            ports: vec![],
        }
    }

    fn lookups() -> StaticLookups {
        let yaml = r#"
workloads:
  - workload: {kind: Deployment, namespace: shop, name: orders}
    references: [{kind: ConfigMap, name: orders-config}]
"#;
        let mut l: StaticLookups = serde_yaml::from_str(yaml).unwrap();
        l.services = vec![service("orders", &[("app", "orders")])];
        l
    }

    #[test]
    fn conditions_parse_with_placeholders_and_guards_and_unknown_ones_are_set_apart() {
        let only = [
            "usedByWorkload{config.webhook.always|false=false}".to_string(),
            "label:{config.label|spring.cloud.kubernetes.config}=true".to_string(),
            "annotation:x".to_string(),
            "usedByNobody".to_string(),
            "label:=v".to_string(),
        ];
        let (p, unknown) = Prefilter::of(&only, &serde_json::json!({}));
        assert_eq!(
            p.conditions,
            vec![
                Condition::UsedByWorkload,
                Condition::Label("spring.cloud.kubernetes.config".into(), Some("true".into())),
                Condition::Annotation("x".into(), None),
            ]
        );
        assert_eq!(unknown.len(), 2);
        assert!(
            unknown[0].contains("unknown condition \"usedByNobody\""),
            "{unknown:?}"
        );
        assert!(unknown[1].contains("names no key"), "{unknown:?}");
        assert_eq!(
            p.to_string(),
            "usedByWorkload and label:spring.cloud.kubernetes.config=true and annotation:x"
        );
        // The guard not met: the condition is left out.
        let (p, _) = Prefilter::of(
            &only[..1],
            &serde_json::json!({"webhook": {"always": true}}),
        );
        assert!(p.is_empty());
    }

    #[test]
    fn used_by_workload_is_what_workloads_referencing_answers() {
        let l = lookups();
        let c = Condition::UsedByWorkload;
        assert!(c.admits(&event(ObjectKind::ConfigMap, "orders-config", &[]), &l));
        assert!(!c.admits(&event(ObjectKind::ConfigMap, "helm-release", &[]), &l));
        // Same name, other kind: not used.
        assert!(!c.admits(&event(ObjectKind::Secret, "orders-config", &[]), &l));
        // Named in a reload annotation without a reference: used.
        let mut l = l;
        l.workloads.push(WorkloadInfo {
            workload: WorkloadRef {
                kind: WorkloadKind::Deployment,
                namespace: "shop".into(),
                name: "named".into(),
            },
            labels: Default::default(),
            annotations: [(
                "secret.reloader.stakater.com/reload".to_string(),
                "token".to_string(),
            )]
            .into(),
            template_annotations: Default::default(),
            references: Vec::<ObjectRef>::new(),
        });
        assert!(c.admits(&event(ObjectKind::Secret, "token", &[]), &l));
    }

    #[test]
    fn used_by_spring_service_finds_apps_as_the_spring_watcher_does() {
        let l = lookups();
        let c = Condition::UsedBySpringService;
        let apps = "spring.cloud.kubernetes.configmap.apps";
        let labels = "spring.cloud.kubernetes.configmap.labels";
        // Named like the object.
        assert!(c.admits(&event(ObjectKind::ConfigMap, "orders", &[]), &l));
        assert!(!c.admits(&event(ObjectKind::ConfigMap, "other", &[]), &l));
        // The apps annotation wins over the name.
        assert!(c.admits(
            &event(ObjectKind::ConfigMap, "x", &[(apps, "a, orders")]),
            &l
        ));
        assert!(!c.admits(
            &event(ObjectKind::ConfigMap, "orders", &[(apps, "a,b")]),
            &l
        ));
        // The labels annotation.
        assert!(c.admits(
            &event(ObjectKind::ConfigMap, "x", &[(labels, "app=orders")]),
            &l
        ));
        assert!(!c.admits(
            &event(ObjectKind::ConfigMap, "x", &[(labels, "app=pay")]),
            &l
        ));
        // A Secret reads the secret annotations only.
        assert!(!c.admits(&event(ObjectKind::Secret, "x", &[(apps, "orders")]), &l));
        assert!(c.admits(
            &event(
                ObjectKind::Secret,
                "x",
                &[("spring.cloud.kubernetes.secret.apps", "orders")]
            ),
            &l
        ));
    }

    #[test]
    fn labels_and_annotations_are_present_or_equal_and_join_the_index_reads() {
        let l = StaticLookups::default();
        let e = event(ObjectKind::ConfigMap, "x", &[("a", "1")]);
        assert!(Condition::Label("team".into(), None).admits(&e, &l));
        assert!(Condition::Label("team".into(), Some("a".into())).admits(&e, &l));
        assert!(!Condition::Label("team".into(), Some("b".into())).admits(&e, &l));
        assert!(!Condition::Label("a".into(), None).admits(&e, &l));
        assert!(Condition::Annotation("a".into(), Some("1".into())).admits(&e, &l));
        let p = Prefilter {
            conditions: vec![
                Condition::Label("team".into(), None),
                Condition::Annotation("a".into(), None),
            ],
        };
        assert!(p.rejects(&e, &l).is_none());
        let reads = p
            .join_reads(Some(MetadataReads {
                labels: vec![],
                annotations: vec!["a".into()],
            }))
            .unwrap();
        assert_eq!(reads.labels, vec!["team".to_string()]);
        assert_eq!(reads.annotations, vec!["a".to_string()]);
        assert_eq!(p.join_reads(None), None);
    }
}
