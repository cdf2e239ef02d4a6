//! `bpfprof`: the command line over the bpfprof library.

use std::{
    ffi::OsString,
    io::IsTerminal,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use bpfprof::{
    cli::record::{CommandOutcome, Progress, Recorder, StopConditions},
    client::Client,
    daemon::DaemonConfig,
    error::{exit_code, Error},
    output::{summary::effective_hz, top, Format, Output},
    process::target::TargetSpec,
    profile::CostScope,
    profile::{Profile, RunEnd, ShortfallCause},
    protocol::{self, Reply, RunRequest},
    recording::request::{
        split_tag, RecordingRequest, TagsAndStacks, Walks, DEFAULT_MAX_STACK_LENGTH,
    },
    sampling::{EventChoice, IntervalArg, SamplingRequest},
    symbolize::SymbolizerThread,
};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Sample the CPU stacks of running processes with eBPF and write a profile.
#[derive(Parser, Debug)]
#[command(
    name = "bpfprof",
    version,
    about,
    after_help = EXIT_CODES,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    record: RecordArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve profiling runs to libraries and tools over a Unix socket (run as root).
    Daemon(DaemonArgs),
    /// Ask the daemon to profile a process; prints `Run Id: N` (with --async) or the results.
    Run(RunArgs),
    /// Print a run's state: `Profile run status: RUNNING`.
    Status(RunIdArgs),
    /// Stop a run early; its results are still written.
    Stop(RunIdArgs),
    /// Print a run's results: samples, files written, top functions.
    Results(ResultsArgs),
    /// List your runs (root sees all).
    List(ClientArgs),
    /// Check this machine: kernel settings, capabilities, PMU, program load and attach,
    /// helpers, daemon; says what to do about each problem (exit 12 when a check fails).
    Doctor(DoctorArgs),
}

#[derive(Args, Debug)]
struct DoctorArgs {
    /// Daemon socket to check [env: BPFPROF_SOCKET] [default: /run/bpfprof/bpfprof.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Print the checks as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct DaemonArgs {
    /// Socket to listen on [env: BPFPROF_SOCKET] [default: /run/bpfprof/bpfprof.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Most kernel memory for CFI unwind tables, per kernel program, in MiB (8 bytes a row;
    /// a 430 MB libtorch_cpu.so needs 20); each program gets what its first target maps,
    /// within this cap.
    #[arg(long, default_value_t = bpfprof::unwind::DEFAULT_TABLE_MIB)]
    unwind_table_mib: u32,
    /// Where runs and their results are kept.
    #[arg(long, default_value = "/var/lib/bpfprof")]
    state_dir: PathBuf,
    /// Most runs sampling at once.
    #[arg(long, default_value_t = 16)]
    max_runs: usize,
    /// Most runs one non-root user may have sampling at once.
    #[arg(long, default_value_t = 8)]
    max_runs_per_user: usize,
    /// Most ended runs kept per non-root user.
    #[arg(long, default_value_t = 50)]
    keep_runs_per_user: usize,
    /// Connections that send no request for this long are closed.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    client_idle_timeout: Duration,
    /// Longest run.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    max_duration: Duration,
    /// Most ended runs kept on disk.
    #[arg(long, default_value_t = 200)]
    keep_runs: usize,
    /// Ended runs older than this are deleted.
    #[arg(long, default_value = "7days", value_parser = humantime::parse_duration)]
    keep_age: Duration,
}

#[derive(Args, Debug)]
struct ClientArgs {
    /// The daemon's socket [env: BPFPROF_SOCKET] [default: /run/bpfprof/bpfprof.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Print the daemon's reply as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct RunIdArgs {
    /// The run.
    #[arg(long)]
    run_id: u64,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Args, Debug)]
struct ResultsArgs {
    /// The run.
    #[arg(long)]
    run_id: u64,
    /// Wait this long for the run to end first: 30s, 5m.
    #[arg(long, value_parser = humantime::parse_duration)]
    wait: Option<Duration>,
    /// Also copy the result files into DIR, read through the daemon's socket (works where
    /// the daemon's state directory is out of reach).
    #[arg(long, value_name = "DIR")]
    copy_to: Option<std::path::PathBuf>,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Process to profile: PID or NS:PID.
    #[arg(short, long, value_name = "PID|NS:PID")]
    pid: String,
    /// Return once the run samples, printing its id.
    #[arg(long = "async")]
    run_async: bool,
    /// auto, cycles or cpu-clock.
    #[arg(long)]
    event: Option<String>,
    /// Period in event units (cycles, or ns for cpu-clock).
    #[arg(long, allow_negative_numbers = true, conflicts_with = "frequency")]
    sample_interval: Option<i64>,
    /// Samples per second.
    #[arg(short = 'F', long, allow_negative_numbers = true)]
    frequency: Option<i64>,
    /// Length of the run in milliseconds.
    #[arg(long)]
    duration_ms: Option<u64>,
    /// Bare tags, comma-separated.
    #[arg(long, value_delimiter = ',')]
    sample_tags: Vec<String>,
    /// KEY=VALUE tags; repeatable.
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    tags: Vec<String>,
    /// Deepest stack kept (default 127, at most 512; frame-pointer stacks stop at
    /// kernel.perf_event_max_stack).
    #[arg(long, allow_negative_numbers = true)]
    max_stack_length: Option<i64>,
    /// Formats to write (default: svg, folded, pprof, speedscope, pstats).
    #[arg(long, value_delimiter = ',')]
    formats: Option<Vec<String>>,
    /// Also profile the children the process forks during the run (and theirs).
    #[arg(long)]
    follow_children: bool,
    /// How user stacks are walked: auto, fp or cfi (as the recording's --unwind); the
    /// daemon's default is auto.
    #[arg(long, value_enum)]
    unwind: Option<bpfprof::unwind::UnwindMode>,

    /// Python frames of a CPython target: auto or off (the daemon's default is auto).
    #[arg(long, value_enum)]
    python: Option<bpfprof::python::stacks::PythonMode>,
    #[command(flatten)]
    client: ClientArgs,
}

/// Options of a direct recording (`bpfprof --pid PID` or `bpfprof -- COMMAND`).
#[derive(Args, Debug)]
struct RecordArgs {
    /// Process to profile: PID, or NS:PID with NS the inode of its pid namespace
    /// (`stat -L -c %i /proc/PID/ns/pid`) and PID as seen inside it. Repeatable.
    #[arg(short, long = "pid", value_name = "PID|NS:PID")]
    pids: Vec<String>,

    /// How long to sample: 500ms, 3s, 2m. Default: until Ctrl-C or the targets exit.
    #[arg(short, long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,

    /// Hard cap on the run's length, whatever else is asked.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    max_duration: Duration,

    /// Event that drives sampling: auto (cycles where a PMU exists, else cpu-clock), cycles,
    /// or cpu-clock.
    #[arg(long, default_value = "auto")]
    event: String,

    /// Sampling period. A plain number is in the event's unit: cycles for auto and cycles
    /// (default 10000000; where auto falls back to cpu-clock it keeps the same rate), or
    /// nanoseconds for cpu-clock. A time (250us, 1ms, 0.01s) is CPU time between samples on any
    /// event. The period in use is printed when sampling starts.
    #[arg(
        long,
        allow_negative_numbers = true,
        conflicts_with = "frequency",
        value_name = "N|TIME"
    )]
    sample_interval: Option<IntervalArg>,

    /// Samples per second per CPU, instead of a period.
    #[arg(short = 'F', long, allow_negative_numbers = true)]
    frequency: Option<i64>,

    /// Keep the sampling period fixed. By default each CPU's period is redrawn around the
    /// mean (±50%) every few milliseconds, so periodic workloads cannot alias with it.
    #[arg(long)]
    fixed_interval: bool,

    /// Where to write the profile; repeatable. The format comes from the extension (.svg,
    /// .folded, .pb.gz, .speedscope.json, .prof, .txt, .summary.json), else from --format.
    /// Default: bpfprof.svg.
    #[arg(short, long = "output", value_name = "PATH")]
    outputs: Vec<PathBuf>,

    /// Format for outputs whose extension names none: svg, folded, pprof, speedscope, pstats,
    /// top, summary-json. `--format top` without --output prints the table.
    #[arg(long)]
    format: Option<String>,

    /// Also write a JSON summary of the run (samples, event, losses, top functions) here.
    #[arg(long, value_name = "PATH")]
    summary_json: Option<PathBuf>,

    /// Strobelight-style sample tags, comma-separated: `--sample-tags a,b`.
    #[arg(long, value_delimiter = ',', value_name = "TAG,...")]
    sample_tags: Vec<String>,

    /// A key=value tag stored with every sample; repeatable.
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    tags: Vec<String>,

    /// Deepest stack kept, in frames, at most 512 (leaf-most frames are kept; cut stacks get a
    /// `[truncated]` root frame). User stacks walked with CFI tables and Python stacks reach
    /// 512; frame-pointer user stacks (--unwind fp) and kernel stacks stop at
    /// kernel.perf_event_max_stack (127 by default), as perf's do.
    #[arg(long, default_value_t = DEFAULT_MAX_STACK_LENGTH, allow_negative_numbers = true)]
    max_stack_length: i64,

    /// Keep threads apart: each thread's stacks under its own frame below the process.
    #[arg(long)]
    per_thread: bool,

    /// Show source file:line on frames that have debug info.
    #[arg(long)]
    line_numbers: bool,

    /// Measure the kernel program's own run time (turns on BPF statistics system-wide
    /// while bpfprof runs).
    #[arg(long)]
    bpf_stats: bool,

    /// How user stacks are walked: auto (CFI tables from .eh_frame where an object has them,
    /// frame pointers elsewhere), fp (frame pointers only), or cfi (as auto, but failing to
    /// load a target's tables is an error).
    #[arg(long, value_enum, default_value_t = bpfprof::unwind::UnwindMode::default())]
    unwind: bpfprof::unwind::UnwindMode,

    /// Most kernel memory for CFI unwind tables, in MiB (8 bytes a row: libc takes 0.2, a
    /// 430 MB libtorch_cpu.so 20). The array is sized from what the targets map, within this
    /// cap; past it, the objects sampled most recently keep their tables and the others
    /// unwind by frame pointer, with a warning.
    #[arg(long, default_value_t = bpfprof::unwind::DEFAULT_TABLE_MIB)]
    unwind_table_mib: u32,

    /// Python frames: auto (read from every CPython 3.10-3.13 process the kernel samples,
    /// and shown in place of the interpreter's `_PyEval_EvalFrameDefault`) or off.
    #[arg(long, value_enum, default_value_t = bpfprof::python::stacks::PythonMode::default())]
    python: bpfprof::python::stacks::PythonMode,

    /// Keep the interpreter's own C frames between Python frames (folded away by default).
    #[arg(long)]
    python_glue: bool,

    /// Put `[GIL held]` or `[GIL not held]` at the root of each Python stack: whether the
    /// sampled thread held CPython's global interpreter lock.
    #[arg(long)]
    python_gil: bool,

    /// Print nothing but errors.
    #[arg(short, long, conflicts_with = "verbose")]
    quiet: bool,

    /// Say more about what bpfprof does (repeat for debug output).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,

    /// With --pid: also profile the children each target forks during the run (and theirs),
    /// as perf's --inherit does. On by default for a command after --.
    #[arg(long, conflicts_with = "no_inherit")]
    follow_children: bool,

    /// With a command after --: profile only the command's own process, not its children.
    #[arg(long)]
    no_inherit: bool,

    /// Command to launch and profile until it exits.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

const EXIT_CODES: &str = "Exit codes: 0 done; 2 usage; 3 no such process; 4 permission denied; \
5 invalid sampling settings; 6 output not writable; 7 target exited before the run ended \
(profile written); 8 event not supported here; 9 no such run; 10 daemon unavailable; \
11 too many runs; 12 a doctor check failed; 130 interrupted (profile written); 1 other errors. \
With a command after --, bpfprof exits with the command's own status (128+N when signal N \
ended it), as `time` does; when --duration ends first, the command is stopped with SIGTERM \
(SIGKILL 5 s later) and bpfprof exits 0.";

async fn daemon(args: DaemonArgs) -> Result<i32, Error> {
    let config = DaemonConfig {
        socket: protocol::socket_path(args.socket.as_deref()),
        state_dir: args.state_dir,
        max_runs: args.max_runs.max(1),
        max_runs_per_user: args.max_runs_per_user.max(1),
        keep_runs_per_user: args.keep_runs_per_user,
        idle_timeout: args.client_idle_timeout,
        max_duration: args.max_duration,
        table_mib: args.unwind_table_mib,
        keep_runs: args.keep_runs,
        keep_age: args.keep_age,
    };
    bpfprof::daemon::serve(config).await?;
    Ok(exit_code::OK)
}

/// Prints `bpfprof doctor`'s checks; exit 12 when any check failed.
fn doctor(args: DoctorArgs) -> Result<i32, Error> {
    let report = bpfprof::cli::doctor::run(args.socket.as_deref());
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(anyhow::Error::from)?
        );
    } else {
        print!("{}", report.render());
    }
    Ok(if report.failed() {
        exit_code::DOCTOR_FAILED
    } else {
        exit_code::OK
    })
}

/// Runs a client command against the daemon; failures map to exit codes by error code.
fn client_command(command: Command) -> Result<i32, Error> {
    let client_args = match &command {
        Command::Run(args) => &args.client,
        Command::Status(a) | Command::Stop(a) => &a.client,
        Command::Results(a) => &a.client,
        Command::List(a) => a,
        Command::Daemon(_) | Command::Doctor(_) => unreachable!("handled by main"),
    };
    let socket = protocol::socket_path(client_args.socket.as_deref());
    let mut client = Client::connect(Some(&socket)).map_err(Error::from)?;
    let reply = match &command {
        Command::Run(args) => {
            let spec: TargetSpec = args.pid.parse()?;
            let (pid, pid_ns) = match spec {
                TargetSpec::Pid(pid) => (pid, None),
                TargetSpec::NsPid { ns, pid } => (pid, Some(ns)),
            };
            let mut tags = std::collections::BTreeMap::new();
            for t in &args.tags {
                let (k, v) = split_tag(t)?;
                tags.insert(k.to_string(), v.to_string());
            }
            let request = RunRequest {
                pid,
                pid_ns,
                event: args.event.clone(),
                sample_interval: args.sample_interval,
                frequency: args.frequency,
                duration_ms: args.duration_ms,
                sample_tags: args.sample_tags.clone(),
                tags,
                max_stack_length: args.max_stack_length,
                formats: args.formats.clone(),
                follow_children: args.follow_children,
                unwind: args.unwind.map(|m| m.name().to_string()),
                python: args.python.map(|m| m.name().to_string()),
            };
            let started = client.run(request).map_err(Error::from)?;
            if args.run_async {
                started
            } else {
                let id = started.run_id.unwrap_or_default();
                let wait = Duration::from_millis(args.duration_ms.unwrap_or(600_000) + 60_000);
                client.results(id, wait).map_err(Error::from)?
            }
        }
        Command::Status(a) => client.status(a.run_id).map_err(Error::from)?,
        Command::Stop(a) => client.stop(a.run_id).map_err(Error::from)?,
        Command::Results(a) => {
            let mut reply = client
                .results(a.run_id, a.wait.unwrap_or_default())
                .map_err(Error::from)?;
            if let Some(dir) = &a.copy_to {
                let files = reply.files.clone().unwrap_or_default();
                let copied =
                    bpfprof::cli::results::copy_results(&mut client, a.run_id, &files, dir)?;
                reply.files = Some(copied);
            }
            reply
        }
        Command::List(_) => Reply {
            runs: Some(client.list().map_err(Error::from)?),
            ..Reply::ok()
        },
        Command::Daemon(_) | Command::Doctor(_) => unreachable!("handled by main"),
    };
    if client_args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reply).map_err(anyhow::Error::from)?
        );
        return Ok(exit_code::OK);
    }
    match &command {
        Command::Run(args) if args.run_async => {
            println!("Run Id: {}", reply.run_id.unwrap_or_default());
        }
        Command::Status(_) | Command::Stop(_) => {
            println!(
                "Profile run status: {}",
                reply.state.map(|s| s.to_string()).unwrap_or_default()
            );
            if let Some(reason) = &reply.reason {
                println!("Reason: {reason}");
            }
        }
        Command::List(_) => {
            println!(
                "{:>6}  {:<10}  {:>8}  {:>8}  {:<16}  tags",
                "run", "state", "samples", "pid", "comm"
            );
            for run in reply.runs.iter().flatten() {
                let mut tags: Vec<String> = run.sample_tags.clone();
                tags.extend(run.tags.iter().map(|(k, v)| format!("{k}={v}")));
                println!(
                    "{:>6}  {:<10}  {:>8}  {:>8}  {:<16}  {}",
                    run.run_id,
                    run.state.to_string(),
                    run.samples,
                    run.pid,
                    run.comm,
                    tags.join(",")
                );
            }
        }
        _ => print_results(&reply),
    }
    Ok(exit_code::OK)
}

fn print_results(reply: &Reply) {
    println!("Run Id: {}", reply.run_id.unwrap_or_default());
    println!(
        "Profile run status: {}",
        reply.state.map(|s| s.to_string()).unwrap_or_default()
    );
    if let Some(reason) = &reply.reason {
        println!("Reason: {reason}");
    }
    println!("Total samples: {}", reply.samples.unwrap_or_default());
    for (format, path) in reply.files.iter().flatten() {
        println!("  {format:<13} {path}");
    }
    if let Some(top) = &reply.top {
        let total = reply.samples.unwrap_or(0).max(1) as f64;
        println!("Top functions (self, total):");
        for f in top.iter().take(10) {
            println!(
                "  {:>6.2}% {:>6.2}%  {}",
                100.0 * f.self_samples as f64 / total,
                100.0 * f.total_samples as f64 / total,
                f.name
            );
        }
    }
}

fn main() -> ExitCode {
    // Called `strobeclient` (or `bpfprof strobeclient ...`): PyTorch's strobelight front end.
    let argv: Vec<OsString> = std::env::args_os().collect();
    if let Some(args) = bpfprof::cli::strobeclient::invocation(&argv) {
        return ExitCode::from(bpfprof::cli::strobeclient::main(args) as u8);
    }
    let cli = Cli::parse_from(argv);
    let level = match (cli.record.quiet, cli.record.verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, _) => "debug",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp(None)
        .format_target(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("starting the async runtime: {e}");
            return ExitCode::from(exit_code::FAILURE as u8);
        }
    };
    if !matches!(cli.command, Some(Command::Daemon(_))) {
        // A reader that goes away (`bpfprof list | head -2`) ends the command quietly, as for
        // any Unix filter, instead of a panic on the failed write. The daemon keeps ignoring
        // SIGPIPE: a client hanging up must not kill it.
        // SAFETY: setting a signal disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match cli.command {
        None => runtime.block_on(record(cli.record)),
        Some(Command::Daemon(args)) => runtime.block_on(daemon(args)),
        Some(Command::Doctor(args)) => doctor(args),
        Some(command) => client_command(command),
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

async fn record(cli: RecordArgs) -> Result<i32, Error> {
    let request = SamplingRequest {
        event: cli.event.parse::<EventChoice>()?,
        sample_interval: match cli.sample_interval {
            Some(IntervalArg::Events(n)) => Some(n),
            _ => None,
        },
        sample_period_ns: match cli.sample_interval {
            Some(IntervalArg::TimeNs(ns)) => Some(ns),
            _ => None,
        },
        frequency: cli.frequency,
        fixed_interval: cli.fixed_interval,
    };
    let specs = cli
        .pids
        .iter()
        .map(|p| p.parse::<TargetSpec>())
        .collect::<Result<Vec<_>, _>>()?;
    if specs.is_empty() == cli.command.is_empty() {
        return Err(Error::InvalidTarget {
            spec: String::new(),
            reason: "give either --pid (repeatable) or a command after --, not both or neither"
                .into(),
        });
    }
    let launch = !cli.command.is_empty();
    if cli.no_inherit && !launch {
        return Err(Error::InvalidTarget {
            spec: String::new(),
            reason: "--no-inherit applies to a command after --; --pid targets are followed \
                     into their children only with --follow-children"
                .into(),
        });
    }
    let follow_children = if launch {
        !cli.no_inherit
    } else {
        cli.follow_children
    };
    let tags = cli
        .tags
        .iter()
        .map(|t| split_tag(t))
        .collect::<Result<Vec<_>, _>>()?;
    let validated = RecordingRequest::validate(
        request,
        follow_children,
        cli.duration,
        cli.max_duration,
        TagsAndStacks {
            sample_tags: &cli.sample_tags,
            tags,
            max_stack_length: Some(cli.max_stack_length),
            per_thread: cli.per_thread,
            line_numbers: cli.line_numbers,
            python: bpfprof::python::stacks::MergeOptions {
                keep_glue: cli.python_glue,
                show_gil: cli.python_gil,
            },
        },
        Walks {
            unwind: cli.unwind,
            python: cli.python,
            table_mib: cli.unwind_table_mib,
        },
    )?;
    let options = validated.options.clone();
    bpfprof::kernel::check_privileges()?;
    // Outputs are created before sampling so that a bad path fails before any work is done.
    let mut outputs = open_outputs(&cli)?;
    let recorder = if launch {
        Recorder::launch(&validated, &cli.command, cli.bpf_stats)
    } else {
        Recorder::attach(&validated, &specs, cli.bpf_stats)
    };
    let mut recorder = match recorder {
        Ok(r) => r,
        Err(e) => {
            outputs.into_iter().for_each(Output::discard);
            return Err(e);
        }
    };
    // Symbols are loaded and sampled addresses resolved while the run goes on, so that the
    // profile is out soon after the end of --duration.
    let symbolizer = SymbolizerThread::spawn()
        .map_err(|e| Error::Other(anyhow::anyhow!("starting the symbolizer thread: {e}")))?;
    let line_numbers = options.line_numbers;
    symbolizer
        .run(move |s| s.set_start_lines(line_numbers))
        .await
        .map_err(|e| Error::Other(anyhow::anyhow!(e)))?;
    recorder.set_warm(symbolizer.warm_sink());
    if !cli.quiet {
        if let Some(sampling) = recorder.sampling() {
            // The program id lets a user find the program with `bpftool prog show id N`.
            eprintln!(
                "bpfprof: loaded program id {}; sampling with {}",
                recorder.program_id(),
                sampling.describe()
            );
        }
    }
    let bar = progress_bar(cli.quiet, cli.duration.is_none());
    let stop = StopConditions {
        duration: cli.duration,
        max_duration: cli.max_duration,
    };
    let end = recorder
        .run(stop, |p: Progress| {
            bar.set_message(format!(
                "{:.1}s  {} samples",
                p.elapsed.as_secs_f64(),
                p.samples
            ))
        })
        .await?;
    bar.finish_and_clear();
    let (collected, outcome) = recorder.finish(end)?;
    let profile = symbolizer
        .run(move |s| collected.assemble(end, s, &options))
        .await
        .map_err(|e| Error::Other(anyhow::anyhow!(e)))?;
    for output in outputs.drain(..) {
        let path = output.path().map(|p| p.display().to_string());
        let format = output.format();
        output.write(&profile)?;
        if let (false, Some(path)) = (cli.quiet, path) {
            eprintln!("bpfprof: wrote {format} to {path}");
        }
    }
    if !cli.quiet {
        eprint!("{}", summary(&profile));
    }
    if let Some(outcome) = outcome {
        return Ok(command_exit(outcome, cli.quiet));
    }
    Ok(match end {
        RunEnd::Completed => exit_code::OK,
        RunEnd::TargetExited => {
            if cli.duration.is_some() || !cli.quiet {
                eprintln!(
                    "bpfprof: the target exited after {:.1}s; the profile holds what was sampled until then",
                    profile.meta.duration.as_secs_f64()
                );
            }
            exit_code::TARGET_EXITED
        }
        RunEnd::Interrupted => exit_code::INTERRUPTED,
    })
}

/// The exit code of a launch-mode run: the command's own status, as `time` and `perf stat`
/// pass it through; 0 when bpfprof stopped it at the end of --duration.
fn command_exit(outcome: CommandOutcome, quiet: bool) -> i32 {
    match outcome {
        CommandOutcome::Exited(status) => {
            let code = CommandOutcome::exit_code(status);
            if code != 0 && !quiet {
                eprintln!("bpfprof: the command {status}; exiting with its status {code}");
            }
            code
        }
        CommandOutcome::StoppedAtDuration(status) => {
            if !quiet {
                eprintln!("bpfprof: --duration ended before the command; stopped it ({status})");
            }
            exit_code::OK
        }
        CommandOutcome::Interrupted(_) => exit_code::INTERRUPTED,
    }
}

/// Opens every requested output, so that a bad path or format fails before sampling.
fn open_outputs(cli: &RecordArgs) -> Result<Vec<Output>, Error> {
    let fallback = cli
        .format
        .as_deref()
        .map(str::parse::<Format>)
        .transpose()?;
    let mut outputs = Vec::new();
    if cli.outputs.is_empty() {
        match fallback {
            Some(Format::Top) => outputs.push(Output::stdout(Format::Top)),
            Some(format) => {
                let path = PathBuf::from(format!("bpfprof.{}", format.extension()));
                outputs.push(Output::create(&path, format)?);
            }
            None => outputs.push(Output::create(Path::new("bpfprof.svg"), Format::Svg)?),
        }
    }
    if let (Some(format), false) = (fallback, cli.outputs.is_empty()) {
        if cli.outputs.iter().all(|p| Format::from_path(p).is_some()) {
            return Err(Error::InvalidOutput(format!(
                "--format {format} is not used: every --output names its format by its \
                 extension (--format applies to outputs without one)"
            )));
        }
    }
    for path in &cli.outputs {
        if path.is_dir() {
            return Err(Error::InvalidOutput(format!(
                "{} is a directory; give a file name such as {}",
                path.display(),
                path.join("profile.svg").display()
            )));
        }
        let format = Format::from_path(path).or(fallback).ok_or_else(|| {
            Error::InvalidOutput(format!(
                "cannot tell the format of {} from its extension: add --format",
                path.display()
            ))
        })?;
        outputs.push(Output::create(path, format)?);
    }
    if let Some(path) = &cli.summary_json {
        outputs.push(Output::create(path, Format::SummaryJson)?);
    }
    Ok(outputs)
}

fn progress_bar(quiet: bool, until_interrupted: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    let template = if until_interrupted {
        "{spinner} sampling  {msg}  (Ctrl-C to stop)"
    } else {
        "{spinner} sampling  {msg}"
    };
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

fn read_sysctl(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

fn summary(profile: &Profile) -> String {
    let meta = &profile.meta;
    let targets: Vec<String> = meta
        .targets
        .iter()
        .map(|t| format!("pid {} ({})", t.pid, t.comm))
        .collect();
    let mut out = format!(
        "bpfprof: {} samples in {:.2}s from {} with {}\n  effective rate: {:.1} samples/s\n",
        profile.total_samples(),
        meta.duration.as_secs_f64(),
        targets.join(", "),
        meta.sampling.describe(),
        effective_hz(profile),
    );
    if !meta.tags.is_empty() {
        out.push_str(&format!("  tags: {}\n", meta.tag_list(", ")));
    }
    let cost = &meta.cost;
    let mib = cost.profiler_peak_rss_bytes as f64 / (1024.0 * 1024.0);
    out.push_str(&match cost.scope {
        CostScope::Process => format!(
            "  bpfprof itself: {:.2}s CPU, {mib:.1} MiB peak memory",
            cost.profiler_cpu_secs
        ),
        CostScope::DaemonRun => format!(
            "  bpfprof daemon: {:.2}s CPU on this run, {mib:.1} MiB daemon peak memory (all runs)",
            cost.profiler_cpu_secs
        ),
    });
    match cost.bpf_ns_per_run() {
        Some(ns) => out.push_str(&format!("; kernel program {ns:.0} ns per run\n")),
        None => out.push('\n'),
    }
    match meta.throttled {
        Some(t) if t.cause == ShortfallCause::KernelThrottling => out.push_str(&format!(
            "  throttled by the kernel: {:.0}% of the {} samples asked for (all CPUs) were \
             taken (kernel.perf_event_max_sample_rate {}, kernel.perf_cpu_time_max_percent {}); \
             ask for a lower rate\n",
            100.0 * t.taken_share(),
            t.expected_samples,
            read_sysctl("perf_event_max_sample_rate"),
            read_sysctl("perf_cpu_time_max_percent"),
        )),
        Some(t) => out.push_str(&format!(
            "  sampling fell short: {:.0}% of the {} samples asked for (all CPUs) were taken, \
             well below the kernel's limits: timer interrupts came late (a loaded machine, or \
             a VM waiting for its host)\n",
            100.0 * t.taken_share(),
            t.expected_samples,
        )),
        None => {}
    }
    let unwound = meta.unwound;
    if unwound.cfi_stacks > 0 {
        out.push_str(&format!(
            "  user stacks: {} walked by the CFI walker ({} frames of them by frame pointer, where \
             no table covered the code), {} by frame pointers alone\n",
            unwound.cfi_stacks,
            unwound.frame_pointer_frames_in_cfi_stacks,
            unwound.frame_pointer_stacks
        ));
    }
    if unwound.stacks_through_untabled > 0 {
        let largest: Vec<String> = meta
            .untabled
            .iter()
            .take(3)
            .map(|o| format!("{} ({} samples: {})", o.name, o.samples, o.why))
            .collect();
        out.push_str(&format!(
            "  {} stacks ran through objects without an unwind table, walked there by frame \
             pointer: {}\n",
            unwound.stacks_through_untabled,
            largest.join("; ")
        ));
    }
    if cost.unwind_tables_built > 0 {
        out.push_str(&format!(
            "  unwind tables: {} built ({:.1} MiB, {:.0} ms on the build thread), {:.1} of {:.0} MiB \
             of kernel memory in use\n",
            cost.unwind_tables_built,
            (cost.unwind_rows_built * 8) as f64 / (1024.0 * 1024.0),
            cost.unwind_build_secs * 1e3,
            cost.unwind_resident_bytes as f64 / (1024.0 * 1024.0),
            cost.unwind_array_bytes as f64 / (1024.0 * 1024.0)
        ));
    }
    if unwound.before_walker_ready > 0 {
        out.push_str(&format!(
            "  {} stacks were taken by frame pointers while the CFI walker was still loading\n",
            unwound.before_walker_ready
        ));
    }
    if unwound.python_stacks + unwound.python_stacks_missing > 0 {
        out.push_str(&format!(
            "  Python frames: read in {} samples, not readable in {}; {} code objects named in {:.0} ms\n",
            unwound.python_stacks,
            unwound.python_stacks_missing,
            meta.cost.python_code_objects,
            meta.cost.python_naming_secs * 1e3
        ));
    }
    let losses = meta.losses.nonzero();
    if losses.is_empty() {
        out.push_str("  lost: none\n");
    } else {
        let list: Vec<String> = losses.iter().map(|(k, n)| format!("{k} {n}")).collect();
        out.push_str(&format!("  lost or incomplete: {}\n", list.join(", ")));
    }
    out.push_str(&top::render(profile, 10));
    out
}
