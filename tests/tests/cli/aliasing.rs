//! Randomized sampling periods: a workload whose loop is a multiple of the sampling period
//! (`alias`: 7.5 ms in `leaf_hot`, 2.5 ms in `leaf_cold`, every 10 ms exactly) is measured at
//! its true split at 100 Hz, where a fixed interval sees one phase of the loop again and again
//! (`--fixed-interval` gave 100% in the bench, section 2). What this checks is that each CPU's
//! period is redrawn while the run goes on (`kernel::perf_events`' jitter thread).

use std::time::Duration;

use bpfprof_tests::{exit, needs_root, spawn_bpfprof, tempdir, Profile, Share, Workload};

const FREQ: u64 = 100;
/// The workload's share of its time in `leaf_hot`, by construction.
const TRUTH: f64 = 0.75;
/// How far the share may be from the truth, or four standard errors where fewer samples make
/// that wider.
const TOLERANCE: f64 = 0.05;
/// The share a fixed interval locked onto the hot phase gives (the bench's, at 100 Hz): what
/// the check must catch.
const DEFECT: f64 = 1.0;
/// The run's durations, tried in turn while too few samples were taken to judge.
const DURATIONS_SECS: [u64; 3] = [4, 8, 16];

#[test]
fn a_loop_in_step_with_the_sampling_period_is_measured_at_its_split() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("alias.folded");
    // 40 s of periods: longer than every try together; killed when the test ends.
    let target = Workload::spawn("alias", &["4000"]);
    std::thread::sleep(Duration::from_millis(200));
    let mut result = Err(String::new());
    for duration in DURATIONS_SECS {
        let run = spawn_bpfprof([
            "--pid",
            &target.pid().to_string(),
            "-F",
            &FREQ.to_string(),
            "-d",
            &format!("{duration}s"),
            "-o",
            out.to_str().unwrap(),
        ])
        .wait_timeout(Duration::from_secs(duration + 30));
        run.assert_code(exit::OK);
        let profile = Profile::read(&out);
        // A frame's function: its name before any ` (file:line)`.
        let in_fn = |frames: &[String], name: &str| {
            frames.iter().any(|f| f.split(' ').next() == Some(name))
        };
        let hot = profile.count_where(|f| in_fn(f, "leaf_hot"));
        let cold = profile.count_where(|f| in_fn(f, "leaf_cold"));
        let share = Share::new(hot, hot + cold);
        eprintln!(
            "{duration} s at {FREQ} Hz: leaf_hot {hot}, leaf_cold {cold} ({:.3}; truth {TRUTH})",
            share.value()
        );
        result = share.near(TRUTH, TOLERANCE, DEFECT);
        if !result
            .as_ref()
            .is_err_and(|e| e.starts_with("too few samples"))
        {
            break;
        }
    }
    if let Err(e) = result {
        panic!("leaf_hot's share of the alias loop at {FREQ} Hz: {e}");
    }
}
