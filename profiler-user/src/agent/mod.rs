//! `bpfprof agent`: the always-on driver. It records the whole machine (or one cgroup, or
//! named processes) at a low rate without stopping, cuts the recording into windows of
//! `--window` ([`crate::recording::Recording::take_window`]: the same aggregation as any
//! recording, so every writer reads the same profile), labels each process's samples
//! ([`labels`], [`rules`]), keeps the recent windows in a ring ([`windows`]) and serves them
//! as pprof with its own metrics over HTTP ([`http`], [`metrics`]), and sends each window to
//! an OpenTelemetry backend as OTLP profiles or to Pyroscope where asked ([`export`],
//! [`pyroscope`], [`send`], [`spool`]; the requests are encoded beside the other formats, by
//! [`crate::output::otlp`] and [`crate::output::pyroscope`]).
//!
//! The recording runs on a thread of its own (ticks, windows, symbolization); the HTTP server
//! and the exporter on the async runtime, reading only the ring, the export queue and
//! atomics. Memory stays bounded however many processes come and go: exited processes are dropped at the window after their exit (with
//! their labels, unwind tracking and Python state), the stacks a window took are forgotten,
//! the symbolizer's caches are emptied past [`MAX_SYMBOL_CACHE`], unwind tables are evicted
//! least recently sampled first within `--unwind-table-mib`, and the ring holds at most
//! [`windows::RING_WINDOWS`]; each cap hit is counted in `/metrics`.

pub mod export;
pub mod http;
pub mod labels;
pub mod metrics;
pub mod peer;
pub mod pyroscope;
pub mod rules;
pub mod send;
pub mod spool;
pub mod tls;
pub mod windows;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use crate::{
    agent::{
        http::Shared,
        labels::ProcessLabels,
        metrics::{Cap, Metrics},
        rules::ServiceRules,
        windows::{Owners, Ring, Window},
    },
    error::{exit_code, Error, Result},
    kernel::pool::ProgramPool,
    process::target::{Target, TargetSpec},
    profile::RunEnd,
    recording::{
        request::RecordingRequest,
        run_loop::{self, RunDriver},
        Recording,
    },
    symbolize::Symbolizer,
};

/// Samples per second per CPU by default: 19 Hz, the always-on rate of Parca Agent and the
/// OpenTelemetry profiler (a prime, so it cannot lock step with periodic work).
pub const DEFAULT_HZ: i64 = 19;
/// Shortest window: a window's symbolization should not run more often than this.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
/// Longest window: the ring then holds hours, and a scraper waits long for its first.
pub const MAX_WINDOW: Duration = Duration::from_secs(600);
/// Most addresses the symbolizer keeps names for before it is emptied (a cap hit): about
/// 100k frames take 20-30 MB, within the agent's 100 MiB budget.
pub const MAX_SYMBOL_CACHE: usize = 100_000;
/// Most files the symbolizer keeps open (and parsed) before it is emptied: each holds a
/// parsed symbol table, and a deleted file's blocks stay allocated while it is open.
pub const MAX_SYMBOL_FILES: usize = 256;

/// Where the agent keeps its state (the export spool) by default: beside the daemon's
/// `/var/lib/bpfprof`, not inside it (the daemon owns what is there).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/bpfprof-agent";
/// The export spool's default limit, in MiB: at 19 Hz an hour or more of a busy machine's
/// windows while the backend is away.
pub const DEFAULT_SPOOL_MIB: u64 = 256;

/// What the agent records and serves, validated.
pub struct AgentConfig {
    /// The recording: event and rate, unwinding, Python, the unwind-table cap.
    pub request: RecordingRequest,
    /// Processes to record instead of the whole machine (the request's scope is then
    /// [`crate::recording::request::Scope::Targets`]).
    pub targets: Vec<TargetSpec>,
    /// Length of a window.
    pub window: Duration,
    /// Where to serve HTTP, if anywhere, and to whom.
    pub listen: Option<ListenConfig>,
    /// The service rules.
    pub rules: ServiceRules,
    /// The daemon's socket, asked for the tags of its runs.
    pub socket: PathBuf,
    /// Where to export each window (OTLP profiles, Pyroscope), if anywhere, and the spool.
    pub export: Option<export::ExportConfig>,
    /// Where unwind tables are kept between windows' programs and restarts
    /// (`--unwind-cache`: a folder or `off`).
    pub table_cache: String,
    /// The most memory the sealed copies of targets' files take at once, in MiB
    /// (`--copy-budget-mib`; see [`crate::process::copies`]).
    pub copy_budget_mib: u64,
}

/// Where and to whom the HTTP endpoint serves.
pub struct ListenConfig {
    /// The TCP address or Unix socket.
    pub listen: peer::Listen,
    /// The Unix socket's mode.
    pub mode: u32,
    /// The Unix socket's group.
    pub group: Option<u32>,
    /// The bearer token that shows everything, if any.
    pub token: Option<Vec<u8>>,
    /// TLS on the TCP endpoint, if asked for ([`tls`]).
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl AgentConfig {
    /// Checks the window's length.
    pub fn check_window(window: Duration) -> Result<Duration> {
        if (MIN_WINDOW..=MAX_WINDOW).contains(&window) {
            Ok(window)
        } else {
            Err(Error::InvalidTarget {
                spec: String::new(),
                reason: format!(
                    "--window must be between {} and {}",
                    humantime::format_duration(MIN_WINDOW),
                    humantime::format_duration(MAX_WINDOW)
                ),
            })
        }
    }
}

/// Runs the agent until SIGINT or SIGTERM (or its recording fails); returns the exit code.
pub async fn serve(mut config: AgentConfig) -> Result<i32> {
    use tokio::signal::unix::{signal, SignalKind};
    crate::kernel::check_privileges()?;
    let listener = match &config.listen {
        Some(l) => Some(http::bind(&l.listen, l.mode, l.group).await?),
        None => None,
    };
    let limits = http::Limits::for_fd_limit(
        raise_fd_limit(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    let token = config.listen.as_mut().and_then(|l| l.token.take());
    let tls = config.listen.as_mut().and_then(|l| l.tls.take());
    let mut sigint = signal(SignalKind::interrupt()).map_err(anyhow::Error::from)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(anyhow::Error::from)?;
    let shared = Arc::new(Shared {
        ring: Ring::default(),
        metrics: Arc::new(Metrics::new()),
        window: config.window,
        copies: crate::process::copies::CopyBudget::mib(config.copy_budget_mib),
    });
    shared
        .metrics
        .copy_budget_bytes
        .set(shared.copies.limit() as i64);
    let host = labels::host_name();
    let (queue, exporter) = match &config.export {
        Some(export) => {
            let (queue, task) = export::start(export, host.clone(), Arc::clone(&shared.metrics))?;
            (Some(queue), Some(task))
        }
        None => (None, None),
    };
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
    let listen = config
        .listen
        .as_ref()
        .map(|l| match (&l.listen, tls.is_some()) {
            (peer::Listen::Tcp(addr), true) => format!("https://{addr}"),
            (listen, _) => listen.to_string(),
        });
    let thread = {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("agent-recording".into())
            .spawn(move || {
                let result = record(config, host, queue, &shared, stop_rx, started_tx);
                let _ = done_tx.send(result);
            })
            .map_err(anyhow::Error::from)?
    };
    match started_rx.await {
        Ok(Ok(sampling)) => eprintln!(
            "bpfprof agent: sampling {sampling}{}",
            listen.map_or(String::new(), |a| format!(
                "; serving {a}/debug/pprof/profile and /metrics (at most {} connections, {} \
                 per peer)",
                limits.connections, limits.per_peer
            ))
        ),
        Ok(Err(e)) => {
            let _ = thread.join();
            return Err(e);
        }
        Err(_) => {
            let _ = thread.join();
            return Err(Error::Other(anyhow::anyhow!("the recording thread ended")));
        }
    }
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = listener.map(|listener| {
        let shared = Arc::clone(&shared);
        tokio::spawn(http::serve(listener, shared, token, tls, limits, async {
            let _ = server_stopped.await;
        }))
    });
    let ended = tokio::select! {
        _ = sigint.recv() => None,
        _ = sigterm.recv() => None,
        result = &mut done_rx => Some(result),
    };
    let _ = stop.send(true);
    let _ = stop_server.send(());
    if let Some(server) = server {
        let _ = server.await;
    }
    let result = match ended {
        Some(result) => result,
        None => done_rx.await,
    };
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    // The recording thread dropped its end of the queue: the exporter spools what is queued
    // and sends what it can; what it cannot stays spooled for the next start.
    if let Some(exporter) = exporter {
        let bound = export::REQUEST_TIMEOUT * (export::QUEUE_WINDOWS as u32 + 1);
        if tokio::time::timeout(bound, exporter).await.is_err() {
            log::warn!("the exporter did not finish sending within {bound:?}");
        }
    }
    match result {
        Ok(Ok(())) => Ok(exit_code::OK),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::Other(anyhow::anyhow!(
            "the recording thread panicked"
        ))),
    }
}

/// Raises this process's soft limit on open files to its hard limit (the agent holds perf
/// events, maps and symbol files besides the endpoint's connections, which are bounded
/// below it: [`http::Limits`]); returns the soft limit now.
fn raise_fd_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            limit = raised;
        }
    }
    limit.current.unwrap_or(u64::MAX)
}

/// The recording thread: starts sampling (saying how through `started`), then runs the one
/// run loop ([`run_loop::run`]), ticking and cutting windows, until `stop` says so.
fn record(
    config: AgentConfig,
    host: String,
    export: Option<export::Queue>,
    shared: &Shared,
    stop: tokio::sync::watch::Receiver<bool>,
    started: tokio::sync::oneshot::Sender<Result<String>>,
) -> Result<()> {
    let table_cache = crate::unwind::open_table_cache(&config.table_cache);
    let mut pool = ProgramPool::new(false)
        .with_build_priority(crate::unwind::BuildPriority::Background)
        .with_table_cache(table_cache.clone());
    let mut recording = Recording::new(&config.request);
    // Every process's copies count against the agent's one budget.
    recording.set_copy_budget(shared.copies.clone());
    let start = start(&config, &mut pool, &mut recording);
    let start = start.map(|()| {
        recording
            .sampling()
            .map_or_else(|| "nothing".to_string(), |s| s.describe())
    });
    let failed = start.as_ref().err().map(|e| e.to_string());
    let _ = started.send(start);
    if let Some(e) = failed {
        return Err(Error::Other(anyhow::anyhow!(e)));
    }
    let agent = Agent {
        config,
        shared,
        symbolizer: Symbolizer::new().with_kernel_cache(table_cache.map(|c| c as _)),
        labels: HashMap::new(),
        host,
        export,
        window_start: SystemTime::now(),
        evictions: 0,
        copy_refusals: 0,
    };
    let next_cut = Instant::now() + agent.config.window;
    let mut driver = AgentLoop {
        agent,
        recording: &mut recording,
        pool: &mut pool,
        stop,
        next_cut,
    };
    // The one run loop every driver runs, on this thread (a runtime of its own: the
    // recording never waits for the HTTP server's or the exporter's tasks, nor they for it).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(anyhow::Error::from)?;
    runtime.block_on(async {
        loop {
            // The agent has no deadline: the loop is given one a day away, and entered again
            // when it passes.
            let deadline = Instant::now() + Duration::from_secs(24 * 3600);
            match run_loop::run(&mut driver, deadline).await? {
                RunEnd::Completed => continue,
                _ => return Ok(()),
            }
        }
    })
}

/// The agent's part of the run loop: each tick also reads the labels of new processes and,
/// every `--window`, cuts a window; the loop stops when the agent is asked to.
struct AgentLoop<'a, 'r> {
    agent: Agent<'a>,
    recording: &'r mut Recording,
    pool: &'r mut ProgramPool,
    stop: tokio::sync::watch::Receiver<bool>,
    next_cut: Instant,
}

impl RunDriver for AgentLoop<'_, '_> {
    type Error = Error;

    async fn tick(&mut self) -> Result<Option<RunEnd>> {
        self.recording.tick(self.pool);
        self.recording.name_runtime_frames(false);
        self.agent.observe(self.recording);
        if Instant::now() >= self.next_cut {
            self.agent.cut(self.recording, self.pool)?;
            self.next_cut += self.agent.config.window;
            // Behind by more than a window (a very slow symbolization): start afresh.
            if self.next_cut < Instant::now() {
                self.next_cut = Instant::now() + self.agent.config.window;
            }
        }
        Ok(None)
    }

    async fn stopped(&mut self) -> RunEnd {
        // A closed channel (the server gone) stops the loop as well.
        let _ = self.stop.wait_for(|stop| *stop).await;
        RunEnd::Interrupted
    }
}

/// Starts sampling what `config` names.
fn start(config: &AgentConfig, pool: &mut ProgramPool, recording: &mut Recording) -> Result<()> {
    if recording.is_system() {
        return recording.start_system(pool);
    }
    for spec in &config.targets {
        recording.add_target(pool, Target::resolve(spec)?)?;
    }
    Ok(())
}

/// The recording thread's state besides the recording.
struct Agent<'a> {
    config: AgentConfig,
    shared: &'a Shared,
    symbolizer: Symbolizer,
    /// Each living process's labels, read when it was first seen.
    labels: HashMap<u32, ProcessLabels>,
    host: String,
    /// The exporter's queue, when windows are exported.
    export: Option<export::Queue>,
    window_start: SystemTime,
    /// Unwind tables evicted as of the last window.
    evictions: u64,
    /// Objects refused a sealed copy as of the last window.
    copy_refusals: u64,
}

impl Agent<'_> {
    /// Reads the labels of the processes seen for the first time (while they live: a
    /// process's cgroup and executable cannot be read after its exit).
    fn observe(&mut self, recording: &Recording) {
        for p in recording.processes() {
            if p.exited || p.target.pid == 0 {
                continue;
            }
            let known = self
                .labels
                .get(&p.target.pid)
                .is_some_and(|l| l.start_time == p.target.start_time);
            if !known {
                let comm = if p.maps.comm().is_empty() {
                    &p.target.comm
                } else {
                    p.maps.comm()
                };
                let read = labels::read(
                    p.target.pid,
                    comm,
                    p.target.start_time,
                    &self.config.rules,
                    &self.host,
                );
                self.labels.insert(p.target.pid, read);
            }
        }
    }

    /// Cuts a window from the recording, labels it and puts it in the ring.
    fn cut(&mut self, recording: &mut Recording, pool: &mut ProgramPool) -> Result<()> {
        let building = Instant::now();
        let mut profile =
            recording.take_window(pool, &mut self.symbolizer, &self.config.request.options)?;
        let end = SystemTime::now();
        let metrics = &self.shared.metrics;
        let daemon = labels::daemon_runs(&self.config.socket);
        if daemon.is_none() {
            metrics.daemon_unreachable.inc();
        }
        let (window_start, runs) = (self.window_start, daemon.as_ref());
        let tags_of = |owner: Option<u32>| {
            runs.map(|(runs, ns)| {
                let runs: Vec<_> = runs
                    .iter()
                    .filter(|r| owner.is_none_or(|uid| r.owner_uid == uid))
                    .cloned()
                    .collect();
                labels::run_tags(&runs, *ns, window_start, end)
            })
        };
        let mut tags = tags_of(None);
        // Each user's own runs' tags, for the users who own a process of the window.
        let mut own_tags: HashMap<u32, Option<labels::RunTags>> = HashMap::new();
        let pids: HashSet<u32> = profile
            .stacks
            .iter()
            .filter_map(|s| profile.stack_pid(s))
            .collect();
        let mut process_labels = BTreeMap::new();
        let mut owners = Owners::default();
        for pid in pids {
            let mut labels = self
                .labels
                .get(&pid)
                .map(|l| l.labels.clone())
                .unwrap_or_default();
            let run_tags = tags.as_mut().and_then(|t| t.remove(&pid));
            // The owner read when the process was first seen, if it still owns it now: a
            // process that exited (its owner cannot be checked again: it may have exec'd a
            // setuid program) or changed owner during the window is shown to root alone.
            let owner = self
                .labels
                .get(&pid)
                .and_then(|l| l.uid)
                .filter(|&uid| labels::process_owner(pid) == Some(uid));
            if let Some(uid) = owner {
                owners.uid.insert(pid, uid);
                if let Some(run_tags) = &run_tags {
                    let own = own_tags
                        .entry(uid)
                        .or_insert_with(|| tags_of(Some(uid)))
                        .as_ref()
                        .and_then(|t| t.get(&pid));
                    let hidden: Vec<(String, String)> = run_tags
                        .iter()
                        .filter(|t| !own.is_some_and(|own| own.contains(t)))
                        .cloned()
                        .collect();
                    if !hidden.is_empty() {
                        owners.hidden_labels.insert(pid, hidden);
                    }
                }
            }
            if let Some(run_tags) = run_tags {
                labels.extend(run_tags);
            }
            if !labels.is_empty() {
                process_labels.insert(pid, labels);
            }
        }
        profile.process_labels = process_labels;
        // A process whose owner changed since it was first seen is read again next window.
        for (pid, l) in &mut self.labels {
            if !owners.uid.contains_key(pid) {
                l.uid = labels::process_owner(*pid);
            }
        }
        // Exited processes were dropped by the window: so are their labels.
        let living: HashSet<u32> = recording.processes().map(|p| p.target.pid).collect();
        self.labels.retain(|pid, _| living.contains(pid));

        metrics.samples.inc_by(profile.total_samples());
        let (_, off_cpu) = profile.time_totals();
        metrics
            .off_cpu_seconds
            .inc_by(off_cpu.values().sum::<u64>() as f64 / 1e9);
        metrics.add_losses(&profile.meta.losses);
        metrics.windows.inc();
        metrics.processes.set(living.len() as i64);
        metrics.labelled_processes.set(self.labels.len() as i64);
        let cost = &profile.meta.cost;
        metrics
            .unwind_resident_bytes
            .set(cost.unwind_resident_bytes as i64);
        metrics
            .unwind_array_bytes
            .set(cost.unwind_array_bytes as i64);
        metrics
            .python_code_objects
            .set(cost.python_code_objects as i64);
        let (evictions, stacks) = recording.kept_state(pool);
        metrics.cap_hit(Cap::UnwindTables, evictions.saturating_sub(self.evictions));
        self.evictions = evictions;
        metrics.stacks_kept.set(stacks as i64);
        let (entries, files) = self.symbolizer.cache_sizes();
        if entries > MAX_SYMBOL_CACHE || files > MAX_SYMBOL_FILES {
            log::info!("symbol caches at {entries} names and {files} files: emptied");
            self.symbolizer.forget();
            metrics.cap_hit(Cap::SymbolCache, 1);
        }
        let (entries, files) = self.symbolizer.cache_sizes();
        metrics.symbol_cache_entries.set(entries as i64);
        metrics.symbol_files.set(files as i64);
        metrics
            .window_build_seconds
            .set(building.elapsed().as_secs_f64());
        let copies = &self.shared.copies;
        metrics.cap_hit(
            Cap::CopyBudget,
            copies.refusals().saturating_sub(self.copy_refusals),
        );
        self.copy_refusals = copies.refusals();
        metrics.update_own_cost(copies.used());
        let window = Arc::new(Window {
            start: self.window_start,
            end,
            profile,
            owners,
        });
        self.window_start = end;
        if let Some(queue) = &self.export {
            for backend in queue.offer(&window) {
                metrics.export(backend, "queue_full");
            }
        }
        if self.shared.ring.push(window) {
            metrics.cap_hit(Cap::WindowRing, 1);
        }
        metrics.windows_kept.set(self.shared.ring.len() as i64);
        Ok(())
    }
}
