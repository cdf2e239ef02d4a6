//! One recording, from its targets to a [`Profile`]: the single pipeline behind both the
//! command line (`record`) and the daemon. [`Recording::add_target`] registers processes with a
//! pooled kernel program, [`Recording::tick`] keeps the run healthy while it samples (moves
//! stacks out of the kernel, refreshes memory maps, picks up followed children, notes exits),
//! [`Recording::collect`] takes what the kernel recorded, and [`Collected::assemble`]
//! symbolizes and aggregates it. Only `add_target`, `tick` and `collect` need the kernel
//! program; `assemble` can run anywhere (the daemon runs it on its symbolizer thread).

pub mod aggregate;
pub mod request;
pub mod run_loop;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use profiler_common::{Counter, PidNamespace, SampleKind};

use crate::{
    error::Result,
    kernel::drain::drain,
    kernel::perf_events::EventStopper,
    kernel::pool::{ProgramPool, Slot},
    kernel::Counters,
    process::target::{Owner, Target},
    process::{copies::CopyBudget, maps::ProcessMaps},
    profile::sample::Sample,
    profile::{
        Losses, Profile, ProfileMeta, ProfiledTarget, RunCost, RunEnd, ShortfallCause, Throttled,
        UntabledObject, Unwound,
    },
    python::{
        shares::NamingShares,
        stacks::{PythonMode, PythonTracking},
    },
    recording::aggregate::{aggregate, AggregateOptions, TargetSamples},
    recording::request::{RecordingRequest, Scope, SystemScope},
    sampling::{KernelLimits, Sampling, SamplingRequest},
    symbolize::{Symbolizer, Warm, WarmSink},
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

/// How often a system-wide run re-reads the maps of a process past its youth that runs no
/// CPython (whose thread list the Python walk needs every [`MAPS_REFRESH`]). Re-reading the
/// maps of every process on the machine twice a second was a sixth of the agent's CPU; a
/// library such a process loads later gets its unwind table up to this much later, and its
/// samples are named all the same (maps are re-read before each window is named).
pub const SYSTEM_MAPS_REFRESH: Duration = Duration::from_secs(5);

/// Most processes a system-wide recording takes in, live and exited (an exited one's maps are
/// kept to name its samples): each costs its memory maps, and while it lives its unwind tables
/// and Python state. Samples of processes past the cap are counted, never named.
pub const MAX_SYSTEM_PROCESSES: usize = 4096;

/// How a system-wide run shows a process that exited before it was taken in.
const EXITED_PROCESS: &str = "[exited process]";

/// Where a recording reaches its kernel programs: the command line owns its pool; the daemon
/// shares one between its runs behind a lock.
pub trait PoolAccess {
    /// Runs `f` on the pool, holding its lock (where it has one) only while `f` runs.
    fn with_pool<R>(&mut self, f: impl FnOnce(&mut ProgramPool) -> R) -> R;
}

impl PoolAccess for ProgramPool {
    fn with_pool<R>(&mut self, f: impl FnOnce(&mut ProgramPool) -> R) -> R {
        f(self)
    }
}

impl PoolAccess for &std::sync::Mutex<ProgramPool> {
    fn with_pool<R>(&mut self, f: impl FnOnce(&mut ProgramPool) -> R) -> R {
        // A panic while holding the pool leaves it as consistent as any error would.
        f(&mut self.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

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
    /// Its Python frames, when it runs a CPython the kernel walks.
    pub python: Option<PythonTracking>,
    /// Why its CPython's frames are not walked, when it runs one bpfprof cannot walk.
    pub python_refused: Option<String>,
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
}

impl ProcessRecording {
    /// Notes which of its objects have no table now, and which got theirs since the run
    /// started at `started` after samples ran in them without it.
    fn note_tables(&mut self, unwind: &crate::unwind::UnwindMaps, started: Instant) {
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
    fn revoke(&mut self, program: &mut crate::kernel::KernelProgram) {
        log::info!(
            "pid {} is no longer its run's owner's to profile: no longer sampled",
            self.target.pid
        );
        if self.direct {
            program.suspend_target(self.slot.run, &self.target);
        } else {
            program.drop_followed(self.slot.run, self.target.pid);
        }
        if let Some(mut python) = self.python.take() {
            python.stop(program);
        }
        self.maps = ProcessMaps::gone(self.sample_pid);
        self.untabled = Vec::new();
        self.revoked = true;
        self.exited = true;
    }

    /// Whether its executable memory changed since the last call (the first call only notes
    /// it): new code was mapped, whose unwind table and names need its maps re-read.
    fn mapped_new_code(&mut self) -> bool {
        let now = self.target.executable_kib();
        let before = std::mem::replace(&mut self.executable_kib, now);
        before.is_some() && now.is_some() && before != now
    }

    /// Notes whether the process still lives, re-reading its maps when `refresh`; true when
    /// it is found to have exited now.
    fn poll(&mut self, refresh: bool, name_threads: bool) -> bool {
        if self.exited {
            return false;
        }
        if !self.target.is_alive() {
            log::debug!("pid {} ({}) exited", self.target.pid, self.target.comm);
            self.exited = true;
            return true;
        }
        if refresh {
            let _ = self.maps.refresh();
            if name_threads {
                self.name_python_threads();
            }
            self.refreshed_at = Instant::now();
        }
        false
    }

    /// Labels its threads by their Python `threading` names, where it is a CPython in
    /// bpfprof's pid namespace (the names come by host tid).
    fn name_python_threads(&mut self) {
        if let Some(python) = &mut self.python {
            if self.target.pid == self.sample_pid {
                self.maps.name_threads(python.threading_names());
            }
        }
    }
}

/// Kernel addresses start here (x86-64, 4- and 5-level paging alike).
const KERNEL_ADDRESS_START: u64 = 1 << 63;

/// A recording in progress.
pub struct Recording {
    request: SamplingRequest,
    /// Whether the profile splits threads (`--per-thread`): their names are then read.
    per_thread: bool,
    /// How user stacks are walked (`--unwind`, the protocol's `unwind`).
    unwind: crate::unwind::UnwindMode,
    /// Most rows a program loaded for this recording gets for unwind tables.
    table_rows_cap: u32,
    sampling: Option<Sampling>,
    follow_children: bool,
    /// One run slot per pid namespace of the targets: a sample names its process by its pid in
    /// its namespace, so processes of two namespaces never share a slot.
    slots: Vec<(Slot, PidNamespace)>,
    /// Every process, by its slot's run and its pid in its namespace.
    processes: BTreeMap<(u32, u32, u32), ProcessRecording>,
    /// Global pids the kernel followed that are not processes (threads), or are gone.
    ignored: HashSet<u32>,
    /// The program's delivery (expected, taken samples) when this recording attached, and the
    /// kernel's sample-rate limit then.
    delivery_at_start: Option<(f64, u64)>,
    max_sample_rate_at_start: u64,
    started: Instant,
    last_refresh: Instant,
    /// Whether CPython processes get their Python frames read.
    python_mode: PythonMode,
    /// Where sampled addresses go to be symbolized during the run, if anywhere.
    warm: Option<WarmSink>,
    /// The non-root user the run is for, whose right to profile each process is re-checked
    /// for the whole run; `None` (root, the command line) checks nothing.
    owner: Option<Owner>,
    /// Which processes are recorded.
    scope: Scope,
    /// Processes of a system-wide run not taken in: past [`MAX_SYSTEM_PROCESSES`].
    over_cap: HashSet<u32>,
    /// When the current window began (see [`Self::take_window`]), and the kernel's counters
    /// then.
    window_started: Instant,
    counters_at_window: Counters,
    /// The shares of naming Python frames this recording's owner's names are charged to.
    naming: Arc<NamingShares>,
    /// The process whose queued Python frames are named first at the next naming: each
    /// process goes first in turn, so that one with a long queue does not starve the others.
    naming_turn: usize,
    /// Whether the kernel writes each sample's time to its timeline ring for this recording.
    timeline: bool,
    /// When a run of targets next looks for new Python stacks between maps refreshes (see
    /// [`PYTHON_SCAN_COST_SHARE`]).
    next_python_scan: Instant,
    /// Each program's count of Python stacks stored at its last look for new ones: while the
    /// count stands still there are none, and a run of targets does not look.
    stacks_at_python_scan: HashMap<u32, u64>,
    /// The budget the sealed copies of its targets' files count against (the driver's: the
    /// agent's, the daemon's for the run's owner; see [`Self::set_copy_budget`]).
    copies: CopyBudget,
}

/// A run of targets looks for new Python stacks to name as often as every tick, but spends at
/// most about 1/this of its time on the look: it reads the kernel's sample map key by key (a
/// system call each: 0.3 ms for 700 keys in a release build, 1-5 ms for 150 in a debug one;
/// up to 16k keys between moves), so the next look waits this many times the CPU the last one
/// took, at most until the next maps refresh.
const PYTHON_SCAN_COST_SHARE: u32 = 20;

/// What [`Recording::name_python`] may take of its owner's CPU share at once: all of it (the
/// share is what bounds it; a single-owner recording names everything queued).
const NAMING_WANT: Duration = Duration::MAX;

/// Where a recording stands after a tick.
#[derive(Clone, Copy, Debug)]
pub struct TickStatus {
    /// Samples of the recording's processes so far.
    pub samples: u64,
    /// Whether every process of the recording has exited.
    pub all_exited: bool,
}

impl Recording {
    /// Sets a newly acquired run slot up for this recording: its timeline, its off-CPU time,
    /// then `more`; the slot is given back when a step fails.
    fn arm_slot(
        &self,
        pool: &mut ProgramPool,
        slot: Slot,
        more: impl FnOnce(&mut crate::kernel::KernelProgram) -> Result<()>,
    ) -> Result<()> {
        let armed = pool.program(slot).and_then(|p| {
            if self.timeline {
                p.record_timeline(slot.run)?;
            }
            if let Some(off_cpu) = self.request.off_cpu {
                p.record_off_cpu(slot.run, off_cpu)?;
            }
            more(p)
        });
        if armed.is_err() {
            pool.release(slot);
        }
        armed
    }

    /// A recording that samples, follows children, walks stacks and reads Python frames as
    /// `request` says; nothing is attached until the first target is added.
    pub fn new(request: &RecordingRequest) -> Recording {
        Recording {
            request: request.sampling,
            per_thread: request.options.per_thread,
            unwind: request.unwind,
            table_rows_cap: request.table_rows_cap,
            sampling: None,
            follow_children: request.follow_children,
            slots: Vec::new(),
            processes: BTreeMap::new(),
            ignored: HashSet::new(),
            delivery_at_start: None,
            max_sample_rate_at_start: 0,
            started: Instant::now(),
            last_refresh: Instant::now(),
            python_mode: request.python,
            warm: None,
            owner: None,
            scope: request.scope.clone(),
            over_cap: HashSet::new(),
            window_started: Instant::now(),
            counters_at_window: Counters::default(),
            naming: Arc::new(NamingShares::single()),
            naming_turn: 0,
            timeline: request.options.timeline,
            next_python_scan: Instant::now(),
            stacks_at_python_scan: HashMap::new(),
            copies: CopyBudget::mib(crate::process::copies::DEFAULT_RECORD_COPY_MIB),
        }
    }

    /// Counts the sealed copies of its targets' files against `budget` (before the first
    /// target is added): the agent's, or the daemon's for the run's owner, shared with the
    /// driver's other runs.
    pub fn set_copy_budget(&mut self, budget: CopyBudget) {
        self.copies = budget;
    }

    /// Charges the naming of this recording's Python frames to its owner's share of `shares`
    /// (a daemon's, shared by every run; before the first target is added).
    pub fn set_naming_shares(&mut self, shares: Arc<NamingShares>) {
        self.naming = shares;
    }

    /// Profiles only what `owner` may profile, for the whole run (before the first target is
    /// added): each process is checked when added, when the kernel reports that it exec'd
    /// (sampling it stops at the exec until then), when it is adopted as a child and at every
    /// maps refresh; one that fails is no longer sampled and its samples are dropped.
    pub fn set_owner(&mut self, owner: Owner) {
        self.owner = Some(owner);
    }

    /// Whom the run's unwind tables are built for: its owner's uid, 0 for root and the
    /// command line.
    fn owner_uid(&self) -> u32 {
        self.owner.map_or(0, |o| o.uid)
    }

    /// Sends the addresses sampled since the previous tick to `sink` at every tick, to be
    /// symbolized while the run goes on: a 430 MB libtorch_cpu.so's symbols took the end of
    /// a run 0.5 s (4 s in a debug build) to load when nothing was loaded before.
    pub fn set_warm(&mut self, sink: WarmSink) {
        self.warm = Some(sink);
    }

    /// The event and rate in use, once a target was added.
    pub fn sampling(&self) -> Option<Sampling> {
        self.sampling
    }

    /// When sampling started (the first target was added).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Handles that disable the sampling events of this recording's programs from another
    /// thread. Only for a recording that is its programs' one user (the command line's).
    pub fn event_stoppers(&self, pool: &mut ProgramPool) -> Vec<EventStopper> {
        let mut ids = HashSet::new();
        self.slots
            .iter()
            .filter(|(slot, _)| ids.insert(slot.program_id))
            .filter_map(|(slot, _)| pool.program(*slot).ok()?.event_stopper())
            .collect()
    }

    /// The kernel program's id, once a target was added.
    pub fn program_id(&self) -> Option<u32> {
        self.slots.first().map(|(s, _)| s.program_id)
    }

    /// Starts recording every process on the machine (a request of [`Scope::System`]):
    /// bpfprof's own process left out, kernel threads and a cgroup as the scope says. Each
    /// process is taken in at the tick after its first sample ([`Self::tick`]): its maps read, its
    /// unwind tables queued and its interpreter looked for; until its tables are built its
    /// stacks are walked by frame pointer (counted). The run has a kernel program of its own.
    pub fn start_system(&mut self, pool: &mut impl PoolAccess) -> Result<()> {
        let Scope::System(scope) = self.scope.clone() else {
            return Err(crate::error::Error::Usage(
                "start_system needs a system-wide request".into(),
            ));
        };
        if !self.slots.is_empty() {
            return Err(crate::error::Error::Usage(
                "a system-wide recording is started once, and has no targets".into(),
            ));
        }
        let cgroup = scope
            .cgroup
            .as_deref()
            .map(SystemScope::cgroup_filter)
            .transpose()?
            .map(|c| (c.id, c.level));
        let table_rows = match self.unwind {
            crate::unwind::UnwindMode::Fp => 1,
            _ => crate::unwind::table_rows_for(None, self.table_rows_cap),
        };
        let slot = pool.with_pool(|pool| -> Result<_> {
            let (slot, sampling) = pool.acquire_system(&self.request, self.unwind, table_rows)?;
            self.arm_slot(pool, slot, |p| {
                p.record_system(slot.run, scope.kernel_threads, cgroup)
            })?;
            self.sampling = Some(sampling);
            self.slots.push((slot, PidNamespace::default()));
            Ok(slot)
        })?;
        // The walker verifies meanwhile (outside the pool, as for a target): stacks of the
        // first 0.1 s use frame pointers and are counted.
        // Off-CPU time waits for its program (verified after the walker) to be attached.
        let off_cpu = self.request.off_cpu.is_some();
        let deadline = Instant::now() + crate::unwind::TABLE_WAIT;
        while (off_cpu || Instant::now() < deadline)
            && pool.with_pool(|pool| pool.program(slot).is_ok_and(|p| p.walker_pending()))
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        if off_cpu {
            pool.with_pool(|pool| pool.program(slot).and_then(|p| p.attach_off_cpu()))?;
        }
        // The processes running now are taken in at the first tick, not half a second later.
        self.last_refresh = Instant::now()
            .checked_sub(MAPS_REFRESH)
            .unwrap_or_else(Instant::now);
        pool.with_pool(|pool| {
            self.started = Instant::now();
            self.window_started = self.started;
            self.delivery_at_start = pool.program(slot).ok().and_then(|p| p.delivery());
            self.max_sample_rate_at_start = KernelLimits::read().max_sample_rate;
        });
        Ok(())
    }

    /// Whether this recording records every process on the machine.
    pub fn is_system(&self) -> bool {
        matches!(self.scope, Scope::System(_))
    }

    /// Captures what symbolization needs and starts keeping the samples of `target`.
    ///
    /// With a shared pool (the daemon's), the slow parts (building the target's unwind tables,
    /// waiting for the walker's verification) run without holding it, so that the other runs
    /// of the pool keep ticking meanwhile.
    pub fn add_target(&mut self, pool: &mut impl PoolAccess, target: Target) -> Result<()> {
        if self.is_system() {
            return Err(crate::error::Error::Usage(
                "a system-wide recording has no targets".into(),
            ));
        }
        let mut steps = crate::kernel::Steps::start(format!("pid {}", target.pid));
        let maps = ProcessMaps::capture(target.pid, target.ns_pid, &self.copies)?;
        // The row array is sized from the objects the target maps (read here, not under the
        // pool).
        let table_rows = match self.unwind {
            crate::unwind::UnwindMode::Fp => 1,
            _ => crate::unwind::table_rows_for(Some(target.pid), self.table_rows_cap),
        };
        steps.done("maps read and tables sized");
        let owner_uid = self.owner_uid();
        if self.slots.iter().all(|(_, ns)| *ns != target.ns) {
            // A program to load is loaded before taking the pool (verifying it is most of a
            // first run's start), so that a shared pool's other runs keep ticking meanwhile.
            let load = pool.with_pool(|pool| {
                pool.load_needed(&self.request, self.unwind, table_rows, owner_uid)
            });
            if let Some(load) = load {
                // A running process waits for the walker (whole stacks from its first sample):
                // verified alongside the sampling program. A launched command starts at once.
                let program = if crate::unwind::loader::is_unexeced_child(target.pid) {
                    load.walker(crate::kernel::WalkerLoad::Background).load()?
                } else {
                    load.load()?
                };
                pool.with_pool(|pool| pool.offer(program));
            }
        }
        let slot = pool.with_pool(|pool| -> Result<_> {
            let slot = match self.slots.iter().find(|(_, ns)| *ns == target.ns) {
                Some((slot, _)) => *slot,
                None => {
                    let (slot, sampling) =
                        pool.acquire(&self.request, self.unwind, table_rows, owner_uid)?;
                    let checks_execs = self.owner.is_some();
                    self.arm_slot(pool, slot, |p| {
                        // Before any process of the run is registered: none of them is
                        // sampled past an exec its owner has not been checked against.
                        if checks_execs {
                            p.stop_at_exec(slot.run, true)?;
                        }
                        Ok(())
                    })?;
                    if self.slots.is_empty() {
                        self.started = Instant::now();
                        self.window_started = self.started;
                        self.delivery_at_start = pool.program(slot)?.delivery();
                        self.max_sample_rate_at_start = KernelLimits::read().max_sample_rate;
                    }
                    self.sampling = Some(sampling);
                    self.slots.push((slot, target.ns));
                    slot
                }
            };
            // The target's tables are queued now, to build on the table thread while the
            // walker verifies; no sample of the target is taken before it is registered.
            let tracked = pool.program(slot).and_then(|p| {
                p.unwind
                    .track_maps(target.pid, owner_uid, Some(maps.last_read()))
            });
            if let Err(e) = tracked {
                self.release_unused(pool, slot);
                return Err(e);
            }
            Ok(slot)
        })?;
        steps.done("program attached and tables queued");
        // Outside the pool, looking in briefly: the walker's verification (0.1 s, more on a
        // loaded machine) and the first tables (see `table_deadline`), so that the other runs
        // of a shared pool keep ticking meanwhile.
        let deadline = table_deadline(self.unwind);
        let off_cpu = self.request.off_cpu.is_some();
        loop {
            let (walker, tables) = pool.with_pool(|pool| match pool.program(slot) {
                Ok(p) => {
                    p.unwind.poll();
                    let tracked = p.unwind.is_tracked(target.pid);
                    (
                        // Off-CPU time needs its program, verified after the walker.
                        (tracked || off_cpu) && p.walker_pending(),
                        tracked && p.unwind.pending(target.pid),
                    )
                }
                Err(_) => (false, false),
            });
            if !walker && (!tables || Instant::now() >= deadline) {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        steps.done("waited for the walker and first tables");
        let registered = pool.with_pool(|pool| self.register(pool, slot, target, maps));
        steps.done("registered: sampling");
        registered
    }

    /// Waits for the walker program of every slot in use to be verified (or to fail): a
    /// launched command is held at its exec until then, so that its stacks are whole from the
    /// first sample and the kernel's verification (15-20 ms of CPU) is not taken from it.
    pub fn wait_for_walker(&mut self, pool: &mut impl PoolAccess) {
        for (slot, _) in self.slots.clone() {
            while pool.with_pool(|pool| pool.program(slot).is_ok_and(|p| p.walker_pending())) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Frees `slot` when no process of this recording uses it (a target that failed to register).
    fn release_unused(&mut self, pool: &mut ProgramPool, slot: Slot) {
        if !self
            .processes
            .keys()
            .any(|k| k.0 == slot.program_id && k.1 == slot.run)
        {
            self.slots.retain(|(s, _)| *s != slot);
            pool.release(slot);
        }
    }

    /// The part of [`Self::add_target`] that needs the kernel program: the target's tables
    /// written in, the target registered in `slot`.
    fn register(
        &mut self,
        pool: &mut ProgramPool,
        slot: Slot,
        target: Target,
        maps: ProcessMaps,
    ) -> Result<()> {
        let mut waited = false;
        let mut sampled_from = None;
        let owner = self.owner;
        let mut maps = maps;
        let registered = pool.program(slot).and_then(|program| {
            if program.unwind.is_tracked(target.pid) {
                // A running process is profiled from its first sample with whole stacks: its
                // samples wait for the CFI walker (verifying since the program loaded). A
                // launched command, added before it execs with no tables, waits for it at its
                // exec ([`Self::wait_for_walker`]).
                if let Err(e) = program.wait_walker() {
                    log::warn!("CFI walker unavailable ({e}): stacks use frame pointers");
                }
                waited = true;
            }
            if self.request.off_cpu.is_some() {
                program.attach_off_cpu()?;
            }
            program.add_target(slot.run, &target, self.follow_children)?;
            sampled_from = Some(Instant::now());
            if let Some(owner) = owner {
                // Checked again now that the kernel watches it (an exec from now on stops its
                // sampling and is reported), and its maps read again after the check: those
                // read before may be of a program it exec'd since the caller's check.
                let recaptured = ProcessMaps::capture(target.pid, target.ns_pid, &self.copies);
                match recaptured {
                    Ok(fresh) if target.profilable_by(owner) => maps = fresh,
                    _ => {
                        let _ = program.remove_target(slot.run, &target);
                        return Err(crate::error::Error::PermissionDenied(format!(
                            "you may not profile pid {}",
                            target.pid
                        )));
                    }
                }
            }
            let mut refused = None;
            let python = match self.python_mode {
                PythonMode::Auto => PythonTracking::start(
                    program,
                    target.pid,
                    &self.naming,
                    self.owner_uid(),
                    &mut refused,
                ),
                PythonMode::Off => None,
            };
            Ok((python, refused))
        });
        if waited && self.processes.is_empty() {
            // The run's duration counts from its first sample, not from the program's load:
            // on a loaded machine the walker's verification takes a good part of a short run.
            // The throttling check counts from the same moment: samples the kernel cut while
            // the walker verified are not the run's.
            // From the target's first possible sample, not after its interpreter was looked
            // at (a tenth of a second and more on a loaded machine, sampled all along).
            self.started = sampled_from.unwrap_or_else(Instant::now);
            self.window_started = self.started;
            self.delivery_at_start = pool.program(slot).ok().and_then(|p| p.delivery());
        }
        let (python, python_refused) = match registered {
            Ok(python) => python,
            Err(e) => {
                self.release_unused(pool, slot);
                return Err(e);
            }
        };
        self.processes.insert(
            (slot.program_id, slot.run, target.ns_pid),
            ProcessRecording {
                slot,
                sample_pid: target.ns_pid,
                target,
                maps,
                direct: true,
                exited: false,
                python,
                python_refused,
                young_until: Some(Instant::now() + YOUNG_PROCESS),
                refreshed_at: Instant::now(),
                executable_kib: None,
                untabled: Vec::new(),
                tabled_late: Vec::new(),
                cfi_walked: waited,
                revoked: false,
            },
        );
        Ok(())
    }

    /// Re-reads the memory maps and unwind tables of `pid` now (a launched command that just
    /// exec'd: before, they were bpfprof's own).
    pub fn refresh_maps(&mut self, pool: &mut ProgramPool, pid: u32) {
        let owner_uid = self.owner_uid();
        for p in self.processes.values_mut() {
            if p.target.pid == pid {
                p.young_until = Some(Instant::now() + YOUNG_PROCESS);
                if let Err(e) = p.maps.refresh() {
                    log::debug!("maps of pid {pid}: {e}");
                }
                if let Ok(program) = pool.program(p.slot) {
                    let _ = program
                        .unwind
                        .track_maps(pid, owner_uid, Some(p.maps.last_read()));
                    p.cfi_walked |= program.unwind.is_tracked(pid);
                    program.unwind.settle(pid, table_deadline(self.unwind));
                    // A launched command is a CPython only once it has exec'd.
                    if p.python.is_none() && self.python_mode == PythonMode::Auto {
                        p.python = PythonTracking::start(
                            program,
                            pid,
                            &self.naming,
                            owner_uid,
                            &mut p.python_refused,
                        );
                    }
                }
            }
        }
    }

    /// Keeps the recording healthy: moves stacks out of the kernel when due, picks up the
    /// children the kernel followed, notes exits and refreshes memory maps.
    pub fn tick(&mut self, pool: &mut ProgramPool) -> TickStatus {
        let refresh = self.last_refresh.elapsed() >= MAPS_REFRESH;
        if refresh {
            self.last_refresh = Instant::now();
        }
        let mut samples = 0;
        let mut seen_programs = HashSet::new();
        // Programs that stored Python stacks never seen before since their last look for them
        // (with the count now), and programs whose count cannot be read. A system-wide run
        // looks only at each refresh, whatever the count: it does not read it.
        let look_between_refreshes = !self.is_system();
        let mut new_stacks: HashMap<u32, Option<u64>> = HashMap::new();
        for (slot, _) in self.slots.clone() {
            let Ok(program) = pool.program(slot) else {
                continue;
            };
            if seen_programs.insert(slot.program_id) {
                program.offload_when_due();
                program.unwind.poll();
                if look_between_refreshes {
                    let stored = program.python_stacks_stored();
                    if stored.is_none()
                        || stored != self.stacks_at_python_scan.get(&slot.program_id).copied()
                    {
                        new_stacks.insert(slot.program_id, stored);
                    }
                }
            }
            samples += program
                .counters(slot.run)
                .map(|c| c.get(Counter::Samples))
                .unwrap_or(0);
            if let Some(owner) = self.owner {
                for pid in program.take_execed(slot.run) {
                    self.after_exec(program, slot, pid, owner);
                }
            }
            if self.follow_children {
                for pid in program.followed(slot.run) {
                    self.adopt(program, slot, pid, false);
                }
            }
            if self.is_system() {
                // The kernel reports each process as it first samples it (again when the
                // report found the ring full), so that a process living a fraction of a second
                // is taken in while it lives.
                for pid in program.take_new_processes() {
                    self.adopt(program, slot, pid, true);
                }
            }
        }
        // Python stacks recorded so far, per program, named below while their processes live.
        let mut python_ids = std::collections::HashMap::new();
        let now = Instant::now();
        let system = self.is_system();
        let owner_uid = self.owner_uid();
        // Every tick where sampling is fast enough that a tick holds more than
        // YOUNG_REFRESH_PERIODS samples per CPU (command-line runs at their default rate).
        let young_every = self
            .sampling
            .filter(|s| system && s.nominal_hz > 0.0)
            .map_or(Duration::ZERO, |s| {
                Duration::from_secs_f64(YOUNG_REFRESH_PERIODS / s.nominal_hz)
            });
        // A system-wide run looks for its processes' exits every MAPS_REFRESH (and at each
        // one's own re-read), not every tick: each look opens and reads /proc/PID/stat, and
        // for every process of the machine ten times a second that was the agent's busiest
        // system call (200 a second on a quiet machine); an exit seen later only keeps the
        // process's state that much longer. Runs of targets look every tick: their end is
        // their targets' exit.
        let look_for_exits = !system || refresh;
        let scan_python = refresh || (!system && now >= self.next_python_scan);
        let mut python_scan_took = None;
        let started = self.started;
        // `--per-thread` labels a Python program's threads by their `threading` names.
        let per_thread = self.per_thread;
        for p in self.processes.values_mut() {
            let young = p.young_until.is_some_and(|t| now < t)
                && now.duration_since(p.refreshed_at) >= young_every;
            let due = if system && p.python.is_none() {
                now.duration_since(p.refreshed_at) >= SYSTEM_MAPS_REFRESH
            } else {
                refresh
            };
            // A target that mapped new code since the last tick (a dlopen) is re-read now:
            // until its new library's unwind table is loaded, that library's samples are its
            // leaf alone, and half a second of them was a visible share of a short run.
            let mapped = !system && !p.exited && p.mapped_new_code();
            let refresh = due || young || mapped;
            let Ok(program) = pool.program(p.slot) else {
                continue;
            };
            if let Some(owner) = self.owner {
                // A change without an exec (the process made itself undumpable) is caught
                // here; an exec was caught by the kernel and handled above.
                if refresh && !p.exited && !p.target.profilable_by(owner) && p.target.is_alive() {
                    p.revoke(program);
                }
            }
            if (look_for_exits || refresh) && p.poll(refresh, per_thread) && system {
                program.forget_system_process(p.target.pid);
            }
            // New code (dlopen, exec) gets its unwind tables while the run goes on, from the
            // same read of the maps as symbolization.
            if refresh && !p.exited {
                let _ =
                    program
                        .unwind
                        .track_maps(p.target.pid, owner_uid, Some(p.maps.last_read()));
                p.note_tables(&program.unwind, started);
                p.cfi_walked |= program.unwind.is_tracked(p.target.pid);
            }
            // A new process may map its interpreter only after its exec (libpython is loaded
            // by ld.so): it is looked for again while the process is young.
            if young && !p.exited && p.python.is_none() && self.python_mode == PythonMode::Auto {
                p.python = PythonTracking::start(
                    program,
                    p.target.pid,
                    &self.naming,
                    owner_uid,
                    &mut p.python_refused,
                );
            }
            if let Some(python) = &mut p.python {
                if p.exited {
                    python.stop(program);
                } else {
                    if refresh {
                        python.refresh_threads(program);
                    }
                    // A code object can be read only while it lives: a function compiled,
                    // run and dropped, or the last code a process runs before it exits, is
                    // gone soon after. Queued at each maps refresh, up to half a second of
                    // such code was never named ("[unknown Python code]"); a run of targets
                    // queues as often as every tick. A system-wide run, which scans the
                    // stacks of every process, still does it at each refresh.
                    if refresh || (scan_python && new_stacks.contains_key(&p.slot.program_id)) {
                        // Named by `name_python`, off the programs' lock.
                        let ids = python_ids.entry(p.slot.program_id).or_insert_with(|| {
                            // CPU time, not wall time: with three busy loops on two cores a
                            // look preempted midway took 13.6 ms for 0.6 ms of CPU, and the
                            // next look, 272 ms later by its wall time, came after the end of
                            // a function that ran 150 ms and its process.
                            let (began, cpu) = (Instant::now(), crate::kernel::thread_cpu_time());
                            let ids = program.python_stack_ids();
                            let took = crate::kernel::thread_cpu_time().saturating_sub(cpu);
                            log::trace!(
                                "{} Python stacks recorded, found in {took:?} of CPU ({:?})",
                                ids.len(),
                                began.elapsed()
                            );
                            *python_scan_took.get_or_insert(Duration::ZERO) += took;
                            ids
                        });
                        python.queue_new_stacks(program, ids, p.slot.run, p.sample_pid);
                    }
                }
            }
            if p.exited && system {
                // What the kernel holds for it goes at once: tables, mappings, Python state
                // (its maps stay, to name its samples).
                if program.unwind.is_tracked(p.target.pid) {
                    p.note_tables(&program.unwind, started);
                    program.unwind.unload_process(p.target.pid);
                }
            }
        }
        if let Some(took) = python_scan_took {
            self.next_python_scan = now + (took * PYTHON_SCAN_COST_SHARE).min(MAPS_REFRESH);
            // Counts read before the look: a stack stored during it is looked for again.
            for (program, stored) in new_stacks {
                if let (Some(stored), true) = (stored, python_ids.contains_key(&program)) {
                    self.stacks_at_python_scan.insert(program, stored);
                }
            }
        }
        self.send_warm(pool);
        TickStatus {
            samples,
            // A system-wide run lasts until it is stopped.
            all_exited: !system && self.processes.values().all(|p| p.exited),
        }
    }

    /// Names the Python frames ticks queued, reading code objects from the live processes:
    /// call it without the programs' lock (it needs none), on a thread that answers no
    /// client. It takes what is left of the owner's CPU share of the period (`at_end`: with
    /// the extra a run's end gets, see [`crate::python::shares`]) and names for that long, the
    /// processes in turn; what is left waits for the next call.
    pub fn name_python(&mut self, at_end: bool) {
        let owner = self.owner_uid();
        let waiting = self
            .processes
            .values()
            .filter(|p| p.python.as_ref().is_some_and(|t| t.has_queued()))
            .count();
        if waiting == 0 {
            return;
        }
        let given = self.naming.take_cpu(owner, NAMING_WANT, at_end);
        let mut left = given;
        let mut order: Vec<&mut ProcessRecording> = self.processes.values_mut().collect();
        let turn = self.naming_turn % order.len().max(1);
        order.rotate_left(turn);
        self.naming_turn = self.naming_turn.wrapping_add(1);
        for p in order {
            let Some(python) = &mut p.python else {
                continue;
            };
            if !python.has_queued() {
                continue;
            }
            if p.exited {
                // Its code objects cannot be read any more.
                python.abandon_queued();
                continue;
            }
            if left.is_zero() {
                break;
            }
            left = left.saturating_sub(python.name_queued(left));
        }
        self.naming.give_back(owner, left);
    }

    /// Queues the frames of the Python stacks recorded since the last tick, to be named by
    /// [`Self::name_python`]: a driver that names off the programs' lock calls it before
    /// [`Self::collect`], so that the last stacks are named there.
    pub fn queue_python(&mut self, pool: &mut ProgramPool) {
        let mut python_ids = std::collections::HashMap::new();
        for p in self.processes.values_mut().filter(|p| !p.exited) {
            if let (Some(python), Ok(program)) = (&mut p.python, pool.program(p.slot)) {
                let ids = python_ids
                    .entry(p.slot.program_id)
                    .or_insert_with(|| program.python_stack_ids());
                python.queue_new_stacks(program, ids, p.slot.run, p.sample_pid);
            }
        }
    }

    /// Sends the addresses sampled since the last call to the warm sink, if there is one.
    fn send_warm(&mut self, pool: &mut ProgramPool) {
        let Some(sink) = &self.warm else {
            return;
        };
        let mut warm = Warm::default();
        let mut seen_programs = HashSet::new();
        for (slot, _) in &self.slots {
            if !seen_programs.insert(slot.program_id) {
                continue;
            }
            let Ok(program) = pool.program(*slot) else {
                continue;
            };
            let (kernel, user): (Vec<u64>, Vec<u64>) = program
                .take_fresh_frames()
                .into_iter()
                .partition(|a| *a >= KERNEL_ADDRESS_START);
            warm.kernel.extend(kernel);
            // A program's stacks do not say whose they are: each is placed in every process
            // of the program that maps it.
            for p in self
                .processes
                .values()
                .filter(|p| p.slot.program_id == slot.program_id)
            {
                warm.user
                    .extend(user.iter().filter_map(|a| match p.maps.locate(*a) {
                        crate::process::maps::Location::File(file, offset) => Some((file, offset)),
                        _ => None,
                    }));
            }
        }
        if !warm.user.is_empty() || !warm.kernel.is_empty() {
            sink(warm);
        }
    }

    /// Handles process `pid` of `slot`, which exec'd: the kernel stopped sampling it at the exec.
    /// It is sampled again if `owner` may profile the new program, with its maps read anew
    /// (those read since the exec may be of a program the owner may not see) and its Python
    /// state forgotten (names read from its memory since the exec, likewise); otherwise it is
    /// revoked. A child not adopted yet is handed back to the kernel's following, and adoption
    /// checks it.
    fn after_exec(
        &mut self,
        program: &mut crate::kernel::KernelProgram,
        slot: Slot,
        pid: u32,
        owner: Owner,
    ) {
        let follow = self.follow_children;
        let known = self
            .processes
            .values_mut()
            .find(|p| p.slot == slot && p.target.pid == pid && !p.exited);
        let Some(p) = known else {
            if !self.ignored.contains(&pid)
                && Target::from_pid(pid).is_ok_and(|t| t.profilable_by(owner))
            {
                let _ = program.resume_followed(slot.run, pid);
            } else {
                program.drop_followed(slot.run, pid);
            }
            return;
        };
        if let Some(mut python) = p.python.take() {
            python.stop(program);
        }
        let fresh = ProcessMaps::capture(pid, p.target.ns_pid, &self.copies);
        let fresh = match fresh {
            Ok(fresh) if p.target.profilable_by(owner) => fresh,
            _ => {
                p.revoke(program);
                return;
            }
        };
        let resumed = if p.direct {
            program.resume_target(slot.run, &p.target, follow)
        } else {
            program.resume_followed(slot.run, pid)
        };
        // Checked again once it samples: an exec between the check and the resume was not
        // reported (the kernel had already stopped the run); one after it is.
        if resumed.is_err() || !p.target.profilable_by(owner) {
            p.revoke(program);
            return;
        }
        log::debug!("pid {pid} exec'd a program its run's owner may profile");
        p.maps = fresh;
        p.young_until = Some(Instant::now() + YOUNG_PROCESS);
        let _ = program
            .unwind
            .track_maps(pid, owner.uid, Some(p.maps.last_read()));
    }

    /// Takes in a child the kernel followed for `slot` (or, `system`, a process a system-wide
    /// run sampled), unless it is a thread or known.
    fn adopt(
        &mut self,
        program: &mut crate::kernel::KernelProgram,
        slot: Slot,
        pid: u32,
        system: bool,
    ) {
        if self.ignored.contains(&pid)
            || self.over_cap.contains(&pid)
            || self
                .processes
                .contains_key(&(slot.program_id, slot.run, pid))
            || (!system && self.processes.values().any(|p| p.target.pid == pid))
        {
            return;
        }
        if system && self.processes.len() >= MAX_SYSTEM_PROCESSES {
            if self.over_cap.is_empty() {
                log::warn!(
                    "{MAX_SYSTEM_PROCESSES} processes taken in, the most a system-wide run \
                     does: the samples of further ones are counted, not named"
                );
            }
            self.over_cap.insert(pid);
            return;
        }
        let is_process = crate::process::target::read_status(pid)
            .map(|s| s.tgid == pid as i32)
            .unwrap_or(false);
        if !is_process {
            // A thread of a target (the fork tracepoint sees those too), or gone already.
            program.forget_followed(pid);
            self.ignored.insert(pid);
            return;
        }
        let adopted = Target::from_pid(pid).and_then(|target| {
            let maps = ProcessMaps::capture(target.pid, target.ns_pid, &self.copies)?;
            Ok((target, maps))
        });
        let adopted = adopted.and_then(|(target, maps)| match self.owner {
            Some(owner) if !target.profilable_by(owner) => {
                // Its samples so far (from its fork on) are dropped with it.
                program.drop_followed(slot.run, pid);
                let sample_pid = if system { pid } else { target.ns_pid };
                let mut gone = ProcessRecording::gone(slot, sample_pid);
                gone.revoked = true;
                log::info!("not following child pid {pid}: its run's owner may not profile it");
                self.processes
                    .insert((slot.program_id, slot.run, sample_pid), gone);
                Err(crate::error::Error::PermissionDenied(format!("pid {pid}")))
            }
            _ => Ok((target, maps)),
        });
        match adopted {
            Ok((target, maps)) => {
                log::debug!("taking in pid {pid} ({})", target.comm);
                let tracked =
                    program
                        .unwind
                        .track_maps(pid, self.owner_uid(), Some(maps.last_read()));
                if let Err(e) = tracked {
                    log::debug!("unwind tables of pid {pid}: {e}");
                }
                let cfi_walked = program.unwind.is_tracked(pid);
                // A system-wide run's samples carry pids of the initial namespace.
                let sample_pid = if system { pid } else { target.ns_pid };
                let mut python_refused = None;
                self.processes.insert(
                    (slot.program_id, slot.run, sample_pid),
                    ProcessRecording {
                        slot,
                        sample_pid,
                        target,
                        maps,
                        direct: false,
                        exited: false,
                        python: match self.python_mode {
                            PythonMode::Auto => PythonTracking::start(
                                program,
                                pid,
                                &self.naming,
                                self.owner_uid(),
                                &mut python_refused,
                            ),
                            PythonMode::Off => None,
                        },
                        python_refused,
                        young_until: Some(Instant::now() + YOUNG_PROCESS),
                        refreshed_at: Instant::now(),
                        executable_kib: None,
                        untabled: Vec::new(),
                        tabled_late: Vec::new(),
                        cfi_walked,
                        revoked: false,
                    },
                );
            }
            Err(_) => {
                self.ignored.insert(pid);
            }
        }
    }

    /// Stops keeping samples, takes everything recorded out of the kernel and frees the run
    /// slots (unloading programs no run needs any more).
    pub fn collect(mut self, pool: &mut ProgramPool) -> Result<Collected> {
        if let Some(owner) = self.owner {
            for (slot, _) in self.slots.clone() {
                if let Ok(program) = pool.program(slot) {
                    for pid in program.take_execed(slot.run) {
                        self.after_exec(program, slot, pid, owner);
                    }
                }
            }
        }
        let mut python_ids = std::collections::HashMap::new();
        for p in self.processes.values_mut() {
            if p.exited || !p.target.is_alive() {
                continue;
            }
            // The last Python stacks are named while the process may still live.
            if let (Some(python), Ok(program)) = (&mut p.python, pool.program(p.slot)) {
                let ids = python_ids
                    .entry(p.slot.program_id)
                    .or_insert_with(|| program.python_stack_ids());
                python.queue_new_stacks(program, ids, p.slot.run, p.sample_pid);
            }
            let _ = p.maps.refresh();
        }
        // Within what is left of the owner's share: a daemon names a run's queue before it
        // collects, off the programs' lock (see `name_python`).
        self.name_python(false);
        for python in self
            .processes
            .values_mut()
            .filter_map(|p| p.python.as_mut())
        {
            python.abandon_queued();
        }
        if self.owner.is_some() {
            // A process that exec'd while it was read last may have been read as the new
            // program: it is revoked rather than read again.
            for (slot, _) in self.slots.clone() {
                let Ok(program) = pool.program(slot) else {
                    continue;
                };
                for pid in program.take_execed(slot.run) {
                    match self
                        .processes
                        .values_mut()
                        .find(|p| p.slot == slot && p.target.pid == pid && !p.revoked)
                    {
                        Some(p) => p.revoke(program),
                        None => program.drop_followed(slot.run, pid),
                    }
                }
            }
        }
        let started = self.started;
        for p in self.processes.values_mut() {
            if let (Some(python), Ok(program)) = (&mut p.python, pool.program(p.slot)) {
                python.stop(program);
            }
            if p.direct {
                if let Ok(program) = pool.program(p.slot) {
                    let _ = program.remove_target(p.slot.run, &p.target);
                }
            }
            if p.revoked {
                continue;
            }
            if let Ok(program) = pool.program(p.slot) {
                if program.unwind.is_tracked(p.target.pid) {
                    p.note_tables(&program.unwind, started);
                    p.cfi_walked = true;
                }
            }
        }
        if self.is_system() {
            // Sampling stops before the counts are taken, as removing targets does.
            for (slot, _) in &self.slots {
                if let Ok(program) = pool.program(*slot) {
                    program.end_system(slot.run);
                }
            }
        }
        let multi_process = self.is_multi_process();
        let mut counters = Counters::default();
        let mut samples = Vec::new();
        let mut bpf_run = None;
        let mut off_cpu_bpf_run = None;
        let mut tables = TableCost::default();
        let throttled = self.throttled(pool);
        let mut result = Ok(());
        for (slot, _) in &self.slots {
            let Ok(program) = pool.program(*slot) else {
                continue;
            };
            program.end_following(slot.run);
            program.end_off_cpu(slot.run);
            program.end_timeline(slot.run);
            let drained = program.counters(slot.run).and_then(|c| {
                for (total, value) in counters.0.iter_mut().zip(c.0) {
                    *total += value;
                }
                drain(program, slot.run)
            });
            match drained {
                Ok(s) => samples.push((slot.program_id, s)),
                Err(e) => result = Err(e),
            }
            bpf_run = bpf_run.or_else(|| program.run_stats());
            off_cpu_bpf_run = off_cpu_bpf_run.or_else(|| program.off_cpu_run_stats());
            tables = TableCost::of(&program.unwind);
        }
        for (slot, _) in &self.slots {
            pool.release(*slot);
        }
        result?;
        let timeline_clock = self.timeline.then(|| TimelineClock::ending(self.started));
        Ok(Collected {
            sampling: self.sampling,
            program_id: self.program_id().unwrap_or(0),
            duration: self.started.elapsed(),
            processes: std::mem::take(&mut self.processes),
            samples,
            counters,
            bpf_run,
            off_cpu_bpf_run,
            throttled,
            tables,
            multi_process,
            system: self.is_system(),
            over_cap: self.over_cap.len(),
            off_cpu: self.request.off_cpu,
            timeline_clock,
        })
    }

    /// How far the kernel throttled the program since this recording attached, when it cut
    /// more than a tenth of the samples.
    fn throttled(&self, pool: &mut ProgramPool) -> Option<Throttled> {
        let (slot, _) = self.slots.first()?;
        let (expected0, taken0) = self.delivery_at_start?;
        let (expected1, taken1) = pool.program(*slot).ok()?.delivery()?;
        // The kernel throttles an event per tick beyond its share of the limit, and the
        // randomized periods reach 1.5 times the mean rate.
        let limit = KernelLimits::read().max_sample_rate;
        let hz = self.sampling.map_or(0.0, |s| s.nominal_hz);
        let cause = if limit < self.max_sample_rate_at_start || 1.5 * hz >= limit as f64 {
            ShortfallCause::KernelThrottling
        } else {
            ShortfallCause::LateTimerInterrupts
        };
        let throttled = Throttled {
            expected_samples: (expected1 - expected0).max(0.0).round() as u64,
            taken_samples: taken1.saturating_sub(taken0),
            cause,
        };
        // Too few samples to tell a shortfall from the randomized periods' spread.
        (throttled.expected_samples >= 200 && throttled.taken_share() < Throttled::THRESHOLD)
            .then_some(throttled)
    }

    /// Cuts a window from the running recording, without stopping it: takes the samples
    /// recorded since the last window (or the start) out of the kernel, and symbolizes and
    /// aggregates them with the processes as they are now into a profile of that window
    /// (the same [`aggregate`] as a whole recording's, so writers see the same model).
    /// Processes seen to exit are dropped after it (their last samples are in it), with what
    /// the kernel program and the unwinder kept of them, and so are the stacks the window
    /// took: a recording that runs for days keeps only what its living processes need.
    pub fn take_window(
        &mut self,
        pool: &mut ProgramPool,
        symbolizer: &mut Symbolizer,
        options: &AggregateOptions,
    ) -> Result<Profile> {
        let mut python_ids = std::collections::HashMap::new();
        let system = self.is_system();
        for p in self.processes.values_mut() {
            if p.exited {
                continue;
            }
            // A system-wide run re-reads an established process's maps only every
            // SYSTEM_MAPS_REFRESH: libraries it loaded since are found before it is named.
            if system && p.refreshed_at.elapsed() >= MAPS_REFRESH && p.poll(true, false) {
                // It exited: a new process may get its pid (the next tick unloads the rest).
                if let Ok(program) = pool.program(p.slot) {
                    program.forget_system_process(p.target.pid);
                }
                continue;
            }
            // Python stacks are named while their process may still live.
            if let (Some(python), Ok(program)) = (&mut p.python, pool.program(p.slot)) {
                let ids = python_ids
                    .entry(p.slot.program_id)
                    .or_insert_with(|| program.python_stack_ids());
                python.queue_new_stacks(program, ids, p.slot.run, p.sample_pid);
            }
        }
        self.name_python(true);
        let mut counters = Counters::default();
        let mut samples = Vec::new();
        let mut tables = TableCost::default();
        let mut result = Ok(());
        for (slot, _) in &self.slots {
            let Ok(program) = pool.program(*slot) else {
                continue;
            };
            let drained = program.counters(slot.run).and_then(|c| {
                for (total, value) in counters.0.iter_mut().zip(c.0) {
                    *total += value;
                }
                drain(program, slot.run)
            });
            match drained {
                Ok(s) => samples.push((slot.program_id, s)),
                Err(e) => result = Err(e),
            }
            tables = TableCost::of(&program.unwind);
        }
        for (slot, _) in &self.slots {
            if let Ok(program) = pool.program(*slot) {
                program.forget_taken_stacks();
            }
        }
        result?;
        // The kernel's counters run on from the recording's start: a window's are the
        // difference.
        let total = counters;
        for (now, before) in counters.0.iter_mut().zip(self.counters_at_window.0) {
            *now = now.saturating_sub(before);
        }
        self.counters_at_window = total;
        let head = Head {
            sampling: self.sampling,
            program_id: self.program_id().unwrap_or(0),
            duration: self.window_started.elapsed(),
            counters,
            bpf_run: None,
            off_cpu_bpf_run: None,
            throttled: None,
            tables,
            multi_process: self.is_multi_process(),
            system: self.is_system(),
            over_cap: self.over_cap.len(),
            off_cpu: self.request.off_cpu,
            // Windows record no timeline.
            timeline_clock: None,
        };
        self.window_started = Instant::now();
        let profile = assemble_samples(
            &mut self.processes,
            samples,
            head,
            RunEnd::Completed,
            symbolizer,
            options,
            // The next window names the same code: the symbolizer keeps its files.
            |_| {},
        );
        self.drop_exited(pool);
        // The files of the processes dropped (their sealed copies above all) go with them.
        symbolizer.release_unmapped();
        Ok(profile)
    }

    /// Whether the run could have more than one process (more than one target, children
    /// followed, system-wide): its processes' root frames carry their pids.
    fn is_multi_process(&self) -> bool {
        self.is_system()
            || self.follow_children
            || self.processes.values().filter(|p| p.direct).count() > 1
    }

    /// Forgets every process seen to exit (or known only by its samples), and what the kernel
    /// program, the unwinder and the Python walk kept of it.
    fn drop_exited(&mut self, pool: &mut ProgramPool) {
        let gone: Vec<(u32, u32, u32)> = self
            .processes
            .iter()
            .filter(|(_, p)| p.exited)
            .map(|(k, _)| *k)
            .collect();
        for key in gone {
            let Some(mut p) = self.processes.remove(&key) else {
                continue;
            };
            let Ok(program) = pool.program(p.slot) else {
                continue;
            };
            if let Some(mut python) = p.python.take() {
                python.stop(program);
            }
            if p.target.pid != 0 {
                if p.direct {
                    let _ = program.remove_target(p.slot.run, &p.target);
                } else {
                    program.forget_followed(p.target.pid);
                }
                program.unwind.unload_process(p.target.pid);
            }
        }
        // Pids seen as threads, or past the system-wide cap, are looked at again once a
        // window: pids are reused, and the cap counts living processes.
        self.ignored = HashSet::new();
        self.over_cap = HashSet::new();
    }

    /// Unwind tables evicted so far by the recording's programs to make room for sampled
    /// ones, and the stacks kept in userspace between windows.
    pub fn kept_state(&self, pool: &mut ProgramPool) -> (u64, usize) {
        let mut seen = HashSet::new();
        let (mut evicted, mut stacks) = (0, 0);
        for (slot, _) in &self.slots {
            if !seen.insert(slot.program_id) {
                continue;
            }
            if let Ok(program) = pool.program(*slot) {
                evicted += program.unwind.evictions();
                stacks += program.offloaded_stack_count();
            }
        }
        (evicted, stacks)
    }

    /// The processes recorded so far.
    pub fn processes(&self) -> impl Iterator<Item = &ProcessRecording> {
        self.processes.values()
    }
}

/// What the kernel recorded for a recording, out of the kernel.
pub struct Collected {
    sampling: Option<Sampling>,
    program_id: u32,
    duration: Duration,
    processes: BTreeMap<(u32, u32, u32), ProcessRecording>,
    /// Samples by the id of the program that recorded them (as drained: copied into one list,
    /// two lists of 25k samples were held at once, the peak of a run's end).
    samples: Vec<(u32, Vec<Sample>)>,
    counters: Counters,
    bpf_run: Option<(u64, u64)>,
    /// The off-CPU program's run time and runs, where statistics were on.
    off_cpu_bpf_run: Option<(u64, u64)>,
    throttled: Option<Throttled>,
    tables: TableCost,
    /// Whether the run could have more than one process (more than one target, children
    /// followed, system-wide): its processes' root frames carry their pids.
    multi_process: bool,
    /// Whether it recorded every process.
    system: bool,
    /// Processes a system-wide run did not take in (past [`MAX_SYSTEM_PROCESSES`]).
    over_cap: usize,
    /// Off-CPU time recorded alongside the samples.
    off_cpu: Option<crate::sampling::OffCpu>,
    /// The run's span and clocks, when it recorded a timeline.
    timeline_clock: Option<TimelineClock>,
}

/// When a run that recorded a timeline started and ended, in the samples' clock
/// (`CLOCK_MONOTONIC`), and that clock's offset to Unix time.
#[derive(Clone, Copy, Debug)]
struct TimelineClock {
    start_ns: u64,
    end_ns: u64,
    realtime_offset_ns: i64,
}

impl TimelineClock {
    /// The span of a run that started sampling at `started` and ends now.
    fn ending(started: Instant) -> TimelineClock {
        use rustix::time::{clock_gettime, ClockId};
        let ns = |t: rustix::time::Timespec| t.tv_sec * 1_000_000_000 + t.tv_nsec;
        let end = ns(clock_gettime(ClockId::Monotonic));
        let realtime = ns(clock_gettime(ClockId::Realtime));
        let end_ns = end.max(0) as u64;
        TimelineClock {
            start_ns: end_ns.saturating_sub(started.elapsed().as_nanos() as u64),
            end_ns,
            realtime_offset_ns: realtime - end,
        }
    }
}

/// What the unwind tables of a recording's program cost, for the summary.
#[derive(Clone, Copy, Debug, Default)]
struct TableCost {
    built: usize,
    /// Of `built`, read from the on-disk cache.
    cached: usize,
    rows: u64,
    build_secs: f64,
    resident_bytes: u64,
    array_bytes: u64,
}

impl TableCost {
    fn of(unwind: &crate::unwind::UnwindMaps) -> TableCost {
        let (built, rows, took) = unwind.build_cost();
        TableCost {
            built,
            cached: unwind.tables_from_cache(),
            rows,
            build_secs: took.as_secs_f64(),
            resident_bytes: unwind.resident_bytes() as u64,
            array_bytes: unwind.capacity_bytes() as u64,
        }
    }
}

impl Collected {
    /// Forgets every kernel frame: for a client the kernel would not show them to.
    pub fn drop_kernel_frames(&mut self) {
        for sample in self.samples.iter_mut().flat_map(|(_, s)| s) {
            sample.kernel_frames = Arc::from([]);
        }
    }

    /// Samples seen by the kernel so far (recorded or lost).
    pub fn samples_seen(&self) -> u64 {
        self.counters.get(Counter::Samples)
    }

    /// Symbolizes and aggregates the samples into a profile that ended as `end`; `after_naming`
    /// gets the symbolizer once every address is named, before the stacks are built (see
    /// [`aggregate`]): [`Symbolizer::release`] where it serves later runs, [`Symbolizer::unload`]
    /// where it serves nothing more.
    pub fn assemble(
        self,
        end: RunEnd,
        symbolizer: &mut Symbolizer,
        options: &AggregateOptions,
        after_naming: impl FnOnce(&mut Symbolizer),
    ) -> Profile {
        let Collected {
            sampling,
            program_id,
            duration,
            mut processes,
            samples,
            counters,
            bpf_run,
            off_cpu_bpf_run,
            throttled,
            tables,
            multi_process,
            system,
            over_cap,
            off_cpu,
            timeline_clock,
        } = self;
        let head = Head {
            sampling,
            program_id,
            duration,
            counters,
            bpf_run,
            off_cpu_bpf_run,
            throttled,
            tables,
            multi_process,
            system,
            over_cap,
            off_cpu,
            timeline_clock,
        };
        assemble_samples(
            &mut processes,
            samples,
            head,
            end,
            symbolizer,
            options,
            after_naming,
        )
    }
}

/// What a profile says besides its processes' samples: of a whole recording, or of a window.
struct Head {
    sampling: Option<Sampling>,
    program_id: u32,
    duration: Duration,
    counters: Counters,
    bpf_run: Option<(u64, u64)>,
    /// The off-CPU program's run time and runs, where statistics were on.
    off_cpu_bpf_run: Option<(u64, u64)>,
    throttled: Option<Throttled>,
    tables: TableCost,
    /// Whether the run could have more than one process: roots carry their pids.
    multi_process: bool,
    /// Whether it recorded every process.
    system: bool,
    /// Processes a system-wide run did not take in (past [`MAX_SYSTEM_PROCESSES`]).
    over_cap: usize,
    /// Off-CPU time recorded alongside the samples.
    off_cpu: Option<crate::sampling::OffCpu>,
    /// The run's span and clocks, when it recorded a timeline.
    timeline_clock: Option<TimelineClock>,
}

/// Symbolizes and aggregates `samples` of `processes` (processes known only by their samples'
/// pids are added to it, as gone) into a profile that ended as `end`; `after_naming` as
/// [`aggregate`] takes it.
fn assemble_samples(
    processes: &mut BTreeMap<(u32, u32, u32), ProcessRecording>,
    samples: Vec<(u32, Vec<Sample>)>,
    head: Head,
    end: RunEnd,
    symbolizer: &mut Symbolizer,
    options: &AggregateOptions,
    after_naming: impl FnOnce(&mut Symbolizer),
) -> Profile {
    let Head {
        sampling,
        program_id,
        duration,
        counters,
        bpf_run,
        off_cpu_bpf_run,
        throttled,
        tables,
        multi_process,
        system,
        over_cap,
        off_cpu,
        timeline_clock,
    } = head;
    let mut options = options.clone();
    options.pid_roots |= multi_process;
    options.timeline = timeline_clock.is_some();
    let options = &options;
    // Samples of processes that came and went between two ticks: counted, not symbolized.
    let mut by_process: BTreeMap<(u32, u32, u32), Vec<Sample>> = BTreeMap::new();
    let mut not_profilable = 0;
    let mut known = |key: (u32, u32, u32)| {
        if processes.get(&key).is_some_and(|p| p.revoked) {
            return false;
        }
        processes.entry(key).or_insert_with(|| {
            let (program_id, run, pid) = key;
            let mut gone = ProcessRecording::gone(Slot { program_id, run }, pid);
            if system {
                // Not a child: a process that came and went between two looks.
                gone.target.comm = EXITED_PROCESS.into();
                gone.maps = ProcessMaps::gone_as(pid, EXITED_PROCESS);
            }
            gone
        });
        true
    };
    for (program_id, samples) in samples {
        let key_of = |s: &Sample| (program_id, s.run, s.pid);
        // One process's samples (a run of one target): moved whole rather than copied into
        // a second vector beside the first, which at 25k stacks was the end's largest piece.
        if let Some(key) = samples.first().map(key_of) {
            if samples.iter().all(|s| key_of(s) == key) && !by_process.contains_key(&key) {
                if known(key) {
                    by_process.insert(key, samples);
                } else {
                    // Never named, not even by address: its owner may not profile it.
                    not_profilable += samples.iter().map(|s| s.count).sum::<u64>();
                }
                continue;
            }
        }
        for sample in samples {
            let key = key_of(&sample);
            if known(key) {
                by_process.entry(key).or_default().push(sample);
            } else {
                not_profilable += sample.count;
            }
        }
    }
    let is_cpu = |s: &&Sample| s.kind == SampleKind::Cpu;
    let drained: u64 = by_process
        .values()
        .flatten()
        .filter(is_cpu)
        .map(|s| s.count)
        .sum::<u64>()
        + not_profilable;
    let drained_off_cpu: u64 = by_process
        .values()
        .flatten()
        .filter(|s| s.kind != SampleKind::Cpu)
        .map(|s| s.count)
        .sum();
    let untabled = untabled_objects(processes, &by_process);
    let mut tabled_late: Vec<crate::profile::LateTable> = Vec::new();
    for late in processes.values().flat_map(|p| &p.tabled_late) {
        if !tabled_late.iter().any(|t| t.name == late.name) {
            tabled_late.push(late.clone());
        }
    }
    tabled_late.sort_by(|a, b| a.after_secs.total_cmp(&b.after_secs));
    // The kernel counted every sample of a CPython thread it had no thread state for as
    // missing its Python frames; those of threads that never run Python (OpenMP and other
    // native workers) miss nothing. (Samples taken before the walker program or the
    // interpreter's layout was loaded were not counted, hence the saturation.)
    let no_python: u64 = processes
        .iter()
        .filter_map(|(key, p)| {
            let python = p.python.as_ref()?;
            let samples = by_process.get(key)?;
            Some(
                samples
                    .iter()
                    .filter(is_cpu)
                    .filter(|s| s.python_frames.is_empty() && python.runs_no_python(s.tid))
                    .map(|s| s.count)
                    .sum::<u64>(),
            )
        })
        .sum();
    let losses = Losses {
        // Off-CPU intervals whose sample map insert failed were counted as map full too, and
        // those not counted as intervals at all: the two kinds are compared apart.
        lost_in_transfer: counters
            .get(Counter::Samples)
            .saturating_sub(drained + counters.get(Counter::SampleMapFull))
            + counters
                .get(Counter::OffCpuIntervals)
                .saturating_sub(drained_off_cpu),
        sample_map_full: counters.get(Counter::SampleMapFull),
        user_stack_map_full: counters.get(Counter::UserStackMapFull),
        user_stack_error: counters.get(Counter::UserStackError),
        kernel_stack_map_full: counters.get(Counter::KernelStackMapFull),
        kernel_stack_error: counters.get(Counter::KernelStackError),
        // Counted by aggregation, which cuts the stacks.
        truncated: 0,
        stack_ended_early: counters.get(Counter::StackEndedEarly),
        not_profilable,
        off_cpu_pending_full: counters.get(Counter::OffCpuPendingFull),
        // Only a run that records a timeline loses times: the kernel counts the others' too
        // when they share a process with one.
        timeline_lost: if timeline_clock.is_some() {
            counters.get(Counter::TimelineLost)
        } else {
            0
        },
    };
    let targets = processes
        .values()
        .filter(|p| p.direct || by_process.keys().any(|k| k.2 == p.sample_pid))
        .map(|p| ProfiledTarget {
            pid: p.target.pid,
            ns_pid: p.target.ns_pid,
            pid_ns: p.target.ns.ino,
            comm: if p.maps.comm().is_empty() {
                p.target.comm.clone()
            } else {
                p.maps.comm().to_string()
            },
        })
        .collect();
    let meta = ProfileMeta {
        targets,
        sampling: sampling.unwrap_or_else(placeholder_sampling),
        duration,
        samples_seen: counters.get(Counter::Samples),
        losses,
        end,
        program_id,
        tags: options.tags.clone(),
        max_stack_length: options.max_stack_length,
        cost: RunCost::default(),
        throttled,
        unwound: Unwound {
            cfi_stacks: counters.get(Counter::CfiStacks),
            frame_pointer_stacks: counters
                .get(Counter::Samples)
                .saturating_sub(counters.get(Counter::CfiStacks)),
            frame_pointer_frames_in_cfi_stacks: counters.get(Counter::FramePointerFrames),
            scanned_frames_in_cfi_stacks: counters.get(Counter::ScannedFrames),
            before_walker_ready: counters.get(Counter::CfiNotReady),
            python_stacks: counters.get(Counter::PythonStacks),
            python_stacks_missing: counters
                .get(Counter::PythonStackMissing)
                .saturating_sub(no_python),
            // Counted by aggregation, which names the frames.
            python_unnamed: 0,
            stacks_through_untabled: counters.get(Counter::UntabledStacks),
        },
        untabled,
        tabled_late,
        off_cpu,
        limits_hit: (over_cap > 0)
            .then(|| {
                format!(
                    "{over_cap} processes not taken in: a system-wide run takes in at most \
                     {MAX_SYSTEM_PROCESSES}; their samples are counted under [exited process]"
                )
            })
            .into_iter()
            .chain(processes.values().filter_map(|p| {
                let said: Vec<String> = p
                    .maps
                    .limits_hit()
                    .into_iter()
                    .chain(p.python.as_ref().and_then(|t| t.limits_hit()))
                    .collect();
                (!said.is_empty()).then(|| {
                    format!(
                        "pid {} ({}): {}",
                        p.target.pid,
                        p.target.comm,
                        said.join("; ")
                    )
                })
            }))
            .collect(),
        python_unsupported: processes
            .values()
            .filter_map(|p| p.python_refused.clone())
            .collect(),
    };
    // The samples go to aggregation, which drops each once counted.
    let inputs: Vec<TargetSamples<'_>> = processes
        .iter()
        .map(|(key, p)| TargetSamples {
            target: &p.target,
            maps: &p.maps,
            sample_pid: p.sample_pid,
            samples: by_process.remove(key).unwrap_or_default(),
            cfi_walked: p.cfi_walked,
            python: p.python.as_ref().map(|t| t.symbols()),
        })
        .collect();
    drop(by_process);
    let mut profile = aggregate(inputs, symbolizer, options, meta, after_naming);
    // Measured after symbolization, which is most of bpfprof's own work.
    let mut cost = own_cost();
    cost.bpf_run_time_ns = bpf_run.map(|(t, _)| t);
    cost.bpf_run_count = bpf_run.map(|(_, n)| n);
    cost.off_cpu_bpf_run_time_ns = off_cpu_bpf_run.map(|(t, _)| t);
    cost.off_cpu_bpf_run_count = off_cpu_bpf_run.map(|(_, n)| n);
    cost.unwind_tables_built = tables.built as u64;
    cost.unwind_tables_cached = tables.cached as u64;
    cost.unwind_rows_built = tables.rows;
    cost.unwind_build_secs = tables.build_secs;
    cost.unwind_resident_bytes = tables.resident_bytes;
    cost.unwind_array_bytes = tables.array_bytes;
    for (codes, naming) in processes
        .values()
        .filter_map(|p| p.python.as_ref().map(|t| t.naming_cost()))
    {
        cost.python_code_objects += codes as u64;
        cost.python_naming_secs += naming.as_secs_f64();
    }
    profile.meta.cost = cost;
    if let (Some(timeline), Some(clock)) = (&mut profile.timeline, timeline_clock) {
        timeline.start_ns = clock.start_ns;
        timeline.end_ns = clock.end_ns;
        timeline.realtime_offset_ns = clock.realtime_offset_ns;
    }
    profile
}

impl ProcessRecording {
    /// A process known only by the pid its samples carry: it exited before it was seen.
    fn gone(slot: Slot, ns_pid: u32) -> ProcessRecording {
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
            python: None,
            python_refused: None,
            young_until: None,
            refreshed_at: Instant::now(),
            executable_kib: None,
            untabled: Vec::new(),
            tabled_late: Vec::new(),
            cfi_walked: false,
            revoked: false,
        }
    }
}

/// The objects without an unwind table at the run's end that samples' user stacks ran
/// through (their frames there walked by frame pointer), with those samples, most first.
fn untabled_objects(
    processes: &BTreeMap<(u32, u32, u32), ProcessRecording>,
    samples: &BTreeMap<(u32, u32, u32), Vec<Sample>>,
) -> Vec<UntabledObject> {
    let mut objects: BTreeMap<String, UntabledObject> = BTreeMap::new();
    for (key, samples) in samples {
        let Some(untabled) = processes.get(key).map(|p| &p.untabled) else {
            continue;
        };
        if untabled.is_empty() {
            continue;
        }
        for sample in samples {
            for object in untabled {
                if sample
                    .user_frames
                    .iter()
                    .any(|ip| (object.start..object.end).contains(ip))
                {
                    objects
                        .entry(object.name.clone())
                        .or_insert_with(|| UntabledObject {
                            name: object.name.clone(),
                            why: object.state.describe(),
                            samples: 0,
                        })
                        .samples += sample.count;
                }
            }
        }
    }
    let mut objects: Vec<UntabledObject> = objects.into_values().collect();
    objects.sort_by(|a, b| b.samples.cmp(&a.samples).then_with(|| a.name.cmp(&b.name)));
    objects
}

/// Until when a new process's start waits for its unwind tables: with `--unwind cfi` until
/// they are all built; otherwise briefly, so that small objects (an executable, libc) have
/// theirs from the first sample while a huge one's table comes a little later.
fn table_deadline(mode: crate::unwind::UnwindMode) -> Instant {
    Instant::now()
        + match mode {
            crate::unwind::UnwindMode::Cfi => crate::unwind::CFI_TABLE_WAIT,
            _ => crate::unwind::TABLE_WAIT,
        }
}

/// What a profile says of its sampling when nothing was ever attached (no target was added).
fn placeholder_sampling() -> Sampling {
    Sampling {
        event: crate::sampling::Event::CpuClock,
        rate: crate::sampling::Rate::Frequency(0),
        nominal_hz: 0.0,
        fallback: false,
        jitter: false,
    }
}

/// bpfprof's own CPU time and peak memory so far.
fn own_cost() -> RunCost {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    RunCost {
        profiler_cpu_secs: secs(usage.ru_utime) + secs(usage.ru_stime),
        profiler_peak_rss_bytes: usage.ru_maxrss as u64 * 1024,
        ..RunCost::default()
    }
}
