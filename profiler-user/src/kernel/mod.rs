//! The kernel program: loading the embedded eBPF object, attaching it to a perf event on every
//! online CPU, and telling it which processes to keep samples of.

pub mod drain;
pub mod helpers;
pub mod perf_events;
pub mod pool;

use std::{
    collections::HashMap as StdHashMap,
    io,
    ops::DerefMut,
    os::fd::{AsFd, AsRawFd},
};

use anyhow::{anyhow, Context};
use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, ProgramArray},
    programs::{PerfEvent, Program, ProgramError, ProgramFd, TracePoint},
    Ebpf, EbpfError, EbpfLoader,
};
use profiler_common::{
    Config, Counter, OffCpuPending, PidNamespace, SampleKey, SampleValue, StackFrames, StackId,
    TargetInfo, TargetKey, TimelineRecord, ALL_RUNS_SAMPLES_INDEX, EXEC_PROGRAM_NAME,
    EXIT_PROGRAM_NAME, FORK_CHILD_PID_OFFSETS, FORK_PROGRAM_NAMES, INVOCATIONS_INDEX,
    MAX_PID_NAMESPACES, MAX_RUNS, MAX_STACK_DEPTH, OFF_CPU_PROGRAM_NAME, PROGRAM_NAME,
    PYTHON_STACKS_STORED_INDEX, SAMPLE_MAP_ENTRIES, SCHED_SWITCH_OFFSETS, STACK_MAP_ENTRIES,
    TIMELINE_MAP, WALKER_PROGRAM_NAME, WALKER_SLOT,
};

use crate::{
    error::{Error, Result},
    kernel::perf_events::{is_missing_event, AttachedEvents, AttachedTracepoint},
    process::target::Target,
    sampling::{OffCpu, Sampling, SamplingPlan},
};

/// The most addresses kept for [`KernelProgram::take_fresh_frames`] between two takes: a
/// bound on memory where no run takes them.
const FRESH_FRAMES_MAX: usize = 1 << 18;
/// How often stacks move from the kernel map to userspace when few new ones arrive.
const OFFLOAD_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);
/// How often they move while tables are still to be built: a moved stack is how the loader
/// learns which objects run (built first, boosted in a daemon), and on a daemon's first call
/// of a PyTorch step every stack in libtorch_cpu.so ended early until its table was in.
const OFFLOAD_INTERVAL_WHILE_BUILDING: std::time::Duration = std::time::Duration::from_millis(100);

/// The eBPF object built from `profiler-ebpf` by `cargo xtask build-ebpf`.
static PROGRAM_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("CARGO_MANIFEST_DIR"), "/bpf/profiler.bpf.o"));

/// Per-run counters summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters(pub [u64; Counter::COUNT as usize]);

impl Counters {
    /// The value of one counter.
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize]
    }
}

/// The walker program (CFI and Python walks), verified in a background thread while sampling
/// runs without it.
enum Walker {
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
struct WalkerLoaded {
    ebpf: Ebpf,
    _walkers: Option<ProgramArray<MapData>>,
    outcome: std::result::Result<std::time::Duration, String>,
    /// The off-CPU program, when a run asked for it while the thread held the object: its
    /// fd, or why it did not load.
    off_cpu: Option<std::result::Result<(ProgramFd, u32), String>>,
}

/// The loaded kernel program and its maps.
pub struct KernelProgram {
    /// The sampling program, loaded and verified (its object is owned by the walker thread or
    /// `walker`).
    sample_fd: ProgramFd,
    /// The fork programs, one per record layout (see [`FORK_PROGRAM_NAMES`]), and the exit
    /// program: verified at load, attached when a run first follows children.
    fork_fds: Vec<ProgramFd>,
    exit_fd: ProgramFd,
    tracepoints: Vec<AttachedTracepoint>,
    /// The exec program: verified at load, attached when a run first stops at exec.
    exec_fd: ProgramFd,
    exec_tracepoint: Option<AttachedTracepoint>,
    /// Runs that stop sampling a process when it execs ([`Config::StopAtExec`]).
    stop_at_exec_runs: u64,
    /// Processes that exec'd while runs that stop at exec sampled them, by global tgid.
    execed: HashMap<MapData, u32, u64>,
    /// Processes a system-wide run sampled for the first time, by global tgid.
    new_processes: aya::maps::RingBuf<MapData>,
    /// The timeline ring's map: samples of the runs that record a timeline, with their times.
    timeline_map: MapData,
    /// The timeline ring as mapped into bpfprof, only while a run records a timeline: mapped,
    /// its 1 MiB is resident twice over (the ring is mapped twice so that a record can wrap),
    /// 2 MiB of every run's memory that most runs never read.
    timeline: Option<aya::maps::RingBuf<MapData>>,
    /// Runs that record a timeline ([`Config::TimelineRuns`]).
    timeline_runs: u64,
    /// Sample times read from the timeline ring, by the sample's key split per run (the key's
    /// `runs` holds the one run's bit), in the order read.
    timeline_times: StdHashMap<SampleKey, Vec<u64>>,
    /// Those processes as the kernel remembers them (an entry removed is reported again).
    system_seen: HashMap<MapData, u32, u8>,
    walker: Walker,
    events: Option<AttachedEvents>,
    /// The event and rate attached.
    sampling: Option<Sampling>,
    program_id: u32,
    namespaces: Array<MapData, PidNamespace>,
    /// Slot of each watched namespace, with the number of targets in it.
    namespace_slots: StdHashMap<PidNamespace, (u32, usize)>,
    targets: HashMap<MapData, TargetKey, TargetInfo>,
    /// Children of targets, by global pid, found by the fork tracepoint.
    followed: HashMap<MapData, u32, TargetInfo>,
    config: Array<MapData, u64>,
    /// Runs that follow their targets' children.
    following_runs: u64,
    samples: HashMap<MapData, SampleKey, SampleValue>,
    /// Sample counts moved out of the kernel map, split per run (the key's `runs` holds the
    /// one run's bit), added up: sorted by key, each key once (see [`merge_counts`]). A list
    /// rather than a hash table: at section 4's 27k keys the table took 2-4 MiB, and each
    /// growth held the old table beside the new one, the peak of the run.
    offloaded_samples: Vec<(SampleKey, SampleValue)>,
    /// The off-CPU program (`sched:sched_switch`): verified when a run first asks for off-CPU
    /// time (after the walker, whose walks it repeats), attached while any run records it.
    off_cpu_fd: Option<ProgramFd>,
    /// The off-CPU program's id, for its run-time statistics (`--bpf-stats`).
    off_cpu_program_id: u32,
    /// Its run time and runs when it was attached, where statistics are on.
    off_cpu_stats_at_attach: Option<(u64, u64)>,
    /// Why the off-CPU program did not load, once it was tried.
    off_cpu_error: Option<String>,
    off_cpu_tracepoint: Option<AttachedTracepoint>,
    /// Runs that record off-CPU time ([`Config::OffCpuRuns`]).
    off_cpu_runs: u64,
    /// Target threads off the CPU since their switch-out, by global tid.
    off_cpu_pending: HashMap<MapData, u32, OffCpuPending>,
    /// The program-wide sample count when sample counts were last moved.
    samples_at_last_move: u64,
    /// The samples recorded (all runs) when stacks last moved (see [`Self::offload_when_due`]).
    samples_at_last_offload: u64,
    stacks: HashMap<MapData, StackId, StackFrames>,
    /// Stacks moved out of the kernel map by [`Self::offload_stacks`]. Stack ids are hashes of
    /// the frames, so a stack that recurs after the move is stored again under the same id.
    /// Shared with the samples drained from them, so that a run's end holds each stack once.
    offloaded_stacks: StdHashMap<StackId, std::sync::Arc<[u64]>>,
    /// Addresses of the stacks offloaded since [`Self::take_fresh_frames`] last took them:
    /// what a run symbolizes while it samples (at most [`FRESH_FRAMES_MAX`]).
    fresh_frames: std::collections::HashSet<u64>,
    /// When stacks were last offloaded, and how many moved then.
    last_offload: (std::time::Instant, usize),
    counters: PerCpuArray<MapData, u64>,
    /// Run-time statistics at attach: (run time ns, run count), when stats are on.
    stats_at_attach: Option<(u64, u64)>,
    /// Holds BPF run-time statistics on while bpfprof runs (see [`Self::enable_run_stats`]).
    stats_fd: Option<std::os::fd::OwnedFd>,
    /// The CFI unwinding maps and their resident tables (see [`crate::unwind`]).
    pub unwind: crate::unwind::UnwindMaps,
    /// The Python walk's maps: interpreters' layouts and thread states.
    pub python: PythonMaps,
}

/// The kernel maps of the Python walk.
pub struct PythonMaps {
    /// Layouts of the CPython processes the kernel walks, by host tgid.
    pub processes: HashMap<MapData, u32, profiler_common::PythonProcess>,
    /// `PyThreadState` address by host tid.
    pub threads: HashMap<MapData, u32, u64>,
}

impl KernelProgram {
    /// Loads the program and creates its maps, with an unwind row array of `table_rows` rows
    /// ([`crate::unwind::table_rows_for`]) filled by builds at `build_priority`, the walker
    /// verified as `walker_load` says; nothing is sampled until [`Self::attach`].
    pub fn load(
        table_rows: u32,
        build_priority: crate::unwind::BuildPriority,
        walker_load: WalkerLoad,
    ) -> Result<KernelProgram> {
        check_privileges()?;
        let mut steps = Steps::start("load");
        let mut loader = loader_without_kernel_btf();
        steps.done("aya's loader made");
        // The program reads no kernel structure, so it needs no BTF relocations; `Ebpf::load`
        // would parse the kernel's BTF once more to do them.
        let mut ebpf = loader
            .btf(None)
            .map_max_entries("UNWIND_ROWS", table_rows.max(1))
            .load(PROGRAM_OBJECT)
            .map_err(|e| match &e {
                EbpfError::MapError(aya::maps::MapError::CreateError { io_error, .. })
                    if is_permission(io_error) =>
                {
                    Error::PermissionDenied(format!("the kernel refused to create BPF maps: {e}"))
                }
                _ => Error::Kernel(anyhow!(e).context("loading the eBPF object")),
            })?;
        steps.done("object parsed and maps created");
        // With `WalkerLoad::WithSampling` the walker verifies on a second thread meanwhile
        // (the kernel verifies programs of one object in parallel), and the load returns with
        // both: a run that waits for the walker anyway waits the longer of the two, not the sum.
        let (verified, walker_verified) = {
            let mut programs: StdHashMap<&str, &mut Program> = ebpf.programs_mut().collect();
            let walker_program = match walker_load {
                WalkerLoad::WithSampling => programs.remove(WALKER_PROGRAM_NAME),
                WalkerLoad::Background => None,
            };
            std::thread::scope(|scope| {
                let walker = walker_program.map(|p| scope.spawn(move || verify_walker(Some(p))));
                let verified = verify_sampling(&mut programs, &mut steps);
                let walker = walker.map(|thread| {
                    thread
                        .join()
                        .unwrap_or_else(|_| Err("the walker thread panicked".into()))
                });
                (verified, walker)
            })
        };
        let SamplingPrograms {
            sample_fd,
            program_id,
            fork_fds,
            exit_fd,
            exec_fd,
        } = verified?;

        let mut take = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| Error::Kernel(anyhow!("the eBPF object has no map {name}")))
        };
        let namespaces = Array::try_from(take("PID_NAMESPACES")?).map_err(kernel_err)?;
        let targets = HashMap::try_from(take("TARGETS")?).map_err(kernel_err)?;
        let samples = HashMap::try_from(take("SAMPLES")?).map_err(kernel_err)?;
        let stacks = HashMap::try_from(take("STACKS")?).map_err(kernel_err)?;
        let counters = PerCpuArray::try_from(take("COUNTERS")?).map_err(kernel_err)?;
        let followed = HashMap::try_from(take("FOLLOWED")?).map_err(kernel_err)?;
        let execed = HashMap::try_from(take("EXECED")?).map_err(kernel_err)?;
        let config = Array::try_from(take("CONFIG")?).map_err(kernel_err)?;
        let new_processes =
            aya::maps::RingBuf::try_from(take("NEW_PROCESSES")?).map_err(kernel_err)?;
        let system_seen = HashMap::try_from(take("SYSTEM_SEEN")?).map_err(kernel_err)?;
        let timeline_map = match take(TIMELINE_MAP)? {
            aya::maps::Map::RingBuf(map) => map,
            _ => return Err(kernel_err(anyhow!("{TIMELINE_MAP} is not a ring buffer"))),
        };
        let off_cpu_pending = HashMap::try_from(take("OFF_CPU_PENDING")?).map_err(kernel_err)?;
        let unwind = crate::unwind::UnwindMaps::new(
            take("UNWIND_ROWS")?,
            take("UNWIND_PROCESSES")?,
            crate::unwind::UnwindMode::default(),
            build_priority,
        )
        .map_err(kernel_err)?;
        let python = PythonMaps {
            processes: HashMap::try_from(take("PYTHON_PROCESSES")?).map_err(kernel_err)?,
            threads: HashMap::try_from(take("PYTHON_THREADS")?).map_err(kernel_err)?,
        };
        let mut walkers = ProgramArray::try_from(take("WALKERS")?).map_err(kernel_err)?;
        let walker = match walker_verified {
            None => Walker::Loading(start_walker(ebpf, walkers)),
            Some(verified) => {
                let outcome = verified.and_then(|took| {
                    install_walker(&ebpf, &mut walkers)?;
                    log::info!(
                        "walker program (CFI, Python) verified in {} ms, with the sampling program",
                        took.as_millis()
                    );
                    Ok(took)
                });
                if let Err(e) = &outcome {
                    log::warn!(
                        "the CFI and Python walker did not load ({e}): user stacks use frame \
                         pointers and Python frames are not read"
                    );
                }
                Walker::Done(Box::new(WalkerLoaded {
                    ebpf,
                    _walkers: outcome.is_ok().then_some(walkers),
                    outcome,
                    off_cpu: None,
                }))
            }
        };
        Ok(KernelProgram {
            sample_fd,
            fork_fds,
            exit_fd,
            tracepoints: Vec::new(),
            exec_fd,
            exec_tracepoint: None,
            stop_at_exec_runs: 0,
            execed,
            new_processes,
            system_seen,
            timeline_map,
            timeline: None,
            timeline_runs: 0,
            timeline_times: StdHashMap::new(),
            walker,
            events: None,
            sampling: None,
            program_id,
            namespaces,
            namespace_slots: StdHashMap::new(),
            targets,
            followed,
            config,
            following_runs: 0,
            samples,
            off_cpu_fd: None,
            off_cpu_program_id: 0,
            off_cpu_stats_at_attach: None,
            off_cpu_error: None,
            off_cpu_tracepoint: None,
            off_cpu_runs: 0,
            off_cpu_pending,
            stacks,
            offloaded_stacks: StdHashMap::new(),
            fresh_frames: std::collections::HashSet::new(),
            offloaded_samples: Vec::new(),
            samples_at_last_move: 0,
            samples_at_last_offload: 0,
            last_offload: (std::time::Instant::now(), 0),
            counters,
            stats_at_attach: None,
            stats_fd: None,
            unwind,
            python,
        })
    }

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

    fn join_walker(&mut self) {
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

    fn raw_run_stats(&self) -> Option<(u64, u64)> {
        self.program_run_stats(self.program_id)
    }

    fn program_run_stats(&self, program_id: u32) -> Option<(u64, u64)> {
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

    /// The program's id in the kernel (as `bpftool prog show` lists it).
    pub fn program_id(&self) -> u32 {
        self.program_id
    }

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

    /// Makes the kernel follow the children of `run`'s targets: attaches the fork and exit
    /// tracepoints the first time.
    fn follow_children(&mut self, run: u32) -> Result<()> {
        if self.tracepoints.is_empty() {
            let offset = fork_child_pid_offset()?;
            let fork = FORK_CHILD_PID_OFFSETS
                .iter()
                .position(|o| *o as u64 == offset)
                .ok_or_else(|| {
                    Error::EventUnsupported(format!(
                        "cannot follow children on this kernel: its sched_process_fork record \
                         has child_pid at byte {offset}, a layout bpfprof does not know"
                    ))
                })?;
            let tracefs = ensure_tracefs()?;
            for (fd, name) in [
                (&self.fork_fds[fork], "sched_process_fork"),
                (&self.exit_fd, "sched_process_exit"),
            ] {
                let tp =
                    AttachedTracepoint::attach(&tracefs, "sched", name, fd.as_fd().as_raw_fd())
                        .map_err(|e| {
                            kernel_err(anyhow!(e).context(format!("attaching to sched:{name}")))
                        })?;
                self.tracepoints.push(tp);
            }
        }
        self.following_runs |= 1 << run;
        self.write_following()
    }

    fn write_following(&mut self) -> Result<()> {
        self.config
            .set(
                Config::Following as u32,
                u64::from(self.following_runs.count_ones()),
                0,
            )
            .map_err(kernel_err)
    }

    /// Makes `run` stop sampling a process the moment it execs (or not, for a new run in the
    /// slot): the process is reported by [`Self::execed`] and sampled again only once
    /// [`Self::resume_target`] or [`Self::resume_followed`] says so. Attaches the exec
    /// tracepoint the first time.
    pub fn stop_at_exec(&mut self, run: u32, stop: bool) -> Result<()> {
        if run >= MAX_RUNS {
            return Err(Error::Kernel(anyhow!("run slot {run} out of range")));
        }
        if stop && self.exec_tracepoint.is_none() {
            let tracefs = ensure_tracefs()?;
            let tp = AttachedTracepoint::attach(
                &tracefs,
                "sched",
                "sched_process_exec",
                self.exec_fd.as_fd().as_raw_fd(),
            )
            .map_err(|e| kernel_err(anyhow!(e).context("attaching to sched:sched_process_exec")))?;
            self.exec_tracepoint = Some(tp);
        }
        if stop {
            self.stop_at_exec_runs |= 1 << run;
        } else {
            self.stop_at_exec_runs &= !(1 << run);
        }
        self.config
            .set(Config::StopAtExec as u32, self.stop_at_exec_runs, 0)
            .map_err(kernel_err)?;
        if !stop {
            // A new run in the slot inherits no exec of the last one's processes.
            self.take_execed(run);
        }
        Ok(())
    }

    /// Global pids of the processes that exec'd while `run` sampled them (and stop-at-exec
    /// was on): `run` no longer samples them. Each is reported once.
    pub fn take_execed(&mut self, run: u32) -> Vec<u32> {
        let entries: Vec<(u32, u64)> = self.execed.iter().filter_map(|e| e.ok()).collect();
        let mut pids = Vec::new();
        for (pid, runs) in entries {
            if runs & (1 << run) == 0 {
                continue;
            }
            pids.push(pid);
            // The kernel may set another run's bit meanwhile: a lost bit is found again by
            // that run's own check of its processes' credentials on its next tick.
            let left = runs & !(1 << run);
            let _ = if left == 0 {
                self.execed.remove(&pid)
            } else {
                self.execed.insert(pid, left, 0)
            };
        }
        pids
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

    /// Samples the followed child `pid` for `run` again (after an exec its owner may profile).
    pub fn resume_followed(&mut self, run: u32, pid: u32) -> Result<()> {
        let mut info = self.followed.get(&pid, 0).unwrap_or_default();
        info.runs |= 1 << run;
        info.follow |= 1 << run;
        self.followed.insert(pid, info, 0).map_err(kernel_err)
    }

    /// Stops sampling the followed child `pid` for `run` (its owner may no longer profile it);
    /// other runs following it keep it.
    pub fn drop_followed(&mut self, run: u32, pid: u32) {
        if let Ok(mut info) = self.followed.get(&pid, 0) {
            info.runs &= !(1 << run);
            info.follow &= !(1 << run);
            let _ = if info.runs == 0 {
                self.followed.remove(&pid)
            } else {
                self.followed.insert(pid, info, 0)
            };
        }
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

    /// Global pids of the children the kernel follows for `run`.
    pub fn followed(&self, run: u32) -> Vec<u32> {
        self.followed
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(_, info)| info.runs & (1 << run) != 0)
            .map(|(pid, _)| pid)
            .collect()
    }

    /// Stops following `pid` (a thread, not a process, or one no longer wanted).
    pub fn forget_followed(&mut self, pid: u32) {
        let _ = self.followed.remove(&pid);
    }

    /// Stops following children for `run`: its bit leaves every followed child.
    pub fn end_following(&mut self, run: u32) {
        if self.following_runs & (1 << run) == 0 {
            return;
        }
        let entries: Vec<(u32, TargetInfo)> = self.followed.iter().filter_map(|e| e.ok()).collect();
        for (pid, mut info) in entries {
            if info.runs & (1 << run) == 0 {
                continue;
            }
            info.runs &= !(1 << run);
            info.follow &= !(1 << run);
            let _ = if info.runs == 0 {
                self.unwind.unload_process(pid);
                self.followed.remove(&pid)
            } else {
                self.followed.insert(pid, info, 0)
            };
        }
        self.following_runs &= !(1 << run);
        let _ = self.write_following();
    }

    /// Makes `run` record its targets' time off the CPU as `off_cpu` says (the settings are
    /// the program's: the pool gives runs that differ in them different programs), from when
    /// [`Self::attach_off_cpu`] attaches the program. Quick: the first time, the off-CPU program
    /// (which repeats the walker's walks) is verified on the walker's thread, after the walker,
    /// so that [`Self::walker_pending`] holds until both are done.
    pub fn record_off_cpu(&mut self, run: u32, off_cpu: OffCpu) -> Result<()> {
        if run >= MAX_RUNS {
            return Err(Error::Kernel(anyhow!("run slot {run} out of range")));
        }
        check_sched_switch_format()?;
        for (entry, value) in [
            (Config::OffCpuPreempted, u64::from(off_cpu.preempted)),
            (Config::OffCpuMinNs, off_cpu.min_ns),
        ] {
            self.config
                .set(entry as u32, value, 0)
                .map_err(kernel_err)?;
        }
        let verifying =
            self.off_cpu_fd.is_some() || self.off_cpu_error.is_some() || self.off_cpu_runs != 0;
        self.off_cpu_runs |= 1 << run;
        self.config
            .set(Config::OffCpuRuns as u32, self.off_cpu_runs, 0)
            .map_err(kernel_err)?;
        if !verifying {
            let previous = std::mem::replace(&mut self.walker, Walker::Joining);
            self.walker = Walker::Loading(std::thread::spawn(move || {
                let mut loaded = match previous {
                    Walker::Loading(handle) => match handle.join() {
                        Ok(loaded) => loaded,
                        // The thread panicked with the object: nothing can be loaded.
                        Err(payload) => std::panic::resume_unwind(payload),
                    },
                    Walker::Done(loaded) => *loaded,
                    Walker::Joining => unreachable!("the walker is never left joining"),
                };
                loaded.off_cpu = Some(verify_off_cpu(&mut loaded.ebpf));
                loaded
            }));
        }
        Ok(())
    }

    /// Attaches the off-CPU program once verified (waiting for that), for the runs
    /// [`Self::record_off_cpu`] set up; a no-op when attached.
    pub fn attach_off_cpu(&mut self) -> Result<()> {
        if self.off_cpu_tracepoint.is_some() || self.off_cpu_runs == 0 {
            return Ok(());
        }
        self.join_walker();
        let Some(fd) = self.off_cpu_fd.as_ref() else {
            let why = self
                .off_cpu_error
                .clone()
                .unwrap_or_else(|| "the walker thread did not finish".into());
            return Err(Error::Kernel(anyhow!(
                "the off-CPU program did not load: {why}"
            )));
        };
        let tracefs = ensure_tracefs()?;
        let tp =
            AttachedTracepoint::attach(&tracefs, "sched", "sched_switch", fd.as_fd().as_raw_fd())
                .map_err(|e| kernel_err(anyhow!(e).context("attaching to sched:sched_switch")))?;
        self.off_cpu_tracepoint = Some(tp);
        self.off_cpu_stats_at_attach = self.program_run_stats(self.off_cpu_program_id);
        Ok(())
    }

    /// Stops recording off-CPU time for `run` (a no-op for a run that did not): threads still
    /// off the CPU add nothing to it when they return, and their pending entries forget it.
    /// Call before draining the run's samples.
    pub fn end_off_cpu(&mut self, run: u32) {
        if self.off_cpu_runs & (1 << run) == 0 {
            return;
        }
        self.off_cpu_runs &= !(1 << run);
        let _ = self
            .config
            .set(Config::OffCpuRuns as u32, self.off_cpu_runs, 0);
        if self.off_cpu_runs == 0 {
            // Nothing stays attached to every context switch of the machine once no run asks.
            // Closing the tracepoint waits for an RCU grace period (~80 ms): not here.
            if let Some(tp) = self.off_cpu_tracepoint.take() {
                std::thread::spawn(move || drop(tp));
            }
        }
        let entries: Vec<(u32, OffCpuPending)> =
            self.off_cpu_pending.iter().filter_map(|e| e.ok()).collect();
        for (tid, mut pending) in entries {
            if pending.key.runs & (1 << run) == 0 {
                continue;
            }
            pending.key.runs &= !(1 << run);
            let _ = if pending.key.runs == 0 {
                self.off_cpu_pending.remove(&tid)
            } else {
                self.off_cpu_pending.insert(tid, pending, 0)
            };
        }
    }

    /// Makes `run` record a timeline: from now on each of its CPU samples' times is kept too,
    /// and [`crate::kernel::drain::drain`] gives each sample its times.
    pub fn record_timeline(&mut self, run: u32) -> Result<()> {
        if run >= MAX_RUNS {
            return Err(Error::Kernel(anyhow!("run slot {run} out of range")));
        }
        if self.timeline.is_none() {
            self.timeline = Some(self.map_timeline()?);
        }
        // What an earlier run of the slot left is not this run's: samples that raced with its
        // end are still in the ring, or were read after it took its times.
        self.read_timeline();
        self.take_times(run);
        self.timeline_runs |= 1 << run;
        self.config
            .set(Config::TimelineRuns as u32, self.timeline_runs, 0)
            .map_err(kernel_err)
    }

    /// Stops recording a timeline for `run` (a no-op for a run that did not), reading what the
    /// ring holds first. Call before draining the run's samples.
    pub fn end_timeline(&mut self, run: u32) {
        if self.timeline_runs & (1 << run) == 0 {
            return;
        }
        self.read_timeline();
        self.timeline_runs &= !(1 << run);
        let _ = self
            .config
            .set(Config::TimelineRuns as u32, self.timeline_runs, 0);
        if self.timeline_runs == 0 {
            // What the kernel writes after this is no run's: the next run to record a
            // timeline reads it and drops it.
            self.timeline = None;
        }
    }

    /// Maps the timeline ring (a second handle on the map, so that unmapping it leaves the
    /// map to the program).
    fn map_timeline(&self) -> Result<aya::maps::RingBuf<MapData>> {
        use std::os::fd::AsFd;
        let fd = self
            .timeline_map
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| kernel_err(anyhow!(e).context("duplicating the timeline ring's fd")))?;
        let map = MapData::from_fd(fd).map_err(kernel_err)?;
        aya::maps::RingBuf::try_from(aya::maps::Map::RingBuf(map)).map_err(kernel_err)
    }

    /// Moves what the timeline ring holds into `timeline_times`, each sample's time under its
    /// key for each run that records a timeline; call at every tick, so that the ring (room
    /// for 0.1 s of 145,000 samples a second) does not fill.
    fn read_timeline(&mut self) {
        let Some(ring) = &mut self.timeline else {
            return;
        };
        // Records of runs that no longer record a timeline are read and dropped.
        while let Some(item) = ring.next() {
            if item.len() < std::mem::size_of::<TimelineRecord>() {
                continue;
            }
            // SAFETY: the kernel wrote a whole `TimelineRecord` (plain integers) here; the
            // ring's data is 8-aligned, read unaligned anyway.
            let record: TimelineRecord = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            let runs = record.key.runs & self.timeline_runs;
            for run in 0..MAX_RUNS {
                if runs & (1 << run) != 0 {
                    let key = SampleKey {
                        runs: 1 << run,
                        ..record.key
                    };
                    self.timeline_times
                        .entry(key)
                        .or_default()
                        .push(record.time_ns);
                }
            }
        }
    }

    /// Takes the sample times of `run` read so far, by the sample's key (as
    /// [`Self::take_samples`] gives keys); empty for a run without a timeline.
    pub(crate) fn take_times(&mut self, run: u32) -> StdHashMap<SampleKey, Vec<u64>> {
        let bit = 1u64 << run;
        let mut times = StdHashMap::new();
        self.timeline_times.retain(|key, t| {
            if key.runs == bit {
                times.insert(*key, std::mem::take(t));
                false
            } else {
                true
            }
        });
        times
    }

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

    /// Deletes every stack, in the kernel and offloaded; call when no run is recording, so
    /// that a long-lived daemon does not keep the stacks of finished runs.
    pub fn clear_stacks(&mut self) {
        let ids: Vec<StackId> = self.stacks.keys().filter_map(|id| id.ok()).collect();
        for id in ids {
            let _ = self.stacks.remove(&id);
        }
        self.offloaded_stacks = StdHashMap::new();
        self.fresh_frames = std::collections::HashSet::new();
    }

    /// Forgets the stacks moved to userspace that no sample count still refers to (in the
    /// kernel map or moved out): for a recording that takes its samples out in windows while
    /// it runs, so that the stacks of windows already taken do not pile up. A stack that
    /// recurs is stored again by the kernel (its map no longer has it since the move).
    pub fn forget_taken_stacks(&mut self) -> usize {
        let mut wanted: std::collections::HashSet<StackId> = self
            .samples
            .keys()
            .filter_map(|k| k.ok())
            .chain(self.offloaded_samples.iter().map(|(k, _)| *k))
            .flat_map(|k| [k.user_stack, k.kernel_stack, k.python_stack])
            .collect();
        wanted.remove(&0);
        let before = self.offloaded_stacks.len();
        self.offloaded_stacks.retain(|id, _| wanted.contains(id));
        self.offloaded_stacks.shrink_to_fit();
        before - self.offloaded_stacks.len()
    }

    /// Stacks moved to userspace and kept there.
    pub fn offloaded_stack_count(&self) -> usize {
        self.offloaded_stacks.len()
    }

    /// Takes the addresses of the stacks moved to userspace since the last call (symbolizing
    /// them while the run goes on leaves less to do when it ends).
    pub fn take_fresh_frames(&mut self) -> Vec<u64> {
        self.fresh_frames.drain().collect()
    }

    /// Moves stacks and sample counts from the kernel maps to userspace when due, so that
    /// neither map fills up however many distinct stacks a long run sees; call it often
    /// (every 100-200 ms). Samples keep referring to the same stack ids.
    ///
    /// Stacks move every half second, and at every call while new ones keep arriving (more
    /// than 1/64 of the map since the last move): the map holds 4096 deep stacks, so a burst
    /// of new stacks is moved every 100-200 ms instead of waiting for the half second. Sample
    /// counts move once a quarter of the sample map's size in samples has been recorded since
    /// the last move (so at most that many new keys can have appeared): a count incremented
    /// between its read and its deletion loses that increment, which [`Self::take_samples`]'s
    /// callers see as `samples_seen` above the samples drained, so moves are kept rare.
    pub fn offload_when_due(&mut self) {
        self.walker_ready();
        if self.timeline_runs != 0 {
            self.read_timeline();
        }
        let recorded: Option<u64> = self
            .counters
            .get(&ALL_RUNS_SAMPLES_INDEX, 0)
            .ok()
            .map(|r| r.iter().sum());
        let (at, moved) = self.last_offload;
        // Each sample adds at most one stack: once a quarter of the map's size in samples
        // came since the last move, the map may be filling, whatever the last move found (a
        // run sampling at once fills it within the half second at 4999 Hz on a program of
        // many distinct stacks: section 4 lost 660 of 27.8k samples).
        let busy = moved >= STACK_MAP_ENTRIES as usize / 64
            || recorded.is_some_and(|r| {
                r.saturating_sub(self.samples_at_last_offload) >= STACK_MAP_ENTRIES as u64 / 4
            });
        let interval = if self.unwind.awaits_samples() {
            OFFLOAD_INTERVAL_WHILE_BUILDING
        } else {
            OFFLOAD_INTERVAL
        };
        if busy || at.elapsed() >= interval {
            let moved = self.offload_stacks();
            self.last_offload = (std::time::Instant::now(), moved);
            self.samples_at_last_offload = recorded.unwrap_or(self.samples_at_last_offload);
        }
        let Some(recorded) = recorded else {
            return;
        };
        if recorded.saturating_sub(self.samples_at_last_move) >= SAMPLE_MAP_ENTRIES as u64 / 4 {
            self.samples_at_last_move = recorded;
            let moved = self.move_sample_counts(|_| true);
            log::debug!("moved {moved} sample counts to userspace");
        }
    }

    /// Moves the kernel's sample counts whose key `select` picks into `offloaded_samples`,
    /// one count per run the key serves; returns how many keys moved.
    fn move_sample_counts(&mut self, select: impl Fn(&SampleKey) -> bool) -> usize {
        let keys: Vec<SampleKey> = self
            .samples
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| select(k))
            .collect();
        let mut moved = 0;
        for key in keys {
            if let Ok(value) = self.samples.get(&key, 0) {
                let _ = self.samples.remove(&key);
                for run in 0..MAX_RUNS {
                    if key.runs & (1 << run) != 0 {
                        let per_run = SampleKey {
                            runs: 1 << run,
                            ..key
                        };
                        self.offloaded_samples.push((per_run, value));
                    }
                }
                moved += 1;
            }
        }
        if moved > 0 {
            merge_counts(&mut self.offloaded_samples);
        }
        moved
    }

    /// Takes every sample count of `run`, from the kernel map and from userspace, so that the
    /// run's slot can be reused. Call after [`Self::detach`] or [`Self::remove_target`] for a
    /// complete count.
    pub(crate) fn take_samples(&mut self, run: u32) -> Vec<(SampleKey, SampleValue)> {
        let bit = 1u64 << run;
        self.move_sample_counts(|key| key.runs & bit != 0);
        if self
            .offloaded_samples
            .iter()
            .all(|(key, _)| key.runs == bit)
        {
            // The one run (a command line's): its list is taken, not copied.
            return std::mem::take(&mut self.offloaded_samples);
        }
        let mut counts = Vec::new();
        self.offloaded_samples.retain(|(key, count)| {
            if key.runs == bit {
                counts.push((*key, *count));
                false
            } else {
                true
            }
        });
        counts
    }

    /// Moves every stack from the kernel map to userspace; returns how many moved.
    fn offload_stacks(&mut self) -> usize {
        let ids: Vec<StackId> = self.stacks.keys().filter_map(|id| id.ok()).collect();
        let mut moved = 0;
        for id in ids {
            if let Ok(frames) = self.stacks.get(&id, 0) {
                let frames = frames_of(&frames);
                // A stack is the kernel's report of where targets run: objects without a
                // table yet get theirs first.
                self.unwind.note_sampled(frames.iter().copied());
                // Best effort: past the cap, the rest is symbolized when the run ends.
                if self.fresh_frames.len() < FRESH_FRAMES_MAX {
                    self.fresh_frames
                        .extend(crate::symbolize::lookup_addresses(&frames));
                }
                self.offloaded_stacks.insert(id, frames.into());
                moved += 1;
            }
            let _ = self.stacks.remove(&id);
        }
        if moved > 0 {
            log::debug!("moved {moved} stacks to userspace");
        }
        moved
    }

    /// The Python stacks recorded so far, with the runs (bit mask) and the pid (in its
    /// namespace) of the process they belong to: what userspace must name while the process
    /// still lives. A pid alone could be another namespace's process in another run.
    pub fn python_stack_ids(&self) -> Vec<(u64, u32, StackId)> {
        let kernel = self.samples.keys().filter_map(|k| k.ok());
        let moved = self.offloaded_samples.iter().map(|(k, _)| *k);
        let mut ids: Vec<(u64, u32, StackId)> = kernel
            .chain(moved)
            .filter(|k| k.python_stack != 0)
            .map(|k| (k.runs, k.pid, k.python_stack))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The frames of stack `id` (innermost first), wherever it is; empty for id 0 or a stack
    /// that was never stored. A stack moved to userspace is shared, not copied.
    pub(crate) fn stack(&self, id: StackId) -> Result<std::sync::Arc<[u64]>> {
        if id == 0 {
            return Ok(std::sync::Arc::from([]));
        }
        if let Some(frames) = self.offloaded_stacks.get(&id) {
            return Ok(frames.clone());
        }
        match self.stacks.get(&id, 0) {
            Ok(frames) => Ok(frames_of(&frames).into()),
            Err(aya::maps::MapError::KeyNotFound) => Ok(std::sync::Arc::from([])),
            Err(e) => Err(kernel_err(
                anyhow!(e).context(format!("reading stack {id:#x}")),
            )),
        }
    }

    /// A handle that disables this program's sampling events from another thread; None when
    /// none are attached.
    pub fn event_stopper(&self) -> Option<perf_events::EventStopper> {
        self.events.as_ref().map(AttachedEvents::stopper)
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

    /// How many Python stacks the program has stored new in its stack map so far (all runs);
    /// `None` where the count cannot be read.
    pub fn python_stacks_stored(&self) -> Option<u64> {
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
        Ok(())
    }

    /// The counters of `run`, summed over CPUs.
    pub fn counters(&self, run: u32) -> Result<Counters> {
        let mut out = Counters::default();
        for counter in Counter::ALL {
            let values = self
                .counters
                .get(&counter.index(run), 0)
                .map_err(kernel_err)?;
            out.0[counter as usize] = values.iter().sum();
        }
        Ok(out)
    }
}

/// Verifies the walker program of `ebpf` on a thread of its own and puts it in the program
/// array the sampling program tail-calls, while sampling starts without it.
fn start_walker(
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
fn verify_walker(
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
fn install_walker(
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

/// The sampling and tracepoint programs, verified.
struct SamplingPrograms {
    sample_fd: ProgramFd,
    program_id: u32,
    fork_fds: Vec<ProgramFd>,
    exit_fd: ProgramFd,
    exec_fd: ProgramFd,
}

/// Verifies the sampling program and the tracepoint programs among `programs`.
fn verify_sampling(
    programs: &mut StdHashMap<&str, &mut Program>,
    steps: &mut Steps,
) -> Result<SamplingPrograms> {
    let program: &mut PerfEvent = programs
        .get_mut(PROGRAM_NAME)
        .ok_or_else(|| Error::Kernel(anyhow!("the eBPF object has no {PROGRAM_NAME}")))?
        .deref_mut()
        .try_into()
        .map_err(|e: ProgramError| Error::Kernel(e.into()))?;
    program
        .load()
        .map_err(|e| load_error(e, "the sampling program"))?;
    let program_id = program.info().map_err(|e| Error::Kernel(e.into()))?.id();
    let sample_fd = clone_fd(program.fd())?;
    steps.done("sampling program verified");
    log::info!("loaded program id {program_id}");
    // The tracepoint programs are small: verified now, so that attaching them later needs
    // only their fds.
    let mut tracepoint_fd = |name: &str| -> Result<ProgramFd> {
        let tp: &mut TracePoint = programs
            .get_mut(name)
            .ok_or_else(|| kernel_err(anyhow!("the eBPF object has no {name}")))?
            .deref_mut()
            .try_into()
            .map_err(|e: ProgramError| kernel_err(e))?;
        tp.load()
            .map_err(|e| kernel_err(anyhow!(e).context(format!("verifying {name}"))))?;
        clone_fd(tp.fd())
    };
    let fork_fds = FORK_PROGRAM_NAMES
        .iter()
        .map(|name| tracepoint_fd(name))
        .collect::<Result<Vec<_>>>()?;
    let exit_fd = tracepoint_fd(EXIT_PROGRAM_NAME)?;
    let exec_fd = tracepoint_fd(EXEC_PROGRAM_NAME)?;
    steps.done("tracepoint programs verified");
    Ok(SamplingPrograms {
        sample_fd,
        program_id,
        fork_fds,
        exit_fd,
        exec_fd,
    })
}

/// Verifies the off-CPU program of `ebpf`: its fd and id, or why the kernel refused it.
fn verify_off_cpu(ebpf: &mut Ebpf) -> std::result::Result<(ProgramFd, u32), String> {
    let started = std::time::Instant::now();
    let tp: &mut TracePoint = ebpf
        .program_mut(OFF_CPU_PROGRAM_NAME)
        .ok_or_else(|| format!("the eBPF object has no {OFF_CPU_PROGRAM_NAME}"))?
        .try_into()
        .map_err(|e: ProgramError| e.to_string())?;
    tp.load()
        .map_err(|e| load_error(e, "the off-CPU program").to_string())?;
    let fd = clone_fd(tp.fd()).map_err(|e| e.to_string())?;
    let id = tp.info().map_err(|e| e.to_string())?.id();
    log::info!(
        "off-CPU program verified in {} ms",
        started.elapsed().as_millis()
    );
    Ok((fd, id))
}

/// A program that failed to load, as the error a person can act on: permission, a helper this
/// kernel lacks (probed, not guessed from the version), or the verifier's own message.
fn load_error(e: ProgramError, what: &str) -> Error {
    match &e {
        ProgramError::SyscallError(s) if is_permission(&s.io_error) => {
            Error::PermissionDenied(format!("the kernel refused to load {what}: {e}"))
        }
        _ => {
            let missing = helpers::missing_helpers();
            if missing.is_empty() {
                Error::Kernel(anyhow!(e).context(format!("verifying {what}")))
            } else {
                Error::EventUnsupported(format!(
                    "this kernel lacks what {what} needs: {}; bpfprof supports Linux 6.1 and \
                     later (`bpfprof doctor` checks a machine)",
                    missing.join(", ")
                ))
            }
        }
    }
}

/// Our own copy of a loaded program's fd, usable without the object.
fn clone_fd(fd: std::result::Result<&ProgramFd, ProgramError>) -> Result<ProgramFd> {
    fd.map_err(kernel_err)?
        .try_clone()
        .map_err(|e| kernel_err(anyhow!(e).context("duplicating a program fd")))
}

/// Sorts moved sample counts by key and adds up the counts of each key into one entry, in
/// place: a key the kernel made again after its count moved comes back at the next move.
fn merge_counts(counts: &mut Vec<(SampleKey, SampleValue)>) {
    let order = |k: &SampleKey| {
        (
            k.runs,
            k.pid,
            k.tid,
            k.user_stack,
            k.kernel_stack,
            k.python_stack,
            k.kind,
            k.reserved,
        )
    };
    counts.sort_unstable_by_key(|(k, _)| order(k));
    counts.dedup_by(|(key, value), (kept_key, kept)| {
        let same = key == kept_key;
        if same {
            kept.count += value.count;
            kept.off_cpu_ns += value.off_cpu_ns;
        }
        same
    });
}

fn frames_of(stack: &StackFrames) -> Vec<u64> {
    let len = (stack.len as usize).min(MAX_STACK_DEPTH);
    stack.ips[..len].to_vec()
}

/// Where the sched_process_fork tracepoint record keeps `child_pid` on this kernel, from its
/// format file in tracefs (mounted here if nothing has mounted it yet).
fn fork_child_pid_offset() -> Result<u64> {
    let tracefs = ensure_tracefs()?;
    let path = tracefs.join("events/sched/sched_process_fork/format");
    let format = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {}", path.display()))
        .map_err(Error::Kernel)?;
    format
        .lines()
        .find(|l| l.contains(" child_pid;"))
        .and_then(|l| l.split("offset:").nth(1))
        .and_then(|rest| rest.split(';').next())
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| Error::Kernel(anyhow!("no child_pid field in {}", path.display())))
}

/// Checks that this kernel's `sched_switch` record has `prev_state` and `next_pid` where the
/// off-CPU program reads them ([`SCHED_SWITCH_OFFSETS`]).
fn check_sched_switch_format() -> Result<()> {
    let tracefs = ensure_tracefs()?;
    let path = tracefs.join("events/sched/sched_switch/format");
    let format = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {}", path.display()))
        .map_err(Error::Kernel)?;
    let offset = |field: &str| -> Option<usize> {
        format
            .lines()
            .find(|l| l.contains(&format!(" {field};")))
            .and_then(|l| l.split("offset:").nth(1))
            .and_then(|rest| rest.split(';').next())
            .and_then(|n| n.trim().parse().ok())
    };
    let found = (offset("prev_state"), offset("next_pid"));
    if found != (Some(SCHED_SWITCH_OFFSETS.0), Some(SCHED_SWITCH_OFFSETS.1)) {
        return Err(Error::EventUnsupported(format!(
            "cannot record off-CPU time on this kernel: its sched_switch record has prev_state \
             and next_pid at {found:?}, a layout bpfprof does not know"
        )));
    }
    Ok(())
}

/// The tracefs mount, mounting it at /sys/kernel/tracing when no one has (as perf needs too).
pub fn ensure_tracefs() -> Result<std::path::PathBuf> {
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if std::path::Path::new(dir).join("events").is_dir() {
            return Ok(dir.into());
        }
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: NUL-terminated strings that outlive the call; no data argument.
    let rc = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(Error::EventUnsupported(format!(
            "following children needs tracefs, which is not mounted and could not be mounted \
             at /sys/kernel/tracing ({e}); mount it, or profile without following children"
        )));
    }
    Ok("/sys/kernel/tracing".into())
}

fn target_key(target: &Target) -> TargetKey {
    TargetKey {
        ns: target.ns,
        tgid: target.ns_pid,
        reserved: 0,
    }
}

fn kernel_err(e: impl Into<anyhow::Error>) -> Error {
    Error::Kernel(e.into())
}

fn is_permission(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
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

/// CPU time (user and system) the calling thread has used (defined with the unwind tables'
/// CPU budget, the lowest layer that measures it).
pub use crate::unwind::table::thread_cpu_time;

/// Steps of a start-up, each logged (`-v`) with its wall time and the calling thread's CPU
/// time: the breakdown of the time to a run's first sample.
pub struct Steps {
    what: String,
    at: std::time::Instant,
    cpu: std::time::Duration,
}

impl Steps {
    /// Starts timing the steps of `what` (the prefix of each line).
    pub fn start(what: impl Into<String>) -> Steps {
        Steps {
            what: what.into(),
            at: std::time::Instant::now(),
            cpu: thread_cpu_time(),
        }
    }

    /// Logs the step that ends now.
    pub fn done(&mut self, step: &str) {
        let (at, cpu) = (std::time::Instant::now(), thread_cpu_time());
        log::info!(
            "{}: {step} in {:.1} ms ({:.1} ms of CPU)",
            self.what,
            (at - self.at).as_secs_f64() * 1e3,
            cpu.saturating_sub(self.cpu).as_secs_f64() * 1e3
        );
        (self.at, self.cpu) = (at, cpu);
    }
}

/// An aya loader that did not read the kernel's BTF: aya 0.14's `EbpfLoader::new()` parses
/// `/sys/kernel/btf/vmlinux` (6 MB) whatever the caller then passes to `btf()`, and the profiler
/// needs no BTF relocation. That parse was 14 ms of CPU per run before the first sample and,
/// at about 9 MiB of heap, the peak RSS of a small profile. The constructor runs on a thread of
/// its own under a seccomp filter that fails its `open` calls with `ENOENT`, which the
/// constructor takes as "no kernel BTF" (as on a kernel built without it); the filter dies with
/// the thread. Where the filter cannot be installed (a seccomp policy that forbids it), the
/// loader is made as aya makes it and the parse is paid.
fn loader_without_kernel_btf() -> EbpfLoader<'static> {
    std::thread::Builder::new()
        .name("bpfprof-loader".into())
        .spawn(|| {
            if let Err(e) = refuse_opens_on_this_thread() {
                log::debug!("the kernel's BTF is parsed for aya's loader: {e}");
            }
            EbpfLoader::new()
        })
        .ok()
        .and_then(|thread| thread.join().ok())
        .unwrap_or_else(EbpfLoader::new)
}

/// Makes every `open`, `openat` and `openat2` of the calling thread (only) fail with `ENOENT`
/// from now on, until it exits.
fn refuse_opens_on_this_thread() -> std::result::Result<(), seccompiler::Error> {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
    #[cfg(target_arch = "x86_64")]
    let calls = [libc::SYS_open, libc::SYS_openat, libc::SYS_openat2];
    #[cfg(not(target_arch = "x86_64"))]
    let calls = [libc::SYS_openat, libc::SYS_openat2];
    let arch = TargetArch::try_from(std::env::consts::ARCH)?;
    let filter = SeccompFilter::new(
        calls.iter().map(|&call| (call, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOENT as u32),
        arch,
    )?;
    let program = BpfProgram::try_from(filter)?;
    seccompiler::apply_filter(&program)
}

/// Fails early, with a message a person can act on, when the process cannot use BPF.
pub fn check_privileges() -> Result<()> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status = procfs::process::Process::myself()
        .and_then(|p| p.status())
        .context("reading /proc/self/status")?;
    let effective = status.capeff;
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    Err(Error::PermissionDenied(
        "bpfprof needs root, or the CAP_BPF and CAP_PERFMON capabilities, to load its kernel \
         program (try: sudo bpfprof ...)"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moved counts of one key, moved twice, become one entry with their sums; other keys stay.
    #[test]
    fn moved_counts_of_one_key_are_added_up() {
        let key = |tid, user_stack| SampleKey {
            runs: 1,
            pid: 7,
            tid,
            user_stack,
            ..Default::default()
        };
        let value = |count, off_cpu_ns| SampleValue { count, off_cpu_ns };
        let mut counts = vec![
            (key(2, 10), value(3, 0)),
            (key(1, 10), value(1, 5)),
            (key(2, 10), value(4, 1)),
            (key(2, 11), value(1, 0)),
            (key(1, 10), value(2, 0)),
        ];
        merge_counts(&mut counts);
        assert_eq!(
            counts,
            vec![
                (key(1, 10), value(3, 5)),
                (key(2, 10), value(7, 1)),
                (key(2, 11), value(1, 0)),
            ]
        );
    }

    /// The loader is made without reading the kernel's BTF, and the filter that keeps it from
    /// reading it stays on the loader's thread.
    #[test]
    fn loader_skips_the_kernel_btf_and_only_its_thread_is_filtered() {
        if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            eprintln!("skipped: this kernel has no BTF to skip");
            return;
        }
        let loader = loader_without_kernel_btf();
        // aya's loader shows its fields only through Debug; BTF is the first.
        let shown = format!("{loader:?}");
        assert!(
            shown.starts_with("EbpfLoader { btf: None,"),
            "the loader holds the kernel's BTF: {}",
            &shown[..shown.len().min(200)]
        );
        // The calling thread, and a new one, still open files.
        std::fs::read("/sys/kernel/btf/vmlinux").expect("this thread opens files");
        std::thread::spawn(|| std::fs::read("/proc/self/status").expect("another thread opens"))
            .join()
            .expect("the thread ran");
    }
}
