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
        mpsc::{self, RecvTimeoutError},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use perf_event_open_sys as sys;

use crate::sampling::{Event, Rate, Sampling, JITTER};

/// Each CPU's period is redrawn after a random span of 2 to 6 mean periods, but no sooner than
/// every 20 to 60 ms, which bounds the redraws at high rates. Every redraw restarts the CPU's
/// timer at a moment unrelated to the workload, so a periodic workload cannot stay in phase
/// with the sampling for longer than one span (at 4999 Hz, 300 samples at the most). A redraw
/// costs one ioctl per CPU, each an inter-processor interrupt to that CPU (trapped by the
/// hypervisor in a VM), and a wake-up of the jitter thread on a busy machine: at 5-15 ms
/// spans, woken every 10 ms besides to look for the stop, it woke 112-149 times a second at
/// 99-4999 Hz, and cost a launched run at 4999 Hz a point of the workload's time against
/// fixed periods (BENCHMARKS.md section 1).
const SPAN_PERIODS: f64 = 2.0;
const SPAN_MIN: Duration = Duration::from_millis(20);
/// The longest span is this many times the shortest.
const SPAN_RANGE: f64 = 3.0;

/// The attached events of every online CPU.
pub struct AttachedEvents {
    fds: Arc<Vec<OwnedFd>>,
    /// The jitter thread, and the sender whose drop stops it at once.
    jitter: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
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

    /// The events' own counts summed over CPUs: nanoseconds for cpu-clock, cycles for cycles.
    pub fn count(&self) -> io::Result<u64> {
        let mut total = 0u64;
        for fd in self.fds.iter() {
            let mut value = 0u64;
            // SAFETY: reading the 8-byte count (read_format 0) into a u64.
            let n = unsafe { libc::read(fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
            if n != 8 {
                return Err(io::Error::last_os_error());
            }
            total += value;
        }
        Ok(total)
    }

    /// A handle that disables these events from another thread, for a deadline kept while
    /// the thread that owns them is busy (see [`EventStopper`]).
    pub fn stopper(&self) -> EventStopper {
        EventStopper {
            fds: self.fds.clone(),
        }
    }

    /// Stops sampling: disables every event and closes it, which detaches the program.
    pub fn detach(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some((stop, handle)) = self.jitter.take() {
            drop(stop);
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

/// Disables a program's events without owning them: a run's deadline is kept by a thread
/// that does nothing else, so that sampling ends on time however long the owner's tick or the
/// machine's load keeps it (at 100 kHz on every CPU the samples themselves slow it down).
/// The events stay open: the owner detaches them as before. A period redraw does not
/// re-enable a disabled event.
#[derive(Clone)]
pub struct EventStopper {
    fds: Arc<Vec<OwnedFd>>,
}

impl EventStopper {
    /// Disables every event: no sample is taken after this returns.
    pub fn stop(&self) {
        for fd in self.fds.iter() {
            // SAFETY: disabling a perf event kept open by the Arc.
            unsafe { sys::ioctls::DISABLE(fd.as_raw_fd(), 0) };
        }
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
    // pid -1 with a cpu samples every task on that CPU.
    open_event(&mut attr, -1, cpu as i32)
}

/// `perf_event_open(attr, pid, cpu)`, close-on-exec, as an owned fd.
fn open_event(
    attr: &mut sys::bindings::perf_event_attr,
    pid: i32,
    cpu: i32,
) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a fully initialized perf_event_attr of the size it states.
    let fd = unsafe {
        sys::perf_event_open(
            attr,
            pid,
            cpu,
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

/// Whether this machine counts hardware cycles: `Some(false)` where the kernel has no such
/// event (no PMU, common in VMs), `None` where the probe itself was refused (perf_event_paranoid).
///
/// The probe opens a counting, user-only cycles event on the calling thread, which needs no
/// privilege at the default paranoia level, so unprivileged front ends can say which event a
/// run will use before the daemon picks it.
pub fn cycles_available() -> Option<bool> {
    match probe_cycles() {
        Ok(()) => Some(true),
        Err(e) if is_missing_event(&e) => Some(false),
        Err(_) => None,
    }
}

/// Opens and closes a user-only cycles counter on the calling thread; the error says why not.
pub fn probe_cycles() -> io::Result<()> {
    let mut attr = sys::bindings::perf_event_attr {
        size: std::mem::size_of::<sys::bindings::perf_event_attr>() as u32,
        type_: sys::bindings::PERF_TYPE_HARDWARE,
        config: sys::bindings::PERF_COUNT_HW_CPU_CYCLES as u64,
        ..Default::default()
    };
    attr.set_disabled(1);
    attr.set_exclude_kernel(1);
    attr.set_exclude_hv(1);
    // pid 0 with cpu -1 counts the calling thread; dropping the fd closes it.
    drop(open_event(&mut attr, 0, -1)?);
    Ok(())
}

/// ENOENT (no such PMU event) and EOPNOTSUPP/ENODEV (no sampling support) mean "not here".
pub fn is_missing_event(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV)
    )
}

fn check(rc: i32) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn spawn_jitter(fds: Arc<Vec<OwnedFd>>, mean: u64) -> (mpsc::Sender<()>, JoinHandle<()>) {
    let (stop, stopped) = mpsc::channel::<()>();
    let handle = std::thread::Builder::new()
        .name("bpfprof-jitter".into())
        .spawn(move || {
            let mut rng = fastrand::Rng::new();
            let shortest = (SPAN_PERIODS * mean as f64).max(SPAN_MIN.as_nanos() as f64);
            loop {
                let span = shortest * (1.0 + rng.f64() * (SPAN_RANGE - 1.0));
                for fd in fds.iter() {
                    let period = jittered(mean, span, rng.f64());
                    // SAFETY: PERIOD reads a u64 through the pointer passed as its argument.
                    unsafe {
                        sys::ioctls::PERIOD(fd.as_raw_fd(), &period as *const u64 as u64);
                    }
                }
                // One wake-up a span: the sender's drop ends the wait at once on detaching.
                match stopped.recv_timeout(Duration::from_nanos(span as u64)) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                }
            }
        })
        .expect("spawning the jitter thread");
    (stop, handle)
}

/// The period (ns or events) to hold for `span` ns, for a rate drawn uniformly from
/// `(1 ± JITTER) / mean` by `u` in [0, 1).
///
/// Drawing the rate, not the period, keeps the mean rate exact: periods uniform around the
/// mean would sample ~10% too often (the mean of 1/x is above 1/mean). A redraw restarts the
/// timer, so a span of length S at period P holds S/P − 1/2 samples on average, not S/P: the
/// rate is raised by 1/(2S) to make up for it.
fn jittered(mean: u64, span: f64, u: f64) -> u64 {
    let rate = (1.0 - JITTER + 2.0 * JITTER * u) / mean as f64 + 0.5 / span;
    ((1.0 / rate).round() as u64).max(1)
}

/// A tracepoint's perf event with a program attached; the program runs for the tracepoint on
/// every CPU, and detaches when this is dropped.
///
/// bpfprof attaches tracepoints itself, from the program's fd, so that attaching needs no
/// access to the loaded object (which a background thread may be holding while it verifies
/// the walker program).
pub struct AttachedTracepoint {
    _fd: OwnedFd,
}

impl AttachedTracepoint {
    /// Attaches `program_fd` to tracepoint `category:name` (whose id is in tracefs).
    pub fn attach(
        tracefs: &std::path::Path,
        category: &str,
        name: &str,
        program_fd: RawFd,
    ) -> io::Result<AttachedTracepoint> {
        let id_path = tracefs.join("events").join(category).join(name).join("id");
        let id: u64 = std::fs::read_to_string(&id_path)?
            .trim()
            .parse()
            .map_err(|e| io::Error::other(format!("{}: {e}", id_path.display())))?;
        let mut attr = sys::bindings::perf_event_attr {
            size: std::mem::size_of::<sys::bindings::perf_event_attr>() as u32,
            type_: sys::bindings::PERF_TYPE_TRACEPOINT,
            config: id,
            ..Default::default()
        };
        attr.__bindgen_anon_2.wakeup_events = 1;
        attr.set_disabled(1);
        // A tracepoint event on CPU 0 for every process runs its program for the tracepoint
        // on every CPU.
        let fd = open_event(&mut attr, -1, 0)?;
        // SAFETY: `fd` is a perf event we own; the program fd is valid while we run.
        unsafe {
            check(sys::ioctls::SET_BPF(fd.as_raw_fd(), program_fd as u32))?;
            check(sys::ioctls::ENABLE(fd.as_raw_fd(), 0))?;
        }
        Ok(AttachedTracepoint { _fd: fd })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jittered_periods_keep_the_mean_rate_over_a_span() {
        let mut rng = fastrand::Rng::with_seed(7);
        let n = 100_000;
        let mean = 1_000_000u64;
        for span in [2e6, 5e6, 15e6, 60e6] {
            let (mut samples, mut time) = (0f64, 0f64);
            for _ in 0..n {
                let p = jittered(mean, span, rng.f64());
                // Rates between half and 1.5 times the mean, plus the restart compensation.
                assert!(p as f64 >= mean as f64 / (1.5 + 0.5 * mean as f64 / span) - 1.0);
                assert!(p as f64 <= mean as f64 / 0.5, "{p}");
                // The timer restarts at the span's start: samples at P, 2P, ... up to the
                // span's end.
                let mut t = p as f64;
                while t <= span {
                    samples += 1.0;
                    t += p as f64;
                }
                time += span;
            }
            let rate = samples / time * mean as f64;
            // Within 3% of the requested rate.
            assert!((rate - 1.0).abs() < 0.03, "span {span}: rate {rate}");
        }
    }
}
