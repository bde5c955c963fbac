//! Test plugin: tries everything the zero-authority WASI imports must
//! refuse, and reports each outcome as an `event` action, in this order:
//! `OpenFile` (/etc/passwd), `ListDir` (/), `Connect` (TCP to the config's
//! `connect`, default 127.0.0.1:9), `Resolve` (the config's `resolve`,
//! default localhost), `Environment`. The message is `denied: <error>` when
//! the attempt failed (or the environment is empty), `GRANTED: <what>` when
//! it succeeded. plugins/python/testing/inert and plugins/js/testing/inert
//! follow the same protocol, so one test checks all three languages.
use std::net::ToSocketAddrs;

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use wasmwatch::plugin::types::{EmitEvent, EventType};

struct P;

fn outcome(reason: &str, r: Result<String, String>) -> Action {
    let message = match r {
        Ok(what) => format!("GRANTED: {what}"),
        Err(e) => format!("denied: {e}"),
    };
    Action::Event(EmitEvent {
        event_type: EventType::Normal,
        reason: reason.into(),
        message,
    })
}

fn setting(key: &str, default: &str) -> String {
    let config: serde_json::Value =
        serde_json::from_str(&wasmwatch::plugin::host::config()).unwrap_or_default();
    config[key].as_str().unwrap_or(default).to_string()
}

impl Guest for P {
    fn check_config(_: String) -> Result<(), String> {
        Ok(())
    }
    fn handle(_: ChangeEvent) -> Result<Vec<Action>, String> {
        let connect = setting("connect", "127.0.0.1:9");
        let resolve = setting("resolve", "localhost");
        let env: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
        Ok(vec![
            outcome(
                "OpenFile",
                std::fs::read_to_string("/etc/passwd")
                    .map(|s| format!("{} bytes", s.len()))
                    .map_err(|e| e.to_string()),
            ),
            outcome(
                "ListDir",
                std::fs::read_dir("/")
                    .map(|d| format!("{} entries", d.count()))
                    .map_err(|e| e.to_string()),
            ),
            outcome(
                "Connect",
                std::net::TcpStream::connect(&connect)
                    .map(|s| format!("connected to {:?}", s.peer_addr()))
                    .map_err(|e| e.to_string()),
            ),
            outcome(
                "Resolve",
                (resolve.as_str(), 80)
                    .to_socket_addrs()
                    .map(|a| format!("{:?}", a.collect::<Vec<_>>()))
                    .map_err(|e| e.to_string()),
            ),
            outcome(
                "Environment",
                if env.is_empty() {
                    Err("empty".into())
                } else {
                    Ok(env.join(","))
                },
            ),
        ])
    }
}
export!(P);
