//! Fault injection: the switches reliability tests flip, available both on
//! the [`Faults`] handle and over HTTP under `/_faults/...`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::{mpsc, oneshot, watch};

use crate::audit::Request;
use crate::error::ApiError;
use crate::resources::RESOURCES;
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

/// One request to answer with a fault: the `skip + 1`-th request matching
/// the filter (verb, resource, namespace, name prefix) gets `answer`. Armed
/// with [`Faults::fail_nth`], or `POST /_faults/request` with these fields in
/// camelCase: `{"verb": "update", "resource": "leases", "namespace": "ns",
/// "namePrefix": "x-", "skip": 2, "answer": {"status": 403}}` (`answer` is
/// `{"status": code}`, `"drop"` or `"dropAfter"`; only `resource` and
/// `answer` are required).
///
/// Requests are described as Kubernetes authorization sees them (the
/// [`crate::audit`] log's verb, resource, namespace and name).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestFault {
    /// The verb as RBAC names it: get, list, watch, create, update, patch,
    /// delete, deletecollection. `None`: any verb.
    #[serde(default)]
    pub verb: Option<String>,
    /// The resource as an RBAC rule names it: the plural (`leases`), or
    /// `plural/subresource` (`deployments/status`) for a subresource (the
    /// plural alone does not match subresource requests).
    pub resource: String,
    /// `None`: any namespace (and cluster-scoped objects).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Matches when the object's name starts with it: the name in the path
    /// (or a list's `metadata.name=` field selector); for a create the
    /// body's `metadata.name` (or, without one, its `metadata.generateName`).
    /// A request without a name (a list, a collection) does not match.
    /// `None`: any name, and requests without one.
    #[serde(default)]
    pub name_prefix: Option<String>,
    /// How many matching requests are let through before the one answered.
    #[serde(default)]
    pub skip: u32,
    pub answer: FaultAnswer,
}

/// How a [`RequestFault`] answers the request it catches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FaultAnswer {
    /// Answer with this status instead of applying the request, with the
    /// `Status` body kube-apiserver sends: 403 Forbidden (an RBAC denial of
    /// `system:anonymous`), 409 Conflict, 500 InternalError or 503
    /// ServiceUnavailable. Other codes are refused.
    Status(u16),
    /// Close the connection without answering, and without applying the
    /// request (its body is read first).
    Drop,
    /// Apply the request, then close the connection without sending the
    /// answer: the client cannot know whether the write happened.
    DropAfter,
}

impl RequestFault {
    /// Why this rule cannot be armed, if it cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        if let FaultAnswer::Status(code) = self.answer
            && !matches!(code, 403 | 409 | 500 | 503)
        {
            return Err(format!(
                "unsupported status {code}: use 403, 409, 500 or 503"
            ));
        }
        if let Some(v) = &self.verb
            && !matches!(
                v.as_str(),
                "get"
                    | "list"
                    | "watch"
                    | "create"
                    | "update"
                    | "patch"
                    | "delete"
                    | "deletecollection"
            )
        {
            return Err(format!("unknown verb {v:?}"));
        }
        Ok(())
    }

    fn matches(&self, r: &Request, name: Option<&str>) -> bool {
        self.verb.as_ref().is_none_or(|v| *v == r.verb)
            && self.resource == r.rbac_resource()
            && (self.namespace.is_none() || self.namespace == r.namespace)
            && self
                .name_prefix
                .as_ref()
                .is_none_or(|p| name.is_some_and(|n| n.starts_with(p.as_str())))
    }
}

/// The error a [`FaultAnswer::Status`] answers `r` with; `name` is the
/// object's (for a create, from the body).
pub(crate) fn injected_status(code: u16, r: &Request, name: Option<&str>) -> ApiError {
    match code {
        // kube-apiserver's authorizer sees no name in a create's path.
        403 => ApiError::forbidden(r, "system:anonymous"),
        409 => match RESOURCES
            .iter()
            .find(|t| t.group == r.group && t.plural == r.resource)
        {
            Some(rt) => ApiError::conflict(rt, name.unwrap_or_default()),
            None => ApiError::internal("injected fault"),
        },
        503 => ApiError::service_unavailable(),
        _ => ApiError::internal("injected fault"),
    }
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
    request_faults_armed: AtomicBool,
    request_faults: Mutex<Vec<RequestFault>>,
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
                request_faults_armed: AtomicBool::new(false),
                request_faults: Mutex::new(Vec::new()),
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

    /// Answer the `rule.skip + 1`-th request matching `rule` with
    /// `rule.answer` (see [`RequestFault`], [`FaultAnswer`]); the rule is
    /// consumed when it fires. Several rules may be armed: every matching
    /// request counts toward each rule it matches, and when several are due
    /// on the same request the oldest answers it while the others stay due
    /// for the next. Requests answered by [`Self::fail_next`] are not
    /// counted. Answered requests are in the request log with their status,
    /// or with code 0 when the connection was dropped.
    ///
    /// # Panics
    ///
    /// On a status other than 403, 409, 500, 503 or an unknown verb.
    pub fn fail_nth(&self, rule: RequestFault) {
        if let Err(e) = rule.check() {
            panic!("fail_nth: {e}");
        }
        self.inner
            .request_faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(rule);
        self.inner
            .request_faults_armed
            .store(true, Ordering::SeqCst);
    }

    /// Rules armed with [`Self::fail_nth`] that have not fired yet.
    pub fn request_faults_left(&self) -> usize {
        self.inner
            .request_faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Whether any [`Self::fail_nth`] rule is armed.
    pub(crate) fn request_faults_armed(&self) -> bool {
        self.inner.request_faults_armed.load(Ordering::Relaxed)
    }

    /// Count request `r` against the armed rules and consume the one due to
    /// answer it, if any. `name` is the object's (for a create, the body's).
    pub(crate) fn take_request_fault(
        &self,
        r: &Request,
        name: Option<&str>,
    ) -> Option<FaultAnswer> {
        if !self.request_faults_armed() {
            return None;
        }
        let mut rules = self
            .inner
            .request_faults
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut due = None;
        for (i, rule) in rules.iter_mut().enumerate() {
            if !rule.matches(r, name) {
                continue;
            }
            if rule.skip > 0 {
                rule.skip -= 1;
            } else if due.is_none() {
                due = Some(i);
            }
        }
        let answer = rules.remove(due?).answer;
        if rules.is_empty() {
            self.inner
                .request_faults_armed
                .store(false, Ordering::SeqCst);
        }
        Some(answer)
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

    /// Clear failures, latency, forced conflicts and [`Self::fail_nth`] rules.
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
        self.inner
            .request_faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.inner
            .request_faults_armed
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
