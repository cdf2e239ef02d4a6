//! bpfprof: an eBPF sampling CPU profiler.
//!
//! The modules follow the data: [`target`] resolves processes, [`sampling`] validates the event
//! and rate, [`kernel`] loads and attaches the kernel program, [`drain`] reads its maps into
//! [`sample::Sample`]s, [`procmaps`] and [`symbolize`] turn addresses into frames,
//! [`aggregate`] builds a [`profile::Profile`] (the profile model), and [`output`] writes it.
//! [`pool`] shares kernel programs between runs and [`recording`] is the one pipeline from
//! targets to profile, driven by [`record`] (the command line) and [`daemon`].
#![warn(missing_docs)]

pub mod aggregate;
pub mod daemon;
pub mod doctor;
pub mod drain;
pub mod error;
pub mod kernel;
pub mod output;
pub mod perf_events;
pub mod plt;
pub mod pool;
pub mod procmaps;
pub mod profile;
pub mod python;
pub mod python_stacks;
pub mod record;
pub mod recording;
pub mod request;
pub mod results;
pub mod sample;
pub mod sampling;
pub mod stripped;
pub mod strobeclient;
pub mod symbolize;
pub mod target;
pub mod unwind;
pub mod vdso;

pub use bpfprof_client as client;
pub use bpfprof_client::protocol;
pub use error::{Error, Result};
