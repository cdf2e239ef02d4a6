//! The command line's own drivers: a direct recording ([`record`]), the daemon
//! ([`daemon`]) and `bpfprof doctor` ([`doctor`]), each from its validated flags.

use std::{
    io::IsTerminal,
    path::{Path, PathBuf},
    time::Duration,
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::{
    cli::{
        args::{AgentArgs, DaemonArgs, DoctorArgs, ExportArgs, RecordArgs},
        record::{CommandOutcome, Progress, Recorder, StopConditions},
    },
    daemon::DaemonConfig,
    error::{exit_code, Error},
    kernel::pool::ProgramPool,
    output::{Format, Output},
    process::target::TargetSpec,
    profile::RunEnd,
    protocol,
    recording::aggregate::pstats_view,
    recording::request::{split_tag, RecordingRequest, Scope, SystemScope, TagsAndStacks, Walks},
    sampling::{EventChoice, IntervalArg, Mode, OffCpu, SamplingRequest},
    symbolize::{Symbolizer, SymbolizerThread},
};

/// Serves as the root daemon (`bpfprof daemon`) until SIGINT or SIGTERM.
pub async fn daemon(args: DaemonArgs) -> Result<i32, Error> {
    let export = export_config(&args.export, &args.state_dir)?;
    let config = DaemonConfig {
        socket: protocol::socket_path(args.socket.as_deref()),
        state_dir: args.state_dir,
        max_runs: args.max_runs.max(1),
        max_runs_per_user: args.max_runs_per_user.max(1),
        keep_runs_per_user: args.keep_runs_per_user,
        idle_timeout: args.client_idle_timeout,
        max_duration: args.max_duration,
        table_mib: args.unwind_table_mib,
        table_cache: args.unwind_cache,
        copy_budget_mib: args.copy_budget_mib,
        keep_runs: args.keep_runs,
        keep_age: args.keep_age,
        export,
    };
    crate::daemon::serve(config).await?;
    Ok(exit_code::OK)
}

/// Runs the always-on agent (`bpfprof agent`) until SIGINT or SIGTERM.
pub async fn agent(args: AgentArgs) -> Result<i32, Error> {
    let window = crate::agent::AgentConfig::check_window(args.window)?;
    let targets = args
        .pids
        .iter()
        .map(|p| p.parse::<TargetSpec>())
        .collect::<Result<Vec<_>, _>>()?;
    let request = RecordingRequest::validate(
        SamplingRequest {
            frequency: Some(args.frequency),
            off_cpu: OffCpu::from_flags(Mode::Cpu, args.off_cpu, args.off_cpu_min)?,
            ..SamplingRequest::default()
        },
        // Named processes are followed into their children, as the machine's would be.
        true,
        None,
        // The agent runs until stopped: no run length applies.
        Duration::MAX,
        TagsAndStacks::default(),
        Walks {
            table_mib: args.unwind_table_mib,
            ..Walks::default()
        },
    )?
    .with_scope(if targets.is_empty() {
        Scope::System(SystemScope {
            kernel_threads: !args.no_kernel_threads,
            cgroup: args.cgroup,
        })
    } else {
        if args.cgroup.is_some() || args.no_kernel_threads {
            return Err(Error::InvalidTarget {
                spec: String::new(),
                reason: "--cgroup and --no-kernel-threads apply to the whole machine, not to \
                         --pid targets"
                    .into(),
            });
        }
        Scope::Targets
    })?;
    let rules = match &args.service_rules {
        Some(path) => crate::agent::rules::ServiceRules::load(path)?,
        None => Default::default(),
    };
    let export = export_config(&args.export, &args.state_dir)?;
    crate::agent::serve(crate::agent::AgentConfig {
        request,
        targets,
        window,
        listen: match args.listen {
            Some(listen) => Some(crate::agent::ListenConfig {
                mode: args.listen_mode,
                group: args.listen_group,
                token: args
                    .listen_token_file
                    .as_deref()
                    .map(crate::agent::peer::read_token)
                    .transpose()?,
                tls: match (&args.listen_tls_cert, &args.listen_tls_key, &listen) {
                    (Some(cert), Some(key), crate::agent::peer::Listen::Tcp(_)) => {
                        Some(crate::agent::tls::acceptor(cert, key)?)
                    }
                    (Some(_), _, crate::agent::peer::Listen::Unix(_)) => {
                        return Err(Error::Usage(
                            "--listen-tls-cert is for a TCP --listen address: a Unix \
                             socket never leaves the machine"
                                .into(),
                        ))
                    }
                    _ => None,
                },
                listen,
            }),
            None if args.listen_tls_cert.is_some() => {
                return Err(Error::Usage(
                    "--listen-tls-cert needs a TCP --listen address".into(),
                ))
            }
            None => None,
        },
        rules,
        socket: protocol::socket_path(args.socket.as_deref()),
        export,
        table_cache: args.unwind_cache,
        copy_budget_mib: args.copy_budget_mib,
    })
    .await
}

/// The export settings of the agent or the daemon, validated: `None` where no backend is
/// named. The spools go under `state_dir`'s `spool/`.
fn export_config(
    args: &ExportArgs,
    state_dir: &Path,
) -> Result<Option<crate::agent::export::ExportConfig>, Error> {
    use crate::agent::export::{ExportConfig, OtlpConfig};
    if args.spool_mib == 0 {
        return Err(Error::Usage("--spool-mib must be at least 1".into()));
    }
    // The SDKs' signal-specific endpoint wins over the general one, as in their SDKs.
    let endpoint = match (&args.otlp_profiles_endpoint, &args.otlp_endpoint) {
        (Some(signal), _) => Some((signal, true)),
        (None, Some(base)) => Some((base, false)),
        (None, None) => None,
    };
    if endpoint.is_none() && !args.otlp_headers.is_empty() {
        return Err(Error::Usage(
            "--otlp-header needs --otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT)".into(),
        ));
    }
    // The header list and the CA file may come from the environment of a machine whose
    // other programs export: they apply only where an endpoint is named.
    let otlp = match endpoint {
        Some((endpoint, signal_url)) => {
            let mut otlp = OtlpConfig::new(endpoint, args.otlp_protocol, &args.otlp_headers)?;
            if signal_url {
                otlp = otlp.with_signal_url();
            }
            if let Some(list) = &args.otlp_header_list {
                otlp = otlp.with_header_list(list)?;
            }
            if let Some(ca) = &args.otlp_ca_cert {
                otlp = otlp.with_ca_cert(ca)?;
            }
            Some(otlp)
        }
        None => None,
    };
    let pyroscope = match &args.pyroscope_url {
        Some(url) => Some(crate::agent::pyroscope::PyroscopeConfig::new(
            url,
            args.pyroscope_tenant.as_deref(),
            args.pyroscope_user.as_deref(),
        )?),
        None => None,
    };
    Ok(
        (otlp.is_some() || pyroscope.is_some()).then(|| ExportConfig {
            otlp,
            pyroscope,
            spool_dir: state_dir.join("spool"),
            spool_limit: args.spool_mib.saturating_mul(1 << 20),
        }),
    )
}

/// Prints `bpfprof doctor`'s checks; exit 12 when any check failed.
pub fn doctor(args: DoctorArgs) -> Result<i32, Error> {
    if args.clean {
        let (files, bytes) = crate::unwind::cache::clean(&args.unwind_cache).map_err(|e| {
            Error::Other(anyhow::anyhow!(e).context(format!(
                "emptying the unwind table cache {}",
                args.unwind_cache.display()
            )))
        })?;
        eprintln!(
            "bpfprof: removed {files} entries (unwind tables, the kernel's names; {:.1} MiB) \
             from {}",
            bytes as f64 / (1024.0 * 1024.0),
            args.unwind_cache.display()
        );
    }
    let report = match args.pid {
        Some(pid) => crate::cli::doctor::process(pid),
        None => crate::cli::doctor::run(args.socket.as_deref(), &args.unwind_cache),
    };
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

/// Records as the flags say (`bpfprof --pid`, `bpfprof -- CMD`) and writes the outputs;
/// returns the exit code.
pub async fn record(cli: RecordArgs) -> Result<i32, Error> {
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
        off_cpu: OffCpu::from_flags(cli.mode.parse::<Mode>()?, cli.off_cpu, cli.off_cpu_min)?,
    };
    let specs = cli
        .pids
        .iter()
        .map(|p| p.parse::<TargetSpec>())
        .collect::<Result<Vec<_>, _>>()?;
    let ways = [!specs.is_empty(), !cli.command.is_empty(), cli.all];
    if ways.iter().filter(|w| **w).count() != 1 {
        return Err(Error::InvalidTarget {
            spec: String::new(),
            reason: "give one of --pid (repeatable), a command after --, or --all".into(),
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
    let mut validated = RecordingRequest::validate(
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
            runtime: crate::runtime::FrameOptions {
                keep_glue: cli.python_glue,
                show_gil: cli.python_gil,
                view: cli.python_view,
            },
        },
        Walks {
            unwind: cli.unwind,
            python: cli.python,
            table_mib: cli.unwind_table_mib,
            python_async: (cli.python_async == crate::runtime::cpython::stacks::PythonMode::Auto)
                .then_some(cli.max_async_depth),
        },
    )?
    .with_scope(if cli.all {
        Scope::System(SystemScope {
            kernel_threads: !cli.no_kernel_threads,
            cgroup: cli.cgroup.clone(),
        })
    } else {
        Scope::Targets
    })?;
    crate::kernel::check_privileges()?;
    // Outputs are created before sampling so that a bad path fails before any work is done.
    let mut outputs = open_outputs(&cli)?;
    // A trace is drawn from each sample's time: the kernel records it for this run only.
    validated.options.timeline =
        cli.timeline || outputs.iter().any(|o| o.format() == Format::TraceJson);
    // Only pprof shows where each frame's instruction is.
    validated.options.addresses = outputs.iter().any(|o| o.format() == Format::Pprof);
    let options = validated.options.clone();
    let table_cache = crate::unwind::open_table_cache(&cli.unwind_cache);
    let pool = ProgramPool::new(cli.bpf_stats).with_table_cache(table_cache.clone());
    let recorder = if launch {
        Recorder::launch(&validated, &cli.command, pool, false)
    } else if cli.all {
        Recorder::system(&validated, pool)
    } else {
        Recorder::attach(&validated, &specs, pool)
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
    let symbolizer = SymbolizerThread::spawn(table_cache.map(|c| c as _))
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
    // The end of the run's steps are timed for `-vv`: the bench's stop-to-written figure
    // is their sum.
    let stopped = std::time::Instant::now();
    log::debug!("end of run: stopping; {}", own_usage());
    let sampled_for = recorder.sampled_for();
    let (collected, outcome) = recorder.finish(end)?;
    let collected_at = stopped.elapsed();
    log::debug!("end of run: collected; {}", own_usage());
    let mut profile = symbolizer
        // Nothing is named after this profile: the symbolizer's parsed debug info goes as
        // soon as every address is, and the profile is built in its room.
        .run(move |s| collected.assemble(end, s, &options, Symbolizer::unload))
        .await
        .map_err(|e| Error::Other(anyhow::anyhow!(e)))?;
    if let Some(sampled_for) = sampled_for {
        // Sampling stopped at the deadline; the run loop noticed a tick later.
        profile.meta.duration = profile.meta.duration.min(sampled_for);
    }
    let assembled_at = stopped.elapsed();
    log::debug!("end of run: aggregated; {}", own_usage());
    let view = outputs
        .iter()
        .any(|o| o.format() == Format::Pstats)
        .then(|| pstats_view(&profile, &validated.options))
        .flatten();
    let wrote = crate::output::write_all(
        &profile,
        view.as_ref(),
        outputs.drain(..).map(Ok),
        |format, path| {
            if let (false, Some(path)) = (cli.quiet, path) {
                eprintln!("bpfprof: wrote {format} to {}", path.display());
            }
        },
    );
    if let Err(e) = wrote {
        // The other outputs were written; the samples are kept whatever the failure, so
        // that a run that took its time is not lost to one bad path.
        return Err(rescued(e, &profile));
    }
    log::debug!(
        "end of run: collected in {:.3} s, symbolized and aggregated in {:.3} s, written in \
         {:.3} s; {} stacks; {}",
        collected_at.as_secs_f64(),
        (assembled_at - collected_at).as_secs_f64(),
        (stopped.elapsed() - assembled_at).as_secs_f64(),
        profile.stacks.len(),
        own_usage()
    );
    if !cli.quiet {
        eprint!(
            "{}",
            crate::cli::terminal::escape_lines(&crate::cli::summary::summary(&profile))
        );
    }
    if let Some(outcome) = outcome {
        return Ok(command_exit(outcome, cli.quiet));
    }
    Ok(match end {
        RunEnd::Completed => exit_code::OK,
        // With no --duration, "until the targets exit" is the run asked for: a script with
        // `set -e` must not fail on it. Only an end before the asked duration is reported.
        RunEnd::TargetExited if cli.duration.is_none() => exit_code::OK,
        RunEnd::TargetExited => {
            eprintln!(
                "bpfprof: the target exited after {:.1}s; the profile holds what was sampled until then",
                profile.meta.duration.as_secs_f64()
            );
            exit_code::TARGET_EXITED
        }
        RunEnd::Interrupted => exit_code::INTERRUPTED,
    })
}

/// The error of an output that could not be written at the end of a run, with where its
/// samples were kept instead ([`crate::output::write_rescue`]).
fn rescued(e: Error, profile: &crate::profile::Profile) -> Error {
    let kept = match crate::output::write_rescue(profile) {
        Ok(path) => format!("the samples were kept in {}", path.display()),
        Err(why) => format!("the samples could not be kept either ({why})"),
    };
    match e {
        Error::Output { path, source } => Error::Output {
            path,
            source: std::io::Error::new(source.kind(), format!("{source}; {kept}")),
        },
        other => Error::Other(anyhow::anyhow!("{other}; {kept}")),
    }
}

/// bpfprof's CPU time so far and its memory now and at its peak, for `-vv`'s account of the
/// end of a run.
fn own_usage() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map_or_else(String::new, |v| v.trim().to_string())
    };
    let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    format!(
        "CPU {:.3} s, RSS {}, peak {}",
        cpu.tv_sec as f64 + cpu.tv_nsec as f64 / 1e9,
        field("VmRSS:"),
        field("VmHWM:")
    )
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
        // A --format that agrees with every extension says the same thing twice: fine. One
        // that no output takes (each names another format by its extension) is a mistake.
        let unused = cli
            .outputs
            .iter()
            .all(|p| Format::from_path(p).is_some_and(|f| f != format));
        if unused {
            return Err(Error::InvalidOutput(format!(
                "--format {format} conflicts with {}: each names its format by its extension \
                 (--format applies to outputs without one)",
                cli.outputs
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
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

/// The progress line on a terminal's stderr, hidden elsewhere.
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
