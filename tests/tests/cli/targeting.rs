//! Which processes and threads get sampled, across pid namespaces, and with
//! kernel frames.

use std::process::Command;
use std::time::Duration;

use bpfprof_tests::{
    all_pids, exit, is_descendant_of, is_kernel_frame, needs_root, pid_ns_inode, poll_until,
    proc_status, process_name, run_bpfprof, tempdir, Profile, Summary, Workload,
};

fn settle() {
    std::thread::sleep(Duration::from_millis(200));
}

/// Profiles `pids` (each a `--pid` argument) at 999 Hz for `duration`.
fn profile_pids(pids: &[String], duration: &str) -> (Profile, Summary) {
    let dir = tempdir();
    let out = dir.path().join("out.folded");
    let summary = dir.path().join("summary.json");
    let mut args: Vec<String> = Vec::new();
    for p in pids {
        args.push("--pid".into());
        args.push(p.clone());
    }
    args.extend(
        [
            "-F",
            "999",
            "-d",
            duration,
            "-o",
            out.to_str().unwrap(),
            "--summary-json",
            summary.to_str().unwrap(),
        ]
        .map(String::from),
    );
    let run = run_bpfprof(&args, Duration::from_secs(20));
    run.assert_code(exit::OK);
    (Profile::read(&out), Summary::read(&summary))
}

#[test]
fn only_the_target_pid_is_sampled() {
    needs_root!();
    let hotcold = Workload::spawn("hotcold", &["30"]);
    let _spinner = Workload::spawn("spinner", &["30"]);
    settle();
    let (profile, _) = profile_pids(&[hotcold.pid().to_string()], "2s");
    let ctx = profile.top(10);
    assert!(profile.total() > 0, "no samples\n{ctx}");
    assert!(profile.has_frame("leaf_hot"), "hotcold not sampled\n{ctx}");
    assert_eq!(
        profile.count_containing("other_spin"),
        0,
        "samples from the spinner process leaked into hotcold's profile\n{ctx}"
    );
    for frames in profile.stacks.keys() {
        assert_eq!(
            frames[0], "hotcold",
            "line not starting with hotcold;: {frames:?}"
        );
    }
}

#[test]
fn repeated_pid_samples_each_target() {
    needs_root!();
    let hotcold = Workload::spawn("hotcold", &["30"]);
    let spinner = Workload::spawn("spinner", &["30"]);
    settle();
    let (profile, summary) = profile_pids(
        &[hotcold.pid().to_string(), spinner.pid().to_string()],
        "2s",
    );
    let ctx = profile.top(10);
    let comms = profile.by_comm();
    assert!(
        comms.get("hotcold").copied().unwrap_or(0) > 0,
        "hotcold missing\n{ctx}"
    );
    assert!(
        comms.get("spinner").copied().unwrap_or(0) > 0,
        "spinner missing\n{ctx}"
    );
    assert_eq!(comms.len(), 2, "unexpected processes {comms:?}\n{ctx}");
    assert!(profile.has_frame("leaf_hot"), "{ctx}");
    assert!(profile.has_frame("other_spin"), "{ctx}");
    // Each stack's functions belong to its own process.
    for frames in profile.stacks.keys() {
        let bad = match process_name(&frames[0]) {
            "hotcold" => frames.iter().any(|f| f == "other_spin"),
            "spinner" => frames
                .iter()
                .any(|f| f.starts_with("leaf_") || f.starts_with("parent_")),
            _ => false,
        };
        assert!(
            !bad,
            "frames of one process attributed to the other: {frames:?}"
        );
    }
    let mut pids: Vec<u64> = summary
        .targets()
        .iter()
        .filter_map(|t| t["pid"].as_u64())
        .collect();
    pids.sort();
    let mut want = vec![hotcold.pid() as u64, spinner.pid() as u64];
    want.sort();
    assert_eq!(pids, want, "summary targets: {}", summary.0);
}

#[test]
fn pid_in_another_pid_namespace() {
    needs_root!();
    let workload = bpfprof_tests::workload_path("hotcold");
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(&workload)
        .arg("30");
    let unshare = Workload::spawn_command(cmd);

    // The workload: a descendant of unshare named hotcold, with two NSpid
    // entries (host pid, pid inside the new namespace).
    let (host_pid, ns_pid) = poll_until(Duration::from_secs(5), || {
        all_pids().into_iter().find_map(|pid| {
            let st = proc_status(pid)?;
            (st.name == "hotcold" && st.nspid.len() == 2 && is_descendant_of(pid, unshare.pid()))
                .then(|| (pid, *st.nspid.last().unwrap()))
        })
    })
    .expect("hotcold inside the new pid namespace did not show up");
    let ns_inode = pid_ns_inode(host_pid);
    assert_ne!(
        ns_inode,
        pid_ns_inode(std::process::id()),
        "not in a new pid namespace"
    );
    assert_ne!(
        ns_pid, host_pid,
        "namespaced pid should differ from host pid"
    );
    settle();

    let (profile, summary) = profile_pids(&[format!("{ns_inode}:{ns_pid}")], "2s");
    let ctx = profile.top(10);
    assert!(
        profile.has_frame("leaf_hot"),
        "hotcold in pid ns {ns_inode} (ns pid {ns_pid}, host pid {host_pid}) not sampled\n{ctx}"
    );
    for frames in profile.stacks.keys() {
        assert_eq!(frames[0], "hotcold", "unexpected process: {frames:?}");
    }
    let targets = summary.targets();
    assert_eq!(targets.len(), 1, "summary: {}", summary.0);
    assert_eq!(
        targets[0]["pid"].as_u64(),
        Some(host_pid as u64),
        "summary: {}",
        summary.0
    );
    assert_eq!(
        targets[0]["ns_pid"].as_u64(),
        Some(ns_pid as u64),
        "summary: {}",
        summary.0
    );
    assert_eq!(
        targets[0]["pid_ns"].as_u64(),
        Some(ns_inode),
        "summary: {}",
        summary.0
    );

    // The same process by the host's namespace and its host pid.
    let host_ns = pid_ns_inode(std::process::id());
    let (by_host, summary) = profile_pids(&[format!("{host_ns}:{host_pid}")], "1s");
    assert!(
        by_host.has_frame("leaf_hot"),
        "{host_ns}:{host_pid} not sampled\n{}",
        by_host.top(5)
    );
    assert_eq!(
        summary.targets()[0]["ns_pid"].as_u64(),
        Some(ns_pid as u64),
        "summary: {}",
        summary.0
    );
}

/// Two containers, each with its own pid 1: `NS:1` names the pid 1 of namespace NS, whichever
/// of them comes first in /proc (it took the first pid 1 at that depth: the other container's).
#[test]
fn ns_pid_names_the_process_of_that_namespace_not_another_at_the_same_depth() {
    needs_root!();
    let workload = bpfprof_tests::workload_path("hotcold");
    let containers: Vec<(Workload, u32)> = (0..2)
        .map(|_| {
            let mut cmd = Command::new("unshare");
            cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
                .arg(&workload)
                .arg("30");
            let unshare = Workload::spawn_command(cmd);
            let host_pid = poll_until(Duration::from_secs(5), || {
                all_pids().into_iter().find(|&pid| {
                    proc_status(pid).is_some_and(|st| st.name == "hotcold" && st.nspid.len() == 2)
                        && is_descendant_of(pid, unshare.pid())
                })
            })
            .expect("hotcold inside a new pid namespace did not show up");
            (unshare, host_pid)
        })
        .collect();
    settle();
    for (_, host_pid) in &containers {
        let ns = pid_ns_inode(*host_pid);
        let (_, summary) = profile_pids(&[format!("{ns}:1")], "300ms");
        assert_eq!(
            summary.targets()[0]["pid"].as_u64(),
            Some(*host_pid as u64),
            "{ns}:1 is host pid {host_pid}; summary: {}",
            summary.0
        );
    }
}

#[test]
fn kernel_frames_follow_user_frames() {
    needs_root!();
    let target = Workload::spawn("syscalls", &["30"]);
    settle();
    let (profile, _) = profile_pids(&[target.pid().to_string()], "2s");
    let ctx = profile.top(10);
    // syscalls spends >90% of its time in read(/dev/zero) in the kernel.
    let with_kernel = profile.count_where(|f| f.iter().any(|x| is_kernel_frame(x)));
    assert!(
        with_kernel as f64 >= 0.5 * profile.total() as f64,
        "only {with_kernel} of {} samples have kernel frames\n{ctx}",
        profile.total()
    );
    // In every line: comm, then user frames, then kernel frames (never a user
    // frame after a kernel one).
    for frames in profile.stacks.keys() {
        assert_eq!(frames[0], "syscalls", "unexpected process: {frames:?}");
        let first_k = frames.iter().position(|f| is_kernel_frame(f));
        if let Some(k) = first_k {
            assert!(
                frames[k..].iter().all(|f| is_kernel_frame(f)),
                "user frame after a kernel frame: {}",
                frames.join(";")
            );
        }
    }
    // The syscall is issued from do_syscalls through the always_inline
    // raw_syscall3, which DWARF records as inlined: bpfprof expands it, so the
    // user part ends in main;do_syscalls;raw_syscall3 right before the kernel
    // frames.
    assert!(
        profile.stacks.keys().any(|f| {
            let Some(k) = f.iter().position(|x| is_kernel_frame(x)) else {
                return false;
            };
            k >= 3 && f[k - 1] == "raw_syscall3" && f[k - 2] == "do_syscalls" && f[k - 3] == "main"
        }),
        "no stack of the form syscalls;...;main;do_syscalls;raw_syscall3;<kernel>_[k]\n{ctx}"
    );
}

#[test]
fn all_threads_are_sampled() {
    needs_root!();
    let target = Workload::spawn("multithread", &["30"]);
    settle();
    let (profile, _) = profile_pids(&[target.pid().to_string()], "2s");
    let ctx = profile.top(10);
    let a = profile.count_containing("thread_a_work");
    let b = profile.count_containing("thread_b_work");
    assert!(
        a > 0 && b > 0,
        "thread_a_work {a}, thread_b_work {b}\n{ctx}"
    );
    // Both threads burn the same CPU; each should have a fair part of it.
    let total = profile.total() as f64;
    assert!(
        a as f64 >= 0.2 * total && b as f64 >= 0.2 * total,
        "uneven thread coverage: a {a}, b {b} of {total}\n{ctx}"
    );
    // The thread functions appear under their thread start routines.
    assert!(
        profile.count_directly_under("thread_a_work", "run_a") > 0,
        "{ctx}"
    );
    assert!(
        profile.count_directly_under("thread_b_work", "run_b") > 0,
        "{ctx}"
    );
}
