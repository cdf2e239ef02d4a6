//! The tick ([`Recording::tick`]): what keeps a recording healthy while it samples (stacks
//! moved out of the kernel, maps refreshed, followed children and exec'd processes handled,
//! exits noted, new runtime stacks queued, sampled addresses sent to be symbolized early).

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use profiler_common::Counter;

use super::{
    naming::RuntimeStackIds,
    process::{PYTHON_THREADS_BACKSTOP, STALE_MAPS_MIN_INTERVAL, STATELESS_THREAD_RELIST},
    MAPS_REFRESH, MAX_SYSTEM_PROCESSES, SYSTEM_MAPS_REFRESH, YOUNG_PROCESS, YOUNG_REFRESH_PERIODS,
};
use crate::{
    kernel::pool::{ProgramPool, Slot},
    process::maps::ProcessMaps,
    process::target::{ExitWatch, Owner, Target},
    recording::process::ProcessRecording,
    recording::Recording,
    runtime::Naming,
};

/// Kernel addresses start here (x86-64, 4- and 5-level paging alike).
const KERNEL_ADDRESS_START: u64 = 1 << 63;

/// A run of targets looks for new runtime stacks to name as often as every tick, but spends at
/// most about 1/this of its time on the look: it reads the kernel's sample map key by key (a
/// system call each: 0.3 ms for 700 keys in a release build, 1-5 ms for 150 in a debug one;
/// up to 16k keys between moves), so the next look waits this many times the CPU the last one
/// took, at most until the next maps refresh.
pub(super) const RUNTIME_SCAN_COST_SHARE: u32 = 20;

/// A run's sampled addresses are symbolized while it goes on (so that little is left for its
/// end), but not in its first [`WARM_HOLD`] unless [`WARM_BATCH`] of them are waiting: the
/// first batch opens and parses each object's symbols (3.5-4 ms of CPU a launched `burn`
/// run, its executable and the C library), which on a busy machine is taken from the
/// workload, while at the end of a short run it costs the same and nobody's time. A run
/// that samples many distinct addresses at once (section 4's large binary) still has them
/// resolved from its first ticks.
pub(super) const WARM_HOLD: Duration = Duration::from_secs(2);

/// See [`WARM_HOLD`].
pub(super) const WARM_BATCH: usize = 1024;

/// A process's key in a recording's `processes`: its program, run slot and sample pid.
pub(super) type ProcessKey = (u32, u32, u32);

/// Where a recording stands after a tick.
#[derive(Clone, Copy, Debug)]
pub struct TickStatus {
    /// Samples of the recording's processes so far.
    pub samples: u64,
    /// Whether every process of the recording has exited.
    pub all_exited: bool,
}

impl Recording {
    /// Keeps the recording healthy: moves stacks out of the kernel when due, picks up the
    /// children the kernel followed, notes exits and refreshes memory maps.
    pub fn tick(&mut self, pool: &mut ProgramPool) -> TickStatus {
        let refresh = self.last_refresh.elapsed() >= MAPS_REFRESH;
        if refresh {
            self.last_refresh = Instant::now();
        }
        let mut samples = 0;
        let mut seen_programs = HashSet::new();
        // Programs that stored runtime stacks never seen before since their last look for them
        // (with the count now), and programs whose count cannot be read. A system-wide run
        // looks only at each refresh, whatever the count: it does not read it.
        let look_between_refreshes = !self.is_system();
        let mut new_stacks: HashMap<u32, Option<u64>> = HashMap::new();
        for (slot, _) in self.slots.clone() {
            let Ok(program) = pool.program(slot) else {
                continue;
            };
            if seen_programs.insert(slot.program_id) {
                program.offload_when_due();
                program.unwind.poll();
                if look_between_refreshes {
                    let stored = program.runtime_stacks_stored();
                    if stored.is_none()
                        || stored != self.stacks_at_runtime_scan.get(&slot.program_id).copied()
                    {
                        new_stacks.insert(slot.program_id, stored);
                    }
                }
            }
            samples += program.counter(slot.run, Counter::Samples).unwrap_or(0);
            if let Some(owner) = self.owner {
                for pid in program.take_execed(slot.run) {
                    self.after_exec(program, slot, pid, owner);
                }
            }
            if self.follow_children {
                for pid in program.followed(slot.run) {
                    self.adopt(program, slot, pid, false);
                }
            }
            if self.is_system() {
                // The kernel reports each process as it first samples it (again when the
                // report found the ring full), so that a process living a fraction of a second
                // is taken in while it lives.
                for pid in program.take_new_processes() {
                    self.adopt(program, slot, pid, true);
                }
            }
        }
        // Runtime stacks recorded so far, per program, named below while their processes live.
        let mut runtime_ids = RuntimeStackIds::default();
        let now = Instant::now();
        let system = self.is_system();
        // The processes the kernel says exited, all in one look.
        let exited = self.kernel_exits();
        // A system-wide run reads its processes again only where their samples say it is due
        // (a leaf outside their maps, a thread not listed), not on a timer for each.
        let (stale_maps, unlisted_threads) = if system && refresh {
            self.check_samples(pool)
        } else {
            Default::default()
        };
        let owner_uid = self.owner_uid();
        // Every tick where sampling is fast enough that a tick holds more than
        // YOUNG_REFRESH_PERIODS samples per CPU (command-line runs at their default rate).
        let young_every = self
            .sampling
            .filter(|s| system && s.nominal_hz > 0.0)
            .map_or(Duration::ZERO, |s| {
                Duration::from_secs_f64(YOUNG_REFRESH_PERIODS / s.nominal_hz)
            });
        // The kernel says which processes exited (a pidfd each) at every tick. Where it
        // watches none, a system-wide run looks for its processes' exits every MAPS_REFRESH
        // (and at each one's own re-read), not every tick: each look opens and reads /proc/PID/stat, and
        // for every process of the machine ten times a second that was the agent's busiest
        // system call (200 a second on a quiet machine); an exit seen later only keeps the
        // process's state that much longer. Runs of targets look every tick: their end is
        // their targets' exit.
        let look_for_exits = !system || refresh;
        let scan_runtime = refresh || (!system && now >= self.next_runtime_scan);
        let mut runtime_scan_took = None;
        let started = self.started;
        // `--per-thread` labels a program's threads by the names its runtime gave them.
        let per_thread = self.per_thread;
        for (key, p) in self.processes.iter_mut() {
            // A young process of a system-wide run is re-read only when its executable memory
            // changed since the last look (one read of /proc/PID/status, where a re-read of
            // its maps reads its maps, status, executable, and each thread's stat): most
            // processes such a run takes in (a build's compilers) map nothing after it took
            // them in, and re-reading each every few ticks of its youth was most of the
            // agent's maps reads on a machine running builds.
            let young = p.young_until.is_some_and(|t| now < t)
                && now.duration_since(p.refreshed_at) >= young_every
                && (!system || (!p.exited && p.mapped_new_code()));
            let due = if system {
                now.duration_since(p.refreshed_at) >= SYSTEM_MAPS_REFRESH
                    || (stale_maps.contains(key)
                        && now.duration_since(p.refreshed_at) >= STALE_MAPS_MIN_INTERVAL)
            } else {
                refresh
            };
            // A target that mapped new code since the last tick (a dlopen) is re-read now:
            // until its new library's unwind table is loaded, that library's samples are its
            // leaf alone, and half a second of them was a visible share of a short run.
            // A young target is re-read at this tick anyway: its status is not read for the
            // sign as well (that read was a third of bpfprof's main thread in a launched
            // run); the sign's base is taken from the maps read instead, below.
            let mapped = !system && !young && !p.exited && p.mapped_new_code();
            let refresh = due || young || mapped;
            let Ok(program) = pool.program(p.slot) else {
                continue;
            };
            if let Some(owner) = self.owner {
                // A change without an exec (the process made itself undumpable) is caught
                // here; an exec was caught by the kernel and handled above.
                if refresh && !p.exited && !p.target.profilable_by(owner) && p.target.is_alive() {
                    p.revoke(program);
                }
            }
            let polled = look_for_exits || refresh || p.exit.is_watching();
            if polled && p.poll(exited.contains(key), refresh, per_thread) && system {
                program.forget_system_process(p.target.pid);
            }
            if young && !system {
                // What the maps just read count is what its status says (the kernel's
                // `exec_vm`): the first look at its status after its youth compares with it.
                p.executable_kib = p.maps.executable_kib();
            }
            // New code (dlopen, exec) gets its unwind tables while the run goes on, from the
            // same read of the maps as symbolization.
            if refresh && !p.exited {
                let _ =
                    program
                        .unwind
                        .track_maps(p.target.pid, owner_uid, Some(p.maps.last_read()));
                p.note_tables(&program.unwind, started);
                p.cfi_walked |= program.unwind.is_tracked(p.target.pid);
            }
            // A new process may map its interpreter only after its exec (libpython is loaded
            // by ld.so): it is looked for again while the process is young.
            if young && !p.exited && p.runtime.is_none() {
                let naming = Naming {
                    shares: &self.naming,
                    owner: owner_uid,
                    objects: &self.objects,
                };
                // Its maps as read at this tick's refresh (young means refreshed): a process
                // that maps no interpreter is not read again.
                p.runtime = crate::runtime::attach(
                    program,
                    p.target.pid,
                    &naming,
                    self.runtimes,
                    &mut p.runtime_refused,
                    p.maps.last_read(),
                );
            }
            if let Some(runtime) = &mut p.runtime {
                if p.exited {
                    runtime.stop(program);
                } else {
                    // A system-wide run lists a CPython's threads when its samples name one
                    // not listed (see `check_samples`), and otherwise rarely; a run of
                    // targets at each refresh of its maps.
                    let list = if system {
                        refresh
                            || unlisted_threads.contains(key)
                            || now.duration_since(p.threads_listed_at) >= PYTHON_THREADS_BACKSTOP
                    } else {
                        refresh
                    };
                    if list {
                        runtime.refresh(program);
                        p.threads_listed_at = now;
                    }
                    // A code object can be read only while it lives: a function compiled,
                    // run and dropped, or the last code a process runs before it exits, is
                    // gone soon after. Queued at each maps refresh, up to half a second of
                    // such code was never named ("[unknown Python code]"); a run of targets
                    // queues as often as every tick. A system-wide run, which scans the
                    // stacks of every process, still does it at each refresh.
                    // A system-wide run queues at each of its half-second looks, whether or
                    // not the process's maps were read again.
                    let queue = refresh
                        || (system && scan_runtime)
                        || (scan_runtime && new_stacks.contains_key(&p.slot.program_id));
                    if queue {
                        // Named by `name_runtime_frames`, off the programs' lock.
                        let read = |program: &crate::kernel::KernelProgram| {
                            // CPU time, not wall time: with three busy loops on two cores a
                            // look preempted midway took 13.6 ms for 0.6 ms of CPU, and the
                            // next look, 272 ms later by its wall time, came after the end of
                            // a function that ran 150 ms and its process.
                            let (began, cpu) = (Instant::now(), crate::clock::thread_cpu_time());
                            let ids = program.runtime_stack_ids();
                            let took = crate::clock::thread_cpu_time().saturating_sub(cpu);
                            log::trace!(
                                "{} runtime stacks recorded, found in {took:?} of CPU ({:?})",
                                ids.len(),
                                began.elapsed()
                            );
                            *runtime_scan_took.get_or_insert(Duration::ZERO) += took;
                            ids
                        };
                        runtime_ids.queue_with(
                            runtime.as_mut(),
                            program,
                            p.slot,
                            p.sample_pid,
                            read,
                        );
                    }
                }
            }
            if p.exited && system {
                // What the kernel holds for it goes at once: tables, mappings, runtime state
                // (its maps stay, to name its samples).
                if program.unwind.is_tracked(p.target.pid) {
                    p.note_tables(&program.unwind, started);
                    program.unwind.unload_process(p.target.pid);
                }
            }
        }
        if let Some(took) = runtime_scan_took {
            self.next_runtime_scan = now + (took * RUNTIME_SCAN_COST_SHARE).min(MAPS_REFRESH);
            // Counts read before the look: a stack stored during it is looked for again.
            for (program, stored) in new_stacks {
                if let (Some(stored), true) = (stored, runtime_ids.read_for(program)) {
                    self.stacks_at_runtime_scan.insert(program, stored);
                }
            }
        }
        self.send_warm(pool);
        TickStatus {
            samples,
            // A system-wide run lasts until it is stopped.
            all_exited: !system && self.processes.values().all(|p| p.exited),
        }
    }

    /// The processes the kernel says exited (those it watches: see [`ExitWatch`]) and that are
    /// not marked exited yet, by their keys in `processes`.
    ///
    /// The kernel reports each exit once: one reported here stays among those returned until
    /// its process is marked exited, whichever look does that.
    pub(super) fn kernel_exits(&mut self) -> HashSet<ProcessKey> {
        let exited = self.exit_watches.exited();
        if !exited.is_empty() {
            for (key, p) in &self.processes {
                if p.exit.is_among(&exited) {
                    self.exits_reported.insert(*key);
                }
            }
        }
        let processes = &self.processes;
        self.exits_reported
            .retain(|key| processes.get(key).is_some_and(|p| !p.exited));
        self.exits_reported.clone()
    }

    /// Reads the keys of the samples recorded so far and finds, by their keys in
    /// `processes`, the processes whose maps are stale (a user stack of theirs, checked once
    /// per window, has its leaf outside their maps: code mapped since, by dlopen or a JIT) and
    /// the CPythons a sample of which names a thread not listed yet (or listed without a
    /// thread state more than [`STATELESS_THREAD_RELIST`] ago). What this costs grows with
    /// the samples, not with the processes: each new stack's leaf is looked at once.
    fn check_samples(
        &mut self,
        pool: &mut ProgramPool,
    ) -> (HashSet<ProcessKey>, HashSet<ProcessKey>) {
        let (mut stale, mut unlisted) = (HashSet::new(), HashSet::new());
        let now = Instant::now();
        let mut read: HashMap<u32, Vec<profiler_common::SampleKey>> = HashMap::new();
        for (slot, _) in &self.slots {
            let Ok(program) = pool.program(*slot) else {
                continue;
            };
            let keys = read
                .entry(slot.program_id)
                .or_insert_with(|| program.sample_keys());
            for k in keys.iter().filter(|k| k.runs & (1 << slot.run) != 0) {
                let key = (slot.program_id, slot.run, k.pid);
                let Some(p) = self.processes.get_mut(&key) else {
                    continue;
                };
                if p.exited {
                    continue;
                }
                if k.user_stack != 0
                    && p.maps.is_known()
                    && !stale.contains(&key)
                    && p.checked_stacks.insert(k.user_stack)
                {
                    let leaf = program
                        .stack(k.user_stack)
                        .ok()
                        .and_then(|frames| frames.first().copied());
                    if leaf.is_some_and(|leaf| !p.maps.covers_now(leaf)) {
                        stale.insert(key);
                    }
                }
                if let Some(runtime) = &p.runtime {
                    let relist = k.runtime_stack == 0
                        && match runtime.thread_listed(k.tid) {
                            Some(true) => false,
                            Some(false) => {
                                now.duration_since(p.threads_listed_at) >= STATELESS_THREAD_RELIST
                            }
                            None => true,
                        };
                    if relist {
                        unlisted.insert(key);
                    }
                }
            }
        }
        (stale, unlisted)
    }

    /// Sends the addresses sampled since the last call to the warm sink, if there is one,
    /// or holds them back (see [`WARM_HOLD`]).
    fn send_warm(&mut self, pool: &mut ProgramPool) {
        if self.warm.is_none() {
            return;
        }
        let warm = &mut self.warm_held;
        let mut seen_programs = HashSet::new();
        for (slot, _) in &self.slots {
            if !seen_programs.insert(slot.program_id) {
                continue;
            }
            let Ok(program) = pool.program(*slot) else {
                continue;
            };
            let (kernel, user): (Vec<u64>, Vec<u64>) = program
                .take_fresh_frames()
                .into_iter()
                .partition(|a| *a >= KERNEL_ADDRESS_START);
            warm.kernel.extend(kernel);
            // A program's stacks do not say whose they are: each is placed in every process
            // of the program that maps it.
            for p in self
                .processes
                .values()
                .filter(|p| p.slot.program_id == slot.program_id)
            {
                warm.user
                    .extend(user.iter().filter_map(|a| match p.maps.locate(*a) {
                        crate::process::maps::Location::File(file, offset) => Some((file, offset)),
                        _ => None,
                    }));
            }
        }
        let held = warm.user.len() + warm.kernel.len();
        if warm_due(held, self.started.elapsed()) {
            if let Some(sink) = &self.warm {
                sink(std::mem::take(&mut self.warm_held));
            }
        }
    }

    /// Handles process `pid` of `slot`, which exec'd: the kernel stopped sampling it at the exec.
    /// It is sampled again if `owner` may profile the new program, with its maps read anew
    /// (those read since the exec may be of a program the owner may not see) and its runtime
    /// state forgotten (names read from its memory since the exec, likewise); otherwise it is
    /// revoked. A child not adopted yet is handed back to the kernel's following, and adoption
    /// checks it.
    pub(super) fn after_exec(
        &mut self,
        program: &mut crate::kernel::KernelProgram,
        slot: Slot,
        pid: u32,
        owner: Owner,
    ) {
        let follow = self.follow_children;
        let known = self
            .processes
            .values_mut()
            .find(|p| p.slot == slot && p.target.pid == pid && !p.exited);
        let Some(p) = known else {
            if !self.ignored.contains(&pid)
                && Target::from_pid(pid).is_ok_and(|t| t.profilable_by(owner))
            {
                let _ = program.resume_followed(slot.run, pid);
            } else {
                program.drop_followed(slot.run, pid);
            }
            return;
        };
        if let Some(mut runtime) = p.runtime.take() {
            runtime.stop(program);
        }
        let fresh = ProcessMaps::capture(pid, p.target.ns_pid, &self.copies);
        let fresh = match fresh {
            Ok(fresh) if p.target.profilable_by(owner) => fresh,
            _ => {
                p.revoke(program);
                return;
            }
        };
        let resumed = if p.direct {
            program.resume_target(slot.run, &p.target, follow)
        } else {
            program.resume_followed(slot.run, pid)
        };
        // Checked again once it samples: an exec between the check and the resume was not
        // reported (the kernel had already stopped the run); one after it is.
        if resumed.is_err() || !p.target.profilable_by(owner) {
            p.revoke(program);
            return;
        }
        log::debug!("pid {pid} exec'd a program its run's owner may profile");
        p.maps = fresh;
        p.young_until = Some(Instant::now() + YOUNG_PROCESS);
        let _ = program
            .unwind
            .track_maps(pid, owner.uid, Some(p.maps.last_read()));
    }

    /// Takes in a child the kernel followed for `slot` (or, `system`, a process a system-wide
    /// run sampled), unless it is a thread or known.
    pub(super) fn adopt(
        &mut self,
        program: &mut crate::kernel::KernelProgram,
        slot: Slot,
        pid: u32,
        system: bool,
    ) {
        if self.ignored.contains(&pid)
            || self.over_cap.contains(&pid)
            || self
                .processes
                .contains_key(&(slot.program_id, slot.run, pid))
            || (!system && self.processes.values().any(|p| p.target.pid == pid))
        {
            return;
        }
        if system && self.processes.len() >= MAX_SYSTEM_PROCESSES {
            if self.over_cap.is_empty() {
                log::warn!(
                    "{MAX_SYSTEM_PROCESSES} processes taken in, the most a system-wide run \
                     does: the samples of further ones are counted, not named"
                );
            }
            self.over_cap.insert(pid);
            return;
        }
        let (target, status) = match Target::read(pid) {
            Ok((target, status)) if status.tgid == pid as i32 => (target, status),
            _ => {
                // A thread of a target (the fork tracepoint sees those too), or gone already.
                program.forget_followed(pid);
                self.ignored.insert(pid);
                return;
            }
        };
        // Noted before its maps are read, so that code mapped from here on is seen at its
        // youth's next look (see `tick`).
        let executable_kib = system.then(|| crate::process::target::executable_kib(&status));
        let adopted = ProcessMaps::capture(target.pid, target.ns_pid, &self.copies)
            .map(|maps| (target, maps));
        let adopted = adopted.and_then(|(target, maps)| match self.owner {
            Some(owner) if !target.profilable_by(owner) => {
                // Its samples so far (from its fork on) are dropped with it.
                program.drop_followed(slot.run, pid);
                let sample_pid = if system { pid } else { target.ns_pid };
                let mut gone = ProcessRecording::gone(slot, sample_pid);
                gone.revoked = true;
                log::info!("not following child pid {pid}: its run's owner may not profile it");
                self.processes
                    .insert((slot.program_id, slot.run, sample_pid), gone);
                Err(crate::error::Error::PermissionDenied(format!("pid {pid}")))
            }
            _ => Ok((target, maps)),
        });
        match adopted {
            Ok((target, maps)) => {
                log::debug!("taking in pid {pid} ({})", target.comm);
                let tracked =
                    program
                        .unwind
                        .track_maps(pid, self.owner_uid(), Some(maps.last_read()));
                if let Err(e) = tracked {
                    log::debug!("unwind tables of pid {pid}: {e}");
                }
                let cfi_walked = program.unwind.is_tracked(pid);
                // A system-wide run's samples carry pids of the initial namespace.
                let sample_pid = if system { pid } else { target.ns_pid };
                let mut runtime_refused = None;
                let naming = Naming {
                    shares: &self.naming,
                    owner: self.owner_uid(),
                    objects: &self.objects,
                };
                let exit = ExitWatch::open(&target, &self.exit_watches);
                // Young for what is left of its first YOUNG_PROCESS: a process a system-wide
                // run takes in long after its start (every service on the host when the agent
                // starts) has mapped its libraries and started its interpreter already, and
                // looking at each of 150 such processes every few ticks of a youth counted
                // from its adoption was most of the agent's first minute. A later dlopen is
                // caught by its samples' leaves (`check_samples`).
                let young_until = match target.age() {
                    Some(age) => YOUNG_PROCESS
                        .checked_sub(age)
                        .filter(|left| !left.is_zero())
                        .map(|left| Instant::now() + left),
                    None => Some(Instant::now() + YOUNG_PROCESS),
                };
                // Its maps as just read: most processes a system-wide run takes in
                // (compilers, shells) map no interpreter, and are not read again for it.
                let runtime = crate::runtime::attach(
                    program,
                    pid,
                    &naming,
                    self.runtimes,
                    &mut runtime_refused,
                    maps.last_read(),
                );
                self.processes.insert(
                    (slot.program_id, slot.run, sample_pid),
                    ProcessRecording {
                        slot,
                        sample_pid,
                        target,
                        maps,
                        direct: false,
                        exited: false,
                        runtime,
                        runtime_refused,
                        young_until,
                        refreshed_at: Instant::now(),
                        executable_kib,
                        untabled: Vec::new(),
                        tabled_late: Vec::new(),
                        cfi_walked,
                        revoked: false,
                        exit,
                        threads_listed_at: Instant::now(),
                        checked_stacks: Default::default(),
                    },
                );
            }
            Err(_) => {
                self.ignored.insert(pid);
            }
        }
    }
}

/// Whether `held` sampled addresses go to be symbolized now, in a run `age` old (see
/// [`WARM_HOLD`]).
fn warm_due(held: usize, age: Duration) -> bool {
    held > 0 && (held >= WARM_BATCH || age >= WARM_HOLD)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A young run's few addresses wait (the first batch parses each object's symbols, taken
    /// from the workload on a busy machine); many are sent at once, and any once the run is
    /// past its hold; nothing is sent empty.
    #[test]
    fn a_young_runs_few_addresses_wait_for_the_end_of_its_hold() {
        let young = WARM_HOLD / 4;
        assert!(!warm_due(0, young));
        assert!(!warm_due(0, WARM_HOLD * 2));
        assert!(!warm_due(WARM_BATCH - 1, young));
        assert!(warm_due(WARM_BATCH, young));
        assert!(warm_due(1, WARM_HOLD));
        assert!(warm_due(1, WARM_HOLD * 2));
    }
}
