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
//! The Service annotation `boot.spring.io/actuator` (`http://:9090/myactuator`)
//! overrides the port and base path; the default base path is `/actuator` and
//! the default port the endpoint's first port.
//!
//! Config (JSON from the manifest), all optional:
//! `{"strategy": "refresh" | "shutdown", "basePath": "/actuator"}`.

wit_bindgen::generate!({ path: "../../wit", world: "plugin" });

use wasmwatch::plugin::host;
use wasmwatch::plugin::types::{
    HttpMethod, KeyValue, LogLevel, ObjectKind, RefreshService, ServiceInfo,
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

fn parse_config(json: &str) -> Result<Config, String> {
    let json = if json.trim().is_empty() || json.trim() == "null" {
        "{}"
    } else {
        json
    };
    let config: Config =
        serde_json::from_str(json).map_err(|e| format!("http-refresh config: {e}"))?;
    if !config.base_path.starts_with('/') {
        return Err(format!(
            "http-refresh config: basePath must start with '/', got {:?}",
            config.base_path
        ));
    }
    Ok(config)
}

fn annotation<'a>(list: &'a [KeyValue], key: &str) -> Option<&'a str> {
    list.iter()
        .find(|kv| kv.key == key)
        .map(|kv| kv.value.as_str())
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

struct HttpRefresh;

impl Guest for HttpRefresh {
    fn check_config(config: String) -> Result<(), String> {
        parse_config(&config).map(|_| ())
    }

    fn handle(event: ChangeEvent) -> Result<Vec<Action>, String> {
        let config = parse_config(&host::config())?;
        let prefix = match event.kind {
            ObjectKind::ConfigMap => "spring.cloud.kubernetes.configmap",
            ObjectKind::Secret => "spring.cloud.kubernetes.secret",
        };
        let services: Vec<ServiceInfo> =
            if let Some(apps) = annotation(&event.annotations, &format!("{prefix}.apps")) {
                apps.split(',')
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                    .filter_map(|app| host::service(&event.namespace, app))
                    .collect()
            } else if let Some(sel) = annotation(&event.annotations, &format!("{prefix}.labels")) {
                let labels: Vec<KeyValue> = sel
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| KeyValue {
                        key: k.trim().into(),
                        value: v.trim().into(),
                    })
                    .collect();
                host::services_with_labels(&event.namespace, &labels)
            } else {
                host::service(&event.namespace, &event.name)
                    .into_iter()
                    .collect()
            };
        if services.is_empty() {
            host::log(
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
                let (port, base) = annotation(&svc.annotations, "boot.spring.io/actuator")
                    .map(parse_actuator)
                    .unwrap_or((None, None));
                let base = base.unwrap_or_else(|| config.base_path.clone());
                Action::RefreshService(RefreshService {
                    namespace: svc.namespace,
                    service: svc.name,
                    method: HttpMethod::Post,
                    port,
                    path: format!("{}/{endpoint}", base.trim_end_matches('/')),
                    tls: false,
                })
            })
            .collect())
    }
}

export!(HttpRefresh);
