//! A CPython process bpfprof reads: [`PythonTarget::probe`] finds its interpreter
//! ([`super::detect`]) and the layout its frames are walked with ([`super::layout`]), or says
//! why it cannot walk it ([`Unsupported`]); the layout the kernel program walks with, and the
//! main interpreter's GIL.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
};

use anyhow::{anyhow, Context};
use profiler_common::PythonProcess;

use super::{
    code::{CodeInfo, CodeReader},
    detect, layout,
    layout::Layout,
    memory::ProcessMemory,
    FREE_THREADED_GIL_ENABLED, FREE_THREADED_NO_GIL, MAX_INTERPRETERS,
};
use crate::Result;

/// One CPython process bpfprof reads Python frames of.
pub struct PythonTarget {
    pub(super) pid: u32,
    pub(super) interpreter: detect::Interpreter,
    pub(super) layout: Layout,
    pub(super) memory: ProcessMemory,
    /// Code objects read so far, by address.
    pub(super) codes: HashMap<u64, CodeInfo>,
    /// Reads code objects, with what they share cached.
    pub(super) code_reader: CodeReader,
    /// 3.10: where glibc's `struct pthread` keeps the thread's tid, once found.
    pub(super) pthread_tid_offset: Option<u64>,
    /// What the bounds on its walks left out so far.
    pub(super) limits: WalkLimits,
    /// Bytes naming frames cost so far: read from the process, and kept in `codes`.
    pub(super) naming_bytes: u64,
    /// Bytes kept in `codes`.
    pub(super) kept_bytes: u64,
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
        PythonTarget::probe_with(pid, &[], &detect::DetectMemo::default())
    }

    /// [`Self::probe`] with the process's executable mappings as just read (`mapped`, empty
    /// when not read) and the objects already searched (`memo`): see [`detect::find`].
    pub fn probe_with(
        pid: u32,
        mapped: &[procfs::process::MemoryMap],
        memo: &detect::DetectMemo,
    ) -> Result<Probe> {
        let memory = ProcessMemory::new(pid);
        let interpreter = match detect::find(pid, &memory, mapped, memo)? {
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

    /// Whether it is a free-threaded (no-GIL) build.
    pub fn free_threaded(&self) -> bool {
        self.layout.free_threaded
    }

    /// The object that defines `_PyRuntime`, as the process sees its path.
    pub fn interpreter_path(&self) -> &PathBuf {
        &self.interpreter.path
    }

    /// The interpreter found (for `bpfprof doctor --pid`).
    pub fn interpreter(&self) -> &detect::Interpreter {
        &self.interpreter
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
    /// before that has none yet, so call this again later). A free-threaded build whose GIL
    /// is enabled now ([`Self::gil_enabled`]) is given its GIL's addresses and walked as a GIL
    /// build's (its stacks say who holds it), not marked as having none.
    pub fn kernel_layout_with_gil(&mut self) -> PythonProcess {
        let mut k = self.layout.kernel;
        if let Ok((locked, last_holder)) = self.gil_addresses() {
            k.gil_locked = locked;
            k.gil_holder = last_holder;
            k.free_threaded = 0;
        }
        k
    }

    /// The main interpreter's GIL struct (`*PyInterpreterState.ceval.gil`), 3.12 and later.
    fn main_gil(&mut self, interp_gil: u32) -> Result<u64> {
        let runtime = self.interpreter.runtime;
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
            return Err(anyhow!("pid {}: the main interpreter has no GIL yet", self.pid).into());
        }
        Ok(gil)
    }

    /// Whether the main interpreter runs with a GIL now: always for a GIL build; for a
    /// free-threaded one, whether its GIL's `enabled` is set (what `sys._is_gil_enabled()`
    /// reads), as `PYTHON_GIL=1` sets it at start-up and importing an extension module that
    /// does not declare it can run without one sets it later.
    pub fn gil_enabled(&mut self) -> Result<bool> {
        match self.layout.gil {
            layout::GilLayout::FreeThreaded {
                interp_gil,
                enabled,
                ..
            } => {
                let gil = self.main_gil(interp_gil)?;
                Ok(self.memory.read_i32(gil.wrapping_add(enabled as u64))? != 0)
            }
            _ => Ok(true),
        }
    }

    /// What bpfprof says of a free-threaded build's GIL now (`dump`): that it has none, or
    /// that it was enabled at run time; `None` for a GIL build.
    pub fn free_threaded_gil(&mut self) -> Option<&'static str> {
        if !self.layout.free_threaded {
            return None;
        }
        Some(if self.gil_enabled().unwrap_or(false) {
            FREE_THREADED_GIL_ENABLED
        } else {
            FREE_THREADED_NO_GIL
        })
    }

    /// Addresses of the main interpreter's GIL fields in the process: its `locked` flag (a C
    /// `int`, non-zero while held) and `last_holder` (the `PyThreadState` that took it last),
    /// for telling the GIL holder from waiters. A free-threaded build has them only while its
    /// GIL is enabled.
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
                let gil = self.main_gil(interp_gil)?;
                Ok((gil + locked as u64, gil + last_holder as u64))
            }
            layout::GilLayout::FreeThreaded {
                interp_gil,
                enabled,
                locked,
                last_holder,
            } => {
                let gil = self.main_gil(interp_gil)?;
                if self.memory.read_i32(gil.wrapping_add(enabled as u64))? == 0 {
                    return Err(anyhow!("pid {}: {FREE_THREADED_NO_GIL}", self.pid).into());
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
}

#[cfg(test)]
mod tests {
    /// The recording pipeline keeps targets in tokio tasks: they must move between threads.
    #[test]
    fn a_target_is_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::PythonTarget>();
    }
}
