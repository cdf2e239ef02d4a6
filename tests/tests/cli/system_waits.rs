//! Wall time told whole in a system-wide run (`--all --mode wall`): a process whose threads
//! are blocked throughout the run is never sampled on a CPU, so the run found it only through
//! the scan of the machine's waits at its start. Each of its threads shows with its wall time
//! in the run, on the stacks it waits in (kernel and user).
//!
//! The bound on a thread's total is [`super::waits`]'s: one sampling period plus an allowance
//! for the moment the waits still going are counted, a little after the run's end marker. It
//! samples at a fixed interval for the reason given there (`mixer`'s CPU time counted with the
//! rate redraws' own sampling error otherwise).
//!
//! The test samples the whole machine, so it runs alone (`needs_root!(alone)`).

use std::{collections::BTreeMap, process::Command, time::Duration};

use bpfprof_tests::*;

use super::waits::{run_window, C_WAITS};

const TIMEOUT: Duration = Duration::from_secs(180);
/// Sampling rate: a period of about 10 ms.
const HZ: f64 = 99.0;
/// See [`super::waits`].
const LOAD_ALLOWANCE: f64 = 0.15;

#[test]
fn all_shows_a_process_blocked_throughout_with_each_threads_wall_time() {
    needs_root!(alone);
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("waits.c");
    std::fs::write(&source, C_WAITS).unwrap();
    let bin = dir.path().join("waits");
    let built = Command::new("cc")
        .args(["-O1", "-g", "-pthread", "-o"])
        .arg(&bin)
        .arg(&source)
        .status()
        .expect("run cc");
    assert!(built.success(), "cc failed");
    let target = Workload::spawn_command(Command::new(&bin));
    std::thread::sleep(Duration::from_secs(1));
    // Its threads' names by tid, read now: a process taken in past the start's budget on a
    // loaded machine has its threads labelled by tid alone.
    let names: BTreeMap<String, String> = std::fs::read_dir(format!("/proc/{}/task", target.pid()))
        .expect("its threads")
        .filter_map(|e| {
            let tid = e.ok()?.file_name().to_string_lossy().into_owned();
            let comm =
                std::fs::read_to_string(format!("/proc/{}/task/{tid}/comm", target.pid())).ok()?;
            Some((tid, comm.trim().to_string()))
        })
        .collect();
    let folded = dir.path().join("all.folded");
    let trace = dir.path().join("all.trace.json");
    let hz = HZ.to_string();
    let args: Vec<String> = [
        "-a",
        "--mode",
        "wall",
        "--per-thread",
        "-F",
        &hz,
        "-d",
        "4s",
        "--fixed-interval",
        "-o",
        folded.to_str().unwrap(),
        "-o",
        trace.to_str().unwrap(),
    ]
    .into_iter()
    .map(String::from)
    .collect();
    run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
    let profile = Profile::read(&folded);
    let (start, end) = run_window(&trace);
    // `waits (pid N);THREAD (tid M);...`: the target's threads, by name.
    let pid = target.pid();
    let mut totals: BTreeMap<String, f64> = BTreeMap::new();
    for (frames, ns) in &profile.stacks {
        if root_pid(&frames[0]) != Some(pid) {
            continue;
        }
        let Some(thread) = frames.get(1) else {
            continue;
        };
        *totals.entry(thread_name(thread, &names)).or_insert(0.0) += *ns as f64 / 1e9;
    }
    eprintln!(
        "pid {pid}: per-thread totals {totals:?}, run window {:.3} s",
        end - start
    );
    let time_in = |thread: &str, frames: &[&str]| -> f64 {
        profile.count_where(|stack| {
            root_pid(&stack[0]) == Some(pid)
                && stack
                    .get(1)
                    .is_some_and(|t| thread_name(t, &names) == thread)
                && frames
                    .iter()
                    .all(|f| stack.iter().any(|s| s.trim_end_matches("_[k]") == *f))
        }) as f64
            / 1e9
    };
    let mut checks = Checks::new();
    let bound = 1.0 / HZ + LOAD_ALLOWANCE;
    for name in ["waits", "piper", "sleeper", "ticker", "mixer"] {
        let total = totals.get(name).copied().unwrap_or(0.0);
        let truth = end - start;
        checks.check((total - truth).abs() <= bound, || {
            format!("{name}: {total:.3} s in the profile, {truth:.3} s of wall time in the run (bound {bound:.3})")
        });
    }
    // Blocked where they block, kernel and user frames both (the user stacks were walked from
    // the registers the scan read): the main thread in pthread_join's futex, `sleeper` in
    // sleep's nanosleep, `piper` in read on its pipe.
    let window = end - start;
    for (name, frames) in [
        ("waits", &["main", "futex_wait"][..]),
        ("sleeper", &["sleeper", "hrtimer_nanosleep"][..]),
    ] {
        let t = time_in(name, frames);
        checks.check(t >= 0.9 * window, || {
            format!("{name}: {t:.3} s under {frames:?} of {window:.3} s")
        });
    }
    let piped =
        time_in("piper", &["piper", "pipe_read"]) + time_in("piper", &["piper", "anon_pipe_read"]);
    checks.check(piped >= 0.9 * window, || {
        format!("piper: {piped:.3} s in its read of the pipe, of {window:.3} s")
    });
    drop(target);
    checks.finish();
}

/// The name of the thread a profile's thread frame (`NAME (tid N)`, or `tid N`) stands for,
/// by its tid in `names`.
fn thread_name(frame: &str, names: &BTreeMap<String, String>) -> String {
    let tid = frame
        .rsplit("tid ")
        .next()
        .unwrap_or_default()
        .trim_end_matches(')');
    names.get(tid).cloned().unwrap_or_else(|| frame.to_string())
}
