//! Profiling one closure of the calling process through the daemon.
//!
//! [`FunctionProfiler::profile`] starts a run on this process, waits until it is `RUNNING`,
//! runs the work, stops the run and collects its results. The work always keeps its own
//! result and its own panic; profiling failures are logged (or, with
//! [`ProfileOptions::stop_at_error`], returned) but never change what the work does.

use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{Client, ClientError, DEFAULT_CONNECT_TIMEOUT};
use crate::protocol::{Reply, RunRequest, RunState};

/// How often a run still `PREPARING` is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Set while a [`FunctionProfiler::profile`] call holds this process's one profiling run:
/// runs of one process would sample each other's work, so only one may be in flight.
static RUN_ACTIVE: AtomicBool = AtomicBool::new(false);

/// Holds [`RUN_ACTIVE`]; releasing it on drop frees the slot on every path, panics included.
struct RunSlot;

impl RunSlot {
    fn acquire() -> Option<RunSlot> {
        RUN_ACTIVE
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| RunSlot)
    }
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        RUN_ACTIVE.store(false, Ordering::Release);
    }
}

/// Why profiling a piece of work failed (the work's own outcome is never one of these).
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Another `profile` call of this process is running; only one run at a time.
    #[error("another bpfprof profiling run is in progress in this process")]
    Busy,
    /// Talking to the daemon failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The run did not reach `RUNNING` in time (it has been asked to stop).
    #[error("bpfprof run {run_id} still {state} after {waited:?}")]
    NotRunning {
        /// The run.
        run_id: u64,
        /// Its state when the wait ended.
        state: RunState,
        /// How long was waited.
        waited: Duration,
    },
    /// The run ended with `FAILED`, or ended before the work started.
    #[error(
        "bpfprof run {run_id} ended {state}: {}",
        reason.as_deref().unwrap_or("no reason given")
    )]
    RunFailed {
        /// The run.
        run_id: u64,
        /// Its final state.
        state: RunState,
        /// The daemon's reason.
        reason: Option<String>,
    },
    /// The run's results were not ready within the wait.
    #[error("bpfprof run {run_id} still {state} after waiting {waited:?} for its results")]
    NotFinished {
        /// The run.
        run_id: u64,
        /// Its state when the wait ended.
        state: RunState,
        /// How long was waited.
        waited: Duration,
    },
}

/// What a [`FunctionProfiler`] asks the daemon for, and how long it waits.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileOptions {
    /// Return profiling failures as errors instead of logging them. When set, a failure
    /// before the work starts (daemon absent or refusing, another run in progress) returns
    /// the error *without running the work*, and a failure after it returns the error and
    /// drops the work's result. Default false: the work always runs and keeps its result.
    pub stop_at_error: bool,
    /// Longest the run may last; work that takes longer is profiled for its first part only.
    pub max_profile_duration: Duration,
    /// `auto`, `cycles` or `cpu-clock`; `None` leaves the daemon's default (`auto`).
    pub event: Option<String>,
    /// How user stacks are walked: `auto`, `fp` or `cfi` (as `bpfprof --unwind`); `None`
    /// leaves the daemon's default (`auto`).
    pub unwind: Option<String>,
    /// Python frames of a CPython caller: `auto` or `off` (as `bpfprof --python`); `None`
    /// leaves it to the daemon (auto).
    pub python: Option<String>,
    /// What the profile measures: `cpu` or `wall` (CPU samples plus each thread's time off the
    /// CPU, as `bpfprof --mode wall`); `None` leaves the daemon's default (`cpu`).
    pub mode: Option<String>,
    /// Sampling period in event units (cycles, or ns for cpu-clock).
    pub sample_interval: i64,
    /// Samples per second; when set it is sent instead of `sample_interval`.
    pub frequency: Option<i64>,
    /// Bare tags of the run.
    pub sample_tags: Vec<String>,
    /// Key/value tags of the run.
    pub tags: BTreeMap<String, String>,
    /// Deepest stack kept.
    pub max_stack_length: i64,
    /// Formats the daemon writes; `None` is all of them.
    pub formats: Option<Vec<String>>,
    /// Also profile the children the process forks during the run, and theirs (work that
    /// runs in subprocesses or worker pools started by it).
    pub follow_children: bool,
    /// How long to wait for the run to be `RUNNING` before giving up on profiling.
    pub timeout_wait_for_running: Duration,
    /// How long to wait, after stopping, for the run's results.
    pub timeout_wait_for_finished: Duration,
    /// The daemon's socket; `None` is `$BPFPROF_SOCKET`, else the default.
    pub socket: Option<PathBuf>,
}

impl Default for ProfileOptions {
    fn default() -> ProfileOptions {
        ProfileOptions {
            stop_at_error: false,
            max_profile_duration: crate::protocol::MAX_RUN_DURATION,
            event: None,
            unwind: None,
            python: None,
            mode: None,
            sample_interval: 10_000_000,
            frequency: None,
            sample_tags: Vec::new(),
            tags: BTreeMap::new(),
            max_stack_length: 127,
            formats: None,
            follow_children: false,
            timeout_wait_for_running: Duration::from_secs(60),
            timeout_wait_for_finished: Duration::from_secs(60),
            socket: None,
        }
    }
}

impl ProfileOptions {
    /// The `run` request these options make for process `pid` in pid namespace `pid_ns`.
    pub fn run_request(&self, pid: u32, pid_ns: Option<u64>) -> RunRequest {
        RunRequest {
            pid,
            pid_ns,
            event: self.event.clone(),
            sample_interval: self.frequency.is_none().then_some(self.sample_interval),
            frequency: self.frequency,
            duration_ms: Some(
                u64::try_from(self.max_profile_duration.as_millis()).unwrap_or(u64::MAX),
            ),
            sample_tags: self.sample_tags.clone(),
            tags: self.tags.clone(),
            max_stack_length: Some(self.max_stack_length),
            formats: self.formats.clone(),
            follow_children: self.follow_children,
            unwind: self.unwind.clone(),
            python: self.python.clone(),
            python_async: None,
            mode: self.mode.clone(),
            off_cpu: false,
            off_cpu_min_ns: None,
        }
    }
}

/// Profiles closures of the calling process, one run per [`FunctionProfiler::profile`] call.
#[derive(Debug, Default)]
pub struct FunctionProfiler {
    options: ProfileOptions,
    last_run_id: Option<u64>,
    last_result: Option<Reply>,
    last_error: Option<ProfileError>,
}

impl FunctionProfiler {
    /// A profiler with `options`.
    pub fn new(options: ProfileOptions) -> FunctionProfiler {
        FunctionProfiler {
            options,
            ..FunctionProfiler::default()
        }
    }

    /// Its options.
    pub fn options(&self) -> &ProfileOptions {
        &self.options
    }

    /// Its options, to change between calls.
    pub fn options_mut(&mut self) -> &mut ProfileOptions {
        &mut self.options
    }

    /// The run the last `profile` call started, if it got that far.
    pub fn last_run_id(&self) -> Option<u64> {
        self.last_run_id
    }

    /// The `results` reply of the last `profile` call (run id, final state, samples, files,
    /// top functions, summary), if it got that far.
    pub fn last_result(&self) -> Option<&Reply> {
        self.last_result.as_ref()
    }

    /// Why the last `profile` call's profiling failed, if it did (also when only logged).
    pub fn last_error(&self) -> Option<&ProfileError> {
        self.last_error.as_ref()
    }

    /// Runs `work` under a profiling run of this process and returns its result.
    ///
    /// The work's result, including its own errors, comes back untouched in `Ok`, and a panic
    /// in the work unwinds out of this call unchanged (the run is stopped first, its results
    /// not collected). Profiling failures are logged with `log::warn!` and leave the work
    /// running unprofiled, unless [`ProfileOptions::stop_at_error`] is set: then they are
    /// returned (see that field for when the work then does not run). Only one call at a time
    /// per process profiles; a concurrent call runs its work unprofiled with a warning, or
    /// returns [`ProfileError::Busy`] without running it under `stop_at_error`.
    pub fn profile<R>(&mut self, work: impl FnOnce() -> R) -> Result<R, ProfileError> {
        self.last_run_id = None;
        self.last_result = None;
        self.last_error = None;

        let Some(slot) = RunSlot::acquire() else {
            return self.unprofiled(ProfileError::Busy, work);
        };
        let run_id = match self.start_run() {
            Ok(id) => id,
            Err(e) => {
                drop(slot);
                return self.unprofiled(e, work);
            }
        };

        let started = Instant::now();
        let value = match panic::catch_unwind(AssertUnwindSafe(work)) {
            Ok(value) => value,
            Err(payload) => {
                // The work's panic matters more than its profile: end the run so it does not
                // go on sampling, skip the results wait, and let the panic carry on as it was.
                if let Err(e) = stop_run(&self.options, run_id) {
                    log::warn!("bpfprof: cannot stop run {run_id} after a panic: {e}");
                }
                drop(slot);
                panic::resume_unwind(payload);
            }
        };
        if started.elapsed() > self.options.max_profile_duration {
            log::info!(
                "bpfprof: the work outlasted the maximum profile duration of {:?}; run {run_id} \
                 covers its first part only",
                self.options.max_profile_duration
            );
        }

        let finished = self.finish_run(run_id);
        drop(slot);
        match finished {
            Ok(()) => Ok(value),
            Err(e) if self.options.stop_at_error => Err(e),
            Err(e) => {
                log::warn!("bpfprof: profiling failed, the work ran to completion: {e}");
                self.last_error = Some(e);
                Ok(value)
            }
        }
    }

    /// Runs `work` without profiling after `error`, or returns `error` under `stop_at_error`.
    fn unprofiled<R>(
        &mut self,
        error: ProfileError,
        work: impl FnOnce() -> R,
    ) -> Result<R, ProfileError> {
        if self.options.stop_at_error {
            return Err(error);
        }
        log::warn!("bpfprof: running the work unprofiled: {error}");
        self.last_error = Some(error);
        Ok(work())
    }

    /// Starts a run on this process and waits until it is `RUNNING`.
    fn start_run(&mut self) -> Result<u64, ProfileError> {
        let timeout = self.options.timeout_wait_for_running;
        let deadline = Instant::now() + timeout;
        let (pid, pid_ns) = super::self_target();
        let mut client = Client::connect_timeout(
            self.options.socket.as_deref(),
            timeout.min(DEFAULT_CONNECT_TIMEOUT),
        )?;
        // The daemon replies to `run` only once the run is RUNNING, which can take as long as
        // attaching does. If this times out the run may still start later; it then ends at its
        // duration or when this process exits.
        client.set_io_timeout(timeout);
        let reply = client.run(self.options.run_request(pid, pid_ns))?;
        let run_id = reply.run_id.unwrap_or_default();
        self.last_run_id = Some(run_id);
        log::debug!("bpfprof: started run {run_id} on pid {pid}");

        let waited = wait_until_running(&mut client, run_id, reply, deadline, timeout);
        if waited.is_err() {
            // A run that is not sampling our work yet is of no use; ending it now spares the
            // daemon from sampling for the whole duration.
            if let Err(e) = stop_run(&self.options, run_id) {
                log::debug!("bpfprof: cannot stop run {run_id}: {e}");
            }
        }
        waited.map(|()| run_id)
    }

    /// Stops run `run_id` and collects its results into `last_result`.
    fn finish_run(&mut self, run_id: u64) -> Result<(), ProfileError> {
        let wait = self.options.timeout_wait_for_finished;
        let deadline = Instant::now() + wait;
        let mut client = connect(&self.options)?;
        client.stop(run_id)?;
        let mut reply = client.results(run_id, wait)?;
        // One `results` wait is capped by the protocol; longer waits take several.
        loop {
            let state = reply.state.unwrap_or(RunState::Processing);
            let now = Instant::now();
            if state.is_final() || now >= deadline {
                break;
            }
            reply = client.results(run_id, deadline - now)?;
        }
        let state = reply.state.unwrap_or(RunState::Processing);
        let reason = reply.reason.clone();
        log::info!(
            "bpfprof: run {run_id} ended {state} with {} samples{}",
            reply.samples.unwrap_or(0),
            reply
                .files
                .as_ref()
                .and_then(|f| f.get("summary-json").or_else(|| f.values().next()))
                .map(|p| format!(", results beside {p}"))
                .unwrap_or_default()
        );
        self.last_result = Some(reply);
        match state {
            RunState::Failed => Err(ProfileError::RunFailed {
                run_id,
                state,
                reason,
            }),
            s if s.is_final() => Ok(()),
            state => Err(ProfileError::NotFinished {
                run_id,
                state,
                waited: wait,
            }),
        }
    }
}

/// Polls run `run_id`, last seen in `reply`, until it is `RUNNING` or `deadline` passes
/// (`timeout` after the wait began).
fn wait_until_running(
    client: &mut Client,
    run_id: u64,
    mut reply: Reply,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), ProfileError> {
    loop {
        let state = reply.state.unwrap_or(RunState::Preparing);
        match state {
            RunState::Running => return Ok(()),
            RunState::Preparing => {}
            // Ended (or ending) before the work even started: nothing to profile.
            state => {
                return Err(ProfileError::RunFailed {
                    run_id,
                    state,
                    reason: reply.reason,
                })
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ProfileError::NotRunning {
                run_id,
                state,
                waited: timeout,
            });
        }
        std::thread::sleep((deadline - now).min(POLL_INTERVAL));
        reply = client.status(run_id)?;
    }
}

/// A fresh connection per step: the daemon closes connections idle for 60 s, and the work
/// between starting and stopping a run may take far longer.
fn connect(options: &ProfileOptions) -> Result<Client, ClientError> {
    Client::connect(options.socket.as_deref())
}

fn stop_run(options: &ProfileOptions, run_id: u64) -> Result<(), ClientError> {
    connect(options)?.stop(run_id).map(drop)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::{mpsc, Arc};

    use super::super::testutil::*;
    use super::*;
    use crate::protocol::{ErrorCode, Op};

    fn options(daemon: &FakeDaemon) -> ProfileOptions {
        ProfileOptions {
            socket: Some(daemon.path.clone()),
            timeout_wait_for_running: Duration::from_secs(5),
            timeout_wait_for_finished: Duration::from_secs(5),
            ..ProfileOptions::default()
        }
    }

    #[test]
    fn profiles_the_work_and_keeps_its_result() {
        let _serial = serial();
        let daemon = FakeDaemon::well_behaved(RunState::Stopped);
        let mut opts = options(&daemon);
        opts.sample_tags = vec!["t".into()];
        opts.tags.insert("phase".into(), "fwd".into());
        opts.max_profile_duration = Duration::from_secs(3);
        let mut p = FunctionProfiler::new(opts);
        let out: Result<u32, String> = p.profile(|| Err("work's own error".into())).unwrap();
        assert_eq!(out, Err("work's own error".to_string()));
        assert_eq!(p.last_run_id(), Some(7));
        assert!(p.last_error().is_none(), "{:?}", p.last_error());
        let res = p.last_result().unwrap();
        assert_eq!(res.state, Some(RunState::Stopped));
        assert_eq!(daemon.ops(), ["run", "stop", "results"]);

        let requests = daemon.requests.lock().unwrap();
        let Op::Run(run) = &requests[0] else {
            panic!("{:?}", requests[0])
        };
        assert_eq!(run.pid, std::process::id());
        assert_eq!(run.pid_ns, super::super::self_target().1);
        assert_eq!(run.duration_ms, Some(3000));
        assert_eq!(run.sample_interval, Some(10_000_000));
        assert_eq!(run.max_stack_length, Some(127));
        assert_eq!(run.sample_tags, ["t"]);
        assert_eq!(run.tags.get("phase").map(String::as_str), Some("fwd"));
    }

    #[test]
    fn frequency_replaces_the_interval() {
        let req = ProfileOptions {
            frequency: Some(99),
            ..ProfileOptions::default()
        }
        .run_request(1, None);
        assert_eq!((req.frequency, req.sample_interval), (Some(99), None));
        assert!(!req.follow_children);
        let req = ProfileOptions {
            follow_children: true,
            ..ProfileOptions::default()
        }
        .run_request(1, None);
        assert!(req.follow_children);
    }

    #[test]
    fn unwind_mode_is_sent_only_when_set() {
        let default = ProfileOptions::default().run_request(1, None);
        // Absent on the wire, so a daemon that predates the field accepts the request.
        let line = serde_json::to_string(&default).unwrap();
        assert!(!line.contains("unwind"), "{line}");
        let req = ProfileOptions {
            unwind: Some("cfi".into()),
            ..ProfileOptions::default()
        }
        .run_request(1, None);
        assert_eq!(req.unwind.as_deref(), Some("cfi"));
        let line = serde_json::to_string(&req).unwrap();
        assert!(line.contains(r#""unwind":"cfi""#), "{line}");
    }

    #[test]
    fn absent_daemon_runs_the_work_unprofiled() {
        let _serial = serial();
        let dir = tempfile::tempdir().unwrap();
        let mut p = FunctionProfiler::new(ProfileOptions {
            socket: Some(dir.path().join("missing.sock")),
            ..ProfileOptions::default()
        });
        assert_eq!(p.profile(|| 42).unwrap(), 42);
        assert!(matches!(
            p.last_error(),
            Some(ProfileError::Client(ClientError::Unavailable { .. }))
        ));
        assert!(p.last_result().is_none());

        p.options_mut().stop_at_error = true;
        let ran = AtomicBool::new(false);
        let err = p.profile(|| ran.store(true, Ordering::SeqCst)).unwrap_err();
        assert!(matches!(
            err,
            ProfileError::Client(ClientError::Unavailable { .. })
        ));
        assert!(
            !ran.load(Ordering::SeqCst),
            "stop_at_error must not run the work"
        );
    }

    #[test]
    fn refusal_runs_the_work_or_errors_with_stop_at_error() {
        let _serial = serial();
        let daemon =
            FakeDaemon::start(|_| Some(Reply::error(ErrorCode::PermissionDenied, "not yours")));
        let mut p = FunctionProfiler::new(options(&daemon));
        assert_eq!(p.profile(|| "done").unwrap(), "done");
        assert!(matches!(
            p.last_error(),
            Some(ProfileError::Client(ClientError::Refused {
                code: ErrorCode::PermissionDenied,
                ..
            }))
        ));

        p.options_mut().stop_at_error = true;
        let err = p.profile(|| unreachable!("must not run")).unwrap_err();
        assert!(err.to_string().contains("not yours"), "{err}");
    }

    #[test]
    fn failed_run_is_reported_after_the_work() {
        let _serial = serial();
        let daemon = FakeDaemon::well_behaved(RunState::Failed);
        let mut p = FunctionProfiler::new(options(&daemon));
        assert_eq!(p.profile(|| 1).unwrap(), 1);
        assert!(matches!(
            p.last_error(),
            Some(ProfileError::RunFailed {
                run_id: 7,
                state: RunState::Failed,
                reason: Some(r),
            }) if r == "boom"
        ));
        assert_eq!(p.last_result().unwrap().state, Some(RunState::Failed));

        p.options_mut().stop_at_error = true;
        assert!(matches!(
            p.profile(|| 1),
            Err(ProfileError::RunFailed { .. })
        ));
    }

    #[test]
    fn panic_stops_the_run_and_propagates_untouched() {
        let _serial = serial();
        let daemon = FakeDaemon::well_behaved(RunState::Stopped);
        let mut p = FunctionProfiler::new(options(&daemon));
        let payload = panic::catch_unwind(AssertUnwindSafe(|| {
            let _ = p.profile(|| -> u32 { panic::panic_any(1234u64) });
        }))
        .unwrap_err();
        assert_eq!(payload.downcast_ref::<u64>(), Some(&1234));
        assert_eq!(daemon.ops(), ["run", "stop"]);
        // The slot was released by the unwinding.
        assert_eq!(p.profile(|| 5).unwrap(), 5);
        assert!(p.last_error().is_none());
    }

    #[test]
    fn preparing_is_polled_until_running() {
        let _serial = serial();
        let polls = Arc::new(AtomicUsize::new(0));
        let seen = polls.clone();
        let daemon = FakeDaemon::start(move |op| {
            Some(match op {
                Op::Run(_) => Reply {
                    run_id: Some(7),
                    state: Some(RunState::Preparing),
                    ..Reply::ok()
                },
                Op::Status { .. } if seen.fetch_add(1, Ordering::SeqCst) < 2 => Reply {
                    run_id: Some(7),
                    state: Some(RunState::Preparing),
                    ..Reply::ok()
                },
                op => standard_reply(op, RunState::Stopped),
            })
        });
        let mut p = FunctionProfiler::new(options(&daemon));
        p.profile(|| ()).unwrap();
        assert!(p.last_error().is_none(), "{:?}", p.last_error());
        assert_eq!(
            daemon.ops(),
            ["run", "status", "status", "status", "stop", "results"]
        );
    }

    #[test]
    fn never_running_times_out_and_stops_the_run() {
        let _serial = serial();
        let daemon = FakeDaemon::start(|op| {
            Some(match op {
                Op::Run(_) | Op::Status { .. } => Reply {
                    run_id: Some(7),
                    state: Some(RunState::Preparing),
                    ..Reply::ok()
                },
                op => standard_reply(op, RunState::Stopped),
            })
        });
        let mut opts = options(&daemon);
        opts.timeout_wait_for_running = Duration::from_millis(200);
        opts.stop_at_error = true;
        let mut p = FunctionProfiler::new(opts);
        let err = p.profile(|| ()).unwrap_err();
        assert!(
            matches!(
                err,
                ProfileError::NotRunning {
                    run_id: 7,
                    state: RunState::Preparing,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(daemon.ops().last(), Some(&"stop"));
    }

    #[test]
    fn results_not_ready_is_not_finished() {
        let _serial = serial();
        let daemon = FakeDaemon::start(|op| {
            Some(match op {
                Op::Results { .. } => Reply {
                    run_id: Some(7),
                    state: Some(RunState::Processing),
                    ..Reply::ok()
                },
                op => standard_reply(op, RunState::Stopped),
            })
        });
        let mut opts = options(&daemon);
        opts.timeout_wait_for_finished = Duration::from_millis(100);
        let mut p = FunctionProfiler::new(opts);
        assert_eq!(p.profile(|| 3).unwrap(), 3);
        assert!(matches!(
            p.last_error(),
            Some(ProfileError::NotFinished {
                state: RunState::Processing,
                ..
            })
        ));
    }

    #[test]
    fn concurrent_call_runs_unprofiled_or_is_busy() {
        let _serial = serial();
        let daemon = FakeDaemon::well_behaved(RunState::Stopped);
        let opts = options(&daemon);
        let (in_work_tx, in_work_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let first = {
            let opts = opts.clone();
            std::thread::spawn(move || {
                let mut p = FunctionProfiler::new(opts);
                p.profile(|| {
                    in_work_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                })
                .unwrap();
                p.last_error().map(ToString::to_string)
            })
        };
        in_work_rx.recv().unwrap();

        let mut second = FunctionProfiler::new(opts.clone());
        assert_eq!(second.profile(|| 9).unwrap(), 9);
        assert!(matches!(second.last_error(), Some(ProfileError::Busy)));

        second.options_mut().stop_at_error = true;
        assert!(matches!(
            second.profile(|| unreachable!("must not run")),
            Err(ProfileError::Busy)
        ));

        release_tx.send(()).unwrap();
        assert_eq!(first.join().unwrap(), None);
        // One run only reached the daemon.
        assert_eq!(daemon.ops(), ["run", "stop", "results"]);
    }
}
