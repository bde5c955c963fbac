//! `cargo run -p wasmwatch-sim --release -- --seeds 10000` runs schedules
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
    /// Stop at the first failing schedule.
    #[arg(long)]
    fail_fast: bool,
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
            "seed {seed}: {} objects, {} deliveries, {} duplicates, {} excused, {} requests, {:?} simulated, faults {:?}",
            o.writes, o.deliveries, o.duplicates, o.excused, o.requests, o.simulated, o.faults
        );
        for v in &o.violations {
            println!("VIOLATION: {v}");
        }
        std::process::exit(if o.violations.is_empty() { 0 } else { 1 });
    }
    let started = Instant::now();
    let mut failed = Vec::new();
    let (mut deliveries, mut duplicates, mut excused, mut simulated) =
        (0, 0, 0, std::time::Duration::ZERO);
    for seed in args.from..args.from + args.seeds {
        let o = wasmwatch_sim::run(seed);
        if args.twice && wasmwatch_sim::run(seed).trace != o.trace {
            println!("seed {seed}: not deterministic (two runs, two traces)");
            failed.push(seed);
        }
        deliveries += o.deliveries;
        duplicates += o.duplicates;
        excused += o.excused;
        simulated += o.simulated;
        if !o.violations.is_empty() {
            for v in &o.violations {
                println!("seed {seed}: {v}");
            }
            failed.push(seed);
            if args.fail_fast {
                break;
            }
        }
    }
    println!(
        "{} schedules in {:.1?} ({:.1?} simulated): {} failed {:?}; {deliveries} deliveries, {duplicates} duplicates, {excused} deletions lost while the store kept failing",
        args.seeds,
        started.elapsed(),
        simulated,
        failed.len(),
        &failed[..failed.len().min(20)]
    );
    println!("reproduce one: cargo run -p wasmwatch-sim --release -- --seed N");
    std::process::exit(if failed.is_empty() { 0 } else { 1 });
}
