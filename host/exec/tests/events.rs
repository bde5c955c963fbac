//! The Event recorder's aggregation against the in-memory API server over
//! real HTTP: a burst of occurrences becomes a handful of Events whose
//! counts add up (read back with kube, the server's request log and
//! kubectl), distinct Events stay distinct, a gone Event is created again.
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use wasmwatch_apiserver::{Config, Server, ServerHandle};
use wasmwatch_core::action::{EventType, RestartStrategy, WorkloadKind, WorkloadRef};
use wasmwatch_core::{Action, ObjectKind};
use wasmwatch_exec::Origin;
use wasmwatch_exec::executors::Executors;
use wasmwatch_exec::pipeline::Execute;
use wasmwatch_exec::recorder::{
    COMBINED_PREFIX, DEFAULT_CAPACITY, DEFAULT_CONCURRENCY, EventRecorder, RecorderConfig,
};
use wasmwatch_exec::workload::{KubeExecutor, hash_annotation_key};

const NS: &str = "shop";

async fn start() -> (ServerHandle, Client) {
    let server = Server::start(Config::default())
        .await
        .expect("server starts");
    let client = server.client().expect("client");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    (server, client)
}

fn executor(client: &Client) -> Arc<KubeExecutor> {
    Arc::new(KubeExecutor::new(
        client.clone(),
        "wasmwatch",
        "wasmwatch-7d9f-abcde",
    ))
}

/// A recorder with the defaults; the counter of dropped occurrences.
fn recorder(client: &Client) -> (EventRecorder, Arc<AtomicU64>) {
    recorder_with(client, RecorderConfig::default())
}

fn recorder_with(client: &Client, config: RecorderConfig) -> (EventRecorder, Arc<AtomicU64>) {
    let dropped = Arc::new(AtomicU64::new(0));
    let counted = dropped.clone();
    let recorder = EventRecorder::start_with(executor(client), config, move || {
        counted.fetch_add(1, Ordering::Relaxed);
    });
    (recorder, dropped)
}

async fn config_map(client: &Client, name: &str) -> Origin {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "data": {"k": "v"},
    }))
    .unwrap();
    let cm = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    Origin {
        kind: ObjectKind::ConfigMap,
        namespace: NS.into(),
        name: name.into(),
        uid: cm.metadata.uid.unwrap(),
        resource_version: cm.metadata.resource_version.unwrap(),
        plugin: "http-refresh".into(),
        unkeyed_digest: None,
        reloader_hash: None,
    }
}

async fn events(client: &Client) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

fn count(e: &Event) -> i64 {
    i64::from(e.count.unwrap_or(1))
}

/// Event writes the server answered: (POSTs, PATCHes).
fn event_writes(server: &ServerHandle) -> (usize, usize) {
    let writes = |verb: &str| {
        server
            .requests()
            .iter()
            .filter(|r| r.resource == "events" && r.verb == verb)
            .count()
    };
    (writes("create"), writes("patch"))
}

fn refreshed(o: &Origin) -> String {
    format!(
        "POST /actuator/refresh on every ready pod of Service shop/{}: 3 pods answered (plugin {})",
        o.name, o.plugin
    )
}

/// Checks the shape every aggregated Event must have.
fn check_times(e: &Event) {
    let first = e.first_timestamp.as_ref().expect("firstTimestamp").0;
    let last = e.last_timestamp.as_ref().expect("lastTimestamp").0;
    assert!(last >= first, "{last} before {first}: {e:?}");
    assert!(e.event_time.is_some(), "{e:?}");
}

/// 2,000 occurrences on 3 objects, as fast as they come: each object
/// gets one Event whose count is its share, none is dropped, and the
/// whole burst costs a few writes. `kubectl get events` lists the three
/// with their counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_three_objects_writes_a_handful_of_events() {
    let (server, client) = start().await;
    let mut origins = Vec::new();
    for name in ["orders", "billing", "stock"] {
        origins.push(config_map(&client, name).await);
    }
    let (recorder, dropped) = recorder(&client);
    server.clear_requests();
    let started = Instant::now();
    for i in 0..2000 {
        let o = &origins[i % 3];
        assert!(recorder.record(o, EventType::Normal, "Refreshed", refreshed(o)));
        // Let the writers run meanwhile, as in the service.
        if i % 10 == 9 {
            tokio::task::yield_now().await;
        }
    }
    let recorded = started.elapsed();
    assert!(recorder.flush(Duration::from_secs(30)).await);
    let (posts, patches) = event_writes(&server);
    eprintln!(
        "2,000 occurrences on 3 objects recorded in {recorded:?}, written by {:?}: \
         {posts} POST, {patches} PATCH",
        started.elapsed()
    );
    assert_eq!(dropped.load(Ordering::Relaxed), 0);
    assert_eq!(recorder.dropped(), 0);

    let events = events(&client).await;
    assert_eq!(
        events.iter().map(count).sum::<i64>(),
        2000,
        "every occurrence counted once: {events:#?}"
    );
    for o in &origins {
        let mine: Vec<&Event> = events
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(&o.name))
            .collect();
        assert!(
            !mine.is_empty() && mine.len() <= 3,
            "{}: {} Events",
            o.name,
            mine.len()
        );
        let share = (0..2000).filter(|i| i % 3 == origins.iter().position(|p| p == o).unwrap());
        assert_eq!(
            mine.iter().map(|e| count(e)).sum::<i64>(),
            share.count() as i64
        );
        for e in mine {
            check_times(e);
            assert_eq!(e.reason.as_deref(), Some("Refreshed"));
            assert_eq!(e.message.as_deref(), Some(refreshed(o).as_str()));
            assert_eq!(e.involved_object.uid.as_deref(), Some(o.uid.as_str()));
            assert_eq!(
                e.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("wasmwatch.io/plugin"))
                    .map(String::as_str),
                Some("http-refresh")
            );
        }
    }
    // A burst within the minimum interval: one POST per object, and one
    // PATCH per object for the rest at the flush (slack for a slow run).
    assert!(
        posts <= 6 && posts + patches <= 12,
        "{posts} POST, {patches} PATCH"
    );

    // kubectl lists them, with the count.
    let Some(kubectl) = Kubectl::new(&server) else {
        return;
    };
    let listed = kubectl.run(&["get", "events", "-n", NS]).await;
    for o in &origins {
        assert!(
            listed.contains(&format!("configmap/{}", o.name)),
            "{listed}"
        );
    }
    let wide = kubectl
        .run(&[
            "get",
            "events",
            "-n",
            NS,
            "-o",
            "custom-columns=OBJECT:.involvedObject.name,REASON:.reason,COUNT:.count,FIRST:.firstTimestamp,LAST:.lastTimestamp",
        ])
        .await;
    let mut total = 0;
    for line in wide.lines().skip(1) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[1], "Refreshed", "{wide}");
        assert!(
            cells[4] >= cells[3],
            "lastTimestamp before firstTimestamp: {wide}"
        );
        total += cells[2].parse::<i64>().expect("a count");
    }
    assert_eq!(total, 2000, "{wide}");
    // The server's own columns (-o wide has COUNT), as kube-apiserver prints.
    let table = kubectl
        .run(&["get", "events", "-n", NS, "-o", "wide"])
        .await;
    eprintln!("{table}");
    // `kubectl events` prints the count with the last time: `(x667 over 0s)`.
    let printed = kubectl.run(&["events", "-n", NS]).await;
    eprintln!("{printed}");
    for n in [667, 667, 666] {
        assert!(printed.contains(&format!("(x{n} over ")), "{printed}");
    }
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    let at = header
        .iter()
        .position(|c| *c == "COUNT")
        .expect("a COUNT column");
    let counts: i64 = table
        .lines()
        .skip(1)
        .map(|l| {
            // MESSAGE has spaces: count from the end (FIRST SEEN, COUNT, NAME).
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells[cells.len() - (header.len() - at)]
                .parse::<i64>()
                .unwrap()
        })
        .sum();
    assert_eq!(counts, 2000, "{table}");
}

/// Occurrences spread over a while: the Event is written at once, then at
/// most once per minimum interval, its count and lastTimestamp growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_stream_updates_one_event_once_per_interval() {
    let (server, client) = start().await;
    let o = config_map(&client, "orders").await;
    let interval = Duration::from_millis(200);
    let (recorder, dropped) = recorder_with(
        &client,
        RecorderConfig {
            min_interval: interval,
            ..RecorderConfig::default()
        },
    );
    server.clear_requests();
    let started = Instant::now();
    let mut seen = Vec::new();
    for i in 0..150 {
        recorder.record(&o, EventType::Normal, "Refreshed", refreshed(&o));
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Every 500 ms or more: at least one write in between.
        if i % 50 == 49 {
            let now = events(&client).await;
            assert_eq!(now.len(), 1, "{now:#?}");
            seen.push((count(&now[0]), now[0].last_timestamp.clone().unwrap().0));
        }
    }
    let elapsed = started.elapsed();
    assert!(recorder.flush(Duration::from_secs(10)).await);
    let events = events(&client).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(count(&events[0]), 150);
    check_times(&events[0]);
    assert_eq!(dropped.load(Ordering::Relaxed), 0);
    // The count grew while the stream went on.
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
        "{seen:?}"
    );
    let (posts, patches) = event_writes(&server);
    let most = 1 + (elapsed.as_millis() / interval.as_millis()) as usize + 1;
    eprintln!("150 occurrences over {elapsed:?}: {posts} POST, {patches} PATCH (at most {most})");
    assert_eq!(posts, 1);
    assert!(patches >= 2 && posts + patches <= most, "{patches} PATCH");
}

/// Objects, reasons, types, plugins, workloads and messages each keep
/// their own Event, each with its own count.
#[tokio::test]
async fn distinct_objects_reasons_and_messages_stay_distinct_events() {
    let (_server, client) = start().await;
    let a = config_map(&client, "orders").await;
    let b = config_map(&client, "billing").await;
    let other_plugin = Origin {
        plugin: "rollout-restart".into(),
        ..a.clone()
    };
    let web = WorkloadRef {
        kind: WorkloadKind::Deployment,
        namespace: NS.into(),
        name: "web".into(),
    };
    let (recorder, dropped) = recorder(&client);
    for _ in 0..5 {
        for o in [&a, &b, &other_plugin] {
            recorder.record(o, EventType::Normal, "Refreshed", "refreshed".into());
            recorder.record(o, EventType::Warning, "RefreshFailed", "failed".into());
        }
        // One object restarting two workloads: two messages, two Events.
        for w in ["web", "api"] {
            recorder.record(
                &a,
                EventType::Normal,
                "Restarted",
                format!("rollout restart of Deployment shop/{w}"),
            );
        }
        recorder.record_workload(
            &web,
            EventType::Normal,
            "Reloaded",
            "ConfigMap shop/orders changed".into(),
        );
    }
    assert!(recorder.flush(Duration::from_secs(10)).await);
    assert_eq!(dropped.load(Ordering::Relaxed), 0);
    let events = events(&client).await;
    let mut seen: Vec<(String, String, String, String, String, i64)> = events
        .iter()
        .map(|e| {
            check_times(e);
            (
                e.involved_object.kind.clone().unwrap(),
                e.involved_object.name.clone().unwrap(),
                e.type_.clone().unwrap(),
                e.reason.clone().unwrap(),
                e.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("wasmwatch.io/plugin").cloned())
                    .unwrap_or_default(),
                count(e),
            )
        })
        .collect();
    seen.sort();
    let row = |kind: &str, name: &str, t: &str, reason: &str, plugin: &str| {
        (
            kind.to_string(),
            name.to_string(),
            t.to_string(),
            reason.to_string(),
            plugin.to_string(),
            5,
        )
    };
    let mut expected = vec![
        row(
            "ConfigMap",
            "billing",
            "Normal",
            "Refreshed",
            "http-refresh",
        ),
        row(
            "ConfigMap",
            "billing",
            "Warning",
            "RefreshFailed",
            "http-refresh",
        ),
        row("ConfigMap", "orders", "Normal", "Refreshed", "http-refresh"),
        row(
            "ConfigMap",
            "orders",
            "Normal",
            "Refreshed",
            "rollout-restart",
        ),
        row("ConfigMap", "orders", "Normal", "Restarted", "http-refresh"),
        row("ConfigMap", "orders", "Normal", "Restarted", "http-refresh"),
        row(
            "ConfigMap",
            "orders",
            "Warning",
            "RefreshFailed",
            "http-refresh",
        ),
        row(
            "ConfigMap",
            "orders",
            "Warning",
            "RefreshFailed",
            "rollout-restart",
        ),
        row("Deployment", "web", "Normal", "Reloaded", ""),
    ];
    expected.sort();
    assert_eq!(seen, expected);
    let mut restarted: Vec<&str> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Restarted"))
        .filter_map(|e| e.message.as_deref())
        .collect();
    restarted.sort();
    assert_eq!(
        restarted,
        [
            "rollout restart of Deployment shop/api",
            "rollout restart of Deployment shop/web"
        ]
    );
}

/// A group's messages beyond ten go to one combined Event, as client-go's
/// aggregator does: 30 errors make 11 Events, not 30.
#[tokio::test]
async fn varying_messages_are_combined_after_ten() {
    let (_server, client) = start().await;
    let o = config_map(&client, "orders").await;
    let (recorder, _) = recorder(&client);
    for i in 0..30 {
        recorder.record(
            &o,
            EventType::Warning,
            "RefreshFailed",
            format!("POST http://10.0.0.{i}:8080/actuator/refresh: connection refused"),
        );
    }
    assert!(recorder.flush(Duration::from_secs(10)).await);
    let events = events(&client).await;
    assert_eq!(events.len(), 11, "{events:#?}");
    assert_eq!(events.iter().map(count).sum::<i64>(), 30);
    let combined: Vec<&Event> = events
        .iter()
        .filter(|e| {
            e.message
                .as_deref()
                .is_some_and(|m| m.starts_with(COMBINED_PREFIX))
        })
        .collect();
    assert_eq!(combined.len(), 1);
    assert_eq!(count(combined[0]), 20);
    assert_eq!(
        combined[0].message.as_deref(),
        Some(
            format!(
                "{COMBINED_PREFIX}POST http://10.0.0.29:8080/actuator/refresh: connection refused"
            )
            .as_str()
        )
    );
}

/// A deleted (or expired) Event is created again when its key repeats
/// (the PATCH is answered 404); after the window a repeat starts a new
/// Event.
#[tokio::test]
async fn a_gone_event_is_created_again_and_the_window_starts_anew() {
    let (server, client) = start().await;
    let o = config_map(&client, "orders").await;
    let window = Duration::from_millis(400);
    let (recorder, dropped) = recorder_with(
        &client,
        RecorderConfig {
            window,
            ..RecorderConfig::default()
        },
    );
    let api = Api::<Event>::namespaced(client.clone(), NS);
    for _ in 0..3 {
        recorder.record(&o, EventType::Normal, "Refreshed", refreshed(&o));
    }
    assert!(recorder.flush(Duration::from_secs(10)).await);
    let first = events(&client).await;
    assert_eq!(first.len(), 1);
    assert_eq!(count(&first[0]), 3);
    let first_name = first[0].metadata.name.clone().unwrap();
    api.delete(&first_name, &DeleteParams::default())
        .await
        .unwrap();

    server.clear_requests();
    recorder.record(&o, EventType::Normal, "Refreshed", refreshed(&o));
    recorder.record(&o, EventType::Normal, "Refreshed", refreshed(&o));
    assert!(recorder.flush(Duration::from_secs(10)).await);
    let again = events(&client).await;
    assert_eq!(again.len(), 1, "{again:#?}");
    assert_ne!(again[0].metadata.name.as_ref(), Some(&first_name));
    assert_eq!(count(&again[0]), 2);
    let verbs: Vec<(String, u16)> = server
        .requests()
        .iter()
        .filter(|r| r.resource == "events" && r.is_write())
        .map(|r| (r.verb.clone(), r.code))
        .collect();
    assert_eq!(
        verbs,
        [("patch".to_string(), 404), ("create".to_string(), 201)]
    );

    // Quiet for longer than the window: a new Event, the old one stays.
    tokio::time::sleep(window + Duration::from_millis(200)).await;
    recorder.record(&o, EventType::Normal, "Refreshed", refreshed(&o));
    assert!(recorder.flush(Duration::from_secs(10)).await);
    let after = events(&client).await;
    assert_eq!(after.len(), 2, "{after:#?}");
    let mut counts: Vec<i64> = after.iter().map(count).collect();
    counts.sort();
    assert_eq!(counts, [1, 2]);
    assert_eq!(dropped.load(Ordering::Relaxed), 0);
}

/// A WIT 0.3.0 restart's own strategy replaces its plugin's
/// `delivery.restartStrategy`: env-vars here, where the plugin's is
/// annotations; without one, the plugin's.
#[tokio::test]
async fn a_restarts_own_strategy_replaces_its_plugins() {
    let (_server, client) = start().await;
    let o = Origin {
        plugin: "v3".into(),
        ..config_map(&client, "orders").await
    };
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "example/app:1",
                                         "envFrom": [{"configMapRef": {"name": "orders"}}]}]},
            },
        },
    }))
    .unwrap();
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let kube = executor(&client);
    let executors = Executors {
        http: wasmwatch_exec::http::HttpExecutor::new(
            Arc::new(wasmwatch_core::lookups::StaticLookups::default()),
            Duration::from_secs(5),
        ),
        buses: wasmwatch_bus::Buses::new(&[]).unwrap(),
        kube: kube.clone(),
        events: EventRecorder::start(kube, DEFAULT_CAPACITY, DEFAULT_CONCURRENCY, || {
            panic!("nothing is dropped")
        }),
        on_reload: None,
        restart_strategies: [("v3".to_string(), RestartStrategy::Annotations)].into(),
    };
    let restart = |digest: &str, strategy| Action::Restart {
        workload: WorkloadRef {
            kind: WorkloadKind::Deployment,
            namespace: NS.into(),
            name: "web".into(),
        },
        reason: "ConfigMap shop/orders changed".into(),
        content_hash: format!("configmap/orders:{digest}"),
        strategy,
    };
    let (one, two) = ("1".repeat(64), "2".repeat(64));
    executors
        .execute(&o, &restart(&one, Some(RestartStrategy::EnvVars)))
        .await
        .unwrap();
    let template = |d: Deployment| serde_json::to_value(d.spec.template).unwrap();
    let after = template(deployments.get("web").await.unwrap());
    assert_eq!(
        after["spec"]["containers"][0]["env"],
        json!([{"name": "STAKATER_ORDERS_CONFIGMAP", "value": one}])
    );
    let key = hash_annotation_key(&format!("configmap/orders:{one}"));
    assert_eq!(after["metadata"]["annotations"][&key], Value::Null);
    executors.execute(&o, &restart(&two, None)).await.unwrap();
    let after = template(deployments.get("web").await.unwrap());
    let key = hash_annotation_key(&format!("configmap/orders:{two}"));
    assert_eq!(
        after["metadata"]["annotations"][&key],
        json!(format!("configmap/orders:{two}"))
    );
    assert_eq!(
        after["spec"]["containers"][0]["env"][0]["value"],
        json!(two),
        "the variable kept in step with the annotation (the newest record)"
    );
}

/// The restart executor's Events go through the recorder: two restarts of
/// one workload for one object make one `Reloaded` Event on the workload,
/// with count 2, and none on the object.
#[tokio::test]
async fn restart_events_are_aggregated_through_the_recorder() {
    let (_server, client) = start().await;
    let o = Origin {
        plugin: "rollout-restart".into(),
        ..config_map(&client, "orders").await
    };
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
            },
        },
    }))
    .unwrap();
    let created = Api::<Deployment>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let kube = executor(&client);
    let executors = Executors {
        http: wasmwatch_exec::http::HttpExecutor::new(
            Arc::new(wasmwatch_core::lookups::StaticLookups::default()),
            Duration::from_secs(5),
        ),
        buses: wasmwatch_bus::Buses::new(&[]).unwrap(),
        kube: kube.clone(),
        events: EventRecorder::start(kube, DEFAULT_CAPACITY, DEFAULT_CONCURRENCY, || {
            panic!("nothing is dropped")
        }),
        on_reload: None,
        restart_strategies: Default::default(),
    };
    let web = WorkloadRef {
        kind: WorkloadKind::Deployment,
        namespace: NS.into(),
        name: "web".into(),
    };
    for digest in ["1", "2"] {
        let action = Action::Restart {
            workload: web.clone(),
            reason: "ConfigMap shop/orders changed".into(),
            content_hash: format!("configmap/orders:{digest}"),
            strategy: None,
        };
        executors.execute(&o, &action).await.unwrap();
    }
    // Nothing for the same content again.
    let again = Action::Restart {
        workload: web.clone(),
        reason: "ConfigMap shop/orders changed".into(),
        content_hash: "configmap/orders:2".into(),
        strategy: None,
    };
    executors.execute(&o, &again).await.unwrap();
    assert!(executors.events.flush(Duration::from_secs(10)).await);
    let events = events(&client).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let reloaded = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("Reloaded"))
        .unwrap();
    assert_eq!(count(reloaded), 2);
    assert_eq!(reloaded.involved_object.kind.as_deref(), Some("Deployment"));
    assert_eq!(reloaded.involved_object.uid, created.metadata.uid);
    assert_eq!(
        reloaded.message.as_deref(),
        Some(
            "Changes detected in 'orders' of type 'CONFIGMAP' in namespace 'shop', \
             Updated 'web' of type 'Deployment' in namespace 'shop'"
        )
    );
    // Success is told on the workload only (issue 35): no `Restarted`
    // on the changed object.
    assert!(
        events
            .iter()
            .all(|e| e.reason.as_deref() != Some("Restarted")),
        "{events:#?}"
    );
}

/// Stakater Reloader's Events and count from the restart executor: a
/// restart for three objects, one of which the template already records,
/// rolls once (`on_reload` told `true` once) and writes `Reloaded` in
/// Reloader's words for each of the other two (nothing on the objects);
/// the same contents again write and count nothing. A failed
/// attempt (a 409, retryable; a deleted workload, for good) is counted
/// `false` and writes `ReloadFail` on the workload, each attempt.
#[tokio::test]
async fn restarts_write_reloaders_events_and_count_attempts() {
    let (server, client) = start().await;
    let mut origins = Vec::new();
    for name in ["a", "b", "c"] {
        origins.push(Origin {
            plugin: "rollout-restart".into(),
            ..config_map(&client, name).await
        });
    }
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {
                    wasmwatch_exec::workload::hash_annotation_key("configmap/c:1"): "configmap/c:1",
                }},
                "spec": {"containers": [{"name": "app", "image": "example/app:1"}]},
            },
        },
    }))
    .unwrap();
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let created = deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let kube = executor(&client);
    let counted = Arc::new(std::sync::Mutex::new(Vec::<(String, bool)>::new()));
    let executors = Executors {
        http: wasmwatch_exec::http::HttpExecutor::new(
            Arc::new(wasmwatch_core::lookups::StaticLookups::default()),
            Duration::from_secs(5),
        ),
        buses: wasmwatch_bus::Buses::new(&[]).unwrap(),
        kube: kube.clone(),
        events: EventRecorder::start(kube, DEFAULT_CAPACITY, DEFAULT_CONCURRENCY, || {
            panic!("nothing is dropped")
        }),
        on_reload: Some(Box::new({
            let counted = counted.clone();
            move |w: &WorkloadRef, success: bool| {
                counted.lock().unwrap().push((w.name.clone(), success));
            }
        })),
        restart_strategies: Default::default(),
    };
    let take = || std::mem::take(&mut *counted.lock().unwrap());
    let workload = |name: &str| WorkloadRef {
        kind: WorkloadKind::Deployment,
        namespace: NS.into(),
        name: name.into(),
    };
    let restarts = |name: &str, version: &str| -> Vec<(Origin, Action)> {
        origins
            .iter()
            .map(|o| {
                let action = Action::Restart {
                    workload: workload(name),
                    reason: format!("ConfigMap shop/{} changed", o.name),
                    content_hash: format!("configmap/{}:{version}", o.name),
                    strategy: None,
                };
                (o.clone(), action)
            })
            .collect()
    };

    // Three objects, one already recorded: one rollout, two Reloaded.
    executors
        .execute_restarts(&restarts("web", "1"))
        .await
        .unwrap();
    assert_eq!(take(), [("web".to_string(), true)]);
    assert_eq!(
        deployments.get("web").await.unwrap().metadata.generation,
        Some(2)
    );
    // The same contents again: nothing written, nothing counted.
    executors
        .execute_restarts(&restarts("web", "1"))
        .await
        .unwrap();
    assert_eq!(take(), []);

    // Conflicts on every re-read (one alone is read again at once, see
    // workload.rs): a failed attempt, then the retry patches.
    for _ in 0..=wasmwatch_exec::workload::CONFLICT_REREADS {
        server
            .faults()
            .conflict_next_write("deployments", NS, "web");
    }
    let error = executors
        .execute_restarts(&restarts("web", "2"))
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert_eq!(take(), [("web".to_string(), false)]);
    executors
        .execute_restarts(&restarts("web", "2"))
        .await
        .unwrap();
    assert_eq!(take(), [("web".to_string(), true)]);

    // A workload that is gone: a failure for good, counted the same.
    let error = executors
        .execute(&origins[0], &restarts("gone", "1")[0].1)
        .await
        .unwrap_err();
    assert!(!error.is_retryable(), "{error}");
    assert_eq!(take(), [("gone".to_string(), false)]);

    assert!(executors.events.flush(Duration::from_secs(10)).await);
    let events = events(&client).await;
    let on = |kind: &str, name: &str, reason: &str| -> Vec<&Event> {
        events
            .iter()
            .filter(|e| {
                e.involved_object.kind.as_deref() == Some(kind)
                    && e.involved_object.name.as_deref() == Some(name)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect()
    };
    let mut reloaded: Vec<(String, i64)> = on("Deployment", "web", "Reloaded")
        .iter()
        .map(|e| (e.message.clone().unwrap(), count(e)))
        .collect();
    reloaded.sort();
    let message = |object: &str| {
        format!(
            "Changes detected in '{object}' of type 'CONFIGMAP' in namespace 'shop', \
             Updated 'web' of type 'Deployment' in namespace 'shop'"
        )
    };
    // a and b twice (versions 1 and 2), c once (version 2 only).
    assert_eq!(
        reloaded,
        [(message("a"), 2), (message("b"), 2), (message("c"), 1)],
        "{events:#?}"
    );
    for e in on("Deployment", "web", "Reloaded") {
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(e.involved_object.uid, created.metadata.uid);
    }
    for o in ["a", "b", "c"] {
        assert!(
            on("ConfigMap", o, "Restarted").is_empty(),
            "no success Event on the object (issue 35): {events:#?}"
        );
    }

    let fail = on("Deployment", "web", "ReloadFail");
    assert_eq!(fail.len(), 1, "{events:#?}");
    assert_eq!(fail[0].type_.as_deref(), Some("Warning"));
    assert_eq!(count(fail[0]), 1);
    let text = fail[0].message.clone().unwrap();
    assert!(
        text.starts_with(
            "Update for 'web' of type 'Deployment' in namespace 'shop' failed with error \
             conflict (409) when patching the pod template: "
        ),
        "{text}"
    );
    let gone = on("Deployment", "gone", "ReloadFail");
    assert_eq!(gone.len(), 1, "{events:#?}");
    let text = gone[0].message.clone().unwrap();
    assert!(
        text.starts_with(
            "Update for 'gone' of type 'Deployment' in namespace 'shop' failed with error \
             not found (404) when reading the workload"
        ),
        "{text}"
    );
}

/// kubectl (an independent client) against the server, when installed.
struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
}

impl Kubectl {
    fn new(server: &ServerHandle) -> Option<Kubectl> {
        let path = std::env::var_os("PATH")?;
        let Some(bin) = std::env::split_paths(&path)
            .map(|d| d.join("kubectl"))
            .find(|p| p.is_file())
        else {
            eprintln!(
                "\n!!!!!!!! SKIPPING the kubectl part: kubectl is not installed (tests/prepare installs it) !!!!!!!!\n"
            );
            return None;
        };
        let dir = std::env::temp_dir().join(format!(
            "wasmwatch-exec-events-{}-{}",
            std::process::id(),
            server.addr().port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        server.write_kubeconfig(dir.join("kubeconfig")).unwrap();
        Some(Kubectl { bin, dir })
    }

    async fn run(&self, args: &[&str]) -> String {
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::process::Command::new(&self.bin)
                .arg("--kubeconfig")
                .arg(self.dir.join("kubeconfig"))
                .arg("--cache-dir")
                .arg(self.dir.join("cache"))
                .args(args)
                .env_remove("KUBECONFIG")
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("kubectl finished in time")
        .expect("kubectl runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

impl Drop for Kubectl {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
