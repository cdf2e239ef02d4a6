//! End to end: `bpfprof doctor` run for real, as root (every check bpfprof needs passes on this
//! machine, the daemon check finds a live daemon) and as an unprivileged user (the capability
//! and load checks fail, and the exit code says so). Needs root.

use std::{collections::BTreeMap, process::Command};

use bpfprof_tests::*;

/// `bpfprof doctor`'s exit code when a check fails.
const DOCTOR_FAILED: i32 = 12;

/// The checks whose status a recording on this machine depends on.
const ESSENTIAL: [&str; 7] = [
    "kernel",
    "capabilities",
    "perf_event_paranoid",
    "program_load",
    "program_attach",
    "helper_get_ns_current_pid_tgid",
    "helper_get_stack",
];

/// Each check's name with its (status, found) from `doctor --json` output.
fn checks(stdout: &[u8]) -> BTreeMap<String, (String, String)> {
    let report: serde_json::Value = serde_json::from_slice(stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json is not JSON ({e}):\n{}",
            String::from_utf8_lossy(stdout)
        )
    });
    report["checks"]
        .as_array()
        .expect("checks array")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().expect("name").to_string(),
                (
                    c["status"].as_str().expect("status").to_string(),
                    c["found"].as_str().expect("found").to_string(),
                ),
            )
        })
        .collect()
}

#[test]
fn doctor_as_root_passes_the_essential_checks_and_finds_the_daemon() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let out = Command::new(bpfprof_bin())
        .args(["doctor", "--json", "--socket"])
        .arg(daemon.socket())
        .output()
        .unwrap();
    let checks = checks(&out.stdout);
    for name in ESSENTIAL {
        let (status, found) = &checks[name];
        assert_eq!(status, "OK", "{name}: {found}");
    }
    assert_eq!(checks["daemon"].0, "OK", "daemon: {}", checks["daemon"].1);
    assert!(checks["program_attach"].1.contains("cpu-clock"));
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(checks["kernel"].1, release.trim());
    // The PMU check must tell the truth about this machine either way.
    let pmu_ok = checks["hardware_pmu"].0 == "OK";
    assert_eq!(pmu_ok, has_hardware_pmu(), "{:?}", checks["hardware_pmu"]);
    assert_eq!(out.status.code(), Some(0), "{checks:#?}");

    // Without a daemon the same run warns about it and still exits 0.
    let dir = tempdir();
    let out = Command::new(bpfprof_bin())
        .arg("doctor")
        .env("BPFPROF_SOCKET", dir.path().join("none.sock"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("WARN") && l.contains("daemon") && l.contains("none.sock")),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
}

#[test]
fn doctor_without_privileges_names_the_missing_capabilities_and_fails() {
    needs_root!();
    let user = test_user("bpfprof-t3");
    let (_bin_dir, bin) = world_executable_bpfprof();
    let dir = tempdir();
    let out = user
        .command(&bin)
        .args(["doctor", "--json"])
        .env("BPFPROF_SOCKET", dir.path().join("none.sock"))
        .output()
        .unwrap();
    let checks = checks(&out.stdout);
    let (status, found) = &checks["capabilities"];
    assert_eq!(status, "FAIL", "{found}");
    for cap in ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN"] {
        assert!(
            found.split("missing:").nth(1).unwrap_or("").contains(cap),
            "{found}"
        );
    }
    assert_eq!(
        checks["program_load"].0, "FAIL",
        "{:?}",
        checks["program_load"]
    );
    assert!(checks["program_load"].1.contains("permission denied"));
    assert_eq!(out.status.code(), Some(DOCTOR_FAILED), "{checks:#?}");

    // The text form says what to do.
    let out = user.command(&bin).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FAIL  capabilities"), "{text}");
    assert!(text.contains("CAP_BPF and CAP_PERFMON"), "{text}");
    assert_eq!(out.status.code(), Some(DOCTOR_FAILED));
}
