//! End to end: Python functions in the stacks of CPython built without frame pointers (pyenv's
//! 3.12): the kernel program walks libpython by CFI and CPython's perf trampolines by their own
//! rule, and the symbolizer names them from the interpreter's perf map. Through `-X perf`, and
//! through the Python client, which turns the trampolines on for the profiled call. Needs root.

use std::{path::PathBuf, process::Command, time::Duration};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(60);

/// pyenv's CPython 3.12 (perf trampolines need 3.12 or later), if installed.
fn python312() -> Option<PathBuf> {
    let versions =
        PathBuf::from(std::env::var("HOME").unwrap_or("/root".into())).join(".pyenv/versions");
    let mut found: Vec<PathBuf> = std::fs::read_dir(versions)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("3.12"))
        .map(|e| e.path().join("bin/python3"))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop()
}

fn require_python312() -> Option<PathBuf> {
    let found = python312();
    if found.is_none() {
        assert!(
            !ci(),
            "pyenv's CPython 3.12 is needed under CI (see cargo xtask setup)"
        );
        eprintln!("skipping: no CPython 3.12 under ~/.pyenv");
    }
    found
}

fn workload() -> PathBuf {
    workspace_root().join("tests/workloads/pyhot.py")
}

/// Samples whose Python frames are exactly `chain` (outermost first).
fn python_chain(profile: &Profile, chain: &[&str]) -> u64 {
    profile.count_where(|frames| {
        let py: Vec<&str> = frames
            .iter()
            .filter(|f| f.starts_with("py::"))
            .map(|f| f.rsplit_once(':').map_or(f.as_str(), |(name, _)| name))
            .collect();
        py == chain
    })
}

#[test]
fn python_functions_of_a_cpython_without_frame_pointers() {
    needs_root!();
    let Some(python) = require_python312() else {
        return;
    };
    let dir = tempdir();
    let record = |unwind: &str| {
        let out = dir.path().join(format!("{unwind}.folded"));
        let summary = dir.path().join(format!("{unwind}.json"));
        let args = [
            "-F".into(),
            "499".into(),
            "--unwind".into(),
            unwind.into(),
            // The trampolines' own frames: where the kernel walks the Python frames (auto),
            // they would only repeat them and are left out.
            "--python".into(),
            "off".into(),
            "-o".into(),
            out.display().to_string(),
            "--summary-json".into(),
            summary.display().to_string(),
            "--".into(),
            python.display().to_string(),
            "-X".into(),
            "perf".into(),
            workload().display().to_string(),
            // Long enough for hundreds of samples after the walker's verification, which
            // takes seconds on a loaded machine.
            "6".into(),
        ];
        run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
        let summary = Summary::read(&summary);
        let unwind = summary.field("unwind");
        let cfi_stacks = unwind["cfi_stacks"].as_u64().unwrap();
        let before_walker = unwind["before_walker_ready"].as_u64().unwrap();
        (
            Profile::read(&out),
            cfi_stacks,
            before_walker,
            summary.u64("samples_seen"),
        )
    };
    let (cfi, cfi_stacks, before_walker, seen) = record("auto");
    // The summary says which unwinder made the stacks. A launched command starts at once and
    // its first samples use frame pointers until the walker is verified (a start-up cost the
    // bench measures: on a loaded machine 343 samples at 499 Hz, 0.7 s of the target's CPU,
    // since the stack scan made the walker larger), counted as such; from then on the CFI
    // walker makes the stacks.
    assert!(
        cfi_stacks as f64 >= 0.8 * seen.saturating_sub(before_walker) as f64,
        "{cfi_stacks} of {seen} stacks walked with CFI tables, {before_walker} before the \
         walker was ready"
    );
    let hot = python_chain(
        &cfi,
        &["py::<module>", "py::work", "py::parent_hot", "py::leaf_hot"],
    );
    let cold = python_chain(
        &cfi,
        &[
            "py::<module>",
            "py::work",
            "py::parent_cold",
            "py::leaf_cold",
        ],
    );
    // Judged among the samples walked once the walker was ready: on a loaded machine its
    // verification took 3-3.7 s (`bpfprof doctor`, load 7), most of a short run, and a
    // frame-pointer walk stops in this libpython. Not all of them either: samples in the
    // interpreter's start-up, before the perf map names anything, have none.
    let walked = cfi.total().saturating_sub(before_walker);
    assert!(
        walked >= 300,
        "only {walked} samples after the walker was ready ({before_walker} before): too few \
         to judge"
    );
    assert!(
        (hot + cold) as f64 >= 0.6 * walked as f64,
        "only {} of {walked} samples walked by the ready walker have the whole Python stack \
         ({before_walker} before it)\n{}",
        hot + cold,
        cfi.top(6)
    );
    let share = hot as f64 / (hot + cold) as f64;
    assert!(
        (0.65..=0.85).contains(&share),
        "parent_hot has {share:.2} of the Python samples, the workload gives it 3/4"
    );
    // The kernel's frame-pointer walk stops in libpython: the Python callers are lost.
    let (fp, fp_cfi_stacks, _, _) = record("fp");
    assert_eq!(
        fp_cfi_stacks, 0,
        "--unwind fp walked stacks with CFI tables"
    );
    let whole = python_chain(
        &fp,
        &["py::<module>", "py::work", "py::parent_hot", "py::leaf_hot"],
    );
    assert!(
        (whole as f64) < 0.2 * fp.total() as f64,
        "frame pointers alone found {whole} of {} whole Python stacks",
        fp.total()
    );
}

#[test]
fn the_python_client_turns_perf_trampolines_on_for_the_profiled_call() {
    needs_root!();
    let Some(python) = require_python312() else {
        return;
    };
    let daemon = Daemon::start(&[]);
    // No -X perf: the client turns the trampolines on around the profiled call.
    let child = Command::new(&python)
        .arg(workload())
        .args(["2", "client"])
        .arg(daemon.socket())
        .env("PYTHONPATH", workspace_root().join("python/src"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the Python workload");
    let perf_map = PathBuf::from(format!("/tmp/perf-{}.map", child.id()));
    let out = child
        .wait_with_output()
        .expect("wait for the Python workload");
    assert_ok(&out, "the Python workload");
    let folded = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let profile = Profile::read(std::path::Path::new(&folded));
    // The trampolines were on: the interpreter wrote their perf map.
    let map = std::fs::read_to_string(&perf_map).unwrap_or_default();
    let _ = std::fs::remove_file(&perf_map);
    assert!(
        map.contains("py::parent_hot:") && map.contains("py::leaf_hot:"),
        "{} has no trampolines for parent_hot and leaf_hot",
        perf_map.display()
    );
    // The daemon walks the Python frames itself, so the trampolines' repeats of them are
    // left out of its profile.
    let hot = profile.count_where(|f| {
        f.iter()
            .position(|x| x == "parent_hot")
            .is_some_and(|i| f[i + 1..].iter().any(|x| x == "leaf_hot"))
    });
    let trampolines = profile.count_where(|f| f.iter().any(|x| x.starts_with("py::")));
    assert!(
        hot as f64 >= 0.5 * profile.total() as f64 && trampolines == 0,
        "{hot} of {} samples under parent_hot;leaf_hot, {trampolines} with py:: frames\n{}",
        profile.total(),
        profile.top(6)
    );
}
