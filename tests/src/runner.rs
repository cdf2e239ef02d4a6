//! Running bpfprof: to completion or in the background with a timeout, its exit code and
//! output checked, and profiling a running process into a folded profile.

use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::env::bpfprof_bin;
use crate::exit;
use crate::profile::Profile;

/// Outcome of one bpfprof run.
#[derive(Debug)]
pub struct RunResult {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl RunResult {
    /// The exit code; panics (with stderr) if bpfprof died from a signal.
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or_else(|| {
            panic!(
                "bpfprof was killed by a signal ({}); stderr:\n{}",
                self.status, self.stderr
            )
        })
    }

    /// Asserts the exit code, printing stderr on mismatch.
    #[track_caller]
    pub fn assert_code(&self, expected: i32) {
        assert_eq!(
            self.status.code(),
            Some(expected),
            "bpfprof exit status {} (expected code {expected}) after {:?}\n--- stderr ---\n{}\n--- stdout ---\n{}",
            self.status,
            self.elapsed,
            self.stderr,
            self.stdout
        );
    }

    /// Asserts that stderr mentions at least one of `needles`
    /// (case-insensitive): the error message has to name the problem.
    #[track_caller]
    pub fn assert_stderr_mentions(&self, needles: &[&str]) {
        let lower = self.stderr.to_lowercase();
        assert!(
            needles.iter().any(|n| lower.contains(&n.to_lowercase())),
            "bpfprof's stderr should mention one of {needles:?}; it was:\n{}",
            self.stderr
        );
    }

    /// The BPF program id from the `loaded program id N` log line.
    pub fn program_id(&self) -> Option<u32> {
        parse_program_id(&self.stderr)
    }
}

/// Extracts N from "... loaded program id N ..." in bpfprof's log output.
pub fn parse_program_id(stderr: &str) -> Option<u32> {
    const NEEDLE: &str = "loaded program id ";
    let start = stderr.find(NEEDLE)? + NEEDLE.len();
    let digits: String = stderr[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// A bpfprof process running in the background; stdout and stderr are
/// collected by threads. Killed on drop if still running.
pub struct BpfprofProcess {
    child: Child,
    started: Instant,
    stdout: Option<JoinHandle<String>>,
    stderr_buf: Arc<Mutex<String>>,
    stderr: Option<JoinHandle<()>>,
    /// The unwind table cache of this process alone (see [`spawn_bpfprof_command`]).
    _table_cache: Option<tempfile::TempDir>,
}

/// Starts bpfprof with `args` (stdin null, stdout/stderr piped).
pub fn spawn_bpfprof<I, S>(args: I) -> BpfprofProcess
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(bpfprof_bin());
    cmd.args(args);
    spawn_bpfprof_command(cmd)
}

/// Starts a prepared bpfprof command (e.g. wrapped in `setpriv`).
///
/// Each process gets an unwind table cache of its own, empty (`BPFPROF_UNWIND_CACHE`, unless
/// the command sets it): a test's tables are built as its run makes them, whatever earlier
/// tests left in the machine's cache. A test of the cache names its own with
/// `--unwind-cache`.
pub fn spawn_bpfprof_command(mut cmd: Command) -> BpfprofProcess {
    let table_cache = (!cmd.get_envs().any(|(k, _)| k == "BPFPROF_UNWIND_CACHE")).then(|| {
        let dir = tempfile::Builder::new()
            .prefix("bpfprof-test-tables-")
            .tempdir()
            .expect("a temporary folder");
        cmd.env("BPFPROF_UNWIND_CACHE", dir.path().join("unwind"));
        dir
    });
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let stdout = thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let stderr_buf = Arc::new(Mutex::new(String::new()));
    let buf = Arc::clone(&stderr_buf);
    let stderr = thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match err.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buf
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_str(&String::from_utf8_lossy(&chunk[..n])),
            }
        }
    });
    BpfprofProcess {
        child,
        started,
        stdout: Some(stdout),
        stderr_buf,
        stderr: Some(stderr),
        _table_cache: table_cache,
    }
}

impl BpfprofProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// stderr collected so far.
    pub fn stderr_so_far(&self) -> String {
        self.stderr_buf
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sends a signal (e.g. `libc::SIGINT`) to bpfprof.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own unreaped child.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({}, {sig}) failed", self.child.id());
    }

    /// Waits up to `timeout` for bpfprof to exit; on timeout kills it and
    /// panics with what it printed.
    pub fn wait_timeout(mut self, timeout: Duration) -> RunResult {
        // From now, not from the spawn: a daemon dropped after a long test still gets its
        // whole `timeout` to shut down.
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("try_wait on bpfprof") {
                break st;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let (stdout, stderr) = self.collect_output();
                panic!(
                    "bpfprof did not exit within {timeout:?}; killed it\n--- stderr ---\n{stderr}\n--- stdout ---\n{stdout}"
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.started.elapsed();
        let (stdout, stderr) = self.collect_output();
        RunResult {
            status,
            stdout,
            stderr,
            elapsed,
        }
    }

    fn collect_output(&mut self) -> (String, String) {
        let stdout = self
            .stdout
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        if let Some(h) = self.stderr.take() {
            let _ = h.join();
        }
        (stdout, self.stderr_so_far())
    }
}

impl Drop for BpfprofProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs bpfprof with `args` to completion, killing it (and panicking) after
/// `timeout`.
pub fn run_bpfprof<I, S>(args: I, timeout: Duration) -> RunResult
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    spawn_bpfprof(args).wait_timeout(timeout)
}

/// Profiles running process `pid` for `duration` (as `-d` takes it) with `args` besides, into
/// a folded file in `dir`; asserts bpfprof succeeded and returns the profile.
pub fn profile_pid(pid: u32, duration: &str, args: &[&str], dir: &Path) -> Profile {
    let out = dir.join("profile.folded");
    let pid = pid.to_string();
    let mut all: Vec<&str> = vec!["--pid", &pid, "-d", duration, "-o", out.to_str().unwrap()];
    all.extend_from_slice(args);
    run_bpfprof(&all, Duration::from_secs(120)).assert_code(exit::OK);
    Profile::read(&out)
}

/// Runs `bpfprof -F 499 -d SECONDS --pid P...` on `pids` for `seconds` with a folded profile
/// and a summary in `dir`, and `timeout` as its limit; the run must end with exit 0.
pub fn profile_pids(
    pids: &[u32],
    seconds: f64,
    dir: &Path,
    timeout: Duration,
) -> (Profile, crate::summary::Summary) {
    let out = dir.join("run.folded");
    let summary = dir.join("run.json");
    let duration = format!("{}s", seconds as u64);
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let mut args = vec!["-F", "499", "-d", &duration];
    for pid in &pids {
        args.extend(["--pid", pid.as_str()]);
    }
    args.extend([
        "-o",
        out.to_str().unwrap(),
        "--summary-json",
        summary.to_str().unwrap(),
    ]);
    run_bpfprof(&args, timeout).assert_code(exit::OK);
    (Profile::read(&out), crate::summary::Summary::read(&summary))
}
