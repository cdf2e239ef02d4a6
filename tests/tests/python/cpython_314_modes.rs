//! End to end: Debian sid's CPython 3.14 (in the chroot `cargo xtask setup` makes) through the
//! daemon with the Python client (`@bpfprof.profile` in a 3.14 process, its socket reached
//! inside the chroot) and through the agent's pprof endpoint: the 3:1 split of
//! `cpython_314.rs`'s workload within 3 points (or four standard errors) of what the workload
//! measures of itself, with Python frames named. Needs root (chroot, the daemon, the agent).

use std::{path::Path, process::Command, time::Duration};

use bpfprof_tests::agent::{free_port, go_pprof_url, start_agent};
use bpfprof_tests::*;

use super::cpython_314::{chroot_dir, share, sid_python, truth, SID, WORKLOAD};

/// Most the measured share may differ from the workload's own measure (or four standard
/// errors, see [`Share`]), as in `cpython_314.rs`.
const TOLERANCE: f64 = 0.03;
/// An even split: what a walk without `leaf_hot`'s frames (or with the leaves swapped) gives.
const DEFECT: f64 = 0.5;

/// A 3.14 program that profiles `work` (the 3:1 loop, 4 s) with the Python client's decorator
/// against the daemon at `BPFPROF_SOCKET`, measuring each leaf's thread CPU time itself, and
/// prints one JSON line: the result's state, samples and files, and its own split.
const CLIENT: &str = "import json, time
import bpfprof
def leaf_hot():
    x = 0
    for i in range(3000): x += i
def leaf_cold():
    x = 0
    for i in range(1000): x += i
times = [0, 0]
@bpfprof.profile(sample_tags=['py314'], sample_each=2e6)
def work(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.thread_time_ns()
        leaf_hot()
        t1 = time.thread_time_ns()
        leaf_cold()
        t2 = time.thread_time_ns()
        times[0] += t1 - t0
        times[1] += t2 - t1
work(4)
r = work.profiler.profile_result or {}
print(json.dumps({'state': r.get('state'), 'samples': r.get('samples'),
                  'files': r.get('files'), 'truth': times[0] / (times[0] + times[1])}))
";

/// Samples under `leaf_hot` and under `leaf_cold` in a folded profile.
fn leaves(profile: &Profile) -> (u64, u64) {
    let under = |name: &str| {
        let prefix = format!("{name} (");
        profile.count_where(|f| f.iter().any(|x| x == name || x.starts_with(&prefix)))
    };
    (under("leaf_hot"), under("leaf_cold"))
}

/// The daemon's Python client in a 3.14 process (`@bpfprof.profile`): the run ends with its
/// results, and its profile has the split the process measured, under the decorated `work`.
#[test]
fn python_client_on_cpython_314_against_the_daemon() {
    needs_root!();
    let Some(python) = sid_python(14) else {
        return;
    };
    // The daemon's folder inside the chroot, so that the 3.14 process reaches its socket.
    let (host, inside) = chroot_dir();
    let package = host.path().join("package");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(workspace_root().join("python/src"))
        .arg(&package)
        .status()
        .expect("cp");
    assert!(copied.success());
    std::fs::write(host.path().join("client.py"), CLIENT).unwrap();
    let daemon_dir = tempfile::Builder::new()
        .prefix("daemon-")
        .tempdir_in(host.path())
        .unwrap();
    let socket_inside = inside
        .join(daemon_dir.path().file_name().unwrap())
        .join("bpfprof.sock");
    let daemon = Daemon::start_in(daemon_dir, &[]);
    let out = Command::new("chroot")
        .arg(SID)
        .arg("env")
        .arg(format!("BPFPROF_SOCKET={}", socket_inside.display()))
        .arg(format!("PYTHONPATH={}", inside.join("package").display()))
        .arg(&python)
        .arg(inside.join("client.py"))
        .output()
        .expect("run the client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the 3.14 client failed:\n{stdout}\n{stderr}\ndaemon:\n{}",
        daemon.stderr_so_far()
    );
    let line: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON line from the client:\n{stdout}\n{stderr}"));
    let mut checks = Checks::new();
    checks.eq("the run's state", line["state"].as_str(), Some("STOPPED"));
    let folded = line["files"]["folded"].as_str().map(Path::new);
    let truth_share = line["truth"].as_f64().unwrap_or(0.0);
    match folded.filter(|p| p.is_file()) {
        None => checks.check(false, || format!("no folded profile in the result: {line}")),
        Some(path) => {
            let profile = Profile::read(path);
            let (hot, cold) = leaves(&profile);
            let in_work =
                profile.count_where(|f| f.iter().any(|x| x == "work" || x.starts_with("work (")));
            eprintln!(
                "3.14 client: {} samples, in work {in_work}; leaf_hot {hot}, leaf_cold {cold} \
                 ({:.3}); the process measured {truth_share:.3}",
                profile.total(),
                hot as f64 / (hot + cold).max(1) as f64
            );
            checks.result(
                "leaf_hot's share against the process's own measure",
                Share::new(hot, hot + cold).near(truth_share, TOLERANCE, DEFECT),
            );
            checks.result(
                "samples under the decorated work",
                Share::new(in_work, profile.total()).at_least(0.9, 0.0),
            );
        }
    }
    checks.finish();
}

/// The agent's `/debug/pprof/profile` on a 3.14 process (`--pid`): leaf_hot and leaf_cold
/// named as the leaves of its samples, in the split the process measured over the request.
#[test]
fn agent_pprof_endpoint_on_cpython_314() {
    needs_root!();
    let Some(python) = sid_python(14) else {
        return;
    };
    let (host, inside) = chroot_dir();
    std::fs::write(host.path().join("hot.py"), WORKLOAD).unwrap();
    let mut cmd = Command::new("chroot");
    cmd.arg(SID)
        .arg(&python)
        .arg(inside.join("hot.py"))
        .arg(inside.join("truth.txt"))
        .arg("120");
    let target = Workload::spawn_command(cmd);
    truth(host.path());
    let port = free_port();
    let pid = target.pid().to_string();
    let _agent = start_agent(port, &["--pid", &pid, "-F", "499", "--window", "1s"], 1.0);
    let home = tempdir();
    let mut checks = Checks::new();
    // Judged by samples taken: a loaded machine gives the target fewer, so the request
    // covers more seconds until there are enough. The endpoint answers with the windows of
    // the last `seconds` (from the agent's ring), so the workload's own measure is taken
    // over the same seconds, just before the request.
    let mut seconds = 4;
    loop {
        let before = truth(host.path());
        std::thread::sleep(Duration::from_secs(seconds));
        let after = truth(host.path());
        let url = format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds={seconds}");
        let Some(samples) = go_pprof_url(&url, home.path()) else {
            return;
        };
        let hot: u64 = samples
            .iter()
            .filter(|s| s.frames.iter().any(|f| f == "leaf_hot"))
            .map(|s| s.count)
            .sum();
        let cold: u64 = samples
            .iter()
            .filter(|s| s.frames.iter().any(|f| f == "leaf_cold"))
            .map(|s| s.count)
            .sum();
        let measured = share(before, after);
        eprintln!(
            "3.14 agent, {seconds} s: leaf_hot {hot}, leaf_cold {cold} ({:.3}); the process \
             measured {measured:.3}",
            hot as f64 / (hot + cold).max(1) as f64
        );
        if hot + cold >= 300 || seconds >= 16 {
            checks.result(
                "leaf_hot's share of the endpoint's profile against the process's own measure",
                Share::new(hot, hot + cold).near(measured, TOLERANCE, DEFECT),
            );
            break;
        }
        seconds *= 2;
    }
    checks.finish();
}
