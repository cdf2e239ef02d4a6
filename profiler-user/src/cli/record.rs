//! The command line's recording: a thin driver over the [`Recording`] pipeline that adds what
//! only the CLI has: launching a command (sampled from its first instruction, its exit status
//! passed through), signals, and stop conditions.

use std::{
    ffi::OsString,
    os::{
        fd::RawFd,
        unix::process::{CommandExt, ExitStatusExt},
    },
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::{
    error::{Error, Result},
    kernel::{perf_events::EventStopper, pool::ProgramPool},
    process::target::{Target, TargetSpec},
    profile::RunEnd,
    recording::{
        request::RecordingRequest,
        run_loop::{self, RunDriver},
        Collected, Recording,
    },
    sampling::Sampling,
};

/// How long a launched command gets to exit after SIGTERM at the end of `--duration`.
const COMMAND_GRACE: Duration = Duration::from_secs(5);
/// The most a launch waits for the command to take its own name after its exec.
const EXEC_NAME_WAIT: Duration = Duration::from_millis(50);
/// How long an interrupted run waits for a launched command to go by the terminal's SIGINT
/// before sending SIGTERM: a command that traps SIGINT (a shell's `trap ... INT`) would
/// otherwise keep bpfprof waiting forever; perf record ends such a command with SIGTERM too.
const INTERRUPT_GRACE: Duration = Duration::from_millis(500);

/// When a recording stops, besides its targets exiting and SIGINT/SIGTERM.
#[derive(Clone, Copy, Debug)]
pub struct StopConditions {
    /// The requested length; `None` runs until interrupted or the targets exit.
    pub duration: Option<Duration>,
    /// A hard cap, whatever else was asked.
    pub max_duration: Duration,
}

/// Where a recording stands, reported while it runs.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Time since sampling started.
    pub elapsed: Duration,
    /// Samples of the targets so far.
    pub samples: u64,
}

/// What became of a launched command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandOutcome {
    /// It exited by itself with this status.
    Exited(ExitStatus),
    /// The duration ended first: it was stopped with SIGTERM (SIGKILL after a grace period).
    StoppedAtDuration(ExitStatus),
    /// bpfprof was interrupted; the command went by the terminal's signal or was stopped
    /// as at the end of `--duration`.
    Interrupted(ExitStatus),
}

impl CommandOutcome {
    /// The exit code a shell would report for the command: its own code, or 128 + signal.
    pub fn exit_code(status: ExitStatus) -> i32 {
        status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1)
    }
}

/// A recording in progress.
pub struct Recorder {
    pool: ProgramPool,
    recording: Recording,
    child: Option<Child>,
    outcome: Option<CommandOutcome>,
    /// How long sampling ran when the deadline stopped it (the run itself ends a little
    /// later, after the tick in progress).
    sampled_for: Option<Duration>,
}

impl Recorder {
    /// Starts sampling the processes `specs` name (and, when the request follows children,
    /// the children they fork from now on).
    pub fn attach(
        request: &RecordingRequest,
        specs: &[TargetSpec],
        pool: ProgramPool,
    ) -> Result<Recorder> {
        let targets = resolve_targets(specs)?;
        let mut recorder = Recorder::new(request, pool);
        for target in targets {
            recorder.recording.add_target(&mut recorder.pool, target)?;
        }
        recorder.log_start();
        Ok(recorder)
    }

    /// Starts sampling every process on the machine, as the request's system-wide scope says.
    pub fn system(request: &RecordingRequest, pool: ProgramPool) -> Result<Recorder> {
        let mut recorder = Recorder::new(request, pool);
        recorder.recording.start_system(&mut recorder.pool)?;
        recorder.log_start();
        Ok(recorder)
    }

    /// Runs `command` with sampling on from its first instruction (and, when the request
    /// follows children, in every process it forks).
    /// With `detach_stdio` the command's standard input, output and error are `/dev/null`
    /// (for a view that owns the terminal).
    pub fn launch(
        request: &RecordingRequest,
        command: &[OsString],
        pool: ProgramPool,
        detach_stdio: bool,
    ) -> Result<Recorder> {
        let (program_name, args) = command.split_first().ok_or_else(|| Error::InvalidTarget {
            spec: String::new(),
            reason: "no command given after --".into(),
        })?;
        let mut recorder = Recorder::new(request, pool);
        // The child tells us its pid, then waits at the gate until that pid is registered
        // with the kernel program, so the command is sampled from its first instruction.
        // `spawn` itself waits for the exec, so it runs on a helper thread meanwhile.
        let pid_pipe = Pipe::new()?;
        let gate = Pipe::new()?;
        let mut cmd = Command::new(program_name);
        cmd.args(args);
        if detach_stdio {
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
        }
        let (pid_write, pid_read) = (pid_pipe.write, pid_pipe.read);
        let (gate_read, gate_write) = (gate.read, gate.write);
        // SAFETY: only async-signal-safe calls (close, getpid, write, read) run between fork
        // and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::close(gate_write);
                libc::close(pid_read);
                let pid = libc::getpid();
                libc::write(pid_write, (&pid as *const i32).cast(), 4);
                let mut byte = 0u8;
                libc::read(gate_read, (&mut byte as *mut u8).cast(), 1);
                Ok(())
            });
        }
        let spawner = std::thread::spawn(move || cmd.spawn());
        let cannot_run = |source: std::io::Error| Error::CannotRun {
            program: program_name.to_string_lossy().into_owned(),
            source,
        };
        let pid = match pid_pipe.read_pid(&spawner) {
            Some(pid) => pid,
            None => {
                let e = match spawner.join() {
                    Ok(Err(e)) => e,
                    _ => std::io::Error::other("the child did not start"),
                };
                return Err(cannot_run(e));
            }
        };
        // Recorded from its exec: until then it runs bpfprof's own code.
        recorder.recording.expect_exec(pid);
        let registered = Target::from_pid(pid)
            .and_then(|target| recorder.recording.add_target(&mut recorder.pool, target));
        if registered.is_ok() {
            // Before the command runs, not beside it: a short command keeps every CPU busy.
            recorder.recording.wait_for_walker(&mut recorder.pool);
        }
        gate.open();
        if let Err(e) = registered {
            // Never leave the command running unprofiled behind an error.
            if let Ok(Ok(mut child)) = spawner.join() {
                let _ = child.kill();
                let _ = child.wait();
            }
            return Err(e);
        }
        let child = match spawner.join() {
            Ok(Ok(child)) => child,
            Ok(Err(e)) => return Err(cannot_run(e)),
            Err(_) => {
                return Err(Error::Other(anyhow::anyhow!(
                    "spawning the command panicked"
                )))
            }
        };
        recorder.child = Some(child);
        wait_for_exec(pid);
        recorder.recording.exec_seen(&mut recorder.pool);
        recorder.recording.refresh_maps(&mut recorder.pool, pid);
        recorder.log_start();
        Ok(recorder)
    }

    fn new(request: &RecordingRequest, pool: ProgramPool) -> Recorder {
        Recorder {
            pool,
            recording: Recording::new(request),
            child: None,
            outcome: None,
            sampled_for: None,
        }
    }

    /// How long sampling ran, where the deadline stopped it: the profile's duration, rather
    /// than the time until the run loop noticed.
    pub fn sampled_for(&self) -> Option<Duration> {
        self.sampled_for
    }

    fn log_start(&self) {
        if let Some(sampling) = self.recording.sampling() {
            log::info!("sampling with {}", sampling.describe());
        }
    }

    /// The kernel id of the sampling program.
    pub fn program_id(&self) -> u32 {
        self.recording.program_id().unwrap_or(0)
    }

    /// The event and rate in use.
    pub fn sampling(&self) -> Option<Sampling> {
        self.recording.sampling()
    }

    /// Samples until a stop condition, reporting progress every tick.
    pub async fn run(
        &mut self,
        stop: StopConditions,
        progress: impl FnMut(Progress),
    ) -> Result<RunEnd> {
        let limit = stop
            .duration
            .map_or(stop.max_duration, |d| d.min(stop.max_duration));
        let deadline = self.recording.started() + limit;
        // Sampling ends at the deadline even while a tick holds this thread: on a loaded
        // machine, or at a rate whose samples (on every CPU, bpfprof's own included) slow
        // bpfprof down, ticks took seconds and a 1 s run sampled for 12 s, all of which the
        // end of the run then had to drain and name.
        let stoppers = self.recording.event_stoppers(&mut self.pool);
        let guard = run_loop::DeadlineGuard::spawn(deadline, move || {
            stoppers.iter().for_each(EventStopper::stop)
        });
        let mut driver = CliDriver {
            sigterm: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            sigint: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
            sigchld: signal(SignalKind::child()).context("installing SIGCHLD handler")?,
            recorder: self,
            progress,
        };
        let end = run_loop::run(&mut driver, deadline).await;
        if guard.finish() {
            self.sampled_for = Some(limit);
        }
        let end = end?;
        if end == RunEnd::Completed
            && self.outcome.is_none()
            && stop.duration.is_none_or(|d| d > stop.max_duration)
        {
            log::warn!(
                "stopped at --max-duration {}",
                humantime::format_duration(stop.max_duration)
            );
        }
        Ok(end)
    }

    /// One tick of the recording for a driver with a loop of its own (`bpfprof top`):
    /// `Some(end)` once the run is over (a launched command, or every target, exited).
    pub fn tick(&mut self) -> Option<RunEnd> {
        let status = self.recording.tick(&mut self.pool);
        self.recording.name_runtime_frames(false);
        if self.child.is_some() {
            self.command_exited().then_some(RunEnd::Completed)
        } else {
            status.all_exited.then_some(RunEnd::TargetExited)
        }
    }

    /// The profile of the samples since the last window (or the start), the recording going
    /// on ([`Recording::take_window`]).
    pub fn take_window(
        &mut self,
        symbolizer: &mut crate::symbolize::Symbolizer,
        options: &crate::recording::aggregate::AggregateOptions,
    ) -> Result<crate::profile::Profile> {
        self.recording
            .take_window(&mut self.pool, symbolizer, options)
    }

    /// The launched command's exit, once it exited (recorded as the run's outcome).
    fn command_exited(&mut self) -> bool {
        let Some(exit) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        else {
            return false;
        };
        log::info!("command exited: {exit}");
        self.outcome = Some(CommandOutcome::Exited(exit));
        true
    }

    /// Sends what the run samples to `sink` at every tick, to be symbolized meanwhile.
    pub fn set_warm(&mut self, sink: crate::symbolize::WarmSink) {
        self.recording.set_warm(sink);
    }

    /// Stops sampling and takes everything recorded out of the kernel (to be symbolized and
    /// aggregated with [`Collected::assemble`]); a launched command still running is stopped
    /// (at the end of the duration) or reaped (when interrupted), and what became of it is
    /// returned with the samples.
    pub fn finish(mut self, end: RunEnd) -> Result<(Collected, Option<CommandOutcome>)> {
        let collected = self.recording.collect(&mut self.pool)?;
        if let Some(mut child) = self.child.take() {
            if self.outcome.is_none() {
                self.outcome = Some(match end {
                    // It got the terminal's SIGINT too, or not (a `kill` of bpfprof alone),
                    // or it traps it: a short wait, then SIGTERM and SIGKILL.
                    RunEnd::Interrupted => CommandOutcome::Interrupted(
                        wait_for(&mut child, INTERRUPT_GRACE)
                            .unwrap_or_else(|| stop_child(&mut child)),
                    ),
                    _ => CommandOutcome::StoppedAtDuration(stop_child(&mut child)),
                });
            }
        }
        Ok((collected, self.outcome))
    }
}

/// The command line's part of the run loop: signals end the run, and so does a launched
/// command's exit, noticed when SIGCHLD arrives rather than at the next tick.
struct CliDriver<'a, P> {
    recorder: &'a mut Recorder,
    progress: P,
    sigterm: Signal,
    sigint: Signal,
    sigchld: Signal,
}

impl<P: FnMut(Progress)> RunDriver for CliDriver<'_, P> {
    type Error = Error;

    async fn tick(&mut self) -> Result<Option<RunEnd>> {
        let recorder = &mut *self.recorder;
        let status = recorder.recording.tick(&mut recorder.pool);
        recorder.recording.name_runtime_frames(false);
        if recorder.child.is_some() {
            if recorder.command_exited() {
                return Ok(Some(RunEnd::Completed));
            }
        } else if status.all_exited {
            return Ok(Some(RunEnd::TargetExited));
        }
        (self.progress)(Progress {
            elapsed: recorder.recording.started().elapsed(),
            samples: status.samples,
        });
        Ok(None)
    }

    async fn stopped(&mut self) -> RunEnd {
        loop {
            tokio::select! {
                _ = self.sigint.recv() => return RunEnd::Interrupted,
                _ = self.sigterm.recv() => return RunEnd::Interrupted,
                _ = self.sigchld.recv(), if self.recorder.child.is_some() => {
                    if self.recorder.command_exited() {
                        return RunEnd::Completed;
                    }
                }
            }
        }
    }
}

/// Stops a launched command: SIGTERM, then SIGKILL if it is still there after a grace period.
fn stop_child(child: &mut Child) -> ExitStatus {
    // SAFETY: signalling our own child, which has not been reaped (so its pid is not reused).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    if let Some(status) = wait_for(child, COMMAND_GRACE) {
        return status;
    }
    let _ = child.kill();
    child
        .wait()
        .unwrap_or_else(|_| ExitStatus::from_raw(libc::SIGKILL))
}

/// The command's status if it exits within `grace`.
fn wait_for(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + grace;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn resolve_targets(specs: &[TargetSpec]) -> Result<Vec<Target>> {
    if specs.is_empty() {
        return Err(Error::InvalidTarget {
            spec: String::new(),
            reason: "give a target with --pid PID, --pid NS:PID, or a command after --".into(),
        });
    }
    specs.iter().map(Target::resolve).collect()
}

/// Waits (briefly) until a just-released child has replaced bpfprof's image with its command,
/// so the first memory-map capture sees the command's binaries, and has taken its name: the
/// kernel sets the name a moment after the image, and a command as short as `true` would
/// otherwise be reported as `(bpfprof)`.
fn wait_for_exec(pid: u32) {
    let own_exe = std::fs::read_link("/proc/self/exe").ok();
    let own_comm = std::fs::read_to_string("/proc/self/comm").ok();
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        match std::fs::read_link(format!("/proc/{pid}/exe")) {
            Ok(exe) if Some(&exe) != own_exe.as_ref() => break,
            Err(_) => return,
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    // Microseconds apart in the kernel's exec; bounded for a command that is bpfprof itself.
    let deadline = Instant::now() + EXEC_NAME_WAIT;
    while Instant::now() < deadline {
        match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
            Ok(comm) if Some(&comm) == own_comm.as_ref() => {
                std::thread::sleep(Duration::from_micros(200))
            }
            _ => return,
        }
    }
}

/// A pipe between bpfprof and a command it launches.
struct Pipe {
    read: RawFd,
    write: RawFd,
}

impl Pipe {
    fn new() -> Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: fds is a valid array of two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(anyhow::Error::from(std::io::Error::last_os_error())
                .context("creating the launch pipe")
                .into());
        }
        Ok(Pipe {
            read: fds[0],
            write: fds[1],
        })
    }

    /// Reads the pid the child writes, giving up when the spawning thread ends without one
    /// (the fork failed).
    fn read_pid(&self, spawner: &std::thread::JoinHandle<std::io::Result<Child>>) -> Option<u32> {
        loop {
            let mut poll = libc::pollfd {
                fd: self.read,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut poll, 1, 50) };
            if ready > 0 {
                let mut pid: i32 = 0;
                // SAFETY: reading 4 bytes into an i32.
                let n = unsafe { libc::read(self.read, (&mut pid as *mut i32).cast(), 4) };
                return (n == 4 && pid > 0).then_some(pid as u32);
            }
            if spawner.is_finished() {
                return None;
            }
        }
    }

    fn open(&self) {
        // SAFETY: writing one byte from a valid buffer to our own pipe.
        unsafe { libc::write(self.write, [1u8].as_ptr().cast(), 1) };
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        // SAFETY: closing fds this struct owns.
        unsafe {
            libc::close(self.read);
            libc::close(self.write);
        }
    }
}
