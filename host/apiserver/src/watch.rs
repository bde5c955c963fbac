//! Watch streams: newline-delimited JSON events over a chunked response.
//!
//! A watch is a pull-based stream polled by the connection's hyper task: it
//! owns a broadcast receiver from the store, and each poll yields the next
//! chunk. Replayed history or synthetic ADDED events go first, then live
//! changes. Changes that are already waiting are coalesced into one chunk; a
//! chunk goes to the socket as soon as it is ready (hyper flushes when the
//! body has nothing more to give). A watch that falls behind the broadcast
//! buffer is closed, as kube-apiserver closes slow watchers; the client
//! re-watches from its last resourceVersion.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use serde_json::Value;
use tokio::sync::{broadcast, watch};
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::error::ApiError;
use crate::faults::WatchClose;
use crate::resources::{RESOURCES, ResourceId};
use crate::selector::Selectors;
use crate::store::{Change, ChangeType, WatchGuard, WatchStart, bookmark_object, event_line};

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
pub type Chunks = Pin<Box<dyn Stream<Item = Result<Bytes, io::Error>> + Send>>;

const FLUSH_AT: usize = 64 * 1024;
const DRAIN_MAX: usize = 512;

/// A finished watch response with a single ERROR event (410 Expired etc.).
pub fn error_stream(err: &ApiError) -> Chunks {
    let line = event_line("ERROR", &err.status());
    Box::pin(futures_util::stream::iter([Ok(line)]))
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

/// A running watch.
struct WatchState {
    filter: Filter,
    resource: ResourceId,
    bookmarks: bool,
    rx: broadcast::Receiver<std::sync::Arc<Change>>,
    last_rv: u64,
    /// Chunks rendered up front (synthetic events, replay).
    pending: VecDeque<Bytes>,
    deadline: Option<Instant>,
    ticker: Interval,
    close: watch::Receiver<(u64, WatchClose)>,
    buf: BytesMut,
    done: bool,
    _guard: WatchGuard,
}

/// Start a watch from `start` (taken atomically by the store) and return the
/// chunk stream. It ends when the client goes away, the timeout passes or a
/// fault closes it.
pub fn stream(
    req: WatchRequest,
    start: WatchStart,
    bookmark_interval: Duration,
    mut close: watch::Receiver<(u64, WatchClose)>,
) -> Chunks {
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
        rx,
        guard,
    } = start;
    let mut pending = VecDeque::new();
    let mut buf = BytesMut::with_capacity(8 * 1024);
    for obj in &initial {
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str);
        if filter.namespace.as_deref().is_some_and(|n| ns != Some(n))
            || !filter.selectors.matches(obj)
        {
            continue;
        }
        buf.extend_from_slice(&event_line("ADDED", obj));
        if buf.len() >= FLUSH_AT {
            pending.push_back(buf.split().freeze());
        }
    }
    if req.initial_events_end {
        buf.extend_from_slice(&bookmark(req.resource, last_rv, true));
    }
    for c in &replay {
        last_rv = last_rv.max(c.rv);
        filter.append(c, &mut buf);
        if buf.len() >= FLUSH_AT {
            pending.push_back(buf.split().freeze());
        }
    }
    if !buf.is_empty() {
        pending.push_back(buf.split().freeze());
    }
    let mut ticker =
        tokio::time::interval_at(Instant::now() + bookmark_interval, bookmark_interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let state = WatchState {
        filter,
        resource: req.resource,
        bookmarks: req.bookmarks,
        rx,
        last_rv,
        pending,
        deadline: req.timeout.map(|t| Instant::now() + t),
        ticker,
        close,
        buf,
        done: false,
        _guard: guard,
    };
    Box::pin(futures_util::stream::unfold(state, |mut s| async move {
        let item = s.next_chunk().await?;
        Some((item, s))
    }))
}

impl WatchState {
    fn take(&mut self) -> Option<Result<Bytes, io::Error>> {
        (!self.buf.is_empty()).then(|| Ok(self.buf.split().freeze()))
    }

    /// The next chunk, or None when the watch is over.
    async fn next_chunk(&mut self) -> Option<Result<Bytes, io::Error>> {
        if let Some(b) = self.pending.pop_front() {
            return Some(Ok(b));
        }
        if self.done {
            return None;
        }
        loop {
            tokio::select! {
                biased;
                changed = self.close.changed() => {
                    self.done = true;
                    let how = if changed.is_ok() { self.close.borrow_and_update().1 } else { WatchClose::Abort };
                    return (how == WatchClose::Abort).then(|| Err(io::Error::other("watch aborted")));
                }
                _ = sleep_until_opt(self.deadline) => {
                    self.done = true;
                    if self.bookmarks {
                        self.buf.extend_from_slice(&bookmark(self.resource, self.last_rv, false));
                    }
                    return self.take();
                }
                _ = self.ticker.tick(), if self.bookmarks => {
                    self.buf.extend_from_slice(&bookmark(self.resource, self.last_rv, false));
                    return self.take();
                }
                r = self.rx.recv() => {
                    let mut next = r;
                    let mut n = 0;
                    loop {
                        match next {
                            Ok(c) => {
                                if c.rv > self.last_rv {
                                    self.last_rv = c.rv;
                                    self.filter.append(&c, &mut self.buf);
                                }
                            }
                            // Lagged: too slow to keep up, end the watch like
                            // kube-apiserver does; the client resumes from its
                            // last version. Closed: the server is going away.
                            Err(_) => {
                                self.done = true;
                                return self.take();
                            }
                        }
                        n += 1;
                        if n >= DRAIN_MAX || self.buf.len() >= FLUSH_AT {
                            break;
                        }
                        next = match self.rx.try_recv() {
                            Ok(c) => Ok(c),
                            Err(broadcast::error::TryRecvError::Empty) => break,
                            Err(broadcast::error::TryRecvError::Lagged(k)) => {
                                Err(broadcast::error::RecvError::Lagged(k))
                            }
                            Err(broadcast::error::TryRecvError::Closed) => {
                                Err(broadcast::error::RecvError::Closed)
                            }
                        };
                    }
                    if let Some(chunk) = self.take() {
                        return Some(chunk);
                    }
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
