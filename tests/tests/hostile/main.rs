//! End-to-end tests of what an ordinary user can do to the root daemon and agent: each attack
//! run as it was reported, by a real non-root user, with an honest user working beside it.
//!
//! One binary, one module per topic (`cargo test -p bpfprof-tests --test hostile -- files::`);
//! the attackers' helpers are in `bpfprof_tests::hostile`.

mod asyncio_tasks;
mod authz;
mod copies;
mod fairness;
mod fake_runtimes;
mod files;
mod naming;
mod parsers;
mod security;
mod state;
