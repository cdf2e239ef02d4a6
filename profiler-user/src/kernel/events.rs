//! The perf events the sampling program runs on: attached on every online CPU (falling back
//! from `cycles` to `cpu-clock`), detached with the tracepoints.

use std::{
    io,
    os::{fd::AsFd, fd::AsRawFd},
};

use anyhow::anyhow;

use super::program::{is_permission, KernelProgram};
use crate::{
    error::{Error, Result},
    kernel::{perf_events, perf_events::is_missing_event, perf_events::AttachedEvents},
    sampling::{Sampling, SamplingPlan},
};

impl KernelProgram {
    /// Attaches to the first event of `plan` that this machine has, on every online CPU, and
    /// returns it. An explicit `cycles` request on a machine without a PMU is an error.
    pub fn attach(&mut self, plan: &SamplingPlan) -> Result<Sampling> {
        if let Some(cycles) = plan.cycles {
            match self.attach_event(&cycles) {
                Ok(()) => return Ok(cycles),
                Err(e) if is_missing_event(&e) => match plan.cpu_clock {
                    Some(_) => {
                        // Said once, by the run's start line and summary (which name the
                        // fallback); the reason is for `-v`.
                        log::info!(
                            "no hardware PMU on this machine (perf_event_open: {e}); sampling with cpu-clock instead"
                        );
                    }
                    None => {
                        return Err(Error::EventUnsupported(format!(
                            "the cycles event cannot be opened here ({e}): this machine exposes \
                             no hardware PMU (common in VMs); use --event cpu-clock or --event auto"
                        )))
                    }
                },
                Err(e) => return Err(attach_error(e)),
            }
        }
        let clock = plan
            .cpu_clock
            .ok_or_else(|| Error::InvalidSampling("no event to sample with".into()))?;
        self.attach_event(&clock).map_err(attach_error)?;
        Ok(clock)
    }

    fn attach_event(&mut self, sampling: &Sampling) -> io::Result<()> {
        let cpus = aya::util::online_cpus()
            .map_err(|(path, e)| io::Error::new(e.kind(), format!("{path}: {e}")))?;
        let program_fd = self.sample_fd.as_fd().as_raw_fd();
        let events = AttachedEvents::attach(sampling, &cpus, program_fd, sampling.jitter)?;
        self.events = Some(events);
        self.sampling = Some(*sampling);
        self.stats_at_attach = self.raw_run_stats();
        Ok(())
    }

    /// Stops sampling on every CPU and following children; counts and stacks stay readable.
    pub fn detach(&mut self) {
        if let Some(events) = self.events.take() {
            events.detach();
        }
        // Closing a tracepoint's event waits for an RCU grace period (75-85 ms each here,
        // measured with `strace -T`): they close side by side, not one after the other.
        let closing: Vec<_> = self
            .tracepoints
            .drain(..)
            .chain(self.exec_tracepoint.take())
            .chain(self.off_cpu_tracepoint.take())
            .map(|tp| std::thread::spawn(move || drop(tp)))
            .collect();
        for thread in closing {
            let _ = thread.join();
        }
    }

    /// A handle that disables this program's sampling events from another thread; None when
    /// none are attached.
    pub fn event_stopper(&self) -> Option<perf_events::EventStopper> {
        self.events.as_ref().map(AttachedEvents::stopper)
    }
}

fn attach_error(e: io::Error) -> Error {
    if is_permission(&e) {
        return Error::PermissionDenied(format!(
            "the kernel refused to open the perf event ({e}); need CAP_PERFMON or root"
        ));
    }
    if e.raw_os_error() == Some(libc::EINVAL) {
        return Error::InvalidSampling(format!(
            "the kernel rejected the sampling rate ({e}); check kernel.perf_event_max_sample_rate"
        ));
    }
    Error::Kernel(anyhow!(e).context("attaching to perf events"))
}
