//! One process of a recording ([`ProcessRecording`]): what is kept of it, and how often its
//! memory maps are re-read while it lives.

use std::time::{Duration, Instant};

use profiler_common::PidNamespace;

use crate::{
    kernel::pool::Slot,
    process::maps::ProcessMaps,
    process::target::{ExitWatch, Target},
    runtime::Instance,
};

/// How often target memory maps are re-read, to catch libraries loaded during the run.
pub const MAPS_REFRESH: Duration = Duration::from_millis(500);

/// How long a new process (added, exec'd or followed) is refreshed on every tick instead of
/// every [`MAPS_REFRESH`]: its loader is still mapping libraries (which get unwind tables) and
/// its interpreter is still starting (libpython mapped, the main thread's state made). Once a
/// refresh, each of those left a launched Python's first half second without whole stacks
/// or Python frames.
pub const YOUNG_PROCESS: Duration = Duration::from_secs(2);

/// A young process of a system-wide run is re-read at most once in this many sampling
/// periods (and at most once a tick): at the agent's 19 Hz, every 0.26 s instead of every
/// 0.1 s tick. Until its first re-read a new library's samples walk by frame pointer, a few
/// samples at such a rate; re-reading every tick was most of the agent's maps reads on a
/// machine starting many short processes (builds), where each lives its whole life young.
pub const YOUNG_REFRESH_PERIODS: f64 = 5.0;

/// How often a system-wide run re-reads the maps of a process past its youth when nothing
/// says they changed. They are read again sooner when one of its samples ran at an address
/// they do not cover (a library loaded since, new JIT code: see `Recording::tick`, and before
/// each window is named); this is the backstop, for a library mapped where another was
/// (never sampled outside the old maps) and for thread names. Re-reading every process's
/// maps on a timer (Python ones twice a second, the others every 5 s) was half of the
/// agent's CPU on a host of 150 CPython services.
pub const SYSTEM_MAPS_REFRESH: Duration = Duration::from_secs(60);

/// A system-wide run re-reads a process's maps because a sample ran outside them at most
/// this often: an address that no re-read covers (code run from a writable mapping, a
/// frame-pointer walk's guess) costs a read per this interval, not one per tick.
pub const STALE_MAPS_MIN_INTERVAL: Duration = Duration::from_secs(2);

/// How often a system-wide run lists a CPython's threads when none of its samples names a
/// thread it has not listed: the backstop that forgets threads that ended. A sampled thread
/// never listed is listed at the next half-second look; one listed without a thread state
/// (a native thread, or a Python thread caught before its state named it) is listed again
/// at most every [`STATELESS_THREAD_RELIST`].
pub const PYTHON_THREADS_BACKSTOP: Duration = Duration::from_secs(30);

/// See [`PYTHON_THREADS_BACKSTOP`].
pub const STATELESS_THREAD_RELIST: Duration = Duration::from_secs(5);

/// Most processes a system-wide recording takes in, live and exited (an exited one's maps are
/// kept to name its samples): each costs its memory maps, and while it lives its unwind tables
/// and Python state. Samples of processes past the cap are counted, never named.
pub const MAX_SYSTEM_PROCESSES: usize = 4096;

/// One process of a recording: a target, or a child the kernel followed.
pub struct ProcessRecording {
    /// The run slot its samples go to.
    pub slot: Slot,
    /// The pid its samples carry: in its pid namespace for a run of targets, in the initial
    /// one for a system-wide run.
    pub sample_pid: u32,
    /// The process.
    pub target: Target,
    /// Its memory layout, refreshed while it lives.
    pub maps: ProcessMaps,
    /// Whether it was named by the request (not found as a child).
    pub direct: bool,
    /// Whether it has been seen to exit.
    pub exited: bool,
    /// Its runtime's frames (CPython's), when it runs a runtime the kernel walks.
    pub runtime: Option<Box<dyn Instance>>,
    /// Why its runtime's frames are not walked, when it runs one bpfprof cannot walk.
    pub runtime_refused: Option<String>,
    /// Until when it is refreshed on every tick (see [`YOUNG_PROCESS`]).
    pub young_until: Option<Instant>,
    /// When its maps were last re-read (see [`SYSTEM_MAPS_REFRESH`]).
    pub refreshed_at: Instant,
    /// Its executable memory when last looked at (see [`Target::executable_kib`]): a run of
    /// targets re-reads the maps of a process whose executable memory changed at the next
    /// tick, not up to [`MAPS_REFRESH`] later.
    pub executable_kib: Option<u64>,
    /// The objects it maps whose code had no unwind table when last looked at.
    pub untabled: Vec<crate::unwind::Untabled>,
    /// The objects whose table went into the kernel during the run after samples had run in
    /// them without it (see [`crate::unwind::UnwindMaps::tabled_late`]).
    pub tabled_late: Vec<crate::profile::LateTable>,
    /// Whether the kernel's CFI walker walked its stacks: the unwinder tracked it at some
    /// point (a daemon run's target is untracked before its samples are collected).
    pub cfi_walked: bool,
    /// Whether the run's owner could no longer profile it (it exec'd a setuid program or one
    /// its user cannot read, or changed its credentials): no longer sampled, and its samples
    /// are dropped, never named.
    pub revoked: bool,
    /// The kernel's word of its exit, where it gives one (see [`ExitWatch`]).
    pub exit: ExitWatch,
    /// When its CPython's threads were last listed (see [`PYTHON_THREADS_BACKSTOP`]).
    pub threads_listed_at: Instant,
    /// The user stacks of its samples whose leaf was checked against its maps since the
    /// last window (see `Recording::tick`).
    pub checked_stacks: std::collections::HashSet<profiler_common::StackId>,
}

impl ProcessRecording {
    /// Notes which of its objects have no table now, and which got theirs since the run
    /// started at `started` after samples ran in them without it.
    pub(super) fn note_tables(&mut self, unwind: &crate::unwind::UnwindMaps, started: Instant) {
        self.untabled = unwind.untabled(self.target.pid);
        for (name, at) in unwind.tabled_late(self.target.pid, started) {
            if !self.tabled_late.iter().any(|t| t.name == name) {
                let after_secs = at.saturating_duration_since(started).as_secs_f64();
                self.tabled_late
                    .push(crate::profile::LateTable { name, after_secs });
            }
        }
    }

    /// Stops sampling the process for good, forgetting everything read of it: its owner may
    /// no longer profile it.
    pub(super) fn revoke(&mut self, program: &mut crate::kernel::KernelProgram) {
        log::info!(
            "pid {} is no longer its run's owner's to profile: no longer sampled",
            self.target.pid
        );
        if self.direct {
            program.suspend_target(self.slot.run, &self.target);
        } else {
            program.drop_followed(self.slot.run, self.target.pid);
        }
        if let Some(mut runtime) = self.runtime.take() {
            runtime.stop(program);
        }
        self.maps = ProcessMaps::gone(self.sample_pid);
        self.untabled = Vec::new();
        self.revoked = true;
        self.exited = true;
    }

    /// Whether its executable memory changed since the last call (the first call only notes
    /// it): new code was mapped, whose unwind table and names need its maps re-read.
    pub(super) fn mapped_new_code(&mut self) -> bool {
        let now = self.target.executable_kib();
        let before = std::mem::replace(&mut self.executable_kib, now);
        before.is_some() && now.is_some() && before != now
    }

    /// Notes whether the process still lives, re-reading its maps when `refresh`; true when
    /// it is found to have exited now.
    /// `exited` is the kernel's word that it exited ([`ExitWatch`]); a process the kernel does
    /// not watch is looked for in /proc.
    pub(super) fn poll(&mut self, exited: bool, refresh: bool, name_threads: bool) -> bool {
        if self.exited {
            return false;
        }
        let gone = if self.exit.is_watching() {
            exited
        } else {
            !self.target.is_alive()
        };
        if gone {
            log::debug!("pid {} ({}) exited", self.target.pid, self.target.comm);
            self.exited = true;
            return true;
        }
        if refresh {
            let _ = self.maps.refresh();
            if name_threads {
                self.name_runtime_threads();
            }
            self.refreshed_at = Instant::now();
        }
        false
    }

    /// Labels its threads by the names its runtime gave them (Python's `threading` names),
    /// where it is in bpfprof's pid namespace (the names come by host tid).
    fn name_runtime_threads(&mut self) {
        if let Some(runtime) = &mut self.runtime {
            if self.target.pid == self.sample_pid {
                self.maps.name_threads(runtime.thread_names());
            }
        }
    }
}

impl ProcessRecording {
    /// A process known only by the pid its samples carry: it exited before it was seen.
    pub(super) fn gone(slot: Slot, ns_pid: u32) -> ProcessRecording {
        ProcessRecording {
            slot,
            sample_pid: ns_pid,
            target: Target {
                pid: 0,
                ns: PidNamespace::default(),
                ns_pid,
                comm: "[exited child]".into(),
                start_time: 0,
            },
            maps: ProcessMaps::gone(ns_pid),
            direct: false,
            exited: true,
            runtime: None,
            runtime_refused: None,
            young_until: None,
            refreshed_at: Instant::now(),
            executable_kib: None,
            untabled: Vec::new(),
            tabled_late: Vec::new(),
            cfi_walked: false,
            revoked: false,
            exit: ExitWatch::default(),
            threads_listed_at: Instant::now(),
            checked_stacks: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process known only by the pid its samples carry is an exited child, never revoked,
    /// whose maps name it as such; polling it again finds no new exit.
    #[test]
    fn a_process_known_by_its_samples_is_gone() {
        let slot = Slot {
            program_id: 3,
            run: 2,
        };
        let mut p = ProcessRecording::gone(slot, 42);
        assert_eq!((p.slot, p.sample_pid, p.target.ns_pid), (slot, 42, 42));
        assert_eq!(
            (p.target.pid, p.target.comm.as_str()),
            (0, "[exited child]")
        );
        assert!(p.exited && !p.revoked && !p.direct && p.runtime.is_none());
        assert!(!p.poll(true, true, false), "an exited process exits once");
    }

    /// The first look at a process's executable memory only notes it; a look that finds it
    /// changed finds new code.
    #[test]
    fn new_code_is_found_by_a_change_of_executable_memory() {
        let me = Target::from_pid(std::process::id()).expect("this process");
        let mut p = ProcessRecording::gone(
            Slot {
                program_id: 1,
                run: 0,
            },
            me.ns_pid,
        );
        p.target = me;
        assert!(!p.mapped_new_code(), "the first look only notes it");
        assert!(p.executable_kib.is_some_and(|k| k > 0));
        p.executable_kib = p.executable_kib.map(|k| k + 4);
        assert!(
            p.mapped_new_code(),
            "4 KiB more of code than last looked at"
        );
    }
}
