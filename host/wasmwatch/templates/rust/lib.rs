//! {{name}}: a wasmwatch plugin (world wasmwatch:plugin/plugin@0.4.0).
//! `handle` is called once per change of a selected ConfigMap or Secret (or
//! of another kind the manifest's `watch.kinds` names: `event.kind_name()`,
//! `event.is_kind(group, kind)`), in a fresh sandbox; what it returns is
//! checked against the manifest's capabilities and executed by the host.
use wasmwatch_plugin_sdk::{Action, ChangeEvent, EventExt, Guest, action, parse_config};

/// The manifest's `config`; unknown fields are refused at start-up.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Config {}

struct Plugin;

impl Guest for Plugin {
    fn check_config(config: String) -> Result<(), String> {
        parse_config::<Config>("{{name}}", &config).map(|_| ())
    }

    fn handle(event: ChangeEvent) -> Result<Vec<Action>, String> {
        // Other actions: action::refresh_service, action::restart,
        // action::publish_json, and a webhook call (needs an `http` grant):
        //   action::http_json(HttpMethod::Post, "https://hooks.example.com/x",
        //       serde_json::json!({"object": event.object_id()}).to_string())
        Ok(vec![action::event_normal(
            "Changed",
            &format!("{} {} changed", event.kind_name(), event.object_id()),
        )])
    }
}

wasmwatch_plugin_sdk::export!(Plugin with_types_in wasmwatch_plugin_sdk);
