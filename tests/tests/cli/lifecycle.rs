//! How a profiling run ends: launched command exits, target exits early,
//! Ctrl-C / SIGTERM, and the BPF program going away afterwards.

use std::time::{Duration, Instant};

use bpfprof_tests::{
    bpf_prog_exists, ci, exit, find_tool, needs_root, parse_program_id, poll_until, process_name,
    run_bpfprof, spawn_bpfprof, tempdir, workload_path, Profile, Summary, Workload,
};

#[test]
fn launch_mode_profiles_command_until_it_exits() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("launch.folded");
    let workload = workload_path("shortlived");
    let run = run_bpfprof(
        [
            "-F".as_ref(),
            "999".as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
            "--".as_ref(),
            workload.as_os_str(),
        ],
        // Without -d a launch-mode run ends only when the command exits (or at the hour of
        // --max-duration): ending at all within this bound is the check, however loaded the
        // machine is.
        Duration::from_secs(120),
    );
    run.assert_code(exit::OK);
    let profile = Profile::read(&out);
    let ctx = profile.top(10);
    let n = profile.count_containing("short_work");
    assert!(n > 0, "short_work not in profile\n{ctx}");
    // 1 CPU-s at 999 Hz is ~1000 samples; a VM delivers some timer interrupts late.
    assert!(
        n >= 600,
        "only {n} short_work samples for ~1 CPU-s at 999 Hz\n{ctx}"
    );
    assert!(
        profile.count_where(
            |f| process_name(&f[0]) == "shortlived" && f.iter().any(|x| x == "short_work")
        ) == n,
        "short_work samples not under comm shortlived\n{ctx}"
    );
}

#[test]
fn target_exiting_mid_run_gives_exit_7_and_a_profile() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("exited.folded");
    let summary_path = dir.path().join("summary.json");
    // Burns 2 CPU-s: enough for bpfprof to attach, well under -d 60s however loaded the
    // machine is.
    let target = Workload::spawn("shortlived", &["2"]);
    let proc_ = spawn_bpfprof([
        "--pid",
        &target.pid().to_string(),
        "-F",
        "999",
        "-d",
        "60s",
        "-o",
        out.to_str().unwrap(),
        "--summary-json",
        summary_path.to_str().unwrap(),
    ]);
    let exited = poll_until(Duration::from_secs(120), || target.status());
    assert!(exited.is_some(), "the 2 CPU-s target did not exit in 120 s");
    // Measured from the target's exit, not from the start: bpfprof notices it at its next
    // tick (0.1 s); 10 s only tells "stopped at the exit" from "ran on to -d 60s".
    let run = proc_.wait_timeout(Duration::from_secs(10));
    run.assert_code(exit::TARGET_EXITED_EARLY);
    assert!(target.status().is_some(), "target still running?");
    let profile = Profile::read(&out);
    let ctx = profile.top(10);
    assert!(
        profile.has_frame("short_work"),
        "short_work not in profile\n{ctx}"
    );
    let summary = Summary::read(&summary_path);
    assert_eq!(summary.exit(), "target_exited", "summary: {}", summary.0);
    assert_eq!(summary.samples(), profile.total(), "summary: {}", summary.0);
}

/// With no `-d`, a `--pid` run lasts until its target exits: that is the normal end (exit 0,
/// so a `set -e` script goes on), still reported as such in the summary.
#[test]
fn target_exiting_without_a_duration_is_a_normal_end() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("until-exit.folded");
    let summary_path = dir.path().join("summary.json");
    // Long enough to outlive bpfprof's start on a loaded machine: with 1 s of work the target
    // was gone before the first sample once (0 samples at load 10).
    let target = Workload::spawn("shortlived", &["3"]);
    let run = run_bpfprof(
        [
            "--pid",
            &target.pid().to_string(),
            "-o",
            out.to_str().unwrap(),
            "--summary-json",
            summary_path.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    run.assert_code(exit::OK);
    let profile = Profile::read(&out);
    assert!(
        profile.has_frame("short_work"),
        "short_work not in profile\n{}",
        profile.top(10)
    );
    let summary = Summary::read(&summary_path);
    assert_eq!(summary.exit(), "target_exited", "summary: {}", summary.0);
}

/// A launched command that traps SIGINT (a shell's `trap ... INT`) does not keep an
/// interrupted bpfprof waiting: the command gets SIGTERM, the profile is written, exit 130.
/// The signal goes to bpfprof alone, as a `kill` from another terminal would.
#[test]
fn interrupt_ends_a_command_that_traps_sigint() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("trapped.folded");
    let proc_ = spawn_bpfprof([
        "-F",
        "999",
        "-o",
        out.to_str().unwrap(),
        "--",
        "bash",
        "-c",
        // Bounded, so that a bpfprof killed by a failing test leaves no spinning shell.
        "trap 'echo caught' INT; end=$((SECONDS + 90)); while [ $SECONDS -lt $end ]; do :; done",
    ]);
    let attached = poll_until(Duration::from_secs(20), || {
        parse_program_id(&proc_.stderr_so_far())
    });
    assert!(
        attached.is_some(),
        "no 'loaded program id N' on stderr within 20 s:\n{}",
        proc_.stderr_so_far()
    );
    std::thread::sleep(Duration::from_millis(1000));
    proc_.signal(libc::SIGINT);
    // Before the fix bpfprof waited for the command forever; the command's SIGTERM comes
    // 0.5 s after the interrupt, so 30 s only catches a hang.
    let run = proc_.wait_timeout(Duration::from_secs(30));
    run.assert_code(exit::INTERRUPTED);
    let profile = Profile::read(&out);
    assert!(
        profile.total() > 0
            && profile
                .stacks
                .keys()
                .all(|f| f[0].starts_with("bash (pid ")),
        "the command's samples should be written under bash\n{}",
        profile.top(10)
    );
}

/// Starts bpfprof on hotcold without a duration, lets it sample, sends `sig`,
/// and checks exit 130, the written profile, and that the BPF program is gone.
fn interrupt_with(sig: libc::c_int) {
    let dir = tempdir();
    let out = dir.path().join("interrupted.folded");
    let summary_path = dir.path().join("summary.json");
    let target = Workload::spawn("hotcold", &["30"]);
    let proc_ = spawn_bpfprof([
        "--pid",
        &target.pid().to_string(),
        "-F",
        "999",
        "-o",
        out.to_str().unwrap(),
        "--summary-json",
        summary_path.to_str().unwrap(),
    ]);
    let started = Instant::now();
    let prog_id = poll_until(Duration::from_secs(10), || {
        parse_program_id(&proc_.stderr_so_far())
    });
    let Some(prog_id) = prog_id else {
        let stderr = proc_.stderr_so_far();
        drop(proc_);
        panic!("no 'loaded program id N' on stderr within 10 s:\n{stderr}");
    };
    // Let it collect samples: until the target has run 1 CPU-s since the attach, however
    // long that takes on a loaded machine.
    let cpu_at_attach = target.cpu_time();
    let ran = poll_until(Duration::from_secs(60), || {
        (target.cpu_time() >= cpu_at_attach + Duration::from_secs(1)).then_some(())
    });
    assert!(ran.is_some(), "hotcold did not get 1 CPU-s in 60 s");
    proc_.signal(sig);
    let run = proc_.wait_timeout(started.elapsed() + Duration::from_secs(10));
    run.assert_code(exit::INTERRUPTED);

    let profile = Profile::read(&out);
    let ctx = profile.top(10);
    // 1 CPU-s of the target at 999 Hz is ~1000 samples; a loaded VM delivers some late.
    assert!(
        profile.total() >= 300,
        "too few samples for 1 CPU-s at 999 Hz\n{ctx}"
    );
    assert!(
        profile.has_frame("leaf_hot"),
        "hotcold frames missing\n{ctx}"
    );
    assert!(profile.stacks.keys().all(|f| f[0] == "hotcold"), "{ctx}");
    let summary = Summary::read(&summary_path);
    assert_eq!(summary.exit(), "interrupted", "summary: {}", summary.0);
    assert_eq!(summary.program_id(), prog_id, "summary: {}", summary.0);

    // The BPF program must not outlive the profiler.
    match find_tool("bpftool") {
        Some(bpftool) => {
            let gone = poll_until(Duration::from_secs(3), || {
                (!bpf_prog_exists(&bpftool, prog_id)).then_some(())
            });
            assert!(
                gone.is_some(),
                "BPF program id {prog_id} still loaded 3 s after bpfprof exited"
            );
        }
        None if ci() => panic!("bpftool is needed (Debian package bpftool) under CI=true"),
        None => eprintln!("bpftool not installed: not checking that program {prog_id} is gone"),
    }
}

#[test]
fn sigint_stops_writes_profile_and_unloads() {
    needs_root!();
    interrupt_with(libc::SIGINT);
}

#[test]
fn sigterm_stops_writes_profile_and_unloads() {
    needs_root!();
    interrupt_with(libc::SIGTERM);
}

/// `-F 100000 -d 1s` on a busy Python process: sampling stops at the deadline (the samples'
/// times span the duration, no more) and bpfprof exits soon after. At this rate ticks held
/// the run loop past the deadline: it sampled 1.6 s of a 1 s run on an idle machine, 12 s
/// under load, and exited 20 s after it started.
#[test]
fn the_duration_is_kept_at_the_highest_rate() {
    needs_root!();
    let mut busy = std::process::Command::new("python3");
    busy.args([
        "-c",
        "def spin():\n    while True:\n        sum(i * i for i in range(1000))\nspin()",
    ]);
    let target = Workload::spawn_command(busy);
    // `python3` may be a shim (pyenv's is a shell script) that execs the interpreter.
    poll_until(Duration::from_secs(30), || {
        std::fs::read_link(format!("/proc/{}/exe", target.pid()))
            .ok()
            .filter(|exe| exe.to_string_lossy().contains("python"))
    })
    .expect("the busy Python process");
    let dir = tempdir();
    let trace = dir.path().join("run.trace.json");
    let pid = target.pid().to_string();
    let bpfprof = spawn_bpfprof([
        "--pid",
        &pid,
        "-F",
        "100000",
        "-d",
        "1s",
        "-o",
        trace.to_str().unwrap(),
    ]);
    // Printed once sampling is on: its deadline is at most 1 s from here.
    let sampling = poll_until(Duration::from_secs(60), || {
        bpfprof
            .stderr_so_far()
            .contains("loaded program id")
            .then(Instant::now)
    })
    .unwrap_or_else(|| panic!("bpfprof did not start:\n{}", bpfprof.stderr_so_far()));
    let run = bpfprof.wait_timeout(Duration::from_secs(120));
    let ended = sampling.elapsed();
    run.assert_code(exit::OK);
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&trace).expect("the trace")).expect("JSON");
    let (mut first, mut last) = (f64::MAX, f64::MIN);
    for event in trace["traceEvents"].as_array().expect("traceEvents") {
        if event["ph"] == "X" {
            let ts = event["ts"].as_f64().unwrap_or_default();
            first = first.min(ts);
            last = last.max(ts + event["dur"].as_f64().unwrap_or_default());
        }
    }
    let span = (last - first) / 1e6;
    eprintln!("samples span {span:.3} s; bpfprof ended {ended:?} after sampling began");
    // A sample is a period (10 µs) long, and the deadline thread wakes within milliseconds;
    // the slack is for the thread's wakeup on a loaded machine.
    assert!(
        span > 0.3 && span <= 1.25,
        "the samples span {span:.3} s of a 1 s run:\n{}",
        run.stderr
    );
    // The end of the run (the tick in progress, draining, naming, writing) after the
    // deadline, with room for a loaded machine.
    assert!(
        ended <= Duration::from_millis(3500),
        "bpfprof ended {ended:?} after sampling began, for -d 1s:\n{}",
        run.stderr
    );
}
