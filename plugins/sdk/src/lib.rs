//! wasmwatch-plugin-sdk: write a wasmwatch plugin in a few lines of Rust.
//!
//! The crate runs `wit-bindgen` on `wit/0.4.0/plugin.wit` (world
//! `wasmwatch:plugin/plugin@0.4.0`) and re-exports the generated types, the
//! [`Guest`] trait and the [`host`] imports, plus a few helpers:
//!
//! - [`EventExt`]: annotation/label lookup, data values as text, kind checks;
//! - [`WorkloadExt`]: a workload's kind by group/version/kind, and whether
//!   a change touched what it uses;
//! - [`action`]: builders for the actions a plugin returns;
//! - [`parse_config`]: the plugin's JSON config into your `Deserialize` type;
//! - [`spring`]: Spring Cloud Kubernetes target-app resolution.
//!
//! A plugin is a `cdylib` crate built with
//! `cargo build --release --target wasm32-wasip2`:
//!
//! ```ignore
//! use wasmwatch_plugin_sdk::{Action, ChangeEvent, EventExt, Guest, action};
//!
//! struct Hello;
//!
//! impl Guest for Hello {
//!     fn check_config(_config: String) -> Result<(), String> {
//!         Ok(())
//!     }
//!     fn handle(event: ChangeEvent) -> Result<Vec<Action>, String> {
//!         Ok(vec![action::event_normal("Seen", event.object_id())])
//!     }
//! }
//!
//! wasmwatch_plugin_sdk::export!(Hello with_types_in wasmwatch_plugin_sdk);
//! ```
//!
//! Since 0.3.0 a [`WorkloadRef`] names its kind by `group`, `version` and
//! `kind` (strings: `apps`/`v1`/`Deployment`, `batch`/`v1`/`CronJob`,
//! `argoproj.io`/`v1alpha1`/`Rollout`), and `workloads-referencing` tells
//! whether each workload's pod template references the object
//! (`referenced`) and how it uses it (`uses`). A plugin that must stay on
//! 0.2.0 runs `wit_bindgen::generate!` on `wit/plugin.wit` itself
//! (plugins/testing/inert does).
//!
//! Since 0.4.0 the changed object may be of a kind beyond ConfigMap and
//! Secret (`ObjectKind::Other`, a kind the manifest's `watch.kinds` names,
//! such as the CSI driver's SecretProviderClassPodStatus); its `data` holds
//! one entry per content field path (`status.objects`).

/// The `wit-bindgen` output; everything in it is re-exported at the crate root.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/0.4.0",
        world: "plugin",
        pub_export_macro: true,
        default_bindings_module: "wasmwatch_plugin_sdk",
        export_macro_name: "export",
    });
}

pub use bindings::wasmwatch::plugin::host;
pub use bindings::wasmwatch::plugin::types::*;
pub use bindings::*;
/// The world's `use`d types, named explicitly so they win over the glob below.
pub use bindings::{Action, ChangeEvent};

pub mod action;
pub mod spring;

/// Declares what the plugin needs granted, so that `wasmwatch validate`
/// warns when a manifest entry does not grant it (a plugin whose actions
/// would all be refused). The argument is JSON, written once per plugin
/// into the component's custom section `wasmwatch:needs`:
///
/// ```ignore
/// // Refreshes Services in the namespace of each event it gets.
/// wasmwatch_plugin_sdk::declare_needs!(r#"{"refresh": ["{namespace}"]}"#);
/// // Publishes where its config says, `springCloudBus` by default.
/// wasmwatch_plugin_sdk::declare_needs!(
///     r#"{"bus": ["{config.connection}/{config.destination|springCloudBus}"]}"#
/// );
/// ```
///
/// Keys: `refresh` and `restart` (namespaces; `{namespace}` is each one
/// the plugin's events come from), `bus` (`connection/destination`), `http`
/// (URLs), `events` and `secretValues` (booleans); not grants: `metadata`
/// (the object's labels and annotations it reads) and `only` (host-side
/// prefilters: `usedByWorkload`, `usedBySpringService`, `label:KEY[=V]`,
/// `annotation:KEY[=V]`; a change failing one costs no call). `{config.KEY}` and
/// `{config.KEY|DEFAULT}` read the plugin's config (`KEY` may be a dotted
/// path, `webhook.url`); a guard `{config.KEY=A,B}` keeps the need only
/// when the value is `A` or `B`. The format is in plugins/README.md
/// ("Declaring what a plugin needs").
#[macro_export]
macro_rules! declare_needs {
    ($json:literal) => {
        const _: () = {
            const JSON: &str = $json;
            #[used]
            #[unsafe(link_section = "wasmwatch:needs")]
            static NEEDS: [u8; JSON.len()] = {
                let bytes = JSON.as_bytes();
                let mut out = [0u8; JSON.len()];
                let mut i = 0;
                while i < out.len() {
                    out[i] = bytes[i];
                    i += 1;
                }
                out
            };
        };
    };
}

use serde::de::DeserializeOwned;

/// Reads the plugin's config (JSON text from the manifest's `config`, as
/// `check-config` and `host::config()` give it) into `T`.
///
/// Empty text and `null` read as `{}`, so a plugin whose fields all have
/// defaults needs no `config` in the manifest. Errors start with `plugin`,
/// e.g. `bus-refresh config: missing field `connection``, which the host shows
/// to the operator.
pub fn parse_config<T: DeserializeOwned>(plugin: &str, json: &str) -> Result<T, String> {
    let json = match json.trim() {
        "" | "null" => "{}",
        _ => json,
    };
    serde_json::from_str(json).map_err(|e| format!("{plugin} config: {e}"))
}

/// The value of `key` in a list of labels or annotations.
pub fn lookup<'a>(list: &'a [KeyValue], key: &str) -> Option<&'a str> {
    list.iter()
        .find(|kv| kv.key == key)
        .map(|kv| kv.value.as_str())
}

/// Writes a line to the host's log, tagged with the plugin's name.
pub fn log(level: LogLevel, message: &str) {
    host::log(level, message)
}

/// Convenient access to a [`WorkloadRef`] and a [`WorkloadInfo`].
pub trait WorkloadExt {
    /// The workload's reference.
    fn workload_ref(&self) -> &WorkloadRef;
    /// Whether the workload is of `group`/`version`/`kind`.
    fn is_kind(&self, group: &str, version: &str, kind: &str) -> bool {
        let w = self.workload_ref();
        w.group == group && w.version == version && w.kind == kind
    }
    /// `apiVersion` as Kubernetes writes it: `apps/v1`, or `v1` for the
    /// core group.
    fn api_version(&self) -> String {
        let w = self.workload_ref();
        if w.group.is_empty() {
            w.version.clone()
        } else {
            format!("{}/{}", w.group, w.version)
        }
    }
    /// `Kind namespace/name`, for logs and reasons.
    fn describe(&self) -> String {
        let w = self.workload_ref();
        format!("{} {}/{}", w.kind, w.namespace, w.name)
    }
}

impl WorkloadExt for WorkloadRef {
    fn workload_ref(&self) -> &WorkloadRef {
        self
    }
}

impl WorkloadExt for WorkloadInfo {
    fn workload_ref(&self) -> &WorkloadRef {
        &self.workload
    }
}

impl WorkloadInfo {
    /// Whether the pod template uses the object only through specific keys
    /// (env `configMapKeyRef`/`secretKeyRef`, volume `items`): then a change
    /// that touches none of them leaves the workload's pods as they are.
    /// False when a use takes the whole object (`envFrom`, a volume without
    /// `items`), when nothing is known of the uses, or when the workload is
    /// not referenced (selected by a named `reload` annotation).
    pub fn uses_only_keys(&self) -> bool {
        self.referenced && !self.uses.is_empty() && self.uses.iter().all(|u| u.key.is_some())
    }

    /// Whether the change touches what the workload uses: one of the keys
    /// it uses is in `changed_keys` (the event's `changed-keys`), or it uses
    /// the whole object (see [`WorkloadInfo::uses_only_keys`]).
    pub fn uses_any_of(&self, changed_keys: &[String]) -> bool {
        !self.uses_only_keys()
            || self
                .uses
                .iter()
                .filter_map(|u| u.key.as_deref())
                .any(|k| changed_keys.iter().any(|c| c == k))
    }
}

/// Convenient access to a [`ChangeEvent`].
pub trait EventExt {
    /// The value of annotation `key` on the changed object.
    fn annotation(&self, key: &str) -> Option<&str>;
    /// The value of label `key` on the changed object.
    fn label(&self, key: &str) -> Option<&str>;
    /// The value of data key `key` when it is text and not withheld.
    fn text(&self, key: &str) -> Option<&str>;
    fn is_config_map(&self) -> bool;
    fn is_secret(&self) -> bool;
    /// Whether the object is of kind `kind` in `group` (any version).
    fn is_kind(&self, group: &str, kind: &str) -> bool;
    /// `ConfigMap`, `Secret`, or another kind's `kind`.
    fn kind_name(&self) -> &str;
    /// `namespace/name`.
    fn object_id(&self) -> String;
}

impl EventExt for ChangeEvent {
    fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.annotations, key)
    }
    fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.labels, key)
    }
    fn text(&self, key: &str) -> Option<&str> {
        match self.data.iter().find(|d| d.key == key)?.value.as_ref()? {
            DataValue::Text(s) => Some(s),
            DataValue::Binary(_) => None,
        }
    }
    fn is_config_map(&self) -> bool {
        matches!(self.kind, ObjectKind::ConfigMap)
    }
    fn is_secret(&self) -> bool {
        matches!(self.kind, ObjectKind::Secret)
    }
    fn is_kind(&self, group: &str, kind: &str) -> bool {
        match &self.kind {
            ObjectKind::Other(t) => t.group == group && t.kind == kind,
            ObjectKind::ConfigMap => group.is_empty() && kind == "ConfigMap",
            ObjectKind::Secret => group.is_empty() && kind == "Secret",
        }
    }
    fn kind_name(&self) -> &str {
        match &self.kind {
            ObjectKind::ConfigMap => "ConfigMap",
            ObjectKind::Secret => "Secret",
            ObjectKind::Other(t) => &t.kind,
        }
    }
    fn object_id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}
