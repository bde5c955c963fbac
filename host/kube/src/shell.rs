//! The term's async shell, shared by `wasmwatch run` and the simulator
//! (host/sim): it feeds a [`Term`] what happens (watch outputs, finished
//! changes, saves, time, leadership, shutdown) and carries out the effects
//! it returns, writing one save at a time beside everything else.
//!
//! What acts on a change (the plugin calls, their retries, the pipeline and
//! its executors; the simulator's app) is behind [`Act`], so both run this
//! same loop: the order of its inputs, the drain on SIGTERM, the end of a
//! term and its final save are tested by the simulator's schedules.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::sync::watch;
use tokio::time::Instant;
use wasmwatch_core::{ChangeEvent, ObjectKind};

use crate::apis::LeaseApi;
use crate::checkpoint::{
    CheckpointError, CheckpointStore, Checkpoints, StreamIndex, Ticket, Unhandled,
};
use crate::elector::Leadership;
use crate::term::{Effect, End, Input, Saved, Term};
use crate::watchloop::{Flush, Output};

/// "May this replica act now": the stretch of acting its term began in.
pub type MayAct = Arc<dyn Fn() -> bool + Send + Sync>;

/// Every watch loop's outputs, tagged with its stream; ends when every
/// loop has ended.
pub type Outputs = futures_util::stream::SelectAll<BoxStream<'static, (usize, Output)>>;

/// What acts on the changes a term dispatches.
pub trait Act: Send {
    /// Hands a change to the plugins the term routed it to (indexes).
    fn dispatch(&mut self, ticket: Ticket, event: Box<ChangeEvent>, plugins: Vec<usize>);

    /// Waits for the next thing that is over: `Some(tickets)` finishes
    /// those changes, in order (a call that stood for several changes
    /// finishes each); `None` is progress of its own (look again).
    /// Pending while nothing runs.
    fn next(&mut self) -> impl Future<Output = Option<Vec<Ticket>>> + Send;

    /// Whether more watch outputs may be read now (back-pressure).
    fn accepting(&self) -> bool {
        true
    }

    /// Ends everything in flight at once (dropping a plugin call ends its
    /// sandbox) and gives the changes it finished meanwhile. Called again
    /// after the save in flight is written: what finished since.
    fn stop(&mut self) -> Vec<Ticket>;

    /// Waits before each input (the simulator pauses a replica here).
    fn gate(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// A change was received from a watch, or fully handled.
    fn received(&mut self, _kind: ObjectKind) {}
    fn handled(&mut self, _kind: ObjectKind) {}

    /// The term's clock ticked (a save or a retry may be due).
    fn tick(&mut self, _term: &Term) {}

    /// A save's outcome (`last`: written after the term ended, the one in
    /// flight then or the final save), with the state Lease's UID.
    fn saved(&mut self, _saved: &Saved, _state_uid: Option<String>, _last: bool) {}
}

/// Writes one save of the term; what it did, for [`Input::Saved`].
pub async fn write<L: LeaseApi>(
    store: &mut CheckpointStore<L>,
    checkpoints: &Checkpoints,
    indexes: &[StreamIndex],
    unhandled: &Unhandled,
    may_act: &(dyn Fn() -> bool + Send + Sync),
) -> Saved {
    if !may_act() {
        return Saved::NotActing;
    }
    match store.save_with(checkpoints, indexes, unhandled).await {
        Ok(()) => Saved::Stored,
        Err(CheckpointError::Api(e)) => {
            tracing::warn!("checkpoint not saved, retrying: {e}");
            Saved::Failed(e.to_string())
        }
        Err(e) => Saved::Fenced(e.to_string()),
    }
}

/// What the shell waited for.
enum Next {
    Input(Input),
    /// Changes finished, in order.
    Finished(Vec<Ticket>),
    /// Nothing for the term (look again).
    Again,
}

/// A save being written, with the store it gives back.
type Writing<L> = Pin<Box<dyn Future<Output = (CheckpointStore<L>, Saved)> + Send>>;

/// One term's shell.
pub struct Shell<L: LeaseApi, A: Act> {
    pub term: Term,
    pub store: Option<CheckpointStore<L>>,
    pub outputs: Outputs,
    /// Asks every loop for its index when stepping down.
    pub flush: Flush,
    pub may_act: MayAct,
    pub act: A,
    /// How long stepping down waits for the changes in flight and a last
    /// index from every loop.
    pub drain: Duration,
}

impl<L: LeaseApi + Send + 'static, A: Act> Shell<L, A> {
    /// Runs the term until it ends; then stops acting, writes the save in
    /// flight and the final save. Gives back how it ended and the act.
    pub async fn run(
        mut self,
        leadership: &mut watch::Receiver<Leadership>,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> (End, A) {
        let mut writing: Option<Writing<L>> = None;
        let mut closing: Option<Instant> = None;
        let end = loop {
            self.act.gate().await;
            let next = {
                let Shell {
                    term,
                    outputs,
                    flush,
                    may_act,
                    act,
                    drain,
                    ..
                } = &mut self;
                let reading = term.wants_outputs() && act.accepting();
                tokio::select! {
                    biased;
                    _ = &mut shutdown, if closing.is_none() => {
                        // Dispatch nothing more, let what runs finish, and
                        // get an index after it from every loop: the final
                        // save then covers everything handled (issue 32).
                        closing = Some(Instant::now() + *drain);
                        flush.ask();
                        Next::Input(Input::Closing)
                    }
                    () = std::future::ready(()), if closing.is_some() && term.drained() => Next::Input(Input::Shutdown),
                    () = tokio::time::sleep_until(closing.unwrap_or_else(Instant::now)), if closing.is_some() => {
                        tracing::warn!("stepping down before every change in flight was handled; the next leader replays them");
                        Next::Input(Input::Shutdown)
                    }
                    r = leadership.changed() => {
                        if r.is_ok() && may_act() {
                            Next::Again
                        } else {
                            tracing::warn!("not leading any more; stopping leader work");
                            Next::Input(Input::NotActing)
                        }
                    }
                    (store, saved) = async { writing.as_mut().expect("checked").await }, if writing.is_some() => {
                        writing = None;
                        act.saved(&saved, store.uid(), false);
                        self.store = Some(store);
                        Next::Input(Input::Saved(saved))
                    }
                    finished = act.next() => match finished {
                        Some(tickets) => Next::Finished(tickets),
                        None => Next::Again,
                    },
                    _ = tokio::time::sleep_until(term.wake_at()) => {
                        act.tick(term);
                        if may_act() {
                            Next::Input(Input::Tick)
                        } else {
                            tracing::warn!("the fence closed; stopping leader work");
                            Next::Input(Input::NotActing)
                        }
                    }
                    // Back-pressure: outputs are read only while the act
                    // accepts more, so a burst waits in the watch loops'
                    // channels, not in memory.
                    o = outputs.next(), if reading => Next::Input(match o {
                        Some((id, output)) => Input::Output(id, output),
                        None => Input::WatchesGone,
                    }),
                }
            };
            let now = Instant::now();
            let effects = match next {
                Next::Again => continue,
                Next::Finished(tickets) => tickets
                    .into_iter()
                    .flat_map(|t| self.term.handle(Input::Finished(t), now))
                    .collect(),
                Next::Input(input) => self.term.handle(input, now),
            };
            if let Some(end) = self.apply(effects, &mut writing) {
                break end;
            }
        };
        self.finish(end, writing).await
    }

    /// Carries out the term's effects; the end of the term, if one says so.
    fn apply(&mut self, effects: Vec<Effect>, writing: &mut Option<Writing<L>>) -> Option<End> {
        let mut ended = None;
        for effect in effects {
            match effect {
                Effect::Dispatch {
                    ticket,
                    event,
                    plugins,
                } => self.act.dispatch(ticket, event, plugins),
                Effect::Save {
                    checkpoints,
                    indexes,
                    unhandled,
                } => {
                    let mut store = self
                        .store
                        .take()
                        .expect("a term without a store saves nothing (or one save at a time)");
                    let may_act = self.may_act.clone();
                    *writing = Some(Box::pin(async move {
                        let saved =
                            write(&mut store, &checkpoints, &indexes, &unhandled, &*may_act).await;
                        (store, saved)
                    }));
                }
                Effect::Received(kind) => self.act.received(kind),
                Effect::Handled(kind) => self.act.handled(kind),
                Effect::End(why) => ended = Some(why),
            }
        }
        ended
    }

    /// Stops watching and acting first, then saves what is complete.
    async fn finish(mut self, end: End, writing: Option<Writing<L>>) -> (End, A) {
        if let End::Fenced(why) = &end {
            tracing::error!("{why}; stopping leader work");
        }
        drop(std::mem::replace(
            &mut self.outputs,
            futures_util::stream::select_all(Vec::new()),
        ));
        let mut late = self.act.stop();
        // The save being written ends first: one write at a time. One that
        // found the state fenced leaves nothing more to write.
        let mut fenced = false;
        if let Some(w) = writing {
            let (store, saved) = w.await;
            fenced = matches!(saved, Saved::Fenced(_) | Saved::NotActing);
            self.act.saved(&saved, store.uid(), true);
            self.store = Some(store);
        }
        // What finished while it was written (stopped work may still hand
        // back what was already done).
        late.extend(self.act.stop());
        for ticket in late {
            if let Some(kind) = self.term.finish_late(ticket) {
                self.act.handled(kind);
            }
        }
        if let (
            Some(store),
            Some(Effect::Save {
                checkpoints,
                indexes,
                unhandled,
            }),
        ) = (self.store.as_mut(), self.term.final_save())
            && !fenced
            && (self.may_act)()
        {
            let saved = write(store, &checkpoints, &indexes, &unhandled, &*self.may_act).await;
            match &saved {
                Saved::Stored => {}
                Saved::Failed(e) | Saved::Fenced(e) => {
                    tracing::warn!("final checkpoint not saved: {e}")
                }
                Saved::NotActing => tracing::warn!("final checkpoint not saved: the fence closed"),
            }
            self.act.saved(&saved, store.uid(), true);
        }
        (end, self.act)
    }
}

/// Tags a watch loop's channel with its stream id, for [`Outputs`].
pub fn tagged(
    id: usize,
    rx: tokio::sync::mpsc::Receiver<Output>,
) -> BoxStream<'static, (usize, Output)> {
    futures_util::stream::unfold(rx, move |mut rx| async move {
        rx.recv().await.map(|o| ((id, o), rx))
    })
    .boxed()
}
