//! The delivery pipeline's rules on paused time. The executor here is a
//! scripted recorder (the real executors have their own tests against real
//! servers; the end-to-end tests put them together).
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use wasmwatch_core::action::{EventType, HttpMethod, WorkloadKind, WorkloadRef};
use wasmwatch_core::{Action, ObjectKind};
use wasmwatch_exec::pipeline::{
    BoxFuture, Execute, Executed, Outcome, PauseOf, Pipeline, PipelineConfig, Policy, RateLimit,
    Report, Submission,
};
use wasmwatch_exec::{ExecError, Origin};

#[derive(Default)]
struct Recorder {
    /// (when, action type, object of the origin)
    calls: Mutex<Vec<(Instant, Action, String)>>,
    /// Results to return, in order; Ok once empty.
    script: Mutex<VecDeque<Result<(), ExecError>>>,
    dead: Mutex<Vec<(String, ExecError)>>,
    delay: Mutex<Duration>,
    /// (when, content hashes) of each merged restart.
    merged: Mutex<Vec<(Instant, Vec<String>)>>,
    /// (object, wait) of each throttled job.
    throttled: Mutex<Vec<(String, Duration)>>,
}

fn hash_of(a: &Action) -> String {
    match a {
        Action::Restart { content_hash, .. } => content_hash.clone(),
        other => panic!("not a restart: {other:?}"),
    }
}

impl Execute for Recorder {
    fn execute<'a>(
        &'a self,
        origin: &'a Origin,
        action: &'a Action,
    ) -> BoxFuture<'a, Result<Executed, ExecError>> {
        Box::pin(async move {
            self.calls
                .lock()
                .unwrap()
                .push((Instant::now(), action.clone(), origin.name.clone()));
            let delay = *self.delay.lock().unwrap();
            tokio::time::sleep(delay).await;
            let result = self.script.lock().unwrap().pop_front().unwrap_or(Ok(()));
            result.map(|()| Executed::default())
        })
    }

    fn dead_letter(&self, origin: &Origin, _action: &Action, error: &ExecError) {
        self.dead
            .lock()
            .unwrap()
            .push((origin.name.clone(), error.clone()));
    }

    fn execute_restarts<'a>(
        &'a self,
        restarts: &'a [(Origin, Action)],
    ) -> BoxFuture<'a, Result<Executed, ExecError>> {
        Box::pin(async move {
            let hashes = restarts.iter().map(|(_, a)| hash_of(a)).collect();
            self.merged.lock().unwrap().push((Instant::now(), hashes));
            Ok(Executed::default())
        })
    }

    fn throttled(&self, origin: &Origin, _action: &Action, wait: Duration, _cooldown: Duration) {
        self.throttled
            .lock()
            .unwrap()
            .push((origin.name.clone(), wait));
    }
}

fn restart_of(workload: &str, hash: &str) -> Action {
    Action::Restart {
        workload: WorkloadRef {
            kind: WorkloadKind::Deployment,
            namespace: "shop".into(),
            name: workload.into(),
        },
        reason: "r".into(),
        content_hash: hash.into(),
        strategy: None,
    }
}

fn origin(name: &str) -> Origin {
    Origin {
        kind: ObjectKind::ConfigMap,
        namespace: "shop".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: "1".into(),
        plugin: "http-refresh".into(),
        unkeyed_digest: None,
        reloader_hash: None,
    }
}

fn refresh(service: &str) -> Action {
    Action::RefreshService {
        namespace: "shop".into(),
        service: service.into(),
        method: HttpMethod::Post,
        port: None,
        path: "/actuator/refresh".into(),
        tls: false,
    }
}

fn event() -> Action {
    Action::Event {
        event_type: EventType::Normal,
        reason: "Refreshed".into(),
        message: "m".into(),
    }
}

fn policy(debounce_ms: u64, retries: u32) -> Policy {
    Policy {
        debounce: Duration::from_millis(debounce_ms),
        retries,
        backoff_initial: Duration::from_secs(1),
        backoff_max: Duration::from_secs(60),
        cooldown: Duration::ZERO,
    }
}

struct Harness {
    rec: Arc<Recorder>,
    pipeline: Pipeline<u32>,
    done: mpsc::UnboundedReceiver<u32>,
    reports: Arc<Mutex<Vec<Report>>>,
    leading: Arc<std::sync::atomic::AtomicBool>,
}

fn harness(config: PipelineConfig) -> Harness {
    harness_with(config, None)
}

fn harness_with(config: PipelineConfig, pauses: Option<PauseOf>) -> Harness {
    let rec = Arc::new(Recorder::default());
    let (tx, done) = mpsc::unbounded_channel();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let r = reports.clone();
    let leading = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let l = leading.clone();
    let pipeline = Pipeline::start_with_pauses(
        rec.clone(),
        config,
        pauses,
        Arc::new(move || l.load(std::sync::atomic::Ordering::SeqCst)),
        Some(Arc::new(move |rep: &Report| {
            r.lock().unwrap().push(rep.clone())
        })),
        tx,
    );
    Harness {
        rec,
        pipeline,
        done,
        reports,
        leading,
    }
}

fn unlimited() -> PipelineConfig {
    let none = RateLimit {
        rate: 1e9,
        burst: 1e9,
    };
    PipelineConfig {
        global: none,
        per_target: none,
    }
}

async fn done_within(h: &mut Harness, d: Duration) -> Vec<u32> {
    let mut out = Vec::new();
    let deadline = Instant::now() + d;
    while let Ok(Some(t)) = tokio::time::timeout_at(deadline, h.done.recv()).await {
        out.push(t);
    }
    out.sort();
    out
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_50_changes_to_one_app_gives_one_refresh_after_the_debounce() {
    let mut h = harness(unlimited());
    let start = Instant::now();
    for i in 0..50u32 {
        h.pipeline.submit(Submission {
            ticket: i,
            origin: origin(&format!("cm-{}", i % 10)),
            actions: vec![refresh("orders")],
            policy: policy(2000, 5),
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = done_within(&mut h, Duration::from_secs(10)).await;
    assert_eq!(done, (0..50).collect::<Vec<_>>(), "every ticket completes");
    let calls = h.rec.calls.lock().unwrap();
    assert_eq!(calls.len(), 1, "one refresh for the burst");
    let waited = calls[0].0 - start;
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_millis(2100),
        "{waited:?}"
    );
    let rep = h.reports.lock().unwrap();
    assert_eq!(rep[0].origins.len(), 10, "the ten ConfigMaps coalesced");
    assert_eq!(
        h.pipeline
            .stats()
            .coalesced
            .load(std::sync::atomic::Ordering::Relaxed),
        49
    );
}

/// Debounce 0 means now: the job must not wait for a timer, which tokio
/// rounds up to its next millisecond (on paused time the clock would jump
/// by it; in the service it was ~1 ms of every change's latency, issue 24).
#[tokio::test(start_paused = true)]
async fn with_debounce_0_an_action_runs_at_the_instant_it_was_submitted() {
    let mut h = harness(unlimited());
    for i in 0..3u32 {
        // Off the millisecond grid (a sleep would land on it).
        tokio::time::advance(Duration::from_micros(300)).await;
        let submitted = Instant::now();
        h.pipeline.submit(Submission {
            ticket: i,
            origin: origin(&format!("cm-{i}")),
            actions: vec![refresh(&format!("app-{i}"))],
            policy: policy(0, 0),
        });
        assert_eq!(h.done.recv().await, Some(i));
        let calls = h.rec.calls.lock().unwrap();
        assert_eq!(calls.len(), i as usize + 1);
        assert_eq!(calls[i as usize].0, submitted, "change {i} waited");
    }
}

#[tokio::test(start_paused = true)]
async fn two_500s_then_200_is_done_after_retries_with_backoff() {
    let mut h = harness(unlimited());
    h.rec.script.lock().unwrap().extend([
        Err(ExecError::Retryable("500".into())),
        Err(ExecError::Retryable("500".into())),
    ]);
    let start = Instant::now();
    h.pipeline.submit(Submission {
        ticket: 7,
        origin: origin("orders"),
        actions: vec![refresh("orders")],
        policy: policy(0, 5),
    });
    assert_eq!(done_within(&mut h, Duration::from_secs(30)).await, vec![7]);
    let calls = h.rec.calls.lock().unwrap();
    assert_eq!(calls.len(), 3);
    // Backoff 1 s then 2 s, each ±25 %.
    let d1 = calls[1].0 - calls[0].0;
    let d2 = calls[2].0 - calls[1].0;
    assert!(
        (750..=1250).contains(&(d1.as_millis() as u64)),
        "{d1:?} after {:?}",
        calls[0].0 - start
    );
    assert!((1500..=2500).contains(&(d2.as_millis() as u64)), "{d2:?}");
    assert!(h.rec.dead.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_always_failing_target_is_dead_lettered_after_the_retry_budget() {
    let mut h = harness(unlimited());
    h.rec
        .script
        .lock()
        .unwrap()
        .extend((0..10).map(|_| Err(ExecError::Retryable("503".into()))));
    h.pipeline.submit(Submission {
        ticket: 1,
        origin: origin("orders"),
        actions: vec![refresh("orders")],
        policy: policy(0, 3),
    });
    assert_eq!(done_within(&mut h, Duration::from_secs(60)).await, vec![1]);
    assert_eq!(h.rec.calls.lock().unwrap().len(), 4, "1 + 3 retries");
    let dead = h.rec.dead.lock().unwrap();
    assert_eq!(
        *dead,
        vec![("orders".to_string(), ExecError::Retryable("503".into()))]
    );
    let last = h.reports.lock().unwrap().last().cloned().unwrap();
    assert!(matches!(last.outcome, Outcome::DeadLettered { .. }));
}

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_is_not_retried() {
    let mut h = harness(unlimited());
    h.rec
        .script
        .lock()
        .unwrap()
        .push_back(Err(ExecError::Permanent("404".into())));
    h.pipeline.submit(Submission {
        ticket: 1,
        origin: origin("orders"),
        actions: vec![refresh("orders")],
        policy: policy(0, 5),
    });
    assert_eq!(done_within(&mut h, Duration::from_secs(5)).await, vec![1]);
    assert_eq!(h.rec.calls.lock().unwrap().len(), 1);
    assert_eq!(h.rec.dead.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_ticket_completes_only_when_all_its_actions_finished() {
    let mut h = harness(unlimited());
    h.rec
        .script
        .lock()
        .unwrap()
        .push_back(Err(ExecError::Retryable("500".into())));
    h.pipeline.submit(Submission {
        ticket: 1,
        origin: origin("orders"),
        actions: vec![refresh("orders"), refresh("billing"), event()],
        policy: policy(0, 5),
    });
    // Two actions succeed at once; the failed one needs ~1 s.
    assert_eq!(
        done_within(&mut h, Duration::from_millis(500)).await,
        Vec::<u32>::new()
    );
    assert_eq!(done_within(&mut h, Duration::from_secs(5)).await, vec![1]);
    // No actions: complete at once.
    h.pipeline.submit(Submission {
        ticket: 2,
        origin: origin("orders"),
        actions: vec![],
        policy: policy(1000, 5),
    });
    assert_eq!(done_within(&mut h, Duration::from_millis(1)).await, vec![2]);
}

#[tokio::test(start_paused = true)]
async fn a_change_during_a_running_refresh_is_refreshed_again_after_it() {
    let mut h = harness(unlimited());
    *h.rec.delay.lock().unwrap() = Duration::from_millis(500);
    h.pipeline.submit(Submission {
        ticket: 1,
        origin: origin("a"),
        actions: vec![refresh("orders")],
        policy: policy(0, 0),
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Running now: these two coalesce into one more run, after the first.
    for t in [2, 3] {
        h.pipeline.submit(Submission {
            ticket: t,
            origin: origin("b"),
            actions: vec![refresh("orders")],
            policy: policy(0, 0),
        });
    }
    assert_eq!(
        done_within(&mut h, Duration::from_secs(5)).await,
        vec![1, 2, 3]
    );
    let calls = h.rec.calls.lock().unwrap();
    assert_eq!(calls.len(), 2);
    assert!(
        calls[1].0 - calls[0].0 >= Duration::from_millis(500),
        "not concurrent"
    );
}

/// Issue 20's burst control: restarts of one workload for several objects
/// within the window are one job, every object's latest hash in it (they
/// were one job per object: two rollouts); other workloads stay apart.
#[tokio::test(start_paused = true)]
async fn events_are_never_coalesced_and_restarts_of_one_workload_merge() {
    let mut h = harness(unlimited());
    h.pipeline.submit(Submission {
        ticket: 1,
        origin: origin("a"),
        actions: vec![
            event(),
            event(),
            restart_of("orders", "configmap/a:1"),
            restart_of("orders", "configmap/a:2"),
            restart_of("billing", "configmap/a:2"),
        ],
        policy: policy(100, 0),
    });
    h.pipeline.submit(Submission {
        ticket: 2,
        origin: origin("b"),
        actions: vec![restart_of("orders", "secret/b:9")],
        policy: policy(100, 0),
    });
    let mut done = done_within(&mut h, Duration::from_secs(1)).await;
    done.sort();
    assert_eq!(done, vec![1, 2]);
    let calls = h.rec.calls.lock().unwrap();
    let single: Vec<String> = calls
        .iter()
        .filter(|(_, a, _)| matches!(a, Action::Restart { .. }))
        .map(|(_, a, _)| hash_of(a))
        .collect();
    assert_eq!(calls.len(), 3, "2 events + billing's restart: {calls:?}");
    assert_eq!(single, vec!["configmap/a:2"], "billing's, alone");
    let merged = h.rec.merged.lock().unwrap();
    assert_eq!(merged.len(), 1, "orders rolls once: {merged:?}");
    assert_eq!(
        merged[0].1,
        vec!["configmap/a:2", "secret/b:9"],
        "the latest hash of each object"
    );
}

/// A flapping object: after a restart, the workload's next one waits for
/// the cooldown, everything submitted meanwhile merging into it (the last
/// content of each object winning), and the hold is reported once.
#[tokio::test(start_paused = true)]
async fn a_cooldown_holds_and_merges_what_changes_meanwhile() {
    let mut h = harness(unlimited());
    let cooling = Policy {
        cooldown: Duration::from_secs(10),
        ..policy(0, 0)
    };
    let t0 = Instant::now();
    let submit = |h: &Harness, ticket: u32, object: &str, hash: &str| {
        h.pipeline.submit(Submission {
            ticket,
            origin: origin(object),
            actions: vec![restart_of("orders", hash)],
            policy: cooling,
        })
    };
    submit(&h, 1, "a", "configmap/a:1");
    assert_eq!(
        done_within(&mut h, Duration::from_millis(100)).await,
        vec![1]
    );
    for (i, hash) in ["configmap/a:2", "configmap/a:3"].iter().enumerate() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        submit(&h, 2 + i as u32, "a", hash);
    }
    submit(&h, 4, "b", "secret/b:1");
    assert!(
        done_within(&mut h, Duration::from_secs(7)).await.is_empty(),
        "held for the cooldown"
    );
    let mut done = done_within(&mut h, Duration::from_secs(3)).await;
    done.sort();
    assert_eq!(done, vec![2, 3, 4]);
    {
        let calls = h.rec.calls.lock().unwrap();
        assert_eq!(calls.len(), 1, "only the first, alone: {calls:?}");
        let merged = h.rec.merged.lock().unwrap();
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].1, vec!["configmap/a:3", "secret/b:1"]);
        let at = merged[0].0 - t0;
        assert!(
            at >= Duration::from_secs(10) && at < Duration::from_millis(10_100),
            "{at:?}"
        );
        let throttled = h.rec.throttled.lock().unwrap();
        assert_eq!(throttled.len(), 1, "once per held job: {throttled:?}");
        assert_eq!(throttled[0].0, "a");
        assert!(throttled[0].1 > Duration::from_secs(8), "{throttled:?}");
    }
    // After the cooldown, a change acts at once again.
    tokio::time::sleep(Duration::from_secs(15)).await;
    submit(&h, 5, "a", "configmap/a:4");
    assert_eq!(
        done_within(&mut h, Duration::from_millis(100)).await,
        vec![5]
    );
    assert_eq!(h.rec.throttled.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_stops_leading_executes_nothing_and_completes_nothing() {
    let mut h = harness(unlimited());
    h.rec
        .script
        .lock()
        .unwrap()
        .push_back(Err(ExecError::Retryable("500".into())));
    h.pipeline.submit(Submission {
        ticket: 1,
        origin: origin("a"),
        actions: vec![refresh("orders")],
        policy: policy(0, 5),
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.rec.calls.lock().unwrap().len(), 1);
    h.leading.store(false, std::sync::atomic::Ordering::SeqCst);
    h.pipeline.submit(Submission {
        ticket: 2,
        origin: origin("b"),
        actions: vec![refresh("billing")],
        policy: policy(0, 5),
    });
    assert_eq!(
        done_within(&mut h, Duration::from_secs(30)).await,
        Vec::<u32>::new()
    );
    assert_eq!(
        h.rec.calls.lock().unwrap().len(),
        1,
        "no attempt after losing the lead"
    );
    assert_eq!(
        h.pipeline
            .stats()
            .abandoned
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn the_global_rate_limit_spreads_executions() {
    let mut h = harness(PipelineConfig {
        global: RateLimit {
            rate: 10.0,
            burst: 1.0,
        },
        per_target: RateLimit {
            rate: 1e9,
            burst: 1e9,
        },
    });
    let start = Instant::now();
    for i in 0..21u32 {
        h.pipeline.submit(Submission {
            ticket: i,
            origin: origin("a"),
            actions: vec![refresh(&format!("svc-{i}"))],
            policy: policy(0, 0),
        });
    }
    assert_eq!(done_within(&mut h, Duration::from_secs(10)).await.len(), 21);
    let calls = h.rec.calls.lock().unwrap();
    let last = calls.iter().map(|c| c.0).max().unwrap() - start;
    assert!(
        last >= Duration::from_millis(1900) && last <= Duration::from_millis(2200),
        "21 calls at 10/s with a burst of 1 take ~2 s: {last:?}"
    );
}

fn post_content(body: &str) -> Action {
    Action::Http {
        method: HttpMethod::Post,
        url: "http://127.0.0.1:9/ledger".into(),
        headers: vec![],
        body: Some(body.as_bytes().to_vec()),
    }
}

fn publish(payload: &str) -> Action {
    Action::Publish {
        connection: "bus".into(),
        destination: "springCloudBus".into(),
        routing_key: "#".into(),
        headers: vec![],
        payload: payload.as_bytes().to_vec(),
    }
}

fn body_of(a: &Action) -> String {
    match a {
        Action::Http { body, .. } => String::from_utf8(body.clone().unwrap_or_default()).unwrap(),
        Action::Publish { payload, .. } => String::from_utf8(payload.clone()).unwrap(),
        other => panic!("{other:?}"),
    }
}

/// Issue 19: A then B of one object, A answered 503 once. Keyed per
/// message, B ran while A waited out its backoff, and A's retry landed
/// last: the receiver ended on A. Now B waits for A's retry.
#[tokio::test(start_paused = true)]
async fn one_objects_contents_land_in_the_order_of_its_changes_retries_included() {
    for action in [post_content as fn(&str) -> Action, publish] {
        let mut h = harness(unlimited());
        h.rec
            .script
            .lock()
            .unwrap()
            .push_back(Err(ExecError::Retryable("503".into())));
        h.pipeline.submit(Submission {
            ticket: 1,
            origin: origin("orders"),
            actions: vec![action("A")],
            policy: policy(0, 5),
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        h.pipeline.submit(Submission {
            ticket: 2,
            origin: origin("orders"),
            actions: vec![action("B")],
            policy: policy(0, 5),
        });
        assert_eq!(
            done_within(&mut h, Duration::from_secs(10)).await,
            vec![1, 2]
        );
        let calls: Vec<String> = h
            .rec
            .calls
            .lock()
            .unwrap()
            .iter()
            .map(|(_, a, _)| body_of(a))
            .collect();
        assert_eq!(calls, ["A", "A", "B"], "the last content lands last");
    }
}

/// While an older content runs, newer ones of the same object wait, and
/// every one is delivered in order (a plugin may post only what a change
/// touched: skipping one would lose it). Two messages of one decision to one
/// destination (bus-refresh: one per app) both go. Other objects' contents
/// to the same URL are not held.
#[tokio::test(start_paused = true)]
async fn waiting_contents_of_one_object_all_land_in_order_and_other_objects_are_not_held() {
    let mut h = harness(unlimited());
    *h.rec.delay.lock().unwrap() = Duration::from_millis(100);
    let submit = |h: &Harness, ticket, name: &str, actions: Vec<Action>| {
        h.pipeline.submit(Submission {
            ticket,
            origin: origin(name),
            actions,
            policy: policy(0, 5),
        })
    };
    submit(&h, 1, "orders", vec![post_content("A")]);
    tokio::time::sleep(Duration::from_millis(10)).await;
    submit(&h, 2, "orders", vec![post_content("B")]);
    submit(&h, 3, "orders", vec![post_content("C")]);
    submit(&h, 4, "billing", vec![post_content("X")]);
    submit(&h, 5, "shared", vec![publish("app-1"), publish("app-2")]);
    assert_eq!(
        done_within(&mut h, Duration::from_secs(10)).await,
        vec![1, 2, 3, 4, 5]
    );
    let calls: Vec<(String, String)> = h
        .rec
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, a, o)| (o.clone(), body_of(a)))
        .collect();
    let of = |name: &str| -> Vec<String> {
        calls
            .iter()
            .filter(|(o, _)| o == name)
            .map(|(_, b)| b.clone())
            .collect()
    };
    assert_eq!(of("orders"), ["A", "B", "C"], "each content, in order");
    assert_eq!(
        of("shared"),
        ["app-1", "app-2"],
        "both messages of the decision"
    );
    assert_eq!(of("billing"), ["X"]);
    // billing's call did not wait for orders' running one.
    let starts: Vec<Instant> = h.rec.calls.lock().unwrap().iter().map(|c| c.0).collect();
    assert!(
        starts[1] - starts[0] < Duration::from_millis(50),
        "{starts:?}"
    );
}

/// Reloader's pause period, per workload: its restarts wait for the pause
/// after one (the longer of it and the plugin's cooldown), other workloads
/// act at once.
#[tokio::test(start_paused = true)]
async fn a_workloads_pause_period_holds_its_next_restart() {
    let pauses: PauseOf = Arc::new(|a: &Action| match a {
        Action::Restart { workload, .. } if workload.name == "paused" => {
            Some(Duration::from_secs(5))
        }
        _ => None,
    });
    let mut h = harness_with(unlimited(), Some(pauses));
    let t0 = Instant::now();
    let submit = |h: &Harness, ticket: u32, workload: &str, hash: &str| {
        h.pipeline.submit(Submission {
            ticket,
            origin: origin("a"),
            actions: vec![restart_of(workload, hash)],
            policy: policy(0, 0),
        })
    };
    submit(&h, 1, "paused", "configmap/a:1");
    submit(&h, 2, "free", "configmap/a:1");
    assert_eq!(
        done_within(&mut h, Duration::from_millis(100)).await,
        vec![1, 2]
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    submit(&h, 3, "paused", "configmap/a:2");
    submit(&h, 4, "free", "configmap/a:2");
    assert_eq!(
        done_within(&mut h, Duration::from_millis(100)).await,
        vec![4],
        "only the paused workload waits"
    );
    assert_eq!(done_within(&mut h, Duration::from_secs(4)).await, vec![3]);
    let calls = h.rec.calls.lock().unwrap();
    let (at, action, _) = calls.last().unwrap();
    assert_eq!(hash_of(action), "configmap/a:2");
    assert!(*at - t0 >= Duration::from_secs(5), "{:?}", *at - t0);
    let throttled = h.rec.throttled.lock().unwrap();
    assert_eq!(throttled.len(), 1, "{throttled:?}");
}
