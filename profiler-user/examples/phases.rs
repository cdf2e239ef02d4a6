//! Profiles the phases of a small "program" under one session through a running
//! `bpfprof daemon`, then prints what happened to each phase.
//!
//! Run with `cargo run -p profiler-user --example phases`. The environment tunes it:
//! `BPFPROF_PHASE_FILTER=compute` profiles only matching phases, `BPFPROF_SAMPLE_INTERVAL`,
//! `BPFPROF_MAX_STACK_LENGTH` and `BPFPROF_MAX_PROFILE_TIME` (seconds) set the runs, and
//! `BPFPROF_SOCKET` selects the daemon. `bpfprof list` shows the runs afterwards.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bpfprof::client::PhaseProfiler;

/// Burns CPU for `how_long` in a frame named after the phase's work.
#[inline(never)]
fn spin(how_long: Duration) -> u64 {
    let start = Instant::now();
    let mut acc = 0u64;
    while start.elapsed() < how_long {
        acc = black_box(acc.wrapping_add(start.elapsed().subsec_nanos() as u64));
    }
    acc
}

#[inline(never)]
fn load() -> Vec<u64> {
    spin(Duration::from_millis(300));
    (0..1_000_000).collect()
}

#[inline(never)]
fn compute(data: &[u64]) -> u64 {
    spin(Duration::from_millis(700));
    data.iter().copied().fold(0, u64::wrapping_add)
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let phases = PhaseProfiler::enable();
    println!("session {}", phases.session());

    let data = phases.profile_phase("load", load);
    let sum = phases.profile_phase("compute", || {
        // Nested inside "compute": runs, but is not profiled on its own.
        let part = phases.profile_phase("compute/inner", || compute(&data[..1000]));
        compute(&data).wrapping_add(part)
    });
    println!("sum {sum:#x}");

    for run in phases.runs() {
        println!(
            "phase {:<10} run {:>5} {:<10} samples {:>6} {}",
            run.phase,
            run.run_id
                .map(|id| id.to_string())
                .unwrap_or_else(|| "-".into()),
            run.state
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            run.samples.unwrap_or_default(),
            run.error.unwrap_or_default()
        );
    }
    println!("{:?}", phases.stats());
}
