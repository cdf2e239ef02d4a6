//! End to end with real PyTorch on CPython 3.14: torch's cp314 wheel from PyPI in the venv
//! `cargo xtask setup` makes with Debian sid's (stripped) `python3.14` in the sid chroot, a
//! CPU training loop (`tests/workloads/pytorch_train.py loop`) attached with `bpfprof --pid`:
//! the main thread's samples are in `train_step`, under a module's forward or backward with
//! libtorch's frames below, and reach `_start`, as on 3.11 (`pytorch.rs`); the rest are the
//! OpenMP worker's; py-spy 0.4.3 (which reads 3.14) records the same process over the same
//! seconds, and the main thread's share in `train_step` is py-spy's within a few points.
//! Needs root (chroot).

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use bpfprof_tests::*;

use super::cpython_314::{chroot_dir, SID};
use super::pytorch::{function, in_step_with_libtorch, is_forward_or_backward, is_main_thread};

/// The venv's interpreter as the chroot names it (`cargo xtask setup`'s `setup_sid_torch`).
const TORCH_314: &str = "/opt/torch314/bin/python";
/// Longest the loop may take to start training (import torch, a first step): about 10 s
/// alone, far more on a loaded machine.
const LOOP_READY_TIMEOUT: Duration = Duration::from_secs(180);
/// The `--pid` run's length and frequency (499 Hz: a loaded machine gives the trainer a
/// fraction of a CPU, and 99 Hz then left 38 main-thread samples in 8 s, too few to judge),
/// and the most it may take before it is killed.
const RUN: &str = "10s";
const FREQUENCY: &str = "499";
const RUN_KILL: Duration = Duration::from_secs(60);
/// The share of the main thread's CPU samples in `train_step`, the lowest a correct build
/// measured less four standard errors (see [`Share`]): the loop does nothing else but check
/// the clock. 292 of 293 on 2026-11-29 (load 6). The issue saw 0.00 (the eval loop named
/// `_PyObject_DebugMallocStats+0x10bb7`, no Python frames): the defect caught.
const IN_STEP_SHARE: f64 = 0.95;
const IN_STEP_DEFECT: f64 = 0.5;
/// The share of the main thread's CPU samples in `train_step` under a forward or backward
/// with libtorch frames below: 279 of 293 (0.952) on 2026-11-29 (load 6); the step's
/// `zero_grad`, `cross_entropy` and `optimizer.step` are outside by construction. The bound
/// of 3.11's test (`pytorch.rs`, `LIBTORCH_BELOW_SHARE`), which a loaded machine needs while
/// libtorch_cpu.so's table is built.
const LIBTORCH_BELOW_SHARE: f64 = 0.75;
const LIBTORCH_BELOW_DEFECT: f64 = 0.5;
/// The least share of the main thread's stacks that reach `_start` (as `pytorch.rs`'s
/// `PID_TO_START_SHARE`: stacks walked before libtorch_cpu.so's table is in end early).
const TO_START_SHARE: f64 = 0.75;
/// The least share of the other threads' CPU samples in libgomp (the OpenMP worker that
/// `torch.set_num_threads(2)` starts): 252 of 252 on 2026-11-29.
const OPENMP_SHARE: f64 = 0.9;
/// How far bpfprof's share of the main thread's samples in `train_step` may be from py-spy's
/// on the same process over the same seconds (points), or four standard errors where wider.
/// `forward`'s share is printed, not judged: on CPU samples it parts from py-spy's (which
/// counts a thread waiting for a CPU as busy) with the load (see `pytorch.rs`), and in wall
/// mode the main thread's preempted stacks inside libtorch end early on 3.11 and 3.14 alike
/// (2026-11-29), which weighs `forward` against `backward` unevenly.
const PY_SPY_TOLERANCE: f64 = 0.03;
/// py-spy's recording, as long as bpfprof's.
const PY_SPY_SECONDS: &str = "10";

/// torch in that venv, as the host sees it (its `bin/python` is a link to the chroot's
/// `/usr/bin/python3.14`, which the host cannot follow).
const TORCH_314_PACKAGE: &str = "opt/torch314/lib/python3.14/site-packages/torch/__init__.py";

/// sid's venv with torch, when setup made it.
pub(super) fn torch_314() -> bool {
    let venv = Path::new(SID).join(TORCH_314_PACKAGE);
    if venv.is_file() {
        return true;
    }
    assert!(
        !ci(),
        "{} is missing: run `cargo xtask setup` (it installs PyTorch for sid's 3.14)",
        venv.display()
    );
    eprintln!("skipping: {} missing (cargo xtask setup)", venv.display());
    false
}

/// Whether a frame is a module's `forward` (`SmallCNN.forward`, `Conv2d.forward`, ...).
fn is_forward(frame: &str) -> bool {
    is_forward_or_backward(frame) && function(frame).ends_with("forward")
}

/// Whether a frame is in libgomp (the OpenMP worker's loop; its code is unnamed in the
/// stripped library, `libgomp.so.1+0x...`).
fn is_openmp(frame: &str) -> bool {
    frame.contains("libgomp")
}

/// `bpfprof --pid` next to py-spy on a training loop of real PyTorch on sid's CPython 3.14.
#[test]
fn pid_run_on_a_training_loop_on_cpython_314() {
    needs_root!();
    if !torch_314() {
        return;
    }
    let (host, inside) = chroot_dir();
    std::fs::copy(
        workspace_root().join("tests/workloads/pytorch_train.py"),
        host.path().join("pytorch_train.py"),
    )
    .unwrap();
    let mut cmd = Command::new("chroot");
    cmd.arg(SID)
        .arg(TORCH_314)
        .arg(inside.join("pytorch_train.py"))
        .args(["loop", "150"])
        .arg(inside.join("ready"));
    let target = Workload::spawn_command(cmd);
    let ready = host.path().join("ready");
    assert!(
        poll_until(LOOP_READY_TIMEOUT, || ready.exists().then_some(())).is_some(),
        "the training loop did not start within {LOOP_READY_TIMEOUT:?}"
    );
    let pid = target.pid().to_string();
    let mut checks = Checks::new();

    // py-spy records the same process over the same seconds.
    let spy_out = host.path().join("py-spy.txt");
    let spy = py_spy().map(|bin| {
        Command::new(bin)
            .args(["record", "--format", "raw", "--nonblocking", "-r", "100"])
            .args(["-d", PY_SPY_SECONDS, "--pid", &pid, "-o"])
            .arg(&spy_out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start py-spy")
    });
    assert!(
        spy.is_some() || !ci(),
        "py-spy is needed under CI (cargo xtask setup installs it)"
    );
    let cpu = host.path().join("cpu.folded");
    let cpu_arg = cpu.display().to_string();
    let run = run_bpfprof(
        ["--pid", &pid, "-F", FREQUENCY, "-d", RUN, "-o", &cpu_arg],
        RUN_KILL,
    );
    checks.eq("bpfprof exit", run.code(), exit::OK);
    let profile = Profile::read(&cpu);
    let main = profile.count_where(is_main_thread);
    let in_step =
        profile.count_where(|f| is_main_thread(f) && f.iter().any(|x| function(x) == "train_step"));
    let below = profile.count_where(|f| is_main_thread(f) && in_step_with_libtorch(f));
    let to_start =
        profile.count_where(|f| is_main_thread(f) && f.iter().any(|x| function(x) == "_start"));
    let forward = profile.count_where(|f| is_main_thread(f) && f.iter().any(|x| is_forward(x)));
    let others = profile.total() - main;
    let openmp = profile.count_where(|f| !is_main_thread(f) && f.iter().any(|x| is_openmp(x)));
    eprintln!(
        "3.14: {} samples, in train_step {in_step} ({:.3} of all); main thread {main}: in \
         train_step {in_step}, under forward/backward with libtorch {below}, forward {forward} \
         ({:.3}), reaching _start {to_start}; other threads {others}, in libgomp {openmp}",
        profile.total(),
        in_step as f64 / profile.total().max(1) as f64,
        forward as f64 / main.max(1) as f64,
    );
    checks.check(main > 0, || {
        format!(
            "no main-thread (Python) samples:\n{}",
            profile.shapes(10, |_| true)
        )
    });
    checks.result(
        "the main thread's samples in train_step",
        Share::new(in_step, main).at_least(IN_STEP_SHARE, IN_STEP_DEFECT),
    );
    checks.result(
        "the main thread's samples in train_step under forward/backward with libtorch",
        Share::new(below, main).at_least(LIBTORCH_BELOW_SHARE, LIBTORCH_BELOW_DEFECT),
    );
    checks.check(
        main > 0 && to_start as f64 >= TO_START_SHARE * main as f64,
        || {
            format!(
                "{to_start} of the main thread's {main} stacks reach _start (at least \
                 {TO_START_SHARE})"
            )
        },
    );
    checks.check(
        others > 0 && openmp as f64 >= OPENMP_SHARE * others as f64,
        || {
            format!(
                "{openmp} of the other threads' {others} samples in libgomp (at least \
                 {OPENMP_SHARE})"
            )
        },
    );
    if let Some(spy) = spy {
        let out = spy.wait_with_output().expect("wait for py-spy");
        checks.check(out.status.success(), || {
            format!("py-spy failed: {}", String::from_utf8_lossy(&out.stderr))
        });
        if out.status.success() {
            // py-spy samples the Python thread only: all of its samples are the main thread's.
            let (theirs, no_stack) = Profile::read_py_spy(&spy_out);
            eprintln!("py-spy: {no_stack} samples without a stack left out");
            let spy_step = theirs.count_where(|f| f.iter().any(|x| function(x) == "train_step"));
            let spy_forward = theirs.count_where(|f| f.iter().any(|x| is_forward(x)));
            let spy_share = Share::new(spy_step, theirs.total());
            eprintln!(
                "3.14: py-spy {} samples, in train_step {spy_step} ({:.3}), forward \
                 {spy_forward} ({:.3})",
                theirs.total(),
                spy_share.value(),
                spy_forward as f64 / theirs.total().max(1) as f64
            );
            checks.result(
                "the main thread's share in train_step against py-spy's",
                Share::new(in_step, main).near(spy_share.value(), PY_SPY_TOLERANCE, IN_STEP_DEFECT),
            );
        }
    }
    checks.finish();
}
