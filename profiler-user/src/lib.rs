//! bpfprof: an eBPF sampling CPU profiler.
//!
//! The modules follow the data: [`target`] resolves processes, [`sampling`] validates the event
//! and rate, [`kernel`] loads and attaches the kernel program, [`drain`] reads its maps into
//! [`sample::Sample`]s, [`procmaps`] and [`symbolize`] turn addresses into frames,
//! [`aggregate`] builds a [`aggregate::Profile`], and [`output`] writes it. [`record`] drives a
//! whole recording.
#![warn(missing_docs)]

pub mod aggregate;
pub mod client;
pub mod daemon;
pub mod drain;
pub mod error;
pub mod kernel;
pub mod output;
pub mod perf_events;
pub mod procmaps;
pub mod protocol;
pub mod record;
pub mod sample;
pub mod sampling;
pub mod symbolize;
pub mod target;
pub mod unwind;

pub use error::{Error, Result};
