//! Watch streams: newline-delimited JSON events over a chunked response.
//!
//! A watch is a pull-based stream polled by the connection's hyper task: it
//! owns a broadcast receiver from the store, and each poll yields the next
//! chunk. Replayed history or synthetic ADDED events go first, then live
//! changes. Changes that are already waiting are coalesced into one chunk; a
//! chunk goes to the socket as soon as it is ready (hyper flushes when the
//! body has nothing more to give). A watch that falls behind the broadcast
//! buffer is closed, as kube-apiserver closes slow watchers; the client
//! re-watches from its last resourceVersion. A watch on a custom resource
//! ends (cleanly) when its CRD is deleted, after the DELETED events of the
//! objects that went with it.

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
use crate::resources::{RESOURCES, ResourceId, crds_id};
use crate::selector::Selectors;
use crate::store::{Change, ChangeType, WatchGuard, WatchStart, bookmark_object, event_line};
use crate::table::{self, Include, TableRequest};

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
    /// Send each event's object as a Table (`kubectl get -w`).
    pub table: Option<TableRequest>,
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
    /// Render each event's object as a Table of one row.
    table: Option<TableRequest>,
    /// Like kube-apiserver, only the first Table carries column definitions.
    headers_sent: bool,
}

impl Filter {
    fn in_scope(&self, c: &Change) -> bool {
        c.resource == self.resource && self.namespace.as_ref().is_none_or(|n| *n == c.namespace)
    }

    /// Append the event `c` means for this watch, if any.
    fn append(&mut self, c: &Change, buf: &mut BytesMut) {
        if !self.in_scope(c) {
            return;
        }
        let kind = if self.trivial {
            c.kind
        } else {
            let now = self.selectors.matches(&c.object);
            let before = c.prev.as_deref().is_some_and(|p| self.selectors.matches(p));
            match c.kind {
                ChangeType::Added if now => ChangeType::Added,
                ChangeType::Modified if now && before => ChangeType::Modified,
                ChangeType::Modified if now => ChangeType::Added,
                ChangeType::Modified if before => {
                    // An object leaving the selector: kube-apiserver's cacher
                    // sends its previous state (the one that still matched)
                    // stamped with the update's resourceVersion.
                    let prev = c.prev.as_deref().expect("matched before");
                    self.push("DELETED", &left_selector(prev, c.rv), buf);
                    return;
                }
                ChangeType::Deleted if before || now => ChangeType::Deleted,
                _ => return,
            }
        };
        if kind == c.kind && self.table.is_none() {
            buf.extend_from_slice(c.line());
        } else {
            self.push(kind.as_str(), &c.object, buf);
        }
    }

    /// Append one event with `object`, as a Table if the watch asked for one.
    fn push(&mut self, kind: &str, object: &Value, buf: &mut BytesMut) {
        let Some(mut req) = self.table else {
            buf.extend_from_slice(&event_line(kind, object));
            return;
        };
        // The initial-events-end bookmark keeps its annotation visible.
        if kind == "BOOKMARK"
            && object
                .pointer("/metadata/annotations/k8s.io~1initial-events-end")
                .is_some()
        {
            req.include = Include::Metadata;
        }
        let t = table::object(&RESOURCES[self.resource], object, req, !self.headers_sent);
        self.headers_sent = true;
        buf.extend_from_slice(&event_line(kind, &t));
    }

    fn bookmark(&mut self, rv: u64, initial_end: bool, buf: &mut BytesMut) {
        let rt = &RESOURCES[self.resource];
        let obj = bookmark_object(&rt.api_version(), rt.kind, rv, initial_end);
        self.push("BOOKMARK", &obj, buf);
    }
}

/// The object a selector watch's DELETED carries when a change takes it out
/// of the selector: its previous state at the change's resourceVersion.
fn left_selector(prev: &Value, rv: u64) -> Value {
    let mut o = prev.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
    o
}

/// A running watch.
struct WatchState {
    filter: Filter,
    /// For a custom resource: the name of its CRD, whose deletion ends the
    /// watch (the resource is no longer served).
    crd: Option<String>,
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
    let mut filter = Filter {
        resource: req.resource,
        namespace: req.namespace.clone(),
        trivial: req.selectors.labels.is_empty() && req.selectors.fields.is_empty(),
        selectors: req.selectors,
        table: req.table,
        headers_sent: false,
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
        filter.push("ADDED", obj, &mut buf);
        if buf.len() >= FLUSH_AT {
            pending.push_back(buf.split().freeze());
        }
    }
    if req.initial_events_end {
        filter.bookmark(last_rv, true, &mut buf);
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
    let rt = &RESOURCES[filter.resource];
    let state = WatchState {
        crd: rt.custom.then(|| rt.qualified()),
        filter,
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

    /// The change deletes the CRD of this watch's resource.
    fn unserves(&self, c: &Change) -> bool {
        self.crd.as_deref().is_some_and(|n| {
            c.kind == ChangeType::Deleted
                && c.resource == crds_id()
                && c.object.pointer("/metadata/name").and_then(Value::as_str) == Some(n)
        })
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
                        self.filter.bookmark(self.last_rv, false, &mut self.buf);
                    }
                    return self.take();
                }
                _ = self.ticker.tick(), if self.bookmarks => {
                    self.filter.bookmark(self.last_rv, false, &mut self.buf);
                    return self.take();
                }
                r = self.rx.recv() => {
                    let mut next = r;
                    let mut n = 0;
                    loop {
                        match next {
                            Ok(c) => {
                                if self.unserves(&c) {
                                    self.done = true;
                                    return self.take();
                                }
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
