//! The delivery pipeline: from a plugin's decision to executed actions.
//!
//! ```text
//! submit(ticket, actions) ─▶ one job per target key ─ debounce window ─▶ execute
//!                               ▲ same key while pending: coalesce        │ retry with backoff
//!                               │ (latest action wins, tickets attach)    ▼ (jittered, capped)
//!                               └─ same key while running: next window   done / dead letter
//!                                                                         │
//!                         a ticket completes when all its actions are ◀───┘
//! ```
//!
//! - **Target key**: what an action acts on (a Service's pods and path, a
//!   URL, a bus destination, a workload). Actions with the same key
//!   coalesce: ten changes to one app's ConfigMaps inside the debounce
//!   window give one refresh. Restarts of one workload coalesce whatever
//!   object they are for, keeping the latest content hash of each object:
//!   two ConfigMaps changed in one window roll the workload once, both
//!   hashes in one patch ([`Execute::execute_restarts`]; issue 20's burst
//!   control: they were keyed per workload and object, two rollouts).
//! - **Cooldown**: after a coalescing target acted, its next job waits at
//!   least `policy.cooldown` from that job's start; what is submitted
//!   meanwhile merges into it, the last content winning, and
//!   [`Execute::throttled`] is told once per held job (a Warning Event).
//!   A flapping Secret rolls its workloads at most once per cooldown. A
//!   workload's pause period ([`PauseOf`]: Reloader's `pause-period`
//!   annotation) lengthens its restarts' cooldown the same way.
//! - **Debounce**: a job waits `policy.debounce` from its *first* submission
//!   (a fixed window, so a flapping object still gets refreshed every window
//!   rather than never). Events (`Action::Event`) never wait or coalesce.
//! - **One at a time per key**: a submission for a key whose job is running
//!   opens the next window; it runs after the current job, so a change that
//!   lands during a refresh is refreshed again.
//! - **Order of content**: actions that carry content (an HTTP call with a
//!   body, a bus message) are keyed per plugin, object and destination and
//!   queue there, so one object's contents reach a destination in the order
//!   of its changes, retries included: the newer change's action waits while
//!   the older one runs or waits out its backoff. None replaces another: a
//!   plugin may send only the keys a change touched, and one decision may
//!   hold several messages for one destination (bus-refresh: one per app).
//!   They were keyed per message before, and ran concurrently: a 503 retried
//!   after the newer content had landed left the app on the older one for
//!   good (issue 19). Only the global rate limit applies to them, as before.
//! - **Retries**: retryable failures are retried `policy.retries` times with
//!   exponential backoff from `backoff_initial` to `backoff_max`, ±25 %
//!   jitter; a permanent failure, or the last retryable one, dead-letters
//!   the job ([`Execute::dead_letter`], a log line, a count).
//! - **Rate limits**: a global token bucket and one per target key, taken
//!   before every attempt.
//! - **Fence**: before every attempt the pipeline asks `may_act`; when it
//!   says no, the job is abandoned: its tickets never complete, so the
//!   checkpoint stays before them and the next leader redelivers them.
//! - **Tickets** complete (sent on the `done` channel) when every action of
//!   the submission finished or dead-lettered; never on abandonment or when
//!   the pipeline is dropped.
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;
use wasmwatch_core::Action;

use crate::{ExecError, Origin};

/// Boxed future returned by [`Execute`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What carries actions out. The host's implementation dispatches to the
/// HTTP, bus and Kubernetes executors.
pub trait Execute: Send + Sync + 'static {
    /// One attempt of one action.
    fn execute<'a>(
        &'a self,
        origin: &'a Origin,
        action: &'a Action,
    ) -> BoxFuture<'a, Result<Executed, ExecError>>;

    /// The action succeeded for these (coalesced) changes (`executed`: what
    /// the successful attempt said): tell someone (a Kubernetes Event on
    /// each object). Called after the changes' tickets are finished; it
    /// must not wait (the target's next job waits for it): queue the work,
    /// as [`crate::recorder::EventRecorder`] does.
    fn succeeded(&self, _origins: &[Origin], _action: &Action, _executed: &Executed) {}

    /// The action failed for good: tell someone (a Kubernetes Event on the
    /// object). Like [`Execute::succeeded`]: after the tickets, no waiting.
    fn dead_letter(&self, _origin: &Origin, _action: &Action, _error: &ExecError) {}

    /// One attempt of the restarts of one workload for several objects
    /// (each with the change it is for), coalesced: the host's executor
    /// patches the pod template once with every content hash. The default
    /// executes them in turn.
    fn execute_restarts<'a>(
        &'a self,
        restarts: &'a [(Origin, Action)],
    ) -> BoxFuture<'a, Result<Executed, ExecError>> {
        Box::pin(async move {
            let mut executed = Executed::default();
            for (origin, action) in restarts {
                executed = self.execute(origin, action).await?;
            }
            Ok(executed)
        })
    }

    /// `action`, for `origin`'s change, waits `wait` for its target's
    /// cooldown (`cooldown`): tell someone (a Warning Event). Called once
    /// per held job, from the pipeline's loop: it must not wait.
    fn throttled(&self, _origin: &Origin, _action: &Action, _wait: Duration, _cooldown: Duration) {}
}

/// What a successful attempt did beyond what its action says, for the
/// host's Event about it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Executed {
    /// The status an `http` action's call was answered with.
    pub status: Option<u16>,
    /// The ready pods a Service refresh called (each answered 2xx).
    pub pods: Option<usize>,
}

/// Per plugin: how its actions are delivered (the manifest's `delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub debounce: Duration,
    pub retries: u32,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// The shortest time between two jobs of one coalescing target.
    pub cooldown: Duration,
}

impl From<&wasmwatch_core::manifest::Delivery> for Policy {
    fn from(d: &wasmwatch_core::manifest::Delivery) -> Self {
        Policy {
            debounce: d.debounce.0,
            retries: d.retries,
            backoff_initial: d.backoff_initial.0,
            backoff_max: d.backoff_max.0,
            cooldown: d.cooldown.0,
        }
    }
}

/// A token bucket's settings: `rate` per second, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub rate: f64,
    pub burst: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PipelineConfig {
    /// Over all targets.
    pub global: RateLimit,
    /// Per target key.
    pub per_target: RateLimit,
}

impl From<&wasmwatch_core::manifest::RateLimits> for PipelineConfig {
    fn from(r: &wasmwatch_core::manifest::RateLimits) -> Self {
        let limit = |r: wasmwatch_core::manifest::Rate| RateLimit {
            rate: r.per_second,
            burst: f64::from(r.burst),
        };
        PipelineConfig {
            global: limit(r.global),
            per_target: limit(r.per_target),
        }
    }
}

impl Default for PipelineConfig {
    /// The manifest's defaults.
    fn default() -> Self {
        PipelineConfig::from(&wasmwatch_core::manifest::RateLimits::default())
    }
}

/// A target's own cooldown, beside the plugin's `policy.cooldown` (the
/// longer applies): a restart's workload's pause period, read from the
/// lookups' cache when the job starts.
pub type PauseOf = Arc<dyn Fn(&Action) -> Option<Duration> + Send + Sync>;

/// Called with every job's report (logs, metrics, the local run's output).
pub type OnReport = Arc<dyn Fn(&Report) + Send + Sync>;

/// One decision to deliver.
pub struct Submission<T> {
    pub ticket: T,
    pub origin: Origin,
    pub actions: Vec<Action>,
    pub policy: Policy,
}

/// What happened to one job, for logs, metrics and the local run's output.
#[derive(Debug, Clone)]
pub struct Report {
    pub action: Action,
    /// The changes coalesced into this job.
    pub origins: Vec<Origin>,
    /// 1 for the first attempt.
    pub attempt: u32,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Failed, will be retried after the delay.
    Retrying {
        error: ExecError,
        delay: Duration,
    },
    DeadLettered {
        error: ExecError,
    },
    /// Not leading any more: given up without completing its tickets.
    Abandoned,
}

/// Counters, readable at any time.
#[derive(Debug, Default)]
pub struct Stats {
    pub submitted: AtomicU64,
    pub coalesced: AtomicU64,
    pub attempts: AtomicU64,
    pub executed: AtomicU64,
    pub retries: AtomicU64,
    pub dead_letters: AtomicU64,
    pub abandoned: AtomicU64,
    /// Jobs waiting for their window or running.
    pub queued: AtomicUsize,
}

/// The target an action acts on: actions with equal keys coalesce.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TargetKey {
    Refresh {
        namespace: String,
        service: String,
        method: &'static str,
        port: Option<u16>,
        path: String,
        tls: bool,
    },
    Http {
        method: &'static str,
        url: String,
        /// A call with a body carries the content of one object's change:
        /// the plugin and object (`plugin/kind/namespace/name`), so that
        /// calls for other objects never replace it. `None`: bodyless, and
        /// calls for any object coalesce.
        content_of: Option<String>,
    },
    Publish {
        connection: String,
        destination: String,
        routing_key: String,
        /// Whose change the message carries (`plugin/kind/namespace/name`):
        /// a message replaces only a waiting one of the same object.
        content_of: String,
    },
    /// Every restart of one workload, whatever object it is for.
    Restart { workload: String },
    /// Never coalesced.
    Unique(u64),
}

fn method_name(m: wasmwatch_core::action::HttpMethod) -> &'static str {
    use wasmwatch_core::action::HttpMethod::*;
    match m {
        Get => "GET",
        Post => "POST",
        Put => "PUT",
        Patch => "PATCH",
        Delete => "DELETE",
    }
}

/// `plugin/kind/namespace/name`: whose change an action carries.
fn content_of(origin: &Origin) -> String {
    format!(
        "{}/{}/{}/{}",
        origin.plugin,
        origin.kind.as_str(),
        origin.namespace,
        origin.name
    )
}

impl TargetKey {
    /// The key of an action decided for `origin`; `unique` numbers the ones
    /// that never coalesce.
    pub fn of(action: &Action, origin: &Origin, unique: u64) -> TargetKey {
        match action {
            Action::RefreshService {
                namespace,
                service,
                method,
                port,
                path,
                tls,
            } => TargetKey::Refresh {
                namespace: namespace.clone(),
                service: service.clone(),
                method: method_name(*method),
                port: *port,
                path: path.clone(),
                tls: *tls,
            },
            // Calls with a body are not interchangeable across objects:
            // only bodyless ones coalesce whatever their object.
            Action::Http {
                method, url, body, ..
            } => TargetKey::Http {
                method: method_name(*method),
                url: url.clone(),
                content_of: body.as_ref().map(|_| content_of(origin)),
            },
            Action::Publish {
                connection,
                destination,
                routing_key,
                ..
            } => TargetKey::Publish {
                connection: connection.clone(),
                destination: destination.clone(),
                routing_key: routing_key.clone(),
                content_of: content_of(origin),
            },
            Action::Restart { workload, .. } => TargetKey::Restart {
                workload: format!(
                    "{:?}/{}/{}",
                    workload.kind, workload.namespace, workload.name
                ),
            },
            Action::Event { .. } => TargetKey::Unique(unique),
        }
    }

    /// Contents (an HTTP call with a body, a bus message) queue: every one
    /// is delivered, one at a time, in order; none replaces another (a
    /// plugin may send only what a change touched, and one decision may
    /// hold several messages for one destination, one per app).
    fn queues(&self) -> bool {
        matches!(
            self,
            TargetKey::Publish { .. }
                | TargetKey::Http {
                    content_of: Some(_),
                    ..
                }
        )
    }

    /// Jobs of this key wait out `policy.cooldown` after the previous one:
    /// coalescing keys (contents are all delivered, in order).
    fn cools_down(&self) -> bool {
        !(self.queues() || matches!(self, TargetKey::Unique(_)))
    }

    /// HTTP calls with a body and Events go at once (as before keys were
    /// per object); the rest waits for its debounce window.
    fn debounces(&self) -> bool {
        !matches!(
            self,
            TargetKey::Unique(_)
                | TargetKey::Http {
                    content_of: Some(_),
                    ..
                }
        )
    }
}

/// Counts down the actions of one submission; sends the ticket when the
/// last one finishes.
struct TicketState<T> {
    remaining: AtomicUsize,
    ticket: Mutex<Option<T>>,
    done: mpsc::UnboundedSender<T>,
}

impl<T> TicketState<T> {
    fn finish_one(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1
            && let Some(t) = self.ticket.lock().expect("ticket lock").take()
        {
            let _ = self.done.send(t);
        }
    }
}

/// The object a restart's content hash is about (`configmap/orders` of
/// `configmap/orders:<digest>`).
fn restart_object(action: &Action) -> Option<&str> {
    match action {
        Action::Restart { content_hash, .. } => Some(
            content_hash
                .rsplit_once(':')
                .map_or(content_hash.as_str(), |(object, _)| object),
        ),
        _ => None,
    }
}

/// A job waiting for its window.
struct Pending<T> {
    action: Action,
    /// A restart job: the latest restart per object (with the change it
    /// is for), in the order objects joined; `action` is the last one.
    restarts: Vec<(Origin, Action)>,
    origins: Vec<Origin>,
    tickets: Vec<Arc<TicketState<T>>>,
    policy: Policy,
    due: Instant,
}

/// One target key: its running job and what waits for it. A coalescing key
/// has at most one job waiting (later submissions join it); a content key
/// queues every one, in order.
struct Slot<T> {
    running: bool,
    pending: std::collections::VecDeque<Pending<T>>,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            running: false,
            pending: Default::default(),
        }
    }
}

enum Command<T> {
    Submit(Box<Submission<T>>),
    Finished(TargetKey),
}

/// Submits to a pipeline; see [`Pipeline::submitter`].
pub struct Submitter<T> {
    tx: mpsc::UnboundedSender<Command<T>>,
}

impl<T> Submitter<T> {
    pub fn submit(&self, submission: Submission<T>) {
        let _ = self.tx.send(Command::Submit(Box::new(submission)));
    }
}

/// Handle to the pipeline's task. Dropping it stops the pipeline: pending
/// and running jobs are abandoned (their tickets never complete).
pub struct Pipeline<T> {
    tx: mpsc::UnboundedSender<Command<T>>,
    stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

impl<T> Drop for Pipeline<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Bucket {
    limit: RateLimit,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(limit: RateLimit) -> Self {
        Bucket {
            limit,
            tokens: limit.burst,
            at: Instant::now(),
        }
    }

    /// Takes a token; returns how long to wait first (zero when one was there).
    fn take(&mut self) -> Duration {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * self.limit.rate).min(self.limit.burst);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 || self.limit.rate <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.limit.rate)
        }
    }
}

/// Shared by the running jobs.
struct Shared {
    executor: Arc<dyn Execute>,
    may_act: Arc<dyn Fn() -> bool + Send + Sync>,
    on_report: Option<OnReport>,
    stats: Arc<Stats>,
    global: Mutex<Bucket>,
    per_target: Mutex<HashMap<TargetKey, Bucket>>,
    config: PipelineConfig,
    pause_of: Option<PauseOf>,
}

impl Shared {
    fn report(&self, r: Report) {
        if let Some(f) = &self.on_report {
            f(&r);
        }
    }

    async fn rate_limit(&self, key: &TargetKey) {
        let wait = {
            let g = self.global.lock().expect("bucket").take();
            // A unique key is never seen again: a bucket of its own would
            // only grow the map. Contents queue per object, and were
            // limited only globally when each had a key of its own.
            let t = if matches!(key, TargetKey::Unique(_)) || key.queues() {
                Duration::ZERO
            } else {
                let mut targets = self.per_target.lock().expect("buckets");
                targets
                    .entry(key.clone())
                    .or_insert_with(|| Bucket::new(self.config.per_target))
                    .take()
            };
            g.max(t)
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// The delay before retry `n` (1-based): exponential, capped, ±25 % jitter.
pub fn retry_delay(policy: &Policy, n: u32) -> Duration {
    let base = policy
        .backoff_initial
        .saturating_mul(2u32.saturating_pow(n.saturating_sub(1).min(20)))
        .min(policy.backoff_max);
    wasmwatch_core::jitter::spread(base)
}

impl<T: Send + 'static> Pipeline<T> {
    /// Starts the pipeline's task. Completed tickets go to `done`; `may_act`
    /// is the leadership fence, asked before every attempt.
    pub fn start(
        executor: Arc<dyn Execute>,
        config: PipelineConfig,
        may_act: Arc<dyn Fn() -> bool + Send + Sync>,
        on_report: Option<OnReport>,
        done: mpsc::UnboundedSender<T>,
    ) -> Pipeline<T> {
        Pipeline::start_with_pauses(executor, config, None, may_act, on_report, done)
    }

    /// [`Pipeline::start`], with targets' own cooldowns ([`PauseOf`]).
    pub fn start_with_pauses(
        executor: Arc<dyn Execute>,
        config: PipelineConfig,
        pause_of: Option<PauseOf>,
        may_act: Arc<dyn Fn() -> bool + Send + Sync>,
        on_report: Option<OnReport>,
        done: mpsc::UnboundedSender<T>,
    ) -> Pipeline<T> {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(Stats::default());
        let shared = Arc::new(Shared {
            executor,
            may_act,
            on_report,
            stats: stats.clone(),
            global: Mutex::new(Bucket::new(config.global)),
            per_target: Mutex::new(HashMap::new()),
            config,
            pause_of,
        });
        let task = tokio::spawn(run(shared, rx, tx.clone(), done));
        Pipeline { tx, stats, task }
    }

    pub fn submit(&self, submission: Submission<T>) {
        let _ = self.tx.send(Command::Submit(Box::new(submission)));
    }

    /// A handle that submits from elsewhere (a retrying plugin call); it
    /// goes quiet once the pipeline is dropped.
    pub fn submitter(&self) -> Submitter<T> {
        Submitter {
            tx: self.tx.clone(),
        }
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }
}

async fn run<T: Send + 'static>(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<Command<T>>,
    tx: mpsc::UnboundedSender<Command<T>>,
    done: mpsc::UnboundedSender<T>,
) {
    let mut state = Loop {
        shared,
        tx,
        done,
        slots: BTreeMap::new(),
        cooldowns: HashMap::new(),
        timers: BinaryHeap::new(),
        seq: 0,
        unique: 0,
        jobs: tokio::task::JoinSet::new(),
    };
    loop {
        let next_due = state.timers.peek().map(|Reverse((due, _, _))| *due);
        // A window already closed (debounce 0, a finished job's next one)
        // starts now: a timer for it would round up to the timer wheel's
        // next millisecond and add ~1 ms to every change (issue 24).
        let command = if next_due.is_some_and(|due| due <= Instant::now()) {
            None
        } else {
            tokio::select! {
            // Biased: one schedule per seed in the simulator (a due
            // window was taken above, before any command).
            biased;
            c = rx.recv() => match c { Some(c) => Some(c), None => break },
            _ = async { tokio::time::sleep_until(next_due.expect("guarded")).await }, if next_due.is_some() => None,
            Some(_) = state.jobs.join_next(), if !state.jobs.is_empty() => continue,
            }
        };
        match command {
            Some(Command::Submit(s)) => state.submit(*s),
            Some(Command::Finished(key)) => state.finished(key),
            None => state.start_due(),
        }
    }
}

/// The pipeline's loop state.
struct Loop<T> {
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Command<T>>,
    done: mpsc::UnboundedSender<T>,
    slots: BTreeMap<TargetKey, Slot<T>>,
    /// Until when each target's cooldown lasts (from its last job's
    /// start), and the cooldown that set it.
    cooldowns: HashMap<TargetKey, (Instant, Duration)>,
    /// (due, sequence, key): the next pending window to close.
    timers: BinaryHeap<Reverse<(Instant, u64, TargetKey)>>,
    seq: u64,
    unique: u64,
    jobs: tokio::task::JoinSet<()>,
}

impl<T: Send + 'static> Loop<T> {
    /// A decision's actions: each joins its target's waiting job or
    /// opens a window of its own.
    fn submit(&mut self, s: Submission<T>) {
        self.shared.stats.submitted.fetch_add(1, Ordering::Relaxed);
        if s.actions.is_empty() {
            let _ = self.done.send(s.ticket);
            return;
        }
        let state = Arc::new(TicketState {
            remaining: AtomicUsize::new(s.actions.len()),
            ticket: Mutex::new(Some(s.ticket)),
            done: self.done.clone(),
        });
        for action in s.actions {
            self.unique += 1;
            let key = TargetKey::of(&action, &s.origin, self.unique);
            let slot = self.slots.entry(key.clone()).or_default();
            match slot.pending.back_mut() {
                Some(p) if !key.queues() => {
                    self.shared.stats.coalesced.fetch_add(1, Ordering::Relaxed);
                    if let Some(object) = restart_object(&action) {
                        p.restarts
                            .retain(|(_, a)| restart_object(a) != Some(object));
                        p.restarts.push((s.origin.clone(), action.clone()));
                    }
                    p.action = action;
                    if !p.origins.contains(&s.origin) {
                        p.origins.push(s.origin.clone());
                    }
                    p.tickets.push(state.clone());
                }
                _ => {
                    self.shared.stats.queued.fetch_add(1, Ordering::Relaxed);
                    let now = Instant::now();
                    let mut due = if key.debounces() {
                        now + s.policy.debounce
                    } else {
                        now
                    };
                    if let Some((until, cooldown)) = self.cooldowns.get(&key).copied()
                        && until > due
                        && key.cools_down()
                    {
                        self.shared
                            .executor
                            .throttled(&s.origin, &action, until - now, cooldown);
                        due = until;
                    }
                    let restarts = match restart_object(&action) {
                        Some(_) => vec![(s.origin.clone(), action.clone())],
                        None => Vec::new(),
                    };
                    slot.pending.push_back(Pending {
                        action,
                        restarts,
                        origins: vec![s.origin.clone()],
                        tickets: vec![state.clone()],
                        policy: s.policy,
                        due,
                    });
                    self.seq += 1;
                    self.timers.push(Reverse((due, self.seq, key)));
                }
            }
        }
    }

    /// A target's job is over: a window that closed meanwhile starts.
    fn finished(&mut self, key: TargetKey) {
        if let Some(slot) = self.slots.get_mut(&key) {
            slot.running = false;
            // A window that closed while the job ran starts now.
            if slot
                .pending
                .front()
                .is_some_and(|p| p.due <= Instant::now())
            {
                self.seq += 1;
                self.timers
                    .push(Reverse((Instant::now(), self.seq, key.clone())));
            }
            if slot.pending.is_empty() {
                self.slots.remove(&key);
            }
        }
    }

    /// Starts the job of every window that closed, unless its target runs
    /// one.
    fn start_due(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((due, _, _))) = self.timers.peek() {
            if *due > now {
                break;
            }
            let Reverse((_, _, key)) = self.timers.pop().expect("peeked");
            let Some(slot) = self.slots.get_mut(&key) else {
                continue;
            };
            if slot.running || slot.pending.front().is_none_or(|p| p.due > now) {
                continue;
            }
            let pending = slot.pending.pop_front().expect("checked");
            slot.running = true;
            let cooldown = match &self.shared.pause_of {
                Some(pause_of) if key.cools_down() => pause_of(&pending.action)
                    .unwrap_or_default()
                    .max(pending.policy.cooldown),
                _ => pending.policy.cooldown,
            };
            if key.cools_down() && !cooldown.is_zero() {
                if self.cooldowns.len() >= 4096 {
                    self.cooldowns.retain(|_, (until, _)| *until > now);
                }
                self.cooldowns
                    .insert(key.clone(), (now + cooldown, cooldown));
            }
            let shared = self.shared.clone();
            let tx = self.tx.clone();
            let span = {
                let o = pending.origins.last().expect("a job has an origin");
                tracing::info_span!(
                    "action",
                    r#type = pending.action.type_name(),
                    plugin = %o.plugin,
                    object = %format!("{}/{}/{}", o.kind.as_str(), o.namespace, o.name),
                    changes = pending.origins.len(),
                )
            };
            self.jobs.spawn(
                async move {
                    execute_job(&shared, &key, pending).await;
                    shared.stats.queued.fetch_sub(1, Ordering::Relaxed);
                    let _ = tx.send(Command::Finished(key));
                }
                .instrument(span),
            );
        }
    }
}

async fn execute_job<T>(shared: &Shared, key: &TargetKey, job: Pending<T>) {
    let origin = job.origins.last().expect("a job has an origin").clone();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        shared.rate_limit(key).await;
        if !(shared.may_act)() {
            shared.stats.abandoned.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(action = job.action.type_name(), plugin = %origin.plugin, "not leading: abandoning the action; the next leader redelivers it");
            shared.report(Report {
                action: job.action.clone(),
                origins: job.origins.clone(),
                attempt,
                outcome: Outcome::Abandoned,
            });
            return;
        }
        shared.stats.attempts.fetch_add(1, Ordering::Relaxed);
        let result = if job.restarts.len() > 1 {
            shared.executor.execute_restarts(&job.restarts).await
        } else {
            shared.executor.execute(&origin, &job.action).await
        };
        let mut executed = Executed::default();
        let outcome = match result {
            Ok(e) => {
                executed = e;
                Outcome::Done
            }
            Err(error) if error.is_retryable() && attempt <= job.policy.retries => {
                let delay = retry_delay(&job.policy, attempt);
                Outcome::Retrying { error, delay }
            }
            Err(error) => Outcome::DeadLettered { error },
        };
        shared.report(Report {
            action: job.action.clone(),
            origins: job.origins.clone(),
            attempt,
            outcome: outcome.clone(),
        });
        match outcome {
            Outcome::Done => {
                shared.stats.executed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(action = job.action.type_name(), plugin = %origin.plugin, object = %format!("{}/{}", origin.namespace, origin.name), attempt, "action done");
                finish(&job.tickets);
                shared
                    .executor
                    .succeeded(&job.origins, &job.action, &executed);
                return;
            }
            Outcome::Retrying { error, delay } => {
                shared.stats.retries.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(action = job.action.type_name(), plugin = %origin.plugin, attempt, "action failed, retrying in {delay:?}: {error}");
                tokio::time::sleep(delay).await;
            }
            Outcome::DeadLettered { error } => {
                shared.stats.dead_letters.fetch_add(1, Ordering::Relaxed);
                tracing::error!(action = job.action.type_name(), plugin = %origin.plugin, object = %format!("{}/{}", origin.namespace, origin.name), attempt, "action dead-lettered: {error}");
                finish(&job.tickets);
                for o in &job.origins {
                    shared.executor.dead_letter(o, &job.action, &error);
                }
                return;
            }
            Outcome::Abandoned => unreachable!("not produced here"),
        }
    }
}

/// The job's changes are handled (as far as this action goes).
fn finish<T>(tickets: &[Arc<TicketState<T>>]) {
    for t in tickets {
        t.finish_one();
    }
}
