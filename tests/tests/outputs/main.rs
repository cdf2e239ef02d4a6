//! End-to-end tests of what a run writes and shows: every file format read by an independent
//! reader, the timeline, `bpfprof top` in a terminal and `bpfprof dump`.
//!
//! One binary, one module per topic (`cargo test -p bpfprof-tests --test outputs -- formats::`).

mod dump;
mod dump_ends;
mod formats;
mod pstats_startup;
mod timeline;
mod top;

/// Starts a detached tmux session `name` of `cols` x `rows` running `command` (a shell line):
/// how `top` and `dump` are seen as a user over ssh sees them.
fn tmux_session(tmux: &std::path::Path, name: &str, cols: u16, rows: u16, command: &str) {
    let (cols, rows) = (cols.to_string(), rows.to_string());
    let status = std::process::Command::new(tmux)
        .args([
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            &cols,
            "-y",
            &rows,
            command,
        ])
        .status()
        .expect("run tmux");
    assert!(status.success(), "tmux new-session failed");
}
