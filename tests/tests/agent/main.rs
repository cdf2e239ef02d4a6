//! End-to-end tests of `bpfprof agent`: what it serves (pprof, Prometheus metrics) and what it
//! exports (OTLP, Pyroscope), each read by its users' own tools.
//!
//! One binary, one module per topic (`cargo test -p bpfprof-tests --test agent -- export::`);
//! the receivers' helpers are in `bpfprof_tests::agent`.

mod cost;
mod export;
mod serve;
mod tls;
