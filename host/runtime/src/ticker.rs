//! The epoch ticker: advances the engine's epoch every tick while a plugin
//! call runs, and sleeps otherwise.
//!
//! The epoch is how a call's deadline reaches wasm code: each tick, the
//! running calls meet their epoch callback, which yields to other tasks or
//! traps once the deadline has passed (see `Plugin::call`). Between calls
//! nothing needs the epoch: an idle host used to wake 1,000 times a second
//! for nothing.
//!
//! The thread blocks reading a timerfd that the first running call arms
//! (periodic, one tick) and the last one disarms. A call shorter than a
//! tick (most are: ~0.1 ms against a 1 ms tick) so costs two
//! `timerfd_settime` calls and never wakes the thread. Unparking the
//! thread at each call's start, as before, cost two context switches per
//! call: in issue 35's profile, 1,895 switches and 50 ms of the thread for
//! 1,000 changes, ~6% of the product path's CPU. The timer runs in the
//! kernel, so a plugin that never yields (a runaway loop on the worker
//! thread) still meets its deadline.
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use rustix::time::{
    Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
    timerfd_settime,
};
use wasmtime::Engine;

pub(crate) struct EpochTicker {
    shared: Arc<Shared>,
}

struct Shared {
    /// Calls holding a [`Ticking`] guard; the timer is armed while it is
    /// not 0 (changed together, under the lock).
    running: Mutex<usize>,
    timer: OwnedFd,
    tick: Timespec,
    stop: AtomicBool,
    /// Epoch increments so far (for tests and diagnostics).
    ticks: AtomicU64,
}

/// Held for the length of a call: the epoch advances while any is held.
pub(crate) struct Ticking<'a>(&'a EpochTicker);

const ZERO: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 0,
};

impl Shared {
    /// First expiry after `value` (zero: disarmed), then every `interval`
    /// (zero: once).
    fn set(&self, value: Timespec, interval: Timespec) {
        let spec = Itimerspec {
            it_interval: interval,
            it_value: value,
        };
        if let Err(e) = timerfd_settime(&self.timer, TimerfdTimerFlags::empty(), &spec) {
            // Only an invalid descriptor or value fails: neither can be.
            tracing::error!("the plugin epoch timer could not be set: {e}");
        }
    }
}

impl EpochTicker {
    pub(crate) fn start(engine: Engine, tick: Duration) -> std::io::Result<EpochTicker> {
        let timer = timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::CLOEXEC)?;
        let tick = Timespec::try_from(tick.max(Duration::from_micros(1)))
            .map_err(|_| std::io::Error::other("epoch tick out of range"))?;
        let shared = Arc::new(Shared {
            running: Mutex::new(0),
            timer,
            tick,
            stop: AtomicBool::new(false),
            ticks: AtomicU64::new(0),
        });
        {
            let shared = shared.clone();
            thread::Builder::new()
                .name("wasm-epoch".into())
                .spawn(move || {
                    let mut expirations = [0u8; 8];
                    loop {
                        match rustix::io::read(&shared.timer, &mut expirations) {
                            Ok(_) => {}
                            Err(rustix::io::Errno::INTR) => continue,
                            Err(e) => {
                                tracing::error!("the plugin epoch timer failed: {e}");
                                return;
                            }
                        }
                        if shared.stop.load(Ordering::SeqCst) {
                            return;
                        }
                        engine.increment_epoch();
                        shared.ticks.fetch_add(1, Ordering::Relaxed);
                    }
                })?;
        }
        Ok(EpochTicker { shared })
    }

    /// Marks a call as running until the guard is dropped.
    pub(crate) fn ticking(&self) -> Ticking<'_> {
        let mut running = self.running();
        *running += 1;
        if *running == 1 {
            self.shared.set(self.shared.tick, self.shared.tick);
        }
        Ticking(self)
    }

    fn running(&self) -> std::sync::MutexGuard<'_, usize> {
        self.shared
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// How many times the epoch has advanced.
    #[cfg(test)]
    fn ticks(&self) -> u64 {
        self.shared.ticks.load(Ordering::Relaxed)
    }
}

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        let mut running = self.0.running();
        *running -= 1;
        if *running == 0 {
            self.0.shared.set(ZERO, ZERO);
        }
    }
}

impl Drop for EpochTicker {
    /// The thread ends at the timer's next expiry, made due at once; never
    /// joined, so dropping the runtime never blocks.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 1,
        };
        self.shared.set(now, ZERO);
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
    fn calls_shorter_than_a_tick_never_wake_the_thread() {
        // The thread wakes only when the timer expires, and each expiry is
        // a tick: 1,000 calls of microseconds make (nearly) none. Unparking
        // the thread at each call's start woke it twice per call.
        let t = EpochTicker::start(Engine::default(), Duration::from_millis(5)).unwrap();
        let started = Instant::now();
        for _ in 0..1000 {
            let call = t.ticking();
            std::hint::black_box(&call);
            drop(call);
        }
        let armed_ms = started.elapsed().as_millis() as u64;
        // At most one tick per 5 ms spent in the loop (its calls were
        // armed for less than that), and a slow machine's slack.
        assert!(
            t.ticks() <= armed_ms / 5 + 2,
            "{} ticks in {armed_ms} ms",
            t.ticks()
        );
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
