//! Perf events opened by bpfprof itself, one per online CPU, with the kernel program attached.
//!
//! bpfprof opens these rather than letting aya do it so that it keeps the event fds: with
//! them it re-randomizes each CPU's sampling period around the requested mean while sampling
//! runs. A fixed period phase-locks with periodic workloads (a loop that takes exactly ten
//! sampling periods is always caught at the same point) and gives shares far from the truth;
//! random periods with the same mean keep the rate and remove the lock.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use perf_event_open_sys as sys;

use crate::sampling::{Event, Rate, Sampling};

/// Sampling rates are drawn uniformly from `mean rate * (1 ± JITTER)`.
pub const JITTER: f64 = 0.5;
/// The rate is redrawn every 25 to 75 mean periods (a random span, so redraws do not lock
/// with the workload either).
const REDRAW_PERIODS: (f64, f64) = (25.0, 75.0);
/// A redraw restarts the CPU's timer and drops the interval in flight: half a period per
/// redraw on average, which rates are raised by to keep the mean rate exact.
const REDRAW_LOSS: f64 = 0.5 / ((REDRAW_PERIODS.0 + REDRAW_PERIODS.1) / 2.0);

/// The attached events of every online CPU.
pub struct AttachedEvents {
    fds: Arc<Vec<OwnedFd>>,
    jitter: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl AttachedEvents {
    /// Opens `sampling`'s event on every CPU in `cpus`, attaches `program_fd` and enables them;
    /// with `jitter`, fixed periods are re-randomized around their mean while attached.
    pub fn attach(
        sampling: &Sampling,
        cpus: &[u32],
        program_fd: RawFd,
        jitter: bool,
    ) -> io::Result<AttachedEvents> {
        let mut fds = Vec::with_capacity(cpus.len());
        for &cpu in cpus {
            let fd = open(sampling, cpu)?;
            // SAFETY: `fd` is a perf event we own; the program fd is valid while we run.
            unsafe {
                check(sys::ioctls::SET_BPF(fd.as_raw_fd(), program_fd as u32))?;
                check(sys::ioctls::ENABLE(fd.as_raw_fd(), 0))?;
            }
            fds.push(fd);
        }
        let fds = Arc::new(fds);
        let jitter = match (jitter, sampling.rate) {
            (true, Rate::Period(mean)) => Some(spawn_jitter(fds.clone(), mean)),
            _ => None,
        };
        Ok(AttachedEvents { fds, jitter })
    }

    /// Stops sampling: disables every event and closes it, which detaches the program.
    pub fn detach(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some((stop, handle)) = self.jitter.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = handle.join();
        }
        for fd in self.fds.iter() {
            // SAFETY: disabling a perf event we own.
            unsafe { sys::ioctls::DISABLE(fd.as_raw_fd(), 0) };
        }
    }
}

impl Drop for AttachedEvents {
    fn drop(&mut self) {
        self.stop();
    }
}

fn open(sampling: &Sampling, cpu: u32) -> io::Result<OwnedFd> {
    let mut attr = sys::bindings::perf_event_attr {
        size: std::mem::size_of::<sys::bindings::perf_event_attr>() as u32,
        ..Default::default()
    };
    match sampling.event {
        Event::Cycles => {
            attr.type_ = sys::bindings::PERF_TYPE_HARDWARE;
            attr.config = sys::bindings::PERF_COUNT_HW_CPU_CYCLES as u64;
        }
        Event::CpuClock => {
            attr.type_ = sys::bindings::PERF_TYPE_SOFTWARE;
            attr.config = sys::bindings::PERF_COUNT_SW_CPU_CLOCK as u64;
        }
    }
    match sampling.rate {
        Rate::Period(p) => attr.__bindgen_anon_1.sample_period = p,
        Rate::Frequency(f) => {
            attr.__bindgen_anon_1.sample_freq = f;
            attr.set_freq(1);
        }
    }
    attr.set_disabled(1);
    // SAFETY: a fully initialized attr; pid -1 with a cpu samples every task on that CPU.
    let fd = unsafe {
        sys::perf_event_open(
            &mut attr,
            -1,
            cpu as i32,
            -1,
            sys::bindings::PERF_FLAG_FD_CLOEXEC as u64,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: perf_event_open returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn check(rc: i32) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn spawn_jitter(fds: Arc<Vec<OwnedFd>>, mean: u64) -> (Arc<AtomicBool>, JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let stop_thread = stop.clone();
    let handle = std::thread::Builder::new()
        .name("bpfprof-jitter".into())
        .spawn(move || {
            let mut rng = fastrand::Rng::new();
            while !stop_thread.load(Ordering::Relaxed) {
                for fd in fds.iter() {
                    let period = jittered(mean, rng.f64());
                    // SAFETY: PERIOD reads a u64 through the pointer passed as its argument.
                    unsafe {
                        sys::ioctls::PERIOD(fd.as_raw_fd(), &period as *const u64 as u64);
                    }
                }
                // Sleep in short steps so that detaching does not wait for a whole redraw.
                let span = mean as f64
                    * (REDRAW_PERIODS.0 + rng.f64() * (REDRAW_PERIODS.1 - REDRAW_PERIODS.0));
                let mut left = ((span / 1e6) as u64).clamp(5, 1000);
                while left > 0 && !stop_thread.load(Ordering::Relaxed) {
                    let step = left.min(10);
                    std::thread::sleep(Duration::from_millis(step));
                    left -= step;
                }
            }
        })
        .expect("spawning the jitter thread");
    (stop, handle)
}

/// A period whose rate is drawn uniformly from `(1 ± JITTER) / mean` for `u` in [0, 1).
/// Drawing the rate, not the period, keeps the mean rate exact: periods uniform around the
/// mean would sample ~10% too often (the mean of 1/x is above 1/mean).
fn jittered(mean: u64, u: f64) -> u64 {
    let rate_factor = (1.0 - JITTER + 2.0 * JITTER * u) * (1.0 + REDRAW_LOSS);
    ((mean as f64 / rate_factor).round() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jittered_periods_keep_the_mean_rate_and_the_bounds() {
        let mut rng = fastrand::Rng::with_seed(7);
        let n = 100_000;
        let mean = 1_000_000u64;
        let mut rate_sum = 0f64;
        for _ in 0..n {
            let p = jittered(mean, rng.f64());
            // Rates between half and 1.5 times the mean (plus the redraw compensation).
            assert!((650_000..=2_000_000).contains(&p), "{p}");
            rate_sum += mean as f64 / p as f64;
        }
        let rate = rate_sum / n as f64;
        // Mean rate is the requested one, raised by exactly the redraw loss.
        assert!((rate / (1.0 + REDRAW_LOSS) - 1.0).abs() < 0.005, "{rate}");
    }
}
