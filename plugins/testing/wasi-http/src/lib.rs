//! Test plugin: sends an HTTP request itself through wasi:http, so it
//! imports wasi:http/outgoing-handler. The host must refuse to load it
//! (before compiling): a plugin reaches the network only through actions.
wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use wasip2::http::{outgoing_handler, types};

struct P;
impl Guest for P {
    fn check_config(_: String) -> Result<(), String> {
        Ok(())
    }
    fn handle(_: ChangeEvent) -> Result<Vec<Action>, String> {
        let request = types::OutgoingRequest::new(types::Fields::new());
        request
            .set_authority(Some("127.0.0.1:80"))
            .map_err(|()| "bad authority".to_string())?;
        outgoing_handler::handle(request, None)
            .map(|_| Vec::new())
            .map_err(|e| format!("{e:?}"))
    }
}
export!(P);
