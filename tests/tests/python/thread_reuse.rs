//! A thread id reused by another process: a system-wide run, which lists a CPython's threads
//! again only when its samples ask for it (or every 30 s), must not walk a new thread by the
//! entry an ended thread of another process left for the same id
//! (`tests/workloads/pythread_reuse.py`). Before the kernel checked an entry's process, B's
//! busy thread was named after B's sleeping thread for the whole run (`c_thread_idle` in 1,123
//! of 1,123 samples, by hand). Needs root (ns_last_pid, `--all`).

use std::time::Duration;

use bpfprof_tests::*;

/// The run's length: the workload's 3 s in A, its fork, and TB's 6 s, with room.
const RUN: &str = "20s";

#[test]
fn a_thread_given_another_process_ended_thread_id_is_named_by_its_own_frames() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("all.folded");
    let run = spawn_bpfprof([
        "--all",
        "-F",
        "199",
        "-d",
        RUN,
        "--per-thread",
        "-o",
        out.to_str().unwrap(),
    ]);
    poll_until(Duration::from_secs(30), || {
        run.stderr_so_far().contains("sampling with").then_some(())
    })
    .unwrap_or_else(|| panic!("sampling did not start:\n{}", run.stderr_so_far()));
    let script = workspace_root().join("tests/workloads/pythread_reuse.py");
    let status = std::process::Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(dir.path())
        .status()
        .expect("python3");
    assert!(status.success(), "pythread_reuse.py failed");
    let result = run.wait_timeout(Duration::from_secs(60));
    result.assert_code(exit::OK);
    let said = std::fs::read_to_string(dir.path().join("b")).unwrap();
    let mut fields = said.split_whitespace();
    let (Some(pid), Some(tid)) = (fields.next(), fields.next()) else {
        panic!("B's thread never got the ended thread's id (another process took it each time): {said:?}");
    };
    let profile = Profile::read(&out);
    let process = format!("(pid {pid})");
    let thread = format!("tid {tid}");
    let of_tb = |f: &[String]| {
        f.first().is_some_and(|p| p.ends_with(&process))
            && f.get(1)
                .is_some_and(|t| t.ends_with(&thread) || t.contains(&format!("({thread})")))
    };
    let has = |f: &[String], name: &str| f.iter().any(|x| x.split(' ').next() == Some(name));
    let all = profile.count_where(of_tb);
    let own = profile.count_where(|f| of_tb(f) && has(f, "b_thread_work"));
    let wrong =
        profile.count_where(|f| of_tb(f) && (has(f, "c_thread_idle") || has(f, "a_thread_work")));
    eprintln!(
        "B's thread {tid}: {all} samples, b_thread_work {own}, another thread's frames {wrong}"
    );
    assert!(
        all >= 100,
        "too few samples of B's thread: {all}\n{}",
        profile.top(10)
    );
    assert_eq!(
        wrong,
        0,
        "B's thread named by another thread's frames\n{}",
        profile.top(10)
    );
    // Its first samples may come before its process's threads are listed again (a look every
    // half second): native frames only, then.
    assert!(
        own as f64 >= 0.8 * all as f64,
        "{own} of {all} samples of B's thread name b_thread_work\n{}",
        profile.top(10)
    );
}
