//! The ConfigMaps and Secrets a pod template references.
//!
//! The places Stakater Reloader looks at, in containers and init containers:
//! volumes (`configMap`, `secret`, projected `configMap`/`secret` sources),
//! env `valueFrom.configMapKeyRef` / `secretKeyRef`, and `envFrom`
//! `configMapRef` / `secretRef`. Optional references count as references.
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use wasmwatch_core::ObjectKind;
use wasmwatch_core::lookups::ObjectRef;

/// Every ConfigMap and Secret `spec` references, deduplicated, sorted by
/// kind (ConfigMaps first) then name.
pub fn pod_spec_references(spec: &PodSpec) -> Vec<ObjectRef> {
    let mut found: BTreeSet<(ObjectKind, &str)> = BTreeSet::new();
    for volume in spec.volumes.iter().flatten() {
        if let Some(cm) = &volume.config_map {
            found.insert((ObjectKind::ConfigMap, &cm.name));
        }
        if let Some(name) = volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref())
        {
            found.insert((ObjectKind::Secret, name));
        }
        let sources = volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten());
        for source in sources {
            if let Some(cm) = &source.config_map {
                found.insert((ObjectKind::ConfigMap, &cm.name));
            }
            if let Some(secret) = &source.secret {
                found.insert((ObjectKind::Secret, &secret.name));
            }
        }
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for container in containers {
        container_references(container, &mut found);
    }
    found
        .into_iter()
        // An empty name is not a reference to anything (the API rejects it
        // for most forms, but a template is not validated everywhere).
        .filter(|(_, name)| !name.is_empty())
        .map(|(kind, name)| ObjectRef {
            kind,
            name: name.to_string(),
            // TODO(issue 20, WIT 0.3.0 `referenced-keys`): the keys used,
            // from env `configMapKeyRef.key`/`secretKeyRef.key` and volume
            // and projected `items[].key` above (empty when any use takes
            // the whole object: `envFrom`, a volume without `items`), kept
            // in `lookups::WorkloadEntry.references`. Empty reads as the
            // whole object.
            keys: Vec::new(),
        })
        .collect()
}

fn container_references<'a>(c: &'a Container, found: &mut BTreeSet<(ObjectKind, &'a str)>) {
    for var in c.env.iter().flatten() {
        let Some(from) = &var.value_from else {
            continue;
        };
        if let Some(r) = &from.config_map_key_ref {
            found.insert((ObjectKind::ConfigMap, &r.name));
        }
        if let Some(r) = &from.secret_key_ref {
            found.insert((ObjectKind::Secret, &r.name));
        }
    }
    for from in c.env_from.iter().flatten() {
        if let Some(r) = &from.config_map_ref {
            found.insert((ObjectKind::ConfigMap, &r.name));
        }
        if let Some(r) = &from.secret_ref {
            found.insert((ObjectKind::Secret, &r.name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(spec: serde_json::Value) -> Vec<(ObjectKind, String)> {
        let spec: PodSpec = serde_json::from_value(spec).unwrap();
        pod_spec_references(&spec)
            .into_iter()
            .map(|r| (r.kind, r.name))
            .collect()
    }

    fn cm(name: &str) -> (ObjectKind, String) {
        (ObjectKind::ConfigMap, name.to_string())
    }

    fn secret(name: &str) -> (ObjectKind, String) {
        (ObjectKind::Secret, name.to_string())
    }

    #[test]
    fn every_kind_of_reference_is_found_once() {
        let spec = serde_json::json!({
            "volumes": [
                {"name": "a", "configMap": {"name": "vol-cm"}},
                {"name": "b", "secret": {"secretName": "vol-secret"}},
                {"name": "c", "projected": {"sources": [
                    {"configMap": {"name": "proj-cm"}},
                    {"secret": {"name": "proj-secret"}},
                    {"downwardAPI": {"items": []}},
                    {"serviceAccountToken": {"path": "token"}}
                ]}},
                {"name": "d", "emptyDir": {}},
                {"name": "e", "secret": {}}
            ],
            "containers": [{
                "name": "app",
                "env": [
                    {"name": "PLAIN", "value": "x"},
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "k"}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}},
                    {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "D", "valueFrom": {"configMapKeyRef": {"name": "vol-cm", "key": "again"}}}
                ],
                "envFrom": [
                    {"configMapRef": {"name": "from-cm"}},
                    {"secretRef": {"name": "from-secret", "optional": true}}
                ]
            }, {
                "name": "sidecar",
                "envFrom": [{"configMapRef": {"name": "from-cm"}}]
            }],
            "initContainers": [{
                "name": "init",
                "env": [{"name": "I", "valueFrom": {"secretKeyRef": {"name": "init-secret", "key": "k"}}}],
                "envFrom": [{"configMapRef": {"name": "init-cm"}}]
            }],
            "imagePullSecrets": [{"name": "pull-secret"}]
        });
        assert_eq!(
            refs(spec),
            vec![
                cm("env-cm"),
                cm("from-cm"),
                cm("init-cm"),
                cm("proj-cm"),
                cm("vol-cm"),
                secret("env-secret"),
                secret("from-secret"),
                secret("init-secret"),
                secret("proj-secret"),
                secret("vol-secret"),
            ]
        );
    }

    #[test]
    fn a_configmap_and_a_secret_of_the_same_name_are_two_references() {
        let spec = serde_json::json!({
            "volumes": [
                {"name": "a", "configMap": {"name": "same"}},
                {"name": "b", "secret": {"secretName": "same"}}
            ],
            "containers": [{"name": "app"}]
        });
        assert_eq!(refs(spec), vec![cm("same"), secret("same")]);
    }

    #[test]
    fn a_template_without_references_has_none() {
        let spec = serde_json::json!({"containers": [{"name": "app", "image": "x"}]});
        assert!(refs(spec).is_empty());
    }
}
