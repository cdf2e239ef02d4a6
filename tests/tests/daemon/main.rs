//! End-to-end tests of the daemon and the one recording pipeline behind it and the CLI: real
//! runs through its CLI and client, start-ups that never stall it, shared programs.
//!
//! One binary, one module per topic (`cargo test -p bpfprof-tests --test daemon -- runs::`).
//! Attacks on the daemon by other users are in the `hostile` binary.

mod deadline;
mod pipeline;
mod runs;
mod stall;

/// Checks a profile of `shortlived`'s parent: its child's `short_work` has at least 100 samples
/// when the run followed children, none when it did not.
fn check_children_followed(profile: &bpfprof_tests::Profile, follow: bool) {
    let n = profile.count_containing("short_work");
    if follow {
        assert!(n >= 100, "only {n} child samples\n{}", profile.top(5));
    } else {
        assert_eq!(n, 0, "children profiled without --follow-children");
    }
}
