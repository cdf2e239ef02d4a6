//! End-to-end tests of the daemon and the one recording pipeline behind it and the CLI: real
//! runs through its CLI and client, start-ups that never stall it, shared programs.
//!
//! One binary, one module per topic (`cargo test -p bpfprof-tests --test daemon -- runs::`).
//! Attacks on the daemon by other users are in the `hostile` binary.

mod pipeline;
mod runs;
mod stall;
