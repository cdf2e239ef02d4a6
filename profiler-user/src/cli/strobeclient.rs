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
    client::{Client, ClientError, FOLLOW_CHILDREN_ENV},
    error::{exit_code, Error},
    process::target::TargetSpec,
    protocol::{self, Reply, RunRequest, RunState},
    sampling::{EventChoice, KernelLimits, SamplingRequest},
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
const DEFAULT_DURATION_MS: u64 = protocol::MAX_RUN_DURATION.as_millis() as u64;
/// The stack depth PyTorch's compile-time profiler asks for, which strobelight's command line
/// cannot carry: strobeclient reads it from its environment (inherited from PyTorch).
pub const COMPILE_MAX_STACK_LENGTH_ENV: &str = "COMPILE_STROBELIGHT_MAX_STACK_LENGTH";
/// Set (to anything non-empty, as PyTorch tests it) in processes whose `torch.compile` phases
/// PyTorch profiles.
pub const TORCH_COMPILE_ENV: &str = "TORCH_COMPILE_STROBELIGHT";
/// The depth PyTorch's compile-time profiler asks for when `COMPILE_STROBELIGHT_MAX_STACK_LENGTH`
/// is unset (its own default).
const COMPILE_DEFAULT_MAX_STACK_LENGTH: i64 = 500;

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
    /// Most asyncio tasks shown above a sampled task (CPython 3.14+; strobelight's
    /// `async_stack_max_len`, which PyTorch's profilers set); 0 leaves async stacks out.
    #[arg(long)]
    async_stack_max_len: Option<u32>,
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
    let env = RunEnv::from_lookup(|key| std::env::var(key).ok());
    for note in &env.notes {
        let _ = writeln!(err, "INFO {note}");
    }
    let mut request = RunRequest {
        pid,
        pid_ns,
        event: Some(event_name(event).into()),
        sample_interval: args.sample_interval,
        duration_ms: Some(duration_ms),
        sample_tags: args.sample_tags.clone(),
        max_stack_length: env.max_stack_length,
        follow_children: env.follow_children,
        unwind: env.unwind,
        python_async: args.async_stack_max_len,
        ..RunRequest::default()
    };
    let mut client = connect(&args.socket)?;
    // A refusal of what PyTorch asks for but strobelight's own client would have served (a
    // longer run, deeper stacks than the daemon records) takes the daemon's limit instead of
    // failing the profile; each field is dropped at most once, so this ends.
    let started = loop {
        match client.run(request.clone()) {
            Err(ClientError::Refused {
                code: protocol::ErrorCode::BadRequest,
                message,
            }) => {
                if request.duration_ms.is_some() && message.contains("duration_ms") {
                    // PyTorch's compile-time profiler asks for 30 minutes, longer than the
                    // daemon's longest run.
                    let _ = writeln!(
                        err,
                        "INFO --duration-ms {duration_ms} is longer than the daemon allows \
                         ({message}); the run lasts the daemon's longest unless stopped first"
                    );
                    request.duration_ms = None;
                } else if let (Some(depth), true) =
                    (request.max_stack_length, is_stack_length_refusal(&message))
                {
                    let _ = writeln!(
                        err,
                        "INFO a stack depth of {depth} frames is deeper than the daemon records \
                         ({message}); stacks keep their leaf-most frames up to the daemon's \
                         deepest, under a [truncated] root frame"
                    );
                    request.max_stack_length = None;
                } else {
                    return Err(Error::from(ClientError::Refused {
                        code: protocol::ErrorCode::BadRequest,
                        message,
                    }));
                }
            }
            other => break other.map_err(Error::from)?,
        }
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

/// Whether a daemon's refusal is about the requested stack depth.
fn is_stack_length_refusal(message: &str) -> bool {
    message.contains("max-stack-length") || message.contains("max_stack_length")
}

/// What a `run` takes from its environment, which strobelight's command line has no flags for.
#[derive(Debug, Default, PartialEq)]
struct RunEnv {
    /// Deepest stack asked for: `BPFPROF_MAX_STACK_LENGTH`, else
    /// `COMPILE_STROBELIGHT_MAX_STACK_LENGTH`, else PyTorch's compile default in a process
    /// whose compile phases are profiled; `None` is the daemon's default.
    max_stack_length: Option<i64>,
    /// Follow the children the target forks during the run.
    follow_children: bool,
    /// The unwinder (`BPFPROF_UNWIND`); the daemon refuses unknown modes.
    unwind: Option<String>,
    /// What to tell the user about these choices.
    notes: Vec<String>,
}

impl RunEnv {
    /// Reads the environment through `lookup` (empty values count as unset).
    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> RunEnv {
        let get = |key: &str| {
            lookup(key)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let mut env = RunEnv {
            unwind: get(crate::client::UNWIND_ENV),
            ..RunEnv::default()
        };
        let compiling = get(TORCH_COMPILE_ENV).is_some();
        for key in [
            crate::client::MAX_STACK_LENGTH_ENV,
            COMPILE_MAX_STACK_LENGTH_ENV,
        ] {
            let Some(v) = get(key) else { continue };
            match v.parse::<i64>() {
                Ok(n) if n > 0 => {
                    env.max_stack_length = Some(n);
                    break;
                }
                _ => env
                    .notes
                    .push(format!("ignoring {key}={v:?}: not a positive integer")),
            }
        }
        if env.max_stack_length.is_none() && compiling {
            env.max_stack_length = Some(COMPILE_DEFAULT_MAX_STACK_LENGTH);
        }
        // Inductor compiles in child processes (its compile workers): a compile phase's
        // cost is theirs too.
        env.follow_children = compiling;
        // BPFPROF_FOLLOW_CHILDREN decides either way (default: on for compile phases).
        if let Some(v) = get(FOLLOW_CHILDREN_ENV) {
            match crate::client::parse_switch(&v) {
                Some(on) => env.follow_children = on,
                None => env.notes.push(format!(
                    "ignoring {FOLLOW_CHILDREN_ENV}={v:?}: expected 1 or 0"
                )),
            }
        }
        if env.follow_children {
            env.notes.push(format!(
                "following the children the process forks during the run ({}; \
                 {FOLLOW_CHILDREN_ENV}=0 turns it off)",
                if compiling {
                    "TORCH_COMPILE_STROBELIGHT: inductor's compile workers"
                } else {
                    "BPFPROF_FOLLOW_CHILDREN"
                }
            ));
        }
        env
    }
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
    let _ = match crate::kernel::perf_events::cycles_available() {
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
    crate::cli::results::copy_results(client, id, &files, &dir)
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
            "--async-stack-max-len",
            "32",
        ])
        .unwrap();
        match cli.command {
            Command::Run(r) => {
                assert!(r.run_async);
                assert_eq!(r.async_stack_max_len, Some(32));
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
            async_stack_max_len: None,
            socket: SocketArgs { socket: None },
        };
        let e = run(&args, &mut Vec::new()).unwrap_err();
        assert_eq!(e.exit_code(), exit_code::USAGE);
        assert!(e.to_string().contains("pyperf"), "{e}");
        assert!(run_id(-1).is_err());
    }

    fn env_of(vars: &[(&str, &str)]) -> RunEnv {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RunEnv::from_lookup(|key| vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()))
    }

    #[test]
    fn the_environment_gives_depth_children_and_unwinder() {
        assert_eq!(env_of(&[]), RunEnv::default());
        // A compile phase: PyTorch's 500 frames and its compile workers.
        let compile = env_of(&[(TORCH_COMPILE_ENV, "1")]);
        assert_eq!(compile.max_stack_length, Some(500));
        assert!(compile.follow_children);
        assert!(compile.notes[0].contains("compile workers"), "{compile:?}");
        let asked = env_of(&[
            (TORCH_COMPILE_ENV, "1"),
            (COMPILE_MAX_STACK_LENGTH_ENV, "300"),
            (FOLLOW_CHILDREN_ENV, "0"),
        ]);
        assert_eq!(asked.max_stack_length, Some(300));
        assert!(!asked.follow_children);
        // bpfprof's own variable first.
        let ours = env_of(&[
            (crate::client::MAX_STACK_LENGTH_ENV, "64"),
            (COMPILE_MAX_STACK_LENGTH_ENV, "300"),
            (crate::client::UNWIND_ENV, " fp "),
        ]);
        assert_eq!(ours.max_stack_length, Some(64));
        assert_eq!(ours.unwind.as_deref(), Some("fp"));
        assert!(!ours.follow_children);
        let bad = env_of(&[
            (crate::client::MAX_STACK_LENGTH_ENV, "deep"),
            (FOLLOW_CHILDREN_ENV, "maybe"),
        ]);
        assert_eq!(bad.max_stack_length, None);
        assert_eq!(bad.notes.len(), 2, "{bad:?}");
        assert!(is_stack_length_refusal(
            "--max-stack-length 500 is above the 127 frames bpfprof's kernel program collects"
        ));
    }
}
