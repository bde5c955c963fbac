//! http-refresh: Spring Cloud Kubernetes-compatible actuator refresh.
//!
//! For a changed ConfigMap or Secret it finds the target apps the way the
//! Spring Cloud Kubernetes Configuration Watcher does and asks the host to POST
//! `<base>/refresh` (or `<base>/shutdown`) on every ready pod of each app's
//! Service:
//!
//! - apps named in `spring.cloud.kubernetes.configmap.apps` /
//!   `spring.cloud.kubernetes.secret.apps` (comma-separated Service names), or
//! - Services whose labels match `spring.cloud.kubernetes.configmap.labels` /
//!   `...secret.labels` (`k=v,k2=v2`), or else
//! - the Service named like the object.
//!
//! Apps without a Service are skipped. The Service annotation
//! `boot.spring.io/actuator` (`http://:9090/myactuator`) overrides the port and
//! base path; the default base path is `/actuator` and the default port the
//! endpoint's first port.
//!
//! Config (JSON from the manifest), all optional:
//! `{"strategy": "refresh" | "shutdown", "basePath": "/actuator"}`.

use wasmwatch_plugin_sdk::{
    Action, ChangeEvent, Guest, HttpMethod, LogLevel, action, host, log, lookup, parse_config,
    spring,
};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Config {
    #[serde(default)]
    strategy: Strategy,
    #[serde(default = "default_base_path")]
    base_path: String,
}

#[derive(serde::Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Strategy {
    #[default]
    Refresh,
    Shutdown,
}

fn default_base_path() -> String {
    "/actuator".to_string()
}

fn config(json: &str) -> Result<Config, String> {
    let config: Config = parse_config("http-refresh", json)?;
    if !config.base_path.starts_with('/') {
        return Err(format!(
            "http-refresh config: basePath must start with '/', got {:?}",
            config.base_path
        ));
    }
    Ok(config)
}

/// `http://:9090/myactuator` -> (Some(9090), "/myactuator").
fn parse_actuator(value: &str) -> (Option<u16>, Option<String>) {
    let rest = value
        .trim()
        .trim_start_matches("http://")
        .trim_start_matches("https://");
    let (authority, path) = match rest.find('/') {
        Some(i) => (
            &rest[..i],
            Some(rest[i..].trim_end_matches('/').to_string()),
        ),
        None => (rest, None),
    };
    let port = authority.rsplit_once(':').and_then(|(_, p)| p.parse().ok());
    (port, path.filter(|p| !p.is_empty()))
}

// It refreshes Services in the namespace of each event it gets.
// The object's annotations it reads (`spring::target_apps`): a stored
// index keeps only these of each object (and what label selectors name).
// It decides nothing for an object whose target apps have no Service: the
// host skips those calls (`usedBySpringService`, issue 35).
wasmwatch_plugin_sdk::declare_needs!(
    r#"{"refresh": ["{namespace}"], "metadata": {"annotations": ["spring.cloud.kubernetes.configmap.apps", "spring.cloud.kubernetes.secret.apps", "spring.cloud.kubernetes.configmap.labels", "spring.cloud.kubernetes.secret.labels"]}, "only": ["usedBySpringService"]}"#
);

struct HttpRefresh;

impl Guest for HttpRefresh {
    fn check_config(json: String) -> Result<(), String> {
        config(&json).map(|_| ())
    }

    fn handle(event: ChangeEvent) -> Result<Vec<Action>, String> {
        let config = config(&host::config())?;
        let services = spring::target_apps(&event).services(&event.namespace);
        if services.is_empty() {
            log(
                LogLevel::Debug,
                &format!(
                    "no app Service found for {}/{}",
                    event.namespace, event.name
                ),
            );
        }
        let endpoint = match config.strategy {
            Strategy::Refresh => "refresh",
            Strategy::Shutdown => "shutdown",
        };
        Ok(services
            .into_iter()
            .map(|svc| {
                let (port, base) = lookup(&svc.annotations, "boot.spring.io/actuator")
                    .map(parse_actuator)
                    .unwrap_or((None, None));
                let base = base.unwrap_or_else(|| config.base_path.clone());
                let path = format!("{}/{endpoint}", base.trim_end_matches('/'));
                action::refresh_service(&svc.namespace, &svc.name, HttpMethod::Post, port, &path)
            })
            .collect())
    }
}

wasmwatch_plugin_sdk::export!(HttpRefresh with_types_in wasmwatch_plugin_sdk);
