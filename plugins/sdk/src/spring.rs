//! Target apps the way the Spring Cloud Kubernetes Configuration Watcher
//! finds them, shared by `http-refresh` and `bus-refresh`:
//!
//! 1. `spring.cloud.kubernetes.configmap.apps` (for Secrets
//!    `spring.cloud.kubernetes.secret.apps`): comma-separated app names, which
//!    are also Service names; else
//! 2. `spring.cloud.kubernetes.configmap.labels` / `...secret.labels`
//!    (`k=v,k2=v2`): the Services in the object's namespace carrying all of
//!    these labels (host `services-with-labels`); else
//! 3. the app named like the object.
use crate::{ChangeEvent, EventExt, KeyValue, ObjectKind, ServiceInfo, host};

/// How the target apps of a change were named.
#[derive(Debug, Clone)]
pub enum SpringApps {
    /// Listed in the `...apps` annotation (not checked against Services).
    Named(Vec<String>),
    /// The Services matching the `...labels` annotation.
    Labelled(Vec<ServiceInfo>),
    /// No annotation: the app named like the object.
    ObjectName(String),
}

/// `spring.cloud.kubernetes.configmap` or `spring.cloud.kubernetes.secret`;
/// `None` for other kinds, which the Spring watcher does not know.
pub fn annotation_prefix(kind: &ObjectKind) -> Option<&'static str> {
    match kind {
        ObjectKind::ConfigMap => Some("spring.cloud.kubernetes.configmap"),
        ObjectKind::Secret => Some("spring.cloud.kubernetes.secret"),
        ObjectKind::Other(_) => None,
    }
}

/// `k=v, k2=v2` -> labels; entries without `=` are skipped.
pub fn parse_labels(selector: &str) -> Vec<KeyValue> {
    selector
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| KeyValue {
            key: k.trim().into(),
            value: v.trim().into(),
        })
        .collect()
}

/// Resolves the target apps of `event` (asks the host only for the labels
/// annotation). An object of another kind than ConfigMap and Secret has
/// none (an empty `Named`).
pub fn target_apps(event: &ChangeEvent) -> SpringApps {
    let Some(prefix) = annotation_prefix(&event.kind) else {
        return SpringApps::Named(Vec::new());
    };
    if let Some(apps) = event.annotation(&format!("{prefix}.apps")) {
        SpringApps::Named(
            apps.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(String::from)
                .collect(),
        )
    } else if let Some(sel) = event.annotation(&format!("{prefix}.labels")) {
        SpringApps::Labelled(host::services_with_labels(
            &event.namespace,
            &parse_labels(sel),
        ))
    } else {
        SpringApps::ObjectName(event.name.clone())
    }
}

impl SpringApps {
    /// The apps' Services in `namespace`; apps without a Service are dropped
    /// (what an HTTP refresh needs).
    pub fn services(self, namespace: &str) -> Vec<ServiceInfo> {
        match self {
            SpringApps::Named(names) => names
                .iter()
                .filter_map(|app| host::service(namespace, app))
                .collect(),
            SpringApps::Labelled(services) => services,
            SpringApps::ObjectName(name) => host::service(namespace, &name).into_iter().collect(),
        }
    }

    /// The apps' names, each once, in order, whether or not a Service exists
    /// (what a bus message needs: its consumers subscribe by themselves).
    pub fn names(&self) -> Vec<String> {
        let all: Vec<String> = match self {
            SpringApps::Named(names) => names.clone(),
            SpringApps::Labelled(services) => services.iter().map(|s| s.name.clone()).collect(),
            SpringApps::ObjectName(name) => vec![name.clone()],
        };
        let mut out: Vec<String> = Vec::with_capacity(all.len());
        for name in all {
            if !out.contains(&name) {
                out.push(name);
            }
        }
        out
    }
}
