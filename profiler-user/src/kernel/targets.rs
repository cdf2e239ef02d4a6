//! Which processes a run keeps samples of: targets added, removed, suspended and resumed in
//! the kernel's target map, with their pid namespaces' slots.

use std::sync::{Arc, Mutex};

use anyhow::anyhow;
use aya::maps::{Array, MapData};
use profiler_common::{Config, PidNamespace, TargetKey, MAX_PID_NAMESPACES, MAX_RUNS};

use super::program::{kernel_err, KernelProgram};
use crate::{
    error::{Error, Result},
    process::target::Target,
};

impl KernelProgram {
    /// Starts keeping the samples of `target` under `run`, and with `follow` those of the
    /// children it forks from now on (and theirs).
    pub fn add_target(&mut self, run: u32, target: &Target, follow: bool) -> Result<()> {
        if run >= MAX_RUNS {
            return Err(Error::Kernel(anyhow!("run slot {run} out of range")));
        }
        if follow {
            self.follow_children(run)?;
        }
        let slot = match self.namespace_slots.get_mut(&target.ns) {
            Some((slot, users)) => {
                *users += 1;
                *slot
            }
            None => {
                let used: Vec<u32> = self.namespace_slots.values().map(|(s, _)| *s).collect();
                let slot = (0..MAX_PID_NAMESPACES)
                    .find(|s| !used.contains(s))
                    .ok_or_else(|| Error::InvalidTarget {
                        spec: format!("{}:{}", target.ns.ino, target.ns_pid),
                        reason: format!(
                            "at most {MAX_PID_NAMESPACES} pid namespaces can be profiled at once"
                        ),
                    })?;
                self.namespaces
                    .set(slot, target.ns, 0)
                    .map_err(kernel_err)?;
                self.namespace_slots.insert(target.ns, (slot, 1));
                slot
            }
        };
        log::debug!(
            "target pid {} = {}:{} in namespace slot {slot}, run {run}",
            target.pid,
            target.ns.ino,
            target.ns_pid
        );
        let key = target_key(target);
        if self.off_cpu_runs & (1 << run) != 0 {
            // Taken before the kernel sees it as a target: a wait the scan finds then began
            // before this (see `scan_waits`).
            self.targets_added_ns
                .insert((run, target.pid), crate::clock::monotonic_ns());
        }
        // Another run may watch the same process: add this run's bit to its entry.
        let mut info = self.targets.get(&key, 0).unwrap_or_default();
        info.runs |= 1 << run;
        if follow {
            info.follow |= 1 << run;
        }
        self.targets
            .insert(key, info, 0)
            .map_err(|e| Error::Kernel(anyhow!(e).context("registering the target")))
    }

    /// Stops keeping the samples of `target` for `run`; other runs watching it keep theirs.
    pub fn remove_target(&mut self, run: u32, target: &Target) -> Result<()> {
        let key = target_key(target);
        if let Ok(mut info) = self.targets.get(&key, 0) {
            info.runs &= !(1 << run);
            info.follow &= !(1 << run);
            let _ = if info.runs == 0 {
                // No run watches it any more: its unwind tables go too.
                self.unwind.unload_process(target.pid);
                self.targets.remove(&key)
            } else {
                self.targets.insert(key, info, 0)
            };
        }
        if let Some((slot, users)) = self.namespace_slots.get_mut(&target.ns) {
            *users -= 1;
            if *users == 0 {
                let slot = *slot;
                self.namespace_slots.remove(&target.ns);
                self.namespaces
                    .set(slot, PidNamespace::default(), 0)
                    .map_err(kernel_err)?;
            }
        }
        Ok(())
    }

    /// Samples `target` for `run` again after an exec that its owner may profile.
    pub fn resume_target(&mut self, run: u32, target: &Target, follow: bool) -> Result<()> {
        let key = target_key(target);
        let mut info = self.targets.get(&key, 0).map_err(kernel_err)?;
        info.runs |= 1 << run;
        if follow {
            info.follow |= 1 << run;
        }
        self.targets.insert(key, info, 0).map_err(kernel_err)
    }

    /// Stops sampling the direct target `target` for `run` at once, keeping its namespace slot
    /// (the run's [`Self::remove_target`] at its end releases that).
    pub fn suspend_target(&mut self, run: u32, target: &Target) {
        let key = target_key(target);
        if let Ok(mut info) = self.targets.get(&key, 0) {
            info.runs &= !(1 << run);
            info.follow &= !(1 << run);
            let _ = self.targets.insert(key, info, 0);
        }
    }
}

/// Stops one run's sampling at once, from any thread, without the program (whose owner may be
/// in the middle of a long tick, holding it): the run's bit goes into `Config::StoppedRuns`,
/// and the kernel records no sample and no new wait for it from then on. Other runs of the
/// program go on (a daemon's runs share programs, so their events cannot be switched off).
pub struct RunStopper {
    config: Arc<Mutex<Array<MapData, u64>>>,
    run: u32,
}

impl RunStopper {
    /// Stops the run's sampling.
    pub fn stop(&self) {
        let mut config = self.config.lock().unwrap_or_else(|p| p.into_inner());
        set_stopped(&mut config, self.run, true);
    }
}

/// Sets or clears `run`'s bit in `Config::StoppedRuns` (the caller holds the lock).
fn set_stopped(config: &mut Array<MapData, u64>, run: u32, stopped: bool) {
    let index = Config::StoppedRuns as u32;
    let runs = config.get(&index, 0).unwrap_or(0);
    let runs = if stopped {
        runs | 1 << run
    } else {
        runs & !(1 << run)
    };
    if let Err(e) = config.set(index, runs, 0) {
        log::warn!("run {run}: cannot mark it stopped in the kernel: {e}");
    }
}

impl KernelProgram {
    /// A stopper for `run` (see [`RunStopper`]).
    pub fn run_stopper(&self, run: u32) -> RunStopper {
        RunStopper {
            config: self.stopped_runs.clone(),
            run,
        }
    }

    /// Lets `run` record again: a new run takes its slot.
    pub(super) fn clear_stopped(&mut self, run: u32) {
        let mut config = self.stopped_runs.lock().unwrap_or_else(|p| p.into_inner());
        set_stopped(&mut config, run, false);
    }
}

pub(super) fn target_key(target: &Target) -> TargetKey {
    TargetKey {
        ns: target.ns,
        tgid: target.ns_pid,
        reserved: 0,
    }
}
