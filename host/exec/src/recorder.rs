//! The host's own Events about its work (`Refreshed`, `WebhookCalled`,
//! `RefreshPublished`, `RefreshFailed`, ...; which, in
//! [`crate::executors`]), recorded off the delivery path.
//!
//! Such an Event is a record for `kubectl describe`, not part of handling a
//! change: a refresh is done when its pods answered, whether or not the
//! Event about it was written. A coalesced refresh has one origin per
//! changed object (200 in a storm over 200 ConfigMaps), so writing its
//! Events in the delivery job made the next refresh of the same target and
//! every change it carried wait for up to 200 API round trips (measured:
//! 20,000 changes handled after 6.8-8.8 s, while their plugin calls were
//! done after 1.7 s).
//!
//! [`EventRecorder::record`] never waits: it queues the Event for a
//! background task that writes up to `concurrency` at once. When the queue
//! is full (the API server is slow or down, or a storm outruns it) the
//! Event is dropped and counted, like client-go's broadcaster, which drops
//! Events when its queue of 1000 is full; a warning names the dropped
//! Event at the 1st, 2nd, 4th, 8th, ... drop. Each Event carries the time
//! it was recorded, not written. At shutdown the host waits a little for
//! the queue ([`EventRecorder::flush`], 500 ms, after the Lease is released).
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use k8s_openapi::jiff::Timestamp;
use tokio::sync::{Semaphore, mpsc};
use wasmwatch_core::action::EventType;

use crate::Origin;
use crate::workload::KubeExecutor;

/// Queued Events, as client-go's default.
pub const DEFAULT_CAPACITY: usize = 1000;
/// Events written at once.
pub const DEFAULT_CONCURRENCY: usize = 8;

struct Record {
    /// When it happened (the Event is written later).
    at: Timestamp,
    origin: Origin,
    event_type: EventType,
    reason: &'static str,
    message: String,
}

/// Writes Events in the background; see the module docs.
pub struct EventRecorder {
    tx: mpsc::Sender<Record>,
    /// Queued or being written.
    pending: Arc<AtomicUsize>,
    dropped: AtomicU64,
    on_drop: Box<dyn Fn() + Send + Sync>,
}

impl EventRecorder {
    /// Starts the writer task (in the current tokio runtime). `on_drop` is
    /// called for each dropped Event (a metric).
    pub fn start(
        kube: Arc<KubeExecutor>,
        capacity: usize,
        concurrency: usize,
        on_drop: impl Fn() + Send + Sync + 'static,
    ) -> EventRecorder {
        let (tx, mut rx) = mpsc::channel::<Record>(capacity.max(1));
        let permits = Arc::new(Semaphore::new(concurrency.max(1)));
        let pending = Arc::new(AtomicUsize::new(0));
        let done = pending.clone();
        tokio::spawn(async move {
            loop {
                // A free writer first: the queue holds what waits for one.
                let permit = permits.clone().acquire_owned().await.expect("never closed");
                let Some(r) = rx.recv().await else { break };
                let kube = kube.clone();
                let done = done.clone();
                tokio::spawn(async move {
                    if let Err(e) = kube
                        .event_at(&r.origin, r.event_type, r.reason, &r.message, r.at)
                        .await
                    {
                        tracing::warn!("cannot record the {} Event: {e}", r.reason);
                    }
                    done.fetch_sub(1, Ordering::Relaxed);
                    drop(permit);
                });
            }
        });
        EventRecorder {
            tx,
            pending,
            dropped: AtomicU64::new(0),
            on_drop: Box::new(on_drop),
        }
    }

    /// Queues an Event on `origin`'s object; false when it was dropped.
    pub fn record(
        &self,
        origin: &Origin,
        event_type: EventType,
        reason: &'static str,
        message: String,
    ) -> bool {
        let r = Record {
            at: Timestamp::now(),
            origin: origin.clone(),
            event_type,
            reason,
            message,
        };
        self.pending.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(r) {
            Ok(()) => true,
            Err(e) => {
                self.pending.fetch_sub(1, Ordering::Relaxed);
                let (r, why) = match e {
                    mpsc::error::TrySendError::Full(r) => (r, "Event queue full"),
                    mpsc::error::TrySendError::Closed(r) => (r, "Event writer stopped"),
                };
                (self.on_drop)();
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(
                        dropped = n,
                        "{why}: not recording the {} Event on {} {}/{} ({n} dropped so far)",
                        r.reason,
                        r.origin.kind.as_str(),
                        r.origin.namespace,
                        r.origin.name
                    );
                }
                false
            }
        }
    }

    /// Waits until every queued Event is written (or failed), at most
    /// `within`; true when none is left. For shutdown, after the leader
    /// Lease is released: Events recorded in the last moments are written
    /// rather than dropped with the process.
    pub async fn flush(&self, within: std::time::Duration) -> bool {
        let idle = async {
            while self.pending.load(Ordering::Relaxed) > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(within, idle).await.is_ok()
    }

    /// Events dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
