//! The command line's flags (clap), turned into validated requests by the drivers: the
//! recording's into a [`crate::recording::request::RecordingRequest`], the client commands'
//! into protocol requests, the daemon's into a [`crate::daemon::DaemonConfig`].

use std::{ffi::OsString, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::{
    protocol::MAX_RUN_DURATION_ARG, recording::request::DEFAULT_MAX_STACK_LENGTH,
    sampling::IntervalArg,
};

/// Sample the CPU stacks of running processes with eBPF and write a profile.
#[derive(Parser, Debug)]
#[command(
    name = "bpfprof",
    version,
    about,
    after_help = EXIT_CODES,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// The subcommand, if any.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// A direct recording's flags (when there is no subcommand).
    #[command(flatten)]
    pub record: RecordArgs,
}

/// The subcommands; none means a direct recording.
#[derive(Subcommand, Debug)]
pub enum Command {
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
    /// Profile the whole machine (or one cgroup) all the time at a low rate, in windows,
    /// served as pprof and Prometheus metrics over HTTP (run as root).
    Agent(AgentArgs),
    /// A live view of the functions using the CPU, refreshed every second (as py-spy top
    /// and perf top): keys s/t sort by self/total, i by the last interval or since the start,
    /// p the Python view, q quits.
    Top(TopArgs),
    /// Print every thread's current stack, native and Python, with its name, state and
    /// which thread holds the GIL (as py-spy dump); the process is stopped (ptrace) only
    /// while its registers, stacks and Python thread states are copied, and the dump says
    /// for how long.
    Dump(DumpArgs),
}

/// Options of `bpfprof dump`.
#[derive(Args, Debug)]
pub struct DumpArgs {
    /// Process to dump: PID or NS:PID.
    #[arg(short, long = "pid", value_name = "PID|NS:PID")]
    pub pid: String,
    /// Write JSON (the schema is in the README) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Show only the Python frames of threads that run Python (as `py-spy dump` without
    /// `--native`); threads without Python keep their native frames.
    #[arg(long)]
    pub python_only: bool,
}

/// Options of `bpfprof top`.
#[derive(Args, Debug)]
pub struct TopArgs {
    /// Process to watch: PID or NS:PID. Repeatable.
    #[arg(short, long = "pid", value_name = "PID|NS:PID")]
    pub pids: Vec<String>,
    /// Every process on the machine.
    #[arg(short = 'a', long = "all", conflicts_with = "pids")]
    pub all: bool,
    /// Samples per second per CPU.
    #[arg(short = 'F', long, default_value_t = crate::cli::top::DEFAULT_HZ, allow_negative_numbers = true)]
    pub frequency: i64,
    /// Start in the Python view (the interpreter's own C frames folded into the innermost
    /// Python function; `p` switches).
    #[arg(long)]
    pub python_view: bool,
    /// Command to launch and watch until it exits (its output goes to /dev/null: the view
    /// owns the terminal).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// Options of `bpfprof agent`.
#[derive(Args, Debug)]
pub struct AgentArgs {
    /// Samples per second per CPU.
    #[arg(short = 'F', long, default_value_t = crate::agent::DEFAULT_HZ, allow_negative_numbers = true)]
    pub frequency: i64,
    /// Length of a window: the samples of each are aggregated per process and kept in a
    /// ring of the most recent ones (1s to 10m).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub window: Duration,
    /// Serve `GET /debug/pprof/profile?seconds=N` and `GET /metrics` on this TCP address
    /// (127.0.0.1:6060) or Unix socket (unix:/run/bpfprof/agent.sock). Root sees every
    /// process; another local user only its own; a remote peer nothing without
    /// --listen-token-file's token. Off unless given.
    #[arg(long, value_name = "ADDR|unix:PATH")]
    pub listen: Option<crate::agent::peer::Listen>,
    /// The mode of the --listen unix: socket (octal): who may connect at all.
    #[arg(long, value_name = "MODE", default_value = "600", value_parser = parse_mode)]
    pub listen_mode: u32,
    /// The group of the --listen unix: socket (a gid), for a mode such as 660.
    #[arg(long, value_name = "GID")]
    pub listen_group: Option<u32>,
    /// A file holding a bearer token (one line, 16 characters or more, mode 600): a
    /// request with `Authorization: Bearer TOKEN` sees every process, from anywhere.
    #[arg(long, value_name = "FILE")]
    pub listen_token_file: Option<PathBuf>,
    /// Serve the TCP endpoint over TLS with this certificate chain (PEM); needs
    /// --listen-tls-key. Plain HTTP is then refused on that port.
    #[arg(long, value_name = "FILE", requires = "listen_tls_key")]
    pub listen_tls_cert: Option<PathBuf>,
    /// The private key of --listen-tls-cert (PEM, owned by the agent's user, mode 600).
    #[arg(long, value_name = "FILE", requires = "listen_tls_cert")]
    pub listen_tls_key: Option<PathBuf>,
    /// Only the processes of this cgroup v2 (a path under /sys/fs/cgroup, or relative to it:
    /// a container, a systemd unit, a k8s pod).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Leave kernel threads out.
    #[arg(long)]
    pub no_kernel_threads: bool,
    /// Only these processes (PID or NS:PID, repeatable) and the children they fork, instead
    /// of the whole machine.
    #[arg(short, long = "pid", value_name = "PID|NS:PID")]
    pub pids: Vec<String>,
    /// Most kernel memory for CFI unwind tables, in MiB; past it the tables sampled least
    /// recently are evicted.
    #[arg(long, default_value_t = crate::unwind::DEFAULT_TABLE_MIB)]
    pub unwind_table_mib: u32,
    /// Where unwind tables are kept between runs, so that objects seen before get theirs at
    /// once instead of being built again (libtorch_cpu.so: half a second or more), with the
    /// kernel's function names for this boot; `off` builds every table and reads the names.
    #[arg(long, value_name = "DIR|off", env = "BPFPROF_UNWIND_CACHE", default_value = crate::unwind::DEFAULT_TABLE_CACHE)]
    pub unwind_cache: String,
    /// Also record where threads block (sleeps, locks, pipes, disk) and for how long: each
    /// window then carries off-CPU stacks weighed in nanoseconds beside the CPU samples
    /// (pprof's `off_cpu` sample type, an OTLP `off_cpu` profile).
    #[arg(long)]
    pub off_cpu: bool,
    /// Shortest time off the CPU recorded with --off-cpu (default 1us).
    #[arg(long, value_parser = parse_duration, value_name = "TIME")]
    pub off_cpu_min: Option<Duration>,
    /// A TOML file of rules naming services: `[[rule]]` tables with `service` and any of
    /// `comm`, `executable`, `cgroup` (regular expressions); the first rule whose patterns
    /// all match names the process.
    #[arg(long, value_name = "FILE")]
    pub service_rules: Option<PathBuf>,
    /// The daemon's socket, asked for the tags of runs overlapping each window
    /// [env: BPFPROF_SOCKET] [default: /run/bpfprof/bpfprof.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Where to export each window, and the spool's size.
    #[command(flatten)]
    pub export: ExportArgs,
    /// Most memory for sealed copies of targets' files, in MiB: a file its user could
    /// truncate is copied to be read safely, one copy per object however many processes map
    /// it; past this, objects are named `module+0xOFFSET` (the reason logged once).
    #[arg(long, value_name = "MIB", default_value_t = crate::process::copies::DEFAULT_AGENT_COPY_MIB)]
    pub copy_budget_mib: u64,
    /// Where the agent keeps its state: the export spools (`spool/otlp`, `spool/pyroscope`),
    /// windows not yet taken by the backend, kept across restarts.
    #[arg(long, default_value = crate::agent::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

/// Where the agent's windows or the daemon's runs are exported (OTLP profiles, Pyroscope),
/// shared by `bpfprof agent` and `bpfprof daemon`; validated into an
/// [`crate::agent::export::ExportConfig`].
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Send each profile (an agent's window, a daemon's finished run) as OTLP profiles to
    /// this OpenTelemetry endpoint (a collector's `otlpreceiver`: http://HOST:4318 for
    /// http/protobuf, http://HOST:4317 for grpc; https:// for TLS). Off unless given.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// The profiles signal's own endpoint, used as it is (over HTTP nothing is appended to
    /// it), instead of --otlp-endpoint, as the OpenTelemetry SDKs take it.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", value_name = "URL")]
    pub otlp_profiles_endpoint: Option<String>,
    /// The OTLP transport.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        value_enum,
        default_value = "http/protobuf"
    )]
    pub otlp_protocol: crate::agent::export::Protocol,
    /// A header sent with every OTLP request (auth, tenant), repeatable.
    #[arg(long = "otlp-header", value_name = "KEY=VALUE")]
    pub otlp_headers: Vec<String>,
    /// Headers in the OpenTelemetry SDKs' list format (`k=v,k2=v2`, values
    /// percent-encoded), sent besides --otlp-header's.
    #[arg(
        long = "otlp-headers",
        env = "OTEL_EXPORTER_OTLP_HEADERS",
        hide_env_values = true,
        value_name = "K=V,..."
    )]
    pub otlp_header_list: Option<String>,
    /// A PEM file of the certificate authorities trusted for an https:// OTLP endpoint,
    /// instead of the web's roots (a private CA).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_CERTIFICATE", value_name = "FILE")]
    pub otlp_ca_cert: Option<PathBuf>,
    /// Push each profile to this Grafana Pyroscope server's ingest API, one pprof per
    /// service (`POST URL/ingest?name=SERVICE.cpu{host=...}&format=pprof...`). Off unless
    /// given.
    #[arg(long, value_name = "URL")]
    pub pyroscope_url: Option<String>,
    /// The Pyroscope tenant, sent as `X-Scope-OrgID`.
    #[arg(long, value_name = "ID", requires = "pyroscope_url")]
    pub pyroscope_tenant: Option<String>,
    /// Basic auth for Pyroscope (Grafana Cloud: the instance id and an API token)
    /// [env: BPFPROF_PYROSCOPE_USER].
    #[arg(
        long,
        env = "BPFPROF_PYROSCOPE_USER",
        hide_env_values = true,
        value_name = "USER:PASSWORD"
    )]
    pub pyroscope_user: Option<String>,
    /// Most MiB each backend's export spool keeps while it is away (under the state
    /// directory's `spool/`); past it the oldest are dropped, counted.
    #[arg(long, default_value_t = crate::agent::DEFAULT_SPOOL_MIB)]
    pub spool_mib: u64,
}

/// Options of `bpfprof doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Daemon socket to check [env: BPFPROF_SOCKET] [default: /run/bpfprof/bpfprof.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Print the checks as JSON.
    #[arg(long)]
    pub json: bool,
    /// The unwind table cache to report on (and to empty with `--clean`).
    #[arg(long, value_name = "DIR", env = "BPFPROF_UNWIND_CACHE", default_value = crate::unwind::DEFAULT_TABLE_CACHE)]
    pub unwind_cache: PathBuf,
    /// Empty the unwind table cache (the tables are built again as runs need them).
    #[arg(long)]
    pub clean: bool,
    /// Check one process instead of the machine: its Python interpreter, version and build,
    /// whether its layout passed bpfprof's checks (the reason if not), and what a recording
    /// of it will show.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
}

/// Options of `bpfprof daemon`.
#[derive(Args, Debug)]
pub struct DaemonArgs {
    /// Socket to listen on [env: BPFPROF_SOCKET] [default: /run/bpfprof/bpfprof.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Most kernel memory for CFI unwind tables, per kernel program, in MiB (8 bytes a row;
    /// a 430 MB libtorch_cpu.so needs 20); each program gets what its first target maps,
    /// within this cap.
    #[arg(long, default_value_t = crate::unwind::DEFAULT_TABLE_MIB)]
    pub unwind_table_mib: u32,
    /// Where unwind tables are kept between runs, so that objects seen before get theirs at
    /// once instead of being built again (libtorch_cpu.so: half a second or more), with the
    /// kernel's function names for this boot; `off` builds every table and reads the names.
    #[arg(long, value_name = "DIR|off", env = "BPFPROF_UNWIND_CACHE", default_value = crate::unwind::DEFAULT_TABLE_CACHE)]
    pub unwind_cache: String,
    /// Most memory for sealed copies of targets' files, in MiB, per user (the runs' owner):
    /// a file its user could truncate is copied to be read safely, one copy per object
    /// however many of the user's processes map it; past this, objects are named
    /// `module+0xOFFSET` (the reason logged once).
    #[arg(long, value_name = "MIB", default_value_t = crate::process::copies::DEFAULT_DAEMON_COPY_MIB)]
    pub copy_budget_mib: u64,
    /// Where runs and their results are kept.
    #[arg(long, default_value = "/var/lib/bpfprof")]
    pub state_dir: PathBuf,
    /// Most runs sampling at once.
    #[arg(long, default_value_t = 16)]
    pub max_runs: usize,
    /// Most runs one non-root user may have sampling at once.
    #[arg(long, default_value_t = 8)]
    pub max_runs_per_user: usize,
    /// Most ended runs kept per non-root user.
    #[arg(long, default_value_t = 50)]
    pub keep_runs_per_user: usize,
    /// Connections that send no request for this long are closed.
    #[arg(long, default_value = "60s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub client_idle_timeout: Duration,
    /// Longest run.
    #[arg(long, default_value = MAX_RUN_DURATION_ARG, value_parser = parse_duration, allow_hyphen_values = true)]
    pub max_duration: Duration,
    /// Most ended runs kept on disk.
    #[arg(long, default_value_t = 200)]
    pub keep_runs: usize,
    /// Ended runs older than this are deleted.
    #[arg(long, default_value = "7days", value_parser = parse_duration, allow_hyphen_values = true)]
    pub keep_age: Duration,
    /// Where to export each finished run's profile (with its tags, run id and owner), and
    /// the spool's size; the spool lives in the state directory's `spool/`.
    #[command(flatten)]
    pub export: ExportArgs,
}

/// How a client command reaches the daemon and prints its reply.
#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The daemon's socket [env: BPFPROF_SOCKET] [default: /run/bpfprof/bpfprof.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Print the daemon's reply as JSON.
    #[arg(long)]
    pub json: bool,
}

/// A client command about one run.
#[derive(Args, Debug)]
pub struct RunIdArgs {
    /// The run.
    #[arg(long)]
    pub run_id: u64,
    /// How to reach the daemon.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `bpfprof results`.
#[derive(Args, Debug)]
pub struct ResultsArgs {
    /// The run.
    #[arg(long)]
    pub run_id: u64,
    /// Wait this long for the run to end first: 30s, 5m.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    pub wait: Option<Duration>,
    /// Also copy the result files into DIR, read through the daemon's socket (works where
    /// the daemon's state directory is out of reach).
    #[arg(long, value_name = "DIR")]
    pub copy_to: Option<std::path::PathBuf>,
    /// How to reach the daemon.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `bpfprof run`: a daemon run, as the protocol's `run` request.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Process to profile: PID or NS:PID.
    #[arg(short, long, value_name = "PID|NS:PID")]
    pub pid: String,
    /// Return once the run samples, printing its id.
    #[arg(long = "async")]
    pub run_async: bool,
    /// auto, cycles or cpu-clock.
    #[arg(long)]
    pub event: Option<String>,
    /// Period in event units (cycles, or ns for cpu-clock).
    #[arg(long, allow_negative_numbers = true, conflicts_with = "frequency")]
    pub sample_interval: Option<i64>,
    /// Samples per second.
    #[arg(short = 'F', long, allow_negative_numbers = true)]
    pub frequency: Option<i64>,
    /// Length of the run in milliseconds (as strobelight's clients give it).
    #[arg(long, conflicts_with = "duration")]
    pub duration_ms: Option<u64>,
    /// Length of the run (`500ms`, `5s`, `2m`), as `bpfprof --duration` takes it.
    #[arg(short, long, value_parser = parse_duration, value_name = "TIME", allow_hyphen_values = true)]
    pub duration: Option<Duration>,
    /// Bare tags, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub sample_tags: Vec<String>,
    /// KEY=VALUE tags; repeatable.
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
    /// Deepest stack kept (default 127, at most 512; frame-pointer stacks stop at
    /// kernel.perf_event_max_stack).
    #[arg(long, allow_negative_numbers = true)]
    pub max_stack_length: Option<i64>,
    /// Formats to write (default: svg, folded, pprof, speedscope, pstats).
    #[arg(long, value_delimiter = ',')]
    pub formats: Option<Vec<String>>,
    /// Also profile the children the process forks during the run (and theirs).
    #[arg(long)]
    pub follow_children: bool,
    /// How user stacks are walked: auto, fp or cfi (as the recording's --unwind); the
    /// daemon's default is auto.
    #[arg(long, value_enum)]
    pub unwind: Option<crate::unwind::UnwindMode>,

    /// Python frames of a CPython target: auto or off (the daemon's default is auto).
    #[arg(long, value_enum)]
    pub python: Option<crate::runtime::cpython::stacks::PythonMode>,
    /// Most asyncio tasks shown above a sampled task (CPython 3.14+; the daemon's default is
    /// 64); 0 leaves async stacks out.
    #[arg(long)]
    pub max_async_depth: Option<u32>,
    /// What the profile measures: cpu or wall (CPU samples plus each thread's time off the
    /// CPU; as the recording's --mode).
    #[arg(long, value_name = "cpu|wall")]
    pub mode: Option<String>,
    /// Also record where the process's threads block, and for how long (as the recording's
    /// --off-cpu).
    #[arg(long)]
    pub off_cpu: bool,
    /// Shortest time off the CPU recorded (default 1us).
    #[arg(long, value_parser = parse_duration, value_name = "TIME")]
    pub off_cpu_min: Option<Duration>,
    /// How to reach the daemon.
    #[command(flatten)]
    pub client: ClientArgs,
}

impl RunArgs {
    /// The run's length in milliseconds, from whichever of `--duration` and `--duration-ms`
    /// was given.
    pub fn length_ms(&self) -> Option<u64> {
        self.duration_ms.or_else(|| {
            self.duration
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        })
    }
}

/// Options of a direct recording (`bpfprof --pid PID` or `bpfprof -- COMMAND`).
#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Process to profile: PID, or NS:PID with NS the inode of its pid namespace
    /// (`stat -L -c %i /proc/PID/ns/pid`) and PID as seen inside it. Repeatable.
    #[arg(short, long = "pid", value_name = "PID|NS:PID")]
    pub pids: Vec<String>,

    /// How long to sample: 500ms, 3s, 2m. Default: until Ctrl-C or the targets exit.
    #[arg(short, long, value_parser = parse_duration, allow_hyphen_values = true)]
    pub duration: Option<Duration>,

    /// Hard cap on the run's length, whatever else is asked.
    #[arg(long, default_value = MAX_RUN_DURATION_ARG, value_parser = parse_duration, allow_hyphen_values = true)]
    pub max_duration: Duration,

    /// Event that drives sampling: auto (cycles where a PMU exists, else cpu-clock), cycles,
    /// or cpu-clock.
    #[arg(long, default_value = "auto")]
    pub event: String,

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
    pub sample_interval: Option<IntervalArg>,

    /// Samples per second per CPU, instead of a period.
    #[arg(short = 'F', long, allow_negative_numbers = true)]
    pub frequency: Option<i64>,

    /// Keep the sampling period fixed. By default each CPU's period is redrawn around the
    /// mean (±50%) every few periods (20-60 ms at the least), so periodic workloads cannot
    /// alias with it.
    #[arg(long)]
    pub fixed_interval: bool,

    /// What the profile measures: cpu (CPU samples) or wall (CPU samples plus each thread's
    /// time off the CPU, blocked or waiting for a CPU, so that a function that waits 30% of a
    /// thread's time shows 30%). With off-CPU time every format weighs stacks in nanoseconds.
    #[arg(long, default_value = "cpu", value_name = "cpu|wall")]
    pub mode: String,

    /// Also record where target threads block (sleeps, locks, pipes, disk) and for how long,
    /// alongside the CPU samples: off-CPU stacks end in `[off-cpu: sleeping]` or
    /// `[off-cpu: disk]` below the kernel frames of the wait.
    #[arg(long)]
    pub off_cpu: bool,

    /// Shortest time off the CPU recorded (default 1us, as bcc's offcputime; 0 keeps every
    /// switch).
    #[arg(long, value_parser = parse_duration, value_name = "TIME")]
    pub off_cpu_min: Option<Duration>,

    /// Where to write the profile; repeatable. The format comes from the extension (.svg,
    /// .folded, .pb.gz, .speedscope.json, .prof, .txt, .summary.json, .trace.json), else from
    /// --format.
    /// Default: bpfprof.svg.
    #[arg(short, long = "output", value_name = "PATH")]
    pub outputs: Vec<PathBuf>,

    /// Format for outputs whose extension names none: svg, folded, pprof, speedscope, pstats,
    /// top, summary-json, trace (the Chrome trace event format, for Perfetto). `--format top`
    /// without --output prints the table.
    #[arg(long)]
    pub format: Option<String>,

    /// Also write a JSON summary of the run (samples, event, losses, top functions) here.
    #[arg(long, value_name = "PATH")]
    pub summary_json: Option<PathBuf>,

    /// Strobelight-style sample tags, comma-separated: `--sample-tags a,b`.
    #[arg(long, value_delimiter = ',', value_name = "TAG,...")]
    pub sample_tags: Vec<String>,

    /// A key=value tag stored with every sample; repeatable.
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,

    /// Deepest stack kept, in frames, at most 512 (leaf-most frames are kept; cut stacks get a
    /// `[truncated]` root frame). User stacks walked with CFI tables and Python stacks reach
    /// 512; frame-pointer user stacks (--unwind fp) and kernel stacks stop at
    /// kernel.perf_event_max_stack (127 by default), as perf's do.
    #[arg(long, default_value_t = DEFAULT_MAX_STACK_LENGTH, allow_negative_numbers = true)]
    pub max_stack_length: i64,

    /// Keep threads apart: each thread's stacks under its own frame below the process.
    #[arg(long)]
    pub per_thread: bool,

    /// Record when each sample was taken (the kernel writes each sample's time to a ring
    /// buffer): speedscope's "Time Order" then shows samples in the order they happened. On
    /// by itself for a `.trace.json` output.
    #[arg(long)]
    pub timeline: bool,

    /// Show source file:line on frames that have debug info.
    #[arg(long)]
    pub line_numbers: bool,

    /// Measure the kernel program's own run time (turns on BPF statistics system-wide
    /// while bpfprof runs).
    #[arg(long)]
    pub bpf_stats: bool,

    /// How user stacks are walked: auto (CFI tables from .eh_frame where an object has them,
    /// frame pointers elsewhere), fp (frame pointers only), or cfi (as auto, but failing to
    /// load a target's tables is an error).
    #[arg(long, value_enum, default_value_t = crate::unwind::UnwindMode::default())]
    pub unwind: crate::unwind::UnwindMode,

    /// Most kernel memory for CFI unwind tables, in MiB (8 bytes a row: libc takes 0.2, a
    /// 430 MB libtorch_cpu.so 20). The array is sized from what the targets map, within this
    /// cap; past it, the objects sampled most recently keep their tables and the others
    /// unwind by frame pointer, with a warning.
    #[arg(long, default_value_t = crate::unwind::DEFAULT_TABLE_MIB)]
    pub unwind_table_mib: u32,
    /// Where unwind tables are kept between runs, so that objects seen before get theirs at
    /// once instead of being built again (libtorch_cpu.so: half a second or more), with the
    /// kernel's function names for this boot; `off` builds every table and reads the names.
    #[arg(long, value_name = "DIR|off", env = "BPFPROF_UNWIND_CACHE", default_value = crate::unwind::DEFAULT_TABLE_CACHE)]
    pub unwind_cache: String,

    /// Python frames: auto (read from every CPython 3.10-3.13 process the kernel samples,
    /// and shown in place of the interpreter's `_PyEval_EvalFrameDefault`) or off.
    #[arg(long, value_enum, default_value_t = crate::runtime::cpython::stacks::PythonMode::default())]
    pub python: crate::runtime::cpython::stacks::PythonMode,

    /// Keep the interpreter's own C frames between Python frames (folded away by default).
    #[arg(long)]
    pub python_glue: bool,

    /// Put `[GIL held]` or `[GIL not held]` at the root of each Python stack: whether the
    /// sampled thread held CPython's global interpreter lock (`[free-threaded: no GIL]` for a
    /// free-threaded build running without one, as it does unless its GIL is enabled).
    #[arg(long)]
    pub python_gil: bool,

    /// asyncio task stacks (CPython 3.14+): a sample taken while a task runs shows the tasks
    /// that await it, outermost first, as `[task NAME] COROUTINE` frames in place of the
    /// event loop's frames (as `python -m asyncio pstree` draws them); auto (the default) or
    /// off. Costs two reads of the process's memory per Python sample in the kernel; earlier
    /// versions say in the summary that they need 3.14.
    #[arg(long, value_enum, default_value_t = crate::runtime::cpython::stacks::PythonMode::default())]
    pub python_async: crate::runtime::cpython::stacks::PythonMode,

    /// Most tasks shown above a sampled task's own frames (`--python-async`); a longer chain
    /// of awaiting tasks is cut at its outer end, and the summary counts the cuts.
    #[arg(long, default_value_t = crate::runtime::cpython::asyncio::DEFAULT_MAX_ASYNC_DEPTH as u32,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_async_depth: u32,

    /// The Python view: each sample attributed to its innermost Python function, the
    /// interpreter's own C frames below it (eval loop, pymalloc, the C runtime it calls)
    /// folded into it; extension code (numpy, zlib, libtorch) stays below its Python caller.
    /// `--python-view` alone: every output; pstats (the default): the .prof output only; off:
    /// none.
    #[arg(
        long,
        value_enum,
        num_args = 0..=1,
        default_value_t = crate::runtime::cpython::stacks::PythonView::Pstats,
        default_missing_value = "all",
        require_equals = true,
        value_name = "WHICH"
    )]
    pub python_view: crate::runtime::cpython::stacks::PythonView,

    /// Print nothing but errors.
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Say more about what bpfprof does (repeat for debug output).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// With --pid: also profile the children each target forks during the run (and theirs),
    /// as perf's --inherit does. On by default for a command after --.
    #[arg(long, conflicts_with = "no_inherit")]
    pub follow_children: bool,

    /// With a command after --: profile only the command's own process, not its children.
    #[arg(long)]
    pub no_inherit: bool,

    /// Profile every process on every CPU (kernel threads included, bpfprof itself left
    /// out), each under its own root frame `name (pid N)`, until Ctrl-C or --duration.
    #[arg(short = 'a', long = "all", conflicts_with_all = ["pids", "follow_children", "no_inherit"])]
    pub all: bool,

    /// With --all: leave kernel threads out.
    #[arg(long, requires = "all")]
    pub no_kernel_threads: bool,

    /// With --all: only the processes of this cgroup v2 and its descendants, filtered in the
    /// kernel (a path under /sys/fs/cgroup, or relative to the cgroup2 mount there: a
    /// container's, a systemd unit's such as system.slice/nginx.service).
    #[arg(long, requires = "all", value_name = "PATH")]
    pub cgroup: Option<PathBuf>,

    /// Command to launch and profile until it exits.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// The exit codes, as `--help` lists them.
pub const EXIT_CODES: &str =
    "Exit codes: 0 done; 2 usage; 3 no such process; 4 permission denied; \
5 invalid sampling settings; 6 output not writable; 7 target exited before the run ended \
(profile written); 8 event not supported here; 9 no such run; 10 daemon unavailable; \
11 too many runs; 12 a doctor check failed; 130 interrupted (profile written); 1 other errors. \
With a command after --, bpfprof exits with the command's own status (128+N when signal N \
ended it), as `time` does; when --duration ends first, the command is stopped with SIGTERM \
(SIGKILL 5 s later) and bpfprof exits 0.";

/// A duration flag's value (`500ms`, `3s`, `2m`); a negative one is refused in these terms
/// rather than taken for a flag (clap's own tip, `-- -1s`, would launch a command here).
fn parse_duration(arg: &str) -> Result<Duration, String> {
    if arg.starts_with('-') {
        return Err("a duration cannot be negative; give one such as 500ms, 3s or 2m".into());
    }
    humantime::parse_duration(arg)
        .map_err(|e| format!("{e}; give a duration such as 500ms, 3s or 2m"))
}

/// A file mode in octal (`600`, `0660`).
fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s} is not a file mode in octal (600, 660)"))
}
