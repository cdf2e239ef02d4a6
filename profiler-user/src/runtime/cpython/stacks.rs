//! Python frames in a recording: telling the kernel program where a CPython process keeps its
//! frames and naming the frames it recorded while the process still lives; merging them into
//! the native stacks at each `_PyEval_EvalFrameDefault` is [`super::merge`]'s (re-exported
//! here).
//!
//! Stages, in the order the data flows: [`PythonTracking::start`] (when a target is added)
//! gives the kernel the interpreter's layout and thread states; on every tick,
//! [`PythonTracking::refresh_threads`] lists new threads and [`PythonTracking::queue_new_stacks`]
//! queues the frames of new Python stacks (reading the kernel's maps, under the programs'
//! lock); [`PythonTracking::name_queued`] (off that lock, within the owner's share of
//! [`crate::runtime::shares`]) names them, which needs the live process (code objects live in
//! its memory); [`merge`] (at aggregation) puts the named frames where the interpreter
//! ran them.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use profiler_common::{PythonFrame, StackId};

use super::asyncio::{AsyncioLayout, TaskInfo, TaskReader};
pub use super::merge::{
    has_unnamed, limit_python, merge, python_view_keep, split_stack, symbol_key, task_of,
    MergeOptions, PythonNames, PythonSymbols, PythonView, TaskChains, TaskKey, EVAL_FUNCTION,
    PYTHON_FRAME,
};
use crate::{
    kernel::KernelProgram,
    runtime::{
        cpython::{Probe, PythonFunction, PythonTarget},
        shares::{NamingShares, Owner},
    },
};

/// Frames of one process waiting to be named at most: a process whose every sample holds
/// new code objects, named past its owner's CPU share, would otherwise queue without bound
/// (8 bytes and a set entry each). Frames past it stay unnamed, and the summary says so.
const MAX_QUEUED_FRAMES: usize = 1 << 18;
/// Sampled tasks of one process waiting for their chains at most (as frames, above).
const MAX_QUEUED_TASKS: usize = 1 << 16;
/// A sampled task's chain is read again on a later new stack once it is this old.
const CHAIN_REREAD: Duration = Duration::from_secs(1);

mod instance;

/// Whether Python frames are read from CPython processes (`--python`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PythonMode {
    /// For every CPython process bpfprof can walk (3.10-3.15).
    #[default]
    Auto,
    /// Never: Python processes show the interpreter's C functions only.
    Off,
}

impl PythonMode {
    /// The mode's name on the command line and in the protocol.
    pub fn name(self) -> &'static str {
        match self {
            PythonMode::Auto => "auto",
            PythonMode::Off => "off",
        }
    }
}

impl PythonMode {
    /// `runtimes` with CPython's frames read or not, as this mode says.
    pub fn runtimes(self, runtimes: crate::runtime::Enabled) -> crate::runtime::Enabled {
        runtimes.with(
            profiler_common::RuntimeTag::CPython,
            self == PythonMode::Auto,
        )
    }
}

impl std::str::FromStr for PythonMode {
    type Err = crate::error::Error;

    fn from_str(s: &str) -> crate::error::Result<PythonMode> {
        match s {
            "auto" => Ok(PythonMode::Auto),
            "off" => Ok(PythonMode::Off),
            _ => Err(crate::error::Error::Usage(format!(
                "unknown Python mode {s:?}: expected auto or off"
            ))),
        }
    }
}

/// One CPython process whose frames the kernel walks.
pub struct PythonTracking {
    target: PythonTarget,
    /// The layout the kernel has (its GIL addresses appear once the interpreter made its GIL).
    layout: profiler_common::PythonProcess,
    /// Host tids given to the kernel.
    threads: HashSet<u32>,
    /// Which of the process's threads run Python, as seen at each refresh.
    kinds: ThreadKinds,
    /// Python stacks whose frames were queued to be named.
    named_stacks: HashSet<StackId>,
    /// Frames (symbol keys) waiting to be named, oldest first: naming happens off the kernel
    /// programs' lock, within the owner's CPU share, so it may be carried to later ticks.
    queued: VecDeque<u64>,
    /// The keys in `queued`.
    queued_keys: HashSet<u64>,
    /// Frames not queued because [`MAX_QUEUED_FRAMES`] were waiting.
    queue_full: u64,
    /// The naming shares of the daemon (or recording), and whose this process's names are.
    shares: Arc<NamingShares>,
    owner: Owner,
    /// Bytes charged to the owner's share so far, given back when this is dropped.
    charged: u64,
    /// Frames named so far, and the task chains read so far.
    names: PythonNames,
    /// Async stacks: at most this many tasks read above a sampled task; `None`: off.
    async_depth: Option<usize>,
    /// Where the process's `_asyncio` keeps what the task reader reads, once found.
    asyncio: Option<AsyncioLayout>,
    /// What the summary says of asyncio in this process (before 3.14; offsets refused).
    asyncio_note: Option<String>,
    /// Sampled tasks waiting for their chain to be read, and when each chain was read.
    tasks_queued: VecDeque<TaskKey>,
    task_keys_queued: HashSet<TaskKey>,
    chains_read_at: HashMap<TaskKey, std::time::Instant>,
    /// Chains cut at the depth bound, chains that looped, sampled tasks that could not be
    /// read (ended, or another task at their address, before bpfprof read them).
    chains_cut: u64,
    chain_cycles: u64,
    tasks_unread: u64,
    /// Frames whose code object could not be read (freed, or the process is gone).
    unnamed: u64,
    /// Frames left unnamed because the owner's runs keep
    /// [`crate::runtime::shares::NAMING_BYTES_PER_OWNER`] of names.
    over_budget: u64,
    /// Frames still queued when the run ended, or dropped from a full queue: naming them
    /// needed more than the owner's CPU share.
    over_time: u64,
    /// Time spent naming frames (reading code objects and line tables from the process).
    naming: std::time::Duration,
}

impl PythonTracking {
    /// Starts walking the Python frames of `pid` (host pid) when it runs a supported CPython.
    /// Its names are charged to the owner's share of `naming`'s shares; its interpreter is
    /// looked up in `naming`'s objects first. When it runs a CPython bpfprof
    /// cannot walk, `refused` gets the sentence that says so (see [`crate::runtime::cpython::Unsupported`]), logged as
    /// a warning the first time.
    pub fn start(
        program: &mut KernelProgram,
        pid: u32,
        naming: &crate::runtime::Naming,
        async_depth: Option<usize>,
        refused: &mut Option<String>,
        mapped: &[procfs::process::MemoryMap],
    ) -> Option<PythonTracking> {
        let (shares, owner) = (naming.shares, naming.owner);
        let target = match PythonTarget::probe_with(pid, mapped, &naming.objects.cpython) {
            Ok(Probe::Walkable(t)) => *t,
            Ok(Probe::Unsupported(unsupported)) => {
                let said = unsupported.to_string();
                if refused.as_ref() != Some(&said) {
                    log::warn!("{said}");
                    *refused = Some(said);
                }
                return None;
            }
            Ok(Probe::NotPython(reason)) => {
                log::debug!("pid {pid}: no Python frames: {reason}");
                return None;
            }
            Err(e) => {
                log::debug!("pid {pid}: no Python frames: {e}");
                return None;
            }
        };
        let (major, minor) = target.version();
        let mut target = target;
        let layout = target.kernel_layout_with_gil();
        if !fits_frame_copy(&layout) {
            log::warn!(
                "pid {pid}: CPython {major}.{minor}'s frame fields lie past the {} bytes the \
                 kernel reads per frame, or are not aligned: no Python frames",
                profiler_common::PYTHON_FRAME_BYTES
            );
            return None;
        }
        if let Err(e) = program.runtimes.cpython.processes.insert(pid, layout, 0) {
            log::warn!("pid {pid}: cannot register CPython {major}.{minor} with the kernel: {e}");
            return None;
        }
        log::info!("pid {pid}: CPython {major}.{minor}: Python frames on");
        let mut tracking = PythonTracking {
            target,
            layout,
            threads: HashSet::new(),
            kinds: ThreadKinds::default(),
            named_stacks: HashSet::new(),
            queued: VecDeque::new(),
            queued_keys: HashSet::new(),
            queue_full: 0,
            shares: Arc::clone(shares),
            owner,
            charged: 0,
            names: PythonNames::default(),
            async_depth,
            asyncio: None,
            asyncio_note: None,
            tasks_queued: VecDeque::new(),
            task_keys_queued: HashSet::new(),
            chains_read_at: HashMap::new(),
            chains_cut: 0,
            chain_cycles: 0,
            tasks_unread: 0,
            unnamed: 0,
            over_budget: 0,
            over_time: 0,
            naming: std::time::Duration::ZERO,
        };
        tracking.refresh_threads(program);
        Some(tracking)
    }

    /// Gives the kernel the thread states of threads started since the last call, and
    /// forgets those that ended.
    pub fn refresh_threads(&mut self, program: &mut KernelProgram) {
        // A free-threaded build's GIL may be enabled or dropped while it runs (importing an
        // extension module that needs it enables it): looked at again at every refresh.
        self.find_asyncio();
        let with_task = self.asyncio.is_some() && self.layout.tstate_running_task == 0;
        if self.layout.gil_holder == 0 || self.target.free_threaded() || with_task {
            let layout = self.target.kernel_layout_with_gil();
            let layout = self.with_async(layout);
            if layout != self.layout
                && program
                    .runtimes
                    .cpython
                    .processes
                    .insert(self.target.pid(), layout, 0)
                    .is_ok()
            {
                self.layout = layout;
            }
        }
        let crate::runtime::cpython::ThreadListing {
            python: threads,
            tasks,
        } = match self.target.thread_listing() {
            Ok(t) => t,
            Err(e) => {
                log::debug!("pid {}: Python threads: {e}", self.target.pid());
                return;
            }
        };
        let now: HashSet<u32> = threads.iter().map(|(tid, _)| *tid).collect();
        self.kinds.record(
            tasks
                .iter()
                .map(|(&ns_tid, host)| (ns_tid, now.contains(host))),
        );
        let pid = self.target.pid();
        for (tid, tstate) in threads {
            // Re-written every time: a thread id can be reused with a new thread state, and
            // by another process (the entry then names it).
            let thread = profiler_common::PythonThread {
                tstate,
                tgid: pid,
                _pad: 0,
            };
            let _ = program.runtimes.cpython.threads.insert(tid, thread, 0);
        }
        for gone in self.threads.difference(&now) {
            forget_thread(program, pid, *gone);
        }
        self.threads = now;
    }

    /// Queues the frames of the Python stacks the kernel recorded for this process (run slot
    /// `run`, `ns_pid` in its namespace) since the last call, to be named by
    /// [`Self::name_queued`]: this reads the kernel's maps only (call it with the programs'
    /// lock held), and no memory of the process.
    pub fn queue_new_stacks(
        &mut self,
        program: &KernelProgram,
        ids: &[(u64, u32, StackId)],
        run: u32,
        ns_pid: u32,
    ) {
        let mut seen = std::mem::take(&mut self.named_stacks);
        for frames in crate::runtime::new_stacks(program, ids, run, ns_pid, &mut seen) {
            // The GIL and task entries are markers, not code to read.
            let (code, trailer) = split_stack(&frames);
            if let Some(task) = trailer.task {
                self.queue_task(task);
            }
            for &packed in code {
                let key = symbol_key(packed);
                if self.names.symbols.contains_key(&key) || self.queued_keys.contains(&key) {
                    continue;
                }
                if self.queued.len() >= MAX_QUEUED_FRAMES {
                    self.queue_full += 1;
                    continue;
                }
                self.queued_keys.insert(key);
                self.queued.push_back(key);
            }
        }
        self.named_stacks = seen;
    }

    /// Python's `threading` names of the process's threads, by host tid, read without
    /// stopping it (as `bpfprof dump` reads them); empty where they cannot be read.
    pub fn threading_names(&mut self) -> HashMap<u32, String> {
        match self.target.threads() {
            Ok(threads) => self.target.threading_names(&threads),
            Err(e) => {
                log::debug!("no threading names: {e:#}");
                HashMap::new()
            }
        }
    }

    /// Whether frames wait to be named.
    pub fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    /// Names queued frames, oldest first, reading their code objects from the live process,
    /// until this thread has spent `cpu` on it (at least one frame is named when any waits);
    /// returns the CPU spent. Frames past the owner's share of kept bytes stay unnamed
    /// (counted); the rest of the queue waits for the next call.
    pub fn name_queued(&mut self, cpu: Duration) -> Duration {
        let started = std::time::Instant::now();
        let cpu_before = crate::clock::thread_cpu_time();
        let spent = || crate::clock::thread_cpu_time().saturating_sub(cpu_before);
        while let Some(key) = self.queued.pop_front() {
            self.queued_keys.remove(&key);
            if self.names.symbols.contains_key(&key) {
                continue;
            }
            if !self.shares.has_room(self.owner) {
                self.over_budget += 1;
                continue;
            }
            let kept_before = self.target.kept_bytes();
            match self.target.resolve(PythonFrame::unpack(key)) {
                Ok(function) => {
                    let kept = self.target.kept_bytes().saturating_sub(kept_before)
                        + (function.name.len()
                            + function.file.len()
                            + std::mem::size_of::<(u64, PythonFunction)>())
                            as u64;
                    self.shares.charge(self.owner, kept);
                    self.charged += kept;
                    self.names.symbols.insert(key, function);
                }
                Err(e) => {
                    self.unnamed += 1;
                    log::debug!("pid {}: Python frame {key:#x}: {e}", self.target.pid());
                }
            }
            if spent() >= cpu {
                break;
            }
        }
        // Task chains after frames, in what is left of the same CPU: a chain is a few reads.
        let mut parents = HashMap::new();
        let mut read = 0;
        while read == 0 || spent() < cpu {
            let Some(key) = self.tasks_queued.pop_front() else {
                break;
            };
            read += 1;
            self.task_keys_queued.remove(&key);
            if !self.shares.has_room(self.owner) {
                self.over_budget += 1;
                continue;
            }
            self.read_chain(key, &mut parents);
        }
        self.naming += started.elapsed();
        spent()
    }

    /// Queues sampled task `key` to have its chain read: once, and again on a later stack
    /// once its chain is older than [`CHAIN_REREAD`] (a task's waiters change as it runs).
    fn queue_task(&mut self, key: TaskKey) {
        if self.asyncio.is_none() || self.task_keys_queued.contains(&key) {
            return;
        }
        if self
            .chains_read_at
            .get(&key)
            .is_some_and(|at| at.elapsed() < CHAIN_REREAD)
        {
            return;
        }
        if self.tasks_queued.len() >= MAX_QUEUED_TASKS {
            self.queue_full += 1;
            return;
        }
        self.task_keys_queued.insert(key);
        self.tasks_queued.push_back(key);
    }

    /// Reads the chain of tasks awaiting sampled task `key` (`parents`: tasks read in this
    /// naming round, by address) and keeps it, its coroutines named.
    fn read_chain(&mut self, key: TaskKey, parents: &mut HashMap<u64, TaskInfo>) {
        let (Some(asyncio), Some(depth)) = (self.asyncio, self.async_depth) else {
            return;
        };
        let (task, identity) = key;
        let reader = TaskReader {
            memory: &self.target.memory,
            layout: &self.target.layout,
            asyncio: &asyncio,
        };
        // The task at the address must be the one sampled: its coroutine has the bits the
        // kernel recorded (else it ended and another took its memory).
        let same = reader
            .memory
            .read_u64(task.wrapping_add(asyncio.task_coro as u64))
            .is_ok_and(|coro| {
                identity == profiler_common::PythonFrame::UNKNOWN_IDENTITY
                    || profiler_common::PythonFrame::identity_of(coro) == identity
            });
        let before = self.target.memory.bytes_read();
        let chain = if same {
            reader.chain(task, depth, parents)
        } else {
            Err(anyhow::anyhow!("task {task:#x} ended before it was read"))
        };
        self.target.naming_bytes += self.target.memory.bytes_read().saturating_sub(before);
        let mut chain = match chain {
            Ok(chain) => chain,
            Err(e) => {
                self.tasks_unread += 1;
                log::debug!("pid {}: asyncio task: {e:#}", self.target.pid());
                return;
            }
        };
        for t in &mut chain.tasks {
            if t.coro_code != 0 {
                t.coroutine = self.target.code_name(t.coro_code);
            }
        }
        self.chains_cut += u64::from(chain.cut);
        self.chain_cycles += u64::from(chain.cycle);
        let kept = chain
            .tasks
            .iter()
            .map(|t| t.name.len() + t.coroutine.as_ref().map_or(0, String::len) + 64)
            .sum::<usize>() as u64;
        self.shares.charge(self.owner, kept);
        self.charged += kept;
        self.chains_read_at.insert(key, std::time::Instant::now());
        self.names.tasks.insert(key, chain);
    }

    /// Looks for the process's asyncio debug offsets (3.14+) while they are not found, and,
    /// before 3.14, for its `_asyncio` extension, to say that async stacks need 3.14.
    fn find_asyncio(&mut self) {
        if self.async_depth.is_none() || self.asyncio.is_some() || self.asyncio_note.is_some() {
            log::trace!("pid {}: asyncio not looked for", self.target.pid());
            return;
        }
        let pid = self.target.pid();
        let (_, minor) = self.target.version();
        if minor < super::asyncio::FIRST_ASYNC_MINOR {
            if super::asyncio::maps_asyncio_extension(pid) {
                self.asyncio_note = Some(super::asyncio::NEEDS_314.to_string());
            }
            return;
        }
        match super::asyncio::find_layout(
            pid,
            &self.target.memory,
            self.target.runtime_address(),
            minor,
        ) {
            Ok(Some(layout)) => {
                log::info!("pid {pid}: asyncio tasks recorded with its Python samples");
                self.asyncio = Some(layout);
            }
            Ok(None) => log::debug!("pid {pid}: no asyncio debug offsets mapped yet"),
            Err(e) => {
                log::warn!("pid {pid}: asyncio debug offsets refused: {e:#}");
                self.asyncio_note = Some(format!(
                    "asyncio task stacks off: its asyncio debug offsets were refused: {e:#}"
                ));
            }
        }
    }

    /// `layout` with the running task recorded where async stacks are on and found.
    fn with_async(
        &self,
        mut layout: profiler_common::PythonProcess,
    ) -> profiler_common::PythonProcess {
        if let (Some(asyncio), Some(_)) = (self.asyncio, self.async_depth) {
            (layout.tstate_running_task, layout.task_coro) = asyncio.kernel_fields();
        }
        layout
    }

    /// Frames still queued: they will not be named (the run ended); counted in the summary.
    pub fn abandon_queued(&mut self) {
        self.over_time += self.queued.len() as u64;
        self.queued.clear();
        self.queued_keys.clear();
        self.tasks_unread += self.tasks_queued.len() as u64;
        self.tasks_queued.clear();
        self.task_keys_queued.clear();
    }

    /// What the bounds on reading this process's memory left out, in words; `None` when
    /// nothing was.
    pub fn limits_hit(&self) -> Option<String> {
        let walks = self.target.walk_limits();
        let mut parts = Vec::new();
        if walks.cycles > 0 {
            parts.push(format!(
                "its Python thread list looped back on itself at {} reads (each thread state \
                 is listed once)",
                walks.cycles
            ));
        }
        if walks.threads_cut > 0 {
            parts.push(format!(
                "its Python thread list was longer than the daemon reads at {} reads (the \
                 first {} thread states are listed)",
                walks.threads_cut,
                crate::runtime::cpython::MAX_THREAD_STATES
            ));
        }
        if walks.frames_cut > 0 {
            parts.push(format!(
                "{} of its Python frame walks looped or went past {} frames",
                walks.frames_cut,
                crate::runtime::cpython::MAX_FRAMES_VISITED
            ));
        }
        if self.over_budget > 0 {
            parts.push(format!(
                "{} Python frames were left unnamed: its user's runs keep the {} MiB of names \
                 a user may keep",
                self.over_budget,
                crate::runtime::shares::NAMING_BYTES_PER_OWNER >> 20
            ));
        }
        if self.over_time + self.queue_full > 0 {
            parts.push(format!(
                "{} Python frames were left unnamed: naming them needed more than its user's \
                 share of the daemon's CPU during the run",
                self.over_time + self.queue_full
            ));
        }
        if self.chains_cut > 0 {
            parts.push(format!(
                "{} of its asyncio task chains were longer than --max-async-depth ({} tasks): \
                 cut at their outer end",
                self.chains_cut,
                self.async_depth.unwrap_or(0)
            ));
        }
        if self.chain_cycles > 0 {
            parts.push(format!(
                "{} of its asyncio task chains looped back on themselves (each task is shown \
                 once)",
                self.chain_cycles
            ));
        }
        if self.tasks_unread > 0 {
            parts.push(format!(
                "{} of its sampled asyncio tasks could not be read (ended before bpfprof read \
                 them): their samples show the event loop's frames",
                self.tasks_unread
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// What the summary says of asyncio in this process, beyond its limits.
    pub fn notes(&self) -> Vec<String> {
        self.asyncio_note
            .iter()
            .map(|note| {
                let (major, minor) = self.target.version();
                format!(
                    "pid {} (CPython {major}.{minor}): {note}",
                    self.target.pid()
                )
            })
            .collect()
    }

    /// The asyncio layout found in the process, if any (3.14+, async stacks on).
    pub fn asyncio(&self) -> Option<&AsyncioLayout> {
        self.asyncio.as_ref()
    }

    /// Code objects read from the process so far, and the time naming frames took.
    pub fn naming_cost(&self) -> (usize, std::time::Duration) {
        (self.target.code_objects(), self.naming)
    }

    /// Stops walking this process: its layout and threads leave the kernel maps.
    pub fn stop(&mut self, program: &mut KernelProgram) {
        let _ = program
            .runtimes
            .cpython
            .processes
            .remove(&self.target.pid());
        let pid = self.target.pid();
        for tid in self.threads.drain() {
            forget_thread(program, pid, tid);
        }
    }

    /// The frames named so far.
    pub fn symbols(&self) -> &PythonSymbols {
        &self.names.symbols
    }

    /// Whether thread `ns_tid` (in the process's pid namespace) was listed with a thread
    /// state (`Some(true)`), only without one (`Some(false)`), or never (`None`).
    pub fn listed(&self, ns_tid: u32) -> Option<bool> {
        if self.kinds.python.contains(&ns_tid) {
            Some(true)
        } else {
            self.kinds.stateless.contains(&ns_tid).then_some(false)
        }
    }

    /// Whether thread `ns_tid` (in the process's pid namespace) ran no Python during the run:
    /// listed at a refresh without a thread state, and never with one.
    pub fn runs_no_python(&self, ns_tid: u32) -> bool {
        self.kinds.runs_no_python(ns_tid)
    }
}

impl Drop for PythonTracking {
    fn drop(&mut self) {
        self.shares.release(self.owner, self.charged);
    }
}

/// The threads of a CPython process seen so far, by whether they had a thread state.
///
/// The kernel counts every sample of a thread it has no thread state for as "Python frames
/// missing" (it cannot tell a thread userspace has not listed yet from one that never runs
/// Python); this tells the two apart afterwards, so that the count is of threads that run
/// Python only: an OpenMP or other native worker thread has nothing to miss.
#[derive(Debug, Default)]
pub struct ThreadKinds {
    /// Threads listed with a thread state at least once.
    python: HashSet<u32>,
    /// Threads listed without one at least once.
    stateless: HashSet<u32>,
}

impl ThreadKinds {
    /// Records one listing: each task's tid and whether it had a thread state.
    pub fn record(&mut self, tasks: impl IntoIterator<Item = (u32, bool)>) {
        for (tid, has_state) in tasks {
            if has_state {
                self.python.insert(tid);
            } else {
                self.stateless.insert(tid);
            }
        }
    }

    /// Whether `tid` was listed, always without a thread state. A thread that gained one
    /// later (a new Python thread listed before its state named it) runs Python: its samples
    /// before its listing are missing frames indeed.
    pub fn runs_no_python(&self, tid: u32) -> bool {
        self.stateless.contains(&tid) && !self.python.contains(&tid)
    }
}

/// Whether every frame field the kernel reads ends within the bytes it copies per frame and is
/// aligned to its size (the kernel takes fields from whole 8-byte words of its copy), and the
/// copy's window is one the kernel can hold.
fn fits_frame_copy(k: &profiler_common::PythonProcess) -> bool {
    let instr = if k.instr_rule == profiler_common::PythonInstrRule::LastiIndex as u32 {
        4
    } else {
        8
    };
    let window = k.frame_window as usize;
    [
        (k.frame_previous, 8),
        (k.frame_code, 8),
        (k.frame_instr, instr),
        (k.frame_entry, 1),
        // 0 where the build has no thread-local bytecode: never read then.
        (k.frame_tlbc_index, 4),
    ]
    .iter()
    .all(|&(offset, size)| {
        offset as usize + size <= profiler_common::PYTHON_FRAME_BYTES
            && (offset as usize).is_multiple_of(size)
    }) && window.is_multiple_of(8)
        && (profiler_common::PYTHON_FRAME_BYTES..=profiler_common::PYTHON_FRAME_WINDOW_BYTES)
            .contains(&window)
}

/// Removes thread `tid` of process `pid` from the kernel's walked threads, unless its id was
/// reused by another process's thread since, whose entry stays.
fn forget_thread(program: &mut KernelProgram, pid: u32, tid: u32) {
    let threads = &mut program.runtimes.cpython.threads;
    if threads.get(&tid, 0).is_ok_and(|t| t.tgid == pid) {
        let _ = threads.remove(&tid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_threads_never_seen_with_a_thread_state_run_no_python() {
        let mut kinds = ThreadKinds::default();
        // 10: the main thread; 11: an OpenMP worker; 12: a Python thread listed before its
        // state named it.
        kinds.record([(10, true), (11, false), (12, false)]);
        kinds.record([(10, true), (11, false), (12, true)]);
        assert!(!kinds.runs_no_python(10));
        assert!(kinds.runs_no_python(11));
        assert!(!kinds.runs_no_python(12));
        // Never listed (came and went between two refreshes): unknown, not "no Python".
        assert!(!kinds.runs_no_python(13));
    }

    #[test]
    fn every_tabled_layout_fits_the_kernels_frame_copy() {
        for minor in 10..=12 {
            let layout = super::super::layout::table(minor).expect("a tabled version");
            assert!(fits_frame_copy(&layout.kernel), "3.{minor}");
            // The kernel's identity word: the name's hash up to 3.11, the version from 3.12.
            let k = &layout.kernel;
            match minor {
                10 | 11 => assert_eq!(
                    (k.code_identity, k.code_identity_deref),
                    (layout.code_name, 24)
                ),
                _ => assert_eq!(
                    (k.code_identity, k.code_identity_deref),
                    (layout.code_firstlineno + 20, 0)
                ),
            }
        }
        let mut misaligned = super::super::layout::table(12).expect("3.12").kernel;
        misaligned.frame_previous += 4;
        assert!(!fits_frame_copy(&misaligned));
        let mut too_wide = super::super::layout::table(12).expect("3.12").kernel;
        too_wide.frame_window = profiler_common::PYTHON_FRAME_WINDOW_BYTES as u32 + 8;
        assert!(!fits_frame_copy(&too_wide));
    }
}
