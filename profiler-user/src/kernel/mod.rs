//! The kernel program: loading the embedded eBPF object, attaching it to a perf event on every
//! online CPU, and telling it which processes to keep samples of.
//!
//! [`KernelProgram`] is one loaded object with its maps; its methods live by concern:
//! - `load`: the object loaded and verified ([`KernelProgram::load`], [`check_privileges`]);
//! - `walker`: the CFI and runtime (CPython) walker, verified beside sampling ([`WalkerLoad`]);
//! - `events`: the perf events sampled on;
//! - `targets`: the processes each run keeps samples of;
//! - `following`: children followed, processes stopped at exec ([`ensure_tracefs`]);
//! - `off_cpu`, `timeline`, `system`: off-CPU time, sample times, system-wide runs;
//! - `stacks`: stacks and sample counts moved to userspace and taken per run;
//! - `stats`: counters ([`Counters`]), delivery and BPF run-time statistics;
//! - `program`: the state they share.
//!
//! Beside it: the [`pool`] of programs shared by runs, [`drain`] (a run's samples out of the
//! kernel), the kernel's [`helpers`] probed and the [`perf_events`] opened.

pub mod drain;
pub mod helpers;
pub mod perf_events;
pub mod pool;

mod events;
mod following;
mod load;
mod off_cpu;
mod program;
mod stacks;
mod stats;
mod system;
mod targets;
mod timeline;
mod waits;
mod walker;

pub use waits::ScannedWait;

pub use following::ensure_tracefs;
pub use load::check_privileges;
pub use program::{KernelProgram, PythonMaps, RuntimeMaps, V8Maps};
pub use stats::Counters;
pub use targets::RunStopper;
pub use walker::WalkerLoad;
