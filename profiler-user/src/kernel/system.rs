//! System-wide runs: every task of the machine (or of a cgroup) sampled, and each process
//! reported as it is first sampled.

use anyhow::anyhow;
use profiler_common::{Config, MAX_RUNS};

use super::program::{kernel_err, KernelProgram};
use crate::error::{Error, Result};

impl KernelProgram {
    /// Makes `run` record every task on the machine (see [`Config::SystemRuns`]) but
    /// bpfprof's own process, kernel threads only when `kernel_threads`, and with `cgroup`
    /// (its id and depth) only the tasks in that cgroup v2 or below it. The program must have
    /// no other run: the samples carry pids of the initial pid namespace.
    pub fn record_system(
        &mut self,
        run: u32,
        kernel_threads: bool,
        cgroup: Option<(u64, u32)>,
    ) -> Result<()> {
        if run >= MAX_RUNS {
            return Err(Error::Kernel(anyhow!("run slot {run} out of range")));
        }
        let (id, level) = cgroup.unwrap_or((0, 0));
        // The settings first, the run's bit last: no sample is taken under half of them.
        for (entry, value) in [
            (Config::SystemExcludeTgid, u64::from(std::process::id())),
            (Config::SystemNoKernelThreads, u64::from(!kernel_threads)),
            (Config::SystemCgroupId, id),
            (Config::SystemCgroupLevel, u64::from(level)),
            (Config::SystemRuns, 1 << run),
        ] {
            self.config
                .set(entry as u32, value, 0)
                .map_err(kernel_err)?;
        }
        Ok(())
    }

    /// Global tgids of the processes the system-wide run sampled for the first time since the
    /// last call, each reported once (until [`Self::forget_system_process`]).
    pub fn take_new_processes(&mut self) -> Vec<u32> {
        let mut pids = Vec::new();
        while let Some(item) = self.new_processes.next() {
            if let Ok(bytes) = <[u8; 4]>::try_from(&*item) {
                pids.push(u32::from_ne_bytes(bytes));
            }
        }
        pids
    }

    /// Makes the system-wide run report `pid` again when it next samples it: the process
    /// exited, and a new process may get its pid.
    pub fn forget_system_process(&mut self, pid: u32) {
        let _ = self.system_seen.remove(&pid);
    }

    /// Stops recording every task for `run` (a no-op for a run that did not).
    pub fn end_system(&mut self, run: u32) {
        let runs = self
            .config
            .get(&(Config::SystemRuns as u32), 0)
            .unwrap_or(0);
        if runs & (1 << run) != 0 {
            let _ = self
                .config
                .set(Config::SystemRuns as u32, runs & !(1 << run), 0);
        }
    }
}
