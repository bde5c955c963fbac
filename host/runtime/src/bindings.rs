//! Host-side bindings generated from wit/plugin.wit.
wasmtime::component::bindgen!({
    path: "../../wit",
    world: "plugin",
});

pub use wasmwatch::plugin::types as wit;

/// The WIT world this host implements, for error messages.
pub const WORLD: &str = "wasmwatch:plugin/plugin@0.1.0";
