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
    if !require_root() {
        return;
    }
    let Some(python) = require_python312() else {
        return;
    };
    let dir = tempdir();
    let record = |unwind: &str| {
        let out = dir.path().join(format!("{unwind}.folded"));
        let summary = dir.path().join(format!("{unwind}.json"));
        // `--python off`: this test is about the trampolines, not the kernel's frame walk
        // (which would name the same functions and drop the trampoline frames).
        let args = [
            "--python".into(),
            "off".into(),
            "-F".into(),
            "499".into(),
            "--unwind".into(),
            unwind.into(),
            "-o".into(),
            out.display().to_string(),
            "--summary-json".into(),
            summary.display().to_string(),
            "--".into(),
            python.display().to_string(),
            "-X".into(),
            "perf".into(),
            workload().display().to_string(),
            "3".into(),
        ];
        run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
        let summary = Summary::read(&summary);
        let cfi_stacks = summary.field("unwind")["cfi_stacks"].as_u64().unwrap();
        (Profile::read(&out), cfi_stacks, summary.u64("samples_seen"))
    };
    let (cfi, cfi_stacks, seen) = record("auto");
    // The summary says which unwinder made the stacks.
    assert!(
        cfi_stacks as f64 >= 0.8 * seen as f64,
        "{cfi_stacks} of {seen} stacks walked with CFI tables"
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
    let total = cfi.total();
    // Not all: samples in the interpreter's start-up, before the perf map names anything,
    // have none.
    assert!(
        (hot + cold) as f64 >= 0.6 * total as f64,
        "only {} of {total} samples have the whole Python stack\n{}",
        hot + cold,
        cfi.top(6)
    );
    let share = hot as f64 / (hot + cold) as f64;
    assert!(
        (0.65..=0.85).contains(&share),
        "parent_hot has {share:.2} of the Python samples, the workload gives it 3/4"
    );
    // The kernel's frame-pointer walk stops in libpython: the Python callers are lost.
    let (fp, fp_cfi_stacks, _) = record("fp");
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
    if !require_root() {
        return;
    }
    let Some(python) = require_python312() else {
        return;
    };
    let daemon = Daemon::start(&[]);
    // No -X perf: the client turns the trampolines on around the profiled call.
    let out = Command::new(&python)
        .arg(workload())
        .args(["2", "client"])
        .arg(daemon.socket())
        .env("PYTHONPATH", workspace_root().join("python/src"))
        .output()
        .expect("run the Python workload");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let folded = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let profile = Profile::read(std::path::Path::new(&folded));
    let hot = profile.count_where(|f| {
        f.iter().any(|x| x.starts_with("py::parent_hot"))
            && f.iter().any(|x| x.starts_with("py::leaf_hot"))
    });
    assert!(
        hot as f64 >= 0.5 * profile.total() as f64,
        "{hot} of {} samples under py::parent_hot;py::leaf_hot\n{}",
        profile.total(),
        profile.top(6)
    );
}
