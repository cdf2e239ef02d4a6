//! Following targets' children (the fork and exit tracepoints) and stopping at exec (the
//! exec tracepoint): which children the kernel follows for a run, and which processes exec'd.

use std::{
    io,
    os::{fd::AsFd, fd::AsRawFd},
};

use anyhow::{anyhow, Context};
use profiler_common::{Config, TargetInfo, FORK_CHILD_PID_OFFSETS, MAX_RUNS};

use super::program::{kernel_err, KernelProgram};
use crate::{
    error::{Error, Result},
    kernel::perf_events::AttachedTracepoint,
};

impl KernelProgram {
    /// Makes the kernel follow the children of `run`'s targets: attaches the fork and exit
    /// tracepoints the first time.
    pub(super) fn follow_children(&mut self, run: u32) -> Result<()> {
        if self.tracepoints.is_empty() {
            let offset = fork_child_pid_offset()?;
            let fork = FORK_CHILD_PID_OFFSETS
                .iter()
                .position(|o| *o as u64 == offset)
                .ok_or_else(|| {
                    Error::EventUnsupported(format!(
                        "cannot follow children on this kernel: its sched_process_fork record \
                         has child_pid at byte {offset}, a layout bpfprof does not know"
                    ))
                })?;
            let tracefs = ensure_tracefs()?;
            for (fd, name) in [
                (&self.fork_fds[fork], "sched_process_fork"),
                (&self.exit_fd, "sched_process_exit"),
            ] {
                let tp =
                    AttachedTracepoint::attach(&tracefs, "sched", name, fd.as_fd().as_raw_fd())
                        .map_err(|e| {
                            kernel_err(anyhow!(e).context(format!("attaching to sched:{name}")))
                        })?;
                self.tracepoints.push(tp);
            }
        }
        self.following_runs |= 1 << run;
        self.write_following()
    }

    fn write_following(&mut self) -> Result<()> {
        self.config
            .set(
                Config::Following as u32,
                u64::from(self.following_runs.count_ones()),
                0,
            )
            .map_err(kernel_err)
    }

    /// Makes `run` stop sampling a process the moment it execs (or not, for a new run in the
    /// slot): the process is reported by [`Self::execed`] and sampled again only once
    /// [`Self::resume_target`] or [`Self::resume_followed`] says so. Attaches the exec
    /// tracepoint the first time.
    pub fn stop_at_exec(&mut self, run: u32, stop: bool) -> Result<()> {
        if run >= MAX_RUNS {
            return Err(Error::Kernel(anyhow!("run slot {run} out of range")));
        }
        if stop {
            self.attach_exec()?;
        }
        if stop {
            self.stop_at_exec_runs |= 1 << run;
        } else {
            self.stop_at_exec_runs &= !(1 << run);
        }
        self.config
            .set(Config::StopAtExec as u32, self.stop_at_exec_runs, 0)
            .map_err(kernel_err)?;
        if !stop {
            // A new run in the slot inherits no exec of the last one's processes.
            self.take_execed(run);
        }
        Ok(())
    }

    /// Attaches the exec tracepoint, the first time.
    fn attach_exec(&mut self) -> Result<()> {
        if self.exec_tracepoint.is_none() {
            let tracefs = ensure_tracefs()?;
            let tp = AttachedTracepoint::attach(
                &tracefs,
                "sched",
                "sched_process_exec",
                self.exec_fd.as_fd().as_raw_fd(),
            )
            .map_err(|e| kernel_err(anyhow!(e).context("attaching to sched:sched_process_exec")))?;
            self.exec_tracepoint = Some(tp);
        }
        Ok(())
    }

    /// Makes the kernel record nothing of the launched command `pid` (a global pid) until it
    /// execs: until then it runs bpfprof's own code (`Command::do_exec;execve`, some 20 ms of
    /// samples), which is no part of the command's profile. Call before it is added as a
    /// target; the exec tracepoint (attached here) ends the wait as the command execs.
    pub fn await_exec(&mut self, pid: u32) -> Result<()> {
        self.attach_exec()?;
        self.config
            .set(Config::AwaitingExec as u32, u64::from(pid), 0)
            .map_err(kernel_err)?;
        self.awaiting_exec = Some(pid);
        Ok(())
    }

    /// Whether the kernel waits for `pid`'s exec before recording it.
    pub(super) fn awaits_exec(&self, pid: u32) -> bool {
        self.awaiting_exec == Some(pid)
    }

    /// Ends the wait of [`Self::await_exec`] (the command exec'd, which the kernel has seen,
    /// or did not and exits).
    pub fn end_await_exec(&mut self) {
        if self.awaiting_exec.take().is_some() {
            let _ = self.config.set(Config::AwaitingExec as u32, 0, 0);
        }
    }

    /// Global pids of the processes that exec'd while `run` sampled them (and stop-at-exec
    /// was on): `run` no longer samples them. Each is reported once.
    pub fn take_execed(&mut self, run: u32) -> Vec<u32> {
        let entries: Vec<(u32, u64)> = self.execed.iter().filter_map(|e| e.ok()).collect();
        let mut pids = Vec::new();
        for (pid, runs) in entries {
            if runs & (1 << run) == 0 {
                continue;
            }
            pids.push(pid);
            // The kernel may set another run's bit meanwhile: a lost bit is found again by
            // that run's own check of its processes' credentials on its next tick.
            let left = runs & !(1 << run);
            let _ = if left == 0 {
                self.execed.remove(&pid)
            } else {
                self.execed.insert(pid, left, 0)
            };
        }
        pids
    }

    /// Samples the followed child `pid` for `run` again (after an exec its owner may profile).
    pub fn resume_followed(&mut self, run: u32, pid: u32) -> Result<()> {
        let mut info = self.followed.get(&pid, 0).unwrap_or_default();
        info.runs |= 1 << run;
        info.follow |= 1 << run;
        self.followed.insert(pid, info, 0).map_err(kernel_err)
    }

    /// Stops sampling the followed child `pid` for `run` (its owner may no longer profile it);
    /// other runs following it keep it.
    pub fn drop_followed(&mut self, run: u32, pid: u32) {
        if let Ok(mut info) = self.followed.get(&pid, 0) {
            info.runs &= !(1 << run);
            info.follow &= !(1 << run);
            let _ = if info.runs == 0 {
                self.followed.remove(&pid)
            } else {
                self.followed.insert(pid, info, 0)
            };
        }
    }

    /// Global pids of the children the kernel follows for `run`.
    pub fn followed(&self, run: u32) -> Vec<u32> {
        self.followed
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(_, info)| info.runs & (1 << run) != 0)
            .map(|(pid, _)| pid)
            .collect()
    }

    /// Stops following `pid` (a thread, not a process, or one no longer wanted).
    pub fn forget_followed(&mut self, pid: u32) {
        let _ = self.followed.remove(&pid);
    }

    /// Stops following children for `run`: its bit leaves every followed child.
    pub fn end_following(&mut self, run: u32) {
        if self.following_runs & (1 << run) == 0 {
            return;
        }
        let entries: Vec<(u32, TargetInfo)> = self.followed.iter().filter_map(|e| e.ok()).collect();
        for (pid, mut info) in entries {
            if info.runs & (1 << run) == 0 {
                continue;
            }
            info.runs &= !(1 << run);
            info.follow &= !(1 << run);
            let _ = if info.runs == 0 {
                self.unwind.unload_process(pid);
                self.followed.remove(&pid)
            } else {
                self.followed.insert(pid, info, 0)
            };
        }
        self.following_runs &= !(1 << run);
        let _ = self.write_following();
    }
}

/// Where the sched_process_fork tracepoint record keeps `child_pid` on this kernel, from its
/// format file in tracefs (mounted here if nothing has mounted it yet).
fn fork_child_pid_offset() -> Result<u64> {
    let tracefs = ensure_tracefs()?;
    let path = tracefs.join("events/sched/sched_process_fork/format");
    let format = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {}", path.display()))
        .map_err(Error::Kernel)?;
    format
        .lines()
        .find(|l| l.contains(" child_pid;"))
        .and_then(|l| l.split("offset:").nth(1))
        .and_then(|rest| rest.split(';').next())
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| Error::Kernel(anyhow!("no child_pid field in {}", path.display())))
}

/// The tracefs mount, mounting it at /sys/kernel/tracing when no one has (as perf needs too).
pub fn ensure_tracefs() -> Result<std::path::PathBuf> {
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if std::path::Path::new(dir).join("events").is_dir() {
            return Ok(dir.into());
        }
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: NUL-terminated strings that outlive the call; no data argument.
    let rc = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(Error::EventUnsupported(format!(
            "following children needs tracefs, which is not mounted and could not be mounted \
             at /sys/kernel/tracing ({e}); mount it, or profile without following children"
        )));
    }
    Ok("/sys/kernel/tracing".into())
}
