//! CPython, bpfprof's first runtime ([`CPython`], registered in [`crate::runtime::RUNTIMES`]):
//! what userspace needs so that the kernel program can walk a CPython process's Python frames
//! (the kernel walker is `profiler-ebpf/src/python.rs`), and what turns those frames into
//! functions.
//!
//! - [`PythonTarget`] ([`target`]): [`PythonTarget::probe`] finds a process's interpreter
//!   (`_PyRuntime` in a libpython or a static python binary, [`detect`]) and its version's
//!   [`layout::Layout`], or says why it cannot walk it ([`Unsupported`]);
//!   [`PythonTarget::kernel_layout`] is what the kernel program walks with;
//! - [`threads`](ThreadListing): [`PythonTarget::threads`] lists every Python thread (host
//!   tid, `PyThreadState` address) for the kernel's thread map, bounded against hostile
//!   memory ([`list_thread_states`]);
//! - frames: [`PythonTarget::walk_thread`] walks a thread's frames from userspace by the kernel
//!   program's own rules (the reference the kernel's output is checked against);
//!   [`PythonTarget::resolve`] names a recorded frame (reading its code object once,
//!   [`code`]) with its line ([`linetable`]); [`PythonTarget::threading_names`] reads the
//!   threads' `threading` names ([`names`]); [`memory`] reads the process;
//! - [`stacks`]: one followed process in a recording ([`stacks::PythonTracking`], the
//!   runtime's [`crate::runtime::Instance`]);
//! - [`merge`]: named frames merged into native stacks at each `_PyEval_EvalFrameDefault`,
//!   and the Python view.

pub mod asyncio;
pub mod code;
pub mod detect;
mod frames;
pub mod layout;
pub mod linetable;
pub mod memory;
pub mod merge;
pub mod names;
pub mod stacks;
mod target;
mod threads;
pub mod waits;

use profiler_common::MAX_STACK_DEPTH;

pub use self::target::{Probe, PythonFunction, PythonTarget, Unsupported, WalkLimits};
pub use self::threads::{
    list_thread_states, ThreadListing, ThreadState, ThreadStates, MAX_INTERPRETERS,
    MAX_THREAD_STATES,
};

/// A Python frame as the kernel program records it (re-exported for callers of this module).
pub use profiler_common::PythonFrame;
/// The owner byte of 3.12+'s shim frames, which begin each eval call and are not recorded.
pub use profiler_common::PYTHON_FRAME_OWNED_BY_CSTACK as FRAME_OWNED_BY_CSTACK;

/// Most Python frames one walk records (the kernel program's bound).
pub const MAX_PYTHON_DEPTH: usize = MAX_STACK_DEPTH;
/// Most frames one walk visits, shim frames included, so a cycle cannot loop forever.
pub const MAX_FRAMES_VISITED: usize = 2 * MAX_PYTHON_DEPTH;

/// What bpfprof says of a free-threaded build's GIL (`--python-gil`, `dump`): it has none.
pub const FREE_THREADED_NO_GIL: &str = "free-threaded: no GIL";
/// What bpfprof says of a free-threaded build running with its GIL enabled (`PYTHON_GIL=1`,
/// or an extension module that needs it): its stacks then say who holds it, as a GIL
/// build's do.
pub const FREE_THREADED_GIL_ENABLED: &str = "free-threaded: GIL enabled";

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
        enabled: crate::runtime::Enabled,
        refused: &mut Option<String>,
        mapped: &[procfs::process::MemoryMap],
    ) -> Option<Box<dyn crate::runtime::Instance>> {
        let tracking = stacks::PythonTracking::start(
            program,
            pid,
            naming,
            enabled.async_depth(),
            refused,
            mapped,
        )?;
        Some(Box::new(tracking))
    }

    fn cut(&self, stack: &[u64], limit: usize) -> (Vec<u64>, bool) {
        stacks::limit_python(stack, limit)
    }

    fn view_keep(&self, frames: &[Option<&crate::symbolize::Frame>]) -> Vec<bool> {
        stacks::python_view_keep(frames)
    }
}
