//! bus-refresh: Spring Cloud Bus-compatible refresh.
//!
//! For a changed ConfigMap or Secret it publishes, for each target app, one
//! Spring Cloud Bus remote event on a bus connection of the manifest, exactly
//! as the Spring Cloud Kubernetes Configuration Watcher does in bus mode:
//!
//! ```json
//! {"type":"RefreshRemoteApplicationEvent","timestamp":1700000000000,
//!  "originService":"wasmwatch","destinationService":"orders:**",
//!  "id":"0b6c1f0e-8d3a-8c47-9b1e-6f2d7a9c4e11"}
//! ```
//!
//! (`ShutdownRemoteApplicationEvent` with `strategy: shutdown`), with header
//! `content-type: application/json`.
//!
//! Target apps, as in Spring Cloud Kubernetes:
//! - the names in `spring.cloud.kubernetes.configmap.apps` /
//!   `spring.cloud.kubernetes.secret.apps` (comma-separated), published as
//!   they are: no Service is needed, bus consumers subscribe by themselves;
//! - else the Services whose labels match `spring.cloud.kubernetes.configmap.labels`
//!   / `...secret.labels` (`k=v,k2=v2`); none match, nothing is published;
//! - else the object's name, whether or not a Service of that name exists.
//!
//! `id` is a UUID (version 8, RFC 9562) derived from SHA-256 of the object
//! (uid, or `namespace/name` without one), its resourceVersion, its content
//! digest, the app and the event type: a redelivery of the same change
//! carries the same id, so consumers can drop duplicates. `timestamp` is the
//! wall clock in epoch milliseconds.
//!
//! Config (JSON from the manifest):
//! - `connection` (required): a `buses` entry of the manifest;
//! - `destination` (default `springCloudBus`): the RabbitMQ topic exchange or
//!   the NATS subject;
//! - `routingKey` (default: the destination, which is what Spring Cloud
//!   Stream's RabbitMQ binder uses when producing without a
//!   `routingKeyExpression`; the bus consumers bind with `#`);
//! - `originService` (default `wasmwatch`): Spring Bus drops events whose
//!   origin is the receiving app's own bus id, so never use an app's id;
//! - `strategy`: `refresh` (default) or `shutdown`.
//!
//! The manifest must grant `bus: [<connection>/<destination>]`.

use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use wasmwatch_plugin_sdk::{
    Action, ChangeEvent, EventExt, Guest, LogLevel, action, host, log, parse_config, spring,
};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Config {
    connection: String,
    #[serde(default = "default_destination")]
    destination: String,
    #[serde(default)]
    routing_key: Option<String>,
    #[serde(default = "default_origin")]
    origin_service: String,
    #[serde(default)]
    strategy: Strategy,
}

#[derive(serde::Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Strategy {
    #[default]
    Refresh,
    Shutdown,
}

impl Strategy {
    fn event_type(self) -> &'static str {
        match self {
            Strategy::Refresh => "RefreshRemoteApplicationEvent",
            Strategy::Shutdown => "ShutdownRemoteApplicationEvent",
        }
    }
}

fn default_destination() -> String {
    "springCloudBus".into()
}

fn default_origin() -> String {
    "wasmwatch".into()
}

fn config(json: &str) -> Result<Config, String> {
    let config: Config = parse_config("bus-refresh", json)?;
    for (field, value) in [
        ("connection", &config.connection),
        ("destination", &config.destination),
        ("originService", &config.origin_service),
    ] {
        if value.trim().is_empty() {
            return Err(format!("bus-refresh config: {field} must not be empty"));
        }
    }
    Ok(config)
}

/// The JSON Spring Cloud Bus reads, fields in Spring's order.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RemoteEvent<'a> {
    #[serde(rename = "type")]
    event_type: &'a str,
    timestamp: u64,
    origin_service: &'a str,
    destination_service: String,
    id: String,
}

/// A UUID (version 8, RFC 9562 variant) from SHA-256 over length-prefixed
/// parts.
fn derived_uuid(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    let mut b = [0u8; 16];
    b.copy_from_slice(&h.finalize()[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

// It publishes to `connection`/`destination` of its config.
wasmwatch_plugin_sdk::declare_needs!(
    r#"{"bus": ["{config.connection}/{config.destination|springCloudBus}"], "metadata": {"annotations": ["spring.cloud.kubernetes.configmap.apps", "spring.cloud.kubernetes.secret.apps", "spring.cloud.kubernetes.configmap.labels", "spring.cloud.kubernetes.secret.labels"]}}"#
);

struct BusRefresh;

impl Guest for BusRefresh {
    fn check_config(json: String) -> Result<(), String> {
        config(&json).map(|_| ())
    }

    fn handle(event: ChangeEvent) -> Result<Vec<Action>, String> {
        let config = config(&host::config())?;
        let apps = spring::target_apps(&event).names();
        if apps.is_empty() {
            log(
                LogLevel::Debug,
                &format!("no target app for {}", event.object_id()),
            );
        }
        let object = if event.uid.is_empty() {
            event.object_id()
        } else {
            event.uid.clone()
        };
        let event_type = config.strategy.event_type();
        let routing_key = config.routing_key.as_deref().unwrap_or(&config.destination);
        let timestamp = now_millis();
        apps.iter()
            .map(|app| {
                let message = RemoteEvent {
                    event_type,
                    timestamp,
                    origin_service: &config.origin_service,
                    destination_service: format!("{app}:**"),
                    id: derived_uuid(&[
                        &object,
                        &event.resource_version,
                        &event.digest,
                        app,
                        event_type,
                    ]),
                };
                let json = serde_json::to_vec(&message).map_err(|e| e.to_string())?;
                Ok(action::publish_json(
                    &config.connection,
                    &config.destination,
                    routing_key,
                    json,
                ))
            })
            .collect()
    }
}

wasmwatch_plugin_sdk::export!(BusRefresh with_types_in wasmwatch_plugin_sdk);
