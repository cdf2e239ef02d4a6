//! One recording, from its targets to a [`Profile`]: the single pipeline behind both the
//! command line (`record`) and the daemon. [`Recording::add_target`] registers processes with a
//! pooled kernel program, [`Recording::tick`] keeps the run healthy while it samples (moves
//! stacks out of the kernel, refreshes memory maps, picks up followed children, notes exits),
//! [`Recording::collect`] takes what the kernel recorded, and [`Collected::assemble`]
//! symbolizes and aggregates it. Only `add_target`, `tick` and `collect` need the kernel
//! program; `assemble` can run anywhere (the daemon runs it on its symbolizer thread).
//!
//! The files, in the order a run goes through them:
//! - `request`: a validated request ([`request::RecordingRequest`]);
//! - `state`: the recording's state ([`Recording`]) and what it reads back of itself;
//! - `process`: one process of it ([`ProcessRecording`]) and how often its maps are re-read;
//! - `setup`: a system-wide start, a target added, the pool reached ([`PoolAccess`]);
//! - `tick`: the tick ([`TickStatus`]), following children and execs, taking processes in;
//! - `naming`: queueing and naming runtime frames within the owner's CPU share;
//! - `collect`: samples out of the kernel, at the end ([`Collected`]) or as a window;
//! - `assemble`: samples to a profile (losses, walks, costs), through `aggregate`;
//! - `run_loop`: the one run loop every driver runs.
//!
//! [`Profile`]: crate::profile::Profile

pub mod aggregate;
pub mod request;
pub mod run_loop;

mod assemble;
mod collect;
mod naming;
mod process;
mod setup;
mod state;
mod tick;

pub use collect::Collected;
pub use process::{
    ProcessRecording, MAPS_REFRESH, MAX_SYSTEM_PROCESSES, SYSTEM_MAPS_REFRESH, YOUNG_PROCESS,
    YOUNG_REFRESH_PERIODS,
};
pub use setup::PoolAccess;
pub use state::Recording;
pub use tick::TickStatus;
