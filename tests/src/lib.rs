//! Harness for the bpfprof end-to-end tests.
//!
//! The tests in `tests/tests/` run the real `bpfprof` binary, as root, with the
//! real eBPF program, against the C workloads in `tests/workloads/` (compiled by
//! `build.rs`). This library holds what they share:
//!
//! * [`require_root`]: skip (or, under `CI=true`, fail) when not root;
//! * [`bpfprof_bin`]: where the binary is (`BPFPROF_BIN`, else the workspace's
//!   `target/debug/bpfprof`, built once on demand);
//! * [`Workload`]: a spawned workload process, killed on drop;
//! * [`run_bpfprof`] / [`BpfprofProcess`]: run the profiler with a timeout;
//! * [`Profile`]: parsed folded output with stack queries;
//! * [`Summary`]: the `--summary-json` document.

pub mod hostile;
pub mod large_library;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Exit codes of the bpfprof CLI (its contract).
pub mod exit {
    pub const OK: i32 = 0;
    pub const USAGE: i32 = 2;
    pub const NO_SUCH_TARGET: i32 = 3;
    pub const PERMISSION_DENIED: i32 = 4;
    pub const INVALID_SAMPLING: i32 = 5;
    pub const OUTPUT_NOT_WRITABLE: i32 = 6;
    pub const TARGET_EXITED_EARLY: i32 = 7;
    pub const EVENT_NOT_SUPPORTED: i32 = 8;
    pub const INTERRUPTED: i32 = 130;
}

// ---------------------------------------------------------------------------
// Environment
// ---------------------------------------------------------------------------

/// True when the environment variable `CI` is exactly `true`.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Whether the tests may run. Returns false (after printing
/// "skipping: needs root") when not root and not under CI; panics under
/// `CI=true` when not root, so that a misconfigured CI cannot pass silently.
pub fn require_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        return true;
    }
    if ci() {
        panic!(
            "the bpfprof end-to-end tests need root (euid 0, with CAP_BPF and CAP_PERFMON), \
             but euid is {euid} and CI=true: run them as root in CI"
        );
    }
    eprintln!("skipping: needs root");
    false
}

/// Whether a hardware PMU is exposed (`/sys/bus/event_source/devices/cpu`).
/// Without one, `cycles` is unavailable and `--event auto` falls back to cpu-clock.
pub fn has_hardware_pmu() -> bool {
    Path::new("/sys/bus/event_source/devices/cpu").exists()
}

/// Reads a small integer from a procfs/sysfs file.
pub fn read_proc_u64(path: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("parsing {path} ({text:?}): {e}"))
}

/// The workspace root (the parent of this crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent directory")
        .to_path_buf()
}

/// Path of the `bpfprof` binary under test.
///
/// `BPFPROF_BIN` if set; otherwise `$CARGO_TARGET_DIR/debug/bpfprof` or
/// `<workspace>/target/debug/bpfprof`. If that file does not exist it is built
/// once per test process with `cargo build -p profiler-user --bin bpfprof`.
/// (An existing binary is used as is: rebuild it yourself after changes.)
pub fn bpfprof_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("BPFPROF_BIN") {
            let bin = PathBuf::from(bin);
            assert!(
                bin.is_file(),
                "BPFPROF_BIN={} does not exist or is not a file",
                bin.display()
            );
            return bin;
        }
        let root = workspace_root();
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(|d| {
                let d = PathBuf::from(d);
                if d.is_absolute() {
                    d
                } else {
                    root.join(d)
                }
            })
            .unwrap_or_else(|| root.join("target"));
        let bin = target_dir.join("debug").join("bpfprof");
        if !bin.is_file() {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            eprintln!("{} missing: building it", bin.display());
            let status = Command::new(&cargo)
                .args(["build", "-p", "profiler-user", "--bin", "bpfprof"])
                .current_dir(&root)
                .status()
                .unwrap_or_else(|e| panic!("running {cargo:?} build: {e}"));
            assert!(status.success(), "cargo build of bpfprof failed: {status}");
            assert!(
                bin.is_file(),
                "cargo build succeeded but {} still does not exist",
                bin.display()
            );
        }
        bin
    })
}

/// Path of a compiled workload program (see `tests/workloads/`).
pub fn workload_path(name: &str) -> PathBuf {
    let path = match name {
        "hotcold" => env!("WORKLOAD_HOTCOLD"),
        "spinner" => env!("WORKLOAD_SPINNER"),
        "syscalls" => env!("WORKLOAD_SYSCALLS"),
        "multithread" => env!("WORKLOAD_MULTITHREAD"),
        "shortlived" => env!("WORKLOAD_SHORTLIVED"),
        "manystacks" => env!("WORKLOAD_MANYSTACKS"),
        "nofp" => env!("WORKLOAD_NOFP"),
        "nofp_signal" => env!("WORKLOAD_NOFP_SIGNAL"),
        "nofp_dlsym" => env!("WORKLOAD_NOFP_DLSYM"),
        "nofp_ibt" => env!("WORKLOAD_NOFP_IBT"),
        "nofp_dlopen" => env!("WORKLOAD_NOFP_DLOPEN"),
        "nofp_realign" => env!("WORKLOAD_NOFP_REALIGN"),
        "libhot" => env!("WORKLOAD_LIBHOT"),
        "rustwork_nofp" => env!("WORKLOAD_RUSTWORK_NOFP"),
        "rustwork_fp" => env!("WORKLOAD_RUSTWORK_FP"),
        other => panic!("unknown workload {other:?}"),
    };
    PathBuf::from(path)
}

// ---------------------------------------------------------------------------
// Workload processes
// ---------------------------------------------------------------------------

/// A spawned child process (usually a workload). It is reaped by a
/// background thread as soon as it exits (as a real parent would: a zombie
/// would still look alive in /proc) and killed with SIGKILL on drop if it is
/// still running.
pub struct Workload {
    pid: u32,
    state: Arc<Mutex<ChildState>>,
    waiter: Option<JoinHandle<()>>,
}

struct ChildState {
    child: Child,
    status: Option<ExitStatus>,
}

impl Workload {
    /// Spawns the named workload with `args`; stdio is discarded.
    pub fn spawn(name: &str, args: &[&str]) -> Workload {
        let mut cmd = Command::new(workload_path(name));
        cmd.args(args);
        Workload::spawn_command(cmd)
    }

    /// Spawns an arbitrary command (stdin/stdout null, stderr inherited).
    pub fn spawn_command(mut cmd: Command) -> Workload {
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        let pid = child.id();
        let state = Arc::new(Mutex::new(ChildState {
            child,
            status: None,
        }));
        let waiter_state = Arc::clone(&state);
        let waiter = thread::spawn(move || {
            // Wait without reaping, then reap under the lock: `Drop` only
            // signals the pid while holding the lock and before the reap, so
            // it can never hit a recycled pid.
            // SAFETY: plain syscall on a zeroed siginfo_t we own.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            loop {
                let rc = unsafe {
                    libc::waitid(
                        libc::P_PID,
                        pid as libc::id_t,
                        &mut info,
                        libc::WEXITED | libc::WNOWAIT,
                    )
                };
                if rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    break;
                }
            }
            let mut st = waiter_state.lock().unwrap_or_else(|e| e.into_inner());
            if st.status.is_none() {
                st.status = st.child.wait().ok();
            }
        });
        Workload {
            pid,
            state,
            waiter: Some(waiter),
        }
    }

    /// Host pid of the process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Exit status, once the process has exited and been reaped.
    pub fn status(&self) -> Option<ExitStatus> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).status
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.status() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Total CPU time (user + system, all threads) consumed so far, from
    /// /proc/PID/stat.
    pub fn cpu_time(&self) -> Duration {
        process_cpu_time(self.pid).unwrap_or_else(|| panic!("cannot read CPU time of {}", self.pid))
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.status.is_none() {
                // Not reaped yet, so the pid is still ours (alive or zombie).
                let _ = st.child.kill();
            }
        }
        if let Some(waiter) = self.waiter.take() {
            let _ = waiter.join();
        }
    }
}

/// CPU time (utime + stime) of a process, or None if it is gone.
pub fn process_cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised comm; utime and stime are fields 14, 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_nanos((utime + stime) * 1_000_000_000 / hz))
}

/// Fields of /proc/PID/status relevant to pid namespaces.
#[derive(Debug, Clone)]
pub struct ProcStatus {
    pub name: String,
    pub ppid: u32,
    /// NSpid: the pid in each pid namespace, outermost first.
    pub nspid: Vec<u32>,
}

/// Parses /proc/PID/status, or None if the process is gone.
pub fn proc_status(pid: u32) -> Option<ProcStatus> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut name = String::new();
    let mut ppid = 0;
    let mut nspid = Vec::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Name:") {
            name = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("PPid:") {
            ppid = v.trim().parse().ok()?;
        } else if let Some(v) = line.strip_prefix("NSpid:") {
            nspid = v
                .split_whitespace()
                .map(|p| p.parse().ok())
                .collect::<Option<Vec<u32>>>()?;
        }
    }
    Some(ProcStatus { name, ppid, nspid })
}

/// All pids currently in /proc.
pub fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("reading /proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Whether `pid` has `ancestor` among its parents (transitively).
pub fn is_descendant_of(pid: u32, ancestor: u32) -> bool {
    let mut cur = pid;
    for _ in 0..64 {
        match proc_status(cur) {
            Some(st) if st.ppid == ancestor => return true,
            Some(st) if st.ppid > 1 => cur = st.ppid,
            _ => return false,
        }
    }
    false
}

/// Inode number of the pid namespace of `pid` (readlink /proc/PID/ns/pid ->
/// `pid:[INODE]`).
pub fn pid_ns_inode(pid: u32) -> u64 {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/pid"))
        .unwrap_or_else(|e| panic!("readlink /proc/{pid}/ns/pid: {e}"));
    let text = link.to_string_lossy();
    text.strip_prefix("pid:[")
        .and_then(|s| s.strip_suffix(']'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected /proc/{pid}/ns/pid link {text:?}"))
}

/// Polls `f` every 20 ms until it returns Some or `timeout` passes.
pub fn poll_until<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Running bpfprof
// ---------------------------------------------------------------------------

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
pub fn spawn_bpfprof_command(mut cmd: Command) -> BpfprofProcess {
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

// ---------------------------------------------------------------------------
// Folded output
// ---------------------------------------------------------------------------

/// A parsed folded (collapsed-stack) profile: frames root first, the first
/// frame being the process name, kernel frames suffixed `_[k]`.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub stacks: BTreeMap<Vec<String>, u64>,
}

/// Whether a folded frame is a kernel frame (`name_[k]`).
pub fn is_kernel_frame(frame: &str) -> bool {
    frame.ends_with("_[k]")
}

/// The user frames of a folded stack (root first, without the process name).
pub fn user_frames(frames: &[String]) -> Vec<&str> {
    frames
        .iter()
        .skip(1)
        .filter(|f| !is_kernel_frame(f))
        .map(String::as_str)
        .collect()
}

impl Profile {
    /// Parses folded text; panics on a malformed line.
    pub fn parse(text: &str) -> Profile {
        let mut stacks = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (stack, count) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("folded line {} has no count: {line:?}", i + 1));
            let count: u64 = count
                .parse()
                .unwrap_or_else(|e| panic!("folded line {} bad count ({e}): {line:?}", i + 1));
            assert!(
                !stack.is_empty(),
                "folded line {} has an empty stack",
                i + 1
            );
            let frames: Vec<String> = stack.split(';').map(str::to_string).collect();
            assert!(
                frames.iter().all(|f| !f.is_empty()),
                "folded line {} has an empty frame: {line:?}",
                i + 1
            );
            *stacks.entry(frames).or_insert(0) += count;
        }
        Profile { stacks }
    }

    /// Reads and parses a folded file.
    pub fn read(path: &Path) -> Profile {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading folded profile {}: {e}", path.display()));
        Profile::parse(&text)
    }

    /// Total number of samples.
    pub fn total(&self) -> u64 {
        self.stacks.values().sum()
    }

    /// Samples whose stack satisfies `pred`.
    pub fn count_where(&self, mut pred: impl FnMut(&[String]) -> bool) -> u64 {
        self.stacks
            .iter()
            .filter(|(frames, _)| pred(frames))
            .map(|(_, n)| n)
            .sum()
    }

    /// Samples whose stack contains `frame` anywhere.
    pub fn count_containing(&self, frame: &str) -> u64 {
        self.count_where(|f| f.iter().any(|x| x == frame))
    }

    /// Samples whose last frame is `frame`.
    pub fn count_leaf(&self, frame: &str) -> u64 {
        self.count_where(|f| f.last().is_some_and(|x| x == frame))
    }

    /// Samples whose last non-kernel frame is `frame` (the user-space leaf,
    /// ignoring kernel frames appended after it).
    pub fn count_user_leaf(&self, frame: &str) -> u64 {
        self.count_where(|f| {
            f.iter()
                .skip(1)
                .rev()
                .find(|x| !is_kernel_frame(x))
                .is_some_and(|x| x == frame)
        })
    }

    /// Share (0..=1) of all samples whose stack contains `frame`.
    pub fn share_containing(&self, frame: &str) -> f64 {
        ratio(self.count_containing(frame), self.total())
    }

    /// Share (0..=1) of all samples whose last frame is `frame`.
    pub fn share_leaf(&self, frame: &str) -> f64 {
        ratio(self.count_leaf(frame), self.total())
    }

    /// Samples in which `child` appears directly under `parent`
    /// (`...;parent;child;...`).
    pub fn count_directly_under(&self, child: &str, parent: &str) -> u64 {
        self.count_where(|f| f.windows(2).any(|w| w[0] == parent && w[1] == child))
    }

    /// Samples in which `ancestor` appears somewhere before (root-ward of) `frame`.
    pub fn count_with_ancestor(&self, frame: &str, ancestor: &str) -> u64 {
        self.count_where(|f| {
            let Some(pos) = f.iter().position(|x| x == frame) else {
                return false;
            };
            f[..pos].iter().any(|x| x == ancestor)
        })
    }

    /// Whether any stack contains `frame`.
    pub fn has_frame(&self, frame: &str) -> bool {
        self.count_containing(frame) > 0
    }

    /// Samples grouped by the first frame (the process name).
    pub fn by_comm(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for (frames, n) in &self.stacks {
            *m.entry(frames[0].clone()).or_insert(0) += n;
        }
        m
    }

    /// The `n` heaviest stacks, for failure messages.
    pub fn top(&self, n: usize) -> String {
        let mut v: Vec<_> = self.stacks.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1));
        let mut s = format!(
            "{} samples in {} stacks; top:\n",
            self.total(),
            self.stacks.len()
        );
        for (frames, count) in v.into_iter().take(n) {
            let _ = writeln!(s, "  {count:6} {}", frames.join(";"));
        }
        s
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

// ---------------------------------------------------------------------------
// Summary JSON
// ---------------------------------------------------------------------------

/// The `--summary-json` document, with accessors that panic with a clear
/// message when a field is missing or has the wrong type.
#[derive(Debug, Clone)]
pub struct Summary(pub serde_json::Value);

impl Summary {
    pub fn read(path: &Path) -> Summary {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading summary {}: {e}", path.display()));
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("summary {} is not JSON ({e}):\n{text}", path.display()));
        Summary(value)
    }

    #[track_caller]
    pub fn field(&self, key: &str) -> &serde_json::Value {
        self.0
            .get(key)
            .unwrap_or_else(|| panic!("summary has no field {key:?}: {}", self.0))
    }

    #[track_caller]
    pub fn u64(&self, key: &str) -> u64 {
        self.field(key)
            .as_u64()
            .unwrap_or_else(|| panic!("summary field {key:?} is not a u64: {}", self.0))
    }

    #[track_caller]
    pub fn f64(&self, key: &str) -> f64 {
        self.field(key)
            .as_f64()
            .unwrap_or_else(|| panic!("summary field {key:?} is not a number: {}", self.0))
    }

    #[track_caller]
    pub fn str(&self, key: &str) -> &str {
        self.field(key)
            .as_str()
            .unwrap_or_else(|| panic!("summary field {key:?} is not a string: {}", self.0))
    }

    #[track_caller]
    pub fn bool(&self, key: &str) -> bool {
        self.field(key)
            .as_bool()
            .unwrap_or_else(|| panic!("summary field {key:?} is not a bool: {}", self.0))
    }

    pub fn samples(&self) -> u64 {
        self.u64("samples")
    }

    pub fn event(&self) -> &str {
        self.str("event")
    }

    pub fn exit(&self) -> &str {
        self.str("exit")
    }

    pub fn program_id(&self) -> u32 {
        self.u64("program_id") as u32
    }

    #[track_caller]
    pub fn targets(&self) -> &Vec<serde_json::Value> {
        self.field("targets")
            .as_array()
            .unwrap_or_else(|| panic!("summary field \"targets\" is not an array: {}", self.0))
    }
}

// ---------------------------------------------------------------------------
// Misc
// ---------------------------------------------------------------------------

/// Copies the bpfprof binary into a fresh 0755 temp directory as a 0755 file,
/// so that an unprivileged user can execute it (the workspace may live under
/// /root, which `nobody` cannot traverse). Returns the directory guard and
/// the binary path.
pub fn world_executable_bpfprof() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("bpfprof-bin-")
        .tempdir()
        .expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod temp dir");
    let bin = dir.path().join("bpfprof");
    copy_executable(bpfprof_bin(), &bin, &["--version"]);
    (dir, bin)
}

/// Copies an executable (mode 0755) and waits until it runs with `probe_args`: another test
/// thread forking while the copy's write fd was open holds that fd until it execs, and exec
/// of the copy fails with ETXTBSY meanwhile.
pub fn copy_executable(src: &Path, dst: &Path, probe_args: &[&str]) {
    std::fs::copy(src, dst).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let ran = poll_until(Duration::from_secs(5), || {
        match Command::new(dst)
            .args(probe_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
        {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => None,
            other => Some(other),
        }
    });
    assert!(
        matches!(ran, Some(Ok(_))),
        "cannot run {}: {ran:?}",
        dst.display()
    );
}

/// A temp directory for outputs.
/// Writes `bytes` of pseudo-random lowercase text to `path`: input that `xz -9` compresses
/// slowly, so that a compressor outlasts a short run.
pub fn write_random_text(path: &Path, bytes: usize) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let text: Vec<u8> = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 26) as u8
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("bpfprof-test-")
        .tempdir()
        .expect("temp dir")
}

/// Whether an executable is on PATH (or in /usr/sbin, /sbin).
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether a BPF program with this id currently exists in the kernel,
/// according to `bpftool prog show id N`.
pub fn bpf_prog_exists(bpftool: &Path, id: u32) -> bool {
    Command::new(bpftool)
        .args(["prog", "show", "id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("running bpftool")
        .success()
}

/// Collects failed checks so that one run reports all of them; panics in
/// [`Checks::finish`] (or on drop, if not finished) when any failed.
#[derive(Debug, Default)]
pub struct Checks {
    failures: Vec<String>,
    finished: bool,
}

impl Checks {
    pub fn new() -> Checks {
        Checks::default()
    }

    /// Whether no check has failed so far.
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty()
    }

    /// Records `msg` as a failure unless `ok`.
    pub fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(msg());
        }
    }

    /// Records a failure unless `actual == expected`.
    pub fn eq<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, actual: T, expected: T) {
        if actual != expected {
            self.failures
                .push(format!("{what}: got {actual:?}, expected {expected:?}"));
        }
    }

    /// Panics listing every failed check, if any.
    #[track_caller]
    pub fn finish(mut self) {
        self.finished = true;
        let failures = std::mem::take(&mut self.failures);
        if !failures.is_empty() {
            panic!(
                "{} check(s) failed:\n- {}",
                failures.len(),
                failures.join("\n- ")
            );
        }
    }
}

impl Drop for Checks {
    fn drop(&mut self) {
        if !self.finished && !self.failures.is_empty() && !std::thread::panicking() {
            panic!(
                "unfinished checks failed:\n- {}",
                self.failures.join("\n- ")
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The daemon and unprivileged users
// ---------------------------------------------------------------------------

/// How long daemon operations in tests may take.
pub const DAEMON_TIMEOUT: Duration = Duration::from_secs(60);

/// A daemon on a private socket and state directory, stopped on drop.
pub struct Daemon {
    process: Option<BpfprofProcess>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl Daemon {
    pub fn start(extra: &[&str]) -> Daemon {
        Daemon::start_in(tempdir(), extra)
    }

    /// Starts a daemon whose socket and state (`state/`) live in `dir`.
    pub fn start_in(dir: tempfile::TempDir, extra: &[&str]) -> Daemon {
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
        let process = spawn_bpfprof(&args);
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

/// How many perf events process `pid` holds open (`anon_inode:[perf_event]` descriptors).
pub fn perf_event_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|target| target.to_string_lossy() == "anon_inode:[perf_event]")
                .count()
        })
        .unwrap_or(0)
}

/// A real non-root user of this machine, created for the tests.
#[derive(Clone, Debug)]
pub struct TestUser {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

fn id_of(name: &str, flag: &str) -> Option<u32> {
    let out = Command::new("id").args([flag, name]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// The test user `name` (e.g. `bpfprof-t1`), created with `useradd --system` on first use.
/// Test binaries run concurrently, so a `useradd` that loses the race for the password
/// file's lock is retried.
pub fn test_user(name: &str) -> TestUser {
    let found = poll_until(Duration::from_secs(30), || {
        if let (Some(uid), Some(gid)) = (id_of(name, "-u"), id_of(name, "-g")) {
            return Some((uid, gid));
        }
        let _ = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        None
    });
    let (uid, gid) = found.unwrap_or_else(|| panic!("cannot create test user {name}"));
    TestUser {
        name: name.to_string(),
        uid,
        gid,
    }
}

impl TestUser {
    /// A command that runs `program` as this user, with no supplementary groups and no
    /// capabilities.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.args([
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.gid),
            "--clear-groups".into(),
            "--".into(),
        ])
        .arg(program);
        cmd
    }
}

// ---------------------------------------------------------------------------
// The Python package
// ---------------------------------------------------------------------------

/// The Python package installed into a fresh venv (once per test process) the way a user
/// does it, `pip install ./python`, offline; returns its `strobeclient` console script.
pub fn python_console_script() -> &'static Path {
    static SCRIPT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &SCRIPT
        .get_or_init(|| {
            let dir = tempdir();
            std::fs::set_permissions(
                dir.path(),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .unwrap();
            // A copy of the package, so that the build's scratch files stay out of the tree.
            let source = dir.path().join("python");
            let copied = Command::new("cp")
                .arg("-r")
                .arg(workspace_root().join("python"))
                .arg(&source)
                .status()
                .expect("cp");
            assert!(copied.success());
            let _ = std::fs::remove_dir_all(source.join("build"));
            // The system interpreter: one the test user can run (not one under /root).
            // --system-site-packages gives pip Debian's setuptools and wheel, so the
            // install needs no network.
            let venv = dir.path().join("venv");
            let made = Command::new("/usr/bin/python3")
                .args(["-m", "venv", "--system-site-packages"])
                .arg(&venv)
                .status()
                .expect("python3 -m venv");
            assert!(made.success(), "python3 -m venv failed");
            let out = Command::new(venv.join("bin/pip"))
                .args([
                    "install",
                    "--quiet",
                    "--no-index",
                    "--no-build-isolation",
                    "--no-deps",
                ])
                .arg(&source)
                .output()
                .expect("pip install");
            assert!(
                out.status.success(),
                "pip install ./python failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let script = venv.join("bin/strobeclient");
            assert!(script.is_file(), "pip installed no strobeclient script");
            (dir, script)
        })
        .1
}
