//! What the kernel program counted: per-run counters, sample delivery, and BPF run-time
//! statistics.

use anyhow::anyhow;
use profiler_common::{Counter, INVOCATIONS_INDEX, PYTHON_STACKS_STORED_INDEX};

use super::program::{kernel_err, KernelProgram};
use crate::error::{Error, Result};

/// Per-run counters summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters(pub [u64; Counter::COUNT as usize]);

impl Counters {
    /// The value of one counter.
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize]
    }
}

impl KernelProgram {
    /// Turns on the kernel's BPF run-time statistics while this program lives (they cost two
    /// clock reads per BPF program run, system-wide, so they are opt-in).
    pub fn enable_run_stats(&mut self) -> Result<()> {
        let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .map_err(|e| Error::Kernel(anyhow!(e).context("enabling BPF run-time statistics")))?;
        self.stats_fd = Some(fd);
        Ok(())
    }

    /// Total run time (ns) and runs of the program since attach, when statistics are on
    /// (`--bpf-stats`, or the `kernel.bpf_stats_enabled` sysctl).
    pub fn run_stats(&self) -> Option<(u64, u64)> {
        let (t0, n0) = self.stats_at_attach?;
        let (t1, n1) = self.raw_run_stats()?;
        Some((t1.saturating_sub(t0), n1.saturating_sub(n0)))
    }

    /// Total run time (ns) and runs of the off-CPU program since it was attached (every
    /// context switch of the machine runs it), when statistics are on; `None` when no run
    /// recorded off-CPU time.
    pub fn off_cpu_run_stats(&self) -> Option<(u64, u64)> {
        let (t0, n0) = self.off_cpu_stats_at_attach?;
        let (t1, n1) = self.program_run_stats(self.off_cpu_program_id)?;
        Some((t1.saturating_sub(t0), n1.saturating_sub(n0)))
    }

    pub(super) fn raw_run_stats(&self) -> Option<(u64, u64)> {
        self.program_run_stats(self.program_id)
    }

    pub(super) fn program_run_stats(&self, program_id: u32) -> Option<(u64, u64)> {
        let enabled = self.stats_fd.is_some()
            || std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
                .map(|s| s.trim() == "1")
                .unwrap_or(false);
        if !enabled {
            return None;
        }
        // By id rather than through the object, which the walker thread may hold. A tail call
        // runs inside its caller's accounting, so this includes the walker's time.
        let info = aya::programs::loaded_programs()
            .filter_map(|p| p.ok())
            .find(|p| p.id() == program_id)?;
        Some((info.run_time().as_nanos() as u64, info.run_count()))
    }

    /// Samples the attached events should have delivered so far (from their own counts and the
    /// mean period), and how many the program was run for; None where the expectation is
    /// unknown (cycles at a frequency, which the kernel retunes) or nothing is attached.
    pub fn delivery(&self) -> Option<(f64, u64)> {
        let events = self.events.as_ref()?;
        let sampling = self.sampling?;
        let count = events.count().ok()? as f64;
        let expected = match (sampling.event, sampling.rate) {
            (crate::sampling::Event::CpuClock, _) => count * sampling.nominal_hz / 1e9,
            (crate::sampling::Event::Cycles, crate::sampling::Rate::Period(p)) => count / p as f64,
            (crate::sampling::Event::Cycles, crate::sampling::Rate::Frequency(_)) => return None,
        };
        let taken: u64 = self.counters.get(&INVOCATIONS_INDEX, 0).ok()?.iter().sum();
        Some((expected, taken))
    }

    /// How many runtime stacks the program has stored new in its stack map so far (all runs);
    /// `None` where the count cannot be read.
    pub fn runtime_stacks_stored(&self) -> Option<u64> {
        Some(
            self.counters
                .get(&PYTHON_STACKS_STORED_INDEX, 0)
                .ok()?
                .iter()
                .sum(),
        )
    }

    /// Zeroes the counters of `run`, before a new run takes the slot.
    pub fn reset_counters(&mut self, run: u32) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(path, e)| kernel_err(anyhow!("{path}: {e}")))?;
        for counter in Counter::ALL {
            let zeros = aya::maps::PerCpuValues::try_from(vec![0u64; cpus]).map_err(kernel_err)?;
            self.counters
                .set(counter.index(run), zeros, 0)
                .map_err(kernel_err)?;
        }
        self.waits_counted_at_end.remove(&run);
        self.clear_stopped(run);
        Ok(())
    }

    /// Counter `counter` of `run`, summed over CPUs: one read of the map, where
    /// [`Self::counters`] makes one per counter (a tick that wants the sample count alone
    /// made 20 system calls for it).
    pub fn counter(&self, run: u32, counter: Counter) -> Result<u64> {
        let values = self
            .counters
            .get(&counter.index(run), 0)
            .map_err(kernel_err)?;
        Ok(values.iter().sum())
    }

    /// The counters of `run`, summed over CPUs.
    pub fn counters(&self, run: u32) -> Result<Counters> {
        let mut out = Counters::default();
        for counter in Counter::ALL {
            out.0[counter as usize] = self.counter(run, counter)?;
        }
        // The waits still going at the run's end, counted by userspace.
        out.0[Counter::OffCpuIntervals as usize] +=
            self.waits_counted_at_end.get(&run).copied().unwrap_or(0);
        Ok(out)
    }
}
