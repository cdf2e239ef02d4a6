//! Harness for the bpfprof end-to-end tests.
//!
//! The tests in `tests/tests/` (one binary per family, one module per topic) run the real
//! `bpfprof` binary, as root, with the real eBPF program, against the C workloads in
//! `tests/workloads/` (compiled by `build.rs`). This library holds what they share:
//!
//! * [`needs_root!`]: the one way a test says it needs root: it returns (or, under
//!   `CI=true`, fails) when not root, and runs beside the binary's other tests or alone;
//! * [`bpfprof_bin`]: where the binary is (`BPFPROF_BIN`, else the workspace's
//!   `target/debug/bpfprof`, built once on demand);
//! * [`Workload`]: a spawned workload process, killed on drop;
//! * [`run_bpfprof`] / [`BpfprofProcess`]: run the profiler with a timeout;
//! * [`Profile`]: parsed folded output with stack queries;
//! * [`Summary`]: the `--summary-json` document;
//! * [`Daemon`]: a daemon on a private socket, and [`test_user`]: real non-root users.
//!
//! One module per concern, each re-exported here so that `use bpfprof_tests::*;` reaches
//! everything: `env` (root/CI, the binary, workloads, tools), `process` (workload processes
//! and `/proc`), `runner` (running bpfprof), `profile` (folded profiles), `summary` (the
//! summary JSON), `files` (temp dirs and executable copies), `checks`, `daemon`, `users`,
//! `python` (the installed Python package, py-spy), `root` (the machine lock behind
//! `needs_root!`), `stats` (sampled shares and their standard errors), `exit` (exit codes),
//! `large_library` and `agent` (the agent's tests' helpers).

pub mod agent;
pub mod checks;
pub mod daemon;
pub mod env;
pub mod exit;
pub mod files;
pub mod hostile;
pub mod large_library;
pub mod perf;
pub mod process;
pub mod profile;
pub mod python;
pub mod root;
pub mod runner;
pub mod stats;
pub mod summary;
pub mod users;

pub use checks::*;
pub use daemon::*;
pub use env::*;
pub use files::*;
pub use perf::*;
pub use process::*;
pub use profile::*;
pub use python::*;
pub use runner::*;
pub use stats::*;
pub use summary::*;
pub use users::*;
