//! Host-side bindings generated from wit/plugin.wit.
wasmtime::component::bindgen!({
    path: "../../wit",
    world: "plugin",
});

pub use wasmwatch::plugin::types as wit;

/// The WIT world this host implements, for error messages.
pub const WORLD: &str = "wasmwatch:plugin/plugin@0.2.0";

impl<T: 'static> PluginPre<T> {
    /// Instantiates like [`PluginPre::instantiate`] but without checking the
    /// exports' types again. The generated `instantiate` type-checks every
    /// export on every call, about a microsecond per event for `handle`'s
    /// types. The types cannot change after load, so the runtime checks them
    /// once there (with `instantiate`) and uses this for every event.
    ///
    /// Only call this on a `PluginPre` whose `instantiate` has succeeded once:
    /// the generated `call_*` methods rely on the checked types.
    pub(crate) fn instantiate_prechecked(
        &self,
        mut store: impl wasmtime::AsContextMut<Data = T>,
    ) -> wasmtime::Result<Plugin> {
        let instance = self.instance_pre.instantiate(&mut store)?;
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
