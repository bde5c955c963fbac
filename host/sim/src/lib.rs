//! A deterministic simulator of wasmwatch's leader path (issue 33).
//!
//! One seed makes one schedule: how many replicas, what the writer does
//! to the ConfigMaps, which faults hit when (kills, SIGTERM, SIGSTOP under
//! and past the lease, leaderless gaps past the history, partitions from
//! the API server, failing and lost requests, dropped watches, 503s from
//! the app). The replicas run the real elector, checkpoint store, watch
//! loops and term ([`replica`]) against a simulated API server and app
//! ([`world`]), all on one thread under tokio's paused clock, so a seed
//! replays exactly (the checks below compare two runs' traces).
//!
//! Why our own driver rather than turmoil or madsim: both simulate the
//! network under tokio, so the kube client would need a simulated
//! connector and its whole HTTP stack in every schedule, and tokio's
//! `select!` draws its branch order from a per-runtime seed that only
//! `--cfg tokio_unstable` can fix, which would rebuild every crate for the
//! simulator alone. The seams in `wasmwatch_kube::apis` cut below the
//! code whose rules we test and above kube's HTTP, and a current-thread
//! runtime with paused time polls tasks in a fixed order: thousands of
//! schedules a minute, each reproducible from its seed.
//!
//! After each schedule every replica is stopped with SIGTERM and what the
//! app ended with is judged ([`check`]).
pub mod replica;
pub mod world;

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::watch;
use wasmwatch_core::index::{ObjectIndex, Seen};
use wasmwatch_core::{ObjectKind, ObjectSnapshot, Scope};
use wasmwatch_kube::checkpoint::CheckpointStore;
use wasmwatch_kube::elector::{Elector, ElectorConfig};

use crate::replica::{LEADER_LEASE, NAMESPACE, STATE_LEASE, Setup};
use crate::world::{Conn, Shared, World};

/// What one schedule did and what was wrong with it.
#[derive(Debug, Default)]
pub struct Outcome {
    pub seed: u64,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    pub writes: usize,
    pub deliveries: usize,
    /// Deliveries of a content the app had already received.
    pub duplicates: usize,
    /// Deletions lost after creations went out while the store kept
    /// failing (the design's one accepted loss, see `term::HOLD_FAILURES`).
    pub excused: usize,
    /// Objects not judged: a delivery of theirs was dead-lettered (the
    /// app answered 503 six times in a row).
    pub dead_lettered: usize,
    pub faults: Vec<String>,
    pub requests: u64,
    pub simulated: Duration,
    /// Per term after the first: its duplicates (contents the app had
    /// received from an earlier term).
    pub term_duplicates: Vec<usize>,
    /// The same, of the terms that took over from a SIGTERM handover (the
    /// term before ended by SIGTERM with its final save stored).
    pub handover_duplicates: Vec<usize>,
}

/// A fault of the schedule.
#[derive(Debug, Clone)]
enum Fault {
    /// SIGKILL, restarted after.
    Kill { node: usize, down: Duration },
    /// SIGTERM, restarted after.
    Term { node: usize, down: Duration },
    /// SIGSTOP for this long (past the lease or under it), then SIGCONT.
    Pause { node: usize, for_: Duration },
    /// The replica cannot reach the API server (it can reach the app).
    Partition { node: usize, for_: Duration },
    /// Every replica killed for longer than the history.
    Gap { down: Duration },
    /// Requests fail (500/503) with this probability for a while.
    Errors { p: f64, for_: Duration },
    /// Every plugin call fails for a while (the decide stage retries,
    /// then dead-letters).
    PluginDown { for_: Duration },
    /// The app answers every POST with a 503 for a while (the pipeline
    /// retries, then dead-letters).
    AppDown { for_: Duration },
}

/// What a run of many schedules found.
#[derive(Debug, Default)]
pub struct Sweep {
    pub schedules: u64,
    /// Failing seeds, each with its violations, by seed.
    pub failed: Vec<(u64, Vec<String>)>,
    pub deliveries: usize,
    pub duplicates: usize,
    pub excused: usize,
    pub simulated: Duration,
    /// Every term's duplicates (`Outcome::term_duplicates`), and the seed.
    pub term_duplicates: Vec<(usize, u64)>,
    pub handover_duplicates: Vec<(usize, u64)>,
}

impl Sweep {
    /// Duplicates per term after the first: median, 99th percentile, most
    /// (with its seed).
    pub fn per_term(&self) -> Option<(usize, usize, (usize, u64))> {
        spread(&self.term_duplicates)
    }

    /// The same, of the terms after a SIGTERM handover.
    pub fn per_handover(&self) -> Option<(usize, usize, (usize, u64))> {
        spread(&self.handover_duplicates)
    }
}

/// Median, 99th percentile and most (with its seed) of duplicate counts.
fn spread(of: &[(usize, u64)]) -> Option<(usize, usize, (usize, u64))> {
    let mut d = of.to_vec();
    d.sort();
    let most = *d.last()?;
    let at = |q: f64| d[((d.len() - 1) as f64 * q) as usize].0;
    Some((at(0.5), at(0.99), most))
}

/// Runs schedules `seeds` on `threads` threads (each schedule is its own
/// single-threaded world).
pub fn sweep(seeds: std::ops::Range<u64>, threads: usize) -> Sweep {
    let threads = threads.max(1) as u64;
    let parts: Vec<Sweep> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let seeds = seeds.clone();
                s.spawn(move || {
                    let mut part = Sweep::default();
                    for seed in seeds.skip(t as usize).step_by(threads as usize) {
                        let o = run(seed);
                        part.schedules += 1;
                        part.deliveries += o.deliveries;
                        part.duplicates += o.duplicates;
                        part.excused += o.excused;
                        part.simulated += o.simulated;
                        part.term_duplicates
                            .extend(o.term_duplicates.iter().map(|&d| (d, seed)));
                        part.handover_duplicates
                            .extend(o.handover_duplicates.iter().map(|&d| (d, seed)));
                        if !o.violations.is_empty() {
                            part.failed.push((seed, o.violations));
                        }
                    }
                    part
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a schedule panicked"))
            .collect()
    });
    let mut all = Sweep::default();
    for p in parts {
        all.schedules += p.schedules;
        all.failed.extend(p.failed);
        all.deliveries += p.deliveries;
        all.duplicates += p.duplicates;
        all.excused += p.excused;
        all.simulated += p.simulated;
        all.term_duplicates.extend(p.term_duplicates);
        all.handover_duplicates.extend(p.handover_duplicates);
    }
    all.failed.sort();
    all
}

/// Runs schedule `seed`.
pub fn run(seed: u64) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(simulate(seed))
}

struct Replicas {
    world: Shared,
    setup: Setup,
    /// Per node: its running task and SIGTERM switch, if up.
    up: Vec<Option<(tokio::task::JoinHandle<()>, watch::Sender<bool>)>>,
}

impl Replicas {
    fn start(&mut self, node: usize) {
        if self.up[node]
            .as_ref()
            .is_some_and(|(h, _)| !h.is_finished())
        {
            return;
        }
        let (tx, rx) = watch::channel(false);
        let conn = Conn::new(&self.world, node);
        let task = tokio::spawn(replica::run(conn, self.setup.clone(), rx));
        self.world.lock().log(format!("node {node} starts"));
        self.up[node] = Some((task, tx));
    }

    fn kill(&mut self, node: usize) {
        if let Some((task, _)) = self.up[node].take() {
            task.abort();
            self.world.lock().log(format!("node {node} killed"));
        }
    }

    /// SIGTERM; returns the task to wait for.
    fn terminate(&mut self, node: usize) -> Option<tokio::task::JoinHandle<()>> {
        let (task, tx) = self.up[node].take()?;
        self.world.lock().log(format!("node {node} gets SIGTERM"));
        let _ = tx.send(true);
        Some(task)
    }

    fn set_paused(&self, node: usize, paused: bool) {
        let mut w = self.world.lock();
        w.nodes[node].paused = paused;
        w.nodes[node].resumed.notify_waiters();
        w.log(format!(
            "node {node} {}",
            if paused { "SIGSTOP" } else { "SIGCONT" }
        ));
    }
}

async fn simulate(seed: u64) -> Outcome {
    wasmwatch_core::jitter::seed(seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5151_5151);
    let history = Duration::from_secs(rng.random_range(20..90));
    let world = World::shared(seed, history);
    let replicas = rng.random_range(2..=3usize);
    let scopes = if rng.random_bool(0.5) {
        vec![Scope::All]
    } else {
        vec![Scope::from_key("a"), Scope::from_key("b")]
    };
    let setup = Setup {
        scopes,
        checkpoint_interval: Duration::from_millis(rng.random_range(500..3000)),
        act_latency: Duration::from_millis(rng.random_range(1..200)),
        app_503: if rng.random_bool(0.3) {
            rng.random_range(0.0..0.3)
        } else {
            0.0
        },
        plugin_fails: if rng.random_bool(0.3) {
            rng.random_range(0.0..0.2)
        } else {
            0.0
        },
        plugin_slow: if rng.random_bool(0.2) { 0.02 } else { 0.0 },
        // Small (production: 200 KiB; the tail a tenth of it, rewrites from
        // four), so that saves write several segments, rewrite often, and
        // a failure can fall between any two writes.
        segment_bytes: rng.random_range(300..3_000),
    };
    {
        let mut w = world.lock();
        for n in 0..replicas {
            w.add_node(&format!("{NAMESPACE}/replica-{n}"));
        }
        w.faults.watch_drop = if rng.random_bool(0.5) {
            rng.random_range(0.0..0.05)
        } else {
            0.0
        };
        w.faults.lost_answer = if rng.random_bool(0.5) {
            rng.random_range(0.0..0.03)
        } else {
            0.0
        };
        w.faults.error = if rng.random_bool(0.5) {
            rng.random_range(0.0..0.05)
        } else {
            0.0
        };
        let faults = w.faults.clone();
        w.log(format!(
            "seed {seed}: {replicas} replicas, history {history:?}, {setup:?}, {faults:?}"
        ));
    }
    let base_faults = world.lock().faults.clone();
    let mut reps = Replicas {
        world: world.clone(),
        setup,
        up: (0..replicas).map(|_| None).collect(),
    };
    for n in 0..replicas {
        reps.start(n);
    }

    // The writer: creates, changes and deletes objects until `active`.
    let active = Duration::from_secs(rng.random_range(60..240));
    let namespaces: Vec<&str> = vec!["a", "b"];
    let names = rng.random_range(3..12);
    let mean_gap = rng.random_range(0.05..2.0f64);
    let writer = {
        let world = world.clone();
        let scopes = reps.setup.scopes.clone();
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xabcd);
        tokio::spawn(async move {
            // Objects are written once a first baseline is stored: what
            // exists before wasmwatch first leads is what the apps already
            // have, and is not delivered (the first list is a baseline).
            loop {
                let baseline = world
                    .lock()
                    .leases()
                    .get(STATE_LEASE)
                    .and_then(|l| l.metadata.annotations.as_ref())
                    .and_then(|a| {
                        a.get(&wasmwatch_kube::checkpoint::annotation_key(
                            ObjectKind::ConfigMap,
                        ))
                    })
                    .is_some_and(|v| {
                        // Every scope's: a namespace listed later would take
                        // what was written meanwhile as its baseline.
                        let mut stored = wasmwatch_kube::checkpoint::Checkpoints::default();
                        stored.parse_into(ObjectKind::ConfigMap, v).is_ok()
                            && scopes
                                .iter()
                                .all(|s| stored.get(ObjectKind::ConfigMap, s).is_some())
                    });
                if baseline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let end = tokio::time::Instant::now() + active;
            while tokio::time::Instant::now() < end {
                let gap = -mean_gap * (1.0 - rng.random::<f64>()).ln();
                tokio::time::sleep(Duration::from_secs_f64(gap)).await;
                let ns = namespaces[rng.random_range(0..namespaces.len())];
                let name = format!("cm-{}", rng.random_range(0..names));
                let delete = rng.random_bool(0.15);
                let revert = rng.random_bool(0.15);
                world.lock().write(ns, &name, delete, revert);
            }
        })
    };

    // The faults, one after another until `active`.
    let mut faults = Vec::new();
    let start = tokio::time::Instant::now();
    loop {
        let wait = Duration::from_secs_f64(rng.random_range(2.0..40.0));
        if start.elapsed() + wait >= active {
            break;
        }
        tokio::time::sleep(wait).await;
        let node = rng.random_range(0..replicas);
        let fault = match rng.random_range(0..100) {
            0..25 => Fault::Kill {
                node,
                down: Duration::from_secs_f64(rng.random_range(0.0..30.0)),
            },
            25..45 => Fault::Term {
                node,
                down: Duration::from_secs_f64(rng.random_range(0.0..10.0)),
            },
            45..65 => Fault::Pause {
                node,
                for_: Duration::from_secs_f64(rng.random_range(1.0..40.0)),
            },
            65..80 => Fault::Partition {
                node,
                for_: Duration::from_secs_f64(rng.random_range(1.0..40.0)),
            },
            80..90 => Fault::Gap {
                down: history + Duration::from_secs_f64(rng.random_range(5.0..60.0)),
            },
            90..95 => Fault::Errors {
                p: rng.random_range(0.1..0.6),
                for_: Duration::from_secs_f64(rng.random_range(1.0..20.0)),
            },
            95..98 => Fault::PluginDown {
                for_: Duration::from_secs_f64(rng.random_range(5.0..60.0)),
            },
            _ => Fault::AppDown {
                for_: Duration::from_secs_f64(rng.random_range(5.0..60.0)),
            },
        };
        world.lock().log(format!("fault {fault:?}"));
        faults.push(format!("{fault:?}"));
        match fault {
            Fault::Kill { node, down } => {
                reps.kill(node);
                tokio::time::sleep(down).await;
                reps.start(node);
            }
            Fault::Term { node, down } => {
                // It steps down while the world goes on; restarted (same
                // identity: the same pod's container) only once it has
                // exited, as a kubelet does, which kills it after the
                // grace period (30 s).
                let stopping = reps.terminate(node);
                tokio::time::sleep(down).await;
                if let Some(mut task) = stopping
                    && tokio::time::timeout(Duration::from_secs(30), &mut task)
                        .await
                        .is_err()
                {
                    task.abort();
                    world
                        .lock()
                        .log(format!("node {node} killed after the grace period"));
                }
                reps.start(node);
            }
            Fault::Pause { node, for_ } => {
                reps.set_paused(node, true);
                tokio::time::sleep(for_).await;
                reps.set_paused(node, false);
            }
            Fault::Partition { node, for_ } => {
                world.lock().nodes[node].partitioned = true;
                tokio::time::sleep(for_).await;
                world.lock().nodes[node].partitioned = false;
            }
            Fault::Gap { down } => {
                for n in 0..replicas {
                    reps.kill(n);
                }
                tokio::time::sleep(down).await;
                for n in 0..replicas {
                    reps.start(n);
                }
            }
            Fault::Errors { p, for_ } => {
                world.lock().faults.error = p;
                tokio::time::sleep(for_).await;
                world.lock().faults.error = base_faults.error;
            }
            Fault::PluginDown { for_ } => {
                world.lock().plugin_down = true;
                tokio::time::sleep(for_).await;
                world.lock().plugin_down = false;
            }
            Fault::AppDown { for_ } => {
                world.lock().app_down = true;
                tokio::time::sleep(for_).await;
                world.lock().app_down = false;
            }
        }
    }
    let _ = writer.await;

    // Quiet: no faults, every replica up, long enough for a takeover
    // (lease 15 s), a claim and a replay.
    {
        let mut w = world.lock();
        w.faults = Default::default();
        w.log("quiet");
    }
    for n in 0..replicas {
        reps.start(n);
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    // And until the app hears nothing for 40 s (longer than the pipeline's
    // backoff between two attempts): a backlog of one object's contents,
    // refused by its app now and then, drains one change at a time.
    for _ in 0..30 {
        let heard = world.lock().app.len();
        tokio::time::sleep(Duration::from_secs(40)).await;
        if world.lock().app.len() == heard {
            break;
        }
    }
    let mut stopping = Vec::new();
    for n in 0..replicas {
        stopping.extend(reps.terminate(n));
    }
    for t in stopping {
        let _ = t.await;
    }
    let stored = stored_state(&world).await;
    let mut outcome = check(&world, stored);
    outcome.seed = seed;
    outcome.faults = faults;
    outcome.simulated = world.lock().elapsed();
    outcome
}

/// What a new leader would claim after the schedule: the stored index's
/// text (`ObjectIndex::encode`), or why it cannot be read.
async fn stored_state(world: &Shared) -> Result<String, String> {
    let node = world.lock().add_node("checker");
    let conn = Conn::new(world, node);
    let config = ElectorConfig::new(NAMESPACE, LEADER_LEASE, "checker");
    let (mut elector, _) = Elector::with_api(conn.clone(), config).map_err(|e| e.to_string())?;
    let term = elector
        .try_acquire_or_renew()
        .await
        .map_err(|e| format!("the checker cannot take the released lease: {e}"))?;
    let mut store = CheckpointStore::with_api(conn, STATE_LEASE, LEADER_LEASE, term);
    let claimed = store.claim().await.map_err(|e| format!("claim: {e}"))?;
    if !claimed.problems().is_empty() || !claimed.unreadable.is_empty() {
        return Err(format!("unreadable state: {:?}", claimed.problems()));
    }
    Ok(claimed
        .indexes
        .get(&ObjectKind::ConfigMap)
        .map(ObjectIndex::encode)
        .unwrap_or_default())
}

/// The index of the objects as they are (what a leader that handled
/// everything stores).
fn live_index(w: &World) -> String {
    let mut index = ObjectIndex::new(ObjectKind::ConfigMap);
    for o in w.objects() {
        let d = o.to_dynamic();
        let m = d.metadata;
        let meta = wasmwatch_core::event::Metadata {
            name: m.name.unwrap_or_default(),
            namespace: m.namespace.unwrap_or_default(),
            uid: m.uid.unwrap_or_default(),
            resource_version: m.resource_version.unwrap_or_default(),
            labels: Default::default(),
            annotations: Default::default(),
        };
        let snapshot = ObjectSnapshot::from_parts(ObjectKind::ConfigMap, meta, d.data)
            .expect("a simulated object reads");
        index.apply(Seen::Added, snapshot, false);
    }
    index.encode()
}

/// Judges what the app ended with.
fn check(world: &Shared, stored: Result<String, String>) -> Outcome {
    let w = world.lock();
    let mut violations = w.violations.clone();
    // Per object, what the app received, in order.
    let mut seen: BTreeMap<(String, String), Vec<&world::Delivery>> = BTreeMap::new();
    for d in &w.app {
        seen.entry((d.namespace.clone(), d.name.clone()))
            .or_default()
            .push(d);
    }
    let mut duplicates = 0;
    let mut term_duplicates = vec![0; w.claims.len()];
    for (key, ds) in &seen {
        let mut newest = 0;
        let mut had = std::collections::BTreeSet::new();
        for d in ds {
            // A deletion a relist found (no version) is judged by the end
            // state.
            if d.of < newest && d.of != 0 {
                violations.push(format!(
                    "{}/{}: moved backwards: {} delivered at {:?} after rv {newest}",
                    key.0,
                    key.1,
                    describe(d),
                    d.at
                ));
            }
            newest = newest.max(d.of);
            if !had.insert((d.of, d.content.is_some())) {
                duplicates += 1;
                term_duplicates[d.term] += 1;
            }
            if let Some(earlier) = handover_duplicate(&w, ds, d) {
                violations.push(format!(
                    "{}/{}: {} delivered again after a SIGTERM handover (first at {:?} by term {}), but the final save did not name it unhandled",
                    key.0,
                    key.1,
                    describe(d),
                    earlier.at,
                    earlier.term,
                ));
            }
            // No storm: a term delivers nothing at or before the
            // checkpoint it resumed from with an index covering it (what
            // its predecessors stored as handled).
            let claim = &w.claims[d.term];
            if let Some(from) = claim.from.get(&d.namespace)
                && d.of != 0
                && d.of <= *from
            {
                violations.push(format!(
                    "{}/{}: {} delivered at {:?}, at or before the checkpoint {from} its term claimed at {:?}",
                    key.0,
                    key.1,
                    describe(d),
                    d.at,
                    claim.at
                ));
            }
        }
    }
    let mut excused = 0;
    let mut dead_lettered = 0;
    for (key, (content, exists)) in &w.truth {
        let last = seen.get(key).and_then(|ds| ds.last());
        // A dead letter after which nothing of the object reached the
        // app: what the app ends with is not judged (a later delivery is).
        if let Some(&at) = w.dead_letters.get(key)
            && !w.app[at..]
                .iter()
                .any(|d| d.namespace == key.0 && d.name == key.1)
        {
            dead_lettered += 1;
            continue;
        }
        match (exists, last) {
            (true, Some(d)) if d.content == Some(*content) => {}
            (true, last) => violations.push(format!(
                "{}/{}: the app ends with {} but the object is content {content}",
                key.0,
                key.1,
                last.map_or("nothing".to_string(), |d| describe(d))
            )),
            // Delivered while the store kept failing: the creation may
            // have gone without a stored index, and a gap past the history
            // then hides the deletion (accepted, reported; counted).
            (false, Some(_))
                if seen[key]
                    .iter()
                    .rev()
                    .take_while(|d| d.content.is_some())
                    .any(|d| d.store_failing) =>
            {
                excused += 1;
            }
            (false, Some(d)) if d.content.is_some() => violations.push(format!(
                "{}/{}: deleted, but the app ends with {}",
                key.0,
                key.1,
                describe(d)
            )),
            (false, _) => {}
        }
    }
    match stored {
        Err(e) => violations.push(format!("stored state: {e}")),
        Ok(index) => {
            let live = live_index(&w);
            if index != live {
                violations.push(format!(
                    "the stored index after the last SIGTERM is not the objects'.\nstored:\n{index}live:\n{live}"
                ));
            }
        }
    }
    Outcome {
        violations,
        trace: w.trace.clone(),
        writes: w.truth.len(),
        deliveries: w.app.len(),
        duplicates,
        excused,
        dead_lettered,
        requests: w.requests,
        handover_duplicates: (1..w.claims.len())
            .filter(|&k| w.claims[k - 1].handed_over)
            .map(|k| term_duplicates[k])
            .collect(),
        term_duplicates: term_duplicates.into_iter().skip(1).collect(),
        ..Default::default()
    }
}

/// Rule 6: after a SIGTERM handover whose final save was stored, the
/// successor delivers again nothing its predecessors delivered up to the
/// version that save's index was taken at, but the objects it named
/// unhandled (changes still in their retries; issue 32's bound of one
/// duplicate per handover, the one in flight).
/// Returns the earlier delivery `d` repeats, when that breaks the rule.
fn handover_duplicate<'a>(
    w: &World,
    ds: &[&'a world::Delivery],
    d: &world::Delivery,
) -> Option<&'a world::Delivery> {
    let k = d.term;
    if k == 0 || !w.claims[k - 1].handed_over {
        return None;
    }
    let trust = w.claims[k].trust.as_ref()?;
    let kind = ObjectKind::ConfigMap;
    let trusted = trust
        .trusted(kind, &Scope::All)
        .or_else(|| trust.trusted(kind, &Scope::from_key(&d.namespace)))?;
    // Past the stored index's version a change is compared with the
    // index's content: one handled after the index was taken (the loop
    // could not hand its index over within the drain, its watch
    // reconnecting) goes out again. A relist's deletion has no version.
    if d.of == 0
        || d.of > trusted.at
        || trusted
            .unhandled
            .contains(&(d.namespace.clone(), d.name.clone()))
    {
        return None;
    }
    ds.iter()
        .find(|e| e.term < k && e.of == d.of && e.content == d.content)
        .copied()
}

fn describe(d: &world::Delivery) -> String {
    match d.content {
        Some(c) => format!(
            "content {c} at rv {} (node {}{})",
            d.of,
            d.node,
            if d.replay { ", replay" } else { "" }
        ),
        None => format!("its deletion at rv {} (node {})", d.of, d.node),
    }
}
