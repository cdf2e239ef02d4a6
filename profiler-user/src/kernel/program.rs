//! The kernel program's state ([`KernelProgram`]): its programs, maps and what it keeps in
//! userspace, and the helpers every part of it uses.

use std::{collections::HashMap as StdHashMap, io};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::ProgramFd,
};
use profiler_common::{
    OffCpuPending, PidNamespace, SampleKey, SampleValue, StackFrames, StackId, TargetInfo,
    TargetKey,
};

use super::walker::Walker;
use crate::{
    error::Error,
    kernel::{perf_events::AttachedEvents, perf_events::AttachedTracepoint},
    sampling::Sampling,
};

/// The loaded kernel program and its maps.
pub struct KernelProgram {
    /// The sampling program, loaded and verified (its object is owned by the walker thread or
    /// `walker`).
    pub(super) sample_fd: ProgramFd,
    /// The fork programs, one per record layout (see
    /// [`FORK_PROGRAM_NAMES`](profiler_common::FORK_PROGRAM_NAMES)), and the exit
    /// program: verified at load, attached when a run first follows children.
    pub(super) fork_fds: Vec<ProgramFd>,
    pub(super) exit_fd: ProgramFd,
    pub(super) tracepoints: Vec<AttachedTracepoint>,
    /// The exec program: verified at load, attached when a run first stops at exec.
    pub(super) exec_fd: ProgramFd,
    pub(super) exec_tracepoint: Option<AttachedTracepoint>,
    /// Runs that stop sampling a process when it execs
    /// ([`Config::StopAtExec`](profiler_common::Config::StopAtExec)).
    pub(super) stop_at_exec_runs: u64,
    /// Processes that exec'd while runs that stop at exec sampled them, by global tgid.
    pub(super) execed: HashMap<MapData, u32, u64>,
    /// Processes a system-wide run sampled for the first time, by global tgid.
    pub(super) new_processes: aya::maps::RingBuf<MapData>,
    /// The timeline ring's map: samples of the runs that record a timeline, with their times.
    pub(super) timeline_map: MapData,
    /// The timeline ring as mapped into bpfprof, only while a run records a timeline: mapped,
    /// its 1 MiB is resident twice over (the ring is mapped twice so that a record can wrap),
    /// 2 MiB of every run's memory that most runs never read.
    pub(super) timeline: Option<aya::maps::RingBuf<MapData>>,
    /// Runs that record a timeline
    /// ([`Config::TimelineRuns`](profiler_common::Config::TimelineRuns)).
    pub(super) timeline_runs: u64,
    /// Sample times read from the timeline ring, by the sample's key split per run (the key's
    /// `runs` holds the one run's bit), in the order read.
    pub(super) timeline_times: StdHashMap<SampleKey, Vec<u64>>,
    /// Those processes as the kernel remembers them (an entry removed is reported again).
    pub(super) system_seen: HashMap<MapData, u32, u8>,
    pub(super) walker: Walker,
    pub(super) events: Option<AttachedEvents>,
    /// The event and rate attached.
    pub(super) sampling: Option<Sampling>,
    pub(super) program_id: u32,
    pub(super) namespaces: Array<MapData, PidNamespace>,
    /// Slot of each watched namespace, with the number of targets in it.
    pub(super) namespace_slots: StdHashMap<PidNamespace, (u32, usize)>,
    pub(super) targets: HashMap<MapData, TargetKey, TargetInfo>,
    /// Children of targets, by global pid, found by the fork tracepoint.
    pub(super) followed: HashMap<MapData, u32, TargetInfo>,
    pub(super) config: Array<MapData, u64>,
    /// Runs that follow their targets' children.
    pub(super) following_runs: u64,
    pub(super) samples: HashMap<MapData, SampleKey, SampleValue>,
    /// Sample counts moved out of the kernel map, split per run (the key's `runs` holds the
    /// one run's bit), added up: sorted by key, each key once (see
    /// [`merge_counts`](super::stacks::merge_counts)). A list
    /// rather than a hash table: at section 4's 27k keys the table took 2-4 MiB, and each
    /// growth held the old table beside the new one, the peak of the run.
    pub(super) offloaded_samples: Vec<(SampleKey, SampleValue)>,
    /// The off-CPU program (`sched:sched_switch`): verified when a run first asks for off-CPU
    /// time (after the walker, whose walks it repeats), attached while any run records it.
    pub(super) off_cpu_fd: Option<ProgramFd>,
    /// The off-CPU program's id, for its run-time statistics (`--bpf-stats`).
    pub(super) off_cpu_program_id: u32,
    /// Its run time and runs when it was attached, where statistics are on.
    pub(super) off_cpu_stats_at_attach: Option<(u64, u64)>,
    /// Why the off-CPU program did not load, once it was tried.
    pub(super) off_cpu_error: Option<String>,
    pub(super) off_cpu_tracepoint: Option<AttachedTracepoint>,
    /// Runs that record off-CPU time
    /// ([`Config::OffCpuRuns`](profiler_common::Config::OffCpuRuns)).
    pub(super) off_cpu_runs: u64,
    /// Target threads off the CPU since their switch-out, by global tid.
    pub(super) off_cpu_pending: HashMap<MapData, u32, OffCpuPending>,
    /// The wait scan's threads, by global tid (see [`profiler_common::WaitScan`]).
    pub(super) wait_scan: HashMap<MapData, u32, profiler_common::WaitScan>,
    /// Whether the wait scan's program loaded and its offsets were set, once a run asked
    /// (what the first scan sets up: the program loaded, the task offsets written; spelled
    /// out here so that `program` and `waits` do not use each other).
    pub(super) wait_scan_setup: Option<std::result::Result<(), String>>,
    /// When each (run, pid) that records off-CPU time became a target, `CLOCK_MONOTONIC`
    /// nanoseconds: where its threads' waits found by the scan start. Taken by the scan.
    pub(super) targets_added_ns: StdHashMap<(u32, u32), u64>,
    /// Per run, the waits still going at its end that userspace counted (added to the run's
    /// `Counter::OffCpuIntervals`).
    pub(super) waits_counted_at_end: StdHashMap<u32, u64>,
    /// When the off-CPU program was last attached (`CLOCK_MONOTONIC` ns, and the instant).
    pub(super) off_cpu_attached: Option<(u64, std::time::Instant)>,
    /// The configuration array again, for `Config::StoppedRuns`: shared with the runs'
    /// [`super::RunStopper`]s, each write of the entry under the lock.
    pub(super) stopped_runs: std::sync::Arc<std::sync::Mutex<Array<MapData, u64>>>,
    /// The launched command the kernel records nothing of until it execs (global pid).
    pub(super) awaiting_exec: Option<u32>,
    /// The program-wide sample count when sample counts were last moved.
    pub(super) samples_at_last_move: u64,
    /// The samples recorded (all runs) when stacks last moved (see [`Self::offload_when_due`]).
    pub(super) samples_at_last_offload: u64,
    pub(super) stacks: HashMap<MapData, StackId, StackFrames>,
    /// Stacks moved out of the kernel map by [`Self::offload_stacks`]. Stack ids are hashes of
    /// the frames, so a stack that recurs after the move is stored again under the same id.
    /// Shared with the samples drained from them, so that a run's end holds each stack once.
    pub(super) offloaded_stacks: StdHashMap<StackId, std::sync::Arc<[u64]>>,
    /// Addresses of the stacks offloaded since [`Self::take_fresh_frames`] last took them:
    /// what a run symbolizes while it samples (at most
    /// [`FRESH_FRAMES_MAX`](super::stacks::FRESH_FRAMES_MAX)).
    pub(super) fresh_frames: std::collections::HashSet<u64>,
    /// When stacks were last offloaded, and how many moved then.
    pub(super) last_offload: (std::time::Instant, usize),
    pub(super) counters: PerCpuArray<MapData, u64>,
    /// Run-time statistics at attach: (run time ns, run count), when stats are on.
    pub(super) stats_at_attach: Option<(u64, u64)>,
    /// Holds BPF run-time statistics on while bpfprof runs (see [`Self::enable_run_stats`]).
    pub(super) stats_fd: Option<std::os::fd::OwnedFd>,
    /// The CFI unwinding maps and their resident tables (see [`crate::unwind`]).
    pub unwind: crate::unwind::UnwindMaps,
    /// The maps of the runtimes' walks (see `crate::runtime`).
    pub runtimes: RuntimeMaps,
}

/// The kernel maps of each runtime's walk: what its walker reads per process and thread.
pub struct RuntimeMaps {
    /// CPython's: interpreters' layouts and thread states.
    pub cpython: PythonMaps,
    /// HotSpot's: each JVM's code cache and interpreter frame layout, by host tgid.
    pub hotspot: HashMap<MapData, u32, profiler_common::HotspotProcess>,
    /// V8's: each Node.js process's constants.
    pub v8: V8Maps,
}

/// The kernel maps of V8's frames (recorded by the CFI walk).
pub struct V8Maps {
    /// The V8 constants of the processes whose JavaScript frames are recorded, by host tgid.
    pub processes: HashMap<MapData, u32, profiler_common::V8Process>,
}

/// The kernel maps of the CPython walk.
pub struct PythonMaps {
    /// Layouts of the CPython processes the kernel walks, by host tgid.
    pub processes: HashMap<MapData, u32, profiler_common::PythonProcess>,
    /// Each walked thread's `PyThreadState` address and process, by host tid.
    pub threads: HashMap<MapData, u32, profiler_common::PythonThread>,
}

impl KernelProgram {
    /// The program's id in the kernel (as `bpftool prog show` lists it).
    pub fn program_id(&self) -> u32 {
        self.program_id
    }
}

pub(super) fn kernel_err(e: impl Into<anyhow::Error>) -> Error {
    Error::Kernel(e.into())
}

pub(super) fn is_permission(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}
