//! End to end: PyTorch's strobelight profilers driving bpfprof through its `strobeclient`
//! front ends, as a non-root user, against the real daemon and real workload processes.
//!
//! The driver below follows what `torch._strobelight.cli_function_profiler` does (PyTorch
//! 2.x): the same command lines, the same regular expressions over **stderr**, the same exit
//! code checks, up to 20 `PREPARING` polls and the `PROCESSING` retry, only with short
//! sleeps instead of its 10 s ones. It runs through both front ends: a `strobeclient`
//! symlink to the bpfprof binary, and the pure-Python console script that `pip install
//! ./python` puts into a venv. Needs root (to start the daemon and the test user).

use std::{
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
};

use bpfprof_tests::*;
use regex::Regex;

const TIMEOUT: Duration = Duration::from_secs(60);
/// PyTorch's defaults: a sample every 10M cycles, function runs of at most 10 minutes, and
/// 30 minutes for the compile-time profiler (more than the daemon's longest run).
const SAMPLE_EACH: u64 = 10_000_000;
const MAX_PROFILE_DURATION_MS: u64 = 600_000;
const COMPILE_MAX_PROFILE_TIME_MS: u64 = 1_800_000;
/// PyTorch sleeps 10 s between polls; the test sleeps less, the logic is the same.
const POLL_SLEEP: Duration = Duration::from_millis(200);
/// The test user the front ends and their targets run as.
const USER: &str = "bpfprof-strobe";

/// One way of running `strobeclient`, always as the test user and against one daemon.
struct Strobe {
    program: PathBuf,
    /// Arguments before the strobeclient ones (`strobeclient` for `bpfprof strobeclient`).
    prefix: Vec<String>,
    socket: PathBuf,
    user: TestUser,
    /// `XDG_CACHE_HOME`, where results out of the user's reach are copied.
    cache: Option<PathBuf>,
}

impl Strobe {
    fn run(&self, args: &[&str]) -> RunResult {
        self.run_with_env(args, &[])
    }

    /// [`Strobe::run`] with extra environment variables.
    fn run_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> RunResult {
        let mut cmd = self.user.command(&self.program);
        cmd.envs(env.iter().copied());
        cmd.args(&self.prefix)
            .args(args)
            .env("BPFPROF_SOCKET", &self.socket)
            // The test user has no home; nothing may need one when results are readable.
            .env("HOME", "/nonexistent")
            .env_remove("XDG_CACHE_HOME");
        if let Some(cache) = &self.cache {
            cmd.env("XDG_CACHE_HOME", cache);
        }
        spawn_bpfprof_command(cmd).wait_timeout(TIMEOUT)
    }
}

/// What PyTorch's profiler ends with: the run id and the result lines it logs for its user.
struct Profiled {
    run_id: i64,
    run_stderr: String,
    profile_result: Vec<String>,
}

/// `_run_async`: starts a run on `NS:PID` and reads its id from stderr.
fn run_async(strobe: &Strobe, pid: u32, sample_tags: &[String], max_ms: u64) -> (i64, String) {
    let target = format!("{}:{pid}", pid_ns_inode(pid));
    let interval = SAMPLE_EACH.to_string();
    let duration = max_ms.to_string();
    let mut args = vec![
        "run",
        "--profiler",
        "pyperf",
        "--event",
        "cycles",
        "--async",
        "--sample-interval",
        &interval,
        "--duration-ms",
        &duration,
        "--pid",
        &target,
    ];
    let joined = sample_tags.join(",");
    if !sample_tags.is_empty() {
        args.extend(["--sample-tags", &joined]);
    }
    let out = strobe.run(&args);
    out.assert_code(0);
    let id = Regex::new(r"INFO Run Id: (-?\d+)")
        .unwrap()
        .captures(&out.stderr)
        .unwrap_or_else(|| panic!("no run id in:\n{}", out.stderr))[1]
        .parse()
        .unwrap();
    (id, out.stderr)
}

/// `_wait_for_running`: polls while PREPARING, at most 20 times more.
fn wait_for_running(strobe: &Strobe, id: i64, counter: u32) {
    assert!(counter <= 20, "wait_for_running called more than 20 times");
    let out = strobe.run(&["getRunStatus", "--run-id", &id.to_string()]);
    out.assert_code(0);
    let status = Regex::new("Profile run status: (.*)")
        .unwrap()
        .captures(&out.stderr)
        .unwrap_or_else(|| panic!("unexpected output:\n{}", out.stderr))[1]
        .to_string();
    match status.as_str() {
        "RUNNING" => {}
        "PREPARING" => {
            thread::sleep(POLL_SLEEP);
            wait_for_running(strobe, id, counter + 1);
        }
        other => panic!("unexpected {other:?} phase:\n{}", out.stderr),
    }
}

/// `_stop_run`: the first `INFO ::1:` line must say `Success!`.
fn stop_run(strobe: &Strobe, id: i64) {
    let out = strobe.run(&["stopRun", "--run-id", &id.to_string()]);
    out.assert_code(0);
    let status = Regex::new("INFO ::1:(.*)")
        .unwrap()
        .captures(&out.stderr)
        .unwrap_or_else(|| panic!("unexpected output:\n{}", out.stderr))[1]
        .to_string();
    assert!(status.contains("Success!"), "stop said {status:?}");
}

/// `_get_results`: retries while PROCESSING, requires SUCCESS, then collects every
/// `Total samples`, `GraphProfiler` and `Icicle view (python stack)` line.
fn get_results(strobe: &Strobe, id: i64) -> Vec<String> {
    let out = strobe.run(&["getRunStatus", "--run-id", &id.to_string()]);
    out.assert_code(0);
    if let Some(m) = Regex::new("INFO ::1:(.*)").unwrap().captures(&out.stderr) {
        let status = &m[1];
        if status.contains("Profile run status: PROCESSING") {
            thread::sleep(POLL_SLEEP);
            return get_results(strobe, id);
        }
        assert!(
            status.contains("Profile run finished with SUCCESS"),
            "unexpected response:\n{}",
            out.stderr
        );
    }
    Regex::new(r"(Total samples(.*)|GraphProfiler(.*)|Icicle view \(python stack\)(.*))")
        .unwrap()
        .captures_iter(&out.stderr)
        .map(|c| c[1].to_string())
        .collect()
}

/// `StrobelightCLIFunctionProfiler.profile`: start, wait for RUNNING, let the work run until
/// the target has burnt `work` of CPU, stop, collect.
fn profile(
    strobe: &Strobe,
    target: &Workload,
    sample_tags: &[String],
    max_ms: u64,
    work: Duration,
) -> Profiled {
    let (run_id, run_stderr) = run_async(strobe, target.pid(), sample_tags, max_ms);
    wait_for_running(strobe, run_id, 0);
    burn(target, work);
    stop_run(strobe, run_id);
    Profiled {
        run_id,
        run_stderr,
        profile_result: get_results(strobe, run_id),
    }
}

/// Waits until `target` has used `cpu` more CPU time: the samples a run gets follow from
/// the target's CPU time, not from wall time, which a loaded machine stretches.
fn burn(target: &Workload, cpu: Duration) {
    let start = target.cpu_time();
    let burnt = poll_until(TIMEOUT, || (target.cpu_time() >= start + cpu).then_some(()));
    assert!(
        burnt.is_some(),
        "the target did not get {cpu:?} of CPU in {TIMEOUT:?}"
    );
}

/// The value after `prefix` in the one result line starting with it.
fn result_line<'a>(result: &'a [String], prefix: &str) -> &'a str {
    let lines: Vec<&String> = result.iter().filter(|l| l.starts_with(prefix)).collect();
    assert_eq!(lines.len(), 1, "one {prefix:?} line in {result:#?}");
    lines[0][prefix.len()..]
        .trim()
        .trim_start_matches(':')
        .trim()
}

/// Self time per function name in a pstats file, read by Python's own `pstats`.
fn pstats_self_times(path: &Path) -> serde_json::Value {
    let script = "import json, pstats, sys\n\
                  s = pstats.Stats(sys.argv[1])\n\
                  out = {}\n\
                  for (f, l, name), (cc, nc, tt, ct, callers) in s.stats.items():\n\
                  \x20   out[name] = out.get(name, 0.0) + tt\n\
                  print(json.dumps(out))\n";
    let out = output_ok(
        Command::new("python3").args(["-c", script]).arg(path),
        &format!("pstats on {}", path.display()),
    );
    serde_json::from_slice(&out.stdout).expect("pstats JSON")
}

/// Checks what a PyTorch user is pointed at: the sample count and the profiles the result
/// lines name, which must hold the workload's hot function (and the run's tags).
fn check_profile(p: &Profiled, tags: &[String]) {
    let total: u64 = result_line(&p.profile_result, "Total samples")
        .parse()
        .unwrap_or_else(|e| panic!("Total samples line: {e}: {:#?}", p.profile_result));
    assert!(total >= 20, "run {} has {total} samples", p.run_id);
    let graph: Vec<&str> = result_line(&p.profile_result, "GraphProfiler")
        .split_whitespace()
        .collect();
    assert_eq!(graph.len(), 2, "pprof and pstats paths: {graph:?}");
    let (pprof, pstats) = (Path::new(graph[0]), Path::new(graph[1]));
    let svg = Path::new(result_line(&p.profile_result, "Icicle view (python stack)"));

    // The icicle view names the hot function and the tags.
    let svg_text =
        std::fs::read_to_string(svg).unwrap_or_else(|e| panic!("reading {}: {e}", svg.display()));
    assert!(
        svg_text.contains("leaf_hot"),
        "{} lacks leaf_hot",
        svg.display()
    );
    for tag in tags {
        assert!(
            svg_text.contains(&format!("[tag {tag}]")),
            "{} lacks tag {tag}",
            svg.display()
        );
    }
    // pstats: leaf_hot burns three times leaf_cold's CPU (hotcold's fixed 75:25 split).
    let times = pstats_self_times(pstats);
    let hot = times["leaf_hot"].as_f64().unwrap_or(0.0);
    let cold = times["leaf_cold"].as_f64().unwrap_or(0.0);
    assert!(
        hot > 1.5 * cold && hot > 0.0,
        "pstats leaf_hot {hot} vs leaf_cold {cold}: {times}"
    );
    // Tags stay out of pstats' call tree (snakeviz shows 20 levels): the process is the root.
    for tag in tags {
        assert!(
            times.get(format!("[tag {tag}]")).is_none(),
            "pstats has tag {tag} in its call tree: {times}"
        );
    }
    // pprof: gzip-compressed protobuf whose string table names the hot function.
    let gz = Command::new("gzip")
        .arg("-dc")
        .arg(pprof)
        .output()
        .expect("running gzip");
    assert!(gz.status.success(), "{} is not gzip", pprof.display());
    assert!(
        gz.stdout.windows(8).any(|w| w == b"leaf_hot"),
        "{} lacks leaf_hot",
        pprof.display()
    );
}

/// A directory the test user can reach holding bpfprof, a `strobeclient` symlink to it and
/// the hotcold workload.
struct Bins {
    _dir: tempfile::TempDir,
    bpfprof: PathBuf,
    symlink: PathBuf,
    hotcold: PathBuf,
}

fn bins() -> Bins {
    let (dir, bpfprof) = world_executable_bpfprof();
    let symlink_path = dir.path().join("strobeclient");
    symlink("bpfprof", &symlink_path).expect("symlink strobeclient -> bpfprof");
    let hotcold = dir.path().join("hotcold");
    copy_executable(&workload_path("hotcold"), &hotcold, &["0.001"]);
    Bins {
        _dir: dir,
        bpfprof,
        symlink: symlink_path,
        hotcold,
    }
}

fn front_ends(daemon: &Daemon, bins: &Bins) -> Vec<(&'static str, Strobe)> {
    let user = test_user(USER);
    vec![
        (
            "symlink",
            Strobe {
                program: bins.symlink.clone(),
                prefix: vec![],
                socket: daemon.socket(),
                user: user.clone(),
                cache: None,
            },
        ),
        (
            "python",
            Strobe {
                program: python_console_script().to_path_buf(),
                prefix: vec![],
                socket: daemon.socket(),
                user,
                cache: None,
            },
        ),
    ]
}

fn spawn_hotcold(bins: &Bins, secs: &str) -> Workload {
    let mut cmd = test_user(USER).command(&bins.hotcold);
    cmd.arg(secs);
    let w = Workload::spawn_command(cmd);
    thread::sleep(Duration::from_millis(200));
    w
}

#[test]
fn pytorch_function_profiler_flow_through_both_front_ends() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let bins = bins();
    let target = spawn_hotcold(&bins, "120");
    for (name, strobe) in front_ends(&daemon, &bins) {
        let tags = vec![format!("{name}-e2e")];
        let p = profile(
            &strobe,
            &target,
            &tags,
            MAX_PROFILE_DURATION_MS,
            Duration::from_millis(1000),
        );
        assert_eq!(p.profile_result.len(), 3, "{name}: {:#?}", p.profile_result);
        check_profile(&p, &tags);
        assert!(
            p.run_stderr.contains("read from the interpreter's frames"),
            "{name}: {}",
            p.run_stderr
        );
        if !has_hardware_pmu() {
            assert!(
                p.run_stderr.contains("no hardware PMU"),
                "{name} should say cycles fell back to cpu-clock: {}",
                p.run_stderr
            );
        }
    }
    // `bpfprof strobeclient ...` is the same front end.
    let user = test_user(USER);
    let sub = Strobe {
        program: bins.bpfprof.clone(),
        prefix: vec!["strobeclient".into()],
        socket: daemon.socket(),
        user,
        cache: None,
    };
    let p = profile(
        &sub,
        &target,
        &[],
        MAX_PROFILE_DURATION_MS,
        Duration::from_millis(500),
    );
    check_profile(&p, &[]);
}

#[test]
fn phase_profiler_many_short_tagged_runs_on_one_process() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let bins = bins();
    let target = spawn_hotcold(&bins, "120");
    // TORCH_COMPILE_STROBELIGHT's session tag: date, pid and host run together.
    let session = format!("2026-11-23-04:50:12{}bpfprof-host", target.pid());
    let strobes = front_ends(&daemon, &bins);
    let mut ids = Vec::new();
    for phase in 0..6 {
        // Alternate the front ends: the runs follow one another whichever client made them.
        let (name, strobe) = &strobes[phase % strobes.len()];
        let tags = vec![session.clone(), format!("phase{phase}")];
        let p = profile(
            strobe,
            &target,
            &tags,
            COMPILE_MAX_PROFILE_TIME_MS,
            Duration::from_millis(400),
        );
        // 30 minutes is above the daemon's limit: the run takes the longest it allows.
        assert!(
            p.run_stderr.contains("longer than the daemon allows"),
            "{name}: {}",
            p.run_stderr
        );
        assert_eq!(p.profile_result.len(), 3, "{name}: {:#?}", p.profile_result);
        check_profile(&p, &tags);
        // Each run has its own profile, with only its own phase tag.
        let svg =
            std::fs::read_to_string(result_line(&p.profile_result, "Icicle view (python stack)"))
                .unwrap();
        for other in (0..6).filter(|&o| o != phase) {
            assert!(
                !svg.contains(&format!("[tag phase{other}]")),
                "run of phase{phase} holds phase{other}"
            );
        }
        ids.push(p.run_id);
    }
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "distinct run ids: {ids:?}");
}

/// `TORCH_COMPILE_STROBELIGHT=1` in PyTorch's environment (which strobeclient inherits): the
/// run asks for PyTorch's 500-frame stacks, which the daemon records (up to 512); and it
/// follows the children the target forks (inductor's compile workers), whose samples are in
/// the profile.
#[test]
fn compile_phases_take_the_deepest_stacks_and_follow_children() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let bins = bins();
    let shortlived = bins._dir.path().join("shortlived");
    copy_executable(&workload_path("shortlived"), &shortlived, &["0.01"]);
    let run_id = Regex::new(r"INFO Run Id: (-?\d+)").unwrap();
    for (name, strobe) in front_ends(&daemon, &bins) {
        // The child starts only after the run has attached (the sleep), as a compile worker
        // pool started during a phase.
        let mut cmd = test_user(USER).command("sh");
        cmd.args([
            "-c",
            &format!("sleep 2; {} 1.5; sleep 60", shortlived.display()),
        ]);
        let target = Workload::spawn_command(cmd);
        let pid = format!("{}:{}", pid_ns_inode(target.pid()), target.pid());
        let duration = COMPILE_MAX_PROFILE_TIME_MS.to_string();
        let interval = SAMPLE_EACH.to_string();
        let started = strobe.run_with_env(
            &[
                "run",
                "--profiler",
                "pyperf",
                "--event",
                "cycles",
                "--async",
                "--sample-interval",
                &interval,
                "--duration-ms",
                &duration,
                "--pid",
                &pid,
            ],
            &[("TORCH_COMPILE_STROBELIGHT", "1")],
        );
        started.assert_code(0);
        started.assert_stderr_mentions(&[
            "deeper than the daemon records",
            "compile workers",
            "longer than the daemon allows",
        ]);
        let id: i64 = run_id
            .captures(&started.stderr)
            .unwrap_or_else(|| panic!("{name}: no run id in:\n{}", started.stderr))[1]
            .parse()
            .unwrap();
        wait_for_running(&strobe, id, 0);
        // The child burns 1.5 s of CPU after a 2 s sleep: wait until it came and went.
        let child_running = || {
            all_pids().into_iter().any(|p| {
                is_descendant_of(p, target.pid())
                    && proc_status(p).is_some_and(|s| s.name == "shortlived")
            })
        };
        assert!(
            poll_until(TIMEOUT, || child_running().then_some(())).is_some(),
            "{name}: the child never started"
        );
        assert!(
            poll_until(TIMEOUT, || (!child_running()).then_some(())).is_some(),
            "{name}: the child never ended"
        );
        stop_run(&strobe, id);
        let result = get_results(&strobe, id);
        let svg = std::fs::read_to_string(result_line(&result, "Icicle view (python stack)"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            svg.contains("short_work"),
            "{name}: the child's short_work is not in the profile"
        );
        let summary = daemon
            .client()
            .results(id as u64, Duration::ZERO)
            .unwrap()
            .summary
            .unwrap();
        assert_eq!(summary["max_stack_length"], 500, "{name}: {summary}");
    }
}

#[test]
fn bad_command_lines_get_clear_errors_and_non_zero_exits() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let bins = bins();
    let target = spawn_hotcold(&bins, "60");
    let pid = format!("{}:{}", pid_ns_inode(target.pid()), target.pid());
    // A run of root's, which the test user may not see.
    let root_target = Workload::spawn("hotcold", &["60"]);
    let mut client = daemon.client();
    let root_run = client
        .run(bpfprof::protocol::RunRequest {
            pid: root_target.pid(),
            duration_ms: Some(30_000),
            ..Default::default()
        })
        .unwrap()
        .run_id
        .unwrap()
        .to_string();
    for (name, strobe) in front_ends(&daemon, &bins) {
        let unknown_flag = strobe.run(&["stopRun", "--run-id", "1", "--bogus"]);
        assert_ne!(unknown_flag.code(), 0, "{name}");
        unknown_flag.assert_stderr_mentions(&["--bogus"]);

        let profiler = strobe.run(&["run", "--profiler", "jvm", "--async", "--pid", &pid]);
        profiler.assert_code(2);
        profiler.assert_stderr_mentions(&["pyperf"]);

        let event = strobe.run(&[
            "run",
            "--profiler",
            "pyperf",
            "--event",
            "branch-misses",
            "--pid",
            &pid,
        ]);
        assert_ne!(event.code(), 0, "{name}");
        event.assert_stderr_mentions(&["branch-misses"]);

        // The unwinder comes from the environment (strobelight's flags have none).
        let unwind = strobe.run_with_env(
            &["run", "--profiler", "pyperf", "--async", "--pid", &pid],
            &[("BPFPROF_UNWIND", "dwarf")],
        );
        assert_ne!(unwind.code(), 0, "{name}");
        unwind.assert_stderr_mentions(&["expected auto, fp or cfi"]);

        let hidden = strobe.run(&["getRunStatus", "--run-id", &root_run]);
        hidden.assert_code(9);
        hidden.assert_stderr_mentions(&["no run"]);

        let not_owned = strobe.run(&[
            "run",
            "--profiler",
            "pyperf",
            "--async",
            "--pid",
            &root_target.pid().to_string(),
        ]);
        not_owned.assert_code(4);
    }
    client.stop(root_run.parse().unwrap()).unwrap();
}

#[test]
fn results_out_of_reach_are_copied_through_the_socket_and_runs_can_wait() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    // The state folder out of the user's reach, as under a hardened unit or in a container.
    std::fs::set_permissions(
        daemon.state(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let bins = bins();
    let target = spawn_hotcold(&bins, "120");
    let user = test_user(USER);
    let status_line = Regex::new("INFO ::1:(.*)").unwrap();
    let total_line = Regex::new(r"Total samples: \d+").unwrap();
    for (name, strobe) in front_ends(&daemon, &bins) {
        let cache = tempdir();
        std::os::unix::fs::chown(cache.path(), Some(user.uid), Some(user.gid)).unwrap();
        let strobe = Strobe {
            cache: Some(cache.path().to_path_buf()),
            ..strobe
        };
        let tags = vec![format!("{name}-copied")];
        let p = profile(
            &strobe,
            &target,
            &tags,
            MAX_PROFILE_DURATION_MS,
            Duration::from_millis(500),
        );
        // The lines name the user's copies, which hold the profile.
        let svg = result_line(&p.profile_result, "Icicle view (python stack)");
        let copies = cache.path().join("bpfprof/runs").join(p.run_id.to_string());
        assert!(
            Path::new(svg).starts_with(&copies),
            "{name}: {svg} is not under {}",
            copies.display()
        );
        check_profile(&p, &tags);

        // Without --async, run waits for the end and reports like getRunStatus.
        let pid = format!("{}:{}", pid_ns_inode(target.pid()), target.pid());
        let waited = strobe.run(&[
            "run",
            "--profiler",
            "pyperf",
            "--event",
            "cycles",
            "--duration-ms",
            "800",
            "--pid",
            &pid,
        ]);
        waited.assert_code(0);
        let status = status_line
            .captures(&waited.stderr)
            .unwrap_or_else(|| panic!("{name}: no status in:\n{}", waited.stderr))[1]
            .to_string();
        assert!(
            status.contains("Profile run finished with SUCCESS"),
            "{name}: {}",
            waited.stderr
        );
        assert!(
            total_line.is_match(&waited.stderr),
            "{name}: {}",
            waited.stderr
        );
    }
}
