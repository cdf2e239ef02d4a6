//! Profiles a CPU-bound closure of this process through a running `bpfprof daemon` and prints
//! the run's outcome and its top functions.
//!
//! Run with `cargo run -p profiler-user --example profile_function [SECONDS]` while the daemon
//! is up (`BPFPROF_SOCKET` selects a non-default socket; `RUST_LOG=debug` shows the client's
//! steps). Without a daemon the work still runs and the failure is printed.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bpfprof::client::{FunctionProfiler, ProfileOptions};

/// The hot leaf; `inline(never)` keeps it a frame of its own in the profile.
#[inline(never)]
fn leaf_hot(x: u64) -> u64 {
    (0..2_000u64).fold(x, |acc, i| {
        black_box(acc.wrapping_mul(6364136223846793005).wrapping_add(i))
    })
}

/// Burns CPU for `how_long`, calling [`leaf_hot`] in a loop.
#[inline(never)]
fn busy_work(how_long: Duration) -> u64 {
    let start = Instant::now();
    let mut acc = 1u64;
    while start.elapsed() < how_long {
        acc = leaf_hot(acc);
    }
    acc
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);

    let mut profiler = FunctionProfiler::new(ProfileOptions {
        sample_tags: vec!["example".into()],
        ..ProfileOptions::default()
    });
    // With the default stop_at_error = false this is always Ok: the work's own value.
    let value = profiler
        .profile(|| busy_work(Duration::from_secs_f64(seconds)))
        .expect("profile does not fail without stop_at_error");
    println!("work returned {value:#x}");

    if let Some(err) = profiler.last_error() {
        println!("profiling failed: {err}");
    }
    let Some(result) = profiler.last_result() else {
        return;
    };
    println!(
        "run {} ended {}, {} samples",
        result.run_id.unwrap_or_default(),
        result.state.map(|s| s.to_string()).unwrap_or_default(),
        result.samples.unwrap_or_default()
    );
    for (format, path) in result.files.iter().flatten() {
        println!("  {format:<12} {path}");
    }
    println!("top functions (self samples, total samples):");
    for f in result.top.iter().flatten().take(10) {
        println!("  {:>8} {:>8}  {}", f.self_samples, f.total_samples, f.name);
    }
}
