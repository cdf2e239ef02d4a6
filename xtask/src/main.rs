//! bpfprof's task runner, reached through the `cargo xtask` alias (`.cargo/config.toml`): one
//! file per task, dispatched from here.
//!
//! - `setup` (`setup.rs`): installs what the build and the tests need (idempotent).
//! - `build-ebpf` (`build_ebpf.rs`): builds the kernel object reproducibly and copies it into
//!   the tree.
//! - `check-ebpf` (`check_ebpf.rs`): fails if the committed kernel object is not what the
//!   sources build.
//! - `test` (`test.rs`): `cargo test --workspace`.
//! - `bench` (`bench/`): bpfprof against perf and bpftrace, written to `BENCHMARKS.md`.
//! - `vm-test` (`vm.rs`): the smoke suite on the tested kernels under QEMU.
//! - `fuzz` (`fuzz.rs`): every fuzz target of `fuzz/` for a bounded time.
//! - `ci` (`ci.rs`): every check CI runs, in order, stopping at the first failure.
//!
//! `cmd.rs` runs commands for all of them; `consts.rs` holds the paths, versions and package
//! lists they name.

mod bench;
mod build_ebpf;
mod check_ebpf;
mod ci;
mod cmd;
mod consts;
mod fuzz;
mod setup;
mod setup_jdk;
mod setup_node;
mod test;
mod vm;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "bpfprof's build, check and CI tasks"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the build and the tests need (apt packages, bpf-linker, rustfmt, clippy);
    /// does nothing for what is already there.
    Setup,
    /// Build the kernel object reproducibly and copy it to PATH
    /// (default: profiler-user/bpf/profiler.bpf.o).
    BuildEbpf(build_ebpf::Options),
    /// Build the kernel object and fail if it differs from the committed one.
    CheckEbpf(check_ebpf::Options),
    /// Run `cargo test --workspace`, passing ARGS on to it verbatim
    /// (e.g. `cargo xtask test -p bpfprof-tests -- --nocapture`).
    Test(test::Options),
    /// Benchmark bpfprof against perf and bpftrace; writes BENCHMARKS.md and bench/overhead.svg.
    Bench(bench::BenchArgs),
    /// Boot the tested kernels (Debian's 6.1 and 6.12, the host's 6.18 when /boot has it)
    /// under QEMU and run bpfprof's smoke suite inside each.
    VmTest(vm::Options),
    /// Build the fuzz targets (fuzz/) and run each for a bounded time from its committed
    /// corpus, failing on any crash, hang or memory blow-up.
    Fuzz(fuzz::Options),
    /// Run every CI check in order, stopping at the first failure.
    Ci(ci::Options),
}

fn main() {
    let result = match Cli::parse().command {
        Cmd::Setup => setup::setup(),
        Cmd::BuildEbpf(options) => build_ebpf::build_ebpf_cmd(options),
        Cmd::CheckEbpf(options) => check_ebpf::check_ebpf(options.clean),
        // Verbatim, unlike clap, which would swallow a leading `--` (`cargo xtask test --
        // --nocapture` must reach the test binaries). No global options exist, so the
        // subcommand is argv[1].
        Cmd::Test(_) => test::test(&std::env::args_os().skip(2).collect::<Vec<_>>()),
        Cmd::Ci(options) => ci::ci(options),
        Cmd::VmTest(options) => vm::vm_test(&options.kernel),
        Cmd::Fuzz(options) => fuzz::fuzz(options),
        Cmd::Bench(args) => bench::run(args),
    };
    if let Err(err) = result {
        eprintln!("xtask: error: {err:#}");
        std::process::exit(1);
    }
}
