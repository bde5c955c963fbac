//! `cargo run -p wasmwatch-sim -- --seeds 100000` runs schedules
//! 0..10000; `-- --seed N` runs one and prints its trace.
use std::time::Instant;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Runs wasmwatch's leader path through seeded schedules of faults")]
struct Args {
    /// Run this one schedule and print its trace.
    #[arg(long)]
    seed: Option<u64>,
    /// Run this many schedules (from --from).
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Threads (default: one per core).
    #[arg(long)]
    jobs: Option<usize>,
    /// Run each schedule twice and fail if the traces differ.
    #[arg(long)]
    twice: bool,
}

fn main() {
    let args = Args::parse();
    if let Some(seed) = args.seed {
        let o = wasmwatch_sim::run(seed);
        for line in &o.trace {
            println!("{line}");
        }
        println!(
            "seed {seed}: {} objects, {} deliveries, {} duplicates ({:?} per term after the first), {} excused, {} requests, {:?} simulated, faults {:?}",
            o.writes,
            o.deliveries,
            o.duplicates,
            o.term_duplicates,
            o.excused,
            o.requests,
            o.simulated,
            o.faults
        );
        for v in &o.violations {
            println!("VIOLATION: {v}");
        }
        std::process::exit(if o.violations.is_empty() { 0 } else { 1 });
    }
    let started = Instant::now();
    let threads = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut failed = Vec::new();
    if args.twice {
        for seed in args.from..args.from + args.seeds {
            if wasmwatch_sim::run(seed).trace != wasmwatch_sim::run(seed).trace {
                println!("seed {seed}: not deterministic (two runs, two traces)");
                failed.push(seed);
            }
        }
    }
    let sweep = wasmwatch_sim::sweep(args.from..args.from + args.seeds, threads);
    for (seed, violations) in &sweep.failed {
        for v in violations {
            println!("seed {seed}: {v}");
        }
        failed.push(*seed);
    }
    println!(
        "{} schedules in {:.1?} on {threads} threads ({:.1?} simulated): {} failed {:?}; {} deliveries, {} duplicates, {} deletions lost while the store kept failing",
        sweep.schedules,
        started.elapsed(),
        sweep.simulated,
        failed.len(),
        &failed[..failed.len().min(20)],
        sweep.deliveries,
        sweep.duplicates,
        sweep.excused,
    );
    if let Some((median, p99, (most, seed))) = sweep.per_term() {
        println!(
            "duplicates per term after the first ({} terms): median {median}, p99 {p99}, most {most} (seed {seed})",
            sweep.term_duplicates.len()
        );
    }
    if let Some((median, p99, (most, seed))) = sweep.per_handover() {
        println!(
            "duplicates per SIGTERM handover ({}): median {median}, p99 {p99}, most {most} (seed {seed})",
            sweep.handover_duplicates.len()
        );
    }
    println!("reproduce one: cargo run -p wasmwatch-sim -- --seed N");
    std::process::exit(if failed.is_empty() { 0 } else { 1 });
}
