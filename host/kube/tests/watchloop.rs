//! The checkpointed watch loop against the test API server.
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tokio::sync::mpsc;
use wasmwatch_apiserver::{Config, Server, ServerHandle};
use wasmwatch_core::{ChangeType, ObjectKind, Scope};
use wasmwatch_kube::watchloop::{Output, State, Watch, WatchLoop, WatchTarget};

fn target(ns: Option<&str>) -> WatchTarget {
    WatchTarget {
        kind: ObjectKind::ConfigMap,
        scope: ns.map_or(Scope::All, |ns| Scope::Namespace(ns.to_string())),
        label_selector: None,
        field_selector: None,
        metadata_changes: false,
        digest_key: None,
        remember: Default::default(),
        custom: None,
    }
}

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name}, "data": {"v": value}
    }))
    .unwrap()
}

async fn put(api: &Api<ConfigMap>, name: &str, value: &str) {
    let mut obj = api.get(name).await.unwrap();
    obj.data.as_mut().unwrap().insert("v".into(), value.into());
    api.replace(name, &PostParams::default(), &obj)
        .await
        .unwrap();
}

fn drain(rx: &mut mpsc::Receiver<Output>) -> Vec<Output> {
    let mut out = Vec::new();
    while let Ok(o) = rx.try_recv() {
        out.push(o);
    }
    out
}

/// Receives outputs until `n` changes arrived (or 10 s passed).
async fn recv_changes(rx: &mut mpsc::Receiver<Output>, n: usize) -> Vec<Output> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while changes(&out).len() < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(o)) => out.push(o),
            _ => break,
        }
    }
    out
}

/// A predecessor's index as stored: a baseline loop's index, through its
/// text form.
async fn stored_index(server: &ServerHandle) -> wasmwatch_core::index::ObjectIndex {
    let mut first = WatchLoop::new(server.client().unwrap(), target(Some("default")), None);
    let (tx, mut rx) = mpsc::channel(1000);
    first.step(&tx).await.unwrap();
    let Some(Output::Index(index)) = drain(&mut rx).pop() else {
        panic!("no index after the baseline")
    };
    wasmwatch_core::index::ObjectIndex::decode(ObjectKind::ConfigMap, &index.encode()).unwrap()
}

fn changes(outputs: &[Output]) -> Vec<(ChangeType, String)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Change { event, .. } => Some((event.change, event.object.name.clone())),
            Output::Progress { .. } | Output::Index(_) => None,
        })
        .collect()
}

async fn setup(n: usize) -> (ServerHandle, Api<ConfigMap>) {
    let server = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(server.client().unwrap(), "default");
    for i in 0..n {
        api.create(
            &PostParams::default(),
            &cm(&format!("o{i}"), &i.to_string()),
        )
        .await
        .unwrap();
    }
    (server, api)
}

#[tokio::test]
async fn resuming_from_a_checkpoint_replays_exactly_the_changes_after_it() {
    let (server, api) = setup(20).await;
    let checkpoint = server.resource_version().to_string();
    // Changes made while nobody watched.
    put(&api, "o3", "changed").await;
    api.create(&PostParams::default(), &cm("fresh", "x"))
        .await
        .unwrap();
    api.delete("o4", &DeleteParams::default()).await.unwrap();

    let mut lp = WatchLoop::new(
        server.client().unwrap(),
        target(Some("default")),
        Some(checkpoint),
    );
    let (tx, mut rx) = mpsc::channel(1000);
    let watching = tokio::spawn(async move {
        lp.step(&tx).await.unwrap();
        lp
    });
    let out = recv_changes(&mut rx, 3).await;
    server.faults().close_watches();
    let lp = watching.await.unwrap();
    assert_eq!(changes(&drain(&mut rx)), vec![], "nothing more");
    assert_eq!(
        changes(&out),
        vec![
            (ChangeType::Modified, "o3".to_string()),
            (ChangeType::Added, "fresh".to_string()),
            (ChangeType::Deleted, "o4".to_string()),
        ],
        "exactly the missed changes, in order, and no synthetic ADDED for the other 18"
    );
    assert!(matches!(lp.state(), State::Watch(_)));
}

/// Resuming without a stored index (none was stored, or it was set aside):
/// the loop rebuilds one from a list before watching, and hands it out
/// first. Without it a 410 relist delivered every object as added (a storm)
/// and saw no deletion. With it, only what was written after the checkpoint
/// comes out.
#[tokio::test]
async fn a_loop_resuming_without_a_stored_index_rebuilds_it_and_a_relist_stays_exact() {
    let (server, api) = setup(20).await;
    let checkpoint = server.resource_version().to_string();
    put(&api, "o3", "changed").await;
    server.faults().compact_history();
    let mut lp = WatchLoop::new(
        server.client().unwrap(),
        target(Some("default")),
        Some(checkpoint),
    );
    let (tx, mut rx) = mpsc::channel(1000);
    lp.step(&tx).await.unwrap(); // rebuild, then watch -> 410
    let out = drain(&mut rx);
    assert!(
        matches!(&out[..], [Output::Index(ix)] if ix.len() == 20),
        "the rebuilt index first: {out:?}"
    );
    assert!(matches!(lp.state(), State::Relist(_)), "{:?}", lp.state());
    api.delete("o5", &DeleteParams::default()).await.unwrap();
    lp.step(&tx).await.unwrap(); // relist against the rebuilt index
    let out = drain(&mut rx);
    assert_eq!(
        changes(&out),
        vec![
            (ChangeType::Resynced, "o3".to_string()),
            (ChangeType::Deleted, "o5".to_string())
        ],
        "what was written after the checkpoint, and the deletion; not 19 additions"
    );
}

#[tokio::test]
async fn a_baseline_delivers_nothing_and_then_only_content_changes() {
    let (server, api) = setup(5).await;
    let mut lp = WatchLoop::new(server.client().unwrap(), target(None), None);
    let (tx, mut rx) = mpsc::channel(1000);
    lp.step(&tx).await.unwrap();
    let out = drain(&mut rx);
    assert_eq!(changes(&out), vec![], "the first list is a baseline");
    assert!(matches!(&out[..], [Output::Progress { .. }, Output::Index(ix)] if ix.len() == 5));

    let watching = tokio::spawn(async move {
        lp.step(&tx).await.unwrap();
    });
    server.wait_for_watches(1).await;
    put(&api, "o1", "new").await;
    // A label-only change is no modification by default.
    let mut o2 = api.get("o2").await.unwrap();
    o2.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    api.replace("o2", &PostParams::default(), &o2)
        .await
        .unwrap();
    put(&api, "o1", "new").await; // same content again: nothing
    put(&api, "o3", "last").await; // a marker: when it arrives, all before it did
    let out = recv_changes(&mut rx, 2).await;
    server.faults().close_watches();
    watching.await.unwrap();
    assert_eq!(
        changes(&out),
        vec![
            (ChangeType::Modified, "o1".to_string()),
            (ChangeType::Modified, "o3".to_string())
        ]
    );
    assert_eq!(changes(&drain(&mut rx)), vec![]);
    let Output::Change {
        event,
        resource_version,
    } = out
        .iter()
        .find(|o| matches!(o, Output::Change { .. }))
        .unwrap()
    else {
        unreachable!()
    };
    assert_eq!(event.changed_keys, vec!["v"]);
    assert!(resource_version.is_some());
}

#[tokio::test]
async fn after_410_only_objects_changed_in_the_gap_are_delivered() {
    let (server, api) = setup(1000).await;
    let mut lp = WatchLoop::new(server.client().unwrap(), target(Some("default")), None);
    let (tx, mut rx) = mpsc::channel(10_000);
    lp.step(&tx).await.unwrap(); // baseline of 1000 objects, in pages
    let base = match drain(&mut rx).first() {
        Some(Output::Progress {
            resource_version, ..
        }) => resource_version.clone(),
        other => panic!("baseline: {other:?}"),
    };
    server.clear_requests();

    // The gap: three changes, then the history is gone.
    put(&api, "o5", "changed").await;
    api.delete("o7", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &cm("o1000", "new"))
        .await
        .unwrap();
    server.faults().compact_history();

    lp.step(&tx).await.unwrap(); // resume -> 410
    assert!(matches!(lp.state(), State::Relist(_)), "{:?}", lp.state());
    lp.step(&tx).await.unwrap(); // relist and diff
    let out = drain(&mut rx);
    let got = changes(&out);
    assert_eq!(
        got.len(),
        3,
        "exactly 3 deliveries for 3 changes among 1000 objects: {got:?}"
    );
    assert!(got.contains(&(ChangeType::Resynced, "o5".to_string())));
    assert!(got.contains(&(ChangeType::Deleted, "o7".to_string())));
    assert!(got.contains(&(ChangeType::Added, "o1000".to_string())));
    // The differences are handed out at the version the history was lost
    // from: the checkpoint cannot pass the relist until its end, the list's
    // version, which only the final progress carries.
    for o in &out {
        if let Output::Change {
            resource_version, ..
        } = o
        {
            assert_eq!(resource_version.as_deref(), Some(base.as_str()));
        }
    }
    let Output::Progress {
        resource_version: end,
        index_changed: true,
    } = &out[out.len() - 2]
    else {
        panic!("{:?}", out[out.len() - 2])
    };
    assert!(end.parse::<u64>().unwrap() > base.parse::<u64>().unwrap());
    // 1,000 objects after the gap, listed in pages of 250.
    let lists = server
        .requests()
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "configmaps")
        .count();
    assert_eq!(lists, 4, "paged list");
    assert!(matches!(out[out.len() - 2], Output::Progress { .. }));
    assert!(matches!(out.last(), Some(Output::Index(ix)) if ix.len() == 1000));
    assert!(matches!(lp.state(), State::Watch(_)));
}

#[tokio::test]
async fn a_loop_started_from_a_stored_index_resyncs_against_it() {
    // A predecessor's loop handled 50 objects and its index was stored.
    let (server, api) = setup(50).await;
    let stored = stored_index(&server).await;
    let checkpoint = server.resource_version().to_string();
    let (tx, mut rx) = mpsc::channel(1000);

    // The gap outlives the history.
    put(&api, "o9", "changed").await;
    server.faults().compact_history();

    let mut next = WatchLoop::new(
        server.client().unwrap(),
        target(Some("default")),
        Some(checkpoint),
    )
    .with_index(stored);
    next.step(&tx).await.unwrap(); // 410
    next.step(&tx).await.unwrap(); // relist against the stored index
    assert_eq!(
        changes(&drain(&mut rx)),
        vec![(ChangeType::Resynced, "o9".to_string())],
        "one change, not 50 additions"
    );
}

#[tokio::test]
async fn a_change_back_to_the_stored_content_after_the_checkpoint_is_delivered() {
    // The index was stored with o1 = "A"; the previous leader then handled
    // o1 = "B" and checkpointed it, and o1 went back to "A" before anyone
    // handled that. The index is older than the checkpoint, so the last
    // change looks like no change against it, but it is one.
    let (server, api) = setup(3).await;
    put(&api, "o1", "A").await;
    let stored = stored_index(&server).await;
    let (tx, mut rx) = mpsc::channel(1000);
    put(&api, "o1", "B").await;
    let checkpoint = server.resource_version().to_string();
    put(&api, "o1", "A").await;
    // And o2 only gets a label: without metadataChanges, once verified, such
    // changes stay quiet; the first one after a resume is delivered (at
    // least once: its content may have changed in between too).
    let mut o2 = api.get("o2").await.unwrap();
    o2.metadata.labels = Some([("team".to_string(), "x".to_string())].into());
    api.replace("o2", &PostParams::default(), &o2)
        .await
        .unwrap();

    let mut next = WatchLoop::new(
        server.client().unwrap(),
        target(Some("default")),
        Some(checkpoint),
    )
    .with_index(stored);
    let watching = tokio::spawn(async move {
        next.step(&tx).await.unwrap();
        next
    });
    let out = recv_changes(&mut rx, 2).await;
    assert_eq!(
        changes(&out),
        vec![
            (ChangeType::Modified, "o1".to_string()),
            (ChangeType::Modified, "o2".to_string())
        ]
    );
    // Verified now: another label change is no change (it would arrive
    // before o1's).
    let mut o2 = api.get("o2").await.unwrap();
    o2.metadata.labels = Some([("team".to_string(), "y".to_string())].into());
    api.replace("o2", &PostParams::default(), &o2)
        .await
        .unwrap();
    put(&api, "o1", "C").await;
    let out = recv_changes(&mut rx, 1).await;
    assert_eq!(
        changes(&out),
        vec![(ChangeType::Modified, "o1".to_string())]
    );
    server.faults().close_watches();
    watching.await.unwrap();
}

/// Issue 19's first loss, against the test API server: the index was stored
/// with o1 = "A", the previous leader handled o1 = "B" and checkpointed it,
/// then, while nobody led and longer than the history, o1 went back to "A".
/// The next leader meets 410 and relists: o1's content equals the stored
/// index, but it was written after the checkpoint, so it is delivered (the
/// apps hold B). Objects untouched since the checkpoint stay quiet.
#[tokio::test]
async fn a_revert_in_a_gap_past_the_history_is_delivered_by_the_relist() {
    let (server, api) = setup(20).await;
    put(&api, "o1", "A").await;
    let stored = stored_index(&server).await;
    let (tx, mut rx) = mpsc::channel(1000);
    put(&api, "o1", "B").await;
    let checkpoint = server.resource_version().to_string();
    put(&api, "o1", "A").await;
    server.faults().compact_history();

    let mut next = WatchLoop::new(
        server.client().unwrap(),
        target(Some("default")),
        Some(checkpoint),
    )
    .with_index(stored);
    next.step(&tx).await.unwrap(); // 410
    assert!(
        matches!(next.state(), State::Relist(_)),
        "{:?}",
        next.state()
    );
    next.step(&tx).await.unwrap(); // relist
    let out = drain(&mut rx);
    assert_eq!(
        changes(&out),
        vec![(ChangeType::Resynced, "o1".to_string())],
        "the revert, and nothing of the 19 untouched objects"
    );
    let Some(Output::Change { event, .. }) = out.first() else {
        panic!("{out:?}")
    };
    assert_eq!(event.object.data["v"].as_bytes(), b"A");
    assert_eq!(event.changed_keys, ["v"], "unknown: every key");
}

#[tokio::test]
async fn a_baseline_does_not_keep_objects_of_a_stored_index_that_are_gone() {
    // An index stored with o0..o2; o2 is deleted; a loop without a checkpoint
    // (a baseline) is handed the index anyway.
    let (server, api) = setup(3).await;
    let mut first = WatchLoop::new(server.client().unwrap(), target(Some("default")), None);
    let (tx, mut rx) = mpsc::channel(1000);
    first.step(&tx).await.unwrap();
    let Some(Output::Index(stored)) = drain(&mut rx).pop() else {
        panic!("no index after the baseline")
    };
    drop(first);
    api.delete("o2", &DeleteParams::default()).await.unwrap();
    let mut next =
        WatchLoop::new(server.client().unwrap(), target(Some("default")), None).with_index(stored);
    next.step(&tx).await.unwrap(); // baseline: delivers nothing
    assert_eq!(changes(&drain(&mut rx)), vec![]);
    // The history is lost: the relist finds nothing gone, o2 included.
    server.faults().compact_history();
    next.step(&tx).await.unwrap(); // watch: 410
    next.step(&tx).await.unwrap(); // relist
    assert_eq!(changes(&drain(&mut rx)), vec![]);
}

#[tokio::test]
async fn the_index_is_sent_while_changes_come_at_most_every_interval() {
    let (server, api) = setup(3).await;
    let mut lp = WatchLoop::new(server.client().unwrap(), target(Some("default")), None);
    lp.index_interval = std::time::Duration::from_millis(300);
    let (tx, mut rx) = mpsc::channel(1000);
    lp.step(&tx).await.unwrap();
    drain(&mut rx);
    let watching = tokio::spawn(async move {
        lp.step(&tx).await.unwrap();
    });
    server.wait_for_watches(1).await;
    for i in 0..5 {
        put(&api, "o1", &format!("v{i}")).await;
    }
    // After the burst, the index is sent once the interval passed, with no
    // further event needed.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    server.faults().close_watches();
    watching.await.unwrap();
    let out = drain(&mut rx);
    assert_eq!(changes(&out).len(), 5);
    let indexes = out.iter().filter(|o| matches!(o, Output::Index(_))).count();
    assert!(
        (1..=2).contains(&indexes),
        "{indexes} indexes for 5 changes in a burst: {out:?}"
    );
    assert!(
        matches!(out.last(), Some(Output::Index(_))),
        "the last state is sent"
    );
}

#[tokio::test]
async fn a_silent_watch_is_abandoned_and_resumed() {
    let (server, _api) = setup(1).await;
    let mut lp = WatchLoop::new(server.client().unwrap(), target(Some("default")), None);
    lp.idle_timeout = std::time::Duration::from_millis(300);
    let (tx, _rx) = mpsc::channel(100);
    lp.step(&tx).await.unwrap(); // baseline
    let State::Watch(Watch { from, .. }) = lp.state().clone() else {
        panic!("{:?}", lp.state())
    };
    // No changes, no bookmarks (the server's interval is 60 s): the step
    // returns after the idle timeout instead of hanging.
    tokio::time::timeout(std::time::Duration::from_secs(5), lp.step(&tx))
        .await
        .expect("the silent watch was not abandoned")
        .unwrap();
    assert!(
        matches!(lp.state(), State::Watch(w) if w.from == from),
        "{:?}",
        lp.state()
    );
}

/// A watch with a label selector: an object that loses the label comes as a
/// DELETED carrying its previous state (the one that still matched),
/// stamped with the relabel's resourceVersion, as kube-apiserver sends it.
/// The loop delivers it as a deletion of what the plugins last saw (labels
/// that match), its checkpoint moves to the relabel, and gaining the label
/// again is an addition.
#[tokio::test]
async fn an_object_leaving_the_selector_is_a_deletion_of_its_matching_state() {
    let (server, api) = setup(0).await;
    for name in ["a", "b"] {
        let mut o = cm(name, "1");
        o.metadata.labels = Some([("team".to_string(), "shop".to_string())].into());
        api.create(&PostParams::default(), &o).await.unwrap();
    }
    let mut selected = target(Some("default"));
    selected.label_selector = Some("team=shop".into());
    let mut lp = WatchLoop::new(server.client().unwrap(), selected, None);
    let (tx, mut rx) = mpsc::channel(1000);
    lp.step(&tx).await.unwrap();
    assert_eq!(changes(&drain(&mut rx)), vec![], "the baseline");
    let watching = tokio::spawn(async move {
        lp.step(&tx).await.unwrap();
    });
    server.wait_for_watches(1).await;

    let mut a = api.get("a").await.unwrap();
    a.metadata.labels = Some([("team".to_string(), "billing".to_string())].into());
    a.data.as_mut().unwrap().insert("v".into(), "2".into());
    let relabelled = api.replace("a", &PostParams::default(), &a).await.unwrap();
    let relabel_rv = relabelled.metadata.resource_version.clone().unwrap();
    a = relabelled;
    a.metadata.labels = Some([("team".to_string(), "shop".to_string())].into());
    api.replace("a", &PostParams::default(), &a).await.unwrap();
    put(&api, "b", "marker").await;
    let out = recv_changes(&mut rx, 3).await;
    server.faults().close_watches();
    watching.await.unwrap();
    assert_eq!(
        changes(&out),
        vec![
            (ChangeType::Deleted, "a".to_string()),
            (ChangeType::Added, "a".to_string()),
            (ChangeType::Modified, "b".to_string()),
        ]
    );
    let Some(Output::Change {
        event,
        resource_version,
    }) = out.iter().find(|o| matches!(o, Output::Change { .. }))
    else {
        unreachable!()
    };
    assert_eq!(resource_version.as_deref(), Some(relabel_rv.as_str()));
    assert_eq!(event.object.resource_version, relabel_rv);
    assert_eq!(
        event.object.labels["team"], "shop",
        "the state that matched"
    );
    assert_eq!(
        event.object.data["v"],
        wasmwatch_core::DataValue::Text("1".into()),
        "its content before the relabel"
    );
}
