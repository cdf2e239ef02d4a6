//! End to end: `bpfprof doctor --pid PID` says what bpfprof makes of one process's Python:
//! pyenv's CPython 3.11 (bpfprof's table, a symbol table), Debian sid's stripped 3.14 (its
//! own `_Py_DebugOffsets`, stripped with no debug file), and a process with no Python.
//! Needs root.

use std::{path::Path, process::Command, time::Duration};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(60);
const SID: &str = "/srv/sid";
const SPIN: &str =
    "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: sum(range(1000))\n";

/// `bpfprof doctor --pid PID --json`'s checks by name: (status, found).
fn doctor(pid: u32) -> Vec<(String, String, String)> {
    // Exit 12 (DOCTOR_FAILED) when a layout is refused, 0 otherwise.
    let out = run_bpfprof(["doctor", "--json", "--pid", &pid.to_string()], TIMEOUT);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
                c["found"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn found<'a>(checks: &'a [(String, String, String)], name: &str) -> &'a str {
    checks
        .iter()
        .find(|c| c.0 == name)
        .map(|c| c.2.as_str())
        .unwrap_or_else(|| panic!("no {name} check: {checks:?}"))
}

/// Waits until `pid` runs a binary whose path ends with `ends`.
fn exec_done(pid: u32, ends: &str) {
    poll_until(Duration::from_secs(20), || {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        exe.to_string_lossy().ends_with(ends).then_some(())
    })
    .expect("the interpreter runs");
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn doctor_pid_names_the_interpreter_its_build_and_its_layout() {
    needs_root!();
    // pyenv's 3.11: not stripped, bpfprof's table.
    let py311 = Path::new("/root/.pyenv/versions/3.11.7/bin/python3.11");
    if py311.exists() {
        let target = Workload::spawn_command({
            let mut c = Command::new(py311);
            c.args(["-c", SPIN]);
            c
        });
        exec_done(target.pid(), "python3.11");
        let checks = doctor(target.pid());
        assert!(
            found(&checks, "python").starts_with("CPython 3.11."),
            "{checks:?}"
        );
        assert!(
            found(&checks, "python_build").contains("not stripped"),
            "{checks:?}"
        );
        assert!(
            found(&checks, "python_layout").contains("table"),
            "{checks:?}"
        );
        assert!(
            checks.iter().all(|c| c.1 == "OK"),
            "every check passes: {checks:?}"
        );
    } else {
        assert!(!ci(), "pyenv's 3.11.7 is needed under CI");
    }
    // sid's stripped 3.14: its own debug offsets.
    let sid314 = Path::new(SID).join("usr/bin/python3.14");
    if sid314.exists() {
        let target = Workload::spawn_command({
            let mut c = Command::new("chroot");
            c.args([SID, "/usr/bin/python3.14", "-c", SPIN]);
            c
        });
        exec_done(target.pid(), "python3.14");
        let checks = doctor(target.pid());
        assert!(
            found(&checks, "python").starts_with("CPython 3.14."),
            "{checks:?}"
        );
        let build = found(&checks, "python_build");
        assert!(
            build.contains("with the GIL")
                && build.contains("stripped")
                && build.contains("debuglink"),
            "{checks:?}"
        );
        assert!(
            found(&checks, "python_layout").contains("_Py_DebugOffsets"),
            "{checks:?}"
        );
        assert!(
            found(&checks, "python_frames").starts_with("Python frames walked"),
            "{checks:?}"
        );
    } else {
        assert!(!ci(), "{} is needed under CI", sid314.display());
    }
    // sid's 3.14 made to say it is 3.16.0 with a changed layout (as python/cpython_314.rs makes
    // it): refused, with the reason.
    if sid314.exists() {
        let dir = tempfile::Builder::new()
            .prefix("bpfprof-test-")
            .tempdir_in(Path::new(SID).join("tmp"))
            .unwrap();
        // Its struct also gains a field (as 3.15's did), so its shape is no known one's.
        let binary = dir.path().join("python3.16");
        write_python_316(&sid314, &binary, true);
        let inside = Path::new("/tmp")
            .join(dir.path().file_name().unwrap())
            .join("python3.16");
        let target = Workload::spawn_command({
            let mut c = Command::new("chroot");
            c.arg(SID).arg(&inside).args(["-c", SPIN]);
            c
        });
        exec_done(target.pid(), "python3.16");
        let checks = doctor(target.pid());
        assert!(
            found(&checks, "python").starts_with("CPython 3.16.0"),
            "{checks:?}"
        );
        let layout = checks.iter().find(|c| c.0 == "python_layout").unwrap();
        assert!(
            layout.1 == "FAIL" && layout.2.contains("laid out as no version bpfprof knows"),
            "{checks:?}"
        );
        assert!(
            found(&checks, "python_frames")
                .ends_with("native frames only (said in the run's summary, by dump and by top)"),
            "{checks:?}"
        );
    }
    // No Python: said so, native frames only.
    let sleeper = Workload::spawn_command({
        let mut c = Command::new("sleep");
        c.arg("30");
        c
    });
    exec_done(sleeper.pid(), "sleep");
    let checks = doctor(sleeper.pid());
    assert!(
        found(&checks, "python").contains("no CPython"),
        "{checks:?}"
    );
}
