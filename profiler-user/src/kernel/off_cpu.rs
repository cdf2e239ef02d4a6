//! Off-CPU time (`sched:sched_switch`): its program verified after the walker, attached while
//! any run records it, and its pending intervals forgotten at a run's end.

use std::os::{fd::AsFd, fd::AsRawFd};

use anyhow::{anyhow, Context};
use aya::{
    programs::{ProgramError, ProgramFd, TracePoint},
    Ebpf,
};
use profiler_common::{
    Config, OffCpuPending, MAX_RUNS, OFF_CPU_PROGRAM_NAME, SCHED_SWITCH_OFFSETS,
};

use super::{
    following::ensure_tracefs,
    load::{clone_fd, load_error},
    program::{kernel_err, KernelProgram},
    walker::Walker,
};
use crate::{
    error::{Error, Result},
    kernel::perf_events::AttachedTracepoint,
    sampling::OffCpu,
};

impl KernelProgram {
    /// Makes `run` record its targets' time off the CPU as `off_cpu` says (the settings are
    /// the program's: the pool gives runs that differ in them different programs), from when
    /// [`Self::attach_off_cpu`] attaches the program. Quick: the first time, the off-CPU program
    /// (which repeats the walker's walks) is verified on the walker's thread, after the walker,
    /// so that [`Self::walker_pending`] holds until both are done.
    pub fn record_off_cpu(&mut self, run: u32, off_cpu: OffCpu) -> Result<()> {
        if run >= MAX_RUNS {
            return Err(Error::Kernel(anyhow!("run slot {run} out of range")));
        }
        check_sched_switch_format()?;
        for (entry, value) in [
            (Config::OffCpuPreempted, u64::from(off_cpu.preempted)),
            (Config::OffCpuMinNs, off_cpu.min_ns),
        ] {
            self.config
                .set(entry as u32, value, 0)
                .map_err(kernel_err)?;
        }
        let verifying =
            self.off_cpu_fd.is_some() || self.off_cpu_error.is_some() || self.off_cpu_runs != 0;
        self.off_cpu_runs |= 1 << run;
        self.config
            .set(Config::OffCpuRuns as u32, self.off_cpu_runs, 0)
            .map_err(kernel_err)?;
        if !verifying {
            let previous = std::mem::replace(&mut self.walker, Walker::Joining);
            self.walker = Walker::Loading(std::thread::spawn(move || {
                let mut loaded = match previous {
                    Walker::Loading(handle) => match handle.join() {
                        Ok(loaded) => loaded,
                        // The thread panicked with the object: nothing can be loaded.
                        Err(payload) => std::panic::resume_unwind(payload),
                    },
                    Walker::Done(loaded) => *loaded,
                    Walker::Joining => unreachable!("the walker is never left joining"),
                };
                loaded.off_cpu = Some(verify_off_cpu(&mut loaded.ebpf));
                loaded
            }));
        }
        Ok(())
    }

    /// Attaches the off-CPU program once verified (waiting for that), for the runs
    /// [`Self::record_off_cpu`] set up; a no-op when attached.
    pub fn attach_off_cpu(&mut self) -> Result<()> {
        if self.off_cpu_tracepoint.is_some() || self.off_cpu_runs == 0 {
            return Ok(());
        }
        self.join_walker();
        let Some(fd) = self.off_cpu_fd.as_ref() else {
            let why = self
                .off_cpu_error
                .clone()
                .unwrap_or_else(|| "the walker thread did not finish".into());
            return Err(Error::Kernel(anyhow!(
                "the off-CPU program did not load: {why}"
            )));
        };
        let tracefs = ensure_tracefs()?;
        let fd = fd.as_fd().as_raw_fd();
        // Before the attach (its setup takes up to a second or two on a loaded machine): a
        // system-wide run scans as soon as it is attached, and a thread that wakes between
        // the attach and the scan loses the part of its wait until then.
        if let Err(e) = self.set_up_wait_scan() {
            log::warn!("the waits that began before a run will be missing: {e:#}");
        }
        let attached = (crate::clock::monotonic_ns(), std::time::Instant::now());
        let tp = AttachedTracepoint::attach(&tracefs, "sched", "sched_switch", fd)
            .map_err(|e| kernel_err(anyhow!(e).context("attaching to sched:sched_switch")))?;
        self.off_cpu_tracepoint = Some(tp);
        self.off_cpu_attached = Some(attached);
        self.off_cpu_stats_at_attach = self.program_run_stats(self.off_cpu_program_id);
        Ok(())
    }

    /// When the off-CPU program was attached (`CLOCK_MONOTONIC` nanoseconds, and as an
    /// instant): from then on it sees every switch-out of the machine.
    pub fn off_cpu_attached(&self) -> Option<(u64, std::time::Instant)> {
        self.off_cpu_tracepoint.as_ref().and(self.off_cpu_attached)
    }

    /// Stops recording off-CPU time for `run` (a no-op for a run that did not): the waits
    /// still going are counted up to now on the stacks they began with, threads still off the
    /// CPU add nothing more to it when they return, and their pending entries forget it. Call
    /// before draining the run's samples.
    pub fn end_off_cpu(&mut self, run: u32) {
        if self.off_cpu_runs & (1 << run) == 0 {
            return;
        }
        self.off_cpu_runs &= !(1 << run);
        let _ = self
            .config
            .set(Config::OffCpuRuns as u32, self.off_cpu_runs, 0);
        if self.off_cpu_runs == 0 {
            // Nothing stays attached to every context switch of the machine once no run asks.
            // Closing the tracepoint waits for an RCU grace period (~80 ms): not here.
            if let Some(tp) = self.off_cpu_tracepoint.take() {
                std::thread::spawn(move || drop(tp));
            }
        }
        let entries: Vec<(u32, OffCpuPending)> =
            self.off_cpu_pending.iter().filter_map(|e| e.ok()).collect();
        self.count_unfinished_waits(run, &entries);
        for (tid, mut pending) in entries {
            if pending.key.runs & (1 << run) == 0 {
                continue;
            }
            pending.key.runs &= !(1 << run);
            let _ = if pending.key.runs == 0 {
                self.off_cpu_pending.remove(&tid)
            } else {
                self.off_cpu_pending.insert(tid, pending, 0)
            };
        }
    }
}

/// Verifies the off-CPU program of `ebpf`: its fd and id, or why the kernel refused it.
fn verify_off_cpu(ebpf: &mut Ebpf) -> std::result::Result<(ProgramFd, u32), String> {
    let started = std::time::Instant::now();
    let tp: &mut TracePoint = ebpf
        .program_mut(OFF_CPU_PROGRAM_NAME)
        .ok_or_else(|| format!("the eBPF object has no {OFF_CPU_PROGRAM_NAME}"))?
        .try_into()
        .map_err(|e: ProgramError| e.to_string())?;
    tp.load()
        .map_err(|e| load_error(e, "the off-CPU program").to_string())?;
    let fd = clone_fd(tp.fd()).map_err(|e| e.to_string())?;
    let id = tp.info().map_err(|e| e.to_string())?.id();
    log::info!(
        "off-CPU program verified in {} ms",
        started.elapsed().as_millis()
    );
    Ok((fd, id))
}

/// Checks that this kernel's `sched_switch` record has `prev_state` and `next_pid` where the
/// off-CPU program reads them ([`SCHED_SWITCH_OFFSETS`]).
fn check_sched_switch_format() -> Result<()> {
    let tracefs = ensure_tracefs()?;
    let path = tracefs.join("events/sched/sched_switch/format");
    let format = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {}", path.display()))
        .map_err(Error::Kernel)?;
    let offset = |field: &str| -> Option<usize> {
        format
            .lines()
            .find(|l| l.contains(&format!(" {field};")))
            .and_then(|l| l.split("offset:").nth(1))
            .and_then(|rest| rest.split(';').next())
            .and_then(|n| n.trim().parse().ok())
    };
    let found = (offset("prev_state"), offset("next_pid"));
    if found != (Some(SCHED_SWITCH_OFFSETS.0), Some(SCHED_SWITCH_OFFSETS.1)) {
        return Err(Error::EventUnsupported(format!(
            "cannot record off-CPU time on this kernel: its sched_switch record has prev_state \
             and next_pid at {found:?}, a layout bpfprof does not know"
        )));
    }
    Ok(())
}
