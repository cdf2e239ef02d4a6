//! Bad input and bad environments: each case checks the exit code of the
//! contract and that stderr tells a human what is wrong.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use bpfprof_tests::{
    copy_executable, exit, has_hardware_pmu, needs_root, read_proc_u64, run_bpfprof,
    spawn_bpfprof_command, tempdir, workload_path, world_executable_bpfprof, RunResult, Workload,
};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Runs bpfprof against an existing process (this test process) with extra
/// arguments and a short duration, so that a wrongly accepted setting still
/// ends quickly.
fn run_on_self(extra: &[&str]) -> RunResult {
    let dir = tempdir();
    let out = dir.path().join("out.folded");
    let me = std::process::id().to_string();
    let mut args = vec!["--pid", &me, "-d", "1s", "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    run_bpfprof(args, TIMEOUT)
}

#[test]
fn no_such_pid_above_pid_max() {
    needs_root!();
    let pid = read_proc_u64("/proc/sys/kernel/pid_max") + 1;
    let dir = tempdir();
    let out = dir.path().join("out.folded");
    let run = run_bpfprof(
        [
            "--pid",
            &pid.to_string(),
            "-d",
            "1s",
            "-o",
            out.to_str().unwrap(),
        ],
        TIMEOUT,
    );
    run.assert_code(exit::NO_SUCH_TARGET);
    run.assert_stderr_mentions(&[&pid.to_string()]);
    run.assert_stderr_mentions(&["no such", "not found", "does not exist", "not exist"]);
}

#[test]
fn no_such_pid_reaped_child() {
    needs_root!();
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    child.wait().expect("wait true");
    let run = run_on_self(&["--pid", &pid.to_string()]);
    run.assert_code(exit::NO_SUCH_TARGET);
    run.assert_stderr_mentions(&[&pid.to_string()]);
}

#[test]
fn pid_not_a_number() {
    needs_root!();
    let run = run_bpfprof(["--pid", "abc", "-d", "1s"], TIMEOUT);
    run.assert_code(exit::USAGE);
    run.assert_stderr_mentions(&["abc"]);
    run.assert_stderr_mentions(&["--pid", "pid"]);
}

#[test]
fn off_cpu_settings_that_contradict_are_refused() {
    needs_root!();
    // A mode that does not exist is a usage error, as any other bad word on the command line
    // (`--mode off-cpu` exited 5); off-CPU time alone is `--off-cpu`, which it says.
    for (mode, says) in [("idle", "cpu or wall"), ("off-cpu", "--off-cpu")] {
        let run = run_on_self(&["--mode", mode]);
        run.assert_code(exit::USAGE);
        run.assert_stderr_mentions(&[says]);
    }
    for (args, says) in [
        (&["--mode", "wall", "--off-cpu"][..], "--off-cpu"),
        (&["--off-cpu-min", "5us"][..], "--off-cpu-min"),
    ] {
        let run = run_on_self(args);
        run.assert_code(exit::INVALID_SAMPLING);
        run.assert_stderr_mentions(&[says]);
    }
}

#[test]
fn frequency_zero() {
    needs_root!();
    let run = run_on_self(&["-F", "0"]);
    run.assert_code(exit::INVALID_SAMPLING);
    run.assert_stderr_mentions(&["frequency", "-F"]);
}

#[test]
fn frequency_above_max_sample_rate() {
    needs_root!();
    let max = read_proc_u64("/proc/sys/kernel/perf_event_max_sample_rate");
    let too_high = (max + 1).max(10_000_000);
    let run = run_on_self(&["-F", &too_high.to_string()]);
    run.assert_code(exit::INVALID_SAMPLING);
    run.assert_stderr_mentions(&["perf_event_max_sample_rate"]);
}

#[test]
fn sample_interval_zero() {
    needs_root!();
    let run = run_on_self(&["--sample-interval", "0"]);
    run.assert_code(exit::INVALID_SAMPLING);
    run.assert_stderr_mentions(&["interval"]);
}

#[test]
fn sample_interval_negative() {
    needs_root!();
    let run = run_on_self(&["--sample-interval", "-5"]);
    let code = run.code();
    assert!(
        code == exit::INVALID_SAMPLING || code == exit::USAGE,
        "--sample-interval -5: exit {code}, expected 5 or 2\n{}",
        run.stderr
    );
    run.assert_stderr_mentions(&["interval", "-5"]);
}

#[test]
fn unwritable_output_fails_before_sampling() {
    needs_root!();
    let target = Workload::spawn("hotcold", &["30"]);
    let path = "/proc/nonexistent/x.folded";
    let run = run_bpfprof(
        ["--pid", &target.pid().to_string(), "-d", "5s", "-o", path],
        TIMEOUT,
    );
    run.assert_code(exit::OUTPUT_NOT_WRITABLE);
    run.assert_stderr_mentions(&[path]);
    // Checked before sampling starts: no 5 s profiling run first.
    assert!(
        run.elapsed < Duration::from_secs(2),
        "took {:?}: the target was sampled before the output path was checked",
        run.elapsed
    );
}

/// `echo old > keep.folded; bpfprof ... -o keep.folded -o new.svg -o /nonexistent/dir/x.svg`:
/// refused before sampling, and neither the existing file (which it emptied) nor the new
/// path (left as an empty file) is touched.
#[test]
fn one_unwritable_output_leaves_the_others_as_they_were() {
    needs_root!();
    let target = Workload::spawn("hotcold", &["30"]);
    let dir = tempdir();
    let keep = dir.path().join("keep.folded");
    std::fs::write(&keep, "old\n").unwrap();
    let new = dir.path().join("new.svg");
    let bad = "/nonexistent/dir/x.svg";
    let pid = target.pid().to_string();
    let run = run_bpfprof(
        [
            "--pid",
            &pid,
            "-d",
            "5s",
            "-o",
            keep.to_str().unwrap(),
            "-o",
            new.to_str().unwrap(),
            "-o",
            bad,
        ],
        TIMEOUT,
    );
    run.assert_code(exit::OUTPUT_NOT_WRITABLE);
    run.assert_stderr_mentions(&[bad]);
    assert!(
        run.elapsed < Duration::from_secs(2),
        "took {:?}: the target was sampled before the output paths were checked",
        run.elapsed
    );
    assert_eq!(
        std::fs::read_to_string(&keep).unwrap(),
        "old\n",
        "the existing output was changed by a run that never started"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["keep.folded"], "files left beside the outputs");
}

/// The directory of one output removed during the run: the run fails (it said "wrote svg"
/// and exited 0 with no file), the other output is still written, and the samples are kept
/// in a rescue file in the current directory that the error names.
#[test]
fn an_output_directory_removed_during_the_run_fails_and_keeps_the_samples() {
    needs_root!();
    let target = Workload::spawn("hotcold", &["30"]);
    let dir = tempdir();
    let gone = dir.path().join("gone");
    std::fs::create_dir(&gone).unwrap();
    let svg = gone.join("p.svg");
    let folded = dir.path().join("p.folded");
    let mut cmd = Command::new(bpfprof_tests::bpfprof_bin());
    cmd.current_dir(dir.path()).args([
        "--pid",
        &target.pid().to_string(),
        "-d",
        "3s",
        "-o",
        svg.to_str().unwrap(),
        "-o",
        folded.to_str().unwrap(),
    ]);
    let bpfprof = spawn_bpfprof_command(cmd);
    let started = bpfprof_tests::poll_until(Duration::from_secs(60), || {
        bpfprof
            .stderr_so_far()
            .contains("loaded program id")
            .then_some(())
    });
    assert!(started.is_some(), "{}", bpfprof.stderr_so_far());
    std::fs::remove_dir_all(&gone).unwrap();
    let bpfprof_pid = bpfprof.pid();
    let run = bpfprof.wait_timeout(Duration::from_secs(120));
    run.assert_code(exit::OUTPUT_NOT_WRITABLE);
    run.assert_stderr_mentions(&[svg.to_str().unwrap()]);
    let rescue = dir
        .path()
        .join(format!("bpfprof-rescue-{bpfprof_pid}.folded"));
    run.assert_stderr_mentions(&[rescue.file_name().unwrap().to_str().unwrap()]);
    let kept = std::fs::read_to_string(&rescue)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", rescue.display(), run.stderr));
    assert!(kept.contains("leaf_hot"), "the rescue file:\n{kept}");
    let written = std::fs::read_to_string(&folded).unwrap();
    assert!(written.contains("leaf_hot"), "the other output:\n{written}");
}

#[test]
fn output_parent_is_a_file() {
    needs_root!();
    // Root ignores directory permissions, so use a parent that is a file.
    let dir = tempdir();
    let file = dir.path().join("plainfile");
    std::fs::write(&file, b"").unwrap();
    let out = file.join("x.folded");
    let me = std::process::id().to_string();
    let run = run_bpfprof(
        ["--pid", &me, "-d", "5s", "-o", out.to_str().unwrap()],
        TIMEOUT,
    );
    run.assert_code(exit::OUTPUT_NOT_WRITABLE);
    run.assert_stderr_mentions(&[out.to_str().unwrap()]);
    assert!(
        run.elapsed < Duration::from_secs(2),
        "took {:?}",
        run.elapsed
    );
}

#[test]
fn event_cycles_without_pmu() {
    needs_root!();
    if has_hardware_pmu() {
        eprintln!("hardware PMU present: --event cycles is supported here; not testing exit 8");
        return;
    }
    let run = run_on_self(&["--event", "cycles"]);
    run.assert_code(exit::EVENT_NOT_SUPPORTED);
    run.assert_stderr_mentions(&["cycles"]);
}

#[test]
fn not_root_is_permission_denied() {
    needs_root!();
    // A binary `nobody` can execute, an output dir `nobody` can write, and a
    // target owned by `nobody`: the only thing missing is the capabilities.
    let (bin_dir, bin) = world_executable_bpfprof();
    let out_dir = tempdir();
    std::fs::set_permissions(out_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = out_dir.path().join("out.folded");

    // The workload binary lives under the target dir, maybe not traversable
    // by nobody: copy it next to the bpfprof copy.
    let hotcold = bin_dir.path().join("hotcold");
    copy_executable(&workload_path("hotcold"), &hotcold, &["0.001"]);
    std::fs::set_permissions(&hotcold, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut target_cmd = Command::new("setpriv");
    target_cmd
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&hotcold)
        .arg("30");
    let target = Workload::spawn_command(target_cmd);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        target.status().is_none(),
        "hotcold as nobody exited: {:?}",
        target.status()
    );

    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(["--pid", &target.pid().to_string(), "-d", "1s", "-o"])
        .arg(&out);
    let run = spawn_bpfprof_command(cmd).wait_timeout(TIMEOUT);
    run.assert_code(exit::PERMISSION_DENIED);
    run.assert_stderr_mentions(&["permission", "root", "CAP_BPF", "CAP_PERFMON", "privilege"]);
}

/// Durations are refused in their own terms: zero is not "an invalid target", and a negative
/// one is not taken for a flag (clap's tip, `-- -1s`, would launch a command here).
#[test]
fn zero_and_negative_durations_are_usage_errors_that_say_so() {
    needs_root!();
    let run = run_bpfprof(["-d", "0s", "--", "true"], TIMEOUT);
    run.assert_code(exit::USAGE);
    run.assert_stderr_mentions(&["--duration must be longer than 0"]);
    assert!(!run.stderr.contains("target"), "{}", run.stderr);
    let run = run_bpfprof(["-d", "-1s", "--", "true"], TIMEOUT);
    run.assert_code(exit::USAGE);
    run.assert_stderr_mentions(&["negative"]);
    assert!(!run.stderr.contains("'-- -1s'"), "{}", run.stderr);
}

/// A command that cannot be run exits as a shell would: 127 not found, 126 not executable.
#[test]
fn a_command_that_cannot_run_exits_as_a_shell_would() {
    needs_root!();
    let run = run_bpfprof(["--", "/nonexistent/bpfprof-no-such-command"], TIMEOUT);
    run.assert_code(exit::COMMAND_NOT_FOUND);
    run.assert_stderr_mentions(&["cannot run", "/nonexistent/bpfprof-no-such-command"]);
    let dir = tempdir();
    let plain = dir.path().join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run = run_bpfprof(["--".as_ref(), plain.as_os_str()], TIMEOUT);
    run.assert_code(exit::COMMAND_NOT_EXECUTABLE);
    run.assert_stderr_mentions(&["cannot run"]);
}

/// `--format` that agrees with the output's extension is accepted; one that conflicts with
/// every output is refused before anything runs.
#[test]
fn a_format_that_agrees_with_the_extension_is_accepted() {
    needs_root!();
    let dir = tempdir();
    let folded = dir.path().join("out.folded");
    let run = run_bpfprof(
        [
            "--format".as_ref(),
            "folded".as_ref(),
            "-o".as_ref(),
            folded.as_os_str(),
            "--".as_ref(),
            workload_path("shortlived").as_os_str(),
            "0.2".as_ref(),
        ],
        TIMEOUT,
    );
    run.assert_code(exit::OK);
    assert!(folded.exists(), "{}", run.stderr);
    let svg = dir.path().join("out.svg");
    let run = run_bpfprof(
        [
            "--format".as_ref(),
            "folded".as_ref(),
            "-o".as_ref(),
            svg.as_os_str(),
            "--".as_ref(),
            "true".as_ref(),
        ],
        TIMEOUT,
    );
    run.assert_code(exit::USAGE);
    run.assert_stderr_mentions(&["conflicts", "out.svg"]);
    assert!(!svg.exists(), "nothing is written for a refused run");
}

/// The no-PMU fallback is said once (the start line), and a command as short as `true` is
/// named by its own name, not bpfprof's from before its exec.
#[test]
fn the_start_is_said_once_with_the_commands_own_name() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("true.folded");
    for _ in 0..5 {
        let run = run_bpfprof(
            [
                "-o".as_ref(),
                out.as_os_str(),
                "--".as_ref(),
                "true".as_ref(),
            ],
            TIMEOUT,
        );
        run.assert_code(exit::OK);
        if !has_hardware_pmu() {
            assert_eq!(
                run.stderr.matches("no hardware PMU").count(),
                2,
                "once at the start, once in the summary's header:\n{}",
                run.stderr
            );
        }
        assert!(run.stderr.contains("(true)"), "{}", run.stderr);
        assert!(!run.stderr.contains("(bpfprof)"), "{}", run.stderr);
    }
}
