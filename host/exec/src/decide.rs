//! The decide stage's shell: the plugin calls of one term.
//!
//! The rules (one call per plugin and object at a time, in change order;
//! changes waiting for their turn fold into one call) are
//! [`wasmwatch_core::turns::Turns`], without I/O. This shell runs each call
//! it starts in a task of its own (so a slow or blocked plugin delays
//! neither the other plugins nor the term's loop, nor shutdown), retries a
//! failed call per the plugin's delivery policy, and hands the call back to
//! the term's loop when it is over: [`Decide::settle`] submits its decision
//! to the pipeline (or dead-letters it) and only then starts the key's next
//! call, so decisions reach the pipeline in change order.
//!
//! The plugin is a seam ([`Decider`]): `wasmwatch run` puts a sandboxed
//! WebAssembly plugin behind it, the simulator (host/sim) a simulated one
//! that is slow or fails as its seed says; both run this shell and the
//! pipeline after it.
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;
use wasmwatch_core::action::EventType;
use wasmwatch_core::digest::reloader_hash;
use wasmwatch_core::turns::{Call, Offered, Turns};
use wasmwatch_core::{Action, ChangeEvent, ObjectKind};

use crate::pipeline::{BoxFuture, Execute, Pipeline, Policy, Submission};
use crate::{ExecError, Origin};

/// A plugin as the decide stage sees it: a name and one call per change.
pub trait Decider: Send + Sync + 'static {
    fn name(&self) -> &str;

    /// One call: the actions the host may execute (those its capabilities
    /// allow), or why the call failed (it is retried per the policy).
    fn decide<'a>(&'a self, event: &'a ChangeEvent) -> BoxFuture<'a, Result<Vec<Action>, String>>;
}

/// What the decide stage tells the metrics (the service's; none in the
/// simulator).
pub trait Observe: Send + Sync + 'static {
    /// A call ended (`ok`: it decided) after `seconds`.
    fn called(&self, _plugin: &str, _ok: bool, _seconds: f64) {}

    /// A change folded into a call waiting for its turn.
    fn folded(&self, _plugin: &str) {}
}

/// Observes nothing.
pub struct Unobserved;

impl Observe for Unobserved {}

/// A plugin and its delivery policy.
#[derive(Clone)]
pub struct Loaded {
    pub plugin: Arc<dyn Decider>,
    pub policy: Policy,
}

/// Which calls must keep their order: plugin (its index), kind, namespace, name.
type Key = (usize, ObjectKind, String, String);

/// A call that is over, for [`Decide::settle`].
pub struct Decided<T> {
    key: Key,
    call: Call<T>,
    /// The decision's actions, or the error it is dead-lettered with.
    result: Result<Vec<Action>, ExecError>,
}

/// The plugin calls of one term; dropping it ends every call (and a
/// sandboxed plugin's instance) at once. `T`: what marks a change done
/// (the checkpoint's ticket); the pipeline finishes a call's `Vec<T>`.
pub struct Decide<T> {
    plugins: Vec<Loaded>,
    executor: Arc<dyn Execute>,
    observe: Arc<dyn Observe>,
    turns: Turns<Key, T>,
    calls: JoinSet<Decided<T>>,
}

impl<T: Send + 'static> Decide<T> {
    /// `executor` is told of dead-lettered calls (a Warning Event).
    pub fn new(
        plugins: Vec<Loaded>,
        executor: Arc<dyn Execute>,
        observe: Arc<dyn Observe>,
    ) -> Self {
        Decide {
            plugins,
            executor,
            observe,
            turns: Turns::default(),
            calls: JoinSet::new(),
        }
    }

    /// Hands a change to the plugins the term chose (indexes into the
    /// plugins): a call each, now or at its turn, or folded into a call
    /// that waits for its turn.
    pub fn dispatch(&mut self, event: ChangeEvent, ticket: T, plugins: &[usize])
    where
        T: Clone,
    {
        let event = Arc::new(event);
        for &index in plugins {
            let o = &event.object;
            let key = (index, o.kind, o.namespace.clone(), o.name.clone());
            match self.turns.offer(key.clone(), event.clone(), ticket.clone()) {
                Offered::Start(call) => self.start(key, call),
                Offered::Folded => self.observe.folded(self.plugins[index].plugin.name()),
                Offered::Queued => {}
            }
        }
    }

    fn start(&mut self, key: Key, call: Call<T>) {
        let loaded = self.plugins[key.0].clone();
        let observe = self.observe.clone();
        let o = &call.event.object;
        let span = tracing::info_span!(
            "delivery",
            object = %format!("{}/{}/{}", o.kind.as_str(), o.namespace, o.name),
            change = ?call.event.change,
            resource_version = %o.resource_version,
            replay = call.event.replay,
        );
        self.calls.spawn(
            async move {
                let result = decide(&loaded, &call.event, &*observe).await;
                Decided { key, call, result }
            }
            .instrument(span),
        );
    }

    /// The next call that is over; pending while none runs.
    pub async fn next(&mut self) -> Decided<T> {
        loop {
            match self.calls.join_next().await {
                Some(Ok(decided)) => return decided,
                Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Some(Err(_)) => {}
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Submits a call's decision to the pipeline, which finishes its
    /// tickets once its actions are over; a dead-lettered call finishes
    /// them on `done` at once. Then starts the key's next call.
    pub fn settle(
        &mut self,
        decided: Decided<T>,
        pipeline: &Pipeline<Vec<T>>,
        done: &tokio::sync::mpsc::UnboundedSender<Vec<T>>,
    ) {
        let Decided { key, call, result } = decided;
        let loaded = &self.plugins[key.0];
        let event = &call.event;
        let origin = Origin {
            kind: event.object.kind,
            namespace: event.object.namespace.clone(),
            name: event.object.name.clone(),
            uid: event.object.uid.clone(),
            resource_version: event.object.resource_version.clone(),
            plugin: loaded.plugin.name().to_string(),
            unkeyed_digest: event
                .unkeyed_digest
                .as_ref()
                .map(|plain| (event.digest.clone(), plain.clone())),
            reloader_hash: result
                .as_ref()
                .is_ok_and(|actions| actions.iter().any(|a| matches!(a, Action::Restart { .. })))
                .then(|| {
                    let o = &event.object;
                    (event.digest.clone(), reloader_hash(o.kind, &o.data))
                }),
        };
        match result {
            Ok(actions) => pipeline.submit(Submission {
                ticket: call.tickets,
                origin,
                actions,
                policy: loaded.policy,
            }),
            Err(error) => {
                tracing::error!(
                    plugin = loaded.plugin.name(),
                    object = %format!("{}/{}", origin.namespace, origin.name),
                    "dead-lettered: {error}"
                );
                let action = Action::Event {
                    event_type: EventType::Warning,
                    reason: crate::executors::PLUGIN_FAILED.into(),
                    message: error.to_string(),
                };
                let _ = done.send(call.tickets);
                self.executor.dead_letter(&origin, &action, &error);
            }
        }
        if let Some(next) = self.turns.finished(&key) {
            self.start(key, next);
        }
    }

    /// Calls running or waiting for their turn.
    pub fn in_flight(&self) -> usize {
        self.calls.len() + self.turns.waiting()
    }
}

/// One plugin's decision on one change, retried per the plugin's delivery
/// policy; the error it is dead-lettered with.
async fn decide(
    loaded: &Loaded,
    event: &ChangeEvent,
    observe: &dyn Observe,
) -> Result<Vec<Action>, ExecError> {
    let name = loaded.plugin.name();
    let mut attempt = 0;
    loop {
        let started = Instant::now();
        let result = loaded.plugin.decide(event).await;
        observe.called(name, result.is_ok(), started.elapsed().as_secs_f64());
        let error = match result {
            Ok(actions) => return Ok(actions),
            Err(e) => e,
        };
        if attempt == 0 {
            tracing::warn!(plugin = name, "plugin failed: {error}");
        } else {
            tracing::warn!(plugin = name, attempt, "plugin failed again: {error}");
        }
        if attempt >= loaded.policy.retries {
            return Err(ExecError::Permanent(format!(
                "plugin {name} failed: {error}"
            )));
        }
        attempt += 1;
        tokio::time::sleep(crate::pipeline::retry_delay(&loaded.policy, attempt)).await;
    }
}

/// Plugin calls in flight (waiting for their turn, deciding, retrying)
/// before the term stops reading watch outputs. Changes folded into a
/// waiting call cost no call, so a backlog over N objects and P plugins
/// needs about 2·N·P calls: with 1,024, a burst over a few hundred objects
/// folds (at 512, 20,000 changes over 200 objects mostly did not; each call
/// holds its change, ~13 KiB with 10 KiB of data, so the budget is ~13 MiB).
pub const CALLS_IN_FLIGHT: usize = 1024;

/// Pipeline jobs (waiting or running) before the term stops reading watch
/// outputs. Coalescing targets hold one job each; contents queue one per
/// change, so a destination failing for minutes would otherwise hold every
/// body written meanwhile. Not tickets: those legitimately wait out debounce
/// windows, and one app's window must not stall the others.
pub const QUEUED_JOBS: usize = 10_000;

/// What acts on a term's changes: the plugin calls, then the pipeline;
/// `T`s come back once a change's actions are all over. `wasmwatch run`
/// and the simulator both act through it (behind `kube::shell::Act`).
pub struct Stage<T> {
    decide: Decide<T>,
    pipeline: Pipeline<Vec<T>>,
    done_tx: tokio::sync::mpsc::UnboundedSender<Vec<T>>,
    done: tokio::sync::mpsc::UnboundedReceiver<Vec<T>>,
}

impl<T: Clone + Send + 'static> Stage<T> {
    /// `pipeline` starts the pipeline that sends finished changes on the
    /// sender it is given.
    pub fn new(
        decide: Decide<T>,
        pipeline: impl FnOnce(tokio::sync::mpsc::UnboundedSender<Vec<T>>) -> Pipeline<Vec<T>>,
    ) -> Self {
        let (done_tx, done) = tokio::sync::mpsc::unbounded_channel();
        Stage {
            decide,
            pipeline: pipeline(done_tx.clone()),
            done_tx,
            done,
        }
    }

    /// See [`Decide::dispatch`].
    pub fn dispatch(&mut self, ticket: T, event: ChangeEvent, plugins: &[usize]) {
        self.decide.dispatch(event, ticket, plugins);
    }

    /// What happened next: a call is over (its decision went to the
    /// pipeline: `None`), or changes whose actions are all over.
    pub async fn next(&mut self) -> Option<Vec<T>> {
        tokio::select! {
            biased;
            decided = self.decide.next() => {
                self.decide.settle(decided, &self.pipeline, &self.done_tx);
                None
            }
            Some(tickets) = self.done.recv() => Some(tickets),
        }
    }

    /// Whether more changes may come in ([`CALLS_IN_FLIGHT`],
    /// [`QUEUED_JOBS`]).
    pub fn accepting(&self) -> bool {
        self.decide.in_flight() < CALLS_IN_FLIGHT && self.queued() < QUEUED_JOBS
    }

    /// Pipeline jobs waiting or running.
    pub fn queued(&self) -> usize {
        self.pipeline
            .stats()
            .queued
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops deciding and executing (dropping a call ends its sandbox at
    /// once); the changes that finished meanwhile.
    pub fn stop(self) -> Vec<T> {
        let Stage {
            decide,
            pipeline,
            mut done,
            ..
        } = self;
        drop(decide);
        drop(pipeline);
        let mut late = Vec::new();
        while let Ok(tickets) = done.try_recv() {
            late.extend(tickets);
        }
        late
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::Duration;

    use wasmwatch_core::action::HttpMethod;
    use wasmwatch_core::event::{DataValue, ObjectSnapshot};
    use wasmwatch_core::{ChangeType, ObjectKind};

    use super::*;
    use crate::pipeline::{Executed, PipelineConfig};

    /// A plugin that fails its first `fails` calls, then POSTs the
    /// object's `v` after `takes`; every call is recorded.
    struct Script {
        fails: Mutex<u32>,
        takes: Duration,
        calls: Mutex<Vec<String>>,
    }

    impl Decider for Script {
        fn name(&self) -> &str {
            "script"
        }

        fn decide<'a>(
            &'a self,
            event: &'a ChangeEvent,
        ) -> BoxFuture<'a, Result<Vec<Action>, String>> {
            Box::pin(async move {
                let v = match event.object.data.get("v") {
                    Some(DataValue::Text(v)) => v.clone(),
                    _ => String::new(),
                };
                self.calls.lock().unwrap().push(v.clone());
                tokio::time::sleep(self.takes).await;
                let mut fails = self.fails.lock().unwrap();
                if *fails > 0 {
                    *fails -= 1;
                    return Err("scripted failure".into());
                }
                Ok(vec![Action::Http {
                    method: HttpMethod::Post,
                    url: "http://app/refresh".into(),
                    headers: Vec::new(),
                    body: Some(v.into_bytes()),
                }])
            })
        }
    }

    /// The app: records every body, and every dead letter.
    #[derive(Default)]
    struct App {
        got: Mutex<Vec<String>>,
        dead: Mutex<Vec<String>>,
    }

    impl Execute for App {
        fn execute<'a>(
            &'a self,
            _origin: &'a Origin,
            action: &'a Action,
        ) -> BoxFuture<'a, Result<Executed, ExecError>> {
            if let Action::Http { body: Some(b), .. } = action {
                self.got
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(b).into_owned());
            }
            Box::pin(async { Ok(Executed::default()) })
        }

        fn dead_letter(&self, origin: &Origin, _action: &Action, _error: &ExecError) {
            self.dead
                .lock()
                .unwrap()
                .push(origin.resource_version.clone());
        }
    }

    fn change(name: &str, v: u32) -> ChangeEvent {
        let object = ObjectSnapshot {
            kind: ObjectKind::ConfigMap,
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: v.to_string(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            data: BTreeMap::from([("v".to_string(), DataValue::Text(v.to_string()))]),
        };
        ChangeEvent::new(ChangeType::Modified, object, None)
    }

    fn stage(plugin: &Arc<Script>, app: &Arc<App>, retries: u32) -> Stage<u32> {
        let policy = Policy {
            retries,
            ..Policy::from(&wasmwatch_core::manifest::Delivery::default())
        };
        let decide = Decide::new(
            vec![Loaded {
                plugin: plugin.clone(),
                policy,
            }],
            app.clone(),
            Arc::new(Unobserved),
        );
        let app = app.clone();
        Stage::new(decide, move |done| {
            Pipeline::start(
                app,
                PipelineConfig::default(),
                Arc::new(|| true),
                None,
                done,
            )
        })
    }

    /// Runs the stage until `n` tickets are done; the tickets in order.
    async fn finish(stage: &mut Stage<u32>, n: usize) -> Vec<u32> {
        let mut done = Vec::new();
        while done.len() < n {
            if let Some(tickets) = stage.next().await {
                done.extend(tickets);
            }
        }
        done
    }

    fn script(fails: u32) -> Arc<Script> {
        Arc::new(Script {
            fails: Mutex::new(fails),
            takes: Duration::from_millis(100),
            calls: Mutex::new(Vec::new()),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_is_retried_and_the_changes_behind_it_fold_and_wait() {
        let (plugin, app) = (script(2), Arc::new(App::default()));
        let mut stage = stage(&plugin, &app, 5);
        stage.dispatch(1, change("a", 1), &[0]);
        stage.dispatch(2, change("a", 2), &[0]);
        stage.dispatch(3, change("a", 3), &[0]);
        stage.dispatch(4, change("b", 4), &[0]);
        assert_eq!(
            stage.decide.in_flight(),
            3,
            "a: one running, one waiting; b running"
        );
        let mut done = finish(&mut stage, 4).await;
        done.sort();
        assert_eq!(done, [1, 2, 3, 4]);
        // The first attempts for a and b fail, their retries decide, then
        // one call for a's 2 and 3 folded; a's contents reach the app in
        // change order.
        let calls = plugin.calls.lock().unwrap().clone();
        let a: Vec<&String> = calls.iter().filter(|v| *v != "4").collect();
        assert_eq!(a, ["1", "1", "3"]);
        assert_eq!(calls.len(), 5, "{calls:?}");
        let got = app.got.lock().unwrap().clone();
        let a: Vec<&String> = got.iter().filter(|v| *v != "4").collect();
        assert_eq!(a, ["1", "3"]);
        assert!(app.dead.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_failing_past_its_retries_is_dead_lettered_and_its_change_finished() {
        let (plugin, app) = (script(3), Arc::new(App::default()));
        let mut stage = stage(&plugin, &app, 2);
        stage.dispatch(7, change("a", 7), &[0]);
        let started = tokio::time::Instant::now();
        assert_eq!(finish(&mut stage, 1).await, [7]);
        // Three attempts, ~1 s and ~2 s of backoff between them (±25 %).
        assert_eq!(plugin.calls.lock().unwrap().len(), 3);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(2_550) && took < Duration::from_millis(4_100),
            "{took:?}"
        );
        assert!(app.got.lock().unwrap().is_empty());
        assert_eq!(*app.dead.lock().unwrap(), ["7"]);
        // The next change of the object is called for again.
        stage.dispatch(8, change("a", 8), &[0]);
        assert_eq!(finish(&mut stage, 1).await, [8]);
        assert_eq!(*app.got.lock().unwrap(), ["8"]);
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_ends_the_calls_and_gives_back_only_what_finished() {
        let (plugin, app) = (script(0), Arc::new(App::default()));
        let mut stage = stage(&plugin, &app, 0);
        stage.dispatch(1, change("a", 1), &[0]);
        assert_eq!(finish(&mut stage, 1).await, [1]);
        stage.dispatch(2, change("a", 2), &[0]);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(stage.stop().is_empty(), "the call for 2 was still running");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            *app.got.lock().unwrap(),
            ["1"],
            "a stopped call acts no more"
        );
    }
}
