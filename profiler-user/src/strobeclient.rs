//! A `strobeclient`-compatible front end over the daemon, so that PyTorch's strobelight
//! profilers (`torch._strobelight.cli_function_profiler`, `TORCH_COMPILE_STROBELIGHT=1`) run on
//! bpfprof unchanged.
//!
//! PyTorch runs three command lines and reads their **stderr** with regular expressions:
//!
//! * `run --profiler pyperf --event cycles --async --sample-interval N --duration-ms MS
//!   --pid NS:PID [--sample-tags a,b]` → `INFO Run Id: (-?\d+)`;
//! * `getRunStatus --run-id N` → `Profile run status: (.*)` (`PREPARING`/`RUNNING` while it
//!   waits to start) and, after the stop, `INFO ::1:(.*)` holding either
//!   `Profile run status: PROCESSING` (it asks again) or `Profile run finished with SUCCESS`,
//!   followed by the `Total samples`, `GraphProfiler` and `Icicle view (python stack)` lines it
//!   logs for its user;
//! * `stopRun --run-id N` → `INFO ::1:(.*)` containing `Success!`.
//!
//! The binary becomes this front end when it is called `strobeclient` (a symlink) or as
//! `bpfprof strobeclient ...`; see [`invocation`].

use std::{
    ffi::OsString,
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::{Args, Parser, Subcommand};

use crate::{
    client::{Client, ClientError},
    error::{exit_code, Error},
    protocol::{self, Reply, RunRequest, RunState},
    sampling::{EventChoice, KernelLimits, SamplingRequest},
    target::TargetSpec,
};

/// The name this front end answers to, as argv[0] or as bpfprof's first argument.
pub const NAME: &str = "strobeclient";
/// The only `--profiler` strobelight names that bpfprof serves.
const PYPERF: &str = "pyperf";
/// Longest run a `run` without `--async` waits for, beyond its duration, for the results.
const RESULTS_GRACE: Duration = Duration::from_secs(60);
/// Longest stopRun waits for the run to end (results written) after asking it to stop.
const STOP_WAIT: Duration = Duration::from_secs(30);
/// Default run length when `--duration-ms` is not given: the daemon's maximum.
const DEFAULT_DURATION_MS: u64 = 600_000;

/// The strobelight client command line that PyTorch drives.
#[derive(Parser, Debug)]
#[command(
    name = NAME,
    version,
    about = "strobelight's client command line over the bpfprof daemon (for PyTorch's \
             strobelight profilers). Output goes to stderr."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start profiling a process; prints `INFO Run Id: N`.
    Run(RunArgs),
    /// Print a run's state, and its results once it has finished.
    #[command(name = "getRunStatus")]
    GetRunStatus(RunIdArgs),
    /// Stop a run; its results are still written.
    #[command(name = "stopRun")]
    StopRun(RunIdArgs),
}

#[derive(Args, Debug)]
struct SocketArgs {
    /// The daemon's socket [env: BPFPROF_SOCKET] [default: /run/bpfprof/bpfprof.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct RunIdArgs {
    /// The run.
    #[arg(long, allow_negative_numbers = true)]
    run_id: i64,
    #[command(flatten)]
    socket: SocketArgs,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Which strobelight profiler: only `pyperf` (Python functions through CPython's perf
    /// trampolines, else native stacks).
    #[arg(long)]
    profiler: String,
    /// `cycles` (cpu-clock at the equivalent rate where there is no PMU), `cpu-clock` or `auto`.
    #[arg(long, default_value = "cycles")]
    event: String,
    /// Return once the run samples, printing its id (otherwise wait for its results).
    #[arg(long = "async")]
    run_async: bool,
    /// Sampling period in event units (cycles, or ns for cpu-clock).
    #[arg(long, allow_negative_numbers = true)]
    sample_interval: Option<i64>,
    /// Length of the run in milliseconds.
    #[arg(long)]
    duration_ms: Option<u64>,
    /// Process to profile: NS:PID (NS the inode of /proc/PID/ns/pid) or PID.
    #[arg(long, value_name = "NS:PID")]
    pid: String,
    /// Tags stored with every sample, comma-separated.
    #[arg(long, value_delimiter = ',')]
    sample_tags: Vec<String>,
    #[command(flatten)]
    socket: SocketArgs,
}

/// The arguments to hand to [`main`] when this process was started as the strobelight
/// client: argv itself when argv[0]'s file name is `strobeclient`, argv without its first
/// element when argv[1] is `strobeclient`; `None` otherwise.
pub fn invocation(args: &[OsString]) -> Option<Vec<OsString>> {
    let invoked_as = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n == NAME);
    if invoked_as {
        Some(args.to_vec())
    } else if args.get(1).is_some_and(|a| a == NAME) {
        Some(args[1..].to_vec())
    } else {
        None
    }
}

/// Runs the strobelight client with `args` (argv, the program name first) and returns the
/// process exit code; everything it says goes to stderr, as strobelight's client does.
pub fn main(args: Vec<OsString>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version are not errors; clap picks the stream and the code.
            let _ = e.print();
            return e.exit_code();
        }
    };
    let mut err = std::io::stderr().lock();
    let result = match cli.command {
        Command::Run(args) => run(&args, &mut err),
        Command::GetRunStatus(args) => get_run_status(&args, &mut err),
        Command::StopRun(args) => stop_run(&args, &mut err),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(err, "ERROR {e}");
            e.exit_code()
        }
    }
}

fn connect(socket: &SocketArgs) -> Result<Client, Error> {
    let path = protocol::socket_path(socket.socket.as_deref());
    Client::connect(Some(&path)).map_err(Error::from)
}

/// The daemon's run id for a strobelight run id (which PyTorch parses as possibly negative).
fn run_id(id: i64) -> Result<u64, Error> {
    u64::try_from(id).map_err(|_| Error::Daemon {
        code: protocol::ErrorCode::NotFound,
        message: format!("no run {id}"),
    })
}

fn run(args: &RunArgs, err: &mut impl Write) -> Result<i32, Error> {
    if args.profiler != PYPERF {
        return Err(Error::Usage(format!(
            "unknown --profiler {:?}: bpfprof serves only --profiler {PYPERF} (a CPU profile \
             of the process)",
            args.profiler
        )));
    }
    let choice: EventChoice = args.event.parse()?;
    let spec: TargetSpec = args.pid.parse()?;
    let (pid, pid_ns) = match spec {
        TargetSpec::Pid(pid) => (pid, None),
        TargetSpec::NsPid { ns, pid } => (pid, Some(ns)),
    };
    // strobelight's `cycles` is what PyTorch always asks for; bpfprof's `auto` is exactly
    // "cycles where there is a PMU, else cpu-clock at the same rate". The plain bpfprof CLI
    // keeps `cycles` strict.
    let event = match choice {
        EventChoice::Cycles => {
            event_notice(args.sample_interval, err)?;
            EventChoice::Auto
        }
        other => other,
    };
    let _ = writeln!(
        err,
        "INFO --profiler {PYPERF}: Python functions are read from the interpreter's frames \
         (CPython 3.10 to 3.13, no restart or -X perf needed); other Pythons show the \
         interpreter's C frames"
    );
    let duration_ms = args.duration_ms.unwrap_or(DEFAULT_DURATION_MS);
    let request = RunRequest {
        pid,
        pid_ns,
        event: Some(event_name(event).into()),
        sample_interval: args.sample_interval,
        duration_ms: Some(duration_ms),
        sample_tags: args.sample_tags.clone(),
        // strobelight's command line has no unwinder choice: the environment gives it, as for
        // phase profilers; the daemon refuses unknown modes.
        unwind: std::env::var(crate::client::UNWIND_ENV)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty()),
        ..RunRequest::default()
    };
    let mut client = connect(&args.socket)?;
    let started = match client.run(request.clone()) {
        // PyTorch's compile-time profiler asks for 30 minutes, longer than the daemon's
        // longest run: take the longest the daemon allows (no duration) instead of failing.
        Err(ClientError::Refused {
            code: protocol::ErrorCode::BadRequest,
            message,
        }) if duration_ms > 0 && message.contains("duration_ms") => {
            let _ = writeln!(
                err,
                "INFO --duration-ms {duration_ms} is longer than the daemon allows ({message}); \
                 the run lasts the daemon's longest unless stopped first"
            );
            client
                .run(RunRequest {
                    duration_ms: None,
                    ..request
                })
                .map_err(Error::from)?
        }
        other => other.map_err(Error::from)?,
    };
    let id = started.run_id.unwrap_or_default();
    let _ = writeln!(err, "INFO Run Id: {id}");
    if args.run_async {
        return Ok(exit_code::OK);
    }
    let wait = Duration::from_millis(duration_ms) + RESULTS_GRACE;
    let reply = client.results(id, wait).map_err(Error::from)?;
    report(&mut client, &reply, err)
}

fn event_name(choice: EventChoice) -> &'static str {
    match choice {
        EventChoice::Auto => "auto",
        EventChoice::Cycles => "cycles",
        EventChoice::CpuClock => "cpu-clock",
    }
}

/// Says on stderr which event a `--event cycles` run will really use.
fn event_notice(sample_interval: Option<i64>, err: &mut impl Write) -> Result<(), Error> {
    let plan = SamplingRequest {
        event: EventChoice::Auto,
        sample_interval,
        ..SamplingRequest::default()
    }
    .plan(&KernelLimits::read())?;
    let Some(clock) = plan.cpu_clock else {
        return Ok(());
    };
    let _ = match crate::perf_events::cycles_available() {
        Some(true) => Ok(()),
        Some(false) => writeln!(
            err,
            "INFO --event cycles: sampling with {}",
            clock.describe()
        ),
        None => writeln!(
            err,
            "INFO --event cycles: sampling cycles where this machine has a PMU, else cpu-clock \
             at the equivalent {:.0} Hz",
            clock.nominal_hz
        ),
    };
    Ok(())
}

fn get_run_status(args: &RunIdArgs, err: &mut impl Write) -> Result<i32, Error> {
    let id = run_id(args.run_id)?;
    let mut client = connect(&args.socket)?;
    let status = client.status(id).map_err(Error::from)?;
    if status.state.is_some_and(RunState::is_final) {
        let reply = client.results(id, Duration::ZERO).map_err(Error::from)?;
        return report(&mut client, &reply, err);
    }
    let state = status.state.map(|s| s.to_string()).unwrap_or_default();
    let _ = writeln!(err, "INFO ::1: Profile run status: {state}");
    let _ = writeln!(err, "INFO Samples so far: {}", status.samples.unwrap_or(0));
    Ok(exit_code::OK)
}

fn stop_run(args: &RunIdArgs, err: &mut impl Write) -> Result<i32, Error> {
    let id = run_id(args.run_id)?;
    let mut client = connect(&args.socket)?;
    let stopped = client.stop(id).map_err(Error::from)?;
    // The daemon takes the stop asynchronously. Waiting here for the run to end (its results
    // written) means PyTorch's next getRunStatus sees SUCCESS at once, instead of PROCESSING
    // and a 10 s sleep per profiled function; a run still processing after the wait is
    // reported PROCESSING there, which PyTorch retries.
    let reply = if stopped.state.is_some_and(|s| !s.is_final()) {
        client.results(id, STOP_WAIT).map_err(Error::from)?
    } else {
        stopped
    };
    match reply.state {
        Some(RunState::Failed) => {
            let _ = writeln!(
                err,
                "INFO ::1: Run {id} had failed: {}",
                reply.reason.as_deref().unwrap_or("no reason given")
            );
            Ok(exit_code::FAILURE)
        }
        state => {
            let state = state.map(|s| s.to_string()).unwrap_or_default();
            let _ = writeln!(err, "INFO ::1: Success! Run {id} stopped (state {state})");
            Ok(exit_code::OK)
        }
    }
}

/// Prints the end of a run the way strobelight does: `Profile run finished with SUCCESS`
/// (a stopped run ended as asked, so it is a success too) and where the profiles are.
fn report(client: &mut Client, reply: &Reply, err: &mut impl Write) -> Result<i32, Error> {
    let id = reply.run_id.unwrap_or_default();
    let state = reply.state.unwrap_or(RunState::Failed);
    if !state.is_final() {
        let _ = writeln!(err, "INFO ::1: Profile run status: {state}");
        return Ok(exit_code::OK);
    }
    if state == RunState::Failed {
        let _ = writeln!(
            err,
            "INFO ::1: Profile run finished with FAILED: {}",
            reply.reason.as_deref().unwrap_or("no reason given")
        );
        return Ok(exit_code::FAILURE);
    }
    let _ = writeln!(err, "INFO ::1: Profile run finished with SUCCESS");
    if state == RunState::Stopped {
        let _ = writeln!(
            err,
            "INFO run {id} was stopped by stopRun; it holds what was sampled until then"
        );
    }
    if let Some(summary) = &reply.summary {
        if summary["event_fallback"].as_bool() == Some(true) {
            let _ = writeln!(
                err,
                "INFO sampled with {} (no hardware PMU: fell back from cycles)",
                summary["event"].as_str().unwrap_or("cpu-clock")
            );
        }
    }
    let files = readable_files(client, id, reply.files.clone().unwrap_or_default())?;
    let path = |format: &str| {
        files
            .get(format)
            .map(String::as_str)
            .unwrap_or("(not written)")
    };
    let _ = writeln!(err, "INFO Total samples: {}", reply.samples.unwrap_or(0));
    let _ = writeln!(
        err,
        "INFO GraphProfiler: {} {}",
        path("pprof"),
        path("pstats")
    );
    let _ = writeln!(err, "INFO Icicle view (python stack): {}", path("svg"));
    for (format, file) in &files {
        if !matches!(format.as_str(), "pprof" | "pstats" | "svg") {
            let _ = writeln!(err, "INFO {format}: {file}");
        }
    }
    for top in reply.top.iter().flatten().take(5) {
        let _ = writeln!(
            err,
            "INFO top: {} ({} samples, {} with callees)",
            top.name, top.self_samples, top.total_samples
        );
    }
    Ok(exit_code::OK)
}

/// Paths of the run's result files that this user can open: the daemon's own where they are
/// readable (the usual case: they belong to the run's owner), else copies fetched through the
/// socket into the user's cache folder (a daemon whose state folder is out of reach).
fn readable_files(
    client: &mut Client,
    id: u64,
    files: std::collections::BTreeMap<String, String>,
) -> Result<std::collections::BTreeMap<String, String>, Error> {
    if files.values().all(|p| std::fs::File::open(p).is_ok()) {
        return Ok(files);
    }
    let dir = cache_dir()
        .ok_or_else(|| {
            Error::InvalidOutput(
                "the result files are not readable here and neither $XDG_CACHE_HOME nor $HOME \
                 is set to copy them into; use `bpfprof results --run-id N --copy-to DIR`"
                    .into(),
            )
        })?
        .join(id.to_string());
    std::fs::create_dir_all(&dir).map_err(|source| Error::Output {
        path: dir.clone(),
        source,
    })?;
    crate::results::copy_results(client, id, &files, &dir)
}

fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("bpfprof").join("runs"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn dispatches_on_its_own_name_or_first_argument() {
        assert_eq!(
            invocation(&os(&["/usr/local/bin/strobeclient", "stopRun"])),
            Some(os(&["/usr/local/bin/strobeclient", "stopRun"]))
        );
        assert_eq!(
            invocation(&os(&["bpfprof", "strobeclient", "run"])),
            Some(os(&["strobeclient", "run"]))
        );
        assert_eq!(invocation(&os(&["bpfprof", "run", "strobeclient"])), None);
        assert_eq!(invocation(&os(&["bpfprof"])), None);
    }

    #[test]
    fn pytorchs_command_lines_parse() {
        let cli = Cli::try_parse_from([
            "strobeclient",
            "run",
            "--profiler",
            "pyperf",
            "--event",
            "cycles",
            "--async",
            "--sample-interval",
            "10000000",
            "--duration-ms",
            "600000",
            "--pid",
            "4026531836:42",
            "--sample-tags",
            "a,b",
        ])
        .unwrap();
        match cli.command {
            Command::Run(r) => {
                assert!(r.run_async);
                assert_eq!(r.sample_tags, ["a", "b"]);
                assert_eq!(r.pid, "4026531836:42");
            }
            other => panic!("{other:?}"),
        }
        for sub in ["getRunStatus", "stopRun"] {
            assert!(Cli::try_parse_from(["strobeclient", sub, "--run-id", "-1"]).is_ok());
        }
    }

    #[test]
    fn unknown_flags_and_profilers_are_errors() {
        let e = Cli::try_parse_from(["strobeclient", "stopRun", "--run-id", "1", "--bogus"])
            .unwrap_err();
        assert_eq!(e.exit_code(), exit_code::USAGE);
        let args = RunArgs {
            profiler: "jvm".into(),
            event: "cycles".into(),
            run_async: true,
            sample_interval: None,
            duration_ms: None,
            pid: "1".into(),
            sample_tags: vec![],
            socket: SocketArgs { socket: None },
        };
        let e = run(&args, &mut Vec::new()).unwrap_err();
        assert_eq!(e.exit_code(), exit_code::USAGE);
        assert!(e.to_string().contains("pyperf"), "{e}");
        assert!(run_id(-1).is_err());
    }
}
