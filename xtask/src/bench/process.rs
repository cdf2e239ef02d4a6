//! Watching the processes a run starts: waiting for output lines, CPU time and peak memory,
//! a watchdog for hung profilers, signals, the monotonic clock, and BPF run-time statistics.

use std::fs;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::plan::BPF_STATS;
use super::records::Usage;

/// Reads lines until one starts with `prefix`, returning it.
pub(super) fn wait_for(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    prefix: &str,
) -> Result<String> {
    for line in lines {
        let line = line?;
        if line.starts_with(prefix) {
            return Ok(line);
        }
    }
    bail!("the workload ended without printing {prefix:?}")
}

/// Kills and reaps a target started with `spawn_target`.
pub(super) fn stop_target(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends `sig` to `child`.
pub(super) fn signal(child: &Child, sig: i32) {
    // SAFETY: signalling our own child, which has not been reaped yet.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// Waits for `child`, returning its exit status (128 + signal if killed), its CPU time (from
/// `wait4`) and its peak RSS (from `monitor`).
///
/// Not `wait4`'s `ru_maxrss`: a child spawned with vfork, as `Command` does, records the
/// parent's peak at its exec, so it would report xtask's memory whenever that is larger.
pub(super) fn wait_usage(child: &mut Child, monitor: Monitor) -> Result<(i32, Usage)> {
    let pid = child.id() as i32;
    // Wait for the exit without reaping, so that the monitor can no longer signal a pid that
    // might be reused once reaped.
    loop {
        // SAFETY: an all-zero siginfo is valid; waitid fills it for our own child.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child with a valid out-pointer.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        ensure!(
            err.kind() == std::io::ErrorKind::Interrupted,
            "waitid({pid}): {err}"
        );
    }
    let (peak_kib, last_kib) = monitor.finish();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child with valid out-pointers.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if rc == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        ensure!(
            err.kind() == std::io::ErrorKind::Interrupted,
            "wait4({pid}): {err}"
        );
    }
    // Reaped here, behind `Child`'s back: callers must not signal or wait for it again.
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((
        code,
        Usage {
            cpu_secs: secs(usage.ru_utime) + secs(usage.ru_stime),
            max_rss_kib: peak_kib,
            last_rss_kib: last_kib,
        },
    ))
}

/// CLOCK_MONOTONIC in ns: the clock the workloads print, and bpftrace's `nsecs`.
pub(super) fn mono_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid; clock_gettime fills it.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The last lines of a log file, for error messages.
pub(super) fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// Watches a child: its peak RSS (`VmHWM`, a high-water mark, read every few milliseconds, so
/// only growth in its last milliseconds can be missed), and a watchdog that kills it if it
/// outlives its limit (a hung profiler must not hang the bench).
pub(super) struct Monitor {
    done: Arc<AtomicBool>,
    pub(super) thread: Option<std::thread::JoinHandle<(f64, f64)>>,
}

impl Monitor {
    /// Starts watching `pid`, which must have exec'd already (as it has when `spawn` returns).
    pub(super) fn new(pid: i32, limit: Duration) -> Monitor {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + limit;
            let (mut peak, mut last) = (0f64, f64::NAN);
            while !flag.load(Ordering::Relaxed) {
                if let Some((hwm, rss)) = vm_kib(pid) {
                    peak = peak.max(hwm);
                    last = rss;
                }
                if Instant::now() > deadline {
                    eprintln!("xtask bench: pid {pid} ran past {limit:?}, killing it");
                    // SAFETY: our child, not reaped before `finish` has joined this thread.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (peak, last)
        });
        Monitor {
            done,
            thread: Some(thread),
        }
    }

    /// Stops watching; returns the peak RSS and the last RSS seen, in KiB.
    fn finish(mut self) -> (f64, f64) {
        self.done.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or((f64::NAN, f64::NAN))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// The peak RSS of process `pid` so far and its RSS now, in KiB.
fn vm_kib(pid: i32) -> Option<(f64, f64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

/// Turns on `kernel.bpf_stats_enabled` and restores its old value when dropped.
pub(super) struct BpfStatsGuard {
    old: String,
}

impl BpfStatsGuard {
    /// Turns the statistics on, keeping the old value to restore.
    pub(super) fn enable() -> Result<BpfStatsGuard> {
        let old = fs::read_to_string(BPF_STATS)?.trim().to_string();
        fs::write(BPF_STATS, "1").context("enabling BPF statistics")?;
        Ok(BpfStatsGuard { old })
    }
}

impl Drop for BpfStatsGuard {
    fn drop(&mut self) {
        let _ = fs::write(BPF_STATS, &self.old);
    }
}

/// Run time and count of bpftrace's perf_event programs (its `profile` probe), summed.
///
/// Read from the fdinfo of the program fds bpftrace holds (`bpftool prog show` would need to
/// be built with pid support to say which programs are bpftrace's).
pub(super) fn bpftrace_prog_stats(pid: u32) -> Option<(u64, u64)> {
    let mut total = (0, 0);
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo")).ok()?.flatten() {
        let Ok(info) = fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        // BPF_PROG_TYPE_PERF_EVENT: the `profile` probe.
        if field("prog_type") == Some(7) {
            total.0 += field("run_time_ns").unwrap_or(0);
            total.1 += field("run_cnt").unwrap_or(0);
        }
    }
    (total.1 > 0).then_some(total)
}

/// CPU seconds process `pid` has used (user + system, all threads), from `/proc/PID/stat`.
pub(super) fn proc_cpu_secs(pid: i32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesized command name, which may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks as f64 / hz as f64)
}
