//! A bpfprof daemon on a private socket and state directory, for the daemon tests.

use std::path::PathBuf;
use std::time::Duration;

use crate::files::tempdir;
use crate::process::poll_until;
use crate::runner::{run_bpfprof, spawn_bpfprof_command, BpfprofProcess, RunResult};

/// How long daemon operations in tests may take.
pub const DAEMON_TIMEOUT: Duration = Duration::from_secs(60);

/// A daemon on a private socket and state directory, stopped on drop.
pub struct Daemon {
    process: Option<BpfprofProcess>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    env: Vec<(String, String)>,
}

impl Daemon {
    pub fn start(extra: &[&str]) -> Daemon {
        Daemon::start_in(tempdir(), extra)
    }

    /// Starts a daemon with `extra` arguments and `env` added to its environment.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::start_in_with_env(tempdir(), extra, env)
    }

    /// Starts a daemon whose socket and state (`state/`) live in `dir`.
    pub fn start_in(dir: tempfile::TempDir, extra: &[&str]) -> Daemon {
        Daemon::start_in_with_env(dir, extra, &[])
    }

    /// [`Daemon::start_in`] with `env` added to the daemon's environment.
    pub fn start_in_with_env(
        dir: tempfile::TempDir,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        // Unprivileged clients must reach the socket inside.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let mut daemon = Daemon {
            process: None,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        daemon.spawn();
        daemon
    }

    pub fn spawn(&mut self) {
        let mut args = vec![
            "daemon".to_string(),
            "--socket".into(),
            self.socket().display().to_string(),
            "--state-dir".into(),
            self.state().display().to_string(),
        ];
        args.extend(self.extra.iter().cloned());
        let mut cmd = std::process::Command::new(crate::env::bpfprof_bin());
        cmd.args(&args).envs(self.env.iter().cloned());
        let process = spawn_bpfprof_command(cmd);
        let socket = self.socket();
        poll_until(Duration::from_secs(10), || {
            std::os::unix::net::UnixStream::connect(&socket)
                .ok()
                .map(|_| ())
        })
        .unwrap_or_else(|| panic!("daemon did not listen:\n{}", process.stderr_so_far()));
        self.process = Some(process);
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("bpfprof.sock")
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("the daemon runs").pid()
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn client(&self) -> bpfprof::client::Client {
        bpfprof::client::Client::connect(Some(&self.socket())).expect("connect to the daemon")
    }

    /// Kills the daemon without letting it finish its runs (a crash).
    pub fn crash(&mut self) {
        if let Some(p) = self.process.take() {
            p.signal(libc::SIGKILL);
            let _ = p.wait_timeout(DAEMON_TIMEOUT);
        }
    }

    /// What the daemon wrote to stderr so far (its log).
    pub fn stderr_so_far(&self) -> String {
        self.process
            .as_ref()
            .map(|p| p.stderr_so_far())
            .unwrap_or_default()
    }

    /// Runs a CLI client command against this daemon.
    pub fn cli(&self, args: &[&str]) -> RunResult {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.push("--socket".into());
        all.push(self.socket().display().to_string());
        run_bpfprof(&all, DAEMON_TIMEOUT)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(p) = self.process.take() {
            p.signal(libc::SIGTERM);
            let _ = p.wait_timeout(DAEMON_TIMEOUT);
        }
    }
}

/// The arguments of `bpfprof run --async` on `pid` (a pid, or `NS_INODE:PID`) at 499 Hz for
/// `duration_ms`, then `extra`: how the daemon's tests start a run.
pub fn async_run_args<'a>(pid: &'a str, duration_ms: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--async",
        "--pid",
        pid,
        "-F",
        "499",
        "--duration-ms",
        duration_ms,
    ];
    args.extend(extra);
    args
}
