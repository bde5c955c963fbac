//! Watch streams: newline-delimited JSON events over a chunked response.
//!
//! A watch is a task that owns a broadcast receiver from the store and writes
//! event lines into a small bounded channel that backs the response body.
//! Replayed history or synthetic ADDED events go first, then live changes.
//! Events that arrive together are coalesced into one chunk; a chunk is
//! handed to hyper as soon as it is ready (hyper flushes when the body has
//! nothing more to give). A watch that falls behind the broadcast buffer is
//! closed, as kube-apiserver closes slow watchers; the client re-watches from
//! its last resourceVersion.

use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};

use crate::error::ApiError;
use crate::faults::WatchClose;
use crate::resources::{RESOURCES, ResourceId};
use crate::selector::Selectors;
use crate::store::{Change, ChangeType, WatchStart, bookmark_object, event_line};

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// Synthetic ADDED events for the current state, then changes.
    Current,
    /// No synthetic events: only changes after the current version.
    CurrentNoInitial,
    /// Every change after this resourceVersion.
    After(u64),
}

/// A parsed watch request.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    pub resource: ResourceId,
    pub namespace: Option<String>,
    pub selectors: Selectors,
    pub start: StartAt,
    pub bookmarks: bool,
    /// Send the `k8s.io/initial-events-end` bookmark after the synthetic events.
    pub initial_events_end: bool,
    pub timeout: Option<Duration>,
}

/// The chunk stream backing a watch response body.
pub type Chunks = mpsc::Receiver<Result<Bytes, io::Error>>;

const FLUSH_AT: usize = 64 * 1024;
const DRAIN_MAX: usize = 512;

/// A finished watch response with a single ERROR event (410 Expired etc.).
pub fn error_stream(err: &ApiError) -> Chunks {
    let (tx, rx) = mpsc::channel(1);
    let line = event_line("ERROR", &err.status());
    tx.try_send(Ok(line)).expect("fresh channel has room");
    rx
}

/// Start a watch from `start` (taken atomically by the store) and return the
/// chunk stream; the watch runs on its own task until the client goes away,
/// the timeout passes or a fault closes it.
pub fn spawn(
    req: WatchRequest,
    start: WatchStart,
    bookmark_interval: Duration,
    close: watch::Receiver<(u64, WatchClose)>,
) -> Chunks {
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(run(req, start, bookmark_interval, close, tx));
    rx
}

struct Filter {
    resource: ResourceId,
    namespace: Option<String>,
    selectors: Selectors,
    trivial: bool,
}

impl Filter {
    fn in_scope(&self, c: &Change) -> bool {
        c.resource == self.resource && self.namespace.as_ref().is_none_or(|n| *n == c.namespace)
    }

    /// Append the event `c` means for this watch, if any.
    fn append(&self, c: &Change, buf: &mut BytesMut) {
        if !self.in_scope(c) {
            return;
        }
        if self.trivial {
            buf.extend_from_slice(c.line());
            return;
        }
        let now = self.selectors.matches(&c.object);
        let before = c.prev.as_deref().is_some_and(|p| self.selectors.matches(p));
        let kind = match c.kind {
            ChangeType::Added if now => ChangeType::Added,
            ChangeType::Modified if now && before => ChangeType::Modified,
            ChangeType::Modified if now => ChangeType::Added,
            ChangeType::Modified if before => ChangeType::Deleted,
            ChangeType::Deleted if before || now => ChangeType::Deleted,
            _ => return,
        };
        if kind == c.kind {
            buf.extend_from_slice(c.line());
        } else {
            buf.extend_from_slice(&event_line(kind.as_str(), &c.object));
        }
    }
}

fn bookmark(resource: ResourceId, rv: u64, initial_end: bool) -> Bytes {
    let rt = &RESOURCES[resource];
    event_line(
        "BOOKMARK",
        &bookmark_object(&rt.api_version(), rt.kind, rv, initial_end),
    )
}

async fn send(tx: &mpsc::Sender<Result<Bytes, io::Error>>, buf: &mut BytesMut) -> bool {
    if buf.is_empty() {
        return true;
    }
    tx.send(Ok(buf.split().freeze())).await.is_ok()
}

async fn run(
    req: WatchRequest,
    start: WatchStart,
    bookmark_interval: Duration,
    mut close: watch::Receiver<(u64, WatchClose)>,
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
) {
    close.mark_unchanged();
    let filter = Filter {
        resource: req.resource,
        namespace: req.namespace.clone(),
        trivial: req.selectors.labels.is_empty() && req.selectors.fields.is_empty(),
        selectors: req.selectors,
    };
    let WatchStart {
        initial,
        replay,
        rv: mut last_rv,
        mut rx,
    } = start;
    let mut buf = BytesMut::with_capacity(8 * 1024);
    for obj in &initial {
        if filter
            .namespace
            .as_ref()
            .is_some_and(|n| obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(n))
            || !filter.selectors.matches(obj)
        {
            continue;
        }
        buf.extend_from_slice(&event_line("ADDED", obj));
        if buf.len() >= FLUSH_AT && !send(&tx, &mut buf).await {
            return;
        }
    }
    drop(initial);
    if req.initial_events_end {
        buf.extend_from_slice(&bookmark(req.resource, last_rv, true));
    }
    for c in &replay {
        last_rv = last_rv.max(c.rv);
        filter.append(c, &mut buf);
        if buf.len() >= FLUSH_AT && !send(&tx, &mut buf).await {
            return;
        }
    }
    drop(replay);
    if !send(&tx, &mut buf).await {
        return;
    }

    let deadline = req.timeout.map(|t| Instant::now() + t);
    let mut ticker =
        tokio::time::interval_at(Instant::now() + bookmark_interval, bookmark_interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            changed = close.changed() => {
                let how = if changed.is_ok() { close.borrow_and_update().1 } else { WatchClose::Abort };
                if how == WatchClose::Abort {
                    let _ = tx.send(Err(io::Error::other("watch aborted"))).await;
                }
                return;
            }
            _ = tx.closed() => return,
            _ = sleep_until_opt(deadline) => {
                if req.bookmarks {
                    buf.extend_from_slice(&bookmark(req.resource, last_rv, false));
                    send(&tx, &mut buf).await;
                }
                return;
            }
            _ = ticker.tick(), if req.bookmarks => {
                buf.extend_from_slice(&bookmark(req.resource, last_rv, false));
                if !send(&tx, &mut buf).await {
                    return;
                }
            }
            r = rx.recv() => {
                let mut next = r;
                let mut n = 0;
                loop {
                    match next {
                        Ok(c) => {
                            if c.rv > last_rv {
                                last_rv = c.rv;
                                filter.append(&c, &mut buf);
                            }
                        }
                        // Too slow to keep up: end the watch like kube-apiserver
                        // does; the client resumes from its last version.
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            send(&tx, &mut buf).await;
                            return;
                        }
                        Err(broadcast::error::RecvError::Closed) => {
                            send(&tx, &mut buf).await;
                            return;
                        }
                    }
                    n += 1;
                    if n >= DRAIN_MAX || buf.len() >= FLUSH_AT {
                        break;
                    }
                    next = match rx.try_recv() {
                        Ok(c) => Ok(c),
                        Err(broadcast::error::TryRecvError::Lagged(k)) => Err(broadcast::error::RecvError::Lagged(k)),
                        Err(broadcast::error::TryRecvError::Closed) => Err(broadcast::error::RecvError::Closed),
                        Err(broadcast::error::TryRecvError::Empty) => break,
                    };
                }
                if !send(&tx, &mut buf).await {
                    return;
                }
            }
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
