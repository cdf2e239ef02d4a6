//! CFI unwinding through signal frames: a hot loop inside a signal handler, in code without
//! frame pointers, must unwind through the kernel's signal frame (`__restore_rt`, whose CFI
//! points into the saved `ucontext`) to the interrupted function and on to `main`.

use std::time::Duration;

use bpfprof_tests::{is_kernel_frame, needs_root, profile_pid, tempdir, Workload};

#[test]
fn a_hot_signal_handler_unwinds_through_the_signal_frame_to_main() {
    needs_root!();
    let dir = tempdir();
    let target = Workload::spawn("nofp_signal", &["30"]);
    std::thread::sleep(Duration::from_millis(200));
    let profile = profile_pid(
        target.pid(),
        "4s",
        &["--unwind", "cfi", "-F", "999"],
        dir.path(),
    );
    // User frames, root first: ... main, wait_for_signals, <signal trampoline>, on_alarm,
    // burn_in_handler (the trampoline is a local symbol of libc, named by whatever symbol
    // precedes it in a stripped libc).
    let through_signal_frame = |frames: &[String]| {
        let user: Vec<&String> = frames.iter().filter(|f| !is_kernel_frame(f)).collect();
        let n = user.len();
        n >= 6
            && user[n - 1] == "burn_in_handler"
            && user[n - 2] == "on_alarm"
            && user[n - 4] == "wait_for_signals"
            && user[n - 5] == "main"
    };
    let in_handler = profile.count_containing("burn_in_handler");
    let whole = profile.count_where(through_signal_frame);
    assert!(
        in_handler >= 300,
        "only {in_handler} samples in the handler:\n{}",
        profile.top(10)
    );
    assert!(
        whole as f64 >= 0.97 * in_handler as f64,
        "{whole} of {in_handler} samples in the handler unwind through the signal frame to main:\n{}",
        profile.top(10)
    );
}

#[test]
fn frame_pointers_do_not_cross_the_signal_frame() {
    needs_root!();
    // The same workload by frame pointers: the handler's callers are lost, which shows that
    // the check above tests the CFI walk.
    let dir = tempdir();
    let target = Workload::spawn("nofp_signal", &["30"]);
    std::thread::sleep(Duration::from_millis(200));
    let profile = profile_pid(
        target.pid(),
        "3s",
        &["--unwind", "fp", "-F", "999"],
        dir.path(),
    );
    let in_handler = profile.count_containing("burn_in_handler");
    let whole = profile.count_where(|f| {
        f.iter().any(|x| x == "wait_for_signals") && f.iter().any(|x| x == "burn_in_handler")
    });
    assert!(
        in_handler >= 200,
        "only {in_handler} samples in the handler"
    );
    assert!(
        (whole as f64) < 0.5 * in_handler as f64,
        "{whole} of {in_handler} handler samples reached the interrupted function by frame \
         pointers: the workload has frame pointers"
    );
}

/// Code in the dynamic linker (the process's highest executable mapping, right below
/// `[vsyscall]` in the kernel's half) unwinds to `main` like any other: `dlsym` spends its time
/// in ld.so's symbol lookup. (The kernel's mapping search once took `[vsyscall]` for the
/// mapping of every ld.so address: all such stacks ended at their first frame, as did 3% of a
/// Python 3.12 profile, in `__tls_get_addr`.)
#[test]
fn code_in_the_dynamic_linker_unwinds_to_main() {
    needs_root!();
    let dir = tempdir();
    let target = Workload::spawn("nofp_dlsym", &["30"]);
    std::thread::sleep(Duration::from_millis(200));
    let profile = profile_pid(
        target.pid(),
        "3s",
        &["--unwind", "cfi", "-F", "999"],
        dir.path(),
    );
    let in_lookup = profile.count_containing("look_up_symbols");
    let total = profile.total();
    assert!(total >= 300, "only {total} samples");
    assert!(
        in_lookup as f64 >= 0.95 * total as f64
            && profile.count_where(
                |f| f.iter().any(|x| x == "main") && f.iter().any(|x| x == "look_up_symbols")
            ) == in_lookup,
        "{in_lookup} of {total} samples reach main through look_up_symbols:\n{}",
        profile.top(8)
    );
}
