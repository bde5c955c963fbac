//! Lease leader election, client-go style, on `Api<Lease>`.
//!
//! - A candidate reads the Lease every `retry_period`. The holder's lease is
//!   judged expired on the local monotonic clock: `lease_duration` after this
//!   replica last *observed a change* of the record, never by comparing
//!   `renewTime` with the local wall clock (clocks differ between nodes).
//! - Every write is a `replace` carrying the `resourceVersion` read, so two
//!   candidates racing for an expired lease cannot both win: one gets 409.
//! - Taking over from another holder (or an empty one) increments
//!   `leaseTransitions`; the holder, the transitions count and the Lease's
//!   UID form the leadership [`Term`], which fences checkpoint writes of a
//!   stale leader.
//! - The leader renews every `retry_period`; once `renew_deadline` passes
//!   without a successful renew it stops leading by itself, before any other
//!   replica can consider the lease expired (`lease_duration > renew_deadline`).
//! - On shutdown the leader releases: holder cleared, duration 1 s.
//! - Candidates also watch the Lease, so a release is acted on at once rather
//!   at the next retry.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;

use crate::apis::LeaseApi;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// Timing and identity of one elector.
#[derive(Debug, Clone)]
pub struct ElectorConfig {
    pub namespace: String,
    pub lease_name: String,
    /// This replica's identity: the pod name.
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl ElectorConfig {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: &str, lease_name: &str, identity: &str) -> Self {
        ElectorConfig {
            namespace: namespace.into(),
            lease_name: lease_name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// lease duration > renew deadline > 1.2 x retry period, and an identity.
    pub fn validate(&self) -> Result<(), String> {
        if self.identity.is_empty() {
            return Err("leader election identity must not be empty".into());
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "lease duration ({:?}) must be greater than the renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= 1.2 * self.retry_period.as_secs_f64() {
            return Err(format!(
                "renew deadline ({:?}) must be greater than 1.2 x the retry period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration.as_secs() < 1 {
            return Err("lease duration must be at least 1s".into());
        }
        Ok(())
    }
}

/// The identity from `POD_NAME`, else the host name.
pub fn default_identity() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "wasmwatch".into())
}

/// One leadership term: who holds the lease, its transitions count when
/// they took it, and the Lease's UID: a Lease deleted and created again
/// starts counting transitions from 0, so counts compare only within one
/// Lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Term {
    pub holder: String,
    pub transitions: i32,
    /// The leader Lease's `metadata.uid`; empty when unknown.
    pub lease_uid: String,
}

/// What this replica knows about leadership, published on every change.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leadership {
    /// This replica leads now and may act.
    pub leading: bool,
    /// Our term while leading.
    pub term: Option<Term>,
    /// The holder last observed (ourselves included); `None` when free.
    pub holder: Option<String>,
}

/// Whether this replica may act right now: only while it leads and before the
/// renew deadline counted from the start of its last successful renew.
/// Executors check it before every action, and `/leader` answers from it. A
/// replica that was paused (GC, SIGSTOP, a stalled node) sees its deadline
/// passed the moment it wakes, on the monotonic clock, before its elector
/// has even run again.
///
/// It is the one value for "may this replica act": the term it leads in and
/// until when, set and cleared together. A term of leader work holds the
/// [`Acting`] it started with and asks [`Fence::still`]: once the fence has
/// closed, even briefly, that stretch is over for good (a renew that opens
/// it again opens a new stretch), so work given up while it was closed can
/// never be forgotten by a term that goes on.
#[derive(Clone, Debug, Default)]
pub struct Fence {
    state: Arc<Mutex<FenceState>>,
}

#[derive(Debug, Default)]
struct FenceState {
    acting: Option<(Term, Instant)>,
    /// Stretches opened so far.
    opened: u64,
}

/// One stretch of acting: from the fence opening in a term to its closing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acting {
    pub term: Term,
    stretch: u64,
}

impl Fence {
    pub fn may_act(&self) -> bool {
        self.acting().is_some()
    }

    /// The stretch this replica may act in now, if any.
    pub fn acting(&self) -> Option<Acting> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .acting
            .as_ref()
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(term, _)| Acting {
                term: term.clone(),
                stretch: state.opened,
            })
    }

    /// Whether `acting` goes on: the fence is open and has not closed since.
    pub fn still(&self, acting: &Acting) -> bool {
        self.acting().as_ref() == Some(acting)
    }

    fn set(&self, acting: Option<(Term, Instant)>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let open_in = |a: &Option<(Term, Instant)>| {
            a.as_ref()
                .filter(|(_, until)| now < *until)
                .map(|(t, _)| t.clone())
        };
        let before = open_in(&state.acting);
        let after = open_in(&acting);
        if after.is_some() && before != after {
            state.opened += 1;
        }
        state.acting = acting;
    }
}

/// The parts of a Lease record that matter for election.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRecord {
    pub holder: String,
    pub lease_duration_seconds: i32,
    pub acquire_time: Option<MicroTime>,
    pub renew_time: Option<MicroTime>,
    pub transitions: i32,
}

impl LeaseRecord {
    pub fn from_lease(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        LeaseRecord {
            holder: spec.holder_identity.unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
            acquire_time: spec.acquire_time,
            renew_time: spec.renew_time,
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// Tracks the Lease record and when it last changed, on the local
/// monotonic clock.
#[derive(Debug, Default)]
pub struct Observer {
    last: Option<(LeaseRecord, Instant)>,
}

impl Observer {
    /// Records `record` as seen at `now`; the clock restarts only when the
    /// record differs from the last one observed.
    pub fn observe(&mut self, record: LeaseRecord, now: Instant) {
        match &self.last {
            Some((r, _)) if *r == record => {}
            _ => self.last = Some((record, now)),
        }
    }

    pub fn record(&self) -> Option<&LeaseRecord> {
        self.last.as_ref().map(|(r, _)| r)
    }

    /// Whether `me` may try to take or renew the lease at `now`: it is free,
    /// ours, or its holder's duration has passed since we saw it change.
    pub fn may_acquire(&self, me: &str, now: Instant) -> bool {
        match &self.last {
            None => true,
            Some((r, seen)) => {
                r.holder.is_empty()
                    || r.holder == me
                    || now >= *seen + Duration::from_secs(r.lease_duration_seconds.max(0) as u64)
            }
        }
    }
}

/// Why an election round failed.
#[derive(Debug, thiserror::Error)]
pub enum ElectError {
    /// Someone else wrote the Lease between our read and our write (409).
    #[error("lost the race for the lease")]
    Conflict,
    /// The lease is held and not expired.
    #[error("lease held by {0}")]
    Held(String),
    #[error("api: {0}")]
    Api(#[from] kube::Error),
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// The elector. [`Elector::run`] drives it until shutdown.
pub struct Elector<A = Api<Lease>> {
    api: A,
    config: ElectorConfig,
    observer: Observer,
    /// The Lease as last read or written by us (for its resourceVersion).
    lease: Option<Lease>,
    tx: watch::Sender<Leadership>,
    fence: Fence,
}

impl Elector {
    /// An elector and the channel on which it publishes leadership.
    pub fn new(
        client: kube::Client,
        config: ElectorConfig,
    ) -> Result<(Elector, watch::Receiver<Leadership>), String> {
        let api = Api::namespaced(client, &config.namespace);
        Elector::with_api(api, config)
    }

    /// Runs the election until `shutdown` completes; then releases the lease
    /// if this replica holds it. Leadership changes are published as they
    /// happen; leading stops at the renew deadline if renewing fails. A
    /// candidate also looks again as soon as the Lease changes.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let changed = std::sync::Arc::new(Notify::new());
        let _watch_task = AbortOnDrop(tokio::spawn(watch_lease(
            self.api.clone(),
            self.config.lease_name.clone(),
            changed.clone(),
        )));
        self.run_with(shutdown, changed).await
    }
}

impl<A: LeaseApi> Elector<A> {
    /// An elector on Lease API `api` (kube's, or the simulator's).
    pub fn with_api(
        api: A,
        config: ElectorConfig,
    ) -> Result<(Elector<A>, watch::Receiver<Leadership>), String> {
        config.validate()?;
        let (tx, rx) = watch::channel(Leadership::default());
        Ok((
            Elector {
                api,
                config,
                observer: Observer::default(),
                lease: None,
                tx,
                fence: Fence::default(),
            },
            rx,
        ))
    }

    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.tx.subscribe()
    }

    /// The fence executors check before acting.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// One round: read the Lease and take or renew it if we may.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Term, ElectError> {
        let me = self.config.identity.clone();
        let duration = self.config.lease_duration.as_secs() as i32;
        let current = self.api.get_opt(&self.config.lease_name).await?;
        let now = Instant::now();
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.lease_name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(now_micro()),
                    renew_time: Some(now_micro()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&lease).await {
                Ok(created) => Ok(self.took(created, Instant::now())),
                Err(kube::Error::Api(s)) if s.code == 409 => Err(ElectError::Conflict),
                Err(e) => Err(e.into()),
            };
        };
        let record = LeaseRecord::from_lease(&lease);
        self.observer.observe(record.clone(), now);
        self.lease = Some(lease.clone());
        self.publish_holder(&record.holder);
        if !self.observer.may_acquire(&me, now) {
            return Err(ElectError::Held(record.holder));
        }
        let spec = lease.spec.get_or_insert_with(Default::default);
        if record.holder != me {
            spec.acquire_time = Some(now_micro());
            spec.lease_transitions = Some(record.transitions + 1);
        }
        spec.holder_identity = Some(me);
        spec.lease_duration_seconds = Some(duration);
        spec.renew_time = Some(now_micro());
        match self.api.replace(&self.config.lease_name, &lease).await {
            Ok(written) => Ok(self.took(written, Instant::now())),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(ElectError::Conflict),
            Err(e) => Err(e.into()),
        }
    }

    fn took(&mut self, lease: Lease, now: Instant) -> Term {
        let record = LeaseRecord::from_lease(&lease);
        let term = Term {
            holder: record.holder.clone(),
            transitions: record.transitions,
            lease_uid: lease.metadata.uid.clone().unwrap_or_default(),
        };
        self.observer.observe(record, now);
        self.lease = Some(lease);
        term
    }

    fn publish_holder(&self, holder: &str) {
        let holder = (!holder.is_empty()).then(|| holder.to_string());
        self.tx.send_if_modified(|l| {
            let changed = l.holder != holder;
            l.holder = holder;
            changed
        });
    }

    fn publish(&self, leading: Option<Term>) {
        if leading.is_none() {
            self.fence.set(None);
        }
        let new = Leadership {
            leading: leading.is_some(),
            holder: leading
                .as_ref()
                .map(|t| t.holder.clone())
                .or_else(|| self.tx.borrow().holder.clone()),
            term: leading,
        };
        self.tx.send_if_modified(|l| {
            let changed = *l != new;
            *l = new;
            changed
        });
    }

    /// Releases the lease if we hold it: holder cleared, duration 1 s, so a
    /// successor takes over at once.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.lease.clone() else {
            return Ok(());
        };
        let record = LeaseRecord::from_lease(&lease);
        if record.holder != self.config.identity {
            return Ok(());
        }
        // Stop acting before the lease can pass to anyone else.
        self.publish(None);
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(now_micro());
        spec.renew_time = Some(now_micro());
        let result = self.api.replace(&self.config.lease_name, &lease).await;
        self.publish_holder("");
        result.map(|_| ())
    }

    /// [`Elector::run`], woken early by `changed` (kube's: a watch of the
    /// Lease; the simulator's: never, candidates look every retry period).
    pub async fn run_with(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
        changed: std::sync::Arc<Notify>,
    ) {
        tokio::pin!(shutdown);
        let mut last_renew: Option<Instant> = None;
        // A 409 while leading: someone wrote the Lease between our read and
        // our write (another replica, or a harmless annotation). Look again
        // at once, once; the renew deadline still bounds how long we act.
        let mut retry_now = false;
        loop {
            let cfg = self.config.clone();
            // Stop leading the moment the renew deadline passes.
            if let Some(last) = last_renew
                && Instant::now() >= last + cfg.renew_deadline
            {
                tracing::warn!(identity = %cfg.identity, "renew deadline passed; stopping leader work");
                last_renew = None;
                self.publish(None);
            }
            let attempt_started = Instant::now();
            let attempt = self.try_acquire_or_renew();
            let result = match last_renew {
                Some(last) => {
                    match tokio::time::timeout_at(last + cfg.renew_deadline, attempt).await {
                        Ok(r) => r,
                        Err(_) => Err(ElectError::Api(kube::Error::Service(
                            "renew timed out".into(),
                        ))),
                    }
                }
                None => attempt.await,
            };
            match result {
                Ok(term) => {
                    if last_renew.is_none() {
                        tracing::info!(identity = %cfg.identity, transitions = term.transitions, "became leader");
                    }
                    // Count from when the request was sent: the API server
                    // may have stamped the renewal any time after that.
                    last_renew = Some(attempt_started);
                    self.fence
                        .set(Some((term.clone(), attempt_started + cfg.renew_deadline)));
                    self.publish(Some(term));
                }
                // Someone else holds the Lease now: whoever took it judged
                // ours expired, so stop at once rather than act on until
                // our renew deadline.
                Err(ElectError::Held(holder)) => {
                    if last_renew.take().is_some() {
                        tracing::warn!(identity = %cfg.identity, %holder, "the lease was taken over; stopping leader work");
                        self.publish(None);
                    }
                }
                Err(ElectError::Conflict) if last_renew.is_some() && !retry_now => {
                    tracing::debug!(identity = %cfg.identity, "renewing the lease conflicted; looking again");
                    retry_now = true;
                    continue;
                }
                Err(e) => {
                    if last_renew.is_some() {
                        tracing::warn!(identity = %cfg.identity, "renewing the lease failed: {e}");
                    } else {
                        tracing::debug!(identity = %cfg.identity, "acquiring the lease failed: {e}");
                    }
                    if let Some(last) = last_renew
                        && Instant::now() >= last + cfg.renew_deadline
                    {
                        tracing::warn!(identity = %cfg.identity, "renew deadline passed; stopping leader work");
                        last_renew = None;
                        self.publish(None);
                    }
                }
            }
            retry_now = false;
            let mut wake = Instant::now() + cfg.retry_period;
            if let Some(last) = last_renew {
                wake = wake.min(last + cfg.renew_deadline);
            }
            let leading = last_renew.is_some();
            // Biased: the same schedule picks the same branch (the
            // simulator replays a seed exactly).
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                _ = tokio::time::sleep_until(wake) => {}
                // A candidate re-checks as soon as the Lease changes (e.g. released).
                _ = changed.notified(), if !leading => {}
            }
        }
        if last_renew.is_some() {
            match self.release().await {
                Ok(()) => tracing::info!(identity = %self.config.identity, "released the lease"),
                Err(e) => {
                    tracing::warn!(identity = %self.config.identity, "releasing the lease failed: {e}")
                }
            }
        }
        self.publish(None);
    }
}

/// Aborts the task when dropped, so no watch outlives its elector.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Notifies on every change of the one Lease, reconnecting as needed.
async fn watch_lease(api: Api<Lease>, name: String, changed: std::sync::Arc<Notify>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    // Back off on errors: while the API server is down the watch must not spin.
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        if matches!(
            event,
            Ok(watcher::Event::Apply(_)) | Ok(watcher::Event::Delete(_))
        ) {
            changed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, secs: i32, transitions: i32) -> LeaseRecord {
        LeaseRecord {
            holder: holder.into(),
            lease_duration_seconds: secs,
            acquire_time: None,
            renew_time: None,
            transitions,
        }
    }

    #[test]
    fn config_validation() {
        let mut c = ElectorConfig::new("ns", "l", "me");
        assert!(c.validate().is_ok());
        c.renew_deadline = Duration::from_secs(15);
        assert!(
            c.validate()
                .unwrap_err()
                .contains("must be greater than the renew deadline")
        );
        c.renew_deadline = Duration::from_millis(2400);
        assert!(c.validate().unwrap_err().contains("1.2 x the retry period"));
        c.renew_deadline = Duration::from_millis(2500);
        assert!(c.validate().is_ok());
        c.identity.clear();
        assert!(c.validate().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_is_judged_from_the_last_observed_change() {
        let mut o = Observer::default();
        let t0 = Instant::now();
        assert!(o.may_acquire("me", t0), "nothing observed: try");
        o.observe(record("other", 15, 3), t0);
        assert!(!o.may_acquire("me", t0));
        tokio::time::advance(Duration::from_secs(10)).await;
        // The same record seen again does not restart the clock...
        o.observe(record("other", 15, 3), Instant::now());
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(!o.may_acquire("me", Instant::now()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            o.may_acquire("me", Instant::now()),
            "15 s after the change was observed"
        );
        // ...but a renewal (a changed record) does.
        let mut renewed = record("other", 15, 3);
        renewed.renew_time = Some(MicroTime(Timestamp::from_second(1_000).unwrap()));
        o.observe(renewed, Instant::now());
        assert!(!o.may_acquire("me", Instant::now()));
        tokio::time::advance(Duration::from_secs(15)).await;
        assert!(o.may_acquire("me", Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_leader_may_not_act_once_its_deadline_passed() {
        let fence = Fence::default();
        assert!(!fence.may_act());
        let term = Term {
            holder: "me".into(),
            transitions: 3,
            lease_uid: "u".into(),
        };
        let ten_s = || Instant::now() + Duration::from_secs(10);
        fence.set(Some((term.clone(), ten_s())));
        assert!(fence.may_act());
        let acting = fence.acting().expect("open");
        assert_eq!(acting.term, term);
        // Renewals within the stretch keep it.
        fence.set(Some((term.clone(), ten_s())));
        assert!(fence.still(&acting));
        // The process is paused for 11 s: on waking, before anything else
        // runs, the fence is already closed.
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!fence.may_act());
        assert_eq!(fence.acting(), None);
        assert!(!fence.still(&acting));
        // A late renew in the same term opens a new stretch: the old one
        // (whose work may have been given up meanwhile) stays over.
        fence.set(Some((term.clone(), ten_s())));
        assert!(fence.may_act());
        assert!(!fence.still(&acting), "closed once, over for good");
        let again = fence.acting().expect("open");
        assert!(fence.still(&again));
        fence.set(None);
        fence.set(Some((term, ten_s())));
        assert!(!fence.still(&again), "stepped down and back");
    }

    #[tokio::test(start_paused = true)]
    async fn free_or_own_leases_may_be_taken_at_once() {
        let mut o = Observer::default();
        o.observe(record("", 1, 4), Instant::now());
        assert!(o.may_acquire("me", Instant::now()), "released");
        o.observe(record("me", 15, 4), Instant::now());
        assert!(o.may_acquire("me", Instant::now()), "ours");
        assert!(!o.may_acquire("you", Instant::now()));
    }
}
