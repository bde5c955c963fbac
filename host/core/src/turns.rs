//! The decide stage's order, without I/O: per key (a plugin and an object),
//! one call at a time, in change order, and a change that arrives while
//! calls wait folds into the last waiting one.
//!
//! A newer change's decision must not be submitted before an older one's
//! (its actions would run first and the older content land last), and it
//! cannot be skipped either (a plugin may act only on the keys a change
//! touched; a folded change carries its keys along). So the shell starts a
//! call only when [`Turns`] says so, submits the call's decision (or dead
//! letter) when it is over, and only then tells [`Turns::finished`], which
//! hands out the key's next call. A backlog costs one call per key, not one
//! per change, as a controller's work queue holds a key once however often
//! it is added (issue 24).
//!
//! The keys of calls that are over are dropped at once: nothing to clean on
//! a timer.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc;

use crate::event::{ChangeEvent, Folded};

/// A plugin call: the change to decide, and the changes (tickets) it stands
/// for, in order: its own first, then those folded into it while it waited.
#[derive(Debug, Clone)]
pub struct Call<T> {
    pub event: Arc<ChangeEvent>,
    pub tickets: Vec<T>,
}

/// What became of a change offered to [`Turns`].
#[derive(Debug)]
pub enum Offered<T> {
    /// Its key was idle: start this call now.
    Start(Call<T>),
    /// Folded into the key's last waiting call (no call of its own).
    Folded,
    /// Waits for its turn behind the key's running call.
    Queued,
}

/// Per key, the running call (if any) and the calls waiting behind it.
#[derive(Debug)]
pub struct Turns<K, T> {
    keys: HashMap<K, Queue<T>>,
    waiting: usize,
}

#[derive(Debug)]
struct Queue<T> {
    /// Calls not started yet, oldest first (never empty while no call runs:
    /// an idle key is removed).
    waiting: VecDeque<Call<T>>,
}

impl<K, T> Default for Turns<K, T> {
    fn default() -> Self {
        Turns {
            keys: HashMap::new(),
            waiting: 0,
        }
    }
}

impl<K: Hash + Eq, T> Turns<K, T> {
    /// Offers a change under `key` (with its `ticket`).
    pub fn offer(&mut self, key: K, event: Arc<ChangeEvent>, ticket: T) -> Offered<T> {
        let call = Call {
            event,
            tickets: vec![ticket],
        };
        let Some(queue) = self.keys.get_mut(&key) else {
            self.keys.insert(
                key,
                Queue {
                    waiting: VecDeque::new(),
                },
            );
            return Offered::Start(call);
        };
        if let Some(last) = queue.waiting.back_mut() {
            let folded = match ChangeEvent::folded(&last.event, &call.event) {
                Folded::Apart => None,
                Folded::AsNewer => Some(call.event.clone()),
                Folded::Changed(e) => Some(Arc::new(*e)),
            };
            if let Some(event) = folded {
                last.event = event;
                last.tickets.extend(call.tickets);
                return Offered::Folded;
            }
        }
        queue.waiting.push_back(call);
        self.waiting += 1;
        Offered::Queued
    }

    /// The call running under `key` is over (its decision submitted, or
    /// dead-lettered): the key's next call, to start now.
    pub fn finished(&mut self, key: &K) -> Option<Call<T>> {
        let queue = self.keys.get_mut(key)?;
        match queue.waiting.pop_front() {
            Some(next) => {
                self.waiting -= 1;
                Some(next)
            }
            None => {
                self.keys.remove(key);
                None
            }
        }
    }

    /// Calls waiting for their turn (not started).
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Keys with a call running.
    pub fn running(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{ChangeType, DataValue, ObjectKind, ObjectSnapshot};
    use std::collections::BTreeMap;

    fn change(name: &str, change: ChangeType, rv: u64, v: &str) -> Arc<ChangeEvent> {
        let object = ObjectSnapshot {
            kind: ObjectKind::ConfigMap,
            namespace: "ns".into(),
            name: name.into(),
            uid: "u".into(),
            resource_version: rv.to_string(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            data: BTreeMap::from([("k".to_string(), DataValue::Text(v.into()))]),
        };
        let previous = (change == ChangeType::Modified).then(|| {
            let mut p = object.clone();
            p.data
                .insert("k".into(), DataValue::Text(format!("{v}-before")));
            p
        });
        Arc::new(ChangeEvent::new(change, object, previous.as_ref()))
    }

    fn rv(call: &Call<u32>) -> &str {
        &call.event.object.resource_version
    }

    #[test]
    fn one_call_per_key_at_a_time_in_change_order() {
        let mut t = Turns::default();
        let Offered::Start(first) = t.offer("a", change("a", ChangeType::Added, 1, "1"), 1) else {
            panic!("an idle key starts at once");
        };
        assert_eq!(rv(&first), "1");
        // Another key is not held by this one.
        assert!(matches!(
            t.offer("b", change("b", ChangeType::Added, 2, "1"), 2),
            Offered::Start(_)
        ));
        // A deletion does not fold: it waits its turn.
        assert!(matches!(
            t.offer("a", change("a", ChangeType::Deleted, 3, "1"), 3),
            Offered::Queued
        ));
        assert_eq!((t.running(), t.waiting()), (2, 1));
        let next = t.finished(&"a").expect("the deletion goes next");
        assert_eq!((rv(&next), next.tickets.clone()), ("3", vec![3]));
        assert_eq!(t.finished(&"a").map(|c| c.tickets), None);
        assert_eq!(t.finished(&"b").map(|c| c.tickets), None);
        assert_eq!((t.running(), t.waiting()), (0, 0), "idle keys are dropped");
    }

    #[test]
    fn changes_waiting_for_their_turn_fold_into_one_call_on_the_newest_content() {
        let mut t = Turns::default();
        assert!(matches!(
            t.offer("a", change("a", ChangeType::Modified, 1, "1"), 1),
            Offered::Start(_)
        ));
        // The first waits behind the running call; the next ones fold into it.
        assert!(matches!(
            t.offer("a", change("a", ChangeType::Modified, 2, "2"), 2),
            Offered::Queued
        ));
        for (rv, v) in [(3, "3"), (4, "4")] {
            assert!(matches!(
                t.offer("a", change("a", ChangeType::Modified, rv, v), rv as u32),
                Offered::Folded
            ));
        }
        let next = t.finished(&"a").expect("one call stands for three changes");
        assert_eq!(rv(&next), "4");
        assert_eq!(
            next.tickets,
            vec![2, 3, 4],
            "every change it stands for, in order"
        );
        // A change after the folded call started is not folded into it.
        assert!(matches!(
            t.offer("a", change("a", ChangeType::Modified, 5, "5"), 5),
            Offered::Queued
        ));
        assert_eq!(t.finished(&"a").map(|c| c.tickets), Some(vec![5]));
    }

    #[test]
    fn a_deletion_keeps_the_changes_around_it_apart() {
        let mut t = Turns::default();
        t.offer("a", change("a", ChangeType::Modified, 1, "1"), 1);
        t.offer("a", change("a", ChangeType::Modified, 2, "2"), 2);
        t.offer("a", change("a", ChangeType::Deleted, 3, "2"), 3);
        t.offer("a", change("a", ChangeType::Added, 4, "x"), 4);
        t.offer("a", change("a", ChangeType::Modified, 5, "y"), 5);
        let mut order = Vec::new();
        while let Some(call) = t.finished(&"a") {
            order.push(call.tickets);
        }
        assert_eq!(order, vec![vec![2], vec![3], vec![4, 5]]);
    }
}
