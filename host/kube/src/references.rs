//! The ConfigMaps and Secrets a pod template references, and how it uses
//! each (WIT 0.3.0's `workload-info.uses`).
//!
//! The places Stakater Reloader looks at, in containers and init containers:
//! volumes (`configMap`, `secret`, projected `configMap`/`secret` sources),
//! env `valueFrom.configMapKeyRef` / `secretKeyRef`, and `envFrom`
//! `configMapRef` / `secretRef`. Optional references count as references.
//! A volume (or projected source) with `items` uses those keys; without,
//! the whole object; so does `envFrom`. A CSI volume's
//! `volumeAttributes.secretProviderClass` uses that SecretProviderClass
//! (issue 34 §1: Reloader's CSI integration).
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, KeyToPath, PodSpec};
use wasmwatch_core::ObjectKind;
use wasmwatch_core::lookups::{ObjectRef, ObjectUse, UseVia};

type Found<'a> = BTreeMap<(ObjectKind, &'a str), BTreeSet<(UseVia, Option<&'a str>)>>;

/// Every ConfigMap and Secret `spec` references, once each, sorted by kind
/// (ConfigMaps first) then name, each with its uses sorted.
pub fn pod_spec_references(spec: &PodSpec) -> Vec<ObjectRef> {
    let mut found: Found<'_> = BTreeMap::new();
    for volume in spec.volumes.iter().flatten() {
        if let Some(cm) = &volume.config_map {
            volume_use(
                &mut found,
                ObjectKind::ConfigMap,
                &cm.name,
                cm.items.as_deref(),
            );
        }
        if let Some(secret) = &volume.secret
            && let Some(name) = secret.secret_name.as_deref()
        {
            volume_use(
                &mut found,
                ObjectKind::Secret,
                name,
                secret.items.as_deref(),
            );
        }
        // The CSI driver's volume names its SecretProviderClass. The driver
        // is not checked, as Reloader does not (plugins/reloader-spec.md
        // §7.3): the attribute is the driver's own.
        if let Some(spc) = volume
            .csi
            .as_ref()
            .and_then(|csi| csi.volume_attributes.as_ref()?.get("secretProviderClass"))
        {
            add(
                &mut found,
                secret_provider_class(),
                spc,
                UseVia::Volume,
                None,
            );
        }
        let sources = volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten());
        for source in sources {
            if let Some(cm) = &source.config_map {
                volume_use(
                    &mut found,
                    ObjectKind::ConfigMap,
                    &cm.name,
                    cm.items.as_deref(),
                );
            }
            if let Some(secret) = &source.secret {
                volume_use(
                    &mut found,
                    ObjectKind::Secret,
                    &secret.name,
                    secret.items.as_deref(),
                );
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
        .filter(|((_, name), _)| !name.is_empty())
        .map(|((kind, name), uses)| ObjectRef {
            kind,
            name: name.to_string(),
            uses: uses
                .into_iter()
                .map(|(via, key)| ObjectUse {
                    via,
                    key: key.map(str::to_string),
                })
                .collect(),
        })
        .collect()
}

/// [`wasmwatch_core::lookups::SECRET_PROVIDER_CLASS`] as a kind.
pub fn secret_provider_class() -> ObjectKind {
    ObjectKind::parse(wasmwatch_core::lookups::SECRET_PROVIDER_CLASS)
        .expect("the SecretProviderClass kind's name is well formed")
}

fn add<'a>(
    found: &mut Found<'a>,
    kind: ObjectKind,
    name: &'a str,
    via: UseVia,
    key: Option<&'a str>,
) {
    found.entry((kind, name)).or_default().insert((via, key));
}

/// A volume or projected source of object `kind`/`name`: its `items`' keys,
/// or the whole object without any.
fn volume_use<'a>(
    found: &mut Found<'a>,
    kind: ObjectKind,
    name: &'a str,
    items: Option<&'a [KeyToPath]>,
) {
    match items {
        Some(items) if !items.is_empty() => {
            for item in items {
                add(found, kind, name, UseVia::Volume, Some(&item.key));
            }
        }
        _ => add(found, kind, name, UseVia::Volume, None),
    }
}

fn container_references<'a>(c: &'a Container, found: &mut Found<'a>) {
    for var in c.env.iter().flatten() {
        let Some(from) = &var.value_from else {
            continue;
        };
        if let Some(r) = &from.config_map_key_ref {
            add(
                found,
                ObjectKind::ConfigMap,
                &r.name,
                UseVia::Env,
                Some(&r.key),
            );
        }
        if let Some(r) = &from.secret_key_ref {
            add(
                found,
                ObjectKind::Secret,
                &r.name,
                UseVia::Env,
                Some(&r.key),
            );
        }
    }
    for from in c.env_from.iter().flatten() {
        if let Some(r) = &from.config_map_ref {
            add(found, ObjectKind::ConfigMap, &r.name, UseVia::EnvFrom, None);
        }
        if let Some(r) = &from.secret_ref {
            add(found, ObjectKind::Secret, &r.name, UseVia::EnvFrom, None);
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
    fn a_csi_volume_uses_its_secret_provider_class() {
        let spec = serde_json::json!({
            "volumes": [
                {"name": "vault", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": true,
                    "volumeAttributes": {"secretProviderClass": "vault-db"}}},
                {"name": "other", "csi": {"driver": "other.csi.example.com",
                    "volumeAttributes": {"size": "1Gi"}}},
                {"name": "same", "secret": {"secretName": "vault-db"}}
            ],
            "containers": [{"name": "app"}]
        });
        assert_eq!(
            refs(spec),
            vec![
                secret("vault-db"),
                (secret_provider_class(), "vault-db".to_string())
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

    type Uses = Vec<(UseVia, Option<String>)>;

    fn uses(spec: serde_json::Value) -> Vec<(ObjectKind, String, Uses)> {
        let spec: PodSpec = serde_json::from_value(spec).unwrap();
        pod_spec_references(&spec)
            .into_iter()
            .map(|r| {
                let uses = r.uses.into_iter().map(|u| (u.via, u.key)).collect();
                (r.kind, r.name, uses)
            })
            .collect()
    }

    #[test]
    fn each_reference_says_how_it_is_used_and_which_keys() {
        use UseVia::{Env, EnvFrom, Volume};
        let spec = serde_json::json!({
            "volumes": [
                {"name": "a", "configMap": {"name": "cm", "items": [
                    {"key": "b.yaml", "path": "b"}, {"key": "a.yaml", "path": "a"}
                ]}},
                {"name": "b", "configMap": {"name": "whole", "items": []}},
                {"name": "c", "secret": {"secretName": "tls", "items": [{"key": "tls.crt", "path": "crt"}]}},
                {"name": "d", "projected": {"sources": [
                    {"configMap": {"name": "cm", "items": [{"key": "a.yaml", "path": "again"}]}},
                    {"secret": {"name": "tls"}},
                    {"configMap": {"name": "proj", "items": [{"key": "k", "path": "k"}]}}
                ]}}
            ],
            "containers": [{
                "name": "app",
                "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "level"}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                    {"name": "C", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}
                ],
                "envFrom": [{"configMapRef": {"name": "whole"}}, {"secretRef": {"name": "db"}}]
            }],
            "initContainers": [{
                "name": "init",
                "env": [{"name": "I", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "init"}}}]
            }]
        });
        let key = |k: &str| Some(k.to_string());
        assert_eq!(
            uses(spec),
            vec![
                (
                    ObjectKind::ConfigMap,
                    "cm".into(),
                    vec![
                        (Env, key("init")),
                        (Env, key("level")),
                        (Volume, key("a.yaml")),
                        (Volume, key("b.yaml")),
                    ]
                ),
                (
                    ObjectKind::ConfigMap,
                    "proj".into(),
                    vec![(Volume, key("k"))]
                ),
                (
                    ObjectKind::ConfigMap,
                    "whole".into(),
                    vec![(EnvFrom, None), (Volume, None)]
                ),
                (
                    ObjectKind::Secret,
                    "db".into(),
                    vec![(Env, key("password")), (EnvFrom, None)]
                ),
                (
                    ObjectKind::Secret,
                    "tls".into(),
                    vec![(Volume, None), (Volume, key("tls.crt"))]
                ),
            ]
        );
    }
}
