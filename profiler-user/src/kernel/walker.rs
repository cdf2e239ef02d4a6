//! The walker program (CFI and Python walks): verified on a thread of its own or alongside
//! the sampling program ([`WalkerLoad`]), put in the program array the sampling program
//! tail-calls, and waited for.

use aya::{
    maps::{MapData, ProgramArray},
    programs::{PerfEvent, Program, ProgramError, ProgramFd},
    Ebpf,
};
use profiler_common::{WALKER_PROGRAM_NAME, WALKER_SLOT};

use super::{load::load_error, program::KernelProgram};
use crate::clock::thread_cpu_time;

/// The walker program (CFI and Python walks), verified in a background thread while sampling
/// runs without it.
pub(super) enum Walker {
    /// The thread holds the loaded object while the kernel verifies the walker.
    Loading(std::thread::JoinHandle<WalkerLoaded>),
    /// Verified and in the program array, or refused.
    Done(Box<WalkerLoaded>),
    /// Between the two, while being joined.
    Joining,
}

/// When a load verifies the walker program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkerLoad {
    /// On a thread of its own after the load, while sampling starts with frame-pointer stacks
    /// (counted): a launched command's start, which the walker must not delay.
    Background,
    /// Alongside the sampling program, the load returning with both: for a run that waits for
    /// the walker before its first sample (a running process is profiled with whole stacks
    /// from its first sample).
    WithSampling,
}

/// What the walker thread hands back: the object (which owns the programs), the program array
/// it filled (kept open: the kernel empties a program array when its last user fd closes) and
/// how long verification took, or why it failed.
pub(super) struct WalkerLoaded {
    pub(super) ebpf: Ebpf,
    pub(super) _walkers: Option<ProgramArray<MapData>>,
    pub(super) outcome: std::result::Result<std::time::Duration, String>,
    /// The off-CPU program, when a run asked for it while the thread held the object: its
    /// fd, or why it did not load.
    pub(super) off_cpu: Option<std::result::Result<(ProgramFd, u32), String>>,
}

impl KernelProgram {
    /// Whether the walker program is verified and in use; notes it (and logs a refusal) when
    /// its thread has just finished.
    pub fn walker_ready(&mut self) -> bool {
        if let Walker::Loading(handle) = &self.walker {
            if !handle.is_finished() {
                return false;
            }
            self.join_walker();
        }
        matches!(&self.walker, Walker::Done(w) if w.outcome.is_ok())
    }

    /// Whether the walker program is still being verified: a caller that shares this program
    /// polls it to wait without holding the program (then [`Self::wait_walker`] returns at once).
    pub fn walker_pending(&self) -> bool {
        matches!(&self.walker, Walker::Loading(handle) if !handle.is_finished())
    }

    /// Waits for the walker program's verification: how long it took, or why it failed.
    pub fn wait_walker(&mut self) -> std::result::Result<std::time::Duration, String> {
        self.join_walker();
        match &self.walker {
            Walker::Done(w) => w.outcome.clone(),
            _ => Err("the walker thread did not finish".into()),
        }
    }

    pub(super) fn join_walker(&mut self) {
        if !matches!(self.walker, Walker::Loading(_)) {
            return;
        }
        let Walker::Loading(handle) = std::mem::replace(&mut self.walker, Walker::Joining) else {
            return;
        };
        match handle.join() {
            Ok(loaded) => {
                match &loaded.outcome {
                    Ok(took) => log::info!(
                        "walker program (CFI, Python) verified in {} ms",
                        took.as_millis()
                    ),
                    Err(e) => log::warn!(
                        "the CFI and Python walker did not load ({e}): user stacks use frame \
                         pointers and Python frames are not read"
                    ),
                }
                let mut loaded = loaded;
                match loaded.off_cpu.take() {
                    Some(Ok((fd, id))) => {
                        self.off_cpu_fd = Some(fd);
                        self.off_cpu_program_id = id;
                    }
                    Some(Err(e)) => self.off_cpu_error = Some(e),
                    None => {}
                }
                self.walker = Walker::Done(Box::new(loaded));
            }
            Err(_) => log::warn!("the walker thread panicked: stacks use frame pointers"),
        }
    }
}

/// Verifies the walker program of `ebpf` on a thread of its own and puts it in the program
/// array the sampling program tail-calls, while sampling starts without it.
pub(super) fn start_walker(
    mut ebpf: Ebpf,
    mut walkers: ProgramArray<MapData>,
) -> std::thread::JoinHandle<WalkerLoaded> {
    std::thread::spawn(move || {
        let outcome = verify_walker(ebpf.program_mut(WALKER_PROGRAM_NAME)).and_then(|took| {
            install_walker(&ebpf, &mut walkers)?;
            Ok(took)
        });
        WalkerLoaded {
            ebpf,
            _walkers: outcome.is_ok().then_some(walkers),
            outcome,
            off_cpu: None,
        }
    })
}

/// Verifies the walker program (logging the verifier's work): how long it took.
pub(super) fn verify_walker(
    program: Option<&mut Program>,
) -> std::result::Result<std::time::Duration, String> {
    let started = std::time::Instant::now();
    let cpu = thread_cpu_time();
    let program: &mut PerfEvent = program
        .ok_or_else(|| format!("the eBPF object has no {WALKER_PROGRAM_NAME}"))?
        .try_into()
        .map_err(|e: ProgramError| e.to_string())?;
    program
        .load()
        .map_err(|e| load_error(e, "the walker program").to_string())?;
    // The verifier's work, which its time follows: the figure to watch as the walker grows.
    if let Some(n) = program
        .info()
        .ok()
        .and_then(|i| i.verified_instruction_count())
    {
        log::info!(
            "walker program: the verifier processed {n} instructions in {:.1} ms \
             ({:.1} ms of CPU)",
            started.elapsed().as_secs_f64() * 1e3,
            thread_cpu_time().saturating_sub(cpu).as_secs_f64() * 1e3
        );
    }
    Ok(started.elapsed())
}

/// Puts the verified walker program of `ebpf` in `walkers`, where the sampling program
/// tail-calls it.
pub(super) fn install_walker(
    ebpf: &Ebpf,
    walkers: &mut ProgramArray<MapData>,
) -> std::result::Result<(), String> {
    let program: &PerfEvent = ebpf
        .program(WALKER_PROGRAM_NAME)
        .ok_or_else(|| format!("the eBPF object has no {WALKER_PROGRAM_NAME}"))?
        .try_into()
        .map_err(|e: ProgramError| e.to_string())?;
    let fd = program.fd().map_err(|e| e.to_string())?;
    walkers
        .set(WALKER_SLOT, fd, 0)
        .map_err(|e| format!("installing the walker: {e}"))
}
