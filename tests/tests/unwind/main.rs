//! End-to-end tests of stacks: CFI unwinding of code without frame pointers, unwind tables,
//! signal frames, the targets real profiles meet, and how their frames are named.
//!
//! One binary, one module per topic (`cargo test -p bpfprof-tests --test unwind -- cfi::`).

mod cfi;
mod chroot_debug;
mod hotspot;
mod node;
mod plt;
mod signals;
mod stacks;
mod symbols;
mod tables;
mod targets;
