//! Host-side bindings generated from wit/plugin.wit.
//!
//! Exports are called asynchronously, so that a call can be dropped at its
//! deadline even while the plugin waits in a host call (a wasi:clocks
//! poll, say). Imports are trappable: a host lookup past the deadline, or
//! one too large for the plugin, ends the call.
wasmtime::component::bindgen!({
    path: "../../wit",
    world: "plugin",
    imports: { default: trappable },
    exports: { default: async },
});

pub use wasmwatch::plugin::types as wit;

/// The WIT world this host implements, for error messages.
pub const WORLD: &str = "wasmwatch:plugin/plugin@0.2.0";

impl<T: Send + 'static> PluginPre<T> {
    /// Instantiates like [`PluginPre::instantiate_async`] but without
    /// checking the exports' types again. The generated instantiation
    /// type-checks every export on every call, about a microsecond per event
    /// for `handle`'s types. The types cannot change after load, so the
    /// runtime checks them once there and uses this for every event.
    ///
    /// Only call this on a `PluginPre` whose `instantiate_async` has
    /// succeeded once: the generated `call_*` methods rely on the checked
    /// types.
    pub(crate) async fn instantiate_prechecked(
        &self,
        mut store: impl wasmtime::AsContextMut<Data = T>,
    ) -> wasmtime::Result<Plugin> {
        let instance = self.instance_pre.instantiate_async(&mut store).await?;
        let mut export = |index| {
            instance
                .get_func(&mut store, index)
                .ok_or_else(|| wasmtime::format_err!("export missing after instantiation"))
        };
        Ok(Plugin {
            check_config: export(&self.indices.check_config)?,
            handle: export(&self.indices.handle)?,
        })
    }
}

impl Plugin {
    /// The `handle` export, for [`crate::output::call_handle`], which copies
    /// its result out within the limits (the generated `call_handle` copies
    /// it all first).
    pub(crate) fn handle_func(&self) -> wasmtime::component::Func {
        self.handle
    }
}
