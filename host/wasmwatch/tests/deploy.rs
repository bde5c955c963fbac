//! deploy/: every kustomize overlay renders with kubectl; every rendered object
//! is the Kubernetes type it claims, with the security settings operators rely
//! on; the RBAC is least privilege and covers what the manifest asks for, and
//! exactly the calls the host makes (replicas run under each overlay's
//! manifest, their requests recorded by the test API server); the
//! plugin manifest in the ConfigMap is valid (and loads the bundled plugins once
//! pinned); and the render applies to the project's test API server.
//!
//! kubectl: the one on PATH (Debian's 1.20 with kustomize v2.0.3 on a fresh
//! machine, from tests/prepare), plus every binary listed in
//! `WASMWATCH_EXTRA_KUBECTL` (':'-separated), so that an old and a new
//! kustomize can be checked in one run.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Probe, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use wasmwatch_core::action::WorkloadKind;
use wasmwatch_core::{Manifest, ObjectKind};

const NAMESPACE: &str = "wasmwatch";
const SERVICE_ACCOUNT: &str = "wasmwatch";
const PLUGIN_DIR: &str = "/usr/lib/wasmwatch/plugins";
const MANIFEST_PATH: &str = "/etc/wasmwatch/manifest.yaml";
const OVERLAYS: [&str; 2] = ["cluster-wide", "single-namespace"];
const BUNDLED: [&str; 3] = [
    "http_refresh.wasm",
    "bus_refresh.wasm",
    "rollout_restart.wasm",
];
const WRITE_VERBS: [&str; 6] = [
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "*",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

fn deploy_dir() -> PathBuf {
    repo_root().join("deploy")
}

// ---------------------------------------------------------------- kubectl

fn kubectl_on_path() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("kubectl"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.is_file())
}

/// PATH's kubectl, then `WASMWATCH_EXTRA_KUBECTL`; empty (with a loud
/// message) when there is none.
fn kubectls() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = kubectl_on_path().into_iter().collect();
    if let Some(extra) = std::env::var_os("WASMWATCH_EXTRA_KUBECTL") {
        for p in std::env::split_paths(&extra) {
            assert!(
                p.is_file(),
                "WASMWATCH_EXTRA_KUBECTL names {}, which does not exist",
                p.display()
            );
            out.push(p);
        }
    }
    if out.is_empty() {
        eprintln!(
            "\n!!!!!!!! SKIPPING deploy tests: kubectl is not installed (Debian package kubernetes-client; tests/prepare installs it) !!!!!!!!\n"
        );
    }
    for k in &out {
        eprintln!("kubectl {}: {}", k.display(), kubectl_version(k));
    }
    out
}

fn kubectl_version(kubectl: &Path) -> String {
    let out = Command::new(kubectl)
        .args(["version", "--client"])
        .output()
        .expect("run kubectl version");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ")
}

/// `kubectl kustomize <dir>` as JSON objects.
fn render(kubectl: &Path, dir: &Path) -> Vec<Value> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .env_remove("KUBECONFIG")
        .output()
        .expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "{} kustomize {} failed: {}",
        kubectl.display(),
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_documents(&String::from_utf8(out.stdout).expect("utf-8 render"))
}

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("a YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

fn overlay_dir(name: &str) -> PathBuf {
    deploy_dir().join("overlays").join(name)
}

/// Every overlay in deploy/overlays (so that a new one is covered too).
fn overlays() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(deploy_dir().join("overlays"))
        .expect("deploy/overlays")
        .map(|e| e.unwrap())
        .filter(|e| e.path().join("kustomization.yaml").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for o in OVERLAYS {
        assert!(names.iter().any(|n| n == o), "no overlay {o}: {names:?}");
    }
    names
}

// ------------------------------------------------------- typed objects

fn typed<T: DeserializeOwned>(v: &Value) -> T {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| {
        panic!(
            "{} {} does not parse as its type: {e}\n{v:#}",
            v["kind"], v["metadata"]["name"]
        )
    })
}

/// A render, every object parsed into its k8s-openapi type.
#[derive(Default)]
struct Install {
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    deployments: Vec<Deployment>,
    config_maps: Vec<ConfigMap>,
    services: Vec<Service>,
    pdbs: Vec<PodDisruptionBudget>,
    /// overlays/webhook's MutatingWebhookConfiguration.
    webhooks: Vec<MutatingWebhookConfiguration>,
}

impl Install {
    fn parse(objects: &[Value]) -> Install {
        let mut i = Install::default();
        for o in objects {
            let kind = (
                o["apiVersion"].as_str().unwrap_or(""),
                o["kind"].as_str().unwrap_or(""),
            );
            match kind {
                ("v1", "Namespace") => i.namespaces.push(typed(o)),
                ("v1", "ServiceAccount") => i.service_accounts.push(typed(o)),
                ("rbac.authorization.k8s.io/v1", "ClusterRole") => i.cluster_roles.push(typed(o)),
                ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                    i.cluster_role_bindings.push(typed(o))
                }
                ("rbac.authorization.k8s.io/v1", "Role") => i.roles.push(typed(o)),
                ("rbac.authorization.k8s.io/v1", "RoleBinding") => i.role_bindings.push(typed(o)),
                ("apps/v1", "Deployment") => i.deployments.push(typed(o)),
                ("v1", "ConfigMap") => i.config_maps.push(typed(o)),
                ("v1", "Service") => i.services.push(typed(o)),
                ("policy/v1", "PodDisruptionBudget") => i.pdbs.push(typed(o)),
                ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
                    i.webhooks.push(typed(o))
                }
                other => panic!("unexpected object {other:?} in the render:\n{o:#}"),
            }
        }
        i
    }

    fn deployment(&self) -> &Deployment {
        assert_eq!(self.deployments.len(), 1, "one Deployment");
        &self.deployments[0]
    }

    fn pod_spec(&self) -> &PodSpec {
        self.deployment()
            .spec
            .template
            .spec
            .as_ref()
            .expect("pod spec")
    }

    fn pod_labels(&self) -> BTreeMap<String, String> {
        self.deployment()
            .spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .expect("pod template labels")
    }

    fn container(&self) -> &Container {
        let c = &self.pod_spec().containers;
        assert_eq!(c.len(), 1, "one container");
        &c[0]
    }

    /// The value of the container's `--flag=value` (or `--flag value`).
    fn arg(&self, flag: &str) -> Option<String> {
        let args = self.container().args.as_deref().unwrap_or_default();
        args.iter()
            .enumerate()
            .find_map(|(n, a)| match a.strip_prefix(flag) {
                Some("") => args.get(n + 1).cloned(),
                Some(rest) => rest.strip_prefix('=').map(str::to_string),
                None => None,
            })
    }

    /// Whether the container runs the webhook with a generated certificate
    /// (kept in a Secret, its CA written into the caBundle).
    fn webhook_generates_cert(&self) -> bool {
        let args = self.container().args.as_deref().unwrap_or_default();
        args.iter().any(|a| a == "--webhook-generate-cert")
    }

    /// The ConfigMap the Deployment mounts, and the manifest text in it.
    fn manifest_text(&self) -> (String, &ConfigMap) {
        let volume = self
            .pod_spec()
            .volumes
            .as_ref()
            .and_then(|v| v.iter().find(|v| v.config_map.is_some()))
            .expect("a ConfigMap volume");
        let name = volume.config_map.as_ref().unwrap().name.clone();
        let cm = self
            .config_maps
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name.as_str()))
            .unwrap_or_else(|| {
                panic!("the Deployment mounts ConfigMap {name}, which the render lacks")
            });
        assert_eq!(cm.metadata.namespace.as_deref(), Some(NAMESPACE));
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get("manifest.yaml"))
            .expect("key manifest.yaml")
            .clone();
        (text, cm)
    }
}

// ---------------------------------------------------------------- RBAC

/// The rules bound to the service account, each with where it applies
/// (`None`: cluster-wide).
struct Grants {
    rules: Vec<(Option<String>, PolicyRule)>,
}

fn is_our_subject(subjects: &Option<Vec<Subject>>) -> bool {
    let s = subjects.as_deref().unwrap_or_default();
    assert_eq!(s.len(), 1, "bindings name exactly one subject: {s:?}");
    assert_eq!(s[0].kind, "ServiceAccount");
    assert_eq!(s[0].name, SERVICE_ACCOUNT);
    assert_eq!(s[0].namespace.as_deref(), Some(NAMESPACE));
    true
}

impl Grants {
    fn of(i: &Install) -> Grants {
        let cluster_role = |r: &RoleRef| -> Vec<PolicyRule> {
            assert_eq!(r.api_group.as_deref(), Some("rbac.authorization.k8s.io"));
            assert_eq!(r.kind, "ClusterRole", "{r:?}");
            i.cluster_roles
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(r.name.as_str()))
                .unwrap_or_else(|| panic!("binding to ClusterRole {} not in the render", r.name))
                .rules
                .clone()
                .unwrap_or_default()
        };
        let mut rules = Vec::new();
        for b in &i.cluster_role_bindings {
            assert!(is_our_subject(&b.subjects));
            for r in cluster_role(&b.role_ref) {
                rules.push((None, r));
            }
        }
        for b in &i.role_bindings {
            assert!(is_our_subject(&b.subjects));
            let ns = b.metadata.namespace.clone().expect("RoleBinding namespace");
            let bound = if b.role_ref.kind == "Role" {
                i.roles
                    .iter()
                    .find(|r| {
                        r.metadata.name.as_deref() == Some(b.role_ref.name.as_str())
                            && r.metadata.namespace.as_deref() == Some(ns.as_str())
                    })
                    .unwrap_or_else(|| {
                        panic!("binding to Role {ns}/{} not in the render", b.role_ref.name)
                    })
                    .rules
                    .clone()
                    .unwrap_or_default()
            } else {
                cluster_role(&b.role_ref)
            };
            for r in bound {
                rules.push((Some(ns.clone()), r));
            }
        }
        for r in &i.roles {
            let bound = i.role_bindings.iter().any(|b| {
                b.role_ref.kind == "Role"
                    && Some(b.role_ref.name.as_str()) == r.metadata.name.as_deref()
                    && b.metadata.namespace == r.metadata.namespace
            });
            assert!(bound, "Role {:?} is bound", r.metadata.name);
        }
        Grants { rules }
    }

    /// Whether `verb` on `group/resource` (named `name`) in `namespace`
    /// (`None`: across all namespaces) is allowed.
    fn allows(
        &self,
        namespace: Option<&str>,
        group: &str,
        resource: &str,
        verb: &str,
        name: Option<&str>,
    ) -> bool {
        let has = |list: &[String], x: &str| list.iter().any(|l| l == x || l == "*");
        self.rules.iter().any(|(scope, r)| {
            let in_scope = match (scope, namespace) {
                (None, _) => true,
                (Some(s), Some(n)) => s == n,
                (Some(_), None) => false,
            };
            let names = r.resource_names.as_deref().unwrap_or_default();
            in_scope
                && has(r.api_groups.as_deref().unwrap_or_default(), group)
                && has(r.resources.as_deref().unwrap_or_default(), resource)
                && has(&r.verbs, verb)
                && (names.is_empty() || name.is_some_and(|n| names.iter().any(|x| x == n)))
        })
    }

    /// Every (group, resource, verb) write the rules grant, with whether it
    /// is limited by resourceNames.
    fn writes(&self) -> BTreeSet<(String, String, String, bool)> {
        let mut out = BTreeSet::new();
        for (_, r) in &self.rules {
            for g in r.api_groups.as_deref().unwrap_or_default() {
                for res in r.resources.as_deref().unwrap_or_default() {
                    for v in &r.verbs {
                        if WRITE_VERBS.contains(&v.as_str()) {
                            let named = !r.resource_names.as_deref().unwrap_or_default().is_empty();
                            out.insert((g.clone(), res.clone(), v.clone(), named));
                        }
                    }
                }
            }
        }
        out
    }
}

fn all_rules(i: &Install) -> Vec<PolicyRule> {
    i.cluster_roles
        .iter()
        .flat_map(|c| c.rules.clone().unwrap_or_default())
        .chain(
            i.roles
                .iter()
                .flat_map(|r| r.rules.clone().unwrap_or_default()),
        )
        .collect()
}

/// What restarting a workload of `kind` calls: (API group, resource,
/// verbs). A Job's pod template cannot change, so one that opts in is
/// deleted and created again; the other kinds are patched.
fn restart_calls(
    kind: &WorkloadKind,
) -> Option<(&'static str, &'static str, &'static [&'static str])> {
    const PATCH: &[&str] = &["get", "patch"];
    Some(match kind.gvk() {
        ("apps", "v1", "Deployment") => ("apps", "deployments", PATCH),
        ("apps", "v1", "StatefulSet") => ("apps", "statefulsets", PATCH),
        ("apps", "v1", "DaemonSet") => ("apps", "daemonsets", PATCH),
        ("batch", "v1", "CronJob") => ("batch", "cronjobs", PATCH),
        ("batch", "v1", "Job") => ("batch", "jobs", &["get", "create", "delete"]),
        ("argoproj.io", "v1alpha1", "Rollout") => ("argoproj.io", "rollouts", PATCH),
        _ => return None,
    })
}

fn check_rbac(overlay: &str, i: &Install, manifest: &Manifest) {
    // No wildcards, no non-resource URLs, no aggregation.
    for r in all_rules(i) {
        for list in [
            r.api_groups.as_deref().unwrap_or_default(),
            r.resources.as_deref().unwrap_or_default(),
            &r.verbs[..],
        ] {
            assert!(
                !list.iter().any(|x| x == "*"),
                "{overlay}: wildcard in {r:?}"
            );
        }
        assert!(r.non_resource_urls.is_none(), "{overlay}: {r:?}");
        for res in r.resources.as_deref().unwrap_or_default() {
            assert!(
                !res.contains('/'),
                "{overlay}: no subresources needed: {r:?}"
            );
        }
        // Reading ConfigMaps and Secrets only, whatever the rule (and
        // creating the digest key's Secret, checked by namespace below).
        if r.api_groups
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|g| g.is_empty())
        {
            for res in r.resources.as_deref().unwrap_or_default() {
                if res == "configmaps" || res == "secrets" {
                    for v in &r.verbs {
                        let key_create = res == "secrets"
                            && v == "create"
                            && r.resource_names.as_deref().unwrap_or_default().is_empty();
                        assert!(
                            ["get", "list", "watch"].contains(&v.as_str()) || key_create,
                            "{overlay}: {v} on {res} granted: {r:?}"
                        );
                    }
                }
            }
        }
    }
    for c in &i.cluster_roles {
        assert!(c.aggregation_rule.is_none(), "{overlay}: {c:?}");
    }

    let g = Grants::of(i);
    // Exactly these writes, nothing else: restarts (a patch of the pod
    // template, of a CronJob's job template, of a Rollout's; a Job that opts
    // in deleted and created again), core/v1 Events (created, patched when
    // they repeat), the digest key Secret (created once), and the Leases;
    // with the webhook's generated certificate, its Secret (created once,
    // as the digest key's) and the caBundle of the one
    // MutatingWebhookConfiguration (updated, by name).
    // The test `the_rbac_allows_exactly_the_calls_the_host_makes` checks
    // the host really makes each of them.
    let mut expected: BTreeSet<(String, String, String, bool)> = [
        ("apps", "daemonsets", "patch", false),
        ("apps", "deployments", "patch", false),
        ("apps", "statefulsets", "patch", false),
        ("batch", "cronjobs", "patch", false),
        ("batch", "jobs", "create", false),
        ("batch", "jobs", "delete", false),
        ("argoproj.io", "rollouts", "patch", false),
        ("", "events", "create", false),
        ("", "events", "patch", false),
        ("", "secrets", "create", false),
        ("coordination.k8s.io", "leases", "create", false),
        ("coordination.k8s.io", "leases", "update", true),
        ("coordination.k8s.io", "leases", "delete", false),
    ]
    .into_iter()
    .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), d))
    .collect();
    if i.webhook_generates_cert() {
        expected.insert((
            "admissionregistration.k8s.io".into(),
            "mutatingwebhookconfigurations".into(),
            "patch".into(),
            true,
        ));
    }
    assert_eq!(g.writes(), expected, "{overlay}: the write permissions");

    // The digest key: created (RBAC cannot limit create by name) and read
    // by name in wasmwatch's namespace, nowhere else, never changed.
    let lease_ns = manifest.ha.namespace.as_deref().unwrap_or(NAMESPACE);
    let key_secret = manifest.watch.digest_key_secret.as_str();
    assert!(g.allows(Some(lease_ns), "", "secrets", "create", None));
    assert!(
        g.allows(Some(lease_ns), "", "secrets", "get", Some(key_secret)),
        "{overlay}: get secret {key_secret} in {lease_ns}"
    );
    for ns in [None, Some(NAMESPACE), Some("default"), Some("kube-system")] {
        for res in ["configmaps", "secrets"] {
            for verb in ["create", "update", "patch", "delete", "deletecollection"] {
                if (ns, res, verb) == (Some(lease_ns), "secrets", "create") {
                    continue;
                }
                assert!(
                    !g.allows(ns, "", res, verb, Some("x")) && !g.allows(ns, "", res, verb, None),
                    "{overlay}: {verb} {res} in {ns:?}"
                );
            }
        }
    }

    // Leases: create, get and delete anywhere in our namespace (RBAC cannot
    // limit create by name, and the index segments' names grow for ever),
    // update, list and watch only on the manifest's Leases, and only there.
    let ha = &manifest.ha;
    let lease = |ns: &str, verb: &str, name: Option<&str>| {
        g.allows(Some(ns), "coordination.k8s.io", "leases", verb, name)
    };
    assert!(lease(lease_ns, "create", None));
    for name in [ha.lease_name.as_str(), ha.state_lease_name.as_str()] {
        for verb in ["get", "list", "watch", "update"] {
            assert!(
                lease(lease_ns, verb, Some(name)),
                "{overlay}: {verb} lease {name}"
            );
        }
        assert!(
            !lease("default", "update", Some(name)),
            "{overlay}: lease elsewhere"
        );
        assert!(
            !lease("kube-system", "get", Some(name)),
            "{overlay}: lease elsewhere"
        );
    }
    for verb in ["list", "watch", "update"] {
        assert!(
            !lease(lease_ns, verb, Some("someone-elses-lease")),
            "{overlay}: {verb}"
        );
        assert!(
            !lease(lease_ns, verb, None),
            "{overlay}: {verb} leases unnamed"
        );
    }
    let segment = format!("{}-segment-12345", ha.state_lease_name);
    for verb in ["get", "delete"] {
        assert!(lease(lease_ns, verb, Some(&segment)), "{overlay}: {verb}");
        for ns in ["default", "kube-system"] {
            assert!(
                !lease(ns, verb, Some(&segment)),
                "{overlay}: {verb} in {ns}"
            );
        }
    }
    assert!(!g.allows(None, "coordination.k8s.io", "leases", "list", None));

    // What the manifest needs is granted: watch and list the watched kinds
    // (cluster-wide for "*"), the lookups in the same scope, restarts and
    // refreshes where the capabilities allow them, and Events.
    let cluster_wide = manifest.watch.namespaces.iter().any(|n| n == "*");
    let scopes: Vec<Option<&str>> = if cluster_wide {
        vec![None]
    } else {
        manifest
            .watch
            .namespaces
            .iter()
            .map(|n| Some(n.as_str()))
            .collect()
    };
    let read = ["get", "list", "watch"];
    for scope in &scopes {
        for kind in manifest.watch.object_kinds() {
            let (group, res) = match kind {
                ObjectKind::ConfigMap => ("", "configmaps".to_string()),
                ObjectKind::Secret => ("", "secrets".to_string()),
                ObjectKind::Custom(k) => {
                    let gvk = kube::api::GroupVersionKind::gvk(k.group(), k.version(), k.kind());
                    let given = manifest.watch.custom(kind).unwrap().plural;
                    let plural =
                        given.unwrap_or_else(|| kube::api::ApiResource::from_gvk(&gvk).plural);
                    (k.group(), plural)
                }
            };
            let res = res.as_str();
            for v in read {
                assert!(
                    g.allows(*scope, group, res, v, None),
                    "{overlay}: {v} {res} in {scope:?}"
                );
            }
        }
        // The lookups watch every workload kind rollout-restart may find
        // (Rollouts when the API server serves them), Services and
        // EndpointSlices.
        for (group, res) in [
            ("", "services"),
            ("discovery.k8s.io", "endpointslices"),
            ("apps", "deployments"),
            ("apps", "statefulsets"),
            ("apps", "daemonsets"),
            ("batch", "cronjobs"),
            ("batch", "jobs"),
            ("argoproj.io", "rollouts"),
        ] {
            for v in read {
                assert!(
                    g.allows(*scope, group, res, v, None),
                    "{overlay}: {v} {group}/{res}"
                );
            }
        }
    }
    // Restarts: every kind a plugin may restart, in every namespace it may
    // restart in, has the calls its restart makes; and every write on a
    // workload kind the RBAC grants is one a granted restart needs.
    let mut restart_writes: BTreeSet<(String, String, String)> = BTreeSet::new();
    for p in &manifest.plugins {
        let grant = &p.capabilities.restart;
        if grant.is_empty() {
            continue;
        }
        let kinds: Vec<WorkloadKind> = if grant.kinds.is_empty() {
            // The list form: the apps/v1 kinds.
            vec![
                WorkloadKind::Deployment,
                WorkloadKind::StatefulSet,
                WorkloadKind::DaemonSet,
            ]
        } else {
            grant
                .kinds
                .iter()
                .map(|k| {
                    assert_ne!(
                        k, "*",
                        "{overlay}: plugin {} may restart any kind, which no RBAC rule can follow: \
                         name the kinds",
                        p.name
                    );
                    WorkloadKind::parse(k).unwrap_or_else(|e| panic!("{overlay}: {e}"))
                })
                .collect()
        };
        for kind in &kinds {
            let (group, res, verbs) = restart_calls(kind).unwrap_or_else(|| {
                panic!(
                    "{overlay}: plugin {} may restart {kind:?}, which this test \
                    knows no RBAC for",
                    p.name
                )
            });
            for v in verbs {
                if WRITE_VERBS.contains(v) {
                    restart_writes.insert((group.to_string(), res.to_string(), v.to_string()));
                }
                for n in &grant.namespaces {
                    let scope = (n.0 != "*").then_some(n.0.as_str());
                    assert!(
                        g.allows(scope, group, res, v, Some("app")),
                        "{overlay}: plugin {} may restart {kind:?} in {}, RBAC lacks {v} {group}/{res}",
                        p.name,
                        n.0
                    );
                }
            }
        }
    }
    for (group, res, verb, _) in g.writes() {
        if ["apps", "batch", "argoproj.io"].contains(&group.as_str()) {
            assert!(
                restart_writes.contains(&(group.clone(), res.clone(), verb.clone())),
                "{overlay}: {verb} {group}/{res} granted, but no plugin's capabilities.restart \
                 grants a kind that needs it (granted: {restart_writes:?})"
            );
        }
    }
    for p in &manifest.plugins {
        for n in &p.capabilities.refresh {
            let scope = (n.0 != "*").then_some(n.0.as_str());
            assert!(g.allows(scope, "discovery.k8s.io", "endpointslices", "list", None));
            assert!(g.allows(scope, "", "services", "get", Some("app")));
        }
        if p.capabilities.events {
            for scope in &scopes {
                assert!(g.allows(*scope, "", "events", "create", None));
            }
        }
    }
    // Nothing the host does not read: no Pods (their specs may hold
    // secrets in env values), no events.k8s.io.
    for scope in &scopes {
        for v in read {
            assert!(
                !g.allows(*scope, "", "pods", v, None),
                "{overlay}: {v} pods"
            );
        }
    }
    assert!(
        !g.granted()
            .iter()
            .any(|(group, _, _)| group == "events.k8s.io"),
        "{overlay}: events.k8s.io"
    );
    // Nothing beyond the watched scope.
    if !cluster_wide {
        assert!(i.cluster_roles.is_empty() && i.cluster_role_bindings.is_empty());
        assert!(!g.allows(None, "", "configmaps", "list", None));
        assert!(!g.allows(Some("kube-system"), "", "secrets", "get", Some("x")));
        assert!(!g.allows(
            Some("kube-system"),
            "apps",
            "deployments",
            "patch",
            Some("x")
        ));
    }
}

// ------------------------------------------------ Deployment and friends

fn probe_path(p: &Option<Probe>, what: &str) -> (String, IntOrString) {
    let h = p
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .unwrap_or_else(|| panic!("{what}: an httpGet probe"));
    (h.path.clone().unwrap_or_default(), h.port.clone())
}

/// The container port a probe or Service port names.
fn resolve_port(c: &Container, port: &IntOrString) -> i32 {
    match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            c.ports
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .unwrap_or_else(|| panic!("no container port named {name}"))
                .container_port
        }
    }
}

fn env_value(c: &Container, name: &str) -> Option<k8s_openapi::api::core::v1::EnvVar> {
    c.env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|e| e.name == name)
        .cloned()
}

fn field_ref(c: &Container, name: &str) -> String {
    env_value(c, name)
        .and_then(|e| e.value_from)
        .and_then(|v| v.field_ref)
        .map(|f| f.field_path)
        .unwrap_or_else(|| panic!("env {name} from the downward API"))
}

fn check_container_security(c: &Container, pod: &PodSpec, what: &str) {
    let sc = c
        .security_context
        .as_ref()
        .expect("container securityContext");
    let psc = pod.security_context.as_ref();
    let either = |container: Option<bool>, pod: Option<bool>| container.or(pod);
    assert_eq!(
        either(sc.run_as_non_root, psc.and_then(|p| p.run_as_non_root)),
        Some(true),
        "{what}: runAsNonRoot"
    );
    assert_eq!(
        sc.run_as_user.or(psc.and_then(|p| p.run_as_user)),
        Some(65532),
        "{what}: runAsUser"
    );
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "{what}: readOnlyRootFilesystem"
    );
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{what}: allowPrivilegeEscalation"
    );
    assert_ne!(sc.privileged, Some(true), "{what}: privileged");
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(
        caps.drop.as_deref(),
        Some(&["ALL".to_string()][..]),
        "{what}: drop ALL"
    );
    assert!(
        caps.add.as_deref().unwrap_or_default().is_empty(),
        "{what}: no added caps"
    );
    let seccomp = sc
        .seccomp_profile
        .as_ref()
        .or(psc.and_then(|p| p.seccomp_profile.as_ref()))
        .expect("seccompProfile");
    assert_eq!(seccomp.type_, "RuntimeDefault", "{what}: seccomp");
    assert_eq!(
        field_ref(c, "POD_NAME"),
        "metadata.name",
        "{what}: POD_NAME from the downward API"
    );
    assert_eq!(
        field_ref(c, "POD_NAMESPACE"),
        "metadata.namespace",
        "{what}"
    );
    assert!(
        pod.host_network != Some(true) && pod.host_pid != Some(true),
        "{what}"
    );
}

fn check_workload(overlay: &str, i: &Install) {
    assert_eq!(i.namespaces.len(), 1);
    assert_eq!(i.namespaces[0].metadata.name.as_deref(), Some(NAMESPACE));
    assert_eq!(i.service_accounts.len(), 1);
    let sa = &i.service_accounts[0].metadata;
    assert_eq!(
        (sa.name.as_deref(), sa.namespace.as_deref()),
        (Some(SERVICE_ACCOUNT), Some(NAMESPACE))
    );

    let d = i.deployment();
    assert_eq!(d.metadata.namespace.as_deref(), Some(NAMESPACE));
    let spec = &d.spec;
    assert_eq!(spec.replicas, Some(2), "{overlay}: two replicas");
    let pod = i.pod_spec();
    assert_eq!(pod.service_account_name.as_deref(), Some(SERVICE_ACCOUNT));
    let c = i.container();
    check_container_security(c, pod, overlay);
    assert_eq!(
        c.args.as_deref().unwrap_or_default()[..3],
        ["run", "--manifest", MANIFEST_PATH],
        "{overlay}: args"
    );
    assert!(c.image.as_deref().is_some_and(|i| i.contains("wasmwatch")));

    // Probes on the admin port.
    for (probe, path) in [
        (&c.liveness_probe, "/healthz"),
        (&c.readiness_probe, "/readyz"),
        (&c.startup_probe, "/healthz"),
    ] {
        let (p, port) = probe_path(probe, path);
        assert_eq!(p, path, "{overlay}: probe path");
        assert_eq!(resolve_port(c, &port), 8080, "{overlay}: probe port");
    }

    // Resources: small requests, a memory limit.
    let res = c.resources.as_ref().expect("resources");
    let req = res.requests.as_ref().expect("requests");
    assert!(
        req.contains_key("cpu") && req.contains_key("memory"),
        "{overlay}: {req:?}"
    );
    assert!(
        res.limits
            .as_ref()
            .is_some_and(|l| l.contains_key("memory"))
    );

    // Volumes: the manifest read-only at /etc/wasmwatch, the plugin cache an
    // emptyDir named by WASMWATCH_CACHE_DIR, every other writable path an emptyDir.
    let volumes: BTreeMap<&str, &k8s_openapi::api::core::v1::Volume> = pod
        .volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let cache = env_value(c, "WASMWATCH_CACHE_DIR")
        .and_then(|e| e.value)
        .expect("WASMWATCH_CACHE_DIR");
    let mut saw_manifest = false;
    let mut saw_cache = false;
    for m in c.volume_mounts.as_deref().unwrap_or_default() {
        let v = volumes[m.name.as_str()];
        if let Some(cm) = &v.config_map {
            assert_eq!(
                Path::new(MANIFEST_PATH).parent(),
                Some(Path::new(&m.mount_path))
            );
            assert_eq!(m.read_only, Some(true));
            assert!(cm.name.starts_with("wasmwatch-manifest"));
            saw_manifest = true;
        } else {
            assert!(
                v.empty_dir.is_some(),
                "{overlay}: {} is an emptyDir",
                m.name
            );
            saw_cache |= m.mount_path == cache;
        }
    }
    assert!(
        saw_manifest && saw_cache,
        "{overlay}: manifest and cache mounts"
    );

    // The Service and the PodDisruptionBudget select the pods.
    let labels = i.pod_labels();
    let selects = |sel: &BTreeMap<String, String>| {
        !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    let dsel = spec.selector.match_labels.clone().unwrap_or_default();
    assert!(selects(&dsel));
    // The admin Service, and overlays/webhook's (see check_webhook).
    assert_eq!(
        i.services.len(),
        1 + i.webhooks.len(),
        "{overlay}: Services"
    );
    for s in &i.services {
        let sel = s.spec.as_ref().and_then(|s| s.selector.clone());
        assert!(
            selects(&sel.unwrap_or_default()),
            "{overlay}: Service {:?} selector",
            s.metadata.name
        );
    }
    let svc = i
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("wasmwatch"))
        .and_then(|s| s.spec.as_ref())
        .expect("the admin Service wasmwatch");
    let ports = svc.ports.as_deref().unwrap_or_default();
    assert!(
        ports.iter().any(|p| p.port == 8080
            && p.target_port
                .as_ref()
                .is_some_and(|t| resolve_port(c, t) == 8080)),
        "{overlay}: the Service exposes the admin port: {ports:?}"
    );
    assert_eq!(i.pdbs.len(), 1);
    let pdb = i.pdbs[0].spec.as_ref().unwrap();
    assert_eq!(
        pdb.min_available,
        Some(IntOrString::Int(1)),
        "{overlay}: PDB"
    );
    let psel = pdb
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    assert!(selects(&psel), "{overlay}: PDB selector");
    assert_eq!(i.pdbs[0].metadata.namespace.as_deref(), Some(NAMESPACE));
}

// ------------------------------------------------------------ manifest

/// Runs deploy/pin-plugins with `args` and the manifest files.
fn pin_plugins(args: &[&str], manifests: &[&Path]) {
    let out = Command::new(deploy_dir().join("pin-plugins"))
        .args(args)
        .args(manifests)
        .output()
        .expect("run deploy/pin-plugins");
    assert!(
        out.status.success(),
        "pin-plugins {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The manifest text as shipped is refused only for its placeholder pins;
/// pinned (by deploy/pin-plugins from a SHA256SUMS file) it parses.
fn check_manifest(overlay: &str, text: &str) -> Manifest {
    let base = Path::new(MANIFEST_PATH).parent().unwrap();
    match Manifest::parse(text, base) {
        Ok(_) => {
            // Already pinned by an operator: fine, as long as it is valid.
        }
        Err(e) => {
            let paths: Vec<&str> = e.problems.iter().map(|p| p.path.as_str()).collect();
            assert!(
                !paths.is_empty() && paths.iter().all(|p| p.ends_with(".sha256")),
                "{overlay}: the shipped manifest has problems beyond its placeholder pins: {e}"
            );
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let sums = dir.path().join("SHA256SUMS");
    let mut fake = String::new();
    for (n, name) in BUNDLED.iter().enumerate() {
        fake.push_str(&format!("{}  {name}\n", format!("{:x}", n + 10).repeat(64)));
    }
    std::fs::write(&sums, fake).unwrap();
    let file = dir.path().join("manifest.yaml");
    std::fs::write(&file, text).unwrap();
    pin_plugins(&["--sums", sums.to_str().unwrap()], &[&file]);
    let pinned = std::fs::read_to_string(&file).unwrap();
    let m = Manifest::parse(&pinned, base)
        .unwrap_or_else(|e| panic!("{overlay}: the pinned manifest: {e}"));

    assert!(m.ha.enabled, "{overlay}: HA (two replicas)");
    let modules: BTreeSet<PathBuf> = m
        .plugins
        .iter()
        .map(|p| p.module_path(&m.base_dir))
        .collect();
    let bundled: BTreeSet<PathBuf> = BUNDLED
        .iter()
        .map(|b| Path::new(PLUGIN_DIR).join(b))
        .collect();
    assert_eq!(
        modules, bundled,
        "{overlay}: the three bundled plugins from the image"
    );
    for p in &m.plugins {
        let file = p.module.file_name().unwrap().to_str().unwrap();
        let n = BUNDLED.iter().position(|b| *b == file).unwrap();
        assert_eq!(
            p.sha256,
            format!("{:x}", n + 10).repeat(64),
            "{overlay}: {} pinned",
            p.name
        );
        assert!(
            !p.capabilities.secret_values,
            "{overlay}: {} gets no Secret values",
            p.name
        );
    }
    m
}

/// overlays/webhook: the container serves the webhook on the port the
/// Service targets; the MutatingWebhookConfiguration calls that Service,
/// whose name the generated certificate is for, only for updates of the
/// workload kinds a restart records content on, only for workloads that opt
/// in, and never blocks one when the webhook is down; the RBAC lets the host
/// keep its certificate's Secret and the caBundle, by name, and nothing
/// more. Overlays without it: no webhook flag, no grant.
fn check_webhook(overlay: &str, i: &Install) {
    let g = Grants::of(i);
    let mwc = |verb: &str, name: Option<&str>| {
        g.allows(
            None,
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            verb,
            name,
        )
    };
    if i.webhooks.is_empty() {
        assert_eq!(i.arg("--webhook-addr"), None, "{overlay}");
        assert!(!mwc("get", Some("wasmwatch")), "{overlay}");
        return;
    }
    assert_eq!(i.webhooks.len(), 1, "{overlay}: one configuration");
    let config = &i.webhooks[0];
    let name = config.metadata.name.as_deref().expect("name");
    assert_eq!(
        i.arg("--webhook-configuration")
            .as_deref()
            .unwrap_or("wasmwatch"),
        name,
        "{overlay}: the configuration the host writes the CA into"
    );
    let hooks = config.webhooks.as_deref().unwrap_or_default();
    assert_eq!(hooks.len(), 1, "{overlay}: one webhook");
    let h = &hooks[0];

    // The API server calls the Service, which reaches the port the
    // container serves the webhook on.
    let c = i.container();
    let addr: std::net::SocketAddr = i
        .arg("--webhook-addr")
        .expect("--webhook-addr")
        .parse()
        .expect("--webhook-addr is an address");
    assert!(
        addr.ip().is_unspecified(),
        "{overlay}: reachable from the Service"
    );
    assert!(h.client_config.url.is_none(), "{overlay}: {h:?}");
    let to = h
        .client_config
        .service
        .as_ref()
        .expect("clientConfig.service");
    assert_eq!(to.path.as_deref(), Some("/mutate"), "{overlay}");
    let svc = i
        .services
        .iter()
        .find(|s| {
            s.metadata.name.as_deref() == Some(to.name.as_str())
                && s.metadata.namespace.as_deref() == Some(to.namespace.as_str())
        })
        .unwrap_or_else(|| panic!("{overlay}: no Service {}/{}", to.namespace, to.name));
    let port = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default()
        .iter()
        .find(|p| p.port == to.port.unwrap_or(443))
        .unwrap_or_else(|| panic!("{overlay}: the webhook Service has no port {:?}", to.port));
    let target = port.target_port.as_ref().expect("targetPort");
    assert_eq!(
        resolve_port(c, target),
        i32::from(addr.port()),
        "{overlay}: the Service targets the webhook's port"
    );

    // TLS: a generated certificate is for the Service's name, and the host
    // writes the caBundle (none rendered); otherwise a certificate folder.
    if i.webhook_generates_cert() {
        assert_eq!(
            i.arg("--webhook-dns-name"),
            None,
            "{overlay}: the default name"
        );
        assert_eq!(
            format!("{}.{}.svc", to.name, to.namespace),
            format!("wasmwatch-webhook.{NAMESPACE}.svc"),
            "{overlay}: the generated certificate's default name is the Service's"
        );
        assert!(h.client_config.ca_bundle.is_none(), "{overlay}: caBundle");
        let secret = i
            .arg("--webhook-secret")
            .unwrap_or("wasmwatch-webhook-tls".into());
        assert!(g.allows(Some(NAMESPACE), "", "secrets", "create", None));
        assert!(
            g.allows(Some(NAMESPACE), "", "secrets", "get", Some(&secret)),
            "{overlay}: get secret {secret}"
        );
        for verb in ["get", "patch"] {
            assert!(mwc(verb, Some(name)), "{overlay}: {verb} {name}");
            assert!(
                !mwc(verb, Some("another")),
                "{overlay}: {verb} by name only"
            );
            assert!(!mwc(verb, None), "{overlay}: {verb} by name only");
        }
    } else {
        assert!(i.arg("--webhook-cert-dir").is_some(), "{overlay}: TLS");
        assert!(!mwc("patch", Some(name)), "{overlay}");
    }
    for verb in ["create", "update", "delete", "list", "watch"] {
        assert!(!mwc(verb, Some(name)), "{overlay}: {verb}");
    }

    // What it is sent: updates (a create has no record to restore), of the
    // kinds whose restarts leave records (a Job is re-created, not updated),
    // labelled to opt in.
    let mut resources = BTreeSet::new();
    for r in h.rules.as_deref().unwrap_or_default() {
        assert_eq!(
            r.operations.as_deref(),
            Some(&["UPDATE".to_string()][..]),
            "{overlay}: {r:?}"
        );
        assert_eq!(r.scope.as_deref(), Some("Namespaced"), "{overlay}: {r:?}");
        for group in r.api_groups.as_deref().unwrap_or_default() {
            for version in r.api_versions.as_deref().unwrap_or_default() {
                for res in r.resources.as_deref().unwrap_or_default() {
                    resources.insert(format!("{group}/{version}/{res}"));
                }
            }
        }
    }
    let expected: BTreeSet<String> = [
        "apps/v1/deployments",
        "apps/v1/statefulsets",
        "apps/v1/daemonsets",
        "batch/v1/cronjobs",
        "argoproj.io/v1alpha1/rollouts",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    assert_eq!(resources, expected, "{overlay}: the webhook's rules");
    let opt_in = h
        .object_selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    assert_eq!(
        opt_in.get("wasmwatch.io/webhook").map(String::as_str),
        Some("enabled"),
        "{overlay}: workloads opt in"
    );
    // A webhook that is down never blocks a deploy.
    assert_eq!(h.failure_policy.as_deref(), Some("Ignore"), "{overlay}");
    assert_eq!(h.side_effects, "None", "{overlay}");
    assert_eq!(h.admission_review_versions, ["v1"], "{overlay}");
    assert!(
        h.timeout_seconds.is_some_and(|t| (1..=10).contains(&t)),
        "{overlay}: timeoutSeconds"
    );
}

fn check_overlay(overlay: &str, objects: &[Value]) {
    let i = Install::parse(objects);
    check_workload(overlay, &i);
    let (text, _) = i.manifest_text();
    let m = check_manifest(overlay, &text);
    check_rbac(overlay, &i, &m);
    check_webhook(overlay, &i);
}

// --------------------------------------------------------------- tests

#[test]
fn every_overlay_renders_parses_and_is_locked_down() {
    let kubectls = kubectls();
    for kubectl in &kubectls {
        for overlay in overlays() {
            let objects = render(kubectl, &overlay_dir(&overlay));
            check_overlay(&overlay, &objects);
        }
    }
}

/// Two kubectl versions (kustomize v2.0.3 and v5) give the same objects, up
/// to the generated ConfigMap's hash suffix and empty metadata maps.
#[test]
fn every_kubectl_renders_the_same_objects() {
    let kubectls = kubectls();
    if kubectls.len() < 2 {
        eprintln!(
            "only one kubectl: set WASMWATCH_EXTRA_KUBECTL to compare another (e.g. Debian's 1.20)"
        );
        return;
    }
    for overlay in overlays() {
        let renders: Vec<BTreeMap<String, Value>> = kubectls
            .iter()
            .map(|k| common::normalised_objects(&render(k, &overlay_dir(&overlay))))
            .collect();
        for (k, r) in kubectls.iter().zip(&renders).skip(1) {
            assert_eq!(
                r,
                &renders[0],
                "{overlay}: {} and {} render differently",
                k.display(),
                kubectls[0].display()
            );
        }
    }
}

/// The manifests in deploy/ pinned with the real bundled plugins (built from
/// plugins/ as the Dockerfile builds them) pass `wasmwatch validate`: pins,
/// imports, worlds, and each plugin's check of its default config.
#[test]
fn default_manifests_validate_with_the_bundled_plugins() {
    let dir = tempfile::tempdir().unwrap();
    for b in BUNDLED {
        let crate_name = b.trim_end_matches(".wasm").replace('_', "-");
        std::fs::copy(wasmwatch_testkit::plugin(&crate_name), dir.path().join(b)).unwrap();
    }
    let mut manifests = vec![deploy_dir().join("base/manifest.yaml")];
    for o in overlays() {
        let m = overlay_dir(&o).join("manifest.yaml");
        if m.is_file() {
            manifests.push(m);
        }
    }
    for (n, shipped) in manifests.iter().enumerate() {
        let text = std::fs::read_to_string(shipped).unwrap();
        assert!(
            text.contains(PLUGIN_DIR),
            "{}: modules under {PLUGIN_DIR}",
            shipped.display()
        );
        let local = dir.path().join(format!("manifest-{n}.yaml"));
        let plugin_dir = format!("{}/", dir.path().display());
        std::fs::write(&local, text.replace(&format!("{PLUGIN_DIR}/"), &plugin_dir)).unwrap();
        pin_plugins(&["--dir", dir.path().to_str().unwrap()], &[&local]);
        let out = Command::new(env!("CARGO_BIN_EXE_wasmwatch"))
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .arg("validate")
            .arg(&local)
            .output()
            .expect("run wasmwatch validate");
        assert!(
            out.status.success(),
            "{} does not validate with the bundled plugins: {}{}",
            shipped.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The Dockerfile puts exactly the modules the manifests name where they
/// name them, with the SHA256SUMS that pin-plugins reads, and runs as 65532.
#[test]
fn the_dockerfile_ships_what_the_manifests_name() {
    let dockerfile = std::fs::read_to_string(deploy_dir().join("Dockerfile")).unwrap();
    for b in BUNDLED {
        assert!(dockerfile.contains(b), "Dockerfile copies {b}");
    }
    assert!(dockerfile.contains(&format!("{PLUGIN_DIR}/")));
    assert!(dockerfile.contains("SHA256SUMS"));
    assert!(dockerfile.contains("wasm32-wasip2"));
    assert!(dockerfile.lines().any(|l| l.trim() == "USER 65532:65532"));
    let script = std::fs::read_to_string(deploy_dir().join("pin-plugins")).unwrap();
    assert!(script.contains(&format!("{PLUGIN_DIR}/SHA256SUMS")));
}

/// The leader-election sidecar example: parses, is locked down like the
/// service, and its Role covers exactly the Lease its `elect` uses.
#[test]
fn the_sidecar_example_is_consistent() {
    let text = std::fs::read_to_string(deploy_dir().join("examples/leader-sidecar.yaml")).unwrap();
    let i = Install::parse(&yaml_documents(&text));
    let d = i.deployment();
    let pod = i.pod_spec();
    let c = pod
        .containers
        .iter()
        .find(|c| {
            c.args
                .as_deref()
                .unwrap_or_default()
                .first()
                .map(String::as_str)
                == Some("elect")
        })
        .expect("a container running `wasmwatch elect`");
    check_container_security(c, pod, "sidecar");
    let args = c.args.clone().unwrap();
    let arg = |flag: &str| {
        let at = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("{flag}"));
        args[at + 1].clone()
    };
    let lease = arg("--lease-name");
    let port: i32 = arg("--admin-addr")
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    for (probe, path) in [
        (&c.liveness_probe, "/healthz"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let (p, pport) = probe_path(probe, path);
        assert_eq!((p.as_str(), resolve_port(c, &pport)), (path, port));
    }
    let ns = d.metadata.namespace.clone().unwrap();
    let sa = pod.service_account_name.clone().unwrap();
    assert_eq!(i.role_bindings.len(), 1);
    let b = &i.role_bindings[0];
    let subjects = b.subjects.clone().unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (subjects[0].name.as_str(), subjects[0].namespace.as_deref()),
        (sa.as_str(), Some(ns.as_str()))
    );
    let rules = i.roles[0].rules.clone().unwrap();
    let allows = |verb: &str, name: Option<&str>| {
        rules.iter().any(|r| {
            r.api_groups.as_deref() == Some(&["coordination.k8s.io".to_string()][..])
                && r.resources.as_deref() == Some(&["leases".to_string()][..])
                && r.verbs.iter().any(|v| v == verb)
                && r.resource_names
                    .as_deref()
                    .is_none_or(|n| name.is_some_and(|x| n.iter().any(|y| y == x)))
        })
    };
    assert!(allows("create", None));
    for verb in ["get", "list", "watch", "update"] {
        assert!(allows(verb, Some(&lease)), "{verb} {lease}");
        assert!(!allows(verb, Some("other")), "{verb} other");
    }
    assert!(!allows("delete", Some(&lease)));
    assert_eq!(rules.len(), 2, "nothing but the Lease: {rules:?}");
}

// ------------------------------------------------ apply to the test server

/// The kinds the test API server does not serve; applying the rest must work.
const KNOWN_SERVER_GAPS: [&str; 6] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "PodDisruptionBudget",
];

/// Whether the server serves `apiVersion`/`kind`, and the resource's plural
/// and scope.
async fn served(client: &kube::Client, api_version: &str, kind: &str) -> Option<(String, bool)> {
    let list = if api_version.contains('/') {
        client.list_api_group_resources(api_version).await
    } else {
        client.list_core_api_resources(api_version).await
    };
    let list = list.ok()?;
    list.resources
        .into_iter()
        .find(|r| r.kind == kind && !r.name.contains('/'))
        .map(|r| (r.name, r.namespaced))
}

async fn kubectl_apply(kubectl: &Path, kubeconfig: &Path, objects: &[Value]) -> String {
    use tokio::io::AsyncWriteExt;
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let mut child = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(kubeconfig.with_file_name("cache"))
        .args(["apply", "-f", "-"])
        .env_remove("KUBECONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run kubectl apply");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(list.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("kubectl apply finished in time")
        .unwrap();
    assert!(
        out.status.success(),
        "{} apply failed: {}{}",
        kubectl.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Applies what the server serves; returns the kinds it skipped.
async fn apply_supported(kubectl: &Path, objects: &[Value], label: &str) -> BTreeSet<String> {
    let server = wasmwatch_apiserver::Server::start(wasmwatch_apiserver::Config::default())
        .await
        .expect("start the test API server");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let client = server.client().unwrap();

    let mut supported = Vec::new();
    let mut resources = Vec::new();
    let mut skipped = BTreeSet::new();
    for o in objects {
        let (api_version, kind) = (
            o["apiVersion"].as_str().unwrap(),
            o["kind"].as_str().unwrap(),
        );
        match served(&client, api_version, kind).await {
            Some(r) => {
                supported.push(o.clone());
                resources.push(r);
            }
            None => {
                skipped.insert(kind.to_string());
            }
        }
    }
    assert!(!supported.is_empty());
    let first = kubectl_apply(kubectl, &kubeconfig, &supported).await;
    // Applying again (an upgrade with nothing changed) works too.
    let second = kubectl_apply(kubectl, &kubeconfig, &supported).await;
    eprintln!("{label}: applied:\n{first}again:\n{second}skipped (server gaps): {skipped:?}");

    // Every applied object is on the server as rendered.
    for (o, (plural, namespaced)) in supported.iter().zip(&resources) {
        let (group, version) = match o["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), o["apiVersion"].as_str().unwrap().to_string()),
        };
        let ar = kube::discovery::ApiResource {
            group,
            version,
            api_version: o["apiVersion"].as_str().unwrap().into(),
            kind: o["kind"].as_str().unwrap().into(),
            plural: plural.clone(),
        };
        let name = o["metadata"]["name"].as_str().unwrap();
        let api: kube::Api<kube::api::DynamicObject> = if *namespaced {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or("default");
            kube::Api::namespaced_with(client.clone(), ns, &ar)
        } else {
            kube::Api::all_with(client.clone(), &ar)
        };
        let stored = serde_json::to_value(api.get(name).await.unwrap_or_else(|e| {
            panic!(
                "{label}: {} {name} not on the server after apply: {e}",
                o["kind"]
            )
        }))
        .unwrap();
        for field in ["data", "spec"] {
            if let (Some(want), Some(got)) = (o.get(field), stored.get(field)) {
                assert_subset(want, got, &format!("{label}: {} {name}.{field}", o["kind"]));
            }
        }
    }
    server.shutdown().await;
    skipped
}

/// Every field of `want` is in `got` with the same value (the server may add
/// defaults).
fn assert_subset(want: &Value, got: &Value, at: &str) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                let g = g
                    .get(k)
                    .unwrap_or_else(|| panic!("{at}.{k} missing on the server"));
                assert_subset(v, g, &format!("{at}.{k}"));
            }
        }
        (Value::Array(w), Value::Array(g)) => {
            assert_eq!(w.len(), g.len(), "{at}");
            for (n, (w, g)) in w.iter().zip(g).enumerate() {
                assert_subset(w, g, &format!("{at}[{n}]"));
            }
        }
        _ => assert_eq!(want, got, "{at}"),
    }
}

#[tokio::test]
async fn every_overlay_applies_to_the_test_api_server() {
    for kubectl in kubectls() {
        for overlay in overlays() {
            let objects = render(&kubectl, &overlay_dir(&overlay));
            let label = format!("{overlay} ({})", kubectl.display());
            let skipped = apply_supported(&kubectl, &objects, &label).await;
            for kind in &skipped {
                assert!(
                    KNOWN_SERVER_GAPS.contains(&kind.as_str()),
                    "{label}: the test server does not serve {kind}, which is not a known gap"
                );
            }
            let kinds: BTreeSet<&str> = objects
                .iter()
                .map(|o| o["kind"].as_str().unwrap())
                .collect();
            for kind in ["Namespace", "ConfigMap", "Service", "Deployment"] {
                assert!(
                    kinds.contains(kind) && !skipped.contains(kind),
                    "{label}: {kind} applied"
                );
            }
        }
        let sidecar =
            std::fs::read_to_string(deploy_dir().join("examples/leader-sidecar.yaml")).unwrap();
        let label = format!("examples/leader-sidecar.yaml ({})", kubectl.display());
        let skipped = apply_supported(&kubectl, &yaml_documents(&sidecar), &label).await;
        assert!(!skipped.contains("Deployment"));
        assert!(
            skipped
                .iter()
                .all(|k| KNOWN_SERVER_GAPS.contains(&k.as_str())),
            "{skipped:?}"
        );
    }
}

// ------------------------------------- the RBAC against what the host does

/// The test's own requests carry this User-Agent; the host's carry none.
const TEST_AGENT: &str = "wasmwatch-deploy-test";

/// Write grants the host does not use but that are kept, with the reason.
/// (group, resource, verb, reason). Empty: every write granted is used.
const UNUSED_WRITES_KEPT: &[(&str, &str, &str, &str)] = &[];

/// Non-resource paths every authenticated user may GET (the default
/// `system:discovery` and `system:public-info-viewer` ClusterRoles), so the
/// deploy RBAC needs no nonResourceURLs rule for them.
fn default_non_resource(path: &str) -> bool {
    [
        "/api", "/apis", "/version", "/openapi", "/healthz", "/livez", "/readyz",
    ]
    .iter()
    .any(|p| path == *p || path.starts_with(&format!("{p}/")))
}

impl Grants {
    /// Every (group, resource, verb) the rules grant, wherever and on
    /// whichever names.
    fn granted(&self) -> BTreeSet<(String, String, String)> {
        let mut out = BTreeSet::new();
        for (_, r) in &self.rules {
            for g in r.api_groups.as_deref().unwrap_or_default() {
                for res in r.resources.as_deref().unwrap_or_default() {
                    for v in &r.verbs {
                        out.insert((g.clone(), res.clone(), v.clone()));
                    }
                }
            }
        }
        out
    }
}

/// The overlay's plugin manifest, made runnable here: the bundled plugins
/// built from plugins/ and pinned, no debounce, short retries and HA
/// timings. Everything the RBAC depends on is kept as shipped: watched kinds
/// and namespaces, Lease names (and `ha.namespace`), capabilities.
fn runnable_manifest(shipped: &str) -> String {
    let mut m: Value = serde_yaml::from_str(shipped).expect("the manifest is YAML");
    for p in m["plugins"].as_array_mut().expect("plugins") {
        let file = Path::new(p["module"].as_str().expect("module"))
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .replace('_', "-");
        p["module"] = json!(format!("{{module:{file}}}"));
        p["sha256"] = json!(format!("{{sha256:{file}}}"));
        p["delivery"] = json!({"debounce": "0s", "retries": 3, "backoffInitial": "100ms", "backoffMax": "500ms"});
    }
    let ha = m["ha"].as_object_mut().expect("ha");
    ha.insert("leaseDuration".into(), json!("3s"));
    ha.insert("renewDeadline".into(), json!("2s"));
    ha.insert("retryPeriod".into(), json!("500ms"));
    wasmwatch_testkit::pin(&serde_yaml::to_string(&m).unwrap())
}

/// The Deployment's `--webhook-*` args (overlays/webhook), for the test's
/// replicas: the calls the webhook's certificate makes are the overlay's
/// too. The address becomes 127.0.0.1:0, as the admin port's: the two
/// replicas here (and the tests running at the same time) cannot all bind
/// 0.0.0.0:8443.
fn host_webhook_args(i: &Install) -> Vec<String> {
    let args = i.container().args.clone().unwrap_or_default();
    let mut out = Vec::new();
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        if a == "--webhook-addr" || a.starts_with("--webhook-addr=") {
            if !a.contains('=') {
                args.next();
            }
            out.push("--webhook-addr=127.0.0.1:0".to_string());
        } else if a.starts_with("--webhook") {
            let value = !a.contains('=') && a != "--webhook-generate-cert";
            out.push(a);
            if value {
                out.extend(args.next());
            }
        }
    }
    out
}

/// One `wasmwatch run` in the Deployment's namespace (POD_NAMESPACE, where
/// the Leases go when `ha.namespace` is unset), with `extra` args.
fn start_replica(
    kubeconfig: &Path,
    manifest: &Path,
    identity: &str,
    extra: &[String],
) -> common::Replica {
    let mut cmd = common::run_command(kubeconfig, manifest, identity, "200ms", NAMESPACE);
    cmd.args(extra);
    common::Replica::spawn(&mut cmd, identity, Duration::from_secs(120))
}

async fn replica(
    kubeconfig: &Path,
    manifest: &Path,
    identity: &str,
    extra: &[String],
) -> common::Replica {
    let (k, m, id, extra) = (
        kubeconfig.to_path_buf(),
        manifest.to_path_buf(),
        identity.to_string(),
        extra.to_vec(),
    );
    tokio::task::spawn_blocking(move || start_replica(&k, &m, &id, &extra))
        .await
        .unwrap()
}

fn generation(
    server: &wasmwatch_apiserver::ServerHandle,
    resource: &str,
    ns: &str,
    name: &str,
) -> i64 {
    server
        .get(resource, ns, name)
        .and_then(|o| o["metadata"]["generation"].as_i64())
        .unwrap_or(0)
}

fn events_with_reason(server: &wasmwatch_apiserver::ServerHandle, reason: &str) -> usize {
    server
        .snapshot("events")
        .map(|(items, _)| items.iter().filter(|e| e["reason"] == reason).count())
        .unwrap_or(0)
}

/// Runs two `wasmwatch run` replicas under the overlay's manifest through
/// every kind of call the host makes, and returns the host's requests (the
/// test's own, made with [`TEST_AGENT`], left out) and its non-resource
/// requests. The test itself only writes ConfigMaps and Secrets meanwhile,
/// and reads the server in-process. The replicas run with the Deployment's
/// webhook args, if any (see [`host_webhook_args`]), and the overlay's
/// MutatingWebhookConfiguration is on the server for them to find.
async fn host_requests(
    overlay: &str,
    manifest: &Manifest,
    shipped: &str,
    i: &Install,
) -> (
    Vec<wasmwatch_apiserver::Request>,
    Vec<wasmwatch_apiserver::NonResourceRequest>,
) {
    use common::{Pod, REFRESH, eventually};
    use wasmwatch_apiserver::{Config, Server};

    let server = Server::start(Config::default().bookmark_interval(Duration::from_secs(1)))
        .await
        .unwrap();
    let setup = server.client().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let manifest_path = dir.path().join("manifest.yaml");
    std::fs::write(&manifest_path, runnable_manifest(shipped)).unwrap();
    let lease_ns = manifest.ha.namespace.as_deref().unwrap_or(NAMESPACE);
    let leases = "leases.coordination.k8s.io";
    let (leader_lease, state_lease) = (&manifest.ha.lease_name, &manifest.ha.state_lease_name);
    // The apps live in the first watched namespace (`default` for "*").
    let ns = manifest
        .watch
        .namespaces
        .iter()
        .find(|n| *n != "*")
        .map(String::as_str)
        .unwrap_or("default");
    assert!(
        manifest.watch.watches(ObjectKind::ConfigMap) && manifest.watch.watches(ObjectKind::Secret),
        "{overlay}: the scenario changes ConfigMaps and Secrets"
    );

    // ---- setup, by the test: namespaces, an app behind a Service with two
    // pods, six workloads asking for restarts (one of each kind the shipped
    // rollout-restart may restart), their ConfigMaps and Secret.
    for n in [lease_ns, ns] {
        if server.get("namespaces", "", n).is_none() {
            common::namespace(&setup, n).await;
        }
    }
    // A segment of the stored index that a save created and never
    // committed (its replica died before the state write): the first claim
    // deletes it, by the Role's `delete` of unnamed Leases.
    let orphan = format!("{state_lease}-segment-0");
    let leases_api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(setup.clone(), lease_ns);
    leases_api
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": orphan,
                "annotations": {"wasmwatch.io/index": "default/x - \n"}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    // overlays/webhook: its MutatingWebhookConfiguration, applied with the
    // install, whose caBundle the replicas keep. (No workload here carries
    // its opt-in label: the webhook is not called.)
    for config in &i.webhooks {
        common::apply(&setup, serde_json::to_value(config).unwrap()).await;
    }
    let webhook_args = host_webhook_args(i);
    let pods = [Pod::start().await, Pod::start().await];
    common::service(&setup, ns, "orders", &[&pods[0], &pods[1]], &[]).await;
    let auto = json!({"reloader.stakater.com/auto": "true"});
    let container = json!({"name": "app", "image": "example/app:1",
        "envFrom": [{"configMapRef": {"name": "app-config"}}]});
    common::workload(
        &setup,
        ns,
        "Deployment",
        "web",
        auto.clone(),
        json!({}),
        json!({"containers": [container.clone()]}),
    )
    .await;
    common::workload(
        &setup,
        ns,
        "StatefulSet",
        "ledger",
        json!({}),
        auto.clone(),
        json!({"containers": [container.clone()]}),
    )
    .await;
    common::workload(
        &setup,
        ns,
        "DaemonSet",
        "agent",
        json!({"secret.reloader.stakater.com/auto": "true"}),
        json!({}),
        json!({"containers": [{"name": "app", "image": "example/app:1"}],
            "volumes": [{"name": "token", "secret": {"secretName": "app-secret"}}]}),
    )
    .await;
    // A CronJob (restarted through its job template), a Job that opts in to
    // being re-created, and an Argo Rollout, each using app-config.
    let run_once = json!({"metadata": {"labels": {"app": "batch"}},
        "spec": {"containers": [container.clone()], "restartPolicy": "Never"}});
    for o in [
        json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": ns, "annotations": auto.clone()},
            "spec": {"schedule": "0 3 * * *",
                "jobTemplate": {"spec": {"template": run_once.clone()}}}}),
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "migrate", "namespace": ns, "annotations": {
                "reloader.stakater.com/auto": "true", "wasmwatch.io/recreate-job": "true"}},
            "spec": {"template": run_once}}),
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "storefront", "namespace": ns, "annotations": auto.clone()},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "storefront"}},
                "template": {"metadata": {"labels": {"app": "storefront"}},
                    "spec": {"containers": [container.clone()]}}}}),
    ] {
        common::apply(&setup, o).await;
    }
    let job_uid = |server: &wasmwatch_apiserver::ServerHandle| {
        server
            .get("jobs.batch", ns, "migrate")
            .and_then(|j| j["metadata"]["uid"].as_str().map(str::to_string))
    };
    let first_job = job_uid(&server).expect("Job migrate");
    for o in [
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "orders", "namespace": ns,
                "labels": {"spring.cloud.kubernetes.config": "true"}},
            "data": {"application.yaml": "value: 1"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app-config", "namespace": ns},
            "data": {"value": "1"}}),
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "app-secret", "namespace": ns},
            "stringData": {"token": "1"}}),
    ] {
        common::apply(&setup, o).await;
    }

    // ---- from here on, every request without the test's User-Agent is the host's.
    server.clear_requests();
    let mut config = server.kube_config();
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static(TEST_AGENT),
    ));
    let client = kube::Client::try_from(config).unwrap();
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), ns);
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), ns);
    let set_cm = |name: &'static str, value: &'static str| {
        let cms = cms.clone();
        async move {
            let key = if name == "orders" {
                "application.yaml"
            } else {
                "value"
            };
            cms.patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"data": {key: format!("value: {value}")}})),
            )
            .await
            .unwrap();
        }
    };
    let refreshed = |n: usize| {
        let hits: Vec<usize> = pods.iter().map(|p| p.hits(REFRESH)).collect();
        async move { hits.iter().all(|&h| h >= n) }
    };
    let long = Duration::from_secs(30);

    // 1. HA with two replicas: the first leads (elector Lease get, create,
    //    watch, update), claims the state Lease, lists and watches; both
    //    fill their lookups' caches.
    let a = replica(&kubeconfig, &manifest_path, "replica-a", &webhook_args).await;
    eventually(long, "replica-a leads", || a.leading()).await;
    let b = replica(&kubeconfig, &manifest_path, "replica-b", &webhook_args).await;
    // Each replica's lookups (8 kinds) and the leader's ConfigMap and Secret
    // watches at least.
    let watches = 2 * 8 + 2;
    tokio::time::timeout(long, server.wait_for_watches(watches))
        .await
        .unwrap_or_else(|_| panic!("{overlay}: {watches} watches open"));
    assert!(!b.leading().await, "{overlay}: one leader");

    // 2. http-refresh: a refresh of both pods, and a Refreshed Event.
    set_cm("orders", "2").await;
    eventually(long, "both pods refreshed", || refreshed(1)).await;
    eventually(long, "a Refreshed Event", || async {
        events_with_reason(&server, "Refreshed") >= 1
    })
    .await;

    // 3. rollout-restart: get + patch of a Deployment, a StatefulSet, (for
    //    a Secret) a DaemonSet, a CronJob's job template and an Argo
    //    Rollout; a Job deleted and created again; Reloaded Events.
    set_cm("app-config", "2").await;
    secrets
        .patch(
            "app-secret",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"stringData": {"token": "2"}})),
        )
        .await
        .unwrap();
    for (resource, name) in [
        ("deployments.apps", "web"),
        ("statefulsets.apps", "ledger"),
        ("daemonsets.apps", "agent"),
        ("cronjobs.batch", "nightly"),
        ("rollouts.argoproj.io", "storefront"),
    ] {
        eventually(long, &format!("{resource} {name} restarted"), || {
            let g = generation(&server, resource, ns, name);
            async move { g == 2 }
        })
        .await;
    }
    eventually(long, "Job migrate re-created", || {
        let uid = job_uid(&server);
        let first_job = first_job.clone();
        async move { uid.is_some_and(|u| u != first_job) }
    })
    .await;
    eventually(long, "six Reloaded Events", || async {
        events_with_reason(&server, "Reloaded") >= 6
    })
    .await;

    // 4. The checkpoints and the index are stored.
    let state_annotation = |key: String| {
        server.get(leases, lease_ns, state_lease).and_then(|l| {
            l["metadata"]["annotations"][key.as_str()]
                .as_str()
                .map(str::to_string)
        })
    };
    assert!(
        server.get(leases, lease_ns, &orphan).is_none(),
        "{overlay}: the uncommitted segment is gone"
    );
    eventually(long, "the index is named in the state Lease", || {
        let both = state_annotation("wasmwatch.io/index-log".into())
            .is_some_and(|l| l.contains("kinds=ConfigMap,Secret"));
        async move { both }
    })
    .await;

    // 5. A forced 410: the history expires and every watch ends; the watch
    //    loops and the lookups relist.
    let before = server.requests().len();
    server.faults().compact_history();
    server.faults().close_watches();
    // Until the next write, the version each relist returns was handed
    // out before the compaction too (the fault expires it), so the loops
    // relist again and again: write as soon as both kinds have relisted.
    eventually(long, "ConfigMaps and Secrets listed again", || {
        let relisted = server.requests()[before..]
            .iter()
            .filter(|r| r.verb == "list" && r.user_agent.as_deref() != Some(TEST_AGENT))
            .filter(|r| ["configmaps", "secrets"].contains(&r.resource.as_str()))
            .map(|r| r.resource.clone())
            .collect::<BTreeSet<_>>()
            .len();
        async move { relisted == 2 }
    })
    .await;
    set_cm("orders", "3").await;
    for kind in ["ConfigMap", "Secret"] {
        eventually(long, &format!("a {kind} resync"), || async {
            a.metric(&format!("wasmwatch_resyncs_total{{kind=\"{kind}\"}}"))
                .await
                >= 1.0
        })
        .await;
    }
    eventually(long, "refreshed after the resync", || refreshed(2)).await;

    // 6. SIGTERM: the leader releases the Lease; the other takes over,
    //    claims the state and reads the index segments, resumes the watches.
    a.signal("TERM");
    eventually(long, "replica-b leads", || b.leading()).await;
    let mut a = a;
    assert!(
        a.child.wait().unwrap().success(),
        "{overlay}: replica-a exits cleanly"
    );
    assert_eq!(
        server.get(leases, lease_ns, leader_lease).unwrap()["spec"]["holderIdentity"],
        "replica-b"
    );
    set_cm("orders", "4").await;
    eventually(long, "refreshed by the new leader", || refreshed(3)).await;
    b.signal("TERM");
    let mut b = b;
    assert!(
        b.child.wait().unwrap().success(),
        "{overlay}: replica-b exits cleanly"
    );
    let released = server.get(leases, lease_ns, leader_lease).unwrap();
    assert!(
        released["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .is_empty(),
        "{overlay}: released: {released}"
    );
    // 7. The webhook's generated certificate: kept in its Secret, its CA
    //    written into the configuration's caBundle (both base64 here).
    if i.webhook_generates_cert() {
        let secret = i
            .arg("--webhook-secret")
            .unwrap_or("wasmwatch-webhook-tls".into());
        let ca = server
            .get("secrets", NAMESPACE, &secret)
            .unwrap_or_else(|| panic!("{overlay}: Secret {secret}"))["data"]["ca.crt"]
            .clone();
        assert!(ca.is_string(), "{overlay}: {secret} has ca.crt");
        let config = i.webhooks[0].metadata.name.clone().unwrap();
        let bundle = server
            .get(
                "mutatingwebhookconfigurations.admissionregistration.k8s.io",
                "",
                &config,
            )
            .unwrap_or_else(|| panic!("{overlay}: {config}"))["webhooks"][0]["clientConfig"]
            ["caBundle"]
            .clone();
        assert_eq!(bundle, ca, "{overlay}: the CA in {config}'s caBundle");
    }

    assert_eq!(server.requests_dropped(), 0);
    let (ours, host): (Vec<_>, Vec<_>) = server
        .requests()
        .into_iter()
        .partition(|r| r.user_agent.as_deref() == Some(TEST_AGENT));
    // The test wrote only ConfigMaps and Secrets, nothing else.
    for r in &ours {
        assert!(
            r.verb == "patch"
                && r.group.is_empty()
                && ["configmaps", "secrets"].contains(&r.resource.as_str()),
            "{overlay}: the test's own request {r:?}"
        );
    }
    let non_resource = server
        .non_resource_requests()
        .into_iter()
        .filter(|r| r.user_agent.as_deref() != Some(TEST_AGENT))
        .collect();
    (host, non_resource)
}

/// (verb, group/resource, where) → how many, for the test output.
fn observed_table(requests: &[wasmwatch_apiserver::Request]) -> String {
    let mut counts: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for r in requests {
        let resource = if r.group.is_empty() {
            r.rbac_resource()
        } else {
            format!("{}/{}", r.group, r.rbac_resource())
        };
        let at = match (&r.namespace, &r.name) {
            (None, None) => "(all namespaces)".to_string(),
            (None, Some(n)) => n.clone(),
            // Only the Leases are authorized by name.
            (Some(ns), Some(n)) if r.resource == "leases" => format!("{ns}/{n}"),
            (Some(ns), _) => format!("{ns}/*"),
        };
        *counts.entry((resource, r.verb.clone(), at)).or_default() += 1;
    }
    counts
        .iter()
        .map(|((res, verb, at), n)| format!("  {verb:<8} {res:<32} {at:<40} x{n}\n"))
        .collect()
}

fn check_host_against_rbac(
    overlay: &str,
    lease_ns: &str,
    i: &Install,
    host: &[wasmwatch_apiserver::Request],
    non_resource: &[wasmwatch_apiserver::NonResourceRequest],
) {
    let g = Grants::of(i);
    eprintln!(
        "{overlay}: the host made {} API requests:\n{}",
        host.len(),
        observed_table(host)
    );
    let verbs: BTreeSet<(String, String)> = host
        .iter()
        .map(|r| (r.verb.clone(), format!("{}/{}", r.group, r.rbac_resource())))
        .collect();
    eprintln!("{overlay}: observed (verb, group/resource): {verbs:?}");
    eprintln!("{overlay}: the host's non-resource requests: {non_resource:?}");

    // The host never writes ConfigMaps or Secrets, but for creating its
    // digest key's Secret once in its own namespace (and, with the
    // webhook's generated certificate, that Secret too, in the same one).
    let made = 1 + usize::from(i.webhook_generates_cert());
    let mut key_created = 0;
    for r in host {
        if r.is_write() && r.group.is_empty() && r.resource == "secrets" && r.verb == "create" {
            assert_eq!(r.namespace.as_deref(), Some(lease_ns), "{overlay}: {r:?}");
            key_created += 1;
            continue;
        }
        assert!(
            !(r.is_write()
                && r.group.is_empty()
                && ["configmaps", "secrets"].contains(&r.resource.as_str())),
            "{overlay}: the host wrote {r:?}"
        );
    }
    assert!(
        (made..=2 * made).contains(&key_created),
        "{overlay}: the digest key (and the webhook's Secret) is created once \
         (two replicas may race): {key_created}"
    );

    // 1. Every call the host made is allowed, in its namespace (or across
    //    all namespaces) and on its name.
    let denied: BTreeSet<String> = host
        .iter()
        .filter(|r| {
            !g.allows(
                r.namespace.as_deref(),
                &r.group,
                &r.rbac_resource(),
                &r.verb,
                r.name.as_deref(),
            )
        })
        .map(|r| {
            format!(
                "{} {}/{} in {} named {}",
                r.verb,
                r.group,
                r.rbac_resource(),
                r.namespace.as_deref().unwrap_or("(all namespaces)"),
                r.name.as_deref().unwrap_or("-")
            )
        })
        .collect();
    assert!(
        denied.is_empty(),
        "{overlay}: the RBAC does not allow what the host does:\n{}",
        denied.into_iter().collect::<Vec<_>>().join("\n")
    );
    for r in non_resource {
        assert!(
            r.verb == "get" && default_non_resource(&r.path),
            "{overlay}: the host requested {} {}, which no default role allows",
            r.verb,
            r.path
        );
    }

    // 2. Every permission granted is used: writes (verb by verb) and reads
    //    (resource by resource; a `get` next to a used `list` reveals
    //    nothing more, so it may stay unused).
    let used: BTreeSet<(String, String, String)> = host
        .iter()
        .map(|r| (r.group.clone(), r.rbac_resource(), r.verb.clone()))
        .collect();
    let mut unused = Vec::new();
    for (group, resource, verb) in g.granted() {
        if used.contains(&(group.clone(), resource.clone(), verb.clone())) {
            continue;
        }
        let kept = UNUSED_WRITES_KEPT.iter().find(|(g, r, v, _)| {
            (*g, *r, *v) == (group.as_str(), resource.as_str(), verb.as_str())
        });
        let listed = used.contains(&(group.clone(), resource.clone(), "list".to_string()));
        match (verb.as_str(), kept) {
            (_, Some((_, _, _, why))) => {
                eprintln!("{overlay}: granted, unused, kept: {verb} {group}/{resource}: {why}")
            }
            ("get", None) if listed => {}
            _ => unused.push(format!("{verb} {group}/{resource}")),
        }
    }
    assert!(
        unused.is_empty(),
        "{overlay}: the RBAC grants what the host never does (remove it, or list it in \
         UNUSED_WRITES_KEPT with the reason): {unused:?}"
    );
    for (group, resource, verb, _) in UNUSED_WRITES_KEPT {
        assert!(
            !used.contains(&(group.to_string(), resource.to_string(), verb.to_string())),
            "{overlay}: {verb} {group}/{resource} is used after all: take it off UNUSED_WRITES_KEPT"
        );
    }
}

/// The deploy RBAC against the calls the host really makes: for each
/// overlay, two `wasmwatch run` replicas under that overlay's manifest
/// (HA, its watched kinds and namespaces, its Lease names in the
/// Deployment's namespace) go through every kind of call the host makes
/// (election, checkpoints and index segments, watches, the lookups' caches,
/// an http-refresh, rollout restarts of the six workload kinds the shipped
/// rollout-restart may restart (a Job re-created), Events, a
/// 410 relist, a SIGTERM handover and release); every request they made
/// must be allowed by the overlay's rules, and every permission granted
/// must have been used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rbac_allows_exactly_the_calls_the_host_makes() {
    let Some(kubectl) = kubectls().into_iter().next() else {
        return;
    };
    for overlay in overlays() {
        let objects = render(&kubectl, &overlay_dir(&overlay));
        let i = Install::parse(&objects);
        let (text, _) = i.manifest_text();
        let manifest = check_manifest(&overlay, &text);
        let (host, non_resource) = host_requests(&overlay, &manifest, &text, &i).await;
        let lease_ns = manifest.ha.namespace.as_deref().unwrap_or(NAMESPACE);
        check_host_against_rbac(&overlay, lease_ns, &i, &host, &non_resource);
    }
}
