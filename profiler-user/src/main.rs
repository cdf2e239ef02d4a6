//! `bpfprof`: the command line over the bpfprof library. This file only dispatches: the flags
//! are in `bpfprof::cli::args`, the drivers in `bpfprof::cli`.

use std::{ffi::OsString, process::ExitCode};

use bpfprof::{
    cli::{
        self,
        args::{Cli, Command},
        client, drivers,
    },
    error::exit_code,
};
use clap::Parser;

/// Allocations of at least this many bytes get a mapping of their own (glibc's default start,
/// made fixed: see `main`).
#[cfg(target_env = "gnu")]
const MALLOC_MMAP_THRESHOLD: i32 = 128 * 1024;

/// The daemon's async worker threads.
const DAEMON_WORKERS: usize = 2;

fn main() -> ExitCode {
    // One malloc arena for every thread. A run's end frees the raw stacks the sampling thread
    // took while the symbolizer's thread builds the profile from them: with an arena per
    // thread, that freed memory could not be reused for the profile, and the end's peak RSS
    // held both (section 4 of the bench, 23k stacks: 35-37 MiB, 31-32 MiB with one arena).
    // bpfprof's threads allocate little at once, so sharing the arena costs no wait that shows.
    // And a fixed threshold for allocations served by their own mapping: glibc raises it to
    // the size of each such block freed, after which a growing table or list is copied inside
    // the heap (old and new held at once) and its freed room stays resident; fixed, a large
    // block grows in place (mremap) and goes back to the kernel when freed (30-31 MiB).
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt sets allocator parameters; no other thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD);
    }
    // Called `strobeclient` (or `bpfprof strobeclient ...`): PyTorch's strobelight front end.
    let argv: Vec<OsString> = std::env::args_os().collect();
    if let Some(args) = cli::strobeclient::invocation(&argv) {
        return ExitCode::from(cli::strobeclient::main(args) as u8);
    }
    let cli = Cli::parse_from(argv);
    // The live view owns the terminal: a log line would tear it (RUST_LOG still applies);
    // its errors are printed once the terminal is restored.
    let top = matches!(cli.command, Some(Command::Top(_)));
    let level = match (cli.record.quiet, cli.record.verbose) {
        _ if top => "off",
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, _) => "debug",
    };
    let mut logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level));
    logger.format_timestamp(None).format_target(false);
    if cli.record.verbose > 0 {
        // `-v` dates each line from the start of main, so that a run's start-up reads as a
        // breakdown (the maps read, the program loaded, the walker verified, the first sample).
        let started = std::time::Instant::now();
        logger.format(move |buf, record| {
            use std::io::Write;
            writeln!(
                buf,
                "[{:>8.1} ms {:<5}] {}",
                started.elapsed().as_secs_f64() * 1e3,
                record.level(),
                record.args()
            )
        });
    }
    logger.init();
    let daemon = matches!(cli.command, Some(Command::Daemon(_)));
    // The agent serves HTTP clients: like the daemon, a client hanging up must not kill it.
    let serves = daemon || matches!(cli.command, Some(Command::Agent(_)));
    // The daemon answers many clients: two workers, so that a client's request never waits
    // behind another task's moment on a thread (its slow work runs on blocking threads).
    // A recording needs one thread.
    let runtime = if daemon {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(DAEMON_WORKERS)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("starting the async runtime: {e}");
            return ExitCode::from(exit_code::FAILURE as u8);
        }
    };
    if !serves {
        // A reader that goes away (`bpfprof list | head -2`) ends the command quietly, as for
        // any Unix filter, instead of a panic on the failed write. The daemon keeps ignoring
        // SIGPIPE: a client hanging up must not kill it.
        // SAFETY: setting a signal disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match cli.command {
        None => runtime.block_on(drivers::record(cli.record)),
        Some(Command::Daemon(args)) => runtime.block_on(drivers::daemon(args)),
        Some(Command::Agent(args)) => runtime.block_on(drivers::agent(args)),
        Some(Command::Doctor(args)) => drivers::doctor(args),
        Some(Command::Top(args)) => runtime.block_on(cli::top::run(args)),
        Some(Command::Dump(args)) => cli::dump::run(args),
        Some(command) => client::client_command(command),
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bpfprof: error: {e}");
            e.exit_code()
        }
    };
    ExitCode::from(code as u8)
}
