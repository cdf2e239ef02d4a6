//! CFI unwinding on the kinds of targets real profiles meet: a Rust release build without
//! frame pointers, a library `dlopen`ed while the run goes on, a binary visible only inside
//! the target's own mount namespace, and Debian's `xz` compared with `perf record
//! --call-graph dwarf` on the same process at the same time.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use bpfprof_tests::{
    exit, is_kernel_frame, require_root, run_bpfprof, tempdir, workload_path, Checks, Profile,
    Workload,
};

/// The leaf's share under its 3-unit parent (the workloads split their work 3:1).
const PARENT_A_SHARE: f64 = 0.75;
/// Allowed distance from that share (about three standard deviations at ~1500 samples).
const SHARE_TOLERANCE: f64 = 0.04;
/// Share of the leaf's samples that must carry their whole call path.
const FULL_PATH_SHARE: f64 = 0.97;

/// Profiles process `pid` for `seconds` at 999 Hz with `--unwind mode` into `out`.
fn profile_pid(mode: &str, pid: u32, seconds: u32, out: &Path) -> Profile {
    let run = run_bpfprof(
        [
            "--unwind",
            mode,
            "--pid",
            &pid.to_string(),
            "-F",
            "999",
            "-d",
            &format!("{seconds}s"),
            "-o",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    run.assert_code(exit::OK);
    Profile::read(out)
}

/// The user frames of a folded stack (root first), without the process name.
fn user_frames(frames: &[String]) -> Vec<&str> {
    frames
        .iter()
        .skip(1)
        .filter(|f| !is_kernel_frame(f))
        .map(String::as_str)
        .collect()
}

/// The samples of `profile` containing `leaf`, by the user path from `main` down to `leaf`
/// (frames inlined into the leaf dropped); a stack that does not reach `main` is keyed by
/// what it has, from its outermost user frame.
fn paths_to(profile: &Profile, leaf: &str) -> BTreeMap<Vec<String>, u64> {
    let mut paths = BTreeMap::new();
    for (frames, count) in &profile.stacks {
        let user = user_frames(frames);
        let Some(end) = user.iter().position(|f| *f == leaf) else {
            continue;
        };
        let start = user[..end].iter().position(|f| *f == "main").unwrap_or(0);
        let path = user[start..=end].iter().map(|f| f.to_string()).collect();
        *paths.entry(path).or_insert(0) += count;
    }
    paths
}

/// Whether `path` (root first) runs from `main` through `chain`, in order and adjacent, to
/// its end.
fn runs_through(path: &[String], chain: &[&str]) -> bool {
    path.first().is_some_and(|f| f == "main")
        && path.ends_with(&chain.iter().map(|s| s.to_string()).collect::<Vec<_>>())
}

/// A Rust release build without frame pointers gets the same call paths, from `main` down
/// to the hot leaf, as the same program built with them; by frame pointers alone it keeps
/// none (which shows the check can fail).
#[test]
fn rust_release_build_without_frame_pointers_matches_the_frame_pointer_build() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let mut runs = Vec::new();
    for (workload, mode) in [
        ("rustwork_fp", "auto"),
        ("rustwork_nofp", "auto"),
        ("rustwork_nofp", "fp"),
    ] {
        let target = Workload::spawn(workload, &["30"]);
        std::thread::sleep(Duration::from_millis(200));
        let out = dir.path().join(format!("{workload}-{mode}.folded"));
        let profile = profile_pid(mode, target.pid(), 4, &out);
        runs.push((workload, mode, profile));
    }
    let leaf = "rustwork::burn";
    let mut c = Checks::new();
    // The paths each build's leaf samples take, keeping those with at least 2% of them.
    let mut main_paths = Vec::new();
    for (workload, mode, profile) in &runs {
        let paths = paths_to(profile, leaf);
        let in_leaf: u64 = paths.values().sum();
        let through = |parent: &str| -> u64 {
            paths
                .iter()
                .filter(|(p, _)| runs_through(p, &["rustwork::main", parent, leaf]))
                .map(|(_, n)| n)
                .sum()
        };
        let (a, b) = (through("rustwork::parent_a"), through("rustwork::parent_b"));
        c.check(in_leaf >= 500, || {
            format!("{workload} --unwind {mode}: only {in_leaf} samples in {leaf}")
        });
        if *mode == "fp" {
            c.check(((a + b) as f64) < 0.5 * in_leaf as f64, || {
                format!("{workload} --unwind fp: {a} + {b} of {in_leaf} samples reached main: the build has frame pointers")
            });
            continue;
        }
        c.check((a + b) as f64 >= FULL_PATH_SHARE * in_leaf as f64, || {
            format!(
                "{workload} --unwind {mode}: {a} + {b} of {in_leaf} samples in {leaf} reach main through a parent:\n{}",
                profile.top(8)
            )
        });
        let share_a = a as f64 / (a + b).max(1) as f64;
        c.check((share_a - PARENT_A_SHARE).abs() <= SHARE_TOLERANCE, || {
            format!("{workload}: parent_a's share is {share_a:.3}, expected {PARENT_A_SHARE} ± {SHARE_TOLERANCE}")
        });
        let common: Vec<Vec<String>> = paths
            .iter()
            .filter(|(_, n)| **n as f64 >= 0.02 * in_leaf as f64)
            .map(|(p, _)| p.clone())
            .collect();
        main_paths.push((workload, common));
    }
    if let [(_, with_fp), (_, without)] = &main_paths[..] {
        c.check(with_fp == without, || {
            format!("call paths differ:\nwith frame pointers: {with_fp:#?}\nwithout: {without:#?}")
        });
    }
    c.finish();
}

/// A library without frame pointers `dlopen`ed a second after the run started gets its table
/// while the run goes on: its hot leaf reaches `main` through the library's own caller and
/// the program's.
#[test]
fn a_library_dlopened_during_the_run_unwinds_to_main() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let library = workload_path("libhot");
    let target = Workload::spawn("nofp_dlopen", &[library.to_str().unwrap(), "30"]);
    std::thread::sleep(Duration::from_millis(200));
    let out = dir.path().join("dlopen.folded");
    // The library is loaded 1 s into the run and busy from 2 s on.
    let profile = profile_pid("cfi", target.pid(), 5, &out);
    let in_leaf = profile.count_containing("lib_burn");
    let full = profile.count_where(|f| {
        let user = user_frames(f);
        user.ends_with(&["main", "call_lib", "lib_work", "lib_burn"])
    });
    let mut c = Checks::new();
    c.check(in_leaf >= 1000, || {
        format!("only {in_leaf} samples in lib_burn:\n{}", profile.top(5))
    });
    c.check(full as f64 >= FULL_PATH_SHARE * in_leaf as f64, || {
        format!(
            "{full} of {in_leaf} samples in lib_burn reach main through call_lib and lib_work:\n{}",
            profile.top(8)
        )
    });
    c.finish();
}

/// A process whose binary lives on a tmpfs mounted only in its own mount namespace (the path
/// it runs from shows an empty folder on the host) is unwound and named through
/// `/proc/PID/map_files` and `/proc/PID/root`.
#[test]
fn a_binary_only_visible_in_the_targets_mount_namespace() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    let nofp = workload_path("nofp");
    let script = format!(
        "mount -t tmpfs bpfprof-test {p} && cp {w} {p}/nofp && exec {p}/nofp parents 30",
        p = private.display(),
        w = nofp.display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    cmd.stdout(Stdio::null());
    let target = Workload::spawn_command(cmd);
    let exe = bpfprof_tests::poll_until(Duration::from_secs(5), || {
        let exe = std::fs::read_link(format!("/proc/{}/exe", target.pid())).ok()?;
        (exe == private.join("nofp")).then_some(exe)
    })
    .expect("the workload did not start from its private tmpfs");
    assert!(
        !exe.exists(),
        "{} is visible on the host: the test needs it hidden",
        exe.display()
    );
    std::thread::sleep(Duration::from_millis(200));
    let out = dir.path().join("mntns.folded");
    let profile = profile_pid("cfi", target.pid(), 4, &out);
    let in_burn = profile.count_containing("burn");
    let through =
        |parent: &str| profile.count_where(|f| user_frames(f).ends_with(&["main", parent, "burn"]));
    let (a, b) = (through("parent_a"), through("parent_b"));
    let mut c = Checks::new();
    c.check(in_burn >= 500, || {
        format!("only {in_burn} samples named burn:\n{}", profile.top(5))
    });
    c.check((a + b) as f64 >= FULL_PATH_SHARE * in_burn as f64, || {
        format!(
            "{a} + {b} of {in_burn} samples in burn reach main through a parent:\n{}",
            profile.top(8)
        )
    });
    c.finish();
}
