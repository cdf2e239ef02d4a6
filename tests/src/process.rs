//! Processes: spawned workloads (reaped at once, killed on drop), and what `/proc` says about
//! any process (CPU time, pid namespaces, ancestry, perf event fds); polling until a condition.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::env::workload_path;

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
        if cmd.get_program() == "setpriv" {
            // A test user's command starts as `setpriv`, which changes its ids (leaving it
            // undumpable, so no one but root may profile it) and then execs the program:
            // return once the program runs, as it would for a user who started it.
            poll_until(Duration::from_secs(10), || {
                let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
                (!exe.is_some_and(|e| e.ends_with("setpriv"))).then_some(())
            });
        }
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

/// Runs `cmd` to its end and returns its output; panics, naming `what` and printing its stderr,
/// unless it exited with 0.
#[track_caller]
pub fn output_ok(cmd: &mut Command, what: &str) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert_ok(&out, what);
    out
}

/// Panics, naming `what` and printing its stderr, unless `out` is of a command that exited
/// with 0.
#[track_caller]
pub fn assert_ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `unshare` that mounts a proc file system at `root`/proc and then execs the arguments the
/// caller appends (`chroot ROOT PROGRAM ...`), for programs in a chroot that read /proc (a
/// JVM reads /proc/self at start, PyTorch /proc/PID/ns/pid). The mount is made in a mount
/// namespace of the command's own, so it goes with the command however that ends and nothing
/// else sees it; every step execs the next, so the command's pid is the program's.
pub fn with_proc_in(root: &str) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!("mount -t proc proc {root}/proc && exec \"$@\""))
        .arg("sh");
    command
}
