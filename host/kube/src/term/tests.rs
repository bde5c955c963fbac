//! The term's rules on paused time, one test per rule.
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use wasmwatch_core::index::ObjectIndex;
use wasmwatch_core::{ChangeEvent, ChangeType, ObjectKind, ObjectSnapshot};

use super::*;
use crate::watchloop::Output;

const CM: ObjectKind = ObjectKind::ConfigMap;
const INTERVAL: Duration = Duration::from_secs(2);

/// A change of an object the index has (a modification).
fn change(name: &str, rv: Option<&str>) -> Output {
    change_of(ChangeType::Modified, name, rv)
}

fn change_of(change: ChangeType, name: &str, rv: Option<&str>) -> Output {
    let object = ObjectSnapshot::from_json(&json!({"kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "prod", "resourceVersion": rv.unwrap_or("")},
        "data": {"k": name}}))
    .unwrap();
    Output::Change {
        event: Box::new(ChangeEvent::new(change, object, None)),
        resource_version: rv.map(str::to_string),
    }
}

fn progress(rv: &str) -> Output {
    Output::Progress {
        resource_version: rv.into(),
        index_changed: false,
    }
}

fn listed(rv: &str) -> Output {
    Output::Progress {
        resource_version: rv.into(),
        index_changed: true,
    }
}

fn index(names: &[&str]) -> Output {
    let text: String = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("prod/{n} {:032x} {:016x} \n", i + 1, 0))
        .collect();
    Output::Index(ObjectIndex::decode(CM, &text).unwrap())
}

/// A term whose changes go to plugins 0 and 1.
fn term(stored: Checkpoints, unreadable: &[ObjectKind]) -> Term {
    Term::new(
        stored,
        unreadable.iter().copied(),
        true,
        INTERVAL,
        Instant::now(),
        Box::new(|_| vec![0, 1]),
    )
}

fn stored(ns: &str, rv: &str) -> Checkpoints {
    let mut c = Checkpoints::default();
    c.set(CM, &Scope::from_key(ns), rv);
    c
}

fn dispatched(effects: &[Effect]) -> Vec<Ticket> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Dispatch { ticket, .. } => Some(*ticket),
            _ => None,
        })
        .collect()
}

fn saves(effects: &[Effect]) -> Vec<(Checkpoints, Vec<StreamIndex>)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Save {
                checkpoints,
                indexes,
                ..
            } => Some((checkpoints.clone(), indexes.clone())),
            _ => None,
        })
        .collect()
}

fn feed(t: &mut Term, inputs: Vec<Input>) -> Vec<Effect> {
    inputs
        .into_iter()
        .flat_map(|i| t.handle(i, Instant::now()))
        .collect()
}

async fn tick(t: &mut Term, after: Duration) -> Vec<Effect> {
    tokio::time::advance(after).await;
    t.handle(Input::Tick, Instant::now())
}

#[tokio::test(start_paused = true)]
async fn a_change_is_handled_when_every_plugin_it_went_to_is_done_with_it() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let e = feed(&mut t, vec![Input::Output(s, change("a", Some("10")))]);
    let [ticket] = dispatched(&e)[..] else {
        panic!("{e:?}")
    };
    assert!(matches!(&e[1], Effect::Dispatch { plugins, .. } if plugins == &[0, 1]));
    feed(
        &mut t,
        vec![Input::Finished(ticket), Input::Output(s, index(&["a"]))],
    );
    assert_eq!(
        t.checkpoints().get(CM, &Scope::from_key("prod")),
        Some("5"),
        "plugin 1 is not done"
    );
    assert_eq!(t.in_flight(), 1);
    let e = feed(&mut t, vec![Input::Finished(ticket)]);
    assert!(matches!(e[..], [Effect::Handled(CM)]), "{e:?}");
    assert_eq!(
        t.checkpoints().get(CM, &Scope::from_key("prod")),
        Some("10")
    );
    // A late duplicate changes nothing.
    assert!(feed(&mut t, vec![Input::Finished(ticket)]).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_change_no_plugin_selects_is_handled_at_once() {
    let mut t = Term::new(
        Checkpoints::default(),
        [],
        true,
        INTERVAL,
        Instant::now(),
        Box::new(|_| vec![]),
    );
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let e = feed(&mut t, vec![Input::Output(s, change("a", Some("10")))]);
    assert!(
        matches!(e[..], [Effect::Received(CM), Effect::Handled(CM)]),
        "{e:?}"
    );
    assert_eq!(t.in_flight(), 0);
}

/// A successor finding no checkpoint takes a baseline of its own, after
/// whatever this term had in flight: so the baseline is stored first, and
/// the shell reads nothing else until it is, retrying with backoff.
#[tokio::test(start_paused = true)]
async fn a_baseline_is_stored_before_anything_else_is_read() {
    let mut t = term(Checkpoints::default(), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Baseline);
    let e = feed(&mut t, vec![Input::Output(s, listed("10"))]);
    assert!(
        saves(&e).is_empty(),
        "the checkpoint waits for the list's index"
    );
    assert!(t.wants_outputs());
    let e = feed(&mut t, vec![Input::Output(s, index(&["a", "b"]))]);
    let [(checkpoints, indexes)] = &saves(&e)[..] else {
        panic!("{e:?}")
    };
    assert_eq!(checkpoints.get(CM, &Scope::from_key("prod")), Some("10"));
    assert_eq!(indexes[0].index.len(), 2, "with its index");
    assert!(!t.wants_outputs(), "nothing else until it is stored");
    // An API error: retried after a backoff, still holding.
    let e = feed(&mut t, vec![Input::Saved(Saved::Failed("503".into()))]);
    assert!(e.is_empty());
    assert!(!t.wants_outputs());
    let wait = t.wake_at() - Instant::now();
    assert!(
        wait >= Duration::from_millis(150) && wait <= Duration::from_millis(250),
        "{wait:?}"
    );
    assert!(saves(&tick(&mut t, Duration::from_millis(100)).await).is_empty());
    let e = tick(&mut t, Duration::from_millis(200)).await;
    assert_eq!(saves(&e).len(), 1, "retried");
    feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    assert!(t.wants_outputs());
    // Nothing moved since: the interval passes without a write.
    assert!(saves(&tick(&mut t, INTERVAL).await).is_empty());
}

#[tokio::test(start_paused = true)]
async fn checkpoints_are_saved_every_interval_when_they_moved_and_kept_on_errors() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    feed(&mut t, vec![Input::Output(s, progress("6"))]);
    assert!(
        saves(&tick(&mut t, Duration::from_secs(1)).await).is_empty(),
        "not due"
    );
    let e = tick(&mut t, Duration::from_secs(1)).await;
    assert_eq!(saves(&e)[0].0.get(CM, &Scope::from_key("prod")), Some("6"));
    feed(&mut t, vec![Input::Saved(Saved::Failed("timeout".into()))]);
    assert!(t.wants_outputs(), "a periodic save does not hold the term");
    // Kept for the next round, with what moved since.
    feed(&mut t, vec![Input::Output(s, progress("7"))]);
    let e = tick(&mut t, INTERVAL).await;
    assert_eq!(saves(&e)[0].0.get(CM, &Scope::from_key("prod")), Some("7"));
    feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    assert!(saves(&tick(&mut t, INTERVAL).await).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_fenced_save_ends_the_term() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    feed(&mut t, vec![Input::Output(s, progress("6"))]);
    tick(&mut t, INTERVAL).await;
    let e = feed(&mut t, vec![Input::Saved(Saved::Fenced("409".into()))]);
    assert!(
        matches!(&e[..], [Effect::End(End::Fenced(w))] if w == "409"),
        "{e:?}"
    );
    assert!(!t.wants_outputs());
    assert!(feed(&mut t, vec![Input::Output(s, change("a", Some("9")))]).is_empty());
}

/// Issue 19's deletion loss at the term: W is created and handled, the
/// leader dies, W is deleted while nobody leads past the history. Whatever
/// the timing, no save may carry a checkpoint past W without an index that
/// has W (the successor's resync would not know W, and never deliver its
/// deletion).
#[tokio::test(start_paused = true)]
async fn no_save_carries_a_checkpoint_past_a_change_without_an_index_that_has_it() {
    let mut t = term(stored("prod", "10"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let e = feed(&mut t, vec![Input::Output(s, change("w", Some("20")))]);
    let w = dispatched(&e)[0];
    feed(
        &mut t,
        vec![
            Input::Finished(w),
            Input::Finished(w),
            Input::Output(s, progress("25")),
        ],
    );
    for _ in 0..3 {
        let e = tick(&mut t, INTERVAL).await;
        for (checkpoints, _) in saves(&e) {
            assert_eq!(
                checkpoints.get(CM, &Scope::from_key("prod")),
                Some("10"),
                "past W without W"
            );
        }
        feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    }
    feed(&mut t, vec![Input::Output(s, index(&["w"]))]);
    let e = tick(&mut t, INTERVAL).await;
    let [(checkpoints, indexes)] = &saves(&e)[..] else {
        panic!("{e:?}")
    };
    assert_eq!(
        checkpoints.get(CM, &Scope::from_key("prod")),
        Some("25"),
        "up to the index"
    );
    assert_eq!(indexes.len(), 1, "in the same save as the index with W");
    assert_eq!(indexes[0].index.encode().lines().count(), 1);
}

/// A kind unreadable at the claim: its stored value stays until every
/// stream of it has a checkpoint (a partial write would make a successor
/// take baselines in the missing namespaces, after this term's gap).
#[tokio::test(start_paused = true)]
async fn an_unreadable_kind_is_written_only_once_every_stream_of_it_has_a_checkpoint() {
    let mut t = term(Checkpoints::default(), &[CM]);
    let a = t.stream(CM, Scope::from_key("a"), Start::DeliverAll);
    let b = t.stream(CM, Scope::from_key("b"), Start::DeliverAll);
    let e = feed(&mut t, vec![Input::Output(a, change("x", None))]);
    let x = dispatched(&e)[0];
    feed(
        &mut t,
        vec![
            Input::Finished(x),
            Input::Finished(x),
            Input::Output(a, listed("30")),
            Input::Output(a, index(&["x"])),
        ],
    );
    let e = tick(&mut t, INTERVAL).await;
    let [(checkpoints, _)] = &saves(&e)[..] else {
        panic!("{e:?}")
    };
    assert_eq!(
        checkpoints.format(CM),
        None,
        "b has none yet: left as found"
    );
    feed(
        &mut t,
        vec![
            Input::Saved(Saved::Stored),
            Input::Output(b, listed("31")),
            Input::Output(b, index(&[])),
        ],
    );
    let e = tick(&mut t, INTERVAL).await;
    assert_eq!(saves(&e)[0].0.format(CM).as_deref(), Some("a=30,b=31"));
}

#[tokio::test(start_paused = true)]
async fn the_term_ends_when_not_acting_and_its_final_save_has_what_is_complete() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let e = feed(
        &mut t,
        vec![
            Input::Output(s, change("a", Some("8"))),
            Input::Output(s, index(&["a"])),
        ],
    );
    let a = dispatched(&e)[0];
    let e = feed(&mut t, vec![Input::NotActing]);
    assert!(matches!(e[..], [Effect::End(End::NotActing)]));
    // Decisions drained after the end still count before the final save.
    assert_eq!(t.finish_late(a), None);
    assert_eq!(t.finish_late(a), Some(CM));
    let Some(Effect::Save { checkpoints, .. }) = t.final_save() else {
        panic!("a final save")
    };
    assert_eq!(checkpoints.get(CM, &Scope::from_key("prod")), Some("8"));
}

#[tokio::test(start_paused = true)]
async fn without_ha_nothing_is_saved_and_a_baseline_holds_nothing() {
    let mut t = Term::new(
        Checkpoints::default(),
        [],
        false,
        INTERVAL,
        Instant::now(),
        Box::new(|_| vec![0]),
    );
    let s = t.stream(CM, Scope::from_key("*"), Start::Baseline);
    let e = feed(
        &mut t,
        vec![
            Input::Output(s, listed("3")),
            Input::Output(s, index(&["a"])),
        ],
    );
    assert!(saves(&e).is_empty());
    assert!(t.wants_outputs());
    assert!(saves(&tick(&mut t, INTERVAL).await).is_empty());
    assert!(t.final_save().is_none());
}

/// Issue 24: a save being written holds nothing else. Changes are read,
/// dispatched and finished meanwhile; no second save is asked for until the
/// first is over, and one that came due meanwhile follows at once, with
/// what moved meanwhile.
#[tokio::test(start_paused = true)]
async fn changes_go_on_while_a_save_is_written_and_a_save_due_meanwhile_follows_it() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    feed(&mut t, vec![Input::Output(s, progress("6"))]);
    let e = tick(&mut t, INTERVAL).await;
    assert_eq!(saves(&e)[0].0.get(CM, &Scope::from_key("prod")), Some("6"));
    // The write is slow: a change comes and is handled meanwhile.
    assert!(t.wants_outputs());
    let e = feed(&mut t, vec![Input::Output(s, change("a", Some("7")))]);
    let [ticket] = dispatched(&e)[..] else {
        panic!("{e:?}")
    };
    feed(
        &mut t,
        vec![
            Input::Finished(ticket),
            Input::Finished(ticket),
            Input::Output(s, index(&["a"])),
        ],
    );
    assert_eq!(t.checkpoints().get(CM, &Scope::from_key("prod")), Some("7"));
    // The interval passes while the first save is still being written: no
    // second save at once, and no tick wanted before the next interval.
    let e = tick(&mut t, INTERVAL).await;
    assert!(saves(&e).is_empty(), "one save at a time: {e:?}");
    assert!(t.wake_at() > Instant::now(), "no busy ticking while saving");
    // Over: the save that came due follows, with the change and its index.
    let e = feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    let [(checkpoints, indexes)] = &saves(&e)[..] else {
        panic!("{e:?}")
    };
    assert_eq!(checkpoints.get(CM, &Scope::from_key("prod")), Some("7"));
    assert_eq!(indexes[0].index.len(), 1);
    feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    assert!(
        saves(&tick(&mut t, INTERVAL).await).is_empty(),
        "nothing moved"
    );
}

/// A baseline's index arriving while another save is written: nothing else
/// is read from then on, and it is stored right after that save.
#[tokio::test(start_paused = true)]
async fn a_baseline_arriving_while_a_save_is_written_is_stored_right_after_it() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let b = t.stream(CM, Scope::from_key("new"), Start::Baseline);
    feed(&mut t, vec![Input::Output(s, progress("6"))]);
    assert_eq!(saves(&tick(&mut t, INTERVAL).await).len(), 1);
    let e = feed(
        &mut t,
        vec![
            Input::Output(b, listed("20")),
            Input::Output(b, index(&["x"])),
        ],
    );
    assert!(saves(&e).is_empty(), "one save at a time");
    assert!(
        !t.wants_outputs(),
        "nothing read before the baseline is stored"
    );
    // The save being written fails: the baseline's save follows at once.
    let e = feed(&mut t, vec![Input::Saved(Saved::Failed("503".into()))]);
    let [(checkpoints, _)] = &saves(&e)[..] else {
        panic!("{e:?}")
    };
    assert_eq!(checkpoints.get(CM, &Scope::from_key("new")), Some("20"));
    assert!(!t.wants_outputs());
    feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    assert!(t.wants_outputs());

    // The same when the save being written succeeds.
    let c = t.stream(CM, Scope::from_key("newer"), Start::Baseline);
    feed(&mut t, vec![Input::Output(s, progress("7"))]);
    assert_eq!(saves(&tick(&mut t, INTERVAL).await).len(), 1);
    feed(
        &mut t,
        vec![
            Input::Output(c, listed("30")),
            Input::Output(c, index(&["y"])),
        ],
    );
    assert!(!t.wants_outputs());
    let e = feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    let [(checkpoints, _)] = &saves(&e)[..] else {
        panic!("{e:?}")
    };
    assert_eq!(checkpoints.get(CM, &Scope::from_key("newer")), Some("30"));
    assert!(!t.wants_outputs(), "until the baseline is stored");
    feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    assert!(t.wants_outputs());
}

fn dispatched_names(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Dispatch { event, .. } => {
                Some(format!("{:?} {}", event.change, event.object.name).to_lowercase())
            }
            _ => None,
        })
        .collect()
}

/// Issue 32: an object created and delivered, then deleted in a leaderless
/// gap past the history, was lost when the leader died before its index
/// was stored. A creation's actions now wait for a stored index that has
/// the object: the index sent right after it may be stored before the
/// change is handled, at once (group commit), and the dispatch follows
/// the save.
#[tokio::test(start_paused = true)]
async fn a_creation_is_dispatched_only_once_an_index_with_its_object_is_stored() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let e = feed(
        &mut t,
        vec![Input::Output(
            s,
            change_of(ChangeType::Added, "new", Some("10")),
        )],
    );
    assert!(dispatched(&e).is_empty(), "held: {e:?}");
    assert!(saves(&e).is_empty(), "no index with it yet");
    // A modification of another object goes on meanwhile.
    let e = feed(&mut t, vec![Input::Output(s, change("old", Some("11")))]);
    assert_eq!(dispatched_names(&e), ["modified old"]);
    // The index with it comes: saved at once, before either is handled
    // and before the interval.
    let e = feed(&mut t, vec![Input::Output(s, index(&["new", "old"]))]);
    let [(checkpoints, indexes)] = &saves(&e)[..] else {
        panic!("{e:?}")
    };
    assert_eq!(indexes[0].index.len(), 2);
    assert_eq!(
        checkpoints.get(CM, &Scope::from_key("prod")),
        Some("5"),
        "the checkpoint waits for the changes, as ever"
    );
    assert!(dispatched(&e).is_empty(), "not before it is stored");
    let e = feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    assert_eq!(dispatched_names(&e), ["added new"]);
}

/// An index taken after an unhandled deletion is stored with the deleted
/// object put back (a successor still finds the deletion): a creation
/// behind it does not wait for the deletion's actions (an app answering
/// 503 retried for half a minute held every creation before).
#[tokio::test(start_paused = true)]
async fn a_creation_does_not_wait_for_an_unhandled_deletion_before_it() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let e = feed(
        &mut t,
        vec![
            Input::Output(s, change_of(ChangeType::Deleted, "gone", Some("10"))),
            Input::Output(s, change_of(ChangeType::Added, "new", Some("11"))),
            Input::Output(s, index(&["new"])),
        ],
    );
    assert_eq!(dispatched_names(&e), ["deleted gone"]);
    let [(_, indexes)] = &saves(&e)[..] else {
        panic!("{e:?}")
    };
    let stored = &indexes[0].index;
    assert!(stored.contains("prod", "gone") && stored.contains("prod", "new"));
    let e = feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    assert_eq!(
        dispatched_names(&e),
        ["added new"],
        "not behind the deletion"
    );
}

/// Later changes of an object whose creation waits wait behind it (the
/// apps get them in order); created and deleted before the creation went
/// out, the object is handled without any action.
#[tokio::test(start_paused = true)]
async fn changes_of_a_waiting_object_keep_their_order_and_a_quick_deletion_cancels_it() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let e = feed(
        &mut t,
        vec![
            Input::Output(s, change_of(ChangeType::Added, "a", Some("10"))),
            Input::Output(s, change("a", Some("11"))),
            Input::Output(s, change_of(ChangeType::Added, "b", Some("12"))),
            Input::Output(s, change("b", Some("13"))),
            Input::Output(s, change_of(ChangeType::Deleted, "b", Some("14"))),
        ],
    );
    assert!(dispatched(&e).is_empty(), "{e:?}");
    assert_eq!(
        e.iter()
            .filter(|e| matches!(e, Effect::Handled(CM)))
            .count(),
        3,
        "b's three changes are handled without actions"
    );
    let e = feed(&mut t, vec![Input::Output(s, index(&["a"]))]);
    assert_eq!(saves(&e).len(), 1);
    let e = feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    assert_eq!(dispatched_names(&e), ["added a", "modified a"]);
}

/// A replayed creation may have been delivered by the predecessor: its
/// deletion, while it waits, is not cancelled with it but goes out alone,
/// at once (nothing older after it, and no index to wait for).
#[tokio::test(start_paused = true)]
async fn a_deletion_of_a_waiting_replayed_creation_is_delivered() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let replayed = |o: Output| match o {
        Output::Change {
            mut event,
            resource_version,
        } => {
            event.replay = true;
            Output::Change {
                event,
                resource_version,
            }
        }
        o => o,
    };
    let e = feed(
        &mut t,
        vec![
            Input::Output(s, replayed(change_of(ChangeType::Added, "a", Some("10")))),
            Input::Output(s, replayed(change_of(ChangeType::Deleted, "a", Some("11")))),
        ],
    );
    assert_eq!(dispatched_names(&e), ["deleted a"]);
}

/// Saves failing [`HOLD_FAILURES`] times in a row let waiting creations go
/// (the store is failing, which is reported): delivery does not stop with
/// it.
#[tokio::test(start_paused = true)]
async fn a_failed_save_lets_waiting_creations_go() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let e = feed(
        &mut t,
        vec![
            Input::Output(s, change_of(ChangeType::Added, "a", Some("10"))),
            Input::Output(s, index(&["a"])),
        ],
    );
    assert_eq!(saves(&e).len(), 1);
    for failed in 1..HOLD_FAILURES {
        let e = feed(&mut t, vec![Input::Saved(Saved::Failed("503".into()))]);
        assert!(dispatched(&e).is_empty(), "still held after {failed}");
        let e = tick(&mut t, INTERVAL).await;
        assert_eq!(saves(&e).len(), 1, "retried at the interval");
    }
    let e = feed(&mut t, vec![Input::Saved(Saved::Failed("503".into()))]);
    assert_eq!(dispatched_names(&e), ["added a"]);
}

/// Without HA nothing is stored: creations go at once.
#[tokio::test(start_paused = true)]
async fn without_a_store_a_creation_goes_at_once() {
    let mut t = Term::new(
        Checkpoints::default(),
        [],
        false,
        INTERVAL,
        Instant::now(),
        Box::new(|_| vec![0]),
    );
    let s = t.stream(CM, Scope::from_key("prod"), Start::Baseline);
    let e = feed(
        &mut t,
        vec![Input::Output(
            s,
            change_of(ChangeType::Added, "a", Some("10")),
        )],
    );
    assert_eq!(dispatched_names(&e), ["added a"]);
}

/// Issue 32: stepping down (SIGTERM), the term dispatches nothing more,
/// and is drained once what it dispatched is handled and every stream sent
/// an index since: the final save's checkpoint then passes everything
/// handled, even with later changes read and never dispatched (the
/// successor replays those, which nobody delivered).
#[tokio::test(start_paused = true)]
async fn stepping_down_drains_and_the_final_save_covers_everything_handled() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let e = feed(&mut t, vec![Input::Output(s, change("a", Some("10")))]);
    let [a] = dispatched(&e)[..] else {
        panic!("{e:?}")
    };
    feed(&mut t, vec![Input::Closing]);
    assert!(!t.drained(), "a is in flight, no index since");
    let e = feed(&mut t, vec![Input::Output(s, change("b", Some("11")))]);
    assert!(dispatched(&e).is_empty(), "nothing more is dispatched");
    feed(&mut t, vec![Input::Finished(a), Input::Finished(a)]);
    assert!(!t.drained(), "no index since");
    feed(&mut t, vec![Input::Output(s, index(&["a", "b"]))]);
    assert!(t.drained());
    feed(&mut t, vec![Input::Shutdown]);
    let Some(Effect::Save {
        checkpoints,
        indexes,
        ..
    }) = t.final_save()
    else {
        panic!("a final save")
    };
    assert_eq!(
        checkpoints.get(CM, &Scope::from_key("prod")),
        Some("10"),
        "a, handled, is passed; b is not"
    );
    assert_eq!(indexes.len(), 1, "with the index that covers it");
}

/// Issue 32: the lag operators see is what a successor would replay: a
/// handled change counts until a save that covers it is stored.
#[tokio::test(start_paused = true)]
async fn the_lag_counts_handled_changes_until_they_are_stored() {
    let mut t = term(stored("prod", "5"), &[]);
    let s = t.stream(CM, Scope::from_key("prod"), Start::Resume);
    let e = feed(&mut t, vec![Input::Output(s, change("a", Some("10")))]);
    let [a] = dispatched(&e)[..] else {
        panic!("{e:?}")
    };
    assert_eq!(t.unsaved(), 1, "in flight");
    feed(
        &mut t,
        vec![
            Input::Finished(a),
            Input::Finished(a),
            Input::Output(s, index(&["a"])),
        ],
    );
    assert_eq!(t.in_flight(), 0);
    assert_eq!(t.unsaved(), 1, "handled, not stored");
    let e = tick(&mut t, INTERVAL).await;
    assert_eq!(saves(&e).len(), 1);
    assert_eq!(t.unsaved(), 1, "being written");
    feed(&mut t, vec![Input::Saved(Saved::Stored)]);
    assert_eq!(t.unsaved(), 0);
}
