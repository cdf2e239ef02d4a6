//! One Node.js process in a recording: its V8 constants given to the kernel, the
//! SharedFunctionInfos of the frames it recorded queued and named while the process lives
//! (within the owner's naming share), and what could not be named said in the summary.

use std::{
    collections::{HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use profiler_common::{StackId, V8Process};

use super::{
    detect::FoundV8,
    heap::{Heap, JsFunction},
    merge::{frames, lookup_pc, V8Symbols},
};
use crate::{
    kernel::KernelProgram,
    runtime::shares::{NamingShares, Owner},
};

/// Functions of one process waiting to be named at most (as for CPython's code objects).
const MAX_QUEUED: usize = 1 << 18;

/// Something to read from a V8 process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Work {
    /// A SharedFunctionInfo (tagged): its function's name.
    Function(u64),
    /// A Code object (tagged): its kind and inlining.
    Code(u64),
    /// A frame's pc (as [`lookup_pc`] has it): the Code holding it.
    Pc(u64),
}

/// Most pcs whose Code was not found that are remembered: past it none is looked for.
const MAX_NO_CODE: usize = 1 << 14;
/// Pcs whose Code was not found before any was, past which none is looked for.
const MAX_FIRST_MISSES: usize = 1024;

/// One V8 process whose JavaScript frames the kernel records.
pub struct V8Tracking {
    pid: u32,
    heap: Heap,
    kernel: V8Process,
    named_stacks: HashSet<StackId>,
    /// What to read: SharedFunctionInfos, Code objects (tagged) and the pcs of frames whose
    /// Code is to be found.
    queued: VecDeque<Work>,
    queued_keys: HashSet<Work>,
    /// Pcs whose Code was looked for and not found (not looked for again).
    no_code: HashSet<u64>,
    /// The process's anonymous executable mappings (V8's generated code), as last read.
    jit_ranges: Vec<(u64, u64)>,
    /// Its file-backed executable mappings (V8's builtins are in the object's text).
    file_ranges: Vec<(u64, u64)>,
    queue_full: u64,
    shares: Arc<NamingShares>,
    owner: Owner,
    charged: u64,
    symbols: V8Symbols,
    /// SharedFunctionInfos that could not be read as one (moved or freed since the sample).
    unnamed: u64,
    /// Code objects that could not be read as one (their frames keep one function each).
    unread_code: u64,
    over_budget: u64,
    over_time: u64,
    naming: Duration,
}

impl V8Tracking {
    /// Registers `found` (pid `pid`'s V8) with the kernel; `None` when the kernel's map
    /// refused it.
    pub fn start(
        program: &mut KernelProgram,
        pid: u32,
        found: FoundV8,
        shares: &Arc<NamingShares>,
        owner: Owner,
    ) -> Option<V8Tracking> {
        let (major, minor, build) = found.version;
        if let Err(e) = program.runtimes.v8.processes.insert(pid, found.kernel, 0) {
            log::warn!(
                "pid {pid}: cannot register V8 {major}.{minor}.{build} with the kernel: {e}"
            );
            return None;
        }
        log::info!(
            "pid {pid}: V8 {major}.{minor}.{build} ({}): JavaScript frames on",
            found.path.display()
        );
        Some(V8Tracking {
            pid,
            heap: Heap::new(
                crate::runtime::cpython::memory::ProcessMemory::new(pid),
                found.constants,
            ),
            kernel: found.kernel,
            named_stacks: HashSet::new(),
            queued: VecDeque::new(),
            queued_keys: HashSet::new(),
            no_code: HashSet::new(),
            jit_ranges: Vec::new(),
            file_ranges: Vec::new(),
            queue_full: 0,
            shares: Arc::clone(shares),
            owner,
            charged: 0,
            symbols: V8Symbols::default(),
            unnamed: 0,
            unread_code: 0,
            over_budget: 0,
            over_time: 0,
            naming: Duration::ZERO,
        })
    }
}

impl V8Tracking {
    /// Queues a SharedFunctionInfo or Code (`key`) to be read, unless it was or is queued.
    fn queue(&mut self, key: Work) {
        let known = match key {
            Work::Function(shared) => self.symbols.functions.contains_key(&shared),
            Work::Code(code) => self.symbols.codes.contains_key(&code),
            Work::Pc(pc) => self.symbols.code_at(pc).is_some() || self.no_code.contains(&pc),
        };
        if known || self.queued_keys.contains(&key) {
            return;
        }
        if self.queued.len() >= MAX_QUEUED {
            self.queue_full += 1;
            return;
        }
        self.queued_keys.insert(key);
        self.queued.push_back(key);
    }

    /// Whether `pc` lies in V8's generated code (an anonymous executable mapping), where a
    /// Code is looked for: the process's maps are read again (once per naming round,
    /// `maps_read`) for a pc in none of those known.
    fn in_jit_code(&mut self, pc: u64, maps_read: &mut bool) -> bool {
        let within = |ranges: &[(u64, u64)]| ranges.iter().any(|&(lo, hi)| pc >= lo && pc < hi);
        if !within(&self.jit_ranges) && !within(&self.file_ranges) && !*maps_read {
            *maps_read = true;
            if let Ok(maps) = procfs::process::Process::new(self.pid as i32).and_then(|p| p.maps())
            {
                self.jit_ranges.clear();
                self.file_ranges.clear();
                for m in maps {
                    if !m.perms.contains(procfs::process::MMPermissions::EXECUTE) {
                        continue;
                    }
                    match m.pathname {
                        procfs::process::MMapPath::Anonymous => self.jit_ranges.push(m.address),
                        _ => self.file_ranges.push(m.address),
                    }
                }
            }
        }
        within(&self.jit_ranges)
    }

    /// Reads Code `key` and queues the functions it inlined.
    fn read_code(&mut self, key: u64) {
        match self.heap.code(key) {
            Ok(code) => {
                let kept = code.kept_bytes();
                self.shares.charge(self.owner, kept);
                self.charged += kept;
                log::trace!(
                    "pid {}: V8 code {key:#x}: {:?} at {:#x}+{:#x}, inlined {:x?}",
                    self.pid,
                    code.kind,
                    code.start,
                    code.size,
                    code.inlined
                );
                for &shared in &code.inlined {
                    if shared != 0 {
                        self.queue(Work::Function(shared));
                    }
                }
                self.symbols.add_code(key, code);
            }
            Err(e) => {
                self.unread_code += 1;
                log::debug!("pid {}: V8 code {key:#x}: {e:#}", self.pid);
            }
        }
    }
}

impl crate::runtime::Instance for V8Tracking {
    fn tag(&self) -> profiler_common::RuntimeTag {
        profiler_common::RuntimeTag::V8
    }

    fn refresh(&mut self, program: &mut KernelProgram) {
        // Threads need nothing: the kernel finds V8's frames on any thread's stack. The entry
        // is written again in case the map lost it (a process re-registered after an exec).
        let _ = program
            .runtimes
            .v8
            .processes
            .insert(self.pid, self.kernel, 0);
    }

    fn queue_new_stacks(
        &mut self,
        program: &KernelProgram,
        ids: &[(u64, u32, StackId)],
        run: u32,
        ns_pid: u32,
    ) {
        let mut seen = std::mem::take(&mut self.named_stacks);
        let stacks: Vec<_> =
            crate::runtime::new_stacks(program, ids, run, ns_pid, &mut seen).collect();
        self.named_stacks = seen;
        for stack in stacks {
            for frame in frames(&stack) {
                log::trace!("pid {}: V8 frame {frame:x?}", self.pid);
                self.queue(Work::Function(frame.shared));
                // An interpreted frame runs no code of its function's own: only the others'
                // Code is read (for its kind and inlined functions), found from their pc.
                // The Code a frame runs (for its kind and inlined functions), found from its pc:
                // of every frame, interpreted ones too (a frame in on-stack replacement code
                // keeps the interpreter's frame and its bytecode offset), where V8's Code can
                // be read; pcs in V8's builtins (the interpreter's) are left out when it
                // runs (below).
                if self.heap.reads_code() {
                    // The function's own Code where the kernel could read one (a V8 whose
                    // JSFunction holds it), which spares looking for the pc's.
                    if frame.bytecode_offset.is_none() && frame.code & 3 == 1 {
                        self.queue(Work::Code(frame.code));
                    }
                    self.queue(Work::Pc(lookup_pc(&frame)));
                }
            }
        }
    }

    fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    fn name_queued(&mut self, cpu: Duration) -> Duration {
        let started = std::time::Instant::now();
        let cpu_before = crate::clock::thread_cpu_time();
        let spent = || crate::clock::thread_cpu_time().saturating_sub(cpu_before);
        let mut maps_read = false;
        while let Some(queued) = self.queued.pop_front() {
            self.queued_keys.remove(&queued);
            if !self.shares.has_room(self.owner) {
                self.over_budget += 1;
                continue;
            }
            let key = match queued {
                Work::Function(key) => key,
                Work::Code(key) => {
                    if !self.symbols.codes.contains_key(&key) {
                        self.read_code(key);
                    }
                    if spent() >= cpu {
                        break;
                    }
                    continue;
                }
                Work::Pc(pc) => {
                    // Pcs not found are remembered up to a bound, and none is looked for past it
                    // (or, before any was found, past a thousand misses: a process whose
                    // memory holds no InstructionStream is not scanned for each new pc).
                    let hopeless = self.no_code.len() >= MAX_NO_CODE
                        || (self.symbols.codes.is_empty()
                            && self.no_code.len() >= MAX_FIRST_MISSES);
                    if !hopeless
                        && self.symbols.code_at(pc).is_none()
                        && !self.no_code.contains(&pc)
                        && self.in_jit_code(pc, &mut maps_read)
                    {
                        match self.heap.code_at(pc) {
                            Ok(code) if !self.symbols.codes.contains_key(&code) => {
                                self.read_code(code)
                            }
                            Ok(_) => {}
                            Err(e) => {
                                // Not counted: V8's generated memory also holds code with no
                                // InstructionStream (its builtins, copied near the heap).
                                log::debug!("pid {}: V8 pc {pc:#x}: {e:#}", self.pid);
                                self.no_code.insert(pc);
                            }
                        }
                    }
                    if spent() >= cpu {
                        break;
                    }
                    continue;
                }
            };
            if self.symbols.functions.contains_key(&key) {
                continue;
            }
            match self.heap.function(key) {
                Ok(function) => {
                    log::trace!("pid {}: V8 function {key:#x}: {function:?}", self.pid);
                    let kept = (function.name.len()
                        + function.file.as_ref().map_or(0, String::len)
                        + std::mem::size_of::<(u64, JsFunction)>())
                        as u64;
                    self.shares.charge(self.owner, kept);
                    self.charged += kept;
                    self.symbols.functions.insert(key, function);
                }
                Err(e) => {
                    self.unnamed += 1;
                    log::debug!("pid {}: V8 function {key:#x}: {e:#}", self.pid);
                }
            }
            if spent() >= cpu {
                break;
            }
        }
        self.naming += started.elapsed();
        spent()
    }

    fn abandon_queued(&mut self) {
        self.over_time += self.queued.len() as u64;
        self.queued.clear();
        self.queued_keys.clear();
    }

    fn limits_hit(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.unnamed > 0 {
            parts.push(format!(
                "{} JavaScript functions could not be named (their SharedFunctionInfo was \
                 moved or freed before it was read)",
                self.unnamed
            ));
        }
        if self.unread_code > 0 {
            parts.push(format!(
                "{} JavaScript frames' code could not be read (moved or freed before it was \
                 read): their inlined functions are not shown",
                self.unread_code
            ));
        }
        if self.over_budget > 0 {
            parts.push(format!(
                "{} JavaScript functions were left unnamed: its user's runs keep the {} MiB of \
                 names a user may keep",
                self.over_budget,
                crate::runtime::shares::NAMING_BYTES_PER_OWNER >> 20
            ));
        }
        if self.over_time + self.queue_full > 0 {
            parts.push(format!(
                "{} JavaScript functions were left unnamed: naming them needed more than its \
                 user's share of the daemon's CPU during the run",
                self.over_time + self.queue_full
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    fn naming_cost(&self) -> (usize, Duration) {
        (
            self.symbols.functions.len() + self.symbols.codes.len(),
            self.naming,
        )
    }

    fn frames(&self) -> &dyn crate::runtime::NamedFrames {
        &self.symbols
    }

    fn stop(&mut self, program: &mut KernelProgram) {
        let _ = program.runtimes.v8.processes.remove(&self.pid);
    }
}

impl Drop for V8Tracking {
    fn drop(&mut self) {
        self.shares.release(self.owner, self.charged);
    }
}
