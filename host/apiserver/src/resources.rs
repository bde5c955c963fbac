//! The registry of resource types this server knows, with everything the
//! generic storage, routing and discovery code needs to know about each.
//!
//! Built-in types are always served. Custom types (`custom: true`) are
//! served, as kube-apiserver serves them, only while their
//! CustomResourceDefinition (`customresourcedefinitions.apiextensions.k8s.io`,
//! itself a built-in type here) named `<plural>.<group>` exists in the store;
//! a CRD can only be created for a custom type listed here (this server has
//! no generic custom resource storage). See [`Served`].

/// Index of a resource type in [`RESOURCES`].
pub type ResourceId = usize;

/// Which DNS rule object names of a resource must follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain: at most 253 characters, dots allowed.
    Subdomain,
    /// RFC 1123 label: at most 63 characters, no dots.
    Label,
}

/// Static description of one served resource type.
#[derive(Debug)]
pub struct ResourceType {
    /// API group; empty for the core (legacy) group.
    pub group: &'static str,
    pub version: &'static str,
    /// Plural resource name as used in paths, e.g. `configmaps`.
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// The server maintains `metadata.generation`, bumped on spec changes.
    pub generation: bool,
    /// The resource has a `/status` subresource: the main resource ignores
    /// status changes and `/status` ignores everything else.
    pub status_subresource: bool,
    /// The resource has a `/scale` subresource (autoscaling/v1 Scale).
    pub scale_subresource: bool,
    /// A custom resource: served only while its CustomResourceDefinition
    /// (named [`ResourceType::qualified`]) exists; PATCH refuses strategic
    /// merge patches with 415, as kube-apiserver does.
    pub custom: bool,
    pub name_rule: NameRule,
}

impl ResourceType {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The name kube-apiserver uses in messages: `configmaps`, `deployments.apps`.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn is_secret(&self) -> bool {
        self.group.is_empty() && self.plural == "secrets"
    }

    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.plural == "namespaces"
    }

    /// `customresourcedefinitions.apiextensions.k8s.io`.
    pub fn is_crd(&self) -> bool {
        self.group == CRD_GROUP && self.plural == "customresourcedefinitions"
    }

    /// `mutatingwebhookconfigurations.admissionregistration.k8s.io`.
    pub fn is_mutating_webhook_configuration(&self) -> bool {
        self.group == ADMISSION_GROUP && self.plural == "mutatingwebhookconfigurations"
    }

    /// `Namespaced` or `Cluster`, as a CRD's `spec.scope` spells it.
    pub fn scope(&self) -> &'static str {
        if self.namespaced {
            "Namespaced"
        } else {
            "Cluster"
        }
    }

    /// A PUT of a missing name creates it (the kind's strategy's
    /// AllowCreateOnUpdate): Leases, Services and Events.
    pub fn allows_create_on_update(&self) -> bool {
        matches!(
            (self.group, self.plural),
            ("coordination.k8s.io", "leases")
                | ("", "services")
                | ("", "events")
                | ("events.k8s.io", "events")
        )
    }

    /// A PUT without a resourceVersion replaces whatever is stored
    /// (AllowUnconditionalUpdate); a Lease must name the version it read.
    pub fn allows_unconditional_update(&self) -> bool {
        !(self.group == "coordination.k8s.io" && self.plural == "leases")
    }

    /// ConfigMaps and Secrets carry a size-limited `data` map.
    pub fn has_data_limit(&self) -> bool {
        self.group.is_empty() && (self.plural == "configmaps" || self.plural == "secrets")
    }
}

const fn rt(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> ResourceType {
    ResourceType {
        group,
        version,
        plural,
        singular,
        kind,
        namespaced,
        short_names: &[],
        categories: &[],
        generation: false,
        status_subresource: false,
        scale_subresource: false,
        custom: false,
        name_rule: NameRule::Subdomain,
    }
}

/// Every resource type served. Order matters only for discovery output.
pub static RESOURCES: &[ResourceType] = &[
    ResourceType {
        short_names: &["ns"],
        status_subresource: true,
        name_rule: NameRule::Label,
        ..rt("", "v1", "namespaces", "namespace", "Namespace", false)
    },
    ResourceType {
        short_names: &["cm"],
        ..rt("", "v1", "configmaps", "configmap", "ConfigMap", true)
    },
    rt("", "v1", "secrets", "secret", "Secret", true),
    ResourceType {
        short_names: &["svc"],
        categories: &["all"],
        status_subresource: true,
        name_rule: NameRule::Label,
        ..rt("", "v1", "services", "service", "Service", true)
    },
    ResourceType {
        short_names: &["po"],
        categories: &["all"],
        status_subresource: true,
        ..rt("", "v1", "pods", "pod", "Pod", true)
    },
    ResourceType {
        short_names: &["ev"],
        ..rt("", "v1", "events", "event", "Event", true)
    },
    rt(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "endpointslice",
        "EndpointSlice",
        true,
    ),
    ResourceType {
        short_names: &["deploy"],
        categories: &["all"],
        generation: true,
        status_subresource: true,
        scale_subresource: true,
        ..rt(
            "apps",
            "v1",
            "deployments",
            "deployment",
            "Deployment",
            true,
        )
    },
    ResourceType {
        short_names: &["sts"],
        categories: &["all"],
        generation: true,
        status_subresource: true,
        scale_subresource: true,
        ..rt(
            "apps",
            "v1",
            "statefulsets",
            "statefulset",
            "StatefulSet",
            true,
        )
    },
    ResourceType {
        short_names: &["ds"],
        categories: &["all"],
        generation: true,
        status_subresource: true,
        ..rt("apps", "v1", "daemonsets", "daemonset", "DaemonSet", true)
    },
    ResourceType {
        short_names: &["cj"],
        categories: &["all"],
        generation: true,
        status_subresource: true,
        ..rt("batch", "v1", "cronjobs", "cronjob", "CronJob", true)
    },
    ResourceType {
        categories: &["all"],
        generation: true,
        status_subresource: true,
        ..rt("batch", "v1", "jobs", "job", "Job", true)
    },
    // The custom resources below are served only while their CRD exists
    // (`Config::preinstalled_crds`, on by default, creates them at start).
    //
    // Argo Rollouts' Rollout (argoproj.io/v1alpha1), so restarts of custom
    // resources can be tested: no strategic merge patch (kube-apiserver
    // answers 415 for custom resources).
    ResourceType {
        short_names: &["ro"],
        categories: &["all"],
        generation: true,
        status_subresource: true,
        custom: true,
        ..rt(
            "argoproj.io",
            "v1alpha1",
            "rollouts",
            "rollout",
            "Rollout",
            true,
        )
    },
    // OpenKruise's CloneSet: a custom resource with a pod template at
    // spec.template that wasmwatch knows nothing about (restarted through
    // discovery).
    ResourceType {
        categories: &["all"],
        generation: true,
        status_subresource: true,
        custom: true,
        ..rt(
            "apps.kruise.io",
            "v1alpha1",
            "clonesets",
            "cloneset",
            "CloneSet",
            true,
        )
    },
    // The Secrets Store CSI driver's SecretProviderClass (which provider
    // mounts what) and SecretProviderClassPodStatus (what the driver mounted
    // for one pod; `status` is a plain field the driver writes, no
    // subresource and no spec).
    ResourceType {
        generation: true,
        custom: true,
        ..rt(
            SECRETS_STORE_GROUP,
            "v1",
            "secretproviderclasses",
            "secretproviderclass",
            "SecretProviderClass",
            true,
        )
    },
    ResourceType {
        custom: true,
        ..rt(
            SECRETS_STORE_GROUP,
            "v1",
            "secretproviderclasspodstatuses",
            "secretproviderclasspodstatus",
            "SecretProviderClassPodStatus",
            true,
        )
    },
    rt(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
    ),
    ResourceType {
        short_names: &["ev"],
        ..rt("events.k8s.io", "v1", "events", "event", "Event", true)
    },
    // The definitions that make the custom resources above served.
    ResourceType {
        short_names: &["crd", "crds"],
        categories: &["api-extensions"],
        generation: true,
        status_subresource: true,
        ..rt(
            CRD_GROUP,
            "v1",
            "customresourcedefinitions",
            "customresourcedefinition",
            "CustomResourceDefinition",
            false,
        )
    },
    // Mutating admission webhooks: every create and update of another kind
    // calls the matching webhooks of these ([`crate::admission`]).
    ResourceType {
        categories: &["api-extensions"],
        generation: true,
        ..rt(
            ADMISSION_GROUP,
            "v1",
            "mutatingwebhookconfigurations",
            "mutatingwebhookconfiguration",
            "MutatingWebhookConfiguration",
            false,
        )
    },
];

/// The group of admission webhook configurations.
pub const ADMISSION_GROUP: &str = "admissionregistration.k8s.io";

/// The group of CustomResourceDefinitions.
pub const CRD_GROUP: &str = "apiextensions.k8s.io";

const SECRETS_STORE_GROUP: &str = "secrets-store.csi.x-k8s.io";

/// Find a resource by group, version and plural name.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Find a resource by plural name in the core group (`/api/v1/...`).
pub fn lookup_core(plural: &str) -> Option<ResourceId> {
    lookup("", "v1", plural)
}

/// The index of the `namespaces` resource.
pub fn namespaces_id() -> ResourceId {
    lookup_core("namespaces").expect("namespaces is registered")
}

/// The index of the `customresourcedefinitions` resource.
pub fn crds_id() -> ResourceId {
    lookup(CRD_GROUP, "v1", "customresourcedefinitions").expect("CRDs are registered")
}

/// The index of the `mutatingwebhookconfigurations` resource.
pub fn mutating_webhooks_id() -> ResourceId {
    lookup(ADMISSION_GROUP, "v1", "mutatingwebhookconfigurations")
        .expect("mutating webhook configurations are registered")
}

/// The custom type a CRD named `name` (`<plural>.<group>`) makes served.
pub fn custom_for_crd(name: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.custom && r.qualified() == name)
}

/// The custom types, `plural.group/version`, for messages.
pub fn custom_list() -> String {
    RESOURCES
        .iter()
        .filter(|r| r.custom)
        .map(|r| format!("{}/{}", r.qualified(), r.version))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which resource types are served right now, indexed by [`ResourceId`]:
/// built-in types always, custom types while their CRD exists
/// ([`crate::store::Store::served`]).
pub type Served = [bool];

/// API groups served under `/apis`, in discovery order, with their versions.
pub fn groups(served: &Served) -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for (_, r) in RESOURCES
        .iter()
        .enumerate()
        .filter(|(i, r)| served[*i] && !r.group.is_empty())
    {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// Served resources of one group/version.
pub fn in_group_version<'a>(
    group: &'a str,
    version: &'a str,
    served: &'a Served,
) -> impl Iterator<Item = &'static ResourceType> + 'a {
    RESOURCES
        .iter()
        .enumerate()
        .filter(move |(i, r)| served[*i] && r.group == group && r.version == version)
        .map(|(_, r)| r)
}
