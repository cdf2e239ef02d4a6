//! Python frames in a recording: telling the kernel program where a CPython process keeps its
//! frames, naming the frames it recorded while the process still lives, and merging them into
//! the native stacks at each `_PyEval_EvalFrameDefault`.
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

use crate::{
    kernel::KernelProgram,
    runtime::{
        cpython::{Probe, PythonFunction, PythonTarget},
        shares::{NamingShares, Owner},
    },
    symbolize::{Frame, FrameKind},
};

/// The kind of the frames this runtime names (Python functions, and the GIL's root frames).
pub const PYTHON_FRAME: FrameKind = FrameKind::Runtime(profiler_common::RuntimeTag::CPython);

/// The C function that runs Python frames: one call per group of frames the kernel marks as
/// an eval call's entry.
pub const EVAL_FUNCTION: &str = "_PyEval_EvalFrameDefault";

/// How CPython 3.12+'s perf map names a trampoline: `py::QUALNAME:FILE`.
const PERF_TRAMPOLINE_PREFIX: &str = "py::";

/// The C function that calls into a perf trampoline.
const PERF_TRAMPOLINE_EVALUATOR: &str = "py_trampoline_evaluator";

/// Frames of one process waiting to be named at most: a process whose every sample holds
/// new code objects, named past its owner's CPU share, would otherwise queue without bound
/// (8 bytes and a set entry each). Frames past it stay unnamed, and the summary says so.
const MAX_QUEUED_FRAMES: usize = 1 << 18;

/// Names of recorded Python frames, by packed frame without its eval-entry flag (code object
/// and instruction).
pub type PythonSymbols = HashMap<u64, PythonFunction>;

/// Whether Python frames are read from CPython processes (`--python`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PythonMode {
    /// For every CPython 3.10-3.13 process.
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
    /// Frames named so far.
    symbols: PythonSymbols,
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
    /// Its names are charged to `owner`'s share of `shares`. When it runs a CPython bpfprof
    /// cannot walk, `refused` gets the sentence that says so (see [`crate::runtime::cpython::Unsupported`]), logged as
    /// a warning the first time.
    pub fn start(
        program: &mut KernelProgram,
        pid: u32,
        shares: &Arc<NamingShares>,
        owner: Owner,
        refused: &mut Option<String>,
    ) -> Option<PythonTracking> {
        let target = match PythonTarget::probe(pid) {
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
            symbols: PythonSymbols::new(),
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
        if self.layout.gil_holder == 0 {
            let layout = self.target.kernel_layout_with_gil();
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
        for (tid, tstate) in threads {
            // Re-written every time: a thread id can be reused with a new thread state.
            let _ = program.runtimes.cpython.threads.insert(tid, tstate, 0);
        }
        for gone in self.threads.difference(&now) {
            let _ = program.runtimes.cpython.threads.remove(gone);
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
        let mine =
            |&&(runs, pid, _): &&(u64, u32, StackId)| runs & (1 << run) != 0 && pid == ns_pid;
        for (_, _, id) in ids.iter().filter(mine) {
            if !self.named_stacks.insert(*id) {
                continue;
            }
            let Ok(frames) = program.stack(*id) else {
                continue;
            };
            // The GIL entry is a marker, not code to read.
            for &packed in frames.iter().filter(|&&p| !is_gil_marker(p)) {
                let key = symbol_key(packed);
                if self.symbols.contains_key(&key) || self.queued_keys.contains(&key) {
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
            if self.symbols.contains_key(&key) {
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
                    self.symbols.insert(key, function);
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
        self.naming += started.elapsed();
        spent()
    }

    /// Frames still queued: they will not be named (the run ended); counted in the summary.
    pub fn abandon_queued(&mut self) {
        self.over_time += self.queued.len() as u64;
        self.queued.clear();
        self.queued_keys.clear();
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
        (!parts.is_empty()).then(|| parts.join("; "))
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
        for tid in self.threads.drain() {
            let _ = program.runtimes.cpython.threads.remove(&tid);
        }
    }

    /// The frames named so far.
    pub fn symbols(&self) -> &PythonSymbols {
        &self.symbols
    }

    /// Whether thread `ns_tid` (in the process's pid namespace) ran no Python during the run:
    /// listed at a refresh without a thread state, and never with one.
    pub fn runs_no_python(&self, ns_tid: u32) -> bool {
        self.kinds.runs_no_python(ns_tid)
    }
}

impl crate::runtime::Instance for PythonTracking {
    fn tag(&self) -> profiler_common::RuntimeTag {
        profiler_common::RuntimeTag::CPython
    }

    fn refresh(&mut self, program: &mut KernelProgram) {
        self.refresh_threads(program);
    }

    fn queue_new_stacks(
        &mut self,
        program: &KernelProgram,
        ids: &[(u64, u32, StackId)],
        run: u32,
        ns_pid: u32,
    ) {
        PythonTracking::queue_new_stacks(self, program, ids, run, ns_pid);
    }

    fn has_queued(&self) -> bool {
        PythonTracking::has_queued(self)
    }

    fn name_queued(&mut self, cpu: Duration) -> Duration {
        PythonTracking::name_queued(self, cpu)
    }

    fn abandon_queued(&mut self) {
        PythonTracking::abandon_queued(self);
    }

    fn thread_names(&mut self) -> HashMap<u32, String> {
        self.threading_names()
    }

    fn runs_no_runtime_code(&self, ns_tid: u32) -> bool {
        self.runs_no_python(ns_tid)
    }

    fn limits_hit(&self) -> Option<String> {
        PythonTracking::limits_hit(self)
    }

    fn naming_cost(&self) -> (usize, Duration) {
        PythonTracking::naming_cost(self)
    }

    fn frames(&self) -> &dyn crate::runtime::NamedFrames {
        &self.symbols
    }

    fn stop(&mut self, program: &mut KernelProgram) {
        PythonTracking::stop(self, program);
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
    ]
    .iter()
    .all(|&(offset, size)| {
        offset as usize + size <= profiler_common::PYTHON_FRAME_BYTES
            && (offset as usize).is_multiple_of(size)
    }) && window.is_multiple_of(8)
        && (profiler_common::PYTHON_FRAME_BYTES..=profiler_common::PYTHON_FRAME_WINDOW_BYTES)
            .contains(&window)
}

/// The key of a packed frame in [`PythonSymbols`]: the frame without its eval-entry flag.
pub fn symbol_key(packed: u64) -> u64 {
    PythonFrame::without_eval_entry(packed)
}

/// Whether a packed stack entry is the kernel's GIL entry (outermost), not a frame.
fn is_gil_marker(packed: u64) -> bool {
    packed == PythonFrame::GIL_HELD || packed == PythonFrame::GIL_NOT_HELD
}

/// The leaf-most `limit` frames of a kernel Python stack (innermost first, the GIL entry
/// last, kept), and whether any were cut.
pub fn limit_python(frames: &[u64], limit: usize) -> (Vec<u64>, bool) {
    let gil = frames
        .last()
        .filter(|f| **f == PythonFrame::GIL_HELD || **f == PythonFrame::GIL_NOT_HELD);
    let code = &frames[..frames.len() - usize::from(gil.is_some())];
    if code.len() <= limit {
        return (frames.to_vec(), false);
    }
    let mut out = code[..limit].to_vec();
    out.extend(gil);
    (out, true)
}

/// Whether any frame of the Python stack `python` has no name in `symbols`: its code object
/// was never read (freed, or its process exited, before naming reached it), so it shows as
/// `[unknown Python code]`.
pub fn has_unnamed(python: &[u64], symbols: &PythonSymbols) -> bool {
    python
        .iter()
        .any(|&p| !is_gil_marker(p) && !symbols.contains_key(&symbol_key(p)))
}

/// A Python function as a profile frame.
fn python_frame(function: Option<&PythonFunction>) -> Frame {
    match function {
        Some(f) => Frame {
            name: f.name.as_str().into(),
            module: Some(f.file.as_str().into()),
            kind: PYTHON_FRAME,
            inlined: false,
            file: Some(f.file.as_str().into()),
            line: Some(f.line),
            start_line: Some(f.first_line),
            build_id: None,
        },
        None => Frame::named("[unknown Python code]", None, PYTHON_FRAME),
    }
}

/// How [`merge`] shows Python frames: the runtimes' options.
pub use crate::runtime::FrameOptions as MergeOptions;
/// Which outputs show the Python view (`--python-view`): the runtimes' view.
pub use crate::runtime::View as PythonView;

/// The root frame of a sample whose thread held the GIL (`--python-gil`).
const GIL_HELD_FRAME: &str = "[GIL held]";
/// The root frame of a sample whose thread did not hold the GIL (`--python-gil`).
const GIL_NOT_HELD_FRAME: &str = "[GIL not held]";

/// The root frame that says whether a sample's thread held the GIL.
fn gil_frame(held: bool) -> Frame {
    let name = if held {
        GIL_HELD_FRAME
    } else {
        GIL_NOT_HELD_FRAME
    };
    Frame::named(name, None, PYTHON_FRAME)
}

/// Whether `frame` is one of the C runtime's libraries, which the interpreter calls for its
/// own work (`malloc`, `memcpy`, `__tls_get_addr` in the dynamic loader): below the
/// interpreter's frames it is the interpreter's cost, below an extension's the extension's.
fn is_c_runtime(frame: &Frame) -> bool {
    /// File name prefixes of glibc's libraries, the dynamic loader and the vDSO.
    const RUNTIME: [&str; 8] = [
        "libc.so",
        "libc-",
        "ld-linux",
        "libm.so",
        "libpthread",
        "libdl",
        "librt",
        "[vdso]",
    ];
    module_name_starts_with(frame, &RUNTIME)
}

/// Whether `frame` is user code of a module whose file name starts with one of `prefixes`.
fn module_name_starts_with(frame: &Frame, prefixes: &[&str]) -> bool {
    frame.kind == FrameKind::User
        && frame.module.as_deref().is_some_and(|m| {
            let name = std::path::Path::new(m)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            prefixes.iter().any(|p| name.starts_with(p))
        })
}

/// Which frames of a stack (root first) the Python view keeps: below the innermost Python
/// function, the interpreter's C frames (libpython or the python executable: the eval loop,
/// pymalloc, ...), the C runtime it calls and the kernel work they do are folded into that
/// function, up to the first frame of other native code (an extension: numpy, zlib,
/// libtorch), which stays with everything below it; between Python functions the
/// interpreter's frames go as they do without `--python-glue`. A stack without Python
/// frames is kept whole.
pub fn python_view_keep(frames: &[Option<&Frame>]) -> Vec<bool> {
    let is_python = |f: &Option<&Frame>| {
        f.is_some_and(|f| {
            f.kind == PYTHON_FRAME && *f.name != *GIL_HELD_FRAME && *f.name != *GIL_NOT_HELD_FRAME
        })
    };
    let mut keep = vec![true; frames.len()];
    let (Some(first), Some(last)) = (
        frames.iter().position(is_python),
        frames.iter().rposition(is_python),
    ) else {
        return keep;
    };
    for (i, frame) in frames.iter().enumerate().take(last).skip(first + 1) {
        if let Some(frame) = frame {
            keep[i] = !(is_interpreter(frame) || is_perf_trampoline(frame));
        }
    }
    for (i, frame) in frames.iter().enumerate().skip(last + 1) {
        match frame {
            Some(f) if is_interpreter(f) || is_c_runtime(f) || f.kind == FrameKind::Kernel => {
                keep[i] = false
            }
            _ => break,
        }
    }
    keep
}

/// Whether `frame` is C code of the interpreter itself (libpython or a static python
/// binary): the glue between Python frames.
fn is_interpreter(frame: &Frame) -> bool {
    module_name_starts_with(frame, &["libpython3", "python3"])
}

/// Whether `frame` is one of CPython 3.12+'s perf trampolines (`-X perf`): a `py::NAME:FILE`
/// frame named from the interpreter's perf map, or the C function that enters them. Where the
/// kernel walked the Python frames they only repeat them.
fn is_perf_trampoline(frame: &Frame) -> bool {
    frame.kind == FrameKind::User
        && (*frame.name == *PERF_TRAMPOLINE_EVALUATOR
            || (frame.name.starts_with(PERF_TRAMPOLINE_PREFIX)
                && frame.module.as_deref() == Some(crate::symbolize::JIT_MODULE)))
}

impl crate::runtime::NamedFrames for PythonSymbols {
    fn has_unnamed(&self, stack: &[u64]) -> bool {
        has_unnamed(stack, self)
    }

    fn merge(
        &self,
        native: Vec<(Frame, Option<crate::profile::CodeAddress>)>,
        stack: &[u64],
        options: MergeOptions,
    ) -> Vec<(Frame, Option<crate::profile::CodeAddress>)> {
        merge(native, stack, self, options, None)
    }
}

/// Merges a sample's Python frames (`python`, packed, leaf first) into its native user frames
/// (`native`, root first, each with what the caller keeps beside it): each
/// `_PyEval_EvalFrameDefault` frame becomes the Python frames that call ran, matched from the
/// leaf (native stacks lose frames at the root, not the leaf). Python frames left over (a
/// native stack that ended early) go at the root. Unless `keep_glue`, the interpreter's own C
/// frames between two Python frames are dropped: they say how CPython called a function, not
/// what the program did; so are perf-trampoline frames, which repeat the Python frames.
pub fn merge<A: Clone>(
    native: Vec<(Frame, A)>,
    python: &[u64],
    symbols: &PythonSymbols,
    options: MergeOptions,
    python_address: A,
) -> Vec<(Frame, A)> {
    // The kernel's GIL entry, outermost, is not a frame.
    let (python, gil) = match python.split_last() {
        Some((&PythonFrame::GIL_HELD, rest)) => (rest, Some(true)),
        Some((&PythonFrame::GIL_NOT_HELD, rest)) => (rest, Some(false)),
        _ => (python, None),
    };
    let mut out = merge_frames(native, python, symbols, options.keep_glue, &python_address);
    if let (true, Some(held)) = (options.show_gil, gil) {
        out.insert(0, (gil_frame(held), python_address));
    }
    out
}

/// [`merge`] without the GIL entry.
fn merge_frames<A: Clone>(
    native: Vec<(Frame, A)>,
    python: &[u64],
    symbols: &PythonSymbols,
    keep_glue: bool,
    python_address: &A,
) -> Vec<(Frame, A)> {
    if python.is_empty() {
        return native;
    }
    // Groups of frames one eval call ran, root first, each root first.
    let mut groups: Vec<Vec<Frame>> = Vec::new();
    let mut current: Vec<Frame> = Vec::new();
    for packed in python.iter().rev() {
        let f = PythonFrame::unpack(*packed);
        if f.eval_entry && !current.is_empty() {
            groups.push(std::mem::take(&mut current));
        }
        current.push(python_frame(symbols.get(&symbol_key(*packed))));
    }
    if !current.is_empty() {
        groups.push(current);
    }
    let evals = native
        .iter()
        .filter(|(f, _)| f.kind == FrameKind::User && *f.name == *EVAL_FUNCTION)
        .count();
    // The innermost `evals` groups replace the eval frames; the rest go at the root.
    let leftover = groups.len().saturating_sub(evals);
    let mut groups = groups.into_iter();
    let mut out: Vec<(Frame, A)> = Vec::with_capacity(native.len() + python.len());
    for group in groups.by_ref().take(leftover) {
        out.extend(group.into_iter().map(|f| (f, python_address.clone())));
    }
    // Eval frames beyond the Python groups (more C calls than the kernel saw Python calls for)
    // stay as they are, at the root side.
    let mut unmatched_evals = evals.saturating_sub(evals.min(groups.len()));
    for (frame, address) in native {
        if frame.kind == FrameKind::User && *frame.name == *EVAL_FUNCTION {
            if unmatched_evals > 0 {
                unmatched_evals -= 1;
            } else if let Some(group) = groups.next() {
                out.extend(group.into_iter().map(|f| (f, python_address.clone())));
                continue;
            }
        }
        out.push((frame, address));
    }
    if keep_glue {
        return out;
    }
    // Drop interpreter frames that have a Python frame on both sides.
    let is_python = |f: &Frame| f.kind == PYTHON_FRAME;
    let Some(first) = out.iter().position(|(f, _)| is_python(f)) else {
        return out;
    };
    let last = out.iter().rposition(|(f, _)| is_python(f)).unwrap_or(first);
    out.into_iter()
        .enumerate()
        .filter(|(i, (f, _))| {
            !(is_perf_trampoline(f) || (*i > first && *i < last && is_interpreter(f)))
        })
        .map(|(_, x)| x)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(name: &str, module: &str) -> (Frame, u32) {
        (Frame::named(name, Some(module.into()), FrameKind::User), 1)
    }

    fn function(name: &str, line: u32) -> PythonFunction {
        PythonFunction {
            name: name.into(),
            file: "/app/work.py".into(),
            line,
            first_line: line - 1,
        }
    }

    const PY: &str = "/usr/lib/libpython3.12.so.1.0";

    /// Three Python frames in two eval calls (3.12 style: `<module>` calls `outer` through C,
    /// `outer` calls `leaf` inline), with the C callee `time_sleep` under `leaf`.
    #[test]
    fn python_groups_replace_eval_frames_from_the_leaf_and_glue_goes() {
        let mut symbols = PythonSymbols::new();
        let frames = [
            (0x1000u64, 10u32, false, "leaf", 5u32),
            (0x2000, 20, true, "outer", 9),
            (0x3000, 30, true, "<module>", 12),
        ];
        let python: Vec<u64> = frames
            .iter()
            .map(|(code, instr, entry, name, line)| {
                symbols.insert(
                    PythonFrame::pack(*code, *instr, 5, false),
                    function(name, *line),
                );
                PythonFrame::pack(*code, *instr, 5, *entry)
            })
            .collect();
        let stack = vec![
            native("main", "/usr/bin/python3.12"),
            native("Py_RunMain", PY),
            native(EVAL_FUNCTION, PY),
            native("_PyFunction_Vectorcall", PY),
            native("PyObject_Call", PY),
            native(EVAL_FUNCTION, PY),
            native("time_sleep", PY),
        ];
        let names = |v: &[(Frame, u32)]| {
            v.iter()
                .map(|(f, _)| f.name.to_string())
                .collect::<Vec<_>>()
        };
        let merged = merge(stack.clone(), &python, &symbols, MergeOptions::default(), 0);
        assert_eq!(
            names(&merged),
            [
                "main",
                "Py_RunMain",
                "<module>",
                "outer",
                "leaf",
                "time_sleep"
            ]
        );
        assert_eq!(merged[4].0.kind, PYTHON_FRAME);
        assert_eq!(merged[4].0.line, Some(5));
        assert_eq!(merged[4].1, 0, "Python frames get the Python address");
        let glue = MergeOptions {
            keep_glue: true,
            show_gil: false,
            view: PythonView::Off,
        };
        let kept = merge(stack, &python, &symbols, glue, 0);
        assert_eq!(
            names(&kept),
            [
                "main",
                "Py_RunMain",
                "<module>",
                "_PyFunction_Vectorcall",
                "PyObject_Call",
                "outer",
                "leaf",
                "time_sleep"
            ]
        );
    }

    /// Under `-X perf` each eval call sits under its perf trampoline (`py::NAME:FILE`, named
    /// from the perf map): the walked Python frames make them repeats, dropped unless glue is kept.
    #[test]
    fn python_frames_keep_the_leaf_most_and_the_gil_entry() {
        let gil = PythonFrame::GIL_HELD;
        assert_eq!(
            limit_python(&[1, 2, 3, gil], 3),
            (vec![1, 2, 3, gil], false)
        );
        assert_eq!(limit_python(&[1, 2, 3, gil], 2), (vec![1, 2, gil], true));
        assert_eq!(limit_python(&[1, 2, 3], 1), (vec![1], true));
        assert_eq!(limit_python(&[], 1), (vec![], false));
    }

    #[test]
    fn perf_trampolines_go_where_the_kernel_walked_the_frames() {
        let mut symbols = PythonSymbols::new();
        symbols.insert(PythonFrame::pack(0x10, 1, 5, false), function("leaf", 3));
        symbols.insert(
            PythonFrame::pack(0x20, 1, 5, false),
            function("<module>", 9),
        );
        let python = vec![
            PythonFrame::pack(0x10, 1, 5, true),
            PythonFrame::pack(0x20, 1, 5, true),
        ];
        let trampoline = |name: &str| native(name, crate::symbolize::JIT_MODULE);
        let stack = vec![
            native("Py_RunMain", PY),
            native(PERF_TRAMPOLINE_EVALUATOR, "/usr/bin/python3.12"),
            trampoline("py::<module>:/app/work.py"),
            native(EVAL_FUNCTION, PY),
            native(PERF_TRAMPOLINE_EVALUATOR, "/usr/bin/python3.12"),
            trampoline("py::leaf:/app/work.py"),
            native(EVAL_FUNCTION, PY),
            native("burn", "/x/ext.so"),
        ];
        let names = |v: &[(Frame, u32)]| {
            v.iter()
                .map(|(f, _)| f.name.to_string())
                .collect::<Vec<_>>()
        };
        let merged = merge(stack.clone(), &python, &symbols, MergeOptions::default(), 0);
        assert_eq!(names(&merged), ["Py_RunMain", "<module>", "leaf", "burn"]);
        // Glue kept: every frame, trampolines too.
        let glue = MergeOptions {
            keep_glue: true,
            show_gil: false,
            view: PythonView::Off,
        };
        let kept = merge(stack, &python, &symbols, glue, 0);
        assert_eq!(kept.len(), 8);
        // A `py::` frame that is no perf-map frame (a C function so named) stays.
        let own = merge(
            vec![native("py::mine", "/x/ext.so")],
            &python,
            &symbols,
            MergeOptions::default(),
            0,
        );
        assert!(names(&own).contains(&"py::mine".to_string()));
    }

    #[test]
    fn python_frames_without_eval_frames_go_at_the_root() {
        let mut symbols = PythonSymbols::new();
        symbols.insert(PythonFrame::pack(0x10, 1, 5, false), function("f", 3));
        let python = vec![PythonFrame::pack(0x10, 1, 5, true)];
        let merged = merge(
            vec![native("burn", "/x/ext.so")],
            &python,
            &symbols,
            MergeOptions::default(),
            0,
        );
        let names: Vec<&str> = merged.iter().map(|(f, _)| &*f.name).collect();
        assert_eq!(names, ["f", "burn"]);
        // An unnamed frame is still a frame.
        let merged = merge(
            Vec::new(),
            &[PythonFrame::pack(0x20, 0, 5, true)],
            &symbols,
            MergeOptions::default(),
            0,
        );
        assert_eq!(&*merged[0].0.name, "[unknown Python code]");
    }

    /// Below the innermost Python function the interpreter's frames, the C runtime they call
    /// and the kernel work they do fold into it; an extension's frames stay with what is
    /// below them; native callers at the root stay.
    #[test]
    fn the_python_view_folds_the_interpreter_below_the_innermost_python_function() {
        let py = |name: &str| Frame::named(name, Some("/app/work.py".into()), PYTHON_FRAME);
        let c = |name: &str, module: &str| Frame::named(name, Some(module.into()), FrameKind::User);
        let kernel = Frame::named("asm_exc_page_fault", None, FrameKind::Kernel);
        let keep = |frames: &[Frame]| {
            let refs: Vec<Option<&Frame>> = frames.iter().map(Some).collect();
            frames
                .iter()
                .zip(python_view_keep(&refs))
                .filter(|(_, k)| *k)
                .map(|(f, _)| f.name.to_string())
                .collect::<Vec<_>>()
        };
        let alloc = [
            c("main", "/usr/bin/python3.12"),
            c("Py_RunMain", PY),
            py("<module>"),
            c("_PyFunction_Vectorcall", PY),
            py("alloc_hot"),
            c("PyList_Append", PY),
            c("pymalloc_alloc", PY),
            c("__tls_get_addr", "/lib64/ld-linux-x86-64.so.2"),
            c("malloc", "/lib/x86_64-linux-gnu/libc.so.6"),
            kernel.clone(),
        ];
        assert_eq!(
            keep(&alloc),
            ["main", "Py_RunMain", "<module>", "alloc_hot"]
        );
        let zlib = [
            py("<module>"),
            py("compress_leaf"),
            c("cfunction_vectorcall_O", PY),
            c(
                "zlib_compress",
                "/lib/python3.12/lib-dynload/zlib.cpython-312.so",
            ),
            c("deflate", "/lib/x86_64-linux-gnu/libz.so.1"),
            c("memcpy", "/lib/x86_64-linux-gnu/libc.so.6"),
            kernel,
        ];
        assert_eq!(
            keep(&zlib),
            [
                "<module>",
                "compress_leaf",
                "zlib_compress",
                "deflate",
                "memcpy",
                "asm_exc_page_fault"
            ]
        );
        // No Python frame: a native thread of the interpreter stays whole.
        let native = [c("start_thread", "/lib/libc.so.6"), c("pymalloc_alloc", PY)];
        assert_eq!(keep(&native), ["start_thread", "pymalloc_alloc"]);
        // The GIL's root frame is no Python function.
        let gil = [gil_frame(true), c("pymalloc_alloc", PY)];
        assert_eq!(keep(&gil), ["[GIL held]", "pymalloc_alloc"]);
    }

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
    fn the_gil_entry_is_a_root_frame_only_when_asked_for() {
        let symbols = PythonSymbols::new();
        let python = vec![PythonFrame::pack(0x10, 1, 5, true), PythonFrame::GIL_HELD];
        let names = |show_gil| {
            let options = MergeOptions {
                keep_glue: false,
                show_gil,
                view: PythonView::Off,
            };
            merge(vec![native("main", "/x/a")], &python, &symbols, options, 0)
                .into_iter()
                .map(|(f, _)| f.name.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(false), ["[unknown Python code]", "main"]);
        assert_eq!(names(true), ["[GIL held]", "[unknown Python code]", "main"]);
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
