//! Runs of the daemon: validation and authorization of a run request, the shared kernel
//! programs (one per distinct sampling setting) with a run slot per run, each run's monitor
//! task, and the processing of its results.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{watch, Notify};

use crate::{
    agent::{export::Queue, labels, windows::Window},
    clock::thread_cpu_time,
    daemon::store::{now_ms, Store},
    error::Error,
    kernel::pool::ProgramPool,
    output::{summary, top::function_shares, write_all, Format, Output},
    process::copies::CopyBudget,
    process::target::{Owner, Target, TargetSpec},
    profile::CostScope,
    profile::RunEnd,
    protocol::{ErrorCode, Reply, RunInfo, RunRequest, RunState, TopFunction, READ_CHUNK_BYTES},
    recording::aggregate::pstats_view,
    recording::request::RecordingRequest,
    recording::{
        run_loop::{self, RunDriver},
        Recording,
    },
    runtime::shares::NamingShares,
    symbolize::{Symbolizer, SymbolizerThread},
};

/// Formats a run writes when the request names none.
const DEFAULT_FORMATS: [Format; 5] = [
    Format::Svg,
    Format::Folded,
    Format::Pprof,
    Format::Speedscope,
    Format::Pstats,
];
/// How long the daemon keeps its last kernel program loaded (detached) after the last run:
/// runs in a series (a library profiling one call after another) then start without loading
/// and verifying it again, with their unwind tables resident.
pub const PROGRAM_LINGER: Duration = Duration::from_secs(30);
/// The label (pprof) and attribute (OTLP) of an exported run's id.
pub const RUN_ID_LABEL: &str = "run_id";
/// The label and attribute of the uid of an exported run's owner (the user who started it).
pub const OWNER_UID_LABEL: &str = "owner_uid";
/// Highest sampling rate a non-root client may ask for: a run's timer fires on every CPU of
/// the machine, so its rate is a cost every user pays.
pub const MAX_USER_HZ: f64 = 1000.0;

/// Limits of the daemon.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Most runs sampling at once.
    pub max_runs: usize,
    /// Most runs one non-root user may have sampling at once.
    pub max_runs_per_user: usize,
    /// Longest run.
    pub max_duration: Duration,
    /// The cap on a kernel program's unwind row array, in MiB.
    pub table_mib: u32,
    /// The budget of one user's sealed copies of targets' files, in MiB.
    pub copy_budget_mib: u64,
}

/// Most distinct pid namespaces one non-root user's runs may watch at once: the kernel
/// program watches at most `MAX_PID_NAMESPACES` for everyone.
pub const MAX_NAMESPACES_PER_USER: usize = 2;

/// The daemon's part of the run loop: a tick runs on a blocking thread (it reads kernel maps,
/// may build unwind tables or name Python code), waiting for the pool there and never on the
/// thread that answers clients; a client's `stop` ends the run.
struct DaemonDriver {
    runs: Arc<Runs>,
    id: u64,
    /// Away on the blocking thread while a tick runs; lost only with a tick that panicked.
    recording: Option<Recording>,
    /// The run's CPU time so far.
    cpu: Duration,
    stop: Arc<Notify>,
}

impl RunDriver for DaemonDriver {
    type Error = String;

    async fn tick(&mut self) -> Result<Option<RunEnd>, String> {
        let Some(mut recording) = self.recording.take() else {
            return Err("the run's recording was lost".into());
        };
        let runs = self.runs.clone();
        let ticked = tokio::task::spawn_blocking(move || {
            let before = thread_cpu_time();
            let status = recording.tick(&mut runs.lock_pool());
            // Off the programs' lock, within the owner's share.
            recording.name_runtime_frames(false);
            (recording, status, thread_cpu_time().saturating_sub(before))
        })
        .await;
        // The recording (and its run slots) went with a panicked tick.
        let (recording, status, used) =
            ticked.map_err(|e| format!("a tick of the run panicked: {e}"))?;
        self.recording = Some(recording);
        self.cpu += used;
        if let Some(run) = self.runs.lock().runs.get_mut(&self.id) {
            run.info.samples = status.samples;
        }
        Ok(status.all_exited.then_some(RunEnd::TargetExited))
    }

    async fn stopped(&mut self) -> RunEnd {
        self.stop.notified().await;
        RunEnd::Interrupted
    }
}

/// Who sent a request, from the socket's peer credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The client's user id.
    pub uid: u32,
    /// The client's group id.
    pub gid: u32,
}

struct RunEntry {
    info: RunInfo,
    stop: Arc<Notify>,
    state: watch::Sender<RunState>,
}

/// What clients see of the runs: behind a lock held only to copy or change this data, never
/// across kernel work, file I/O or symbolization, so that every client is answered at once
/// whatever a run is doing.
struct Table {
    runs: HashMap<u64, RunEntry>,
    next_id: u64,
    /// Runs being started (attaching, building unwind tables), not yet shown to anyone: they
    /// count against the limits, so that concurrent starts cannot exceed them.
    starting: HashMap<u64, Starting>,
    next_starting: u64,
}

/// A run being started, as the limits count it.
#[derive(Clone, Copy)]
struct Starting {
    uid: u32,
    pid_ns: u64,
}

/// Every run the daemon knows, and the kernel programs behind them.
///
/// Two locks: `table` (what clients ask about) and `pool` (the kernel programs, and every
/// kernel map behind them). Kernel work (attaching, ticks, collecting) runs on blocking
/// threads and takes only `pool`; nothing holds `table` while it waits for `pool`.
pub struct Runs {
    table: Mutex<Table>,
    /// The kernel programs of the runs in flight; empty (nothing attached) when none is.
    pool: Mutex<ProgramPool>,
    symbolizer: SymbolizerThread,
    /// Every run's naming of Python frames, shared fairly between their owners.
    naming: Arc<NamingShares>,
    store: Store,
    limits: Limits,
    /// Where finished runs' profiles go, until the daemon shuts down.
    export: Mutex<Option<Export>>,
    /// Each user's budget for the sealed copies of their runs' targets' files (by the runs'
    /// owner uid): every run of one user counts against one, and shares its copies.
    copies: Mutex<HashMap<u32, CopyBudget>>,
}

/// The exporter's end for finished runs: its queue (the agent's exporter,
/// [`crate::agent::export`]) and this host's name.
pub struct Export {
    /// The exporter's bounded queue.
    pub queue: Queue,
    /// This host's name, the `host.name` of every profile.
    pub host: String,
}

/// A start's place in [`Table::starting`], given back when the start ends either way.
struct StartReservation<'a> {
    runs: &'a Runs,
    key: u64,
}

impl Drop for StartReservation<'_> {
    fn drop(&mut self) {
        self.runs.lock().starting.remove(&self.key);
    }
}

/// A request error: what goes back to the client.
pub type Refusal = (ErrorCode, String);

fn refusal(e: Error) -> Refusal {
    let code = match &e {
        Error::NoSuchProcess(_) => ErrorCode::NoSuchProcess,
        Error::PermissionDenied(_) => ErrorCode::PermissionDenied,
        Error::EventUnsupported(_) => ErrorCode::Unsupported,
        Error::Busy(_) => ErrorCode::TooManyRuns,
        Error::InvalidSampling(_)
        | Error::InvalidTarget { .. }
        | Error::InvalidOutput(_)
        | Error::InvalidTag(_)
        | Error::Usage(_) => ErrorCode::BadRequest,
        _ => ErrorCode::Internal,
    };
    (code, e.to_string())
}

impl Runs {
    /// Loads the runs kept in `store` (marking interrupted ones FAILED) and applies cleanup.
    pub fn new(
        store: Store,
        limits: Limits,
        export: Option<Export>,
        table_cache: Option<Arc<crate::unwind::TableCache>>,
    ) -> Runs {
        let loaded = store.load_all();
        let deleted = store.cleanup(&loaded.runs);
        let next_id = loaded.next_id;
        let runs = loaded
            .runs
            .into_iter()
            .filter(|r| !deleted.contains(&r.run_id))
            .map(|info| {
                let (state, _) = watch::channel(info.state);
                (
                    info.run_id,
                    RunEntry {
                        info,
                        stop: Arc::new(Notify::new()),
                        state,
                    },
                )
            })
            .collect();
        Runs {
            table: Mutex::new(Table {
                runs,
                next_id,
                starting: HashMap::new(),
                next_starting: 0,
            }),
            pool: Mutex::new(
                ProgramPool::new(false)
                    .with_linger(PROGRAM_LINGER)
                    .with_build_priority(crate::unwind::BuildPriority::SampledFirst)
                    .with_table_cache(table_cache.clone()),
            ),
            symbolizer: SymbolizerThread::spawn(table_cache.map(|c| c as _))
                .expect("spawning the symbolizer thread"),
            naming: Arc::new(NamingShares::per_owner()),
            store,
            limits,
            export: Mutex::new(export),
            copies: Mutex::new(HashMap::new()),
        }
    }

    /// The budget of `uid`'s sealed copies, shared by all of that user's runs.
    fn copy_budget(&self, uid: u32) -> CopyBudget {
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        // Users whose runs and copies are all gone are forgotten.
        copies.retain(|_, budget| budget.shared());
        copies
            .entry(uid)
            .or_insert_with(|| CopyBudget::mib(self.limits.copy_budget_mib))
            .clone()
    }

    /// Closes the exporter's queue (at shutdown): it ends once it spooled what was queued.
    pub fn close_export(&self) {
        self.export.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Hands run `id`'s profile to the exporter, with its run id, owner and each process's
    /// labels, without waiting; `ended` is when sampling ended.
    fn export(
        &self,
        id: u64,
        owner: u32,
        mut profile: crate::profile::Profile,
        ended: std::time::SystemTime,
    ) {
        let (queue, host) = match &*self.export.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(export) => (export.queue.clone(), export.host.clone()),
            None => return,
        };
        let pids: std::collections::BTreeSet<u32> = profile
            .stacks
            .iter()
            .filter_map(|s| profile.stack_pid(s))
            .collect();
        let comms: HashMap<u32, String> = profile
            .meta
            .targets
            .iter()
            .map(|t| (t.pid, t.comm.clone()))
            .collect();
        // The run's id and owner are the daemon's to say: a tag of the same key is left out.
        profile
            .meta
            .tags
            .retain(|t| t.key != RUN_ID_LABEL && t.key != OWNER_UID_LABEL);
        let rules = Default::default();
        for pid in pids {
            let comm = comms.get(&pid).map_or("", String::as_str);
            // Read at the run's end: a process that exited keeps its name as its service.
            let mut process = labels::read(pid, comm, 0, &rules, &host).labels;
            process.push((RUN_ID_LABEL.into(), id.to_string()));
            process.push((OWNER_UID_LABEL.into(), owner.to_string()));
            profile.process_labels.insert(pid, process);
        }
        let start = ended.checked_sub(profile.meta.duration).unwrap_or(ended);
        let window = Arc::new(Window {
            start,
            end: ended,
            profile,
            // Exported only, never served over HTTP.
            owners: Default::default(),
        });
        for backend in queue.offer(&window) {
            log::warn!(
                "run {id}: the {backend} exporter's queue is full: its profile is not exported"
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_pool(&self) -> std::sync::MutexGuard<'_, ProgramPool> {
        // Likewise: a panicked tick leaves the pool as an error would.
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a run for client `uid`; returns once it samples. Blocks (attaching, building
    /// the target's unwind tables): call it on a blocking thread. A refused request leaves
    /// nothing behind: no run, no run id, nothing attached.
    pub fn start(self: &Arc<Self>, peer: Peer, req: RunRequest) -> Result<Reply, Refusal> {
        let uid = peer.uid;
        let validated = self.validate(uid, &req)?;
        if req.pid == 0 {
            return Err((ErrorCode::BadRequest, "pid must be positive".into()));
        }
        let spec = match req.pid_ns {
            Some(ns) => TargetSpec::NsPid { ns, pid: req.pid },
            None => TargetSpec::Pid(req.pid),
        };
        let owner = (uid != 0).then_some(Owner { uid, gid: peer.gid });
        let target = match (Target::resolve(&spec), owner) {
            (Ok(target), Some(owner)) if !target.profilable_by(owner) => {
                return Err(not_profilable(&spec))
            }
            (Ok(target), _) => target,
            // A missing process and another user's are refused alike: the refusal says
            // nothing of a process the client may not see.
            (Err(Error::NoSuchProcess(_) | Error::PermissionDenied(_)), Some(_)) => {
                return Err(not_profilable(&spec))
            }
            (Err(e), _) => return Err(refusal(e)),
        };

        let reservation = self.reserve_start(uid, target.ns.ino)?;
        let mut recording = Recording::new(&validated.recording);
        recording.set_warm(self.symbolizer.warm_sink());
        recording.set_naming_shares(Arc::clone(&self.naming));
        recording.set_copy_budget(self.copy_budget(uid));
        if let Some(owner) = owner {
            // Checked again once the kernel watches it, at every exec and for every child.
            recording.set_owner(owner);
        }
        // Takes the pool only for kernel work, not while it builds the target's unwind tables
        // or waits for the walker; never the client table.
        let before = thread_cpu_time();
        let added = recording.add_target(&mut &self.pool, target.clone());
        let start_cpu = thread_cpu_time().saturating_sub(before);
        if let Err(e) = added {
            // Release whatever the failed attach took.
            let _ = recording.collect(&mut self.lock_pool());
            return Err(match e {
                Error::PermissionDenied(_) if owner.is_some() => not_profilable(&spec),
                e => refusal(e),
            });
        }
        let sampling = recording.sampling().expect("a target was added");
        let id = {
            let mut table = self.lock();
            table.next_id += 1;
            table.next_id - 1
        };
        if let Err(e) = self.store.create_run_dir(id) {
            let _ = recording.collect(&mut self.lock_pool());
            let mut table = self.lock();
            // A refused request leaves no run id behind, unless another start took a later one.
            if table.next_id == id + 1 {
                table.next_id = id;
            }
            return Err((ErrorCode::Internal, format!("{e:#}")));
        }
        let info = RunInfo {
            run_id: id,
            state: RunState::Running,
            reason: None,
            samples: 0,
            pid: req.pid,
            pid_ns: target.ns.ino,
            comm: target.comm.clone(),
            owner_uid: uid,
            sample_tags: req.sample_tags.clone(),
            tags: req.tags.clone(),
            created_unix_ms: now_ms(),
            ended_unix_ms: None,
            files: BTreeMap::new(),
            top: Vec::new(),
            summary: None,
        };
        let (state, _) = watch::channel(RunState::Running);
        let stop = Arc::new(Notify::new());
        {
            let mut table = self.lock();
            table.runs.insert(
                id,
                RunEntry {
                    info: info.clone(),
                    stop: stop.clone(),
                    state,
                },
            );
            // The run now counts as itself.
            table.starting.remove(&reservation.key);
        }
        drop(reservation);
        let _ = self.store.save(&info);
        log::info!(
            "run {id}: uid {uid} profiles pid {} ({}) with {}",
            target.pid,
            target.comm,
            sampling.describe()
        );
        let runs = self.clone();
        tokio::spawn(async move {
            runs.monitor(id, recording, stop, validated, start_cpu)
                .await;
        });
        Ok(Reply::for_run(&info, false))
    }

    /// Checks the limits of runs for a start by `uid` in pid namespace `pid_ns` and holds its
    /// place among them until the start ends.
    fn reserve_start(&self, uid: u32, pid_ns: u64) -> Result<StartReservation<'_>, Refusal> {
        let mut table = self.lock();
        // Runs that sample: a stopped run writing its results holds no run slot any more.
        let active: Vec<Starting> = table
            .runs
            .values()
            .map(|r| &r.info)
            .filter(|i| matches!(i.state, RunState::Preparing | RunState::Running))
            .map(|i| Starting {
                uid: i.owner_uid,
                pid_ns: i.pid_ns,
            })
            .chain(table.starting.values().copied())
            .collect();
        // The global count is not told to clients: it says what other users do.
        if active.len() >= self.limits.max_runs {
            return Err((
                ErrorCode::TooManyRuns,
                "the daemon is at its limit of runs in progress; try again when one ends".into(),
            ));
        }
        if uid != 0 {
            let own: Vec<&Starting> = active.iter().filter(|i| i.uid == uid).collect();
            if own.len() >= self.limits.max_runs_per_user {
                return Err((
                    ErrorCode::TooManyRuns,
                    format!(
                        "you have {} runs in progress, the most one user may; stop one or \
                         wait for one to end",
                        own.len()
                    ),
                ));
            }
            let mut namespaces: Vec<u64> = own.iter().map(|i| i.pid_ns).collect();
            namespaces.sort_unstable();
            namespaces.dedup();
            if !namespaces.contains(&pid_ns) && namespaces.len() >= MAX_NAMESPACES_PER_USER {
                return Err((
                    ErrorCode::TooManyRuns,
                    format!(
                        "your runs already watch {MAX_NAMESPACES_PER_USER} pid namespaces, the \
                         most one user may; wait for one of them to end"
                    ),
                ));
            }
        }
        let key = table.next_starting;
        table.next_starting += 1;
        table.starting.insert(key, Starting { uid, pid_ns });
        Ok(StartReservation { runs: self, key })
    }

    fn validate(&self, uid: u32, req: &RunRequest) -> Result<Validated, Refusal> {
        let bad = |m: String| (ErrorCode::BadRequest, m);
        let recording = RecordingRequest::from_run_request(
            req,
            self.limits.max_duration,
            self.limits.table_mib,
        )
        .map_err(refusal)?;
        let hz = recording.nominal_hz();
        if uid != 0 && hz > MAX_USER_HZ {
            return Err(bad(format!(
                "{hz:.0} samples/s is above the {MAX_USER_HZ:.0} a non-root user may ask for \
                 (every CPU of the machine pays for the rate); ask for less"
            )));
        }
        let formats = match &req.formats {
            None => DEFAULT_FORMATS.to_vec(),
            Some(names) => {
                let mut formats = Vec::new();
                for name in names {
                    let f: Format = name.parse().map_err(|e: Error| bad(e.to_string()))?;
                    if f != Format::SummaryJson && !formats.contains(&f) {
                        formats.push(f);
                    }
                }
                formats
            }
        };
        let mut recording = recording;
        // A trace is drawn from each sample's time: the kernel records it for this run only.
        recording.options.timeline = formats.contains(&Format::TraceJson);
        Ok(Validated { recording, formats })
    }

    async fn monitor(
        self: Arc<Self>,
        id: u64,
        recording: Recording,
        stop: Arc<Notify>,
        validated: Validated,
        mut cpu: Duration,
    ) {
        let duration = validated
            .recording
            .duration
            .unwrap_or(self.limits.max_duration);
        let deadline = recording.started() + duration;
        // The run's sampling stops at its deadline even while a tick holds the pool (at a
        // high rate one took seconds); its program's other runs go on.
        let stoppers = recording.run_stoppers(&mut self.lock_pool());
        let guard = run_loop::DeadlineGuard::spawn(deadline, move || {
            stoppers.iter().for_each(crate::kernel::RunStopper::stop)
        });
        let mut driver = DaemonDriver {
            runs: self.clone(),
            id,
            recording: Some(recording),
            cpu,
            stop,
        };
        let ended = run_loop::run(&mut driver, deadline).await;
        let ended_at = std::time::SystemTime::now();
        // Joined off the reactor: the thread has stopped sampling, or will not now.
        let _ = tokio::task::spawn_blocking(move || guard.finish()).await;
        cpu = driver.cpu;
        let (mut recording, end) = match (driver.recording.take(), ended) {
            (Some(recording), Ok(end)) => (recording, end),
            (_, Err(reason)) => {
                self.finish_off_reactor(id, RunState::Failed, Some(reason), None)
                    .await;
                return;
            }
            (None, Ok(_)) => unreachable!("only a panicked tick loses the recording"),
        };
        {
            // Saving the state syncs a file: not on the thread that answers clients.
            let runs = self.clone();
            let _ =
                tokio::task::spawn_blocking(move || runs.set_state(id, RunState::Processing)).await;
        }
        let runs = self.clone();
        let collected = tokio::task::spawn_blocking(move || {
            let before = thread_cpu_time();
            // The last Python stacks are named off the programs' lock, with the extra CPU a
            // run's end gets; `collect` names what came since within the owner's share.
            recording.queue_runtime_stacks(&mut runs.lock_pool());
            recording.name_runtime_frames(true);
            let collected = recording.collect(&mut runs.lock_pool());
            (collected, thread_cpu_time().saturating_sub(before))
        })
        .await;
        let collected = match collected {
            Ok((collected, used)) => {
                cpu += used;
                collected
            }
            Err(e) => {
                let reason = format!("collecting the run's samples panicked: {e}");
                self.finish_off_reactor(id, RunState::Failed, Some(reason), None)
                    .await;
                return;
            }
        };
        // The program may now be the pool's idle spare: unload it once it has lingered.
        let runs = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(PROGRAM_LINGER + Duration::from_millis(100)).await;
            let _ = tokio::task::spawn_blocking(move || runs.lock_pool().expire_idle()).await;
        });
        let owner = self.owner(id);
        let final_state = if end == RunEnd::Interrupted {
            RunState::Stopped
        } else {
            RunState::Success
        };
        let runs = self.clone();
        let result = self
            .symbolizer
            .run(move |symbolizer| -> Result<Processed, Error> {
                let before = thread_cpu_time();
                let mut collected = collected?;
                if !may_see_kernel_frames(owner) {
                    collected.drop_kernel_frames();
                }
                // Once the run's frames are named (`assemble` took the run's own handles on
                // its targets' files), the symbolizer closes the files it opened for it, a
                // target's deleted binaries among them, before the profile is built.
                let mut profile = collected.assemble(
                    end,
                    symbolizer,
                    &validated.recording.options,
                    Symbolizer::release,
                );
                symbolizer.bound();
                // The daemon serves many runs: this run's cost is the CPU spent on its work
                // (attach, ticks, collection, processing), beside the daemon's peak memory.
                cpu += thread_cpu_time().saturating_sub(before);
                profile.meta.cost.profiler_cpu_secs = cpu.as_secs_f64();
                profile.meta.cost.scope = CostScope::DaemonRun;
                let owner = runs.owner(id);
                let mut files = BTreeMap::new();
                let mut formats = validated.formats.clone();
                formats.push(Format::SummaryJson);
                let outputs = formats.iter().map(|&format| {
                    let (file, path) = runs
                        .store
                        .create_result(id, &result_file_name(format), owner)
                        .map_err(Error::Other)?;
                    Ok(Output::to_file(file, path, format))
                });
                let view = formats
                    .contains(&Format::Pstats)
                    .then(|| pstats_view(&profile, &validated.recording.options))
                    .flatten();
                let wrote = write_all(&profile, view.as_ref(), outputs, |format, path| {
                    let path = path.map(|p| p.display().to_string()).unwrap_or_default();
                    files.insert(format.to_string(), path);
                });
                if let Err(e) = wrote {
                    // A full disk must not leave empty or partial files behind.
                    for format in formats {
                        runs.store.remove_result(id, &result_file_name(format));
                    }
                    return Err(e);
                }
                let mut json = Vec::new();
                summary::write(&profile, &mut json).map_err(|e| Error::Other(e.into()))?;
                let summary = serde_json::from_slice(&json).ok();
                let top = function_shares(&profile)
                    .into_iter()
                    .take(20)
                    .map(|s| TopFunction {
                        name: s.name,
                        self_samples: s.self_samples,
                        total_samples: s.total_samples,
                    })
                    .collect();
                let samples = profile.total_samples();
                // Queued, not sent: the run's results do not wait on a backend.
                runs.export(id, owner, profile, ended_at);
                Ok(Processed {
                    samples,
                    files,
                    top,
                    summary,
                })
            })
            .await;
        match result {
            Ok(Ok(processed)) => {
                self.finish_off_reactor(id, final_state, None, Some(processed))
                    .await
            }
            Ok(Err(e)) => {
                self.finish_off_reactor(id, RunState::Failed, Some(e.to_string()), None)
                    .await
            }
            Err(e) => {
                self.finish_off_reactor(id, RunState::Failed, Some(e), None)
                    .await
            }
        }
    }

    /// [`Self::finish`] on a blocking thread: it syncs the run's state file and cleans up
    /// old runs' folders, which must not hold up the thread that answers clients.
    async fn finish_off_reactor(
        self: &Arc<Self>,
        id: u64,
        state: RunState,
        reason: Option<String>,
        processed: Option<Processed>,
    ) {
        let runs = self.clone();
        let finished =
            tokio::task::spawn_blocking(move || runs.finish(id, state, reason, processed)).await;
        if let Err(e) = finished {
            log::warn!("finishing run {id} panicked: {e}");
        }
    }

    fn owner(&self, id: u64) -> u32 {
        self.lock()
            .runs
            .get(&id)
            .map(|r| r.info.owner_uid)
            .unwrap_or(0)
    }

    fn set_state(&self, id: u64, state: RunState) {
        let info = {
            let mut table = self.lock();
            let Some(run) = table.runs.get_mut(&id) else {
                return;
            };
            run.info.state = state;
            let _ = run.state.send(state);
            run.info.clone()
        };
        let _ = self.store.save(&info);
    }

    fn finish(
        &self,
        id: u64,
        state: RunState,
        reason: Option<String>,
        processed: Option<Processed>,
    ) {
        let mut info = match self.lock().runs.get(&id) {
            Some(run) => run.info.clone(),
            None => return,
        };
        info.state = state;
        info.reason = reason.clone();
        info.ended_unix_ms = Some(now_ms());
        if let Some(p) = processed {
            info.samples = p.samples;
            info.files = p.files;
            info.top = p.top;
            info.summary = p.summary;
        }
        match &reason {
            Some(r) => log::warn!("run {id}: {state}: {r}"),
            None => log::info!("run {id}: {state}, {} samples", info.samples),
        }
        // Saved before clients learn of it: a client told that a run ended must find it so
        // after a crash. Announced first, a crash during the sync brought the run back as
        // interrupted (FAILED) although its client had its results.
        if let Err(e) = self.store.save(&info) {
            log::warn!("saving run {id}: {e:#}");
        }
        {
            let mut table = self.lock();
            if let Some(run) = table.runs.get_mut(&id) {
                run.info = info.clone();
                let _ = run.state.send(state);
            }
        }
        let all: Vec<RunInfo> = self.lock().runs.values().map(|r| r.info.clone()).collect();
        let deleted = self.store.cleanup(&all);
        if !deleted.is_empty() {
            let mut table = self.lock();
            for d in deleted {
                table.runs.remove(&d);
            }
        }
    }

    /// The run `id` as client `uid` may see it.
    pub fn info(&self, uid: u32, id: u64) -> Result<RunInfo, Refusal> {
        let table = self.lock();
        match table.runs.get(&id) {
            Some(r) if uid == 0 || r.info.owner_uid == uid => Ok(r.info.clone()),
            _ => Err((ErrorCode::NotFound, format!("no run {id}"))),
        }
    }

    /// Asks run `id` to stop; returns its state after the request: PROCESSING for a run
    /// that was sampling (it now writes its results), as protocol.md says.
    pub fn stop(&self, uid: u32, id: u64) -> Result<RunInfo, Refusal> {
        let mut info = self.info(uid, id)?;
        if !info.state.is_final() {
            if let Some(r) = self.lock().runs.get(&id) {
                r.stop.notify_one();
            }
            info.state = RunState::Processing;
        }
        Ok(info)
    }

    /// Stops every run in flight (daemon shutdown) and waits for them to end.
    pub async fn stop_all(&self, timeout: Duration) {
        let receivers: Vec<watch::Receiver<RunState>> = {
            let table = self.lock();
            table
                .runs
                .values()
                .filter(|r| !r.info.state.is_final())
                .map(|r| {
                    r.stop.notify_one();
                    r.state.subscribe()
                })
                .collect()
        };
        let wait_all = async {
            for mut rx in receivers {
                let _ = rx.wait_for(|s| s.is_final()).await;
            }
        };
        let _ = tokio::time::timeout(timeout, wait_all).await;
    }

    /// Waits up to `wait` for run `id` to end, then returns it.
    pub async fn results(&self, uid: u32, id: u64, wait: Duration) -> Result<RunInfo, Refusal> {
        let info = self.info(uid, id)?;
        if info.state.is_final() || wait.is_zero() {
            return Ok(info);
        }
        let rx = self.lock().runs.get(&id).map(|r| r.state.subscribe());
        if let Some(mut rx) = rx {
            let _ = tokio::time::timeout(wait, rx.wait_for(|s| s.is_final())).await;
        }
        self.info(uid, id)
    }

    /// A chunk of result file `format` of run `id`, starting at `offset`.
    pub fn read(&self, uid: u32, id: u64, format: &str, offset: u64) -> Result<Reply, Refusal> {
        use std::io::{Read, Seek, SeekFrom};
        let info = self.info(uid, id)?;
        let not_found = || {
            (
                ErrorCode::NotFound,
                format!("run {id} has no {format} result"),
            )
        };
        let format: Format = format.parse().map_err(|_| not_found())?;
        if !info.state.is_final() || !info.files.contains_key(&format.to_string()) {
            return Err(not_found());
        }
        let internal = |e: std::io::Error| (ErrorCode::Internal, format!("reading run {id}: {e}"));
        let mut file = self
            .store
            .open_result(id, &result_file_name(format))
            .map_err(|e| (ErrorCode::Internal, format!("{e:#}")))?;
        let size = file.metadata().map_err(internal)?.len();
        file.seek(SeekFrom::Start(offset.min(size)))
            .map_err(internal)?;
        let mut chunk = Vec::with_capacity(READ_CHUNK_BYTES.min(size as usize));
        file.take(READ_CHUNK_BYTES as u64)
            .read_to_end(&mut chunk)
            .map_err(internal)?;
        use base64::Engine as _;
        Ok(Reply {
            run_id: Some(id),
            data: Some(base64::engine::general_purpose::STANDARD.encode(&chunk)),
            size: Some(size),
            ..Reply::ok()
        })
    }

    /// The runs client `uid` may see, oldest first.
    pub fn list(&self, uid: u32) -> Vec<RunInfo> {
        let table = self.lock();
        let mut runs: Vec<RunInfo> = table
            .runs
            .values()
            .filter(|r| uid == 0 || r.info.owner_uid == uid)
            .map(|r| {
                let mut info = r.info.clone();
                info.summary = None;
                info
            })
            .collect();
        runs.sort_by_key(|r| r.run_id);
        runs
    }
}

struct Validated {
    recording: RecordingRequest,
    formats: Vec<Format>,
}

struct Processed {
    samples: u64,
    files: BTreeMap<String, String>,
    top: Vec<TopFunction>,
    summary: Option<serde_json::Value>,
}

/// The name of a run's result file in `format`.
fn result_file_name(format: Format) -> String {
    format!("profile.{}", format.extension())
}

/// Whether user `uid` may see kernel frames: root always, others where
/// `kernel.perf_event_paranoid` lets unprivileged users profile the kernel (1 or less), as
/// `perf record` run by that user would.
fn may_see_kernel_frames(uid: u32) -> bool {
    uid == 0
        || std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .is_some_and(|level| level <= 1)
}

/// The refusal of a non-root client's target: the same words whether the process does not
/// exist, is another user's, or is the client's but setuid or undumpable, so that it reveals
/// nothing about other users' processes (not even that one exists).
fn not_profilable(spec: &TargetSpec) -> Refusal {
    (
        ErrorCode::PermissionDenied,
        format!(
            "you may not profile pid {spec}: no process you may profile has that pid (only \
             processes that run entirely as you, not setuid, not marked undumpable, can be \
             profiled by a non-root user)"
        ),
    )
}
