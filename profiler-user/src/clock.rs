//! Clocks and bpfprof's own cost: the calling thread's CPU time (what a step costs whatever
//! the machine's load, where its wall time depends on it), the timed steps of a start, and the
//! process's CPU time and peak memory. A leaf every layer may use (the `layers` test lists it
//! as shared): it uses nothing of the crate.

use std::time::{Duration, Instant};

/// CPU time (user and system) the calling thread has used: what a step costs whatever the
/// machine's load, where its wall time depends on it.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; this clock exists on Linux.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock of the kernel program's timestamps
/// (`bpf_ktime_get_ns`) and of the timeline.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Steps of a start-up, each logged (`-v`) with its wall time and the calling thread's CPU
/// time: the breakdown of the time to a run's first sample.
pub struct Steps {
    what: String,
    at: Instant,
    cpu: Duration,
}

impl Steps {
    /// Starts timing the steps of `what` (the prefix of each line).
    pub fn start(what: impl Into<String>) -> Steps {
        Steps {
            what: what.into(),
            at: Instant::now(),
            cpu: thread_cpu_time(),
        }
    }

    /// Logs the step that ends now.
    pub fn done(&mut self, step: &str) {
        let (at, cpu) = (Instant::now(), thread_cpu_time());
        log::info!(
            "{}: {step} in {:.1} ms ({:.1} ms of CPU)",
            self.what,
            (at - self.at).as_secs_f64() * 1e3,
            cpu.saturating_sub(self.cpu).as_secs_f64() * 1e3
        );
        (self.at, self.cpu) = (at, cpu);
    }
}

/// bpfprof's own CPU time and peak memory so far, from the kernel's accounts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OwnUsage {
    /// CPU time (user and system) of every thread, in seconds.
    pub cpu_secs: f64,
    /// Peak resident memory, in bytes.
    pub peak_rss_bytes: u64,
}

/// bpfprof's own CPU time and peak memory so far.
pub fn own_usage() -> OwnUsage {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    OwnUsage {
        cpu_secs: secs(usage.ru_utime) + secs(usage.ru_stime),
        peak_rss_bytes: usage.ru_maxrss as u64 * 1024,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread's CPU time grows by what it spins, and not by what it sleeps; the process's
    /// own usage counts it too.
    #[test]
    fn thread_cpu_time_counts_work_not_sleep() {
        let (before, usage_before) = (thread_cpu_time(), own_usage());
        std::thread::sleep(Duration::from_millis(50));
        let slept = thread_cpu_time().saturating_sub(before);
        assert!(
            slept < Duration::from_millis(25),
            "{slept:?} of CPU while asleep"
        );
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        // On a loaded machine the thread runs only part of its 30 ms of wall time: some of it.
        let spun = thread_cpu_time().saturating_sub(before);
        assert!(
            spun > Duration::from_millis(1),
            "{spun:?} of CPU for 30 ms of spinning"
        );
        let usage = own_usage();
        assert!(usage.cpu_secs >= usage_before.cpu_secs + spun.as_secs_f64() * 0.5 - 0.01);
        assert!(usage.peak_rss_bytes > 0);
    }
}
