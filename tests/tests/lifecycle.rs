//! How a profiling run ends: launched command exits, target exits early,
//! Ctrl-C / SIGTERM, and the BPF program going away afterwards.

use std::time::{Duration, Instant};

use bpfprof_tests::{
    bpf_prog_exists, ci, exit, find_tool, parse_program_id, poll_until, require_root, run_bpfprof,
    spawn_bpfprof, tempdir, workload_path, Profile, Summary, Workload,
};

#[test]
fn launch_mode_profiles_command_until_it_exits() {
    if !require_root() {
        return;
    }
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
        Duration::from_secs(20),
    );
    run.assert_code(exit::OK);
    // shortlived burns 1 CPU-s; bpfprof stops when it exits.
    assert!(
        run.elapsed < Duration::from_secs(6),
        "launch mode ran {:?} for a 1 s command",
        run.elapsed
    );
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
        profile.count_where(|f| f[0] == "shortlived" && f.iter().any(|x| x == "short_work")) == n,
        "short_work samples not under comm shortlived\n{ctx}"
    );
}

#[test]
fn target_exiting_mid_run_gives_exit_7_and_a_profile() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("exited.folded");
    let summary_path = dir.path().join("summary.json");
    // Burns 2 CPU-s (2-4 s of wall time on a loaded machine): enough for bpfprof to attach,
    // well under -d 10s.
    let target = Workload::spawn("shortlived", &["2"]);
    let run = run_bpfprof(
        [
            "--pid",
            &target.pid().to_string(),
            "-F",
            "999",
            "-d",
            "10s",
            "-o",
            out.to_str().unwrap(),
            "--summary-json",
            summary_path.to_str().unwrap(),
        ],
        Duration::from_secs(20),
    );
    run.assert_code(exit::TARGET_EXITED_EARLY);
    assert!(
        run.elapsed < Duration::from_secs(8),
        "bpfprof should stop soon after the target exits (~2 s), not at -d 10s; took {:?}",
        run.elapsed
    );
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
    // Let it collect samples.
    std::thread::sleep(Duration::from_millis(1500));
    proc_.signal(sig);
    let run = proc_.wait_timeout(started.elapsed() + Duration::from_secs(5));
    run.assert_code(exit::INTERRUPTED);

    let profile = Profile::read(&out);
    let ctx = profile.top(10);
    assert!(
        profile.total() >= 300,
        "too few samples in ~1.5 s at 999 Hz\n{ctx}"
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
    if !require_root() {
        return;
    }
    interrupt_with(libc::SIGINT);
}

#[test]
fn sigterm_stops_writes_profile_and_unloads() {
    if !require_root() {
        return;
    }
    interrupt_with(libc::SIGTERM);
}
