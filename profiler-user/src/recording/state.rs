//! A recording's state ([`Recording`]): what it was asked for, its run slots and processes,
//! and what it reads back of them.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Instant,
};

use profiler_common::PidNamespace;

use crate::{
    kernel::perf_events::EventStopper,
    kernel::pool::{ProgramPool, Slot},
    kernel::Counters,
    process::copies::CopyBudget,
    process::target::{ExitWatches, Owner},
    recording::process::ProcessRecording,
    recording::request::{RecordingRequest, Scope},
    runtime::{shares::NamingShares, Enabled},
    sampling::{Sampling, SamplingRequest},
    symbolize::WarmSink,
};

/// A recording in progress.
pub struct Recording {
    pub(super) request: SamplingRequest,
    /// Whether the profile splits threads (`--per-thread`): their names are then read.
    pub(super) per_thread: bool,
    /// How user stacks are walked (`--unwind`, the protocol's `unwind`).
    pub(super) unwind: crate::unwind::UnwindMode,
    /// Most rows a program loaded for this recording gets for unwind tables.
    pub(super) table_rows_cap: u32,
    pub(super) sampling: Option<Sampling>,
    pub(super) follow_children: bool,
    /// A launched command not yet exec'd (its pid), which the kernel is to record only from
    /// its exec ([`Recording::expect_exec`]).
    pub(super) launched: Option<u32>,
    /// One run slot per pid namespace of the targets: a sample names its process by its pid in
    /// its namespace, so processes of two namespaces never share a slot.
    pub(super) slots: Vec<(Slot, PidNamespace)>,
    /// Every process, by its slot's run and its pid in its namespace.
    pub(super) processes: BTreeMap<(u32, u32, u32), ProcessRecording>,
    /// The kernel's watches of the processes' exits.
    pub(super) exit_watches: ExitWatches,
    /// The processes whose exit the kernel reported and that are not marked exited yet.
    pub(super) exits_reported: HashSet<(u32, u32, u32)>,
    /// Global pids the kernel followed that are not processes (threads), or are gone.
    pub(super) ignored: HashSet<u32>,
    /// The program's delivery (expected, taken samples) when this recording attached, and the
    /// kernel's sample-rate limit then.
    pub(super) delivery_at_start: Option<(f64, u64)>,
    pub(super) max_sample_rate_at_start: u64,
    pub(super) started: Instant,
    pub(super) last_refresh: Instant,
    /// The runtimes whose frames are read (`--python off` leaves CPython out).
    pub(super) runtimes: Enabled,
    /// Where sampled addresses go to be symbolized during the run, if anywhere.
    pub(super) warm: Option<WarmSink>,
    /// Sampled addresses not sent to `warm` yet (see [`super::tick::WARM_HOLD`]).
    pub(super) warm_held: crate::symbolize::Warm,
    /// The non-root user the run is for, whose right to profile each process is re-checked
    /// for the whole run; `None` (root, the command line) checks nothing.
    pub(super) owner: Option<Owner>,
    /// Which processes are recorded.
    pub(super) scope: Scope,
    /// Processes of a system-wide run not taken in: past [`super::MAX_SYSTEM_PROCESSES`].
    pub(super) over_cap: HashSet<u32>,
    /// When the current window began (see [`Self::take_window`]), and the kernel's counters
    /// then.
    pub(super) window_started: Instant,
    pub(super) counters_at_window: Counters,
    /// The shares of naming runtime frames this recording's owner's names are charged to.
    pub(super) naming: Arc<NamingShares>,
    /// What the runtimes found in the objects of the processes taken in so far.
    pub(super) objects: crate::runtime::ObjectMemo,
    /// The process whose queued runtime frames are named first at the next naming: each
    /// process goes first in turn, so that one with a long queue does not starve the others.
    pub(super) naming_turn: usize,
    /// Whether the kernel writes each sample's time to its timeline ring for this recording.
    pub(super) timeline: bool,
    /// When a run of targets next looks for new runtime stacks between maps refreshes (see
    /// [`super::tick::RUNTIME_SCAN_COST_SHARE`]).
    pub(super) next_runtime_scan: Instant,
    /// Each program's count of runtime stacks stored at its last look for new ones: while the
    /// count stands still there are none, and a run of targets does not look.
    pub(super) stacks_at_runtime_scan: HashMap<u32, u64>,
    /// The budget the sealed copies of its targets' files count against (the driver's: the
    /// agent's, the daemon's for the run's owner; see [`Self::set_copy_budget`]).
    pub(super) copies: CopyBudget,
}

impl Recording {
    /// A recording that samples, follows children, walks stacks and reads runtime frames as
    /// `request` says; nothing is attached until the first target is added.
    pub fn new(request: &RecordingRequest) -> Recording {
        Recording {
            request: request.sampling,
            per_thread: request.options.per_thread,
            unwind: request.unwind,
            table_rows_cap: request.table_rows_cap,
            sampling: None,
            follow_children: request.follow_children,
            launched: None,
            slots: Vec::new(),
            processes: BTreeMap::new(),
            exit_watches: ExitWatches::new(),
            exits_reported: HashSet::new(),
            ignored: HashSet::new(),
            delivery_at_start: None,
            max_sample_rate_at_start: 0,
            started: Instant::now(),
            last_refresh: Instant::now(),
            runtimes: request.runtimes,
            warm: None,
            warm_held: Default::default(),
            owner: None,
            scope: request.scope.clone(),
            over_cap: HashSet::new(),
            window_started: Instant::now(),
            counters_at_window: Counters::default(),
            naming: Arc::new(NamingShares::single()),
            objects: Default::default(),
            naming_turn: 0,
            timeline: request.options.timeline,
            next_runtime_scan: Instant::now(),
            stacks_at_runtime_scan: HashMap::new(),
            copies: CopyBudget::mib(crate::process::copies::DEFAULT_RECORD_COPY_MIB),
        }
    }

    /// Counts the sealed copies of its targets' files against `budget` (before the first
    /// target is added): the agent's, or the daemon's for the run's owner, shared with the
    /// driver's other runs.
    pub fn set_copy_budget(&mut self, budget: CopyBudget) {
        self.copies = budget;
    }

    /// Charges the naming of this recording's runtime frames to its owner's share of `shares`
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
    pub(super) fn owner_uid(&self) -> u32 {
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

    /// Stoppers of this recording's runs alone (other runs of their programs go on), for a
    /// deadline kept while a tick holds the pool (see [`crate::kernel::RunStopper`]).
    pub fn run_stoppers(&self, pool: &mut ProgramPool) -> Vec<crate::kernel::RunStopper> {
        self.slots
            .iter()
            .filter_map(|(slot, _)| Some(pool.program(*slot).ok()?.run_stopper(slot.run)))
            .collect()
    }

    /// The kernel program's id, once a target was added.
    pub fn program_id(&self) -> Option<u32> {
        self.slots.first().map(|(s, _)| s.program_id)
    }

    /// Whether this recording records every process on the machine.
    pub fn is_system(&self) -> bool {
        matches!(self.scope, Scope::System(_))
    }

    /// Whether the run could have more than one process (more than one target, children
    /// followed, system-wide): its processes' root frames carry their pids.
    pub(super) fn is_multi_process(&self) -> bool {
        self.is_system()
            || self.follow_children
            || self.processes.values().filter(|p| p.direct).count() > 1
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
