//! What every task shares: the workspace root, and how commands are built (without `cargo run`'s
//! variables), echoed, run, probed and run as root.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};

/// The workspace root: xtask lives in `<root>/xtask`.
pub fn workspace_root() -> PathBuf {
    // `cargo xtask` (cargo run) sets CARGO_MANIFEST_DIR at run time too; prefer it, so that a
    // binary built in another checkout (a worktree seeded from another target/) works on the
    // checkout it is run from, not on the one it was compiled in.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.join("Cargo.toml").is_file())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest
        .parent()
        .expect("xtask's manifest dir has a parent")
        .to_path_buf()
}

/// Environment variables `cargo run` sets for the program it runs (here: xtask itself). They
/// describe xtask's package and must not reach the cargo invocations xtask makes.
fn is_cargo_run_var(key: &str) -> bool {
    key == "CARGO"
        || key.starts_with("CARGO_PKG_")
        || matches!(
            key,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_RUSTC_CURRENT_DIR"
        )
}

/// A command with `cargo run`'s per-package variables removed; for the workspace's own cargo
/// (rustup's, the one that runs xtask) and other tools.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(is_cargo_run_var) {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// The rustup cargo that runs xtask (the proxy in PATH, pinned by `RUSTUP_TOOLCHAIN`).
pub fn cargo() -> Command {
    let mut cmd = command("cargo");
    cmd.current_dir(workspace_root());
    cmd
}

/// `cmd` as a shell line (its environment, program and quoted arguments, and its directory).
pub fn describe(cmd: &Command) -> String {
    let mut line = String::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            line += &format!("{}={} ", key.to_string_lossy(), value.to_string_lossy());
        }
    }
    line += &cmd.get_program().to_string_lossy();
    for arg in cmd.get_args() {
        let arg = arg.to_string_lossy();
        let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
        if arg.is_empty() || !arg.chars().all(plain) {
            line += &format!(" '{}'", arg.replace('\'', r"'\''"));
        } else {
            line += &format!(" {arg}");
        }
    }
    if let Some(dir) = cmd.get_current_dir() {
        line = format!("(in {}) {line}", dir.display());
    }
    line
}

/// Runs `cmd`, echoing it, and fails unless it exits successfully.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = describe(cmd);
    println!("    $ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    ensure!(status.success(), "`{line}` failed ({status})");
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout if it succeeded, `None` if it failed or could not
/// start (e.g. the program is not installed).
pub fn probe(cmd: &mut Command) -> Option<String> {
    let output = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A duration as seconds with one decimal, e.g. `1.5s`.
pub fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Whether the Debian package `package` is installed.
pub fn apt_installed(package: &str) -> bool {
    probe(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_some_and(|status| status.trim() == "install ok installed")
}

/// A command run as root: directly when xtask is root, through sudo otherwise.
pub fn as_root(program: &str) -> Result<Command> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(command(program));
    }
    ensure!(
        probe(Command::new("sudo").arg("--version")).is_some(),
        "installing packages needs root: run `cargo xtask setup` as root (sudo is not available)"
    );
    let mut cmd = command("sudo");
    cmd.arg(program);
    Ok(cmd)
}
