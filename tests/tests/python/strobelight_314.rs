//! End to end: PyTorch's `strobelight` decorator around a train step on CPython 3.14 (torch's
//! cp314 wheel in the venv `cargo xtask setup` makes with Debian sid's `python3.14` in the sid
//! chroot), through both `strobeclient` front ends against the daemon with its defaults, as a
//! non-root user, as `pytorch.rs` does on 3.11. The chroot reaches the daemon because the
//! daemon's folder (its socket) and the front ends are in a folder of the chroot's `/tmp`,
//! removed at the end; PyTorch reads `/proc`, mounted in the chroot in a mount namespace of the
//! workload's own. Every call logs its results, and the main thread's samples are in the
//! step, with libtorch below. Needs root (chroot, the daemon, the test user).

use std::{path::Path, process::Command, time::Instant};

use bpfprof_tests::*;
use regex::Regex;

use super::cpython_314::{chroot_dir, SID};
// The 3.11 test's user, calls and bounds: the same decorator, judged the same way.
use super::pytorch::{Pooled, CALLS, CALLS_TIMEOUT, MAX_ROUNDS, STOP_TO_RESULTS, USER};
use super::pytorch_314::torch_314;

/// The venv's interpreter as the chroot names it (`cargo xtask setup`'s `setup_sid_torch`).
const TORCH_314: &str = "/opt/torch314/bin/python";

/// The Python front end inside the chroot: the package's `strobeclient` entry point run by
/// sid's own `python3.14`, the package beside it at `package`.
fn python_front_end(inside: &Path) -> String {
    format!(
        "#!/usr/bin/python3.14\nimport sys\nsys.path.insert(0, {:?})\n\
         from bpfprof.strobeclient import main\nsys.exit(main())\n",
        inside.join("package").display().to_string()
    )
}

#[test]
fn strobelight_decorator_around_a_train_step_on_cpython_314() {
    needs_root!();
    if !torch_314() {
        return;
    }
    let started = Instant::now();
    let user = test_user(USER);
    let (host, inside) = chroot_dir();
    let at = |p: &str| host.path().join(p);
    for sub in ["bin-binary", "bin-python", "home"] {
        std::fs::create_dir(at(sub)).unwrap();
    }
    std::fs::copy(
        workspace_root().join("tests/workloads/pytorch_train.py"),
        at("pytorch_train.py"),
    )
    .unwrap();
    copy_executable(
        bpfprof_bin(),
        &at("bin-binary/strobeclient"),
        &["--version"],
    );
    let copied = Command::new("cp")
        .arg("-r")
        .arg(workspace_root().join("python/src"))
        .arg(at("package"))
        .status()
        .expect("cp");
    assert!(copied.success());
    std::fs::write(at("bin-python/strobeclient"), python_front_end(&inside)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        at("bin-python/strobeclient"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    // The user's home is theirs; the rest root's and readable (the daemon refuses a folder
    // another user owns above its socket).
    let chown = Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", user.uid, user.gid))
        .arg(at("home"))
        .status()
        .unwrap();
    assert!(chown.success());
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The daemon's folder (root's), inside the chroot.
    let daemon_dir = tempfile::Builder::new()
        .prefix("daemon-")
        .tempdir_in(host.path())
        .unwrap();
    let socket_inside = inside
        .join(daemon_dir.path().file_name().unwrap())
        .join("bpfprof.sock");
    let daemon = Daemon::start_in(daemon_dir, &[]);

    let total = Regex::new(r"Total samples: (\d+)").unwrap();
    let icicle = Regex::new(r"Icicle view \(python stack\): (\S+)").unwrap();
    let mut checks = Checks::new();
    for name in ["binary", "python"] {
        let mut pooled = Pooled::default();
        let mut stderr = String::new();
        for round in 0..MAX_ROUNDS {
            // PyTorch's decorator reads /proc/PID/ns/pid, and the chroot has no /proc: one is
            // mounted there in a mount namespace of the workload's own (the host's pids), which
            // goes with it however it ends.
            let mut cmd = bpfprof_tests::with_proc_in(SID);
            cmd.arg("chroot")
                .arg(format!("--userspec={}:{}", user.uid, user.gid))
                .arg(SID)
                .arg("env")
                .arg(format!(
                    "PATH={}:/usr/bin:/bin",
                    inside.join(format!("bin-{name}")).display()
                ))
                .arg(format!("HOME={}", inside.join("home").display()))
                .arg(format!("USER={USER}"))
                .arg(format!("BPFPROF_SOCKET={}", socket_inside.display()))
                .arg(format!(
                    "TORCHINDUCTOR_CACHE_DIR={}",
                    inside.join("home/inductor").display()
                ))
                .arg(TORCH_314)
                .arg(inside.join("pytorch_train.py"))
                .args(["strobelight", &CALLS.to_string()]);
            let out = spawn_bpfprof_command(cmd).wait_timeout(CALLS_TIMEOUT);
            checks.check(out.code() == 0, || {
                format!(
                    "{name}: the workload failed ({}):\n{}\ndaemon:\n{}",
                    out.code(),
                    out.stderr,
                    daemon.stderr_so_far()
                )
            });
            let lines: Vec<serde_json::Value> = out
                .stdout
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            checks.eq(&format!("{name}: calls reported"), lines.len(), CALLS);
            for line in &lines {
                eprintln!(
                    "{name}: call {}: profiled {}, stop to results {:?} s",
                    line["call"],
                    line["profiled"],
                    line["stop_to_results_s"].as_f64()
                );
                checks.check(line["profiled"] == true, || {
                    format!("{name}: call {} was not profiled", line["call"])
                });
                let secs = line["stop_to_results_s"].as_f64();
                checks.check(
                    secs.is_some_and(|s| s < STOP_TO_RESULTS.as_secs_f64()),
                    || {
                        format!(
                            "{name}: call {}: {secs:?} s from stop to results",
                            line["call"]
                        )
                    },
                );
            }
            let totals: Vec<u64> = total
                .captures_iter(&out.stderr)
                .map(|c| c[1].parse().unwrap())
                .collect();
            let svgs: Vec<&str> = icicle
                .captures_iter(&out.stderr)
                .map(|c| c.get(1).unwrap().as_str())
                .collect();
            checks.eq(&format!("{name}: Total samples lines"), totals.len(), CALLS);
            checks.eq(&format!("{name}: Icicle view lines"), svgs.len(), CALLS);
            for (call, (samples, svg)) in totals.iter().zip(&svgs).enumerate() {
                // The client writes the results in its home: a path inside the chroot.
                let svg = Path::new(SID).join(svg.trim_start_matches('/'));
                let profile = Profile::read(&svg.parent().unwrap().join("profile.folded"));
                let (main, in_step, good) = pooled.add(&profile);
                eprintln!(
                    "{name}: call {call}: {samples} samples, main thread {main}, in train_step \
                     {in_step}, under forward/backward with libtorch {good}"
                );
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
    eprintln!(
        "strobelight_decorator_around_a_train_step_on_cpython_314: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    drop(daemon);
    checks.finish();
}
