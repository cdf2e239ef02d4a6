//! End to end (issue 23, items 11, 12 and 15): authorization that holds for the whole run, and
//! fair shares of the daemon's sampling settings. Each attack is run by a real non-root user
//! against a real root daemon, as it was reported; the tests check that it no longer works and
//! that another user still gets a run. Needs root.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use bpfprof::protocol::RunState;
use bpfprof_tests::{
    hostile::{cli, results_of, run_id_of, shared_dir, start_as, Bystander},
    *,
};

/// The function every sample of the `spinner` workload runs in: the name a run must not show
/// once spinner runs as a program its user cannot read or as root.
const SECRET_FUNCTION: &str = "other_spin";

/// A root-owned copy of workload `name` in `dir` with `mode` (0711: execute-only, unreadable
/// to other users; 04755: setuid root).
fn root_copy(dir: &Path, name: &str, file: &str, mode: u32) -> PathBuf {
    let path = dir.join(file);
    copy_executable(&workload_path(name), &path, &["0.001"]);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// What the exec attacks set up: mallory, a daemon, a folder shared with her holding root's
/// execute-only and setuid-root copies of `spinner`, and a bystander working for a while.
struct ExecAttack {
    mallory: TestUser,
    daemon: Daemon,
    dir: tempfile::TempDir,
    secret: PathBuf,
    setuid: PathBuf,
    bystander: Bystander,
    bin: PathBuf,
}

impl ExecAttack {
    /// The set-up, with a bystander working for `bystander_for`.
    fn new(bystander_for: Duration) -> ExecAttack {
        let mallory = test_user("bpfprof-t1");
        let daemon = Daemon::start(&[]);
        let dir = shared_dir();
        let secret = root_copy(dir.path(), "spinner", "secret-spinner", 0o711);
        let setuid = root_copy(dir.path(), "spinner", "setuid-spinner", 0o4755);
        let bystander = Bystander::start(&daemon, bystander_for);
        let bin = bystander.bin.clone();
        ExecAttack {
            mallory,
            daemon,
            dir,
            secret,
            setuid,
            bystander,
            bin,
        }
    }
}

/// A shell of `user` that spins until `go` exists, then runs `then` (a shell command).
fn shell_then(user: &TestUser, go: &Path, then: &str) -> Workload {
    let script = format!("while [ ! -e {go} ]; do :; done; {then}", go = go.display());
    let mut cmd = user.command("/bin/sh");
    cmd.args(["-c", &script]);
    let w = Workload::spawn_command(cmd);
    thread::sleep(Duration::from_millis(200));
    w
}

/// Item 11: a run on the attacker's own process, which then execs a program the attacker may
/// not profile: an execute-only binary (mode 0711, its symbols unreadable to the attacker) or
/// a setuid-root one. The run stops sampling the process at the exec: the profile shows
/// nothing of the new program (its function names, nor any sample taken as root), the
/// samples of the process are dropped and counted, and the run ends when its only process
/// can no longer be profiled, long before its duration.
#[test]
fn exec_into_an_unreadable_or_setuid_program_ends_the_runs_sampling() {
    needs_root!();
    let ExecAttack {
        mallory,
        daemon,
        dir,
        secret,
        setuid,
        bystander,
        bin,
    } = ExecAttack::new(Duration::from_secs(20));
    let mut checks = Checks::default();
    for program in [&secret, &setuid] {
        let go = dir.path().join(format!(
            "go-{}",
            program.file_name().unwrap().to_string_lossy()
        ));
        let shell = shell_then(&mallory, &go, &format!("exec {} 30", program.display()));
        let id = run_id_of(&start_as(
            &mallory,
            &bin,
            &daemon,
            shell.pid(),
            20_000,
            &["--formats", "folded"],
        ));
        let started = Instant::now();
        // The shell spins as mallory (samples the run may keep) for a while, then execs.
        thread::sleep(Duration::from_millis(700));
        std::fs::write(&go, "").unwrap();
        let (state, profile, summary) = results_of(&daemon, id);
        let what = program.display();
        checks.eq(
            &format!("{what}: the run's state"),
            state,
            RunState::Success,
        );
        checks.check(!profile.has_frame(SECRET_FUNCTION), || {
            format!(
                "{what}: the profile names the new program's function {SECRET_FUNCTION}:\n{}",
                profile.top(10)
            )
        });
        checks.check(
            summary.0["lost"]["not_profilable"].as_u64().unwrap_or(0) > 0,
            || {
                format!(
                    "{what}: the process's samples are not counted as dropped: {}",
                    summary.0["lost"]
                )
            },
        );
        let took = started.elapsed();
        checks.check(took < Duration::from_secs(15), || {
            format!(
                "{what}: the run went on for {took:?} after its only process could no longer \
                 be profiled"
            )
        });
    }
    checks.finish();
    bystander.finish();
}

/// Item 11 for children: with `--follow-children`, a child the attacker's shell forks, which
/// execs an execute-only or setuid-root program, is not followed; a child that execs a
/// program the attacker may profile still is, with its functions named.
#[test]
fn followed_children_that_exec_what_their_user_may_not_profile_are_left_out() {
    needs_root!();
    let ExecAttack {
        mallory,
        daemon,
        dir,
        secret,
        setuid,
        bystander,
        bin,
    } = ExecAttack::new(Duration::from_secs(10));
    let allowed = root_copy(dir.path(), "hotcold", "hotcold", 0o755);
    let go = dir.path().join("go");
    let shell = shell_then(
        &mallory,
        &go,
        &format!(
            "{} 30 & {} 30 & {} 30 & wait",
            secret.display(),
            setuid.display(),
            allowed.display()
        ),
    );
    let id = run_id_of(&start_as(
        &mallory,
        &bin,
        &daemon,
        shell.pid(),
        4_000,
        &["--follow-children", "--formats", "folded"],
    ));
    thread::sleep(Duration::from_millis(300));
    std::fs::write(&go, "").unwrap();
    let (state, profile, _) = results_of(&daemon, id);
    assert_eq!(state, RunState::Success);
    assert!(
        !profile.has_frame(SECRET_FUNCTION),
        "children running programs mallory may not profile are in her profile:\n{}",
        profile.top(10)
    );
    assert!(
        profile.has_frame("leaf_hot"),
        "the child mallory may profile was not followed:\n{}",
        profile.top(10)
    );
    bystander.finish();
}

/// Item 12: one user's runs at 101, 102, 103 and 104 Hz used to take the daemon's four
/// sampling settings and refuse every other user for as long as they ran. Now a user holds
/// at most one setting of their own and the last place is kept for the default setting: the
/// attacker's further settings are refused with a clear reason, and another user starts runs
/// both at a rate of their own and at the default.
#[test]
fn one_user_cannot_take_every_sampling_setting() {
    needs_root!();
    let mallory = test_user("bpfprof-t1");
    let bob = test_user("bpfprof-t3");
    let daemon = Daemon::start(&[]);
    // The bystander's own run (499 Hz) is in flight throughout.
    let bystander = Bystander::start(&daemon, Duration::from_secs(15));
    let bin = bystander.bin.clone();
    let spinner = bystander.bin_dir().join("spinner");
    copy_executable(&workload_path("spinner"), &spinner, &["0.001"]);
    let mut cmd = mallory.command(&spinner);
    cmd.arg("60");
    let hers = Workload::spawn_command(cmd);
    let mut cmd = bob.command(&spinner);
    cmd.arg("60");
    let his = Workload::spawn_command(cmd);
    thread::sleep(Duration::from_millis(200));
    let start = |user: &TestUser, pid: u32, hz: Option<u32>| {
        let pid = pid.to_string();
        let hz = hz.map(|h| h.to_string());
        let mut args = vec!["run", "--async", "--pid", &pid, "--duration-ms", "30000"];
        if let Some(hz) = &hz {
            args.extend(["-F", hz]);
        }
        cli(user, &bin, &daemon, &args)
    };
    let mut ids = Vec::new();
    let mut refused = Vec::new();
    for hz in [101, 102, 103, 104] {
        let result = start(&mallory, hers.pid(), Some(hz));
        if result.code() == 0 {
            ids.push(run_id_of(&result));
        } else {
            result.assert_code(11);
            result.assert_stderr_mentions(&["sampling setting"]);
            refused.push(hz);
        }
    }
    assert_eq!(
        refused,
        [102, 103, 104],
        "mallory's distinct settings beyond her first"
    );
    // Her own setting is still hers to share.
    ids.push(run_id_of(&start(&mallory, hers.pid(), Some(101))));
    // Bob gets a run at a rate of his own, and at the default.
    ids.push(run_id_of(&start(&bob, his.pid(), Some(97))));
    ids.push(run_id_of(&start(&bob, his.pid(), None)));
    let mut client = daemon.client();
    for id in ids {
        client.stop(id).unwrap();
        let reply = client.results(id, DAEMON_TIMEOUT).unwrap();
        assert_eq!(reply.state, Some(RunState::Stopped), "run {id}: {reply:?}");
    }
    bystander.finish();
}

/// Item 12, the place kept for the default: with three users each holding a setting of their
/// own, a fourth user's new setting is refused but the default setting always starts. (No
/// bystander here: its run would hold a place of its own and the fourth user's refusal would
/// then be the daemon's overall limit, not the kept place.)
#[test]
fn the_default_sampling_setting_always_has_a_place() {
    needs_root!();
    let users: Vec<TestUser> = ["bpfprof-t1", "bpfprof-t2", "bpfprof-t3", "bpfprof-t4"]
        .iter()
        .map(|name| test_user(name))
        .collect();
    let daemon = Daemon::start(&[]);
    let (bin_dir, bin) = world_executable_bpfprof();
    let spinner = bin_dir.path().join("spinner");
    copy_executable(&workload_path("spinner"), &spinner, &["0.001"]);
    let workloads: Vec<Workload> = users
        .iter()
        .map(|user| {
            let mut cmd = user.command(&spinner);
            cmd.arg("60");
            Workload::spawn_command(cmd)
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let start = |i: usize, hz: Option<u32>| {
        let pid = workloads[i].pid().to_string();
        let hz = hz.map(|h| h.to_string());
        let mut args = vec!["run", "--async", "--pid", &pid, "--duration-ms", "30000"];
        if let Some(hz) = &hz {
            args.extend(["-F", hz]);
        }
        cli(&users[i], &bin, &daemon, &args)
    };
    let mut ids: Vec<u64> = (0..3)
        .map(|i| run_id_of(&start(i, Some(101 + i as u32))))
        .collect();
    let refused = start(3, Some(104));
    refused.assert_code(11);
    refused.assert_stderr_mentions(&["default"]);
    ids.push(run_id_of(&start(3, None)));
    let mut client = daemon.client();
    for id in ids {
        client.stop(id).unwrap();
        client.results(id, DAEMON_TIMEOUT).unwrap();
    }
}

/// Item 15: the refusal of pid 1 named its command and said it was another user's, while a
/// pid that does not exist got another answer; a non-root user now gets the same refusal for
/// both, naming neither the command nor the owner. And a process whose name is not UTF-8
/// (any bytes, `prctl(PR_SET_NAME)`) was refused as "does not exist": its owner now profiles
/// it.
#[test]
fn refusals_say_nothing_of_other_processes_and_any_name_is_profiled() {
    needs_root!();
    let mallory = test_user("bpfprof-t1");
    let daemon = Daemon::start(&[]);
    let (_bin_dir, bin) = world_executable_bpfprof();
    let max: u32 = read_proc_u64("/proc/sys/kernel/pid_max") as u32;
    let missing = (2..max)
        .rev()
        .find(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        .unwrap();
    let init_comm = std::fs::read_to_string("/proc/1/comm").unwrap();
    let refusal = |pid: u32| {
        let result = cli(
            &mallory,
            &bin,
            &daemon,
            &["run", "--async", "--pid", &pid.to_string()],
        );
        let words = result
            .stderr
            .replace(&format!("pid {pid}"), "pid PID")
            .replace(&format!("/proc/{pid}/"), "/proc/PID/");
        (result.code(), words)
    };
    let (init_code, init_words) = refusal(1);
    let (missing_code, missing_words) = refusal(missing);
    assert_eq!(init_code, 4, "{init_words}");
    assert_eq!(
        (init_code, &init_words),
        (missing_code, &missing_words),
        "pid 1 and a missing pid are refused differently"
    );
    for told in [init_comm.trim(), "another user", "belongs", "uid 0"] {
        assert!(
            !init_words.contains(told),
            "the refusal says {told:?}: {init_words}"
        );
    }

    // A process of mallory's named by bytes that are not UTF-8.
    let mut cmd = mallory.command("/usr/bin/python3");
    cmd.args([
        "-c",
        "import ctypes, time\n\
         ctypes.CDLL(None).prctl(15, b'spin\\xff\\xfe', 0, 0, 0)\n\
         end = time.time() + 60\n\
         while time.time() < end: pass",
    ]);
    let named = Workload::spawn_command(cmd);
    let renamed = poll_until(Duration::from_secs(5), || {
        let comm = std::fs::read(format!("/proc/{}/comm", named.pid())).ok()?;
        (comm == b"spin\xff\xfe\n").then_some(())
    });
    assert!(renamed.is_some(), "the workload did not rename itself");
    let started = cli(
        &mallory,
        &bin,
        &daemon,
        &[
            "run",
            "--async",
            "--pid",
            &named.pid().to_string(),
            "--duration-ms",
            "1500",
            "--formats",
            "folded",
        ],
    );
    let id = run_id_of(&started);
    let (state, profile, _) = results_of(&daemon, id);
    assert_eq!(state, RunState::Success);
    assert!(profile.total() > 20, "{}", profile.top(5));
}

/// The bystander's check on `list` answers can fail: a daemon that answers nothing for a
/// second (SIGSTOP, which holds up no other process) fails it, though the control process saw
/// the machine run as usual meanwhile. What every hostile test asserts is then not excused by
/// the control whenever an answer is slow.
#[test]
fn a_daemon_that_stops_answering_fails_the_bystanders_check() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let bystander = Bystander::start(&daemon, Duration::from_secs(3));
    thread::sleep(Duration::from_millis(500));
    let pid = daemon.pid() as libc::pid_t;
    // SAFETY: plain syscalls on the test's own daemon.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    thread::sleep(Duration::from_secs(1));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let finished = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bystander.finish()));
    let failure = match finished {
        Ok(report) => panic!("a daemon stopped for 1 s passed the bystander's check: {report:?}"),
        Err(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default(),
    };
    assert!(
        failure.contains("over the bound with no such stall"),
        "the bystander failed for another reason: {failure}"
    );
}
