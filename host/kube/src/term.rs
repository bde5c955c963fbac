//! One term of leadership as a state machine without I/O.
//!
//! ```text
//! inputs                                   effects
//! ───────────────────────────────────────  ─────────────────────────────────
//! watch outputs (change, progress, index)  Dispatch(ticket, event, plugins)
//! Finished(ticket)  (a plugin's decision   Save(checkpoints, indexes)
//!                    and its actions over) Received(kind) / Handled(kind)
//! Tick              (the save interval,    End(why)
//!                    a baseline retry)
//! Saved(outcome)    (the last Save's)
//! NotActing, Shutdown
//! ```
//!
//! The async shell (`wasmwatch run`) feeds it what happened and carries out
//! what it returns: it owns the watch loops, the plugin calls, the pipeline
//! and the state Lease; this owns the rules that make a failover lose
//! nothing:
//!
//! - A change's ticket completes when every plugin it was dispatched to has
//!   finished with it; only then may [`Progress`] move the checkpoint past
//!   it, and only together with an index that has it.
//! - A stream without a stored checkpoint takes a baseline; that baseline
//!   (checkpoint and index) is saved before anything else of the term is
//!   read, retried with backoff: a successor finding no checkpoint would
//!   take a baseline of its own, after what this term had in flight.
//!   [`Term::wants_outputs`] says when the shell may read outputs.
//! - A kind whose checkpoints were unreadable at the claim keeps its stored
//!   (unreadable) value until every stream of it has a checkpoint, so that a
//!   leader dying before then leaves its successor the same instruction
//!   (deliver everything once) rather than a mix.
//! - Checkpoints are saved at most every interval, when they moved; a
//!   `Fenced` save ends the term; an API error is retried at the next one.
//! - The term ends when the shell says the fence closed (or a save found it
//!   closed), when a save finds the state owned by another term, on
//!   shutdown, or when the watches are gone; [`Term::final_save`] is what is left to
//!   write (the shell writes it only while the fence is still open, after
//!   the save being written, if any, is over).
//! - One save at a time: while a `Save` is being written, the shell goes on
//!   feeding every other input (changes are read and handled meanwhile; a
//!   save of a large index must not hold them, issue 24), and the term asks
//!   for no other `Save` until it was fed `Saved`. A save that came due
//!   meanwhile (the interval, or a baseline's index) follows at once.
//!
//! - A creation's actions wait until a stored index has its object (issue
//!   32): a successor that meets a 410 after the object was deleted in a
//!   leaderless gap must find it in the index, or the deletion reaches no
//!   app. The watch loop sends its index right after a creation, the
//!   index may be stored before its changes are handled (see
//!   [`Progress::index`]), and the term saves as soon as it may (group
//!   commit: one save for the creations of a moment), then dispatches
//!   them. Later changes of a waiting object wait behind it; an object
//!   created and deleted before its creation was dispatched is handled
//!   without any action (the apps never saw it), unless one of its
//!   changes is a replay (the predecessor may have delivered it: the
//!   deletion goes out alone). [`HOLD_FAILURES`] failed saves in a row
//!   let them go (the store is failing; that is reported), and a term
//!   that ends first leaves them to the successor's replay.
//!
//! Replays are marked by the watch loops (they know where they resumed).
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;
use wasmwatch_core::{ChangeEvent, ChangeType, ObjectKind, Scope};

use crate::checkpoint::{Checkpoints, Progress, StreamIndex, Ticket, Unhandled};
use crate::watchloop::Output;

/// Which plugins (indexes into the shell's list) a change goes to.
pub type Route = Box<dyn Fn(&ChangeEvent) -> Vec<usize> + Send>;

/// How a stream of the term starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From a stored checkpoint.
    Resume,
    /// No checkpoint: the loop lists a baseline, saved before anything else.
    Baseline,
    /// The kind's checkpoints were unreadable: the loop delivers every
    /// object once (changes without versions), then goes on live.
    DeliverAll,
}

/// What happened, for the term to decide on.
#[derive(Debug)]
pub enum Input {
    /// A watch loop's output, with the stream's id ([`Term::stream`]).
    Output(usize, Output),
    /// One plugin is done with the ticket's change (its actions finished
    /// or were dead-lettered, or the plugin failed for good).
    Finished(Ticket),
    /// Time passed: a save or a retry may be due.
    Tick,
    /// What the last [`Effect::Save`] did.
    Saved(Saved),
    /// The fence closed, or leadership went elsewhere.
    NotActing,
    /// Stepping down (SIGTERM): dispatch nothing more; the shell asks the
    /// watch loops for their index, waits until [`Term::drained`] (or a
    /// deadline), then feeds `Shutdown`: the final save then covers
    /// everything handled, and the successor replays only what was not.
    Closing,
    Shutdown,
    /// Every watch loop is gone.
    WatchesGone,
}

/// The outcome of a save.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Saved {
    Stored,
    /// An API error: kept for the next round.
    Failed(String),
    /// Another leader owns the state.
    Fenced(String),
    /// Not written: the fence was closed when the save was due.
    NotActing,
}

/// What the shell must do.
#[derive(Debug)]
pub enum Effect {
    /// Hand the change to these plugins (indexes into the shell's list);
    /// feed [`Input::Finished`] once per plugin.
    Dispatch {
        ticket: Ticket,
        event: Box<ChangeEvent>,
        plugins: Vec<usize>,
    },
    /// Write these (new index segments first, then the state Lease: the
    /// commit), then feed [`Input::Saved`].
    Save {
        checkpoints: Checkpoints,
        indexes: Vec<StreamIndex>,
        /// Per stream, what a successor must not trust of the stored
        /// index (see [`crate::checkpoint::Trust`]).
        unhandled: Unhandled,
    },
    /// A change arrived (for metrics).
    Received(ObjectKind),
    /// A change is handled (for metrics).
    Handled(ObjectKind),
    /// The term is over.
    End(End),
}

/// Why a term ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    Shutdown,
    /// The fence closed or leadership went elsewhere.
    NotActing,
    /// A save found the state owned by another term.
    Fenced(String),
    WatchesGone,
}

#[derive(Debug)]
struct Stream {
    /// A baseline whose index (and so checkpoint) is not stored yet.
    baseline_unsaved: bool,
}

/// A change whose dispatch waits (see the module docs).
#[derive(Debug)]
struct Held {
    ticket: Ticket,
    event: Box<ChangeEvent>,
    plugins: Vec<usize>,
    /// A creation: waits for a stored index with its object. Else a later
    /// change of a waiting object: waits for it.
    creation: bool,
}

/// Kind, namespace and name.
type ObjectKey = (ObjectKind, String, String);

fn object_of(event: &ChangeEvent) -> ObjectKey {
    let o = &event.object;
    (o.kind, o.namespace.clone(), o.name.clone())
}

#[derive(Debug)]
struct Outstanding {
    left: usize,
    kind: ObjectKind,
    since: Instant,
}

/// One term of leadership (see the module docs).
pub struct Term {
    progress: Progress,
    streams: Vec<Stream>,
    outstanding: HashMap<Ticket, Outstanding>,
    /// Which plugins a change goes to.
    route: Route,
    /// Kinds unreadable at the claim whose checkpoints are not all there.
    unreadable: BTreeSet<ObjectKind>,
    /// Checkpoints moved since the last stored save.
    unsaved: bool,
    /// Safe indexes not stored yet, the newest per stream.
    indexes: Vec<StreamIndex>,
    /// With checkpoints (HA): saves happen. Without, nothing is stored.
    stores: bool,
    interval: Duration,
    next_save: Instant,
    /// A baseline must be stored before anything else: retry at.
    urgent: Option<Instant>,
    urgent_failures: u32,
    /// A `Save` is being written (not fed `Saved` yet).
    saving: bool,
    /// While saving: a save came due (the interval passed).
    due_while_saving: bool,
    /// While saving: a baseline's index came, to be stored next.
    baseline_while_saving: Option<Instant>,
    /// Changes whose dispatch waits for a stored index, in arrival order.
    held: VecDeque<Held>,
    /// Per object, how many of `held` are its changes; and how many of
    /// `held` are creations (a change or a tick looks here, not at each).
    waiting: HashMap<ObjectKey, usize>,
    held_creations: usize,
    /// Per stream, [`Progress::handed`] when the save being written was
    /// taken, and as of the last stored save.
    committing: Vec<u64>,
    stored_through: Vec<u64>,
    /// Stepping down: per stream, whether an index came since.
    closing: Option<Vec<bool>>,
    /// Changes handled in this term; as of the save being written; as of
    /// the last stored save.
    handled: u64,
    handled_saving: u64,
    handled_stored: u64,
    ended: bool,
    /// Saves failed in a row.
    failed_saves: u32,
}

/// Failed saves in a row after which waiting creations go without a
/// stored index (a store that keeps failing must not stop delivery; it is
/// reported, by a Warning Event from the same count on). Fewer, and an API
/// server's brief trouble opened the window the hold closes (found by the
/// simulator: a creation let go at the first failed save, then deleted in
/// a leaderless gap past the history, stayed with its apps).
pub const HOLD_FAILURES: u32 = 3;

impl Term {
    /// A term that starts from `checkpoints` (as claimed; empty without HA)
    /// and saves every `interval` when `stores`. `route` names the plugins
    /// a change goes to. `unreadable`: kinds whose stored checkpoints could
    /// not be read.
    pub fn new(
        checkpoints: Checkpoints,
        unreadable: impl IntoIterator<Item = ObjectKind>,
        stores: bool,
        interval: Duration,
        now: Instant,
        route: Route,
    ) -> Term {
        Term {
            progress: Progress::new(checkpoints),
            streams: Vec::new(),
            outstanding: HashMap::new(),
            route,
            unreadable: unreadable.into_iter().collect(),
            unsaved: false,
            indexes: Vec::new(),
            stores,
            interval,
            next_save: now + interval,
            urgent: None,
            urgent_failures: 0,
            saving: false,
            due_while_saving: false,
            baseline_while_saving: None,
            held: VecDeque::new(),
            waiting: HashMap::new(),
            held_creations: 0,
            committing: Vec::new(),
            stored_through: Vec::new(),
            closing: None,
            handled: 0,
            handled_saving: 0,
            handled_stored: 0,
            ended: false,
            failed_saves: 0,
        }
    }

    /// Registers a stream; returns its id.
    pub fn stream(&mut self, kind: ObjectKind, scope: Scope, start: Start) -> usize {
        let id = self.progress.stream(kind, scope);
        self.streams.push(Stream {
            baseline_unsaved: self.stores && start == Start::Baseline,
        });
        self.committing.push(0);
        self.stored_through.push(0);
        id
    }

    /// Whether the shell may read watch outputs now: not while a baseline
    /// waits to be stored (nothing of the term is handled before it), nor
    /// once the term ended.
    pub fn wants_outputs(&self) -> bool {
        !self.ended && self.urgent.is_none() && self.baseline_while_saving.is_none()
    }

    /// When the shell must feed [`Input::Tick`] next. While saving, only
    /// the interval: what comes due meanwhile follows `Saved`.
    pub fn wake_at(&self) -> Instant {
        if self.saving {
            return self.next_save;
        }
        self.urgent.unwrap_or(self.next_save).min(self.next_save)
    }

    /// Stepping down, every dispatched change is handled and every stream
    /// sent an index since: the final save covers all that was handled.
    pub fn drained(&self) -> bool {
        self.closing
            .as_ref()
            .is_some_and(|f| f.iter().all(|x| *x) && self.outstanding.len() == self.held.len())
    }

    /// What a successor would replay if this term ended now: changes not
    /// handled yet, and those handled since the last stored save (without
    /// a store, only the former).
    pub fn unsaved(&self) -> usize {
        let handled = if self.stores {
            (self.handled - self.handled_stored) as usize
        } else {
            0
        };
        self.in_flight() + handled
    }

    /// Changes handed out and not handled yet.
    pub fn in_flight(&self) -> usize {
        self.progress.in_flight()
    }

    /// How long the oldest change not handled yet has waited.
    pub fn oldest(&self, now: Instant) -> Duration {
        self.outstanding
            .values()
            .map(|o| now.saturating_duration_since(o.since))
            .max()
            .unwrap_or_default()
    }

    /// The checkpoints as this term has them now.
    pub fn checkpoints(&self) -> &Checkpoints {
        self.progress.checkpoints()
    }

    /// Decides on one input.
    pub fn handle(&mut self, input: Input, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        match input {
            Input::Output(id, output) => self.output(id, output, now, &mut out),
            Input::Finished(ticket) => self.finished(ticket, &mut out),
            Input::Tick => {
                let due = now >= self.next_save || self.urgent.is_some_and(|at| now >= at);
                if due {
                    if now >= self.next_save {
                        self.next_save = now + self.interval;
                    }
                    if self.saving {
                        self.due_while_saving = true;
                    } else {
                        self.save(&mut out);
                    }
                }
            }
            Input::Saved(saved) => self.saved(saved, now, &mut out),
            Input::NotActing => self.end(End::NotActing, &mut out),
            Input::Closing => self.closing = Some(vec![false; self.streams.len()]),
            Input::Shutdown => self.end(End::Shutdown, &mut out),
            Input::WatchesGone => self.end(End::WatchesGone, &mut out),
        }
        out
    }

    fn output(&mut self, id: usize, output: Output, now: Instant, out: &mut Vec<Effect>) {
        match output {
            Output::Change {
                event,
                resource_version,
            } => self.change(id, event, resource_version, now, out),
            Output::Progress {
                resource_version,
                index_changed,
            } => {
                if index_changed {
                    self.progress.remembered(id, &resource_version);
                } else {
                    self.progress.progress(id, &resource_version);
                }
            }
            Output::Index(index) => self.index(id, index, now, out),
        }
    }

    /// A change from stream `id`: dispatched, held behind a creation
    /// waiting for a stored index, or handled at once (no plugin wants
    /// it; closing: the successor replays it).
    fn change(
        &mut self,
        id: usize,
        event: Box<ChangeEvent>,
        resource_version: Option<String>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let kind = event.object.kind;
        out.push(Effect::Received(kind));
        let removes = event.change == ChangeType::Deleted;
        let ticket = self.progress.change_to(
            id,
            resource_version.as_deref(),
            Some((event.object.namespace.clone(), event.object.name.clone())),
            removes.then_some(&event.object),
        );
        if self.closing.is_some() {
            // Not handled: the successor replays it.
            return;
        }
        let plugins = (self.route)(&event);
        if plugins.is_empty() {
            self.progress.complete(ticket);
            self.handled += 1;
            out.push(Effect::Handled(kind));
            return;
        }
        self.outstanding.insert(
            ticket,
            Outstanding {
                left: plugins.len(),
                kind,
                since: now,
            },
        );
        let creation =
            self.stores && matches!(event.change, ChangeType::Added | ChangeType::Resynced);
        // Only a creation, or a change while some wait, needs it.
        let key = (creation || !self.waiting.is_empty()).then(|| object_of(&event));
        let waits = key.as_ref().is_some_and(|k| self.waiting.contains_key(k));
        if waits && removes {
            let key = key.expect("waits");
            self.cancel_creation(&key, ticket, event, plugins, out);
            return;
        }
        if waits || creation {
            *self.waiting.entry(key.expect("held")).or_default() += 1;
            self.held_creations += usize::from(creation);
            self.held.push_back(Held {
                ticket,
                event,
                plugins,
                creation,
            });
            self.commit_held(out);
            return;
        }
        out.push(Effect::Dispatch {
            ticket,
            event,
            plugins,
        });
    }

    /// A deletion of `key` while its creation waits for a stored index:
    /// created and deleted before the creation's actions ran, the waiting
    /// changes run not. Nor the deletion, as the apps never saw the
    /// object; unless one of them is a replay, which the predecessor may
    /// have delivered: then the deletion goes out alone, now (a successor
    /// relisting finds the object gone and no app keeping it). Found by
    /// the simulator (seed 12: the object stayed with its apps).
    fn cancel_creation(
        &mut self,
        key: &ObjectKey,
        ticket: Ticket,
        event: Box<ChangeEvent>,
        plugins: Vec<usize>,
        out: &mut Vec<Effect>,
    ) {
        let kind = event.object.kind;
        self.waiting.remove(key);
        let mut gone = Vec::new();
        let mut creations = 0;
        let mut replayed = event.replay;
        self.held.retain(|h| {
            let of = object_of(&h.event) == *key;
            if of {
                gone.push(h.ticket);
                creations += usize::from(h.creation);
                replayed |= h.event.replay;
            }
            !of
        });
        self.held_creations -= creations;
        if !replayed {
            gone.push(ticket);
        }
        for t in gone {
            self.outstanding.remove(&t);
            self.progress.complete(t);
            self.handled += 1;
            out.push(Effect::Handled(kind));
        }
        if replayed {
            out.push(Effect::Dispatch {
                ticket,
                event,
                plugins,
            });
        }
    }

    /// A copy of stream `id`'s index: to store with the checkpoint; a
    /// baseline's is stored at once.
    fn index(
        &mut self,
        id: usize,
        index: wasmwatch_core::index::ObjectIndex,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        self.progress.index(id, index);
        if let Some(flushed) = self.closing.as_mut() {
            flushed[id] = true;
        }
        self.commit_held(out);
        let stream = &mut self.streams[id];
        if std::mem::take(&mut stream.baseline_unsaved) {
            // Stored at once, and nothing else read until it is
            // (right after the save being written, if one is).
            if self.saving {
                self.baseline_while_saving = Some(now);
            } else {
                self.urgent = Some(now);
                self.save(out);
            }
        }
    }

    fn finished(&mut self, ticket: Ticket, out: &mut Vec<Effect>) {
        let Some(o) = self.outstanding.get_mut(&ticket) else {
            return;
        };
        o.left -= 1;
        if o.left == 0 {
            self.handled += 1;
            out.push(Effect::Handled(o.kind));
            self.outstanding.remove(&ticket);
            self.progress.complete(ticket);
            self.commit_held(out);
        }
    }

    /// Saves at once (or right after the save being written) when a
    /// creation waits and an index that may be stored is there.
    fn commit_held(&mut self, out: &mut Vec<Effect>) {
        if self.ended || self.held_creations == 0 || !self.progress.has_ready() {
            return;
        }
        if self.saving {
            self.due_while_saving = true;
        } else {
            self.save(out);
        }
    }

    /// Dispatches what no longer waits: every change when `all` (a save
    /// failed), else creations whose object a stored index has, and the
    /// changes behind them.
    fn release(&mut self, all: bool, out: &mut Vec<Effect>) {
        if self.closing.is_some() {
            return;
        }
        self.waiting.clear();
        self.held_creations = 0;
        let mut keep = VecDeque::new();
        for h in std::mem::take(&mut self.held) {
            let (stream, pos) = Progress::position(h.ticket);
            let key = object_of(&h.event);
            let stored = pos < self.stored_through[stream];
            if !all && ((h.creation && !stored) || self.waiting.contains_key(&key)) {
                *self.waiting.entry(key).or_default() += 1;
                self.held_creations += usize::from(h.creation);
                keep.push_back(h);
            } else {
                out.push(Effect::Dispatch {
                    ticket: h.ticket,
                    event: h.event,
                    plugins: h.plugins,
                });
            }
        }
        self.held = keep;
    }

    /// Collects what moved; emits a save when there is something.
    fn save(&mut self, out: &mut Vec<Effect>) {
        if !self.stores {
            self.urgent = None;
            return;
        }
        self.unsaved |= self.progress.take_dirty();
        for ix in self.progress.take_indexes() {
            self.indexes
                .retain(|o| !(o.kind == ix.kind && o.scope == ix.scope));
            self.indexes.push(ix);
        }
        if !self.unsaved && self.indexes.is_empty() {
            self.urgent = None;
            return;
        }
        let mut checkpoints = self.progress.checkpoints().clone();
        for kind in &self.unreadable {
            if !self.progress.has_checkpoints(*kind) {
                checkpoints.clear(*kind);
            }
        }
        self.saving = true;
        self.handled_saving = self.handled;
        self.committing = (0..self.streams.len())
            .map(|id| self.progress.handed(id))
            .collect();
        out.push(Effect::Save {
            checkpoints,
            indexes: self.indexes.clone(),
            unhandled: self.progress.unhandled_all(),
        });
    }

    fn saved(&mut self, saved: Saved, now: Instant, out: &mut Vec<Effect>) {
        self.saving = false;
        let due = std::mem::take(&mut self.due_while_saving);
        let baseline = self.baseline_while_saving.take();
        match saved {
            Saved::Stored => {
                self.failed_saves = 0;
                self.unsaved = false;
                self.indexes.clear();
                self.stored_through = self.committing.clone();
                self.handled_stored = self.handled_saving;
                self.release(false, out);
                let progress = &self.progress;
                self.unreadable.retain(|k| !progress.has_checkpoints(*k));
                self.urgent = baseline;
                self.urgent_failures = 0;
                if due || baseline.is_some() {
                    self.save(out);
                }
            }
            Saved::Failed(_) => {
                self.failed_saves += 1;
                if self.failed_saves >= HOLD_FAILURES {
                    self.release(true, out);
                }
                if baseline.is_some() && self.urgent.is_none() {
                    // Its own save: at once.
                    self.urgent = baseline;
                    self.save(out);
                } else if self.urgent.is_some() {
                    self.urgent_failures += 1;
                    self.urgent = Some(now + crate::watchloop::backoff(self.urgent_failures));
                }
            }
            Saved::Fenced(why) => self.end(End::Fenced(why), out),
            Saved::NotActing => self.end(End::NotActing, out),
        }
    }

    fn end(&mut self, why: End, out: &mut Vec<Effect>) {
        self.ended = true;
        out.push(Effect::End(why));
    }

    /// After the term ended: the last save, if anything moved (the shell
    /// writes it only while the fence is open, and only after the save it
    /// was writing, if any, is over). Tickets finished after the
    /// end may still be fed as [`Input::Finished`] first (use
    /// [`Term::finish_late`]).
    pub fn final_save(&mut self) -> Option<Effect> {
        let mut out = Vec::new();
        self.saving = false;
        self.save(&mut out);
        self.saving = false;
        out.pop()
    }

    /// A ticket finished after the term ended (drained from the shell's
    /// channel before the final save).
    pub fn finish_late(&mut self, ticket: Ticket) -> Option<ObjectKind> {
        let mut out = Vec::new();
        self.finished(ticket, &mut out);
        out.into_iter().find_map(|e| match e {
            Effect::Handled(kind) => Some(kind),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests;
