//! `bpfprof`: the command line over the bpfprof library.

use std::{
    ffi::OsString,
    io::IsTerminal,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use bpfprof::{
    aggregate::{AggregateOptions, Profile, RunEnd, Tag},
    client::{Client, ClientError},
    daemon::DaemonConfig,
    error::{exit_code, Error},
    output::{summary::effective_hz, top, Format, Output},
    protocol::{self, Reply, RunRequest},
    record::{Progress, Recorder, StopConditions},
    sampling::{validate_max_stack_length, EventChoice, KernelLimits, SamplingRequest},
    symbolize::Symbolizer,
    target::TargetSpec,
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
}

#[derive(Args, Debug)]
struct DaemonArgs {
    /// Socket to listen on [env: BPFPROF_SOCKET] [default: /run/bpfprof/bpfprof.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Where runs and their results are kept.
    #[arg(long, default_value = "/var/lib/bpfprof")]
    state_dir: PathBuf,
    /// Most runs sampling at once.
    #[arg(long, default_value_t = 16)]
    max_runs: usize,
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
    /// Deepest stack kept.
    #[arg(long, allow_negative_numbers = true)]
    max_stack_length: Option<i64>,
    /// Formats to write (default: svg, folded, pprof, speedscope, pstats).
    #[arg(long, value_delimiter = ',')]
    formats: Option<Vec<String>>,
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

    /// Sampling period in event units: cycles (default 10000000), or nanoseconds for cpu-clock.
    #[arg(long, allow_negative_numbers = true, conflicts_with = "frequency")]
    sample_interval: Option<i64>,

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

    /// Deepest stack kept, in frames (leaf-most frames are kept; cut stacks get a
    /// `[truncated]` root frame). At most kernel.perf_event_max_stack.
    #[arg(long, default_value_t = 127, allow_negative_numbers = true)]
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

    /// Print nothing but errors.
    #[arg(short, long)]
    quiet: bool,

    /// Command to launch and profile until it exits.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

const EXIT_CODES: &str = "Exit codes: 0 done; 2 usage; 3 no such process; 4 permission denied; \
5 invalid sampling settings; 6 output not writable; 7 target exited before the run ended \
(profile written); 8 event not supported here; 9 no such run; 10 daemon unavailable; \
11 too many runs; 130 interrupted (profile written); 1 other errors.";

async fn daemon(args: DaemonArgs) -> Result<i32, Error> {
    let config = DaemonConfig {
        socket: protocol::socket_path(args.socket.as_deref()),
        state_dir: args.state_dir,
        max_runs: args.max_runs.max(1),
        max_duration: args.max_duration,
        keep_runs: args.keep_runs,
        keep_age: args.keep_age,
    };
    bpfprof::daemon::serve(config).await?;
    Ok(exit_code::OK)
}

/// Runs a client command against the daemon; failures map to exit codes by error code.
fn client_command(command: Command) -> Result<i32, Error> {
    let client_args = match &command {
        Command::Run(args) => &args.client,
        Command::Status(a) | Command::Stop(a) => &a.client,
        Command::Results(a) => &a.client,
        Command::List(a) => a,
        Command::Daemon(_) => unreachable!("handled by main"),
    };
    let socket = protocol::socket_path(client_args.socket.as_deref());
    let mut client = Client::connect(Some(&socket)).map_err(client_error)?;
    let reply = match &command {
        Command::Run(args) => {
            let spec: TargetSpec = args.pid.parse()?;
            let (pid, pid_ns) = match spec {
                TargetSpec::Pid(pid) => (pid, None),
                TargetSpec::NsPid { ns, pid } => (pid, Some(ns)),
            };
            let mut tags = std::collections::BTreeMap::new();
            for t in &args.tags {
                let (k, v) = t
                    .split_once('=')
                    .ok_or_else(|| Error::InvalidTag(format!("--tag {t:?} must be KEY=VALUE")))?;
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
            };
            let started = client.run(request).map_err(client_error)?;
            if args.run_async {
                started
            } else {
                let id = started.run_id.unwrap_or_default();
                let wait = Duration::from_millis(args.duration_ms.unwrap_or(600_000) + 60_000);
                client.results(id, wait).map_err(client_error)?
            }
        }
        Command::Status(a) => client.status(a.run_id).map_err(client_error)?,
        Command::Stop(a) => client.stop(a.run_id).map_err(client_error)?,
        Command::Results(a) => {
            let mut reply = client
                .results(a.run_id, a.wait.unwrap_or_default())
                .map_err(client_error)?;
            if let Some(dir) = &a.copy_to {
                let mut copied = std::collections::BTreeMap::new();
                for format in reply.files.iter().flatten().map(|(f, _)| f.clone()) {
                    let bytes = client
                        .read_result(a.run_id, &format)
                        .map_err(client_error)?;
                    let name = std::path::Path::new(&reply.files.as_ref().unwrap()[&format])
                        .file_name()
                        .map(|n| n.to_os_string())
                        .unwrap_or_else(|| format.clone().into());
                    let path = dir.join(name);
                    std::fs::write(&path, bytes).map_err(|source| Error::Output {
                        path: path.clone(),
                        source,
                    })?;
                    copied.insert(format, path.display().to_string());
                }
                reply.files = Some(copied);
            }
            reply
        }
        Command::List(_) => Reply {
            runs: Some(client.list().map_err(client_error)?),
            ..Reply::ok()
        },
        Command::Daemon(_) => unreachable!("handled by main"),
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

fn client_error(e: ClientError) -> Error {
    match e {
        ClientError::Refused { code, message } => Error::Daemon { code, message },
        e @ ClientError::Unavailable { .. } => Error::DaemonUnavailable(format!(
            "{e} (start it with `sudo bpfprof daemon`, or point --socket/BPFPROF_SOCKET at it)"
        )),
        other => Error::Other(anyhow::Error::from(other)),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = if cli.record.quiet { "error" } else { "info" };
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
    let result = match cli.command {
        None => runtime.block_on(record(cli.record)),
        Some(Command::Daemon(args)) => runtime.block_on(daemon(args)),
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
        sample_interval: cli.sample_interval,
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
    let mut tags = Vec::new();
    for t in &cli.sample_tags {
        tags.push(Tag::new(Tag::BARE_KEY, t).map_err(Error::InvalidTag)?);
    }
    for t in &cli.tags {
        if !t.contains('=') {
            return Err(Error::InvalidTag(format!("--tag {t:?} must be KEY=VALUE")));
        }
        tags.push(Tag::parse(t).map_err(Error::InvalidTag)?);
    }
    let options = AggregateOptions {
        per_thread: cli.per_thread,
        max_stack_length: validate_max_stack_length(cli.max_stack_length)?,
        line_numbers: cli.line_numbers,
        tags,
    };
    bpfprof::kernel::check_privileges()?;
    let plan = request.plan(&KernelLimits::read())?;
    // Outputs are created before sampling so that a bad path fails before any work is done.
    let mut outputs = open_outputs(&cli)?;
    bpfprof::unwind::set_default_mode(cli.unwind);
    let recorder = if cli.command.is_empty() {
        Recorder::attach(&plan, &specs, cli.bpf_stats)
    } else {
        Recorder::launch(&plan, &cli.command, cli.bpf_stats)
    };
    let mut recorder = match recorder {
        Ok(r) => r,
        Err(e) => {
            outputs.into_iter().for_each(Output::discard);
            return Err(e);
        }
    };
    let bar = progress_bar(cli.quiet);
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
    let mut symbolizer = Symbolizer::new();
    let profile = recorder.finish(end, &mut symbolizer, &options)?;
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
    for path in &cli.outputs {
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

fn progress_bar(quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} sampling  {msg}  (Ctrl-C to stop)")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
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
    out.push_str(&format!(
        "  bpfprof itself: {:.2}s CPU, {:.1} MiB peak memory",
        cost.profiler_cpu_secs,
        cost.profiler_peak_rss_bytes as f64 / (1024.0 * 1024.0)
    ));
    match cost.bpf_ns_per_run() {
        Some(ns) => out.push_str(&format!("; kernel program {ns:.0} ns per run\n")),
        None => out.push('\n'),
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
