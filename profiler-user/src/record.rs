//! A recording: the kernel program attached, its targets registered, sampling until a stop
//! condition, then the samples drained, symbolized and aggregated into a [`Profile`].

use std::{
    ffi::OsString,
    os::{fd::RawFd, unix::process::CommandExt},
    process::{Child, Command},
    time::{Duration, Instant},
};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    aggregate::{
        aggregate, AggregateOptions, Losses, Profile, ProfileMeta, ProfiledTarget, RunCost, RunEnd,
        TargetSamples,
    },
    drain::drain,
    error::{Error, Result},
    kernel::{Counters, KernelProgram},
    procmaps::ProcessMaps,
    sample::Sample,
    sampling::{Sampling, SamplingPlan},
    symbolize::Symbolizer,
    target::{Target, TargetSpec},
};
use profiler_common::{Counter, MAX_RUNS};

/// How often the run loop checks targets and reports progress.
const TICK: Duration = Duration::from_millis(200);
/// How often target memory maps are re-read, to catch libraries loaded during the run.
const MAPS_REFRESH: Duration = Duration::from_millis(500);

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

/// One process being recorded under a run slot of the kernel program.
pub struct TargetRecording {
    /// The run slot its samples go to.
    pub run: u32,
    /// The process.
    pub target: Target,
    /// Its memory layout, refreshed while it lives.
    pub maps: ProcessMaps,
    /// Whether it has been seen to exit.
    pub exited: bool,
}

impl TargetRecording {
    /// Captures what symbolization needs and registers `target` under `run`.
    pub fn start(program: &mut KernelProgram, run: u32, target: Target) -> Result<Self> {
        let maps = ProcessMaps::capture(target.pid, target.ns_pid)?;
        program.reset_counters(run)?;
        // Tables first, so that no sample of the target is taken before its CFI is in place.
        program.unwind.track(target.pid)?;
        program.add_target(run, &target)?;
        Ok(TargetRecording {
            run,
            target,
            maps,
            exited: false,
        })
    }

    /// Notes whether the process still lives, re-reading its maps when `refresh`; returns
    /// true while it lives.
    pub fn poll(&mut self, refresh: bool) -> bool {
        if self.exited {
            return false;
        }
        if !self.target.is_alive() {
            log::info!("pid {} ({}) exited", self.target.pid, self.target.comm);
            self.exited = true;
            return false;
        }
        if refresh {
            let _ = self.maps.refresh();
        }
        true
    }
}

/// A recording in progress.
pub struct Recorder {
    program: KernelProgram,
    sampling: Sampling,
    targets: Vec<TargetRecording>,
    child: Option<Child>,
    started: Instant,
}

impl Recorder {
    /// Loads and attaches the kernel program and starts sampling the processes `specs` name.
    /// With `bpf_stats`, the kernel program's own run time is measured.
    pub fn attach(plan: &SamplingPlan, specs: &[TargetSpec], bpf_stats: bool) -> Result<Recorder> {
        let targets = resolve_targets(specs)?;
        let (program, sampling) = load_and_attach(plan, bpf_stats)?;
        let mut recorder = Recorder::new(program, sampling);
        for target in targets {
            recorder.add(target)?;
        }
        Ok(recorder)
    }

    /// Loads and attaches the kernel program, then runs `command` with sampling on from its
    /// first instruction.
    pub fn launch(plan: &SamplingPlan, command: &[OsString], bpf_stats: bool) -> Result<Recorder> {
        let (program_name, args) = command.split_first().ok_or_else(|| Error::InvalidTarget {
            spec: String::new(),
            reason: "no command given after --".into(),
        })?;
        let (program, sampling) = load_and_attach(plan, bpf_stats)?;
        // The child tells us its pid, then waits at the gate until that pid is registered
        // with the kernel program, so the command is sampled from its first instruction.
        // `spawn` itself waits for the exec, so it runs on a helper thread meanwhile.
        let pid_pipe = Pipe::new()?;
        let gate = Pipe::new()?;
        let mut cmd = Command::new(program_name);
        cmd.args(args);
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
        let pid = match pid_pipe.read_pid(&spawner) {
            Some(pid) => pid,
            None => {
                let e = match spawner.join() {
                    Ok(Err(e)) => e.to_string(),
                    _ => "the child did not start".to_string(),
                };
                return Err(Error::NoSuchProcess(format!(
                    "cannot run {}: {e}",
                    program_name.to_string_lossy()
                )));
            }
        };
        let mut recorder = Recorder::new(program, sampling);
        let registered = Target::from_pid(pid).and_then(|target| recorder.add(target));
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
            Ok(Err(e)) => {
                return Err(Error::NoSuchProcess(format!(
                    "cannot run {}: {e}",
                    program_name.to_string_lossy()
                )))
            }
            Err(_) => {
                return Err(Error::Other(anyhow::anyhow!(
                    "spawning the command panicked"
                )))
            }
        };
        recorder.child = Some(child);
        wait_for_exec(pid);
        let _ = recorder.program.unwind.track(pid);
        if let Some(t) = recorder.targets.first_mut() {
            if let Err(e) = t.maps.refresh() {
                log::debug!("maps of launched pid {pid}: {e}");
            }
        }
        Ok(recorder)
    }

    fn new(program: KernelProgram, sampling: Sampling) -> Recorder {
        log::info!("sampling with {}", sampling.describe());
        Recorder {
            program,
            sampling,
            targets: Vec::new(),
            child: None,
            started: Instant::now(),
        }
    }

    fn add(&mut self, target: Target) -> Result<()> {
        let run = self.targets.len() as u32;
        if run >= MAX_RUNS {
            return Err(Error::InvalidTarget {
                spec: target.pid.to_string(),
                reason: format!("at most {MAX_RUNS} processes can be profiled at once"),
            });
        }
        let recording = TargetRecording::start(&mut self.program, run, target)?;
        self.targets.push(recording);
        self.started = Instant::now();
        Ok(())
    }

    /// Sets how user stacks are walked (`--unwind`), for the targets already added too.
    pub fn set_unwind_mode(&mut self, mode: crate::unwind::UnwindMode) -> Result<()> {
        self.program.unwind.set_mode(mode);
        for t in &self.targets {
            match mode {
                crate::unwind::UnwindMode::Fp => self.program.unwind.unload_process(t.target.pid),
                _ => self.program.unwind.track(t.target.pid)?,
            }
        }
        Ok(())
    }

    /// The kernel id of the sampling program.
    pub fn program_id(&self) -> u32 {
        self.program.program_id()
    }

    /// The event and rate in use.
    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    fn counters(&self) -> Counters {
        let mut sum = Counters::default();
        for t in &self.targets {
            if let Ok(c) = self.program.counters(t.run) {
                for (total, value) in sum.0.iter_mut().zip(c.0) {
                    *total += value;
                }
            }
        }
        sum
    }

    /// Samples until a stop condition, reporting progress every tick.
    pub async fn run(
        &mut self,
        stop: StopConditions,
        mut progress: impl FnMut(Progress),
    ) -> Result<RunEnd> {
        let limit = stop
            .duration
            .map_or(stop.max_duration, |d| d.min(stop.max_duration));
        let deadline = tokio::time::Instant::from_std(self.started + limit);
        let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
        let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
        let mut tick = tokio::time::interval(TICK);
        let mut last_refresh = Instant::now();
        let end = loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {
                    if stop.duration.is_none_or(|d| d > stop.max_duration) {
                        log::warn!("stopped at --max-duration {}", humantime::format_duration(stop.max_duration));
                    }
                    break RunEnd::Completed;
                }
                _ = sigint.recv() => break RunEnd::Interrupted,
                _ = sigterm.recv() => break RunEnd::Interrupted,
                _ = tick.tick() => {
                    let refresh = last_refresh.elapsed() >= MAPS_REFRESH;
                    if refresh {
                        last_refresh = Instant::now();
                    }
                    self.program.offload_when_due();
                    if let Some(end) = self.check_targets(refresh) {
                        break end;
                    }
                    progress(Progress {
                        elapsed: self.started.elapsed(),
                        samples: self.counters().get(Counter::Samples),
                    });
                }
            }
        };
        Ok(end)
    }

    /// Notes exited targets and refreshes the maps of live ones; returns how the run ends
    /// when no target is left.
    fn check_targets(&mut self, refresh: bool) -> Option<RunEnd> {
        if let Some(child) = &mut self.child {
            if let Ok(Some(status)) = child.try_wait() {
                log::info!("command exited: {status}");
                for t in &mut self.targets {
                    t.exited = true;
                }
                return Some(RunEnd::Completed);
            }
        }
        for t in &mut self.targets {
            // New code (dlopen, exec) gets its unwind tables while the run goes on.
            if t.poll(refresh) && refresh {
                let _ = self.program.unwind.track(t.target.pid);
            }
        }
        if self.child.is_none() && self.targets.iter().all(|t| t.exited) {
            return Some(RunEnd::TargetExited);
        }
        None
    }

    /// Stops sampling and builds the profile from everything recorded.
    pub fn finish(
        mut self,
        end: RunEnd,
        symbolizer: &mut Symbolizer,
        options: &AggregateOptions,
    ) -> Result<Profile> {
        let duration = self.started.elapsed();
        self.program.detach();
        let (bpf_run_time_ns, bpf_run_count) = match self.program.run_stats() {
            Some((t, n)) => (Some(t), Some(n)),
            None => (None, None),
        };
        let mut profile = build_profile(
            &mut self.program,
            &mut self.targets,
            Finished {
                sampling: self.sampling,
                duration,
                end,
            },
            symbolizer,
            options,
        )?;
        profile.meta.cost.bpf_run_time_ns = bpf_run_time_ns;
        profile.meta.cost.bpf_run_count = bpf_run_count;
        if let Some(mut child) = self.child.take() {
            // Interrupted before the command ended: it got the terminal's SIGINT too; reap it.
            if end == RunEnd::Interrupted {
                let _ = child.wait();
            }
        }
        Ok(profile)
    }
}

/// How a recording ended, for [`build_profile`].
#[derive(Clone, Copy, Debug)]
pub struct Finished {
    /// The event and rate used.
    pub sampling: Sampling,
    /// Wall-clock length of the recording.
    pub duration: Duration,
    /// Why it ended.
    pub end: RunEnd,
}

/// Stops keeping samples of `targets`, drains what they recorded and builds their profile.
pub fn build_profile(
    program: &mut KernelProgram,
    targets: &mut [TargetRecording],
    finished: Finished,
    symbolizer: &mut Symbolizer,
    options: &AggregateOptions,
) -> Result<Profile> {
    let collected = collect(program, targets)?;
    Ok(assemble(collected, targets, finished, symbolizer, options))
}

/// What the kernel recorded for some targets, read out of its maps.
pub struct Collected {
    counters: Counters,
    samples: Vec<Vec<Sample>>,
    program_id: u32,
}

/// Stops keeping samples of `targets` and drains what they recorded: the only step that
/// needs the kernel program, so that a shared program is held briefly.
pub fn collect(program: &mut KernelProgram, targets: &mut [TargetRecording]) -> Result<Collected> {
    for t in targets.iter_mut() {
        let _ = program.remove_target(&t.target);
        program.unwind.unload_process(t.target.pid);
        if !t.exited && t.target.is_alive() {
            let _ = t.maps.refresh();
        }
    }
    let mut counters = Counters::default();
    let mut samples = Vec::with_capacity(targets.len());
    for t in targets.iter() {
        let c = program.counters(t.run)?;
        for (total, value) in counters.0.iter_mut().zip(c.0) {
            *total += value;
        }
        samples.push(drain(program, t.run)?);
    }
    Ok(Collected {
        counters,
        samples,
        program_id: program.program_id(),
    })
}

/// Symbolizes and aggregates collected samples into a profile.
pub fn assemble(
    collected: Collected,
    targets: &[TargetRecording],
    finished: Finished,
    symbolizer: &mut Symbolizer,
    options: &AggregateOptions,
) -> Profile {
    let Collected {
        counters,
        samples,
        program_id,
    } = collected;
    let inputs: Vec<TargetSamples<'_>> = targets
        .iter()
        .zip(&samples)
        .map(|(t, samples)| TargetSamples {
            target: &t.target,
            maps: &t.maps,
            samples,
        })
        .collect();
    let (frames, stacks, truncated) = aggregate(&inputs, symbolizer, options);
    let drained: u64 = samples.iter().flatten().map(|s| s.count).sum();
    let losses = Losses {
        lost_in_transfer: counters
            .get(Counter::Samples)
            .saturating_sub(drained + counters.get(Counter::SampleMapFull)),
        sample_map_full: counters.get(Counter::SampleMapFull),
        user_stack_map_full: counters.get(Counter::UserStackMapFull),
        user_stack_error: counters.get(Counter::UserStackError),
        kernel_stack_map_full: counters.get(Counter::KernelStackMapFull),
        kernel_stack_error: counters.get(Counter::KernelStackError),
        truncated,
        stack_ended_early: counters.get(Counter::StackEndedEarly),
    };
    let profiled = targets
        .iter()
        .map(|t| ProfiledTarget {
            pid: t.target.pid,
            ns_pid: t.target.ns_pid,
            pid_ns: t.target.ns.ino,
            comm: if t.maps.comm().is_empty() {
                t.target.comm.clone()
            } else {
                t.maps.comm().to_string()
            },
        })
        .collect();
    Profile {
        meta: ProfileMeta {
            targets: profiled,
            sampling: finished.sampling,
            duration: finished.duration,
            samples_seen: counters.get(Counter::Samples),
            losses,
            end: finished.end,
            program_id,
            tags: options.tags.clone(),
            max_stack_length: options.max_stack_length,
            cost: own_cost(),
        },
        frames,
        stacks,
    }
}

fn load_and_attach(plan: &SamplingPlan, bpf_stats: bool) -> Result<(KernelProgram, Sampling)> {
    let mut program = KernelProgram::load()?;
    if bpf_stats {
        program.enable_run_stats()?;
    }
    let sampling = program.attach(plan)?;
    Ok((program, sampling))
}

/// bpfprof's own CPU time and peak memory so far.
fn own_cost() -> RunCost {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    RunCost {
        profiler_cpu_secs: secs(usage.ru_utime) + secs(usage.ru_stime),
        profiler_peak_rss_bytes: usage.ru_maxrss as u64 * 1024,
        ..RunCost::default()
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
/// so the first memory-map capture sees the command's binaries.
fn wait_for_exec(pid: u32) {
    let own = std::fs::read_link("/proc/self/exe").ok();
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        match std::fs::read_link(format!("/proc/{pid}/exe")) {
            Ok(exe) if Some(&exe) != own.as_ref() => return,
            Err(_) => return,
            _ => std::thread::sleep(Duration::from_millis(1)),
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
