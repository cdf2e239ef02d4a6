//! End-to-end tests of what a run writes and shows: every file format read by an independent
//! reader, the timeline, `bpfprof top` in a terminal and `bpfprof dump`.
//!
//! One binary, one module per topic (`cargo test -p bpfprof-tests --test outputs -- formats::`).

mod dump;
mod formats;
mod timeline;
mod top;
