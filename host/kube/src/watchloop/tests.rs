//! The loop's transitions on paused time, over a scripted collection API:
//! what each step asks of the API and what it hands out.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use kube::api::{ObjectList, ObjectMeta, PartialObjectMeta};
use kube::core::{ListMeta, Status, TypeMeta};
use serde_json::json;
use tokio::time::Instant;

use super::*;

/// One item of a scripted watch stream.
enum Step {
    Event(Box<WatchEvent<DynamicObject>>),
    /// The stream fails (a broken connection).
    Fail(kube::Error),
    /// Nothing for this long.
    After(Duration),
    /// Nothing ever again (the idle timeout ends it).
    Hang,
}

/// A request the loop made, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    /// The collection's version (a metadata list of one).
    Version,
    /// A list page (its continue token).
    List(Option<String>),
    /// A watch from this version.
    Watch(String),
}

#[derive(Default)]
struct Script {
    versions: VecDeque<kube::Result<String>>,
    lists: VecDeque<kube::Result<ObjectList<DynamicObject>>>,
    watches: VecDeque<kube::Result<Vec<Step>>>,
    calls: Vec<(Instant, Call)>,
}

/// An [`ObjectApi`] answering from a script; an unscripted call panics.
#[derive(Clone, Default)]
struct Scripted(Arc<Mutex<Script>>);

impl Scripted {
    fn version(&self, rv: &str) -> &Self {
        self.0.lock().unwrap().versions.push_back(Ok(rv.into()));
        self
    }

    fn list(&self, rv: &str, items: Vec<DynamicObject>) -> &Self {
        self.list_page(rv, items, None)
    }

    fn list_page(&self, rv: &str, items: Vec<DynamicObject>, next: Option<&str>) -> &Self {
        let list = ObjectList {
            types: TypeMeta::default(),
            metadata: ListMeta {
                resource_version: Some(rv.into()),
                continue_: next.map(str::to_string),
                ..Default::default()
            },
            items,
        };
        self.0.lock().unwrap().lists.push_back(Ok(list));
        self
    }

    fn list_fails(&self) -> &Self {
        self.0.lock().unwrap().lists.push_back(Err(broken()));
        self
    }

    fn watch(&self, steps: Vec<Step>) -> &Self {
        self.0.lock().unwrap().watches.push_back(Ok(steps));
        self
    }

    fn watch_refused(&self, e: kube::Error) -> &Self {
        self.0.lock().unwrap().watches.push_back(Err(e));
        self
    }

    /// The requests made since the last call, forgetting them.
    fn calls(&self) -> Vec<Call> {
        self.timed_calls().into_iter().map(|(_, c)| c).collect()
    }

    fn timed_calls(&self) -> Vec<(Instant, Call)> {
        std::mem::take(&mut self.0.lock().unwrap().calls)
    }

    fn called(&self, call: Call) {
        self.0.lock().unwrap().calls.push((Instant::now(), call));
    }
}

impl ObjectApi for Scripted {
    async fn list(&self, lp: &ListParams) -> kube::Result<ObjectList<DynamicObject>> {
        self.called(Call::List(lp.continue_token.clone()));
        let next = self.0.lock().unwrap().lists.pop_front();
        next.expect("an unscripted list")
    }

    async fn list_metadata(
        &self,
        _lp: &ListParams,
    ) -> kube::Result<ObjectList<PartialObjectMeta<DynamicObject>>> {
        self.called(Call::Version);
        let next = self.0.lock().unwrap().versions.pop_front();
        let rv = next.expect("an unscripted version read")?;
        Ok(ObjectList {
            types: TypeMeta::default(),
            metadata: ListMeta {
                resource_version: Some(rv),
                ..Default::default()
            },
            items: Vec::new(),
        })
    }

    async fn watch(
        &self,
        _wp: &WatchParams,
        version: &str,
    ) -> kube::Result<BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>> {
        self.called(Call::Watch(version.into()));
        let next = self.0.lock().unwrap().watches.pop_front();
        let steps: VecDeque<Step> = next.expect("an unscripted watch")?.into();
        Ok(futures_util::stream::unfold(steps, |mut steps| async move {
            loop {
                match steps.pop_front()? {
                    Step::Event(e) => return Some((Ok(*e), steps)),
                    Step::Fail(e) => return Some((Err(e), steps)),
                    Step::After(d) => tokio::time::sleep(d).await,
                    Step::Hang => std::future::pending::<()>().await,
                }
            }
        })
        .boxed())
    }
}

fn target() -> WatchTarget {
    WatchTarget {
        kind: ObjectKind::ConfigMap,
        scope: Scope::Namespace("prod".into()),
        label_selector: None,
        field_selector: None,
        metadata_changes: false,
        digest_key: None,
        remember: Default::default(),
        custom: None,
    }
}

/// ConfigMap `prod/name` at version `rv` with `data` (`key=value` pairs).
fn cm(name: &str, rv: u64, data: &[(&str, &str)]) -> DynamicObject {
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    DynamicObject {
        types: Some(TypeMeta {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        }),
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("prod".into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(rv.to_string()),
            ..Default::default()
        },
        data: json!({ "data": data }),
    }
}

fn added(o: DynamicObject) -> Step {
    Step::Event(Box::new(WatchEvent::Added(o)))
}

fn modified(o: DynamicObject) -> Step {
    Step::Event(Box::new(WatchEvent::Modified(o)))
}

fn deleted(o: DynamicObject) -> Step {
    Step::Event(Box::new(WatchEvent::Deleted(o)))
}

fn bookmark(rv: u64) -> Step {
    Step::Event(Box::new(WatchEvent::Bookmark(
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "resourceVersion": rv.to_string() }
        }))
        .unwrap(),
    )))
}

fn expired() -> Box<Status> {
    Box::new(Status::failure("too old resource version", "Expired").with_code(410))
}

/// A 410 as an ERROR event on the stream.
fn gone_event() -> Step {
    Step::Event(Box::new(WatchEvent::Error(expired())))
}

/// A 410 refusing the watch request.
fn gone_error() -> kube::Error {
    kube::Error::Api(expired())
}

fn broken() -> kube::Error {
    kube::Error::Service("connection reset".into())
}

/// An index (as an earlier leader stored it) of these objects.
fn index_of(objects: &[DynamicObject]) -> ObjectIndex {
    let mut index = target().new_index();
    for o in objects {
        let mut value = o.data.clone();
        value["kind"] = json!("ConfigMap");
        value["metadata"] = serde_json::to_value(&o.metadata).unwrap();
        let snapshot = ObjectSnapshot::from_json(&value).unwrap();
        index.apply(Seen::Added, snapshot, false);
    }
    ObjectIndex::decode(ObjectKind::ConfigMap, &index.encode()).unwrap()
}

/// An output in short: `Modified a@12 replay [k]`, `progress 12`,
/// `listed 12` (a progress whose index changed), `index a,b`.
fn show(o: &Output) -> String {
    match o {
        Output::Change {
            event,
            resource_version,
        } => format!(
            "{:?} {}@{}{} [{}]",
            event.change,
            event.object.name,
            resource_version.as_deref().unwrap_or("-"),
            if event.replay { " replay" } else { "" },
            event.changed_keys.join(",")
        ),
        Output::Progress {
            resource_version,
            index_changed: false,
        } => format!("progress {resource_version}"),
        Output::Progress {
            resource_version,
            index_changed: true,
        } => format!("listed {resource_version}"),
        Output::Index(index) => {
            let names: Vec<_> = index
                .encode()
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .map(|k| k.trim_start_matches("prod/").to_string())
                .collect();
            format!("index {}", names.join(","))
        }
    }
}

/// What the loop handed out since the last call, in short.
fn drain(rx: &mut mpsc::Receiver<Output>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(o) = rx.try_recv() {
        out.push(show(&o));
    }
    out
}

fn channel() -> (mpsc::Sender<Output>, mpsc::Receiver<Output>) {
    mpsc::channel(1000)
}

/// A loop that took a baseline of `objects` at version `rv` (its outputs
/// and requests are left behind).
async fn after_baseline(
    api: &Scripted,
    rv: &str,
    objects: Vec<DynamicObject>,
) -> WatchLoop<Scripted> {
    api.list(rv, objects);
    let mut lp = WatchLoop::with_api(api.clone(), target(), None);
    lp.step(&channel().0).await.unwrap();
    api.calls();
    lp
}

#[test]
fn backoff_grows_and_is_capped() {
    let b1 = backoff(1).as_secs_f64();
    assert!((0.15..=0.25).contains(&b1), "{b1}");
    let b5 = backoff(5).as_secs_f64();
    assert!((2.4..=4.0).contains(&b5), "{b5}");
    let b50 = backoff(50).as_secs_f64();
    assert!((22.5..=37.5).contains(&b50), "{b50}");
}

/// Start without a checkpoint: the list is the baseline (nothing
/// delivered, its version and the index handed out), then a watch from
/// its version delivers live changes.
#[tokio::test(start_paused = true)]
async fn without_a_checkpoint_the_loop_lists_a_baseline_then_watches_from_it() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    api.list(
        "10",
        vec![cm("a", 5, &[("k", "1")]), cm("b", 7, &[("k", "1")])],
    );
    let mut lp = WatchLoop::with_api(api.clone(), target(), None);
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls(), [Call::List(None)]);
    assert_eq!(drain(&mut rx), ["listed 10", "index a,b"]);

    api.watch(vec![
        modified(cm("a", 11, &[("k", "2")])),
        added(cm("c", 12, &[("k", "1")])),
    ]);
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls(), [Call::Watch("10".into())]);
    assert_eq!(
        drain(&mut rx),
        ["Modified a@11 [k]", "Added c@12 [k]"],
        "live changes: no replays"
    );
}

/// Start from a checkpoint: read the collection's version, then watch from
/// the checkpoint (no list): exactly the changes after it arrive; the
/// stream's end resumes from where it reached.
#[tokio::test(start_paused = true)]
async fn with_a_checkpoint_the_loop_reads_the_version_and_watches_from_the_checkpoint() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let stored = index_of(&[cm("a", 5, &[("k", "1")]), cm("b", 6, &[("k", "1")])]);
    api.version("10").watch(vec![
        modified(cm("a", 11, &[("k", "2")])),
        deleted(cm("b", 12, &[("k", "1")])),
    ]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into())).with_index(stored);
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls(), [Call::Version, Call::Watch("10".into())]);
    assert_eq!(
        drain(&mut rx),
        ["Modified a@11 [k]", "Deleted b@12 [k]"],
        "after the version read when the loop started: live"
    );

    api.watch(vec![]);
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls(), [Call::Watch("12".into())], "no second read");
}

/// Resuming without a stored index: the loop lists first to rebuild one and
/// hands it out before anything else, then watches from the checkpoint.
#[tokio::test(start_paused = true)]
async fn resuming_without_a_stored_index_rebuilds_it_from_a_list_first() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    api.version("20")
        .list(
            "20",
            vec![cm("a", 5, &[("k", "1")]), cm("b", 15, &[("k", "1")])],
        )
        .watch(vec![modified(cm("b", 21, &[("k", "2")]))]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into()));
    lp.step(&tx).await.unwrap();
    assert_eq!(
        api.calls(),
        [Call::Version, Call::List(None), Call::Watch("10".into())]
    );
    assert_eq!(drain(&mut rx), ["index a,b", "Modified b@21 [k]"]);
}

/// A rebuild that fails is retried; the version read before it is kept.
#[tokio::test(start_paused = true)]
async fn a_failed_rebuild_is_retried_without_reading_the_version_again() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    api.version("20")
        .list_fails()
        .list("20", vec![cm("a", 5, &[("k", "1")])])
        .watch(vec![
            modified(cm("a", 12, &[("k", "2")])),
            modified(cm("a", 21, &[("k", "3")])),
        ]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into()));
    assert!(lp.step(&tx).await.is_err());
    assert_eq!(api.calls(), [Call::Version, Call::List(None)]);
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls(), [Call::List(None), Call::Watch("10".into())]);
    assert_eq!(
        drain(&mut rx),
        ["index a", "Modified a@12 replay [k]", "Modified a@21 [k]"],
        "the changes up to the version read first are replays"
    );
}

/// A 410 refusing the watch request: the loop relists and delivers only
/// what differs from its index, at the version the history was lost
/// from; then it watches from the list's version.
#[tokio::test(start_paused = true)]
async fn a_410_refusing_the_watch_relists_against_the_index_then_watches_from_the_list() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let a = cm("a", 5, &[("k", "1")]);
    let b = cm("b", 6, &[("k", "1")]);
    let c = cm("c", 7, &[("k", "1")]);
    let mut lp = after_baseline(&api, "10", vec![a, b.clone(), c]).await;
    drain(&mut rx);

    api.watch_refused(gone_error());
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls(), [Call::Watch("10".into())]);
    assert_eq!(drain(&mut rx), Vec::<String>::new());

    api.list(
        "30",
        vec![cm("a", 25, &[("k", "2")]), b, cm("d", 28, &[("k", "1")])],
    );
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls(), [Call::List(None)]);
    assert_eq!(
        drain(&mut rx),
        [
            "Resynced a@10 [k]",
            "Added d@10 [k]",
            "Deleted c@10 []",
            "listed 30",
            "index a,b,d"
        ],
        "b is unchanged: not delivered"
    );

    api.watch(vec![]);
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls(), [Call::Watch("30".into())]);
}

/// A 410 as an ERROR event on the stream: the relist's floor is the last
/// version the stream handed out. An object equal to the index but written
/// after it is delivered (a revert while nobody could see it); one last
/// written at or before it is not.
#[tokio::test(start_paused = true)]
async fn a_410_on_the_stream_relists_from_the_version_the_watch_reached() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let a = cm("a", 5, &[("k", "1")]);
    let b = cm("b", 6, &[("k", "1")]);
    let mut lp = after_baseline(&api, "10", vec![a, b]).await;

    api.watch(vec![modified(cm("a", 12, &[("k", "2")])), gone_event()]);
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls(), [Call::Watch("10".into())]);
    assert_eq!(drain(&mut rx), ["Modified a@12 [k]"]);

    // b went to 2 and back to 1 while the history was lost.
    api.list(
        "30",
        vec![cm("a", 12, &[("k", "2")]), cm("b", 20, &[("k", "1")])],
    );
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls(), [Call::List(None)]);
    assert_eq!(
        drain(&mut rx),
        ["Resynced b@12 [k]", "listed 30", "index a,b"],
        "the revert, at the floor; not a"
    );
}

/// A relist in pages that fails is retried from its first page at the
/// same floor.
#[tokio::test(start_paused = true)]
async fn a_failed_relist_is_retried_at_the_same_floor() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let a = cm("a", 5, &[("k", "1")]);
    let b = cm("b", 6, &[("k", "1")]);
    let mut lp = after_baseline(&api, "10", vec![a.clone(), b.clone()]).await;
    api.watch_refused(gone_error());
    lp.step(&tx).await.unwrap();
    api.calls();

    api.list_page("30", vec![a.clone()], Some("p2"))
        .list_fails();
    assert!(lp.step(&tx).await.is_err());
    assert_eq!(
        api.calls(),
        [Call::List(None), Call::List(Some("p2".into()))]
    );
    api.list_page("31", vec![a], Some("p2")).list_page(
        "31",
        vec![cm("b", 31, &[("k", "2")])],
        None,
    );
    lp.step(&tx).await.unwrap();
    assert_eq!(
        api.calls(),
        [Call::List(None), Call::List(Some("p2".into()))]
    );
    assert_eq!(
        drain(&mut rx),
        ["Resynced b@10 [k]", "listed 31", "index a,b"]
    );
}

/// A 410 right after a relist, with no event in between, backs off before
/// the next relist (longer each time); an event in between starts over.
#[tokio::test(start_paused = true)]
async fn a_410_again_right_after_a_relist_backs_off_before_relisting() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let a = cm("a", 5, &[("k", "1")]);
    let mut lp = after_baseline(&api, "10", vec![a.clone()]).await;

    // The time from the 410 (the watch request) to the relist's list.
    let gap = |api: &Scripted| {
        let calls = api.timed_calls();
        let [(watched, Call::Watch(_)), (listed, Call::List(_))] = &calls[..] else {
            panic!("{calls:?}")
        };
        *listed - *watched
    };
    let ms = |d: Duration| d.as_millis();
    for (i, expected) in [(0, 0..=0), (1, 150..=250), (2, 300..=500)] {
        api.watch_refused(gone_error())
            .list(&(20 + i).to_string(), vec![a.clone()]);
        lp.step(&tx).await.unwrap();
        lp.step(&tx).await.unwrap();
        let waited = ms(gap(&api));
        assert!(expected.contains(&waited), "410 #{}: {waited} ms", i + 1);
    }
    // A 410 on the stream right after a relist counts too.
    api.watch(vec![gone_event()]).list("30", vec![a.clone()]);
    lp.step(&tx).await.unwrap();
    lp.step(&tx).await.unwrap();
    let waited = ms(gap(&api));
    assert!((600..=1000).contains(&waited), "410 #4: {waited} ms");

    // An event in between: the next 410 relists at once.
    api.watch(vec![bookmark(31), gone_event()])
        .list("40", vec![a]);
    lp.step(&tx).await.unwrap();
    lp.step(&tx).await.unwrap();
    assert_eq!(ms(gap(&api)), 0);
    drain(&mut rx);
}

/// Resuming: the changes up to the collection's version when the loop
/// started are replays, held until the replay is over and handed out
/// newest per object (the keys of all its held changes; a creation if it
/// was one), in version order, before the first live change; no progress
/// goes out meanwhile.
#[tokio::test(start_paused = true)]
async fn replays_are_held_until_a_live_change_then_go_out_newest_per_object() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let stored = index_of(&[
        cm("a", 5, &[("k", "1"), ("l", "1")]),
        cm("b", 6, &[("k", "1")]),
    ]);
    api.version("20").watch(vec![
        modified(cm("a", 12, &[("k", "2"), ("l", "1")])),
        added(cm("n", 13, &[("k", "1")])),
        modified(cm("b", 14, &[("k", "2")])),
        modified(cm("a", 15, &[("k", "2"), ("l", "2")])),
        modified(cm("n", 16, &[("k", "2")])),
        modified(cm("b", 21, &[("k", "3")])),
    ]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into())).with_index(stored);
    lp.step(&tx).await.unwrap();
    assert_eq!(
        drain(&mut rx),
        [
            "Modified b@14 replay [k]",
            "Modified a@15 replay [k,l]",
            "Added n@16 replay [k]",
            "Modified b@21 [k]",
        ]
    );
}

/// Held replays go out once nothing more came for `REPLAY_QUIET`; a watch
/// that ends meanwhile goes on holding them, and the next one waits a
/// quiet period again.
#[tokio::test(start_paused = true)]
async fn held_replays_go_out_once_the_replay_is_quiet_across_a_reconnection() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let stored = index_of(&[cm("a", 5, &[("k", "1")]), cm("b", 6, &[("k", "1")])]);
    api.version("20")
        .watch(vec![modified(cm("a", 12, &[("k", "2")]))])
        .watch(vec![
            Step::After(Duration::from_millis(100)),
            modified(cm("b", 13, &[("k", "2")])),
            Step::Hang,
        ]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into())).with_index(stored);
    lp.idle_timeout = Duration::from_secs(2);
    lp.step(&tx).await.unwrap();
    assert_eq!(drain(&mut rx), Vec::<String>::new(), "held across the end");

    let started = Instant::now();
    let watching = tokio::spawn(async move {
        lp.step(&tx).await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(340)).await;
    assert_eq!(drain(&mut rx), Vec::<String>::new(), "b came at 100 ms");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        drain(&mut rx),
        ["Modified a@12 replay [k]", "Modified b@13 replay [k]"],
        "quiet for 250 ms after b"
    );
    watching.await.unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(2100),
        "then idle for 2 s after b"
    );
    assert_eq!(
        drain(&mut rx),
        Vec::<String>::new(),
        "the index waits for its interval"
    );
}

/// A bookmark before the replay's end passes nothing; one at or past it
/// ends the replay: the held changes go out, then the progress.
#[tokio::test(start_paused = true)]
async fn a_bookmark_past_the_replay_releases_the_held_changes_before_its_progress() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let stored = index_of(&[cm("a", 5, &[("k", "1")])]);
    api.version("20").watch(vec![
        modified(cm("a", 12, &[("k", "2")])),
        bookmark(15),
        bookmark(20),
        bookmark(25),
    ]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into())).with_index(stored);
    lp.step(&tx).await.unwrap();
    assert_eq!(
        drain(&mut rx),
        ["Modified a@12 replay [k]", "progress 20", "progress 25"]
    );
    api.watch(vec![]);
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls().last(), Some(&Call::Watch("25".into())));
}

/// A 410 while replays are held: they are not handed out; the relist
/// hands out the held objects' current state instead, its floor below the
/// oldest held change (the index has them already), marked as replays.
#[tokio::test(start_paused = true)]
async fn a_410_while_replays_are_held_relists_from_before_the_oldest() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let stored = index_of(&[
        cm("a", 5, &[("k", "1")]),
        cm("b", 6, &[("k", "1")]),
        cm("c", 7, &[("k", "1")]),
    ]);
    api.version("20").watch(vec![
        modified(cm("a", 12, &[("k", "2")])),
        modified(cm("b", 14, &[("k", "2")])),
        gone_event(),
    ]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into())).with_index(stored);
    lp.step(&tx).await.unwrap();
    assert_eq!(drain(&mut rx), Vec::<String>::new());

    api.list(
        "30",
        vec![
            cm("a", 12, &[("k", "2")]),
            cm("b", 14, &[("k", "2")]),
            cm("c", 7, &[("k", "1")]),
        ],
    );
    lp.step(&tx).await.unwrap();
    assert_eq!(
        drain(&mut rx),
        [
            "Resynced a@11 replay [k]",
            "Resynced b@11 replay [k]",
            "listed 30",
            "index a,b,c"
        ]
    );
}

/// The relist right after taking over delivers its differences as
/// replays (they are from the gap), whatever their version; the watch
/// after it goes on marking the changes up to the version read at the
/// start, and the first live change ends the replay.
#[tokio::test(start_paused = true)]
async fn a_relist_after_taking_over_delivers_replays_then_the_watch_goes_live() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let stored = index_of(&[cm("a", 5, &[("k", "1")]), cm("b", 6, &[("k", "1")])]);
    api.version("40")
        .watch_refused(gone_error())
        .list(
            "30",
            vec![cm("a", 25, &[("k", "2")]), cm("b", 6, &[("k", "1")])],
        )
        .watch(vec![
            modified(cm("b", 35, &[("k", "2")])),
            modified(cm("a", 41, &[("k", "3")])),
            modified(cm("b", 42, &[("k", "3")])),
        ]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into())).with_index(stored);
    for _ in 0..3 {
        lp.step(&tx).await.unwrap();
    }
    assert_eq!(
        api.calls(),
        [
            Call::Version,
            Call::Watch("10".into()),
            Call::List(None),
            Call::Watch("30".into())
        ]
    );
    assert_eq!(
        drain(&mut rx),
        [
            "Resynced a@10 replay [k]",
            "listed 30",
            "index a,b",
            "Modified b@35 replay [k]",
            "Modified a@41 [k]",
            "Modified b@42 [k]",
        ]
    );
}

/// In a relist after taking over, a resynced difference is a replay
/// whatever its version (it is from the gap), until the first other
/// difference past the replay's end, which ends it.
#[tokio::test(start_paused = true)]
async fn in_a_relist_past_the_replay_only_resynced_differences_stay_replays() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let stored = index_of(&[
        cm("a", 5, &[("k", "1")]),
        cm("b", 6, &[("k", "1")]),
        cm("e", 7, &[("k", "1")]),
    ]);
    api.version("20")
        .watch(vec![bookmark(25), gone_event()])
        .list(
            "30",
            vec![
                cm("a", 22, &[("k", "2")]),
                cm("b", 6, &[("k", "1")]),
                cm("d", 23, &[("k", "1")]),
                cm("e", 24, &[("k", "2")]),
            ],
        );
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into())).with_index(stored);
    lp.step(&tx).await.unwrap();
    lp.step(&tx).await.unwrap();
    assert_eq!(
        drain(&mut rx),
        [
            "progress 25",
            "Resynced a@25 replay [k]",
            "Added d@25 [k]",
            "Resynced e@25 [k]",
            "listed 30",
            "index a,b,d,e"
        ]
    );
}

/// Delivering every object (unreadable checkpoints): a relist against an
/// empty index, every object a replay without a version, then the list's
/// progress; then the watch is live.
#[tokio::test(start_paused = true)]
async fn delivering_all_hands_out_every_object_without_versions_then_watches_live() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    api.list(
        "10",
        vec![cm("a", 5, &[("k", "1")]), cm("b", 7, &[("k", "1")])],
    )
    .watch(vec![modified(cm("a", 11, &[("k", "2")]))]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), None).delivering_all();
    lp.step(&tx).await.unwrap();
    lp.step(&tx).await.unwrap();
    assert_eq!(api.calls(), [Call::List(None), Call::Watch("10".into())]);
    assert_eq!(
        drain(&mut rx),
        [
            "Added a@- replay [k]",
            "Added b@- replay [k]",
            "listed 10",
            "index a,b",
            "Modified a@11 [k]"
        ]
    );
}

/// A creation: the index follows within `CREATION_INDEX_AFTER`, while the
/// watch waits.
#[tokio::test(start_paused = true)]
async fn a_creation_is_followed_by_the_index_at_once() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let mut lp = after_baseline(&api, "10", vec![cm("a", 5, &[("k", "1")])]).await;
    drain(&mut rx);
    lp.idle_timeout = Duration::from_secs(1);
    api.watch(vec![added(cm("n", 11, &[("k", "1")])), Step::Hang]);
    let watching = tokio::spawn(async move {
        lp.step(&tx).await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(drain(&mut rx), ["Added n@11 [k]"]);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(drain(&mut rx), ["index a,n"]);
    watching.await.unwrap();
}

/// Asked for its index (a leader stepping down), a watching loop sends it
/// at once, the held replays first (the index has their objects).
#[tokio::test(start_paused = true)]
async fn asked_for_its_index_the_loop_sends_the_held_replays_first() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let flush = Flush::default();
    let stored = index_of(&[cm("a", 5, &[("k", "1")])]);
    api.version("20")
        .watch(vec![modified(cm("a", 12, &[("k", "2")])), Step::Hang]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into()))
        .with_index(stored)
        .with_flush(&flush);
    lp.idle_timeout = Duration::from_secs(1);
    let watching = tokio::spawn(async move {
        lp.step(&tx).await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(drain(&mut rx), Vec::<String>::new());
    flush.ask();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(drain(&mut rx), ["Modified a@12 replay [k]", "index a"]);
    watching.await.unwrap();
}

/// A stream that fails, or goes silent past the idle timeout, is resumed
/// from the version it reached, not from where it started.
#[tokio::test(start_paused = true)]
async fn a_failed_or_silent_watch_resumes_from_the_version_it_reached() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let mut lp = after_baseline(&api, "10", vec![cm("a", 5, &[("k", "1")])]).await;
    lp.idle_timeout = Duration::from_secs(1);
    api.watch(vec![
        modified(cm("a", 11, &[("k", "2")])),
        Step::Fail(broken()),
    ])
    .watch(vec![modified(cm("a", 12, &[("k", "3")])), Step::Hang])
    .watch_refused(broken())
    .watch(vec![]);
    assert!(lp.step(&tx).await.is_err());
    lp.step(&tx).await.unwrap();
    assert!(lp.step(&tx).await.is_err());
    lp.step(&tx).await.unwrap();
    assert_eq!(
        api.calls(),
        [
            Call::Watch("10".into()),
            Call::Watch("11".into()),
            Call::Watch("12".into()),
            Call::Watch("12".into())
        ]
    );
    assert_eq!(drain(&mut rx), ["Modified a@11 [k]", "Modified a@12 [k]"]);
}

fn trusted(at: u64, unhandled: &[&str]) -> Trusted {
    Trusted {
        at,
        unhandled: unhandled
            .iter()
            .map(|n| ("prod".to_string(), n.to_string()))
            .collect(),
    }
}

/// Issue 33: resuming with a stored index the state trusts up to 16, a
/// replayed change up to it is skipped unless its object was named
/// unhandled (b: its change was still in its retries at the save); a
/// deletion up to it too. Past 16 changes compare with the index as usual.
#[tokio::test(start_paused = true)]
async fn a_trusted_index_skips_replayed_changes_it_has_as_handled() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let stored = index_of(&[
        cm("a", 15, &[("k", "3")]),
        cm("b", 14, &[("k", "2")]),
        cm("c", 5, &[("k", "1")]),
    ]);
    api.version("20").watch(vec![
        modified(cm("a", 12, &[("k", "2")])),
        modified(cm("b", 14, &[("k", "2")])),
        modified(cm("a", 15, &[("k", "3")])),
        deleted(cm("d", 16, &[("k", "1")])),
        modified(cm("a", 18, &[("k", "2")])),
        modified(cm("c", 21, &[("k", "2")])),
    ]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into()))
        .with_index(stored)
        .trusting(trusted(16, &["b"]));
    lp.step(&tx).await.unwrap();
    assert_eq!(
        drain(&mut rx),
        [
            "progress 12",
            "Modified b@14 replay [k]",
            "Modified a@18 replay [k]",
            "Modified c@21 [k]",
        ]
    );
}

/// Once the watch has seen the whole replay (here a bookmark at its end),
/// an object with no change since the checkpoint is verified: a later
/// event with its stored content delivers nothing (before, the first event
/// of every stored object after a failover was delivered).
#[tokio::test(start_paused = true)]
async fn past_the_replay_the_stored_objects_are_verified() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let stored = index_of(&[cm("a", 5, &[("k", "1")]), cm("b", 6, &[("k", "1")])]);
    api.version("20").watch(vec![
        modified(cm("a", 12, &[("k", "1")])),
        bookmark(20),
        modified(cm("b", 22, &[("k", "1")])),
        modified(cm("b", 23, &[("k", "2")])),
    ]);
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into())).with_index(stored);
    lp.step(&tx).await.unwrap();
    assert_eq!(
        drain(&mut rx),
        [
            "Modified a@12 replay [k]",
            "progress 20",
            "progress 22",
            "Modified b@23 [k]",
        ]
    );
}

/// A relist against a trusted index: an object the index has as handled
/// and last written by 16 is not delivered for being written after the
/// checkpoint (a, equal); one named unhandled is (b).
#[tokio::test(start_paused = true)]
async fn a_relist_against_a_trusted_index_delivers_only_what_it_cannot_trust() {
    let api = Scripted::default();
    let (tx, mut rx) = channel();
    let stored = index_of(&[cm("a", 15, &[("k", "1")]), cm("b", 14, &[("k", "1")])]);
    api.version("40").watch_refused(gone_error()).list(
        "30",
        vec![cm("a", 15, &[("k", "1")]), cm("b", 14, &[("k", "1")])],
    );
    let mut lp = WatchLoop::with_api(api.clone(), target(), Some("10".into()))
        .with_index(stored)
        .trusting(trusted(16, &["b"]));
    for _ in 0..2 {
        lp.step(&tx).await.unwrap();
    }
    assert_eq!(
        drain(&mut rx),
        ["Resynced b@10 replay [k]", "listed 30", "index a,b"]
    );
}

/// A custom kind's resource: its plural as the manifest gives it, else
/// kube-rs's plural of the kind.
#[test]
fn a_custom_kinds_resource_takes_the_given_plural_or_kube_rs_one() {
    let kind = ObjectKind::parse("example.com/v1/Policy").unwrap();
    let spec = |plural: Option<&str>| CustomKindSpec {
        api_version: "example.com/v1".into(),
        kind: "Policy".into(),
        plural: plural.map(str::to_string),
        content: vec!["spec".into()],
    };
    let of = |plural: Option<&str>| {
        api_resource(&WatchTarget {
            kind,
            custom: Some(Arc::new(spec(plural))),
            ..target()
        })
    };
    let ar = of(None);
    assert_eq!(
        (
            ar.group.as_str(),
            ar.api_version.as_str(),
            ar.plural.as_str()
        ),
        ("example.com", "example.com/v1", "policies")
    );
    assert_eq!(of(Some("rules")).plural, "rules");
}
