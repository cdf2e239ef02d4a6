//! CPython processes: what userspace needs so that the kernel program can walk their Python
//! frames, and what turns those frames into functions.
//!
//! [`PythonTarget::detect`] finds a process's interpreter (`_PyRuntime` in a libpython or a
//! static python binary, [`detect`]) and its version's [`layout::Layout`];
//! [`PythonTarget::kernel_layout`] is what the kernel program walks with;
//! [`PythonTarget::threads`] lists every Python thread (host tid, `PyThreadState` address) for
//! the kernel's thread map; [`PythonTarget::walk_thread`] walks a thread's frames from userspace
//! by the kernel program's own rules (the reference the kernel's output is checked against);
//! [`PythonTarget::resolve`] names a recorded frame (reading its code object once, [`code`]) with
//! its line ([`linetable`]); [`PythonTarget::threading_names`] reads the threads' `threading`
//! names ([`names`]).

pub mod code;
pub mod detect;
pub mod layout;
pub mod linetable;
pub mod memory;
pub mod names;
pub mod stacks;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
};

use anyhow::{anyhow, Context};
use profiler_common::{
    PythonEntryRule, PythonInstrRule, PythonProcess, MAX_STACK_DEPTH, PYTHON_FRAME_OWNED_BY_CSTACK,
    PYTHON_STACKREF_TAG_BITS,
};

use self::{
    code::{CodeInfo, CodeReader},
    layout::Layout,
    memory::ProcessMemory,
};
use crate::Result;

/// A Python frame as the kernel program records it (re-exported for callers of this module).
pub use profiler_common::PythonFrame;
/// The owner byte of 3.12+'s shim frames, which begin each eval call and are not recorded.
pub use profiler_common::PYTHON_FRAME_OWNED_BY_CSTACK as FRAME_OWNED_BY_CSTACK;

/// Most Python frames one walk records (the kernel program's bound).
pub const MAX_PYTHON_DEPTH: usize = MAX_STACK_DEPTH;
/// Most frames one walk visits, shim frames included, so a cycle cannot loop forever.
pub const MAX_FRAMES_VISITED: usize = 2 * MAX_PYTHON_DEPTH;
/// Most interpreters listed (the list is linked in the target's memory, which may change while
/// it is read, so a walk of it must end even on a cycle).
pub const MAX_INTERPRETERS: usize = 256;
/// Most thread states listed over all interpreters: each costs a few reads of the target's
/// memory on every refresh, under the lock that serves every user. A fake interpreter whose
/// interpreters each had a thread list looping on itself made the daemon walk 4 million
/// states per refresh (98 s of CPU, 3 GB on 3.10); real programs run tens of threads.
pub const MAX_THREAD_STATES: usize = 4096;
/// Bytes of glibc's `struct pthread` searched for the thread id.
const PTHREAD_SEARCH_BYTES: usize = 1024;
/// `offsetof(struct pthread, tid)` in glibc 2.26 and later on x86-64 (Debian 12's 2.36 too);
/// preferred when the search finds several offsets that fit.
const GLIBC_PTHREAD_TID: usize = 0x2d0;

/// CPython as a [`crate::runtime::Runtime`]: recognised by its `_PyRuntime` ([`detect`]),
/// followed by [`stacks::PythonTracking`], its frames merged at each
/// `_PyEval_EvalFrameDefault` ([`stacks::merge`]).
pub struct CPython;

impl crate::runtime::Runtime for CPython {
    fn tag(&self) -> profiler_common::RuntimeTag {
        profiler_common::RuntimeTag::CPython
    }

    fn attach(
        &self,
        program: &mut crate::kernel::KernelProgram,
        pid: u32,
        naming: &crate::runtime::Naming,
        refused: &mut Option<String>,
    ) -> Option<Box<dyn crate::runtime::Instance>> {
        let tracking =
            stacks::PythonTracking::start(program, pid, naming.shares, naming.owner, refused)?;
        Some(Box::new(tracking))
    }

    fn cut(&self, stack: &[u64], limit: usize) -> (Vec<u64>, bool) {
        stacks::limit_python(stack, limit)
    }

    fn view_keep(&self, frames: &[Option<&crate::symbolize::Frame>]) -> Vec<bool> {
        stacks::python_view_keep(frames)
    }
}

/// One CPython process bpfprof reads Python frames of.
pub struct PythonTarget {
    pid: u32,
    interpreter: detect::Interpreter,
    layout: Layout,
    memory: ProcessMemory,
    /// Code objects read so far, by address.
    codes: HashMap<u64, CodeInfo>,
    /// Reads code objects, with what they share cached.
    code_reader: CodeReader,
    /// 3.10: where glibc's `struct pthread` keeps the thread's tid, once found.
    pthread_tid_offset: Option<u64>,
    /// What the bounds on its walks left out so far.
    limits: WalkLimits,
    /// Bytes naming frames cost so far: read from the process, and kept in `codes`.
    naming_bytes: u64,
    /// Bytes kept in `codes`.
    kept_bytes: u64,
}

/// How often the bounds on walking a target's memory were hit, for the run's summary: a
/// target whose memory holds loops or more than any real interpreter is read in part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkLimits {
    /// Thread listings that met a thread state or interpreter twice (a cycle).
    pub cycles: u64,
    /// Thread listings cut at [`MAX_THREAD_STATES`] or [`MAX_INTERPRETERS`].
    pub threads_cut: u64,
    /// Frame walks that met a frame twice (a cycle) or went past the frames a walk visits.
    pub frames_cut: u64,
}

/// A Python function as a frame names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonFunction {
    /// The qualified name (`Worker.run`) on 3.11 and later, the plain name on 3.10.
    pub name: String,
    /// The code's file name (`co_filename`), as the process sees it.
    pub file: String,
    /// The line of the frame's current instruction.
    pub line: u32,
    /// The line the function starts on (`co_firstlineno`).
    pub first_line: u32,
}

/// One read of a CPython process's threads.
#[derive(Debug, Default)]
pub struct ThreadListing {
    /// The threads that run Python: host tid and thread state address.
    pub python: Vec<(u32, u64)>,
    /// Every task of the process: tid in its pid namespace -> host tid.
    pub tasks: HashMap<u32, u32>,
}

/// One thread state as its interpreter's list gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadState {
    /// Its address in the target.
    pub address: u64,
    /// Its `thread_id` (the thread's `pthread_t`).
    pub thread_id: u64,
    /// Its `native_thread_id` (the tid in the process's pid namespace), where the layout has
    /// one (3.11 and later).
    pub native_id: Option<u32>,
}

/// The thread states of every interpreter of a CPython process, as read from its memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadStates {
    /// Each state once, in list order (interpreters newest first).
    pub states: Vec<ThreadState>,
    /// Whether a list met an interpreter or a thread state twice (a cycle), and ended there.
    pub cycle: bool,
    /// Whether the listing stopped at [`MAX_INTERPRETERS`] or [`MAX_THREAD_STATES`].
    pub cut: bool,
}

/// Lists the thread states of every interpreter from `_PyRuntime` at `runtime` in `memory`,
/// with `layout`'s offsets: what the target's memory says, which its user controls, so the
/// listing ends on any cycle (each interpreter and thread state is read once, whichever list
/// leads to it) and at [`MAX_INTERPRETERS`] and [`MAX_THREAD_STATES`]; a pointer that cannot be
/// read is an error.
pub fn list_thread_states(
    memory: &ProcessMemory,
    layout: &Layout,
    runtime: u64,
) -> Result<ThreadStates> {
    let l = layout;
    let mut out = ThreadStates::default();
    let mut interp = memory
        .read_u64(runtime.wrapping_add(l.runtime_interpreters_head as u64))
        .context("read _PyRuntime.interpreters.head")?;
    let mut seen = HashSet::new();
    let mut listed = HashSet::new();
    while interp != 0 {
        if !seen.insert(interp) {
            out.cycle = true;
            break;
        }
        if seen.len() > MAX_INTERPRETERS {
            out.cut = true;
            break;
        }
        let mut tstate = memory.read_u64(interp.wrapping_add(l.interp_threads_head as u64))?;
        while tstate != 0 {
            if !listed.insert(tstate) {
                out.cycle = true;
                break;
            }
            if listed.len() > MAX_THREAD_STATES {
                out.cut = true;
                break;
            }
            let thread_id = memory.read_u64(tstate.wrapping_add(l.tstate_thread_id as u64))?;
            let native_id = match l.tstate_native_thread_id {
                Some(off) => Some(memory.read_u64(tstate.wrapping_add(off as u64))? as u32),
                None => None,
            };
            out.states.push(ThreadState {
                address: tstate,
                thread_id,
                native_id,
            });
            tstate = memory.read_u64(tstate.wrapping_add(l.tstate_next as u64))?;
        }
        if out.cut {
            break;
        }
        interp = memory.read_u64(interp.wrapping_add(l.interp_next as u64))?;
    }
    Ok(out)
}

/// What [`PythonTarget::probe`] found in a process.
pub enum Probe {
    /// A CPython whose frames bpfprof walks.
    Walkable(Box<PythonTarget>),
    /// A CPython whose frames bpfprof cannot walk, and why.
    Unsupported(Unsupported),
    /// No CPython (why, for debugging).
    NotPython(String),
}

/// A CPython bpfprof recognised but cannot walk: said in the run's summary, by `dump` and by
/// `top` (its Display), never left to an empty profile to tell.
#[derive(Clone, Debug)]
pub struct Unsupported {
    /// The process (in bpfprof's pid namespace).
    pub pid: u32,
    /// The interpreter found.
    pub interpreter: detect::Interpreter,
    /// Why its frames cannot be walked.
    pub reason: String,
}

impl Unsupported {
    /// `3.16.0` from `Py_Version`, or `3.16` from the object's name.
    pub fn version(&self) -> String {
        let (major, minor) = self.interpreter.version;
        match self.interpreter.version_hex {
            Some(hex) => format!("{major}.{minor}.{}", (hex >> 8) & 0xff),
            None => format!("{major}.{minor}"),
        }
    }
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self
            .interpreter
            .path
            .file_name()
            .map_or_else(|| "python".into(), |n| n.to_string_lossy());
        write!(
            f,
            "{name} (CPython {}, pid {}): Python frames not supported by this bpfprof: {}; \
             native frames only",
            self.version(),
            self.pid,
            self.reason
        )
    }
}

impl PythonTarget {
    /// None when the process runs no CPython bpfprof can walk (the reason logged: at debug
    /// level when it runs none, at warning level when it runs one bpfprof cannot walk).
    pub fn detect(pid: u32) -> Result<Option<PythonTarget>> {
        Ok(match PythonTarget::probe(pid)? {
            Probe::Walkable(target) => Some(*target),
            Probe::NotPython(reason) => {
                log::debug!("pid {pid}: no Python frames: {reason}");
                None
            }
            Probe::Unsupported(unsupported) => {
                log::warn!("{unsupported}");
                None
            }
        })
    }

    /// Looks for a CPython in process `pid` and, where one is, for the layout its frames are
    /// walked with: from 3.13 on its own `_Py_DebugOffsets`, checked, before 3.13 bpfprof's
    /// table of its version.
    pub fn probe(pid: u32) -> Result<Probe> {
        let memory = ProcessMemory::new(pid);
        let interpreter = match detect::find(pid, &memory)? {
            Ok(found) => found,
            Err(reason) => return Ok(Probe::NotPython(reason)),
        };
        let unsupported = |reason: String| {
            Ok(Probe::Unsupported(Unsupported {
                pid,
                interpreter: interpreter.clone(),
                reason,
            }))
        };
        let (major, minor) = interpreter.version;
        let layout = match layout::table(minor) {
            Some(layout) if major == 3 && minor < 13 => layout,
            _ if major != 3 || minor < 10 => {
                return unsupported("versions before 3.10 are not supported".into())
            }
            _ => {
                let raw = match memory.read_vec(interpreter.runtime, layout::DEBUG_OFFSETS_SIZE) {
                    Ok(raw) => raw,
                    Err(e) => return unsupported(format!("cannot read its _PyRuntime: {e:#}")),
                };
                match Layout::from_debug_offsets(&raw, interpreter.version) {
                    Ok(layout) => layout,
                    Err(e) => return unsupported(format!("{e:#}")),
                }
            }
        };
        log::debug!(
            "pid {pid}: CPython {}.{} in {}, _PyRuntime at {:#x}",
            interpreter.version.0,
            interpreter.version.1,
            interpreter.path.display(),
            interpreter.runtime
        );
        Ok(Probe::Walkable(Box::new(PythonTarget {
            pid,
            interpreter,
            layout,
            memory,
            codes: HashMap::new(),
            code_reader: CodeReader::default(),
            pthread_tid_offset: None,
            limits: WalkLimits::default(),
            naming_bytes: 0,
            kept_bytes: 0,
        })))
    }

    /// The code object a frame's `f_executable` (`f_code`) word points to: 3.14 and later
    /// keep a `_PyStackRef` there, a pointer with tag bits, cleared here as the kernel clears
    /// them (earlier versions' plain pointers have them clear: objects are 8-aligned).
    fn frame_code(&self, frame: u64) -> Result<u64> {
        let word = self
            .memory
            .read_u64(frame.wrapping_add(self.layout.kernel.frame_code as u64))?;
        Ok(word & !PYTHON_STACKREF_TAG_BITS)
    }

    /// The process (in bpfprof's pid namespace).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How many code objects were read from the process so far.
    pub fn code_objects(&self) -> usize {
        self.codes.len()
    }

    /// Bytes naming frames cost so far: read from the process's memory for code objects,
    /// and kept for them (names, files, line ranges).
    pub fn naming_bytes(&self) -> u64 {
        self.naming_bytes
    }

    /// Bytes the code objects read so far keep (names, files, line ranges).
    pub fn kept_bytes(&self) -> u64 {
        self.kept_bytes
    }

    /// What the bounds on walking its memory left out so far.
    pub fn walk_limits(&self) -> WalkLimits {
        self.limits
    }

    /// `(major, minor)` of the interpreter.
    pub fn version(&self) -> (u8, u8) {
        self.interpreter.version
    }

    /// The object that defines `_PyRuntime`, as the process sees its path.
    pub fn interpreter_path(&self) -> &PathBuf {
        &self.interpreter.path
    }

    /// Address of `_PyRuntime` in the process.
    pub fn runtime_address(&self) -> u64 {
        self.interpreter.runtime
    }

    /// All the offsets in use, userspace's included.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The offsets the kernel program walks this process's frames with.
    pub fn kernel_layout(&self) -> PythonProcess {
        self.layout.kernel
    }

    /// [`Self::kernel_layout`] with the addresses of the main interpreter's GIL state, once
    /// the interpreter has made its GIL (3.12+ allocate it at start-up: a process caught
    /// before that has none yet, so call this again later).
    pub fn kernel_layout_with_gil(&mut self) -> PythonProcess {
        let mut k = self.layout.kernel;
        if let Ok((locked, last_holder)) = self.gil_addresses() {
            k.gil_locked = locked;
            k.gil_holder = last_holder;
        }
        k
    }

    /// Host tid -> PyThreadState address for every thread of every interpreter.
    ///
    /// One entry per thread: of a thread's states in several interpreters, the first with a
    /// frame, newest interpreter first (where a thread that entered a subinterpreter runs).
    pub fn threads(&mut self) -> Result<Vec<(u32, u64)>> {
        Ok(self.thread_listing()?.python)
    }

    /// [`PythonTarget::threads`], and every task of the process read for it: tid in its own
    /// pid namespace -> host tid (the threads that run Python and those that do not).
    pub fn thread_listing(&mut self) -> Result<ThreadListing> {
        let listed = list_thread_states(&self.memory, &self.layout, self.interpreter.runtime)?;
        self.limits.cycles += u64::from(listed.cycle);
        self.limits.threads_cut += u64::from(listed.cut);
        let states: Vec<(u64, u64, Option<u32>)> = listed
            .states
            .iter()
            .map(|t| (t.address, t.thread_id, t.native_id))
            .collect();
        let to_host = self.namespace_tids()?;
        let ns_tids: Vec<u32> = if states.iter().all(|s| s.2.is_some()) {
            states.iter().map(|s| s.2.unwrap_or(0)).collect()
        } else {
            self.tids_from_pthreads(&states, &to_host)?
        };
        // A thread that entered other interpreters (subinterpreters) has a thread state in
        // each; the kernel's map holds one per thread: the first one with a frame, in list
        // order (newest interpreter first, where a thread that switched interpreters runs now).
        let mut out: Vec<(u32, u64)> = Vec::new();
        let mut chosen: HashMap<u32, (usize, bool)> = HashMap::new();
        for (&(tstate, _, _), ns_tid) in states.iter().zip(ns_tids) {
            // A thread state whose thread has exited (or not yet started) has no task.
            let Some(&host) = to_host.get(&ns_tid) else {
                continue;
            };
            let has_frame = self.current_frame(tstate).is_ok_and(|f| f != 0);
            match chosen.get(&host) {
                None => {
                    chosen.insert(host, (out.len(), has_frame));
                    out.push((host, tstate));
                }
                Some(&(at, false)) if has_frame => {
                    out[at] = (host, tstate);
                    chosen.insert(host, (at, true));
                }
                Some(_) => {}
            }
        }
        Ok(ThreadListing {
            python: out,
            tasks: to_host,
        })
    }

    /// The innermost frame of the thread state at `tstate` (0 when it runs no Python), read as
    /// the kernel reads it.
    fn current_frame(&self, tstate: u64) -> Result<u64> {
        let k = self.layout.kernel;
        let mut frame = self
            .memory
            .read_u64(tstate.wrapping_add(k.tstate_frame as u64))
            .with_context(|| format!("pid {}: read thread state {tstate:#x}", self.pid))?;
        if self.layout.has_cframe() && frame != 0 {
            frame = self
                .memory
                .read_u64(frame.wrapping_add(k.cframe_current_frame as u64))
                .with_context(|| format!("pid {}: read _PyCFrame {frame:#x}", self.pid))?;
        }
        Ok(frame)
    }

    /// The process's threads: tid in its own pid namespace -> tid in bpfprof's (the kernel's
    /// thread map is keyed by the host's tid), from each task's `NSpid` line, which lists the
    /// ids from the reader's namespace inwards.
    fn namespace_tids(&self) -> Result<HashMap<u32, u32>> {
        let dir = format!("/proc/{}/task", self.pid);
        let mut map = HashMap::new();
        for entry in std::fs::read_dir(&dir).with_context(|| format!("read {dir}"))? {
            let entry = entry.with_context(|| format!("read {dir}"))?;
            let Some(host) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            // A thread may exit between the listing and this read.
            let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
                continue;
            };
            let inner = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|ids| ids.split_whitespace().last()?.parse::<u32>().ok())
                .unwrap_or(host);
            map.insert(inner, host);
        }
        Ok(map)
    }

    /// 3.10: each thread's tid (in its namespace) from its `pthread_t`, which glibc makes the
    /// address of the thread's `struct pthread`. The offset of `tid` in that struct differs
    /// between glibc versions and libc's debug info is rarely installed, so it is found from the
    /// data: a 4-byte-aligned offset at which every thread's struct holds either a distinct id
    /// of one of the process's tasks or 0 (the kernel clears it when a thread exits), at least
    /// one being the process's own id (its main thread runs Python in all but embedded
    /// interpreters, for which that condition is dropped). Among several, glibc 2.26+'s offset
    /// on x86-64 wins, then the smallest. Found once per process.
    fn tids_from_pthreads(
        &mut self,
        states: &[(u64, u64, Option<u32>)],
        to_host: &HashMap<u32, u32>,
    ) -> Result<Vec<u32>> {
        let blocks: Vec<Option<Vec<u8>>> = states
            .iter()
            .map(|&(_, pthread, _)| self.memory.read_vec(pthread, PTHREAD_SEARCH_BYTES).ok())
            .collect();
        // One struct per thread, however many interpreters the thread has a state in.
        let mut unique_threads = HashSet::new();
        let unique: Vec<&Vec<u8>> = states
            .iter()
            .zip(&blocks)
            .filter(|((_, pthread, _), _)| unique_threads.insert(*pthread))
            .filter_map(|(_, block)| block.as_ref())
            .collect();
        let at = |block: &[u8], off: usize| -> u32 {
            u32::from_ne_bytes(block[off..off + 4].try_into().expect("4 bytes"))
        };
        if self.pthread_tid_offset.is_none() {
            let ns_pid = to_host
                .iter()
                .find(|&(_, &host)| host == self.pid)
                .map(|(&inner, _)| inner);
            let readable = &unique;
            let fits = |off: &usize, need_pid: bool| {
                let ids: Vec<u32> = readable.iter().map(|b| at(b, *off)).collect();
                let live: Vec<u32> = ids.iter().copied().filter(|&id| id != 0).collect();
                let distinct: HashSet<u32> = live.iter().copied().collect();
                !live.is_empty()
                    && distinct.len() == live.len()
                    && live.iter().all(|id| to_host.contains_key(id))
                    && (!need_pid || ns_pid.is_some_and(|pid| live.contains(&pid)))
            };
            let offsets = || (0..=PTHREAD_SEARCH_BYTES - 4).step_by(4);
            let mut candidates: Vec<usize> = offsets().filter(|o| fits(o, true)).collect();
            if candidates.is_empty() {
                candidates = offsets().filter(|o| fits(o, false)).collect();
            }
            let offset = candidates
                .iter()
                .copied()
                .find(|&o| o == GLIBC_PTHREAD_TID)
                .or(candidates.first().copied())
                .ok_or_else(|| {
                    anyhow!(
                        "pid {}: cannot find the tid in glibc's struct pthread of its {} Python threads",
                        self.pid,
                        readable.len()
                    )
                })?;
            log::debug!(
                "pid {}: struct pthread keeps the tid at {offset} (candidates {candidates:?})",
                self.pid
            );
            self.pthread_tid_offset = Some(offset as u64);
        }
        let offset = self.pthread_tid_offset.unwrap_or(0) as usize;
        Ok(blocks
            .iter()
            .map(|b| b.as_ref().map_or(0, |b| at(b, offset)))
            .collect())
    }

    /// Addresses of the main interpreter's GIL fields in the process: its `locked` flag (a C
    /// `int`, non-zero while held) and `last_holder` (the `PyThreadState` that took it last),
    /// for telling the GIL holder from waiters.
    pub fn gil_addresses(&mut self) -> Result<(u64, u64)> {
        let runtime = self.interpreter.runtime;
        match self.layout.gil {
            layout::GilLayout::InRuntime {
                locked,
                last_holder,
            } => Ok((runtime + locked as u64, runtime + last_holder as u64)),
            layout::GilLayout::PerInterpreter {
                interp_gil,
                locked,
                last_holder,
            } => {
                let main = self
                    .memory
                    .read_u64(runtime.wrapping_add(self.layout.runtime_interpreters_head as u64))
                    .context("read _PyRuntime.interpreters.head")?;
                // The main interpreter is the list's last (interpreters are pushed at its head).
                let mut interp = main;
                let mut seen = HashSet::new();
                while interp != 0 && seen.insert(interp) && seen.len() <= MAX_INTERPRETERS {
                    let next = self
                        .memory
                        .read_u64(interp.wrapping_add(self.layout.interp_next as u64))?;
                    if next == 0 {
                        break;
                    }
                    interp = next;
                }
                let gil = self
                    .memory
                    .read_u64(interp.wrapping_add(interp_gil as u64))?;
                if gil == 0 {
                    return Err(
                        anyhow!("pid {}: the main interpreter has no GIL yet", self.pid).into(),
                    );
                }
                Ok((gil + locked as u64, gil + last_holder as u64))
            }
        }
    }

    /// The `PyThreadState` holding the main interpreter's GIL now, None while it is free.
    pub fn gil_holder(&mut self) -> Result<Option<u64>> {
        let (locked, holder) = self.gil_addresses()?;
        if self.memory.read_i32(locked)? == 0 {
            return Ok(None);
        }
        Ok(Some(self.memory.read_u64(holder)?).filter(|&t| t != 0))
    }

    /// The Python frames of the thread whose `PyThreadState` is at `tstate`, innermost first,
    /// walked by the kernel program's rules: the same offsets, packing and eval-entry flags
    /// (3.10 every frame; 3.11 a frame with `is_entry`; 3.12+ the frame just before a shim
    /// frame, which is not recorded); it ends at [`MAX_PYTHON_DEPTH`] frames or at a null or
    /// unreadable pointer.
    pub fn walk_thread(&mut self, tstate: u64) -> Result<Vec<PythonFrame>> {
        let k = self.layout.kernel;
        let mut frame = self.current_frame(tstate)?;
        let mut packed: Vec<u64> = Vec::new();
        let mut visited = HashSet::new();
        while frame != 0 && packed.len() < MAX_PYTHON_DEPTH {
            if !visited.insert(frame) || visited.len() > MAX_FRAMES_VISITED {
                self.limits.frames_cut += 1;
                break;
            }
            match self.read_frame(frame, &k) {
                Ok(Some(entry)) => packed.push(entry),
                Ok(None) => {
                    // A shim frame: the frame recorded just before it began the eval call.
                    if let Some(last) = packed.last_mut() {
                        *last = PythonFrame::with_eval_entry(*last);
                    }
                }
                Err(_) => break,
            }
            frame = match self
                .memory
                .read_u64(frame.wrapping_add(k.frame_previous as u64))
            {
                Ok(previous) => previous,
                Err(_) => break,
            };
        }
        Ok(packed.into_iter().map(PythonFrame::unpack).collect())
    }

    /// One frame packed as the kernel packs it, or None for a shim frame.
    fn read_frame(&mut self, frame: u64, k: &PythonProcess) -> Result<Option<u64>> {
        let entry = match k.entry_rule {
            r if r == PythonEntryRule::EveryFrame as u32 => true,
            r if r == PythonEntryRule::EntryFlag as u32 => {
                self.memory
                    .read_u8(frame.wrapping_add(k.frame_entry as u64))?
                    != 0
            }
            _ => {
                if self
                    .memory
                    .read_u8(frame.wrapping_add(k.frame_entry as u64))?
                    == PYTHON_FRAME_OWNED_BY_CSTACK
                {
                    return Ok(None);
                }
                false
            }
        };
        let code = self.frame_code(frame)?;
        let instruction = if k.instr_rule == PythonInstrRule::LastiIndex as u32 {
            // -1 before the first instruction runs: index 0.
            self.memory
                .read_i32(frame.wrapping_add(k.frame_instr as u64))?
                .max(0) as u32
        } else {
            let pointer = self
                .memory
                .read_u64(frame.wrapping_add(k.frame_instr as u64))?;
            let first = code.wrapping_add(k.code_instructions as u64);
            // 3.11's `prev_instr` starts one code unit before the first instruction: index 0.
            let units = pointer.saturating_sub(first) / 2;
            u32::try_from(units).unwrap_or(u32::MAX)
        };
        // As the kernel does: unknown where a read fails.
        let identity = self
            .memory
            .read_u64(code.wrapping_add(k.code_identity as u64))
            .map_or(PythonFrame::UNKNOWN_IDENTITY, |word| {
                code::identity_bits(&self.memory, k, word)
            });
        Ok(Some(PythonFrame::pack(code, instruction, identity, entry)))
    }

    /// Python's `threading` names of the threads `threads` lists (host tid, thread state),
    /// by host tid; empty when the program never imported `threading` or no thread runs
    /// its code (see [`names`]). Reads the process's memory without stopping it.
    pub fn threading_names(&mut self, threads: &[(u32, u64)]) -> HashMap<u32, String> {
        let Ok(listed) = list_thread_states(&self.memory, &self.layout, self.interpreter.runtime)
        else {
            return HashMap::new();
        };
        let ident: HashMap<u64, u64> = listed
            .states
            .iter()
            .map(|t| (t.address, t.thread_id))
            .collect();
        let reader_minor = self.interpreter.version.1;
        let globals_offset = names::NameReader {
            memory: &self.memory,
            layout: &self.layout,
            minor: reader_minor,
        }
        .frame_globals_offset();
        let k = self.layout.kernel;
        let mut globals = None;
        'threads: for &(_, tstate) in threads {
            let Ok(mut frame) = self.current_frame(tstate) else {
                continue;
            };
            for _ in 0..MAX_FRAMES_VISITED {
                if frame == 0 {
                    break;
                }
                if let Ok(code) = self.frame_code(frame) {
                    let in_threading = self
                        .function(code, 0, None)
                        .is_ok_and(|f| f.file.ends_with("threading.py"));
                    if in_threading {
                        globals = self.memory.read_u64(frame + globals_offset).ok();
                        break 'threads;
                    }
                }
                frame = match self
                    .memory
                    .read_u64(frame.wrapping_add(k.frame_previous as u64))
                {
                    Ok(previous) => previous,
                    Err(_) => break,
                };
            }
        }
        let Some(globals) = globals.filter(|g| *g != 0) else {
            return HashMap::new();
        };
        let reader = names::NameReader {
            memory: &self.memory,
            layout: &self.layout,
            minor: reader_minor,
        };
        let by_ident = match reader.names(globals) {
            Ok(n) => n,
            Err(e) => {
                log::debug!("pid {}: no threading names: {e:#}", self.pid);
                return HashMap::new();
            }
        };
        threads
            .iter()
            .filter_map(|(tid, tstate)| {
                let name = by_ident.get(ident.get(tstate)?)?;
                Some((*tid, name.clone()))
            })
            .collect()
    }

    /// Name, file, line of one recorded frame; cached by code address, and read again where
    /// another code object took that address since (CPython frees code objects, a module's
    /// once it is imported, and reuses their memory). Without that check, one loaded CI run
    /// named a launched 3.10 script's leaf function `<module>` in every sample, which fits a
    /// start-up module's code named at that address first. A frame whose identity bits are
    /// not those of the code object now at its address was recorded before the change: it is
    /// not named (an error), rather than named after the newcomer. 1 in 128 replacements have
    /// the same bits and still take the newcomer's name: no later read can tell them apart.
    pub fn resolve(&mut self, frame: PythonFrame) -> Result<PythonFunction> {
        self.function(frame.code, frame.instruction, Some(frame.identity))
    }

    /// [`PythonReader::resolve`] the code object at `code`, instruction `instruction`, checked
    /// against the kernel's identity bits where given.
    fn function(
        &mut self,
        code: u64,
        instruction: u32,
        identity: Option<u8>,
    ) -> Result<PythonFunction> {
        let frame = PythonFrame {
            code,
            instruction,
            identity: identity.unwrap_or(PythonFrame::UNKNOWN_IDENTITY),
            eval_entry: false,
        };
        let before = self.memory.bytes_read();
        let stale = self.codes.get(&frame.code).is_none_or(|info| {
            // Bits other than the cached object's: the frame's object may be a newer one (or
            // the cached object's name was hashed since it was read).
            identity.is_some_and(|bits| {
                bits != PythonFrame::UNKNOWN_IDENTITY && bits != info.identity_bits
            }) || code::CodeReader::identity(&self.memory, &self.layout, frame.code)
                .is_ok_and(|now| now != info.identity)
        });
        self.naming_bytes += self.memory.bytes_read().saturating_sub(before);
        if stale {
            let before = self.memory.bytes_read();
            let read = self
                .code_reader
                .read_code(&self.memory, &self.layout, frame.code);
            self.naming_bytes += self.memory.bytes_read().saturating_sub(before);
            match read {
                Ok(info) => {
                    let kept = info.kept_bytes();
                    self.naming_bytes += kept;
                    self.kept_bytes += kept;
                    if let Some(old) = self.codes.insert(frame.code, info) {
                        self.kept_bytes = self.kept_bytes.saturating_sub(old.kept_bytes());
                    }
                }
                // A failed read (the process is gone, the object half freed) keeps what was
                // read while it lived: the bits below say whether it was this frame's.
                Err(e) if !self.codes.contains_key(&frame.code) => {
                    let what = format!("pid {}: code object {:#x}", self.pid, frame.code);
                    return Err(e.context(what).into());
                }
                Err(_) => {}
            }
        }
        let info = &self.codes[&frame.code];
        if let Some(bits) =
            identity.filter(|&bits| !PythonFrame::identities_match(bits, info.identity_bits))
        {
            return Err(anyhow!(
                "pid {}: code object {:#x} was replaced since the frame was recorded \
                 (identity bits {bits:#x}, now {:#x}): its function is gone",
                self.pid,
                frame.code,
                info.identity_bits
            )
            .into());
        }
        Ok(PythonFunction {
            name: info.name.clone(),
            file: info.file.clone(),
            // A clamped instruction could be anywhere past it: the def's line, not a wrong one.
            line: if frame.instruction >= PythonFrame::MAX_INSTRUCTION {
                info.first_line
            } else {
                info.line(frame.instruction)
            },
            first_line: info.first_line,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memory image in this process: `words` 8-byte words, written by `(word, value)`, with
    /// `at(word)` the address of a word.
    struct Image(Vec<u64>);

    impl Image {
        fn at(&self, word: usize) -> u64 {
            self.0.as_ptr() as u64 + 8 * word as u64
        }

        fn set(&mut self, field_at: u64, value: u64) {
            let word = (field_at - self.at(0)) as usize / 8;
            self.0[word] = value;
        }
    }

    #[test]
    fn thread_lists_that_loop_are_read_once_per_state_and_wild_pointers_are_errors() {
        let layout = layout::table(12).expect("3.12 is tabled");
        let mut image = Image(vec![0; 4096]);
        // _PyRuntime at word 0; interpreters at words 1000 and 2000; thread states at 3000
        // and 3500. Interpreter A's list: t1 -> t2 -> t1 (a loop); its next is B, whose list
        // leads to t2 again, and whose next is A (another loop).
        let (runtime, a, b, t1, t2) = (
            image.at(0),
            image.at(1000),
            image.at(2000),
            image.at(3000),
            image.at(3500),
        );
        image.set(runtime + u64::from(layout.runtime_interpreters_head), a);
        image.set(a + u64::from(layout.interp_threads_head), t1);
        image.set(a + u64::from(layout.interp_next), b);
        image.set(b + u64::from(layout.interp_threads_head), t2);
        image.set(b + u64::from(layout.interp_next), a);
        image.set(t1 + u64::from(layout.tstate_next), t2);
        image.set(t2 + u64::from(layout.tstate_next), t1);
        image.set(t1 + u64::from(layout.tstate_thread_id), 11);
        image.set(t2 + u64::from(layout.tstate_thread_id), 22);
        let memory = ProcessMemory::new(std::process::id());
        let listed = list_thread_states(&memory, &layout, runtime).unwrap();
        let addresses: Vec<u64> = listed.states.iter().map(|t| t.address).collect();
        assert_eq!(addresses, [t1, t2]);
        assert_eq!(listed.states[1].thread_id, 22);
        assert!(listed.cycle && !listed.cut);
        // A next pointer into unmapped memory ends the listing with an error.
        image.set(t2 + u64::from(layout.tstate_next), 0x10);
        assert!(list_thread_states(&memory, &layout, runtime).is_err());
    }

    /// The recording pipeline keeps targets in tokio tasks: they must move between threads.
    #[test]
    fn a_target_is_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::PythonTarget>();
    }
}
