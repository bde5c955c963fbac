//! `handle`'s result, counted while it is copied out of the sandbox.
//!
//! The generated `call_handle` copies the whole result (every action,
//! header and body) into host types before the host can look at it, and
//! that copy cannot be interrupted: a plugin that returned lists aliasing
//! one 16 MiB buffer, or a million headers, held its call (and its tokio
//! worker) for up to a second past the deadline (issue 23). Here the
//! result's type is [`HandleOutput`], whose lifting reads the list's length
//! and each action's lengths from guest memory first, refuses at the first
//! action over the limits (`OutputRefused`), and copies only what is within
//! them: at most `MAX_OUTPUT_BYTES` of actions, a few milliseconds.
//!
//! Why in a `Lift` implementation rather than through `WasmList`/`WasmStr`
//! handles read after the call: in wasmtime 48 `TypedFunc::call_async`
//! runs the guest's `post-return` itself before returning (`post_return`
//! is deprecated and does nothing), and that frees (and so overwrites parts
//! of: an allocator's free lists) the memory such handles point into. The
//! lift is the last moment the result is intact.
//!
//! Each world ([`V2`], [`V3`]) has its own action layout; the lift reads
//! it per [`World`] and converts every action to the core type as it is
//! copied.
use std::cell::Cell;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use wasmtime::AsContextMut;
use wasmtime::ValRaw;
use wasmtime::component::__internal::wasmtime_environ::component::StringEncoding;
use wasmtime::component::__internal::{
    CanonicalAbiInfo, ComponentVariant, InstanceType, InterfaceType, LiftContext, bad_type_info,
};
use wasmtime::component::{ComponentType, Func, Lift, Lower, TypedFunc};
use wasmwatch_core::Action;

use crate::bindings::{v2, v3, v4};
use crate::convert;

/// What the lift needs to know of a world's `handle`.
pub(crate) trait World: 'static {
    /// `change-event`.
    type Event: ComponentType + Lower + Sync;
    /// `action`.
    type Action: ComponentType + Lift;
    /// Bytes of one `action` in guest memory.
    const ACTION_SIZE: usize;
    /// Counts a `restart` action's strings (`action`: the whole action,
    /// payload at [`PAYLOAD`]) as `Action::approx_size` counts them.
    fn restart_bytes(memory: &[u8], action: &[u8]) -> usize;
    fn to_core(action: Self::Action) -> Action;
}

/// WIT 0.2.0.
pub(crate) struct V2;
/// WIT 0.3.0.
pub(crate) struct V3;
/// WIT 0.4.0: 0.3.0's actions, its own event (open kinds).
pub(crate) struct V4;

/// `handle`'s parameters and results as [`call_handle`] types them.
type Params<'a, W> = (&'a <W as World>::Event,);
type Results<W> = (Lifted<W>,);

/// Checks once, at load, that `handle` has the type [`call_handle`] relies on.
pub(crate) fn check_handle<W: World>(
    func: Func,
    store: impl wasmtime::AsContext,
) -> wasmtime::Result<()> {
    func.typed::<Params<'_, W>, Results<W>>(store).map(drop)
}

/// Calls `handle` (a function [`check_handle`] accepted for the same
/// component and world) and copies its result out within the limits (see
/// [`WithLimits`] for `max_actions`).
pub(crate) async fn call_handle<W: World>(
    func: Func,
    store: impl AsContextMut<Data: Send>,
    event: &W::Event,
) -> wasmtime::Result<HandleOutput> {
    // SAFETY: the type was checked at load (`check_handle`), as the
    // generated bindings' own calls rely on (`instantiate_prechecked`).
    let typed = unsafe { TypedFunc::<Params<'_, W>, Results<W>>::new_unchecked(func) };
    Ok(typed.call_async(store, (event,)).await?.0.0)
}

/// Bytes of actions one call may return, counted as
/// [`wasmwatch_core::Action::approx_size`] counts them.
pub(crate) const MAX_OUTPUT_BYTES: usize = 1 << 20;

/// Bytes of a returned error message copied out of the sandbox; the host
/// shows at most `MAX_MESSAGE_BYTES` of it anyway.
const MAX_ERROR_BYTES: usize = 2 * wasmwatch_core::text::MAX_MESSAGE_BYTES;

/// What `handle` returned, as the WIT says it: `result<list<action>, string>`.
type Generated<W> = Result<Vec<<W as World>::Action>, String>;

/// `handle`'s result, copied out within the limits.
#[derive(Debug)]
pub(crate) enum HandleOutput {
    /// Converted from the world's actions as they were copied.
    Actions(Vec<Action>),
    /// The plugin's error: the first `MAX_ERROR_BYTES` of it (lossy UTF-8
    /// for a UTF-8 guest), and its full length in bytes.
    Error { text: String, len: usize },
}

/// The output was over a limit; nothing past the first action over it was
/// copied. Becomes [`crate::PluginError::OutputTooLarge`].
#[derive(Debug)]
pub(crate) struct OutputRefused(pub String);

impl std::fmt::Display for OutputRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "output refused: {}", self.0)
    }
}

impl std::error::Error for OutputRefused {}

thread_local! {
    /// The calling plugin's `max_actions`, for the lift (which is given no
    /// state of its own). Set around every poll of the call by
    /// [`WithLimits`]; the lift runs inside such a poll, on the fiber the
    /// call runs on, which shares the polling thread's locals.
    static MAX_ACTIONS: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Runs `inner` with the plugin's action limit visible to the lift.
pub(crate) struct WithLimits<F> {
    max_actions: usize,
    inner: F,
}

impl<F> WithLimits<F> {
    pub(crate) fn new(max_actions: usize, inner: F) -> Self {
        WithLimits { max_actions, inner }
    }
}

impl<F: Future> Future for WithLimits<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        struct Restore(Option<usize>);
        impl Drop for Restore {
            fn drop(&mut self) {
                MAX_ACTIONS.set(self.0);
            }
        }
        let _restore = Restore(MAX_ACTIONS.replace(Some(self.max_actions)));
        // SAFETY: `inner` is never moved out of `self` (structural pinning;
        // `WithLimits` has no `Drop` and is `Unpin` only if `F` is).
        unsafe { self.map_unchecked_mut(|s| &mut s.inner) }.poll(cx)
    }
}

// The canonical ABI layout (wasm32) this module reads. The sizes are
// checked against wasmtime's own at compile time; the offsets follow from
// the WIT (wit/plugin.wit 0.2.0, wit/0.3.0/plugin.wit), are checked against
// the result of the real copy in debug builds (every test's actions), and
// the types themselves are checked when a plugin is loaded. Only `action`'s
// size and the `restart` payload differ between the worlds.
/// Where an action's payload starts (after its discriminant).
const PAYLOAD: usize = 4;
const HEADER_SIZE: usize = 16;
/// Bytes a header counts for besides its name and value (as `approx_size`).
const HEADER_COST: usize = 32;
/// Bytes an action counts for besides its strings, headers and bodies.
const ACTION_COST: usize = 64;

macro_rules! check_layout {
    ($wit:path, $w:ty, $restart:expr) => {
        const _: () = {
            use $wit as wit;
            assert!(<wit::Action as ComponentType>::SIZE32 == <$w as World>::ACTION_SIZE);
            assert!(<wit::Action as ComponentVariant>::PAYLOAD_OFFSET32 == PAYLOAD);
            assert!(<wit::Header as ComponentType>::SIZE32 == HEADER_SIZE);
            assert!(<wit::HttpCall as ComponentType>::SIZE32 == 32);
            assert!(<wit::RefreshService as ComponentType>::SIZE32 == 36);
            assert!(<wit::BusPublish as ComponentType>::SIZE32 == 40);
            assert!(<wit::RestartWorkload as ComponentType>::SIZE32 == $restart);
            assert!(<wit::EmitEvent as ComponentType>::SIZE32 == 20);
            assert!(<Generated<$w> as ComponentVariant>::PAYLOAD_OFFSET32 == 4);
            assert!(
                std::mem::size_of::<<Generated<$w> as ComponentType>::Lower>()
                    == std::mem::size_of::<[ValRaw; 3]>()
            );
        };
    };
}

check_layout!(v2::wit, V2, 36);
check_layout!(v3::wit, V3, 60);
check_layout!(v4::wit, V4, 60);
// 0.3.0's restart-workload: workload-ref (five strings) @0, reason @40,
// content-hash @48, strategy: option<enum> (2 bytes) @56.
const _: () = {
    assert!(<v3::wit::WorkloadRef as ComponentType>::SIZE32 == 40);
    assert!(<Option<v3::wit::RestartStrategy> as ComponentType>::SIZE32 == 2);
};

impl World for V2 {
    type Event = v2::wit::ChangeEvent;
    type Action = v2::wit::Action;
    const ACTION_SIZE: usize = 44;

    /// restart(restart-workload): workload {kind (an enum), namespace @4,
    /// name @12}, reason @20, content-hash @28.
    fn restart_bytes(_memory: &[u8], action: &[u8]) -> usize {
        let s = |at| str_len(action, PAYLOAD + at);
        s(4) + s(12) + s(20) + s(28)
    }

    fn to_core(action: v2::wit::Action) -> Action {
        convert::v2::action_from_wit(action)
    }
}

impl World for V3 {
    type Event = v3::wit::ChangeEvent;
    type Action = v3::wit::Action;
    const ACTION_SIZE: usize = 64;

    /// restart(restart-workload): workload {group @0, version @8, kind @16,
    /// namespace @24, name @32}, reason @40, content-hash @48, strategy
    /// @56. An apps/v1 kind counts for nothing, as it becomes one of
    /// `WorkloadKind`'s own variants (`WorkloadKind::from_gvk`).
    fn restart_bytes(memory: &[u8], action: &[u8]) -> usize {
        let s = |at| str_len(action, PAYLOAD + at);
        let text = |at| {
            let (ptr, len) = (u32_at(action, PAYLOAD + at), s(at));
            memory.get(ptr..).and_then(|m| m.get(..len))
        };
        let apps_v1 = text(0) == Some(b"apps")
            && text(8) == Some(b"v1")
            && matches!(
                text(16),
                Some(b"Deployment" | b"StatefulSet" | b"DaemonSet")
            );
        let kind = if apps_v1 { 0 } else { s(0) + s(8) + s(16) };
        kind + s(24) + s(32) + s(40) + s(48)
    }

    fn to_core(action: v3::wit::Action) -> Action {
        convert::v3::action_from_wit(action)
    }
}

impl World for V4 {
    type Event = v4::wit::ChangeEvent;
    type Action = v4::wit::Action;
    const ACTION_SIZE: usize = V3::ACTION_SIZE;

    /// As 0.3.0's: the actions are the same.
    fn restart_bytes(memory: &[u8], action: &[u8]) -> usize {
        V3::restart_bytes(memory, action)
    }

    fn to_core(action: v4::wit::Action) -> Action {
        convert::v4::action_from_wit(action)
    }
}

fn u32_at(bytes: &[u8], at: usize) -> usize {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize
}

/// A string's length in code units: the UTF-16 tag of `latin1+utf16`
/// strings is not length. For a UTF-8 guest (Rust, Python, JavaScript) this
/// is the byte length `approx_size` counts; for a UTF-16 one, the exact
/// count after the copy (in `Plugin::handle`) decides.
fn str_len(bytes: &[u8], at: usize) -> usize {
    u32_at(bytes, at + 4) & !(1 << 31)
}

/// Counts one action (`action`: its `ACTION_SIZE` bytes) as `approx_size`
/// would, adding to `total`, and refuses as soon as the total is over the
/// limit, before reading a header list that takes it over. Reads lengths
/// (and 0.3.0's kind strings); a pointer out of bounds is left to the copy,
/// which reports it.
fn count_action<W: World>(
    memory: &[u8],
    action: &[u8],
    total: &mut usize,
) -> Result<(), OutputRefused> {
    let p = PAYLOAD;
    let s = |at| str_len(action, p + at);
    let over = |total: usize| {
        OutputRefused(format!(
            "at least {total} bytes of actions, the limit is {MAX_OUTPUT_BYTES}"
        ))
    };
    let headers = |at: usize, total: &mut usize| {
        let (ptr, len) = (u32_at(action, p + at), u32_at(action, p + at + 4));
        *total = total.saturating_add(len.saturating_mul(HEADER_COST));
        if *total > MAX_OUTPUT_BYTES {
            return Err(over(*total));
        }
        if let Some(list) = memory.get(ptr..).and_then(|m| m.get(..len * HEADER_SIZE)) {
            for h in list.chunks_exact(HEADER_SIZE) {
                *total += str_len(h, 0) + str_len(h, 8);
            }
        }
        Ok(())
    };
    *total += ACTION_COST;
    match action[0] {
        // http(http-call): method, url @4, headers @12, body: option @20.
        0 => {
            *total += s(4);
            if action[p + 20] != 0 {
                *total += u32_at(action, p + 28);
            }
            headers(12, total)?;
        }
        // refresh-service: namespace @0, service @8, method, port, path @24.
        1 => *total += s(0) + s(8) + s(24),
        // publish(bus-publish): connection @0, destination @8,
        // routing-key @16, headers @24, payload @32.
        2 => {
            *total += s(0) + s(8) + s(16) + u32_at(action, p + 36);
            headers(24, total)?;
        }
        // restart(restart-workload): per world.
        3 => *total += W::restart_bytes(memory, action),
        // event(emit-event): event-type, reason @4, message @12.
        4 => *total += s(4) + s(12),
        // Invalid: the copy reports it.
        _ => {}
    }
    if *total > MAX_OUTPUT_BYTES {
        return Err(over(*total));
    }
    Ok(())
}

/// [`HandleOutput`] as `handle`'s result in world `W`.
pub(crate) struct Lifted<W>(HandleOutput, PhantomData<fn() -> W>);

impl<W: World> Lifted<W> {
    fn lift(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        discriminant: u32,
        ptr: usize,
        len: usize,
    ) -> wasmtime::Result<HandleOutput> {
        let (ok, err) = match ty {
            InterfaceType::Result(r) => (cx.types[r].ok, cx.types[r].err),
            _ => bad_type_info(),
        };
        match (discriminant, ok, err) {
            (0, Some(InterfaceType::List(list)), _) => {
                let element = cx.types[list].element;
                Ok(HandleOutput::Actions(Self::actions(cx, element, ptr, len)?))
            }
            (1, _, Some(InterfaceType::String)) => Self::error(cx, ptr, len),
            (0 | 1, _, _) => bad_type_info(),
            _ => wasmtime::bail!("invalid expected discriminant"),
        }
    }

    /// Counts, then copies, one action at a time.
    fn actions(
        cx: &mut LiftContext<'_>,
        element: InterfaceType,
        ptr: usize,
        len: usize,
    ) -> wasmtime::Result<Vec<Action>> {
        let max_actions = MAX_ACTIONS.get().unwrap_or(usize::MAX);
        if len > max_actions {
            return Err(OutputRefused(format!("{len} actions, the limit is {max_actions}")).into());
        }
        if len.saturating_mul(ACTION_COST) > MAX_OUTPUT_BYTES {
            return Err(OutputRefused(format!(
                "{len} actions, at least {} bytes, the limit is {MAX_OUTPUT_BYTES}",
                len * ACTION_COST
            ))
            .into());
        }
        let memory = cx.memory();
        // The checks wasmtime makes for a list, with its messages.
        let Some(list) = memory
            .get(ptr..)
            .and_then(|m| m.get(..len * W::ACTION_SIZE))
        else {
            wasmtime::bail!("list pointer/length out of bounds of memory");
        };
        if !ptr.is_multiple_of(4) {
            wasmtime::bail!("list pointer is not aligned");
        }
        let utf8 = matches!(cx.options().string_encoding, StringEncoding::Utf8);
        let mut total = 0;
        let mut actions = Vec::with_capacity(len);
        for bytes in list.chunks_exact(W::ACTION_SIZE) {
            let before = total;
            count_action::<W>(memory, bytes, &mut total)?;
            let action = W::to_core(W::Action::linear_lift_from_memory(cx, element, bytes)?);
            if cfg!(debug_assertions) && utf8 {
                let size = action.approx_size();
                debug_assert_eq!(total - before, size, "counted differently: {action:?}");
            }
            actions.push(action);
        }
        Ok(actions)
    }

    /// The plugin's error message, at most `MAX_ERROR_BYTES` of it.
    fn error(cx: &mut LiftContext<'_>, ptr: usize, len: usize) -> wasmtime::Result<HandleOutput> {
        if !matches!(cx.options().string_encoding, StringEncoding::Utf8) {
            // Not a toolchain we ship for; copied whole, as before.
            let text = String::linear_lift_from_flat(
                cx,
                InterfaceType::String,
                &[ValRaw::u32(ptr as u32), ValRaw::u32(len as u32)],
            )?;
            let len = text.len();
            return Ok(HandleOutput::Error { text, len });
        }
        let Some(bytes) = cx.memory().get(ptr..).and_then(|m| m.get(..len)) else {
            wasmtime::bail!("string pointer/length out of bounds of memory");
        };
        let text = String::from_utf8_lossy(&bytes[..len.min(MAX_ERROR_BYTES)]).into_owned();
        Ok(HandleOutput::Error { text, len })
    }
}

// SAFETY: the same ABI, flat representation and type check as the
// generated type it stands for (`Generated`), checked above per world.
unsafe impl<W: World> ComponentType for Lifted<W> {
    type Lower = [ValRaw; 3];

    const ABI: CanonicalAbiInfo = <Generated<W> as ComponentType>::ABI;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <Generated<W> as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: reads guest memory only through `LiftContext::memory` with
// bounds checks, and lifts every action through the generated type.
unsafe impl<W: World> Lift for Lifted<W> {
    fn linear_lift_from_flat(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        src: &Self::Lower,
    ) -> wasmtime::Result<Self> {
        let [discriminant, ptr, len] = src.map(|v| v.get_u32());
        Self::lift(cx, ty, discriminant, ptr as usize, len as usize)
            .map(|output| Lifted(output, PhantomData))
    }

    fn linear_lift_from_memory(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        bytes: &[u8],
    ) -> wasmtime::Result<Self> {
        Self::lift(
            cx,
            ty,
            u32::from(bytes[0]),
            u32_at(bytes, 4),
            u32_at(bytes, 8),
        )
        .map(|output| Lifted(output, PhantomData))
    }
}
