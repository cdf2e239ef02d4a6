//! bpfprof: an eBPF sampling CPU profiler.
//!
//! The tree reads from the drivers down to what they stand on; a module uses only the modules
//! listed after it (and the shared [`error`] and [`sampling`] settings and [`clock`]s), checked
//! by the `layers` test:
//! - [`cli`], [`daemon`] and [`agent`]: the drivers (command line, client commands,
//!   `strobeclient`, `doctor`; the root daemon serving tagged runs; the always-on agent
//!   serving windows of the whole machine over HTTP);
//! - [`recording`]: the one pipeline from a validated request to a profile, shared by every
//!   driver (targets, run loop, ticks, collection, aggregation);
//! - [`runtime`]: language runtimes behind one interface (recognising a process, what the
//!   kernel walks it with, naming and merging its frames into native stacks): CPython first;
//! - [`kernel`]: the kernel program, its pool, perf events, helper probes and draining its maps;
//! - [`unwind`]: CFI tables for code without frame pointers;
//! - [`output`]: the writers (SVG, folded, pprof, speedscope, pstats, top, summary);
//! - [`profile`]: the sample and the profile model every writer reads;
//! - [`symbolize`]: addresses to function names (with PLT stubs and stripped objects);
//! - [`process`]: target processes, their memory maps and vDSO;
//! - shared by all: [`trusted_dir`], the folders bpfprof writes in as root, opened so that no
//!   other user can steer a write.
#![warn(missing_docs)]

pub mod cli;
pub mod daemon;

pub mod agent;

pub mod recording;

pub mod runtime;

pub mod kernel;
pub mod unwind;

pub mod output;
pub mod profile;
pub mod symbolize;

pub mod process;

pub mod clock;
pub mod error;
pub mod sampling;
pub mod trusted_dir;

pub use bpfprof_client as client;
pub use bpfprof_client::protocol;
pub use error::{Error, Result};
