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
/// how `top` and `dump` are seen as a user over ssh sees them. Each session has a tmux server
/// of its own (see [`tmux`]): two tests starting the first session of the
/// default server at once race to start it, and one of them failed ("tmux new-session
/// failed", once in a fresh clone's CI).
fn tmux_session(tmux_bin: &std::path::Path, name: &str, cols: u16, rows: u16, command: &str) {
    let (cols, rows) = (cols.to_string(), rows.to_string());
    let status = tmux(tmux_bin, name)
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

/// A tmux command line for session `name`'s own server (see [`tmux_session`]).
fn tmux(tmux_bin: &std::path::Path, name: &str) -> std::process::Command {
    let mut command = std::process::Command::new(tmux_bin);
    command.arg("-S").arg(tmux_socket(name));
    command
}

/// Session `name`'s server socket: tmux leaves it behind when its server exits.
fn tmux_socket(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{name}.tmux"))
}

/// Ends session `name` and its server, and removes the server's socket.
fn tmux_kill(tmux_bin: &std::path::Path, name: &str) {
    let _ = tmux(tmux_bin, name).args(["kill-server"]).status();
    let _ = std::fs::remove_file(tmux_socket(name));
}
