//! End to end: the one recording pipeline behind the CLI and the daemon. Launch mode follows
//! children and passes the command's exit status through, `--follow-children` does the same for
//! `--pid`, an idle daemon holds no perf events and burns no CPU, identical requests share a
//! program, several runs on one process each get every sample, and start-time usage errors.
//! Needs root.

use std::{
    collections::BTreeSet,
    io::Read,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use bpfprof::protocol::{RunRequest, RunState};
use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A shell command whose child runs `shortlived 1.5` and whose grandchild (through a second
/// shell) runs `shortlived 1`; "; true" keeps each shell from exec'ing its last command.
fn family_script(workload: &Path) -> String {
    let w = workload.display();
    format!("sh -c '{w} 1; true'; {w} 1.5; true")
}

#[test]
fn launch_follows_children_and_grandchildren() {
    needs_root!();
    let dir = tempdir();
    let workload = workload_path("shortlived");
    let script = family_script(&workload);
    let run = |extra: &[&str], name: &str| {
        let out = dir.path().join(format!("{name}.folded"));
        let summary = dir.path().join(format!("{name}.json"));
        let mut args: Vec<String> = vec!["-F".into(), "999".into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend([
            "-o".into(),
            out.display().to_string(),
            "--summary-json".into(),
            summary.display().to_string(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            script.clone(),
        ]);
        let result = run_bpfprof(&args, TIMEOUT);
        result.assert_code(exit::OK);
        (Profile::read(&out), Summary::read(&summary))
    };

    let (followed, summary) = run(&[], "followed");
    let n = followed.count_containing("short_work");
    // The children burn 2.5 CPU-s: ~2500 samples at 999 Hz, fewer where a VM delivers timer
    // interrupts late.
    assert!(
        n >= 1500,
        "only {n} short_work samples from children\n{}",
        followed.top(8)
    );
    let pids: BTreeSet<u64> = summary
        .targets()
        .iter()
        .filter(|t| t["comm"] == "shortlived")
        .filter_map(|t| t["pid"].as_u64())
        .collect();
    assert_eq!(
        pids.len(),
        2,
        "the child and the grandchild are both profiled processes: {:?}",
        summary.targets()
    );

    let (alone, _) = run(&["--no-inherit"], "alone");
    assert_eq!(
        alone.count_containing("short_work"),
        0,
        "--no-inherit still profiled children\n{}",
        alone.top(8)
    );
}

#[test]
fn follow_children_of_a_pid_target() {
    needs_root!();
    let dir = tempdir();
    let workload = workload_path("shortlived");
    for follow in [true, false] {
        // The shell starts its child only after bpfprof has attached.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &format!("sleep 3; {} 1.5; true", workload.display())]);
        let parent = Workload::spawn_command(cmd);
        let out = dir.path().join(format!("follow-{follow}.folded"));
        let pid = parent.pid().to_string();
        let mut args = vec!["-F", "999", "-d", "6s", "-p", &pid];
        if follow {
            args.push("--follow-children");
        }
        let out_arg = out.display().to_string();
        args.extend(["-o", &out_arg]);
        let run = run_bpfprof(&args, TIMEOUT);
        assert!(
            [exit::OK, exit::TARGET_EXITED_EARLY].contains(&run.code()),
            "exit {}: {}",
            run.code(),
            run.stderr
        );
        let profile = Profile::read(&out);
        crate::check_children_followed(&profile, follow);
    }
}

#[test]
fn launch_passes_the_command_exit_status_through() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("x.folded");
    let out = out.display().to_string();
    let launch = |cmd: &[&str], extra: &[&str]| {
        let mut args = vec!["-o", &out];
        args.extend(extra);
        args.push("--");
        args.extend(cmd);
        run_bpfprof(&args, TIMEOUT)
    };
    launch(&["sh", "-c", "exit 3"], &[]).assert_code(3);
    launch(&["false"], &[]).assert_code(1);
    launch(&["true"], &[]).assert_code(0);
    // Killed by a signal: 128 + N, as a shell reports it.
    launch(&["sh", "-c", "kill -TERM $$"], &[]).assert_code(128 + libc::SIGTERM);

    // --duration ends first: the command is stopped, not left behind, and it is said.
    let marker = "31.25";
    let started = Instant::now();
    let run = launch(&["sleep", marker], &["-d", "1s"]);
    run.assert_code(exit::OK);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    run.assert_stderr_mentions(&["--duration ended", "stopped"]);
    let left = all_pids().into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| c == format!("sleep\0{marker}\0").as_bytes())
            .unwrap_or(false)
    });
    assert_eq!(left, None, "the command outlived bpfprof");
    assert!(Path::new(&out).exists(), "no profile written");
}

#[test]
fn usage_errors_fail_at_start_with_their_reason() {
    needs_root!();
    let dir = tempdir();
    let spin = Workload::spawn("spinner", &["30"]);
    let pid = spin.pid().to_string();
    let svg = dir.path().join("x.svg").display().to_string();
    let cases: [(&[&str], &str); 5] = [
        (
            &["-p", &pid, "-d", "0s", "-o", &svg],
            "--duration must be longer than 0",
        ),
        (
            &["-p", &pid, "-d", "20m", "-o", &svg],
            "longer than --max-duration",
        ),
        (
            &["-p", &pid, "-d", "1s", "-o", dir.path().to_str().unwrap()],
            "is a directory",
        ),
        (
            &["-p", &pid, "-d", "1s", "--format", "top", "-o", &svg],
            "--format top conflicts with",
        ),
        (
            &["-p", &pid, "--no-inherit", "-d", "1s"],
            "--no-inherit applies to a command",
        ),
    ];
    for (args, message) in cases {
        let started = Instant::now();
        let run = run_bpfprof(args, TIMEOUT);
        run.assert_code(exit::USAGE);
        run.assert_stderr_mentions(&[message]);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{args:?} was not refused at start"
        );
    }
    assert!(!Path::new(&svg).exists(), "a refused run left an output");
}

#[test]
fn a_pid_the_caller_may_not_inspect_is_permission_denied() {
    needs_root!();
    // A user with the BPF capabilities but not root: /proc/1/ns/pid is not readable to it.
    let user = test_user("bpfprof-t1");
    let (_dir, bin) = world_executable_bpfprof();
    let mut cmd = Command::new("setpriv");
    cmd.args([
        format!("--reuid={}", user.uid),
        format!("--regid={}", user.gid),
        "--clear-groups".into(),
        "--inh-caps=+bpf,+perfmon".into(),
        "--ambient-caps=+bpf,+perfmon".into(),
        "--".into(),
    ]);
    cmd.arg(&bin)
        .args(["-p", "1", "-d", "1s", "-o", "/tmp/bpfprof-never.svg"]);
    let out = cmd.output().expect("run setpriv");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(exit::PERMISSION_DENIED),
        "stderr: {stderr}"
    );
    // A refusal names neither the process's command nor whose it is (issue 23, item 15).
    let comm = std::fs::read_to_string("/proc/1/comm").unwrap();
    assert!(
        stderr.contains("may not profile pid 1")
            && !stderr.contains(comm.trim())
            && !stderr.contains("another user")
            && !stderr.contains("does not exist"),
        "stderr: {stderr}"
    );
}

fn request(pid: u32, frequency: i64, duration_ms: u64) -> RunRequest {
    RunRequest {
        pid,
        frequency: Some(frequency),
        duration_ms: Some(duration_ms),
        formats: Some(vec!["folded".into(), "summary-json".into()]),
        ..RunRequest::default()
    }
}

/// CPU time (user + system) of `pid` so far.
fn cpu_of(pid: u32) -> Duration {
    process_cpu_time(pid).expect("the process lives")
}

#[test]
fn an_idle_daemon_holds_no_perf_events_and_uses_no_cpu() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let spin = Workload::spawn("spinner", &["60"]);
    let mut client = daemon.client();
    assert_eq!(
        perf_event_fds(daemon.pid()),
        0,
        "events open before any run"
    );
    let id = client
        .run(request(spin.pid(), 999, 1500))
        .unwrap()
        .run_id
        .unwrap();
    // While the run samples, the daemon holds one event per CPU (shows the check can fail).
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert!(
        perf_event_fds(daemon.pid()) >= cpus,
        "{} perf events while sampling on {cpus} CPUs",
        perf_event_fds(daemon.pid())
    );
    let done = client.results(id, TIMEOUT).unwrap();
    assert_eq!(done.state, Some(RunState::Success), "{:?}", done.reason);
    assert!(done.samples.unwrap_or(0) > 100);
    let events = poll_until(Duration::from_secs(5), || {
        (perf_event_fds(daemon.pid()) == 0).then_some(())
    });
    assert!(
        events.is_some(),
        "the daemon still holds {} perf events after its only run ended",
        perf_event_fds(daemon.pid())
    );
    let before = cpu_of(daemon.pid());
    thread::sleep(Duration::from_secs(3));
    let used = cpu_of(daemon.pid()) - before;
    assert!(
        used < Duration::from_millis(50),
        "the idle daemon used {used:?} of CPU in 3 s"
    );
}

#[test]
fn sixteen_runs_on_one_process_each_get_every_sample_from_one_program() {
    needs_root!();
    let daemon = Daemon::start(&["--max-runs", "16"]);
    let spin = Workload::spawn("spinner", &["60"]);
    let mut client = daemon.client();
    let ids: Vec<u64> = (0..16)
        .map(|_| {
            client
                .run(request(spin.pid(), 499, 60_000))
                .unwrap()
                .run_id
                .unwrap()
        })
        .collect();
    thread::sleep(Duration::from_secs(2));
    for id in &ids {
        client.stop(*id).unwrap();
    }
    let mut totals = Vec::new();
    let mut programs = BTreeSet::new();
    for id in &ids {
        let r = client.results(*id, TIMEOUT).unwrap();
        assert_eq!(r.state, Some(RunState::Stopped), "run {id}: {:?}", r.reason);
        let files = r.files.unwrap();
        let profile = Profile::read(Path::new(&files["folded"]));
        assert!(
            profile.count_containing("other_spin") > 100,
            "run {id}: {} samples\n{}",
            profile.total(),
            profile.top(5)
        );
        totals.push(profile.total());
        programs.insert(Summary::read(Path::new(&files["summary-json"])).program_id());
    }
    assert_eq!(
        programs.len(),
        1,
        "identical requests used programs {programs:?}"
    );
    // The runs overlap for all but the time it takes to start and stop 16 of them.
    let (min, max) = (totals.iter().min().unwrap(), totals.iter().max().unwrap());
    assert!(*min * 2 > *max, "sample counts {totals:?}");
}

#[test]
fn distinct_sampling_settings_are_bounded_and_refusals_leave_nothing() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let spin = Workload::spawn("spinner", &["60"]);
    let mut client = daemon.client();
    let mut ids = Vec::new();
    for hz in [97, 98, 99, 101] {
        ids.push(
            client
                .run(request(spin.pid(), hz, 60_000))
                .unwrap()
                .run_id
                .unwrap(),
        );
    }
    let refused = daemon.cli(&[
        "run",
        "--pid",
        &spin.pid().to_string(),
        "-F",
        "103",
        "--async",
    ]);
    refused.assert_code(11);
    refused.assert_stderr_mentions(&["distinct sampling settings"]);
    // The same setting as a running run still fits.
    let shared = client.run(request(spin.pid(), 99, 60_000)).unwrap();
    let shared_id = shared.run_id.unwrap();
    assert_eq!(
        shared_id,
        ids.last().unwrap() + 1,
        "a refused request consumed a run id"
    );
    assert_eq!(
        client.list().unwrap().len(),
        5,
        "a refused request left a run"
    );
    for id in ids.iter().chain([&shared_id]) {
        client.stop(*id).unwrap();
        client.results(*id, TIMEOUT).unwrap();
    }
    let events = poll_until(Duration::from_secs(5), || {
        (perf_event_fds(daemon.pid()) == 0).then_some(())
    });
    assert!(
        events.is_some(),
        "programs left attached after every run ended"
    );
}

#[test]
fn kernel_throttling_is_reported_as_what_it_is() {
    needs_root!();
    let dir = tempdir();
    let spin = Workload::spawn("spinner", &["60"]);
    let pid = spin.pid().to_string();
    let max_rate = read_proc_u64("/proc/sys/kernel/perf_event_max_sample_rate");
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    for rate in [999, max_rate] {
        let summary_path = dir.path().join(format!("{rate}.json"));
        let rate_arg = rate.to_string();
        let run = run_bpfprof(
            [
                "-p",
                pid.as_str(),
                "-F",
                rate_arg.as_str(),
                "-d",
                "2s",
                "-o",
                dir.path().join("x.folded").to_str().unwrap(),
                "--summary-json",
                summary_path.to_str().unwrap(),
            ],
            TIMEOUT,
        );
        run.assert_code(exit::OK);
        let summary = Summary::read(&summary_path);
        let throttled = summary.field("throttled");
        let secs = summary.f64("duration_secs");
        if rate == 999 {
            // Far below the kernel's limit: never blamed on the kernel (a VM may still deliver
            // timer interrupts late, and that is said as what it is).
            assert!(
                throttled.is_null() || throttled["cause"] == "late_timer_interrupts",
                "999 Hz reported as kernel throttling: {}",
                summary.0
            );
            continue;
        }
        if throttled.is_null() {
            // Not reported: then the target really got (nearly) every sample asked for.
            let effective = summary.f64("effective_hz");
            assert!(
                effective >= 0.85 * rate as f64,
                "{effective:.0} of {rate} samples/s and no throttling reported: {}",
                summary.0
            );
        } else {
            let expected = throttled["expected_samples"].as_u64().unwrap() as f64;
            let taken = throttled["taken_samples"].as_u64().unwrap();
            let asked = secs * cpus * rate as f64;
            assert!(
                (expected - asked).abs() < 0.15 * asked,
                "expected {expected} samples, the rate asks {asked:.0}: {}",
                summary.0
            );
            assert!(
                (taken as f64) < 0.9 * expected && taken >= summary.u64("samples_seen"),
                "taken {taken} of {expected}: {}",
                summary.0
            );
            assert_eq!(throttled["cause"], "kernel_throttling", "{}", summary.0);
            run.assert_stderr_mentions(&["throttled by the kernel"]);
        }
    }
}

#[test]
fn sample_interval_takes_a_time_and_the_period_is_printed() {
    needs_root!();
    let dir = tempdir();
    let spin = Workload::spawn("spinner", &["30"]);
    let summary_path = dir.path().join("s.json");
    let run = run_bpfprof(
        [
            "-p",
            &spin.pid().to_string(),
            "--sample-interval",
            "2ms",
            "-d",
            "1s",
            "-o",
            dir.path().join("x.folded").to_str().unwrap(),
            "--summary-json",
            summary_path.to_str().unwrap(),
        ],
        TIMEOUT,
    );
    run.assert_code(exit::OK);
    let summary = Summary::read(&summary_path);
    assert!(
        (summary.f64("frequency_hz") - 500.0).abs() < 1e-6,
        "{}",
        summary.0
    );
    if summary.event() == "cpu-clock" {
        assert_eq!(summary.u64("period"), 2_000_000, "{}", summary.0);
        run.assert_stderr_mentions(&["every 2.000 ms (500 Hz)"]);
    }
    // A plain number under cpu-clock is nanoseconds, and a unit that is not one is refused.
    let bad = run_bpfprof(
        [
            "-p",
            &spin.pid().to_string(),
            "--sample-interval",
            "2 parsecs",
            "-d",
            "1s",
        ],
        TIMEOUT,
    );
    bad.assert_code(exit::USAGE);
    bad.assert_stderr_mentions(&["unknown unit"]);
}

#[test]
fn quiet_by_default_and_no_ctrl_c_hint_with_a_duration() {
    needs_root!();
    let dir = tempdir();
    let spin = Workload::spawn("spinner", &["30"]);
    let out = dir.path().join("x.folded");
    // On a terminal (script(1) gives bpfprof one), as a user sees it.
    let on_terminal = |extra: &str| {
        let cmd = format!(
            "{} -p {} -o {} {extra}",
            bpfprof_bin().display(),
            spin.pid(),
            out.display()
        );
        let output = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .output()
            .expect("run script(1)");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let with_duration = on_terminal("-d 1s");
    assert!(with_duration.contains("sampling"), "{with_duration}");
    assert!(
        !with_duration.contains("Ctrl-C"),
        "a run with --duration offers Ctrl-C: {with_duration}"
    );
    assert!(
        !with_duration.contains("INFO "),
        "info logging by default: {with_duration}"
    );
    // Without a duration the hint is there. The run ends when its target exits, which the
    // test causes only once the hint shows: on a loaded machine the walker's verification alone
    // can take seconds, so no fixed delay is long enough (a 1.5 s SIGINT once came first).
    let short = Workload::spawn("spinner", &["300"]);
    let mut until_stopped = Command::new("script")
        .args([
            "-qec",
            &format!(
                "{} -p {} -o {}",
                bpfprof_bin().display(),
                short.pid(),
                out.display()
            ),
            "/dev/null",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run script(1)");
    let mut stdout = until_stopped.stdout.take().expect("piped stdout");
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        let mut told = false;
        while let Ok(n @ 1..) = stdout.read(&mut buf) {
            text.extend_from_slice(&buf[..n]);
            if !told && String::from_utf8_lossy(&text).contains("Ctrl-C to stop") {
                told = true;
                let _ = seen_tx.send(());
            }
        }
        String::from_utf8_lossy(&text).into_owned()
    });
    let seen = seen_rx.recv_timeout(Duration::from_secs(120)).is_ok();
    drop(short);
    let _ = until_stopped.wait();
    let until_stopped = reader.join().expect("reader thread");
    assert!(seen, "no Ctrl-C hint without a duration: {until_stopped}");
    assert!(
        on_terminal("-d 1s -v").contains("INFO "),
        "-v shows info logging"
    );
}

/// Short-lived children of a launched shell pipeline (issue 27: 1902 of 2976 samples were
/// `[exited child];[unmapped]+0x...`, 1641 distinct stacks): a child whose maps were read is
/// named with its own frames; one that exited first keeps its kernel frames under one frame
/// saying so, never an `[unmapped]` address per frame.
#[test]
fn short_lived_children_never_give_unmapped_frames() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("pipeline.folded");
    let run = run_bpfprof(
        [
            "-F",
            "999",
            "-o",
            out.to_str().unwrap(),
            "--",
            "bash",
            "-c",
            "for i in $(seq 40); do head -c 2M /dev/urandom | gzip -1 >/dev/null; done",
        ],
        Duration::from_secs(300),
    );
    run.assert_code(exit::OK);
    let profile = Profile::read(&out);
    let ctx = profile.top(15);
    assert!(
        profile.total() >= 200,
        "too few samples for 40 pipelines\n{ctx}"
    );
    assert_eq!(
        profile.count_where(|f| f.iter().any(|x| x.starts_with("[unmapped]"))),
        0,
        "{ctx}"
    );
    assert!(
        profile.count_where(|f| f[0].starts_with("gzip (pid ")) > 0,
        "gzip's samples should be named under its own root\n{ctx}"
    );
    let unread = "[user code: exited before its maps were read]";
    // A launched command's processes are rooted `NAME (pid N)`.
    let exited = |f: &[String]| f[0].starts_with("[exited child] (pid ");
    // Under the root: the one user frame, and kernel frames (a sample taken in the kernel as
    // the child exited may have no user stack at all).
    let odd: Vec<String> = profile
        .stacks
        .iter()
        .filter(|(f, _)| exited(f) && !f[1..].iter().all(|x| x == unread || is_kernel_frame(x)))
        .map(|(f, n)| format!("{n} {}", f.join(";")))
        .collect();
    assert!(odd.is_empty(), "{odd:#?}\n{ctx}");
}
