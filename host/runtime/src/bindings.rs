//! Host-side bindings generated from the WIT worlds the host implements:
//! [`v2`] from wit/plugin.wit (0.2.0), [`v3`] from wit/0.3.0/plugin.wit and
//! [`v4`] from wit/0.4.0/plugin.wit.
//! A loaded plugin is a component of one of them ([`Pre`]).
//!
//! Exports are called asynchronously, so that a call can be dropped at its
//! deadline even while the plugin waits in a host call (a wasi:clocks
//! poll, say). Imports are trappable: a host lookup past the deadline, or
//! one too large for the plugin, ends the call.
use wasmtime::AsContextMut;
use wasmtime::component::Func;

/// The bindings of one world, with the instantiation the runtime uses.
macro_rules! world {
    ($path:tt) => {
        wasmtime::component::bindgen!({
            path: $path,
            world: "plugin",
            imports: { default: trappable },
            exports: { default: async },
        });

        pub use wasmwatch::plugin::types as wit;

        impl<T: Send + 'static> PluginPre<T> {
            /// Instantiates like [`PluginPre::instantiate_async`] but without
            /// checking the exports' types again. The generated instantiation
            /// type-checks every export on every call, about a microsecond per
            /// event for `handle`'s types. The types cannot change after load,
            /// so the runtime checks them once there and uses this for every
            /// event.
            ///
            /// Only call this on a `PluginPre` whose `instantiate_async` has
            /// succeeded once: the generated `call_*` methods rely on the
            /// checked types.
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
            /// The `handle` export, for [`crate::output::call_handle`], which
            /// copies its result out within the limits (the generated
            /// `call_handle` copies it all first).
            pub(crate) fn handle_func(&self) -> wasmtime::component::Func {
                self.handle
            }
        }
    };
}

/// `wasmwatch:plugin/plugin@0.2.0` (wit/plugin.wit, frozen).
pub mod v2 {
    world!("../../wit");

    pub const WORLD: &str = "wasmwatch:plugin/plugin@0.2.0";
}

/// `wasmwatch:plugin/plugin@0.3.0` (wit/0.3.0/plugin.wit): open workload
/// kinds, how workloads use the object, a restart's strategy.
pub mod v3 {
    world!("../../wit/0.3.0");

    pub const WORLD: &str = "wasmwatch:plugin/plugin@0.3.0";
}

/// `wasmwatch:plugin/plugin@0.4.0` (wit/0.4.0/plugin.wit): 0.3.0 with open
/// watched kinds (`object-kind` has `other(object-type)`).
pub mod v4 {
    world!("../../wit/0.4.0");

    pub const WORLD: &str = "wasmwatch:plugin/plugin@0.4.0";
}

/// The worlds a plugin may target, for error messages.
pub const WORLDS: &str = "wasmwatch:plugin/plugin@0.2.0, @0.3.0 or @0.4.0";

/// A pre-linked plugin of one of the worlds.
pub(crate) enum Pre<T: 'static> {
    V2(v2::PluginPre<T>),
    V3(v3::PluginPre<T>),
    V4(v4::PluginPre<T>),
}

/// One instance of a plugin, of its world.
pub(crate) enum Exports {
    V2(v2::Plugin),
    V3(v3::Plugin),
    V4(v4::Plugin),
}

impl<T: Send + 'static> Pre<T> {
    /// The world's name.
    pub(crate) fn world(&self) -> &'static str {
        match self {
            Pre::V2(_) => v2::WORLD,
            Pre::V3(_) => v3::WORLD,
            Pre::V4(_) => v4::WORLD,
        }
    }

    /// Whether the world can carry objects of kinds other than ConfigMap
    /// and Secret (0.4.0 on).
    pub(crate) fn open_kinds(&self) -> bool {
        matches!(self, Pre::V4(_))
    }

    /// Instantiates, type-checking the exports (`check_types`, once at
    /// load) or not (see `instantiate_prechecked`).
    pub(crate) async fn instantiate(
        &self,
        store: impl AsContextMut<Data = T>,
        check_types: bool,
    ) -> wasmtime::Result<Exports> {
        Ok(match (self, check_types) {
            (Pre::V2(p), true) => Exports::V2(p.instantiate_async(store).await?),
            (Pre::V2(p), false) => Exports::V2(p.instantiate_prechecked(store).await?),
            (Pre::V3(p), true) => Exports::V3(p.instantiate_async(store).await?),
            (Pre::V3(p), false) => Exports::V3(p.instantiate_prechecked(store).await?),
            (Pre::V4(p), true) => Exports::V4(p.instantiate_async(store).await?),
            (Pre::V4(p), false) => Exports::V4(p.instantiate_prechecked(store).await?),
        })
    }
}

impl Exports {
    /// `check-config` (the same function in both worlds).
    pub(crate) async fn call_check_config<S: AsContextMut<Data: Send>>(
        &self,
        store: S,
        config: &str,
    ) -> wasmtime::Result<Result<(), String>> {
        match self {
            Exports::V2(p) => p.call_check_config(store, config).await,
            Exports::V3(p) => p.call_check_config(store, config).await,
            Exports::V4(p) => p.call_check_config(store, config).await,
        }
    }

    /// The `handle` export (its types are the world's).
    pub(crate) fn handle_func(&self) -> Func {
        match self {
            Exports::V2(p) => p.handle_func(),
            Exports::V3(p) => p.handle_func(),
            Exports::V4(p) => p.handle_func(),
        }
    }

    /// Checks that `handle` has the type `output::call_handle` relies on.
    pub(crate) fn check_handle(&self, store: impl wasmtime::AsContext) -> wasmtime::Result<()> {
        match self {
            Exports::V2(p) => {
                crate::output::check_handle::<crate::output::V2>(p.handle_func(), store)
            }
            Exports::V3(p) => {
                crate::output::check_handle::<crate::output::V3>(p.handle_func(), store)
            }
            Exports::V4(p) => {
                crate::output::check_handle::<crate::output::V4>(p.handle_func(), store)
            }
        }
    }
}
