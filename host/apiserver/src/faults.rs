//! Fault injection: the switches reliability tests flip, available both on
//! the [`Faults`] handle and over HTTP under `/_faults/...`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::ApiError;
use crate::store::Store;

/// How injected request failures look to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Failure {
    /// 500 InternalError.
    Internal,
    /// 429 TooManyRequests with a `Retry-After` header.
    TooManyRequests { retry_after_seconds: u32 },
}

/// How open watches are ended by [`Faults::close_watches`] and friends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WatchClose {
    #[default]
    None,
    /// End the response cleanly, as a watch timeout would.
    Clean,
    /// Abort the response mid-stream, as a crashed server would.
    Abort,
}

/// Commands to the accept loop.
pub(crate) enum Control {
    /// Close the listener (and every connection) for a while.
    Refuse(Duration, oneshot::Sender<()>),
}

/// The fault switches of one running server. Cheap to clone.
#[derive(Clone)]
pub struct Faults {
    inner: Arc<FaultState>,
}

pub(crate) struct FaultState {
    store: Arc<Store>,
    fail_armed: AtomicBool,
    fail: Mutex<(u64, Failure)>,
    latency_micros: AtomicU64,
    conflicts_armed: AtomicBool,
    conflicts: Mutex<HashMap<(String, String, String), u32>>,
    watch_close: watch::Sender<(u64, WatchClose)>,
    control: mpsc::UnboundedSender<Control>,
    replace_failures_armed: AtomicBool,
    replace_failures: Mutex<Vec<ReplaceFailure>>,
}

/// Replaces of one object to refuse while their new body matches.
struct ReplaceFailure {
    object: (String, String, String),
    left: u32,
    matches: Box<dyn Fn(&serde_json::Value) -> bool + Send + Sync>,
}

impl Faults {
    pub(crate) fn new(store: Arc<Store>, control: mpsc::UnboundedSender<Control>) -> Self {
        let (watch_close, _) = watch::channel((0, WatchClose::None));
        Faults {
            inner: Arc::new(FaultState {
                store,
                fail_armed: AtomicBool::new(false),
                fail: Mutex::new((0, Failure::Internal)),
                latency_micros: AtomicU64::new(0),
                conflicts_armed: AtomicBool::new(false),
                conflicts: Mutex::new(HashMap::new()),
                watch_close,
                control,
                replace_failures_armed: AtomicBool::new(false),
                replace_failures: Mutex::new(Vec::new()),
            }),
        }
    }

    /// End every open watch now, cleanly (clients see the stream end and
    /// re-watch from their last resourceVersion).
    pub fn close_watches(&self) {
        self.signal_watches(WatchClose::Clean);
    }

    pub(crate) fn signal_watches(&self, how: WatchClose) {
        self.inner.watch_close.send_modify(|(epoch, kind)| {
            *epoch += 1;
            *kind = how;
        });
    }

    pub(crate) fn watch_close_rx(&self) -> watch::Receiver<(u64, WatchClose)> {
        self.inner.watch_close.subscribe()
    }

    /// Fail the next `n` Kubernetes API requests with `failure`.
    pub fn fail_next(&self, n: u64, failure: Failure) {
        *self.inner.fail.lock().unwrap_or_else(|e| e.into_inner()) = (n, failure);
        self.inner.fail_armed.store(n > 0, Ordering::SeqCst);
    }

    /// Fail the next `n` replaces (PUT) of one object whose new body
    /// matches `matches` with a 500, leaving every other request alone:
    /// one kind of write can fail while the rest of the client works.
    pub fn fail_replaces_where(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        n: u32,
        matches: impl Fn(&serde_json::Value) -> bool + Send + Sync + 'static,
    ) {
        if n == 0 {
            return;
        }
        let mut f = self
            .inner
            .replace_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        f.push(ReplaceFailure {
            object: (resource.into(), namespace.into(), name.into()),
            left: n,
            matches: Box::new(matches),
        });
        self.inner
            .replace_failures_armed
            .store(true, Ordering::SeqCst);
    }

    /// Armed replace failures not yet consumed.
    pub fn replace_failures_left(&self) -> u32 {
        self.inner
            .replace_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|r| r.left)
            .sum()
    }

    /// Consume an armed replace failure matching this write, if any.
    pub(crate) fn take_replace_failure(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        body: &serde_json::Value,
    ) -> bool {
        if !self.inner.replace_failures_armed.load(Ordering::Relaxed) {
            return false;
        }
        let mut f = self
            .inner
            .replace_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let hit = f.iter_mut().find(|r| {
            r.left > 0
                && r.object.0 == resource
                && r.object.1 == namespace
                && r.object.2 == name
                && (r.matches)(body)
        });
        let Some(hit) = hit else { return false };
        hit.left -= 1;
        f.retain(|r| r.left > 0);
        if f.is_empty() {
            self.inner
                .replace_failures_armed
                .store(false, Ordering::SeqCst);
        }
        true
    }

    /// Add `latency` before every Kubernetes API request is handled (zero to stop).
    pub fn set_latency(&self, latency: Duration) {
        self.inner
            .latency_micros
            .store(latency.as_micros() as u64, Ordering::SeqCst);
    }

    /// Drop all kept history now: the next watch or exact list from an older
    /// resourceVersion gets 410 Expired.
    pub fn compact_history(&self) {
        self.inner.store.compact();
    }

    /// Stop serving for `duration`: the listening socket is closed (new
    /// connections are refused), every open connection is closed and open
    /// watches are aborted. Returns once the socket is closed.
    pub async fn refuse_connections(&self, duration: Duration) {
        let (tx, rx) = oneshot::channel();
        if self
            .inner
            .control
            .send(Control::Refuse(duration, tx))
            .is_ok()
        {
            let _ = rx.await;
        }
    }

    /// Answer the next write (update, patch or delete) to the named object with
    /// 409 Conflict. `resource` is the plural name, e.g. `leases`; use an
    /// empty namespace for cluster-scoped objects.
    pub fn conflict_next_write(&self, resource: &str, namespace: &str, name: &str) {
        let mut c = self
            .inner
            .conflicts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *c.entry((resource.into(), namespace.into(), name.into()))
            .or_default() += 1;
        self.inner.conflicts_armed.store(true, Ordering::SeqCst);
    }

    /// Clear failures, latency and forced conflicts.
    pub fn reset(&self) {
        self.fail_next(0, Failure::Internal);
        self.set_latency(Duration::ZERO);
        self.inner
            .conflicts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.inner.conflicts_armed.store(false, Ordering::SeqCst);
        self.inner
            .replace_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.inner
            .replace_failures_armed
            .store(false, Ordering::SeqCst);
    }

    /// The injected latency for a request, if any.
    pub(crate) fn latency(&self) -> Option<Duration> {
        match self.inner.latency_micros.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Consume one injected failure, if armed.
    pub(crate) fn take_failure(&self) -> Option<ApiError> {
        if !self.inner.fail_armed.load(Ordering::Relaxed) {
            return None;
        }
        let mut f = self.inner.fail.lock().unwrap_or_else(|e| e.into_inner());
        if f.0 == 0 {
            return None;
        }
        f.0 -= 1;
        if f.0 == 0 {
            self.inner.fail_armed.store(false, Ordering::SeqCst);
        }
        Some(match f.1 {
            Failure::Internal => ApiError::internal("injected fault"),
            Failure::TooManyRequests {
                retry_after_seconds,
            } => ApiError::too_many_requests(retry_after_seconds),
        })
    }

    /// Consume a forced conflict for this object, if one is armed.
    pub(crate) fn take_conflict(&self, resource: &str, namespace: &str, name: &str) -> bool {
        if !self.inner.conflicts_armed.load(Ordering::Relaxed) {
            return false;
        }
        let mut c = self
            .inner
            .conflicts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = (
            resource.to_string(),
            namespace.to_string(),
            name.to_string(),
        );
        let hit = match c.get_mut(&key) {
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    c.remove(&key);
                }
                true
            }
            None => false,
        };
        if c.is_empty() {
            self.inner.conflicts_armed.store(false, Ordering::SeqCst);
        }
        hit
    }
}

/// Body of `POST /_faults/fail`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FailRequest {
    pub count: u64,
    #[serde(default = "default_code")]
    pub code: u16,
    #[serde(default = "default_retry")]
    pub retry_after_seconds: u32,
}

fn default_code() -> u16 {
    500
}

fn default_retry() -> u32 {
    1
}

/// Body of `POST /_faults/latency` and `/_faults/refuse`.
#[derive(Debug, Deserialize)]
pub(crate) struct DurationRequest {
    pub millis: u64,
}

/// Body of `POST /_faults/conflict`.
#[derive(Debug, Deserialize)]
pub(crate) struct ConflictRequest {
    pub resource: String,
    #[serde(default)]
    pub namespace: String,
    pub name: String,
}
