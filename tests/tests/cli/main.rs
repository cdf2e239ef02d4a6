//! End-to-end tests of `bpfprof` runs from the command line: which processes are sampled, how a
//! run ends, off-CPU and wall-clock time, the whole machine, sampling accuracy, bad input,
//! `doctor`, and the docs' commands and links.
//!
//! One binary, one module per topic (`cargo test -p bpfprof-tests --test cli -- targeting::`).

mod aliasing;
mod docs;
mod doctor;
mod errors;
mod hotcold;
mod launch_exec;
mod lifecycle;
mod offcpu;
mod system_waits;
mod system_wide;
mod targeting;
mod waits;
