//! The epoch ticker: advances the engine's epoch every tick while a plugin
//! call runs, and sleeps otherwise.
//!
//! The epoch is how a call's deadline reaches wasm code: each tick, the
//! running calls meet their epoch callback, which yields to other tasks or
//! traps once the deadline has passed (see `Plugin::call`). Between calls
//! nothing needs the epoch, so the thread parks instead of waking every
//! millisecond: an idle host used to wake 1,000 times a second for nothing.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::{self, Thread};
use std::time::Duration;

use wasmtime::Engine;

pub(crate) struct EpochTicker {
    shared: Arc<Shared>,
    thread: Thread,
}

struct Shared {
    /// Calls holding a [`Ticking`] guard.
    running: AtomicUsize,
    stop: AtomicBool,
    /// Epoch increments so far (for tests and diagnostics).
    ticks: AtomicU64,
}

/// Held for the length of a call: the epoch advances while any is held.
pub(crate) struct Ticking<'a>(&'a EpochTicker);

impl EpochTicker {
    pub(crate) fn start(engine: Engine, tick: Duration) -> std::io::Result<EpochTicker> {
        let shared = Arc::new(Shared {
            running: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            ticks: AtomicU64::new(0),
        });
        let handle = {
            let shared = shared.clone();
            thread::Builder::new()
                .name("wasm-epoch".into())
                .spawn(move || {
                    while !shared.stop.load(Ordering::SeqCst) {
                        if shared.running.load(Ordering::SeqCst) == 0 {
                            // A call starting after the load above unparks
                            // us; an unpark before this park makes it return
                            // at once, so no start is missed.
                            thread::park();
                            continue;
                        }
                        thread::sleep(tick);
                        engine.increment_epoch();
                        shared.ticks.fetch_add(1, Ordering::Relaxed);
                    }
                })?
        };
        Ok(EpochTicker {
            shared,
            thread: handle.thread().clone(),
        })
    }

    /// Marks a call as running until the guard is dropped.
    pub(crate) fn ticking(&self) -> Ticking<'_> {
        if self.shared.running.fetch_add(1, Ordering::SeqCst) == 0 {
            self.thread.unpark();
        }
        Ticking(self)
    }

    /// How many times the epoch has advanced.
    #[cfg(test)]
    fn ticks(&self) -> u64 {
        self.shared.ticks.load(Ordering::Relaxed)
    }
}

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        self.0.shared.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for EpochTicker {
    /// The thread ends at its next wake-up (at once when parked); never
    /// joined, so dropping the runtime never blocks.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn ticker() -> EpochTicker {
        EpochTicker::start(Engine::default(), Duration::from_millis(1)).unwrap()
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(10), "{what}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn ticks_only_while_a_call_runs() {
        let t = ticker();
        thread::sleep(Duration::from_millis(100));
        assert_eq!(t.ticks(), 0, "an idle ticker must not advance the epoch");

        let call = t.ticking();
        wait_for("ticks while a call runs", || t.ticks() >= 20);
        drop(call);
        // At most the tick in progress lands after the guard is gone.
        thread::sleep(Duration::from_millis(20));
        let after = t.ticks();
        thread::sleep(Duration::from_millis(100));
        assert_eq!(t.ticks(), after, "ticking went on with no call running");

        // Overlapping calls: ticking lasts until the last one ends.
        let a = t.ticking();
        let b = t.ticking();
        drop(a);
        let before = t.ticks();
        wait_for("ticks while the second call runs", || {
            t.ticks() >= before + 20
        });
        drop(b);
    }

    #[test]
    fn a_call_starting_right_after_another_is_not_missed() {
        let t = ticker();
        for _ in 0..200 {
            let before = t.ticks();
            let call = t.ticking();
            wait_for("a tick for a fresh call", || t.ticks() > before);
            drop(call);
        }
    }

    #[test]
    fn the_thread_ends_with_the_ticker() {
        let engine = Engine::default();
        let t = EpochTicker::start(engine.clone(), Duration::from_millis(1)).unwrap();
        let shared = t.shared.clone();
        drop(t);
        wait_for("the ticker thread to let go of its state", || {
            Arc::strong_count(&shared) == 1
        });
    }
}
