//! Setting a recording up: a system-wide run's program ([`Recording::start_system`]), a
//! target's slot, tables and registration ([`Recording::add_target`]), and the pool behind
//! them ([`PoolAccess`]).

use std::time::{Duration, Instant};

use profiler_common::PidNamespace;

use super::{MAPS_REFRESH, YOUNG_PROCESS};
use crate::{
    error::Result,
    kernel::pool::{ProgramPool, Slot},
    process::maps::ProcessMaps,
    process::target::{ExitWatch, Target},
    recording::process::ProcessRecording,
    recording::request::{Scope, SystemScope},
    recording::Recording,
    runtime::Naming,
    sampling::KernelLimits,
};

/// Where a recording reaches its kernel programs: the command line owns its pool; the daemon
/// shares one between its runs behind a lock.
pub trait PoolAccess {
    /// Runs `f` on the pool, holding its lock (where it has one) only while `f` runs.
    fn with_pool<R>(&mut self, f: impl FnOnce(&mut ProgramPool) -> R) -> R;
}

impl PoolAccess for ProgramPool {
    fn with_pool<R>(&mut self, f: impl FnOnce(&mut ProgramPool) -> R) -> R {
        f(self)
    }
}

impl PoolAccess for &std::sync::Mutex<ProgramPool> {
    fn with_pool<R>(&mut self, f: impl FnOnce(&mut ProgramPool) -> R) -> R {
        // A panic while holding the pool leaves it as consistent as any error would.
        f(&mut self.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Recording {
    /// Sets a newly acquired run slot up for this recording: its timeline, its off-CPU time,
    /// then `more`; the slot is given back when a step fails.
    fn arm_slot(
        &self,
        pool: &mut ProgramPool,
        slot: Slot,
        more: impl FnOnce(&mut crate::kernel::KernelProgram) -> Result<()>,
    ) -> Result<()> {
        let armed = pool.program(slot).and_then(|p| {
            if self.timeline {
                p.record_timeline(slot.run)?;
            }
            if let Some(off_cpu) = self.request.off_cpu {
                p.record_off_cpu(slot.run, off_cpu)?;
            }
            more(p)
        });
        if armed.is_err() {
            pool.release(slot);
        }
        armed
    }

    /// Starts recording every process on the machine (a request of [`Scope::System`]):
    /// bpfprof's own process left out, kernel threads and a cgroup as the scope says. Each
    /// process is taken in at the tick after its first sample ([`Self::tick`]): its maps read, its
    /// unwind tables queued and its interpreter looked for; until its tables are built its
    /// stacks are walked by frame pointer (counted). The run has a kernel program of its own.
    pub fn start_system(&mut self, pool: &mut impl PoolAccess) -> Result<()> {
        let Scope::System(scope) = self.scope.clone() else {
            return Err(crate::error::Error::Usage(
                "start_system needs a system-wide request".into(),
            ));
        };
        if !self.slots.is_empty() {
            return Err(crate::error::Error::Usage(
                "a system-wide recording is started once, and has no targets".into(),
            ));
        }
        let cgroup = scope
            .cgroup
            .as_deref()
            .map(SystemScope::cgroup_filter)
            .transpose()?
            .map(|c| (c.id, c.level));
        let table_rows = match self.unwind {
            crate::unwind::UnwindMode::Fp => 1,
            _ => crate::unwind::table_rows_for(None, self.table_rows_cap),
        };
        let off_cpu = self.request.off_cpu.is_some();
        let slot = pool.with_pool(|pool| -> Result<_> {
            let (slot, sampling) = pool.acquire_system(&self.request, self.unwind, table_rows)?;
            // With off-CPU time, the machine is recorded from the off-CPU program's attach
            // on (below): its on-CPU samples from before it (the walkers' verification,
            // seconds on a loaded machine) would fall before the run's window.
            self.arm_slot(pool, slot, |p| {
                if off_cpu {
                    return Ok(());
                }
                p.record_system(slot.run, scope.kernel_threads, cgroup)
            })?;
            self.sampling = Some(sampling);
            self.slots.push((slot, PidNamespace::default()));
            Ok(slot)
        })?;
        // The walker verifies meanwhile (outside the pool, as for a target): stacks of the
        // first 0.1 s use frame pointers and are counted.
        // Off-CPU time waits for its program (verified after the walker) to be attached.
        let deadline = Instant::now() + crate::unwind::TABLE_WAIT;
        while (off_cpu || Instant::now() < deadline)
            && pool.with_pool(|pool| pool.program(slot).is_ok_and(|p| p.walker_pending()))
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        // The run's window starts as the off-CPU program is attached: it records every
        // switch-out of the machine from then on.
        let mut attached = None;
        if off_cpu {
            attached = pool.with_pool(|pool| {
                pool.program(slot).and_then(|p| {
                    // The scan's setup first (its own second or two), then the machine's
                    // samples and switches from one moment on.
                    p.prepare_wait_scan();
                    p.record_system(slot.run, scope.kernel_threads, cgroup)?;
                    p.attach_off_cpu()?;
                    Ok(p.off_cpu_attached())
                })
            })?;
        }
        let (since_ns, started) =
            attached.unwrap_or_else(|| (crate::clock::monotonic_ns(), Instant::now()));
        // The processes running now are taken in at the first tick, not half a second later.
        self.last_refresh = Instant::now()
            .checked_sub(MAPS_REFRESH)
            .unwrap_or_else(Instant::now);
        pool.with_pool(|pool| {
            self.started = started;
            self.window_started = self.started;
            self.delivery_at_start = pool.program(slot).ok().and_then(|p| p.delivery());
            self.max_sample_rate_at_start = KernelLimits::read().max_sample_rate;
        });
        if off_cpu {
            // The waits the scan finds count from the window's start, as a switch-out's since
            // then would (the scan takes a while on a busy host).
            pool.with_pool(|pool| self.take_in_waiting(pool, slot, &scope, since_ns));
        }
        Ok(())
    }

    /// Says that the target `pid` about to be added is a launched command that has not
    /// exec'd yet: the kernel records it only from its exec (until then it runs bpfprof's own
    /// code). [`Self::exec_seen`] once it has exec'd.
    pub fn expect_exec(&mut self, pid: u32) {
        self.launched = Some(pid);
    }

    /// The launched command has exec'd (or failed to): the kernel's wait for it ends.
    pub fn exec_seen(&mut self, pool: &mut impl PoolAccess) {
        if self.launched.take().is_none() {
            return;
        }
        let slots: Vec<Slot> = self.slots.iter().map(|(s, _)| *s).collect();
        pool.with_pool(|pool| {
            for slot in slots {
                if let Ok(program) = pool.program(slot) {
                    program.end_await_exec();
                }
            }
        });
    }

    /// A system-wide run's waits that began before it ([`KernelProgram::scan_machine_waits`]):
    /// every process of `scope` with a thread off the CPU now is taken in now, with the
    /// stacks its threads wait in; one blocked throughout would never be sampled, so never
    /// taken in, and its wall or off-CPU time would be missing.
    ///
    /// [`KernelProgram::scan_machine_waits`]: crate::kernel::KernelProgram::scan_machine_waits
    fn take_in_waiting(
        &mut self,
        pool: &mut ProgramPool,
        slot: Slot,
        scope: &SystemScope,
        since_ns: u64,
    ) {
        let pids = scope_pids(scope);
        let Ok(program) = pool.program(slot) else {
            return;
        };
        let waits = program.scan_machine_waits(slot.run, &pids, since_ns);
        let started = Instant::now();
        let mut left = 0;
        for (pid, mut waits) in waits {
            if started.elapsed() >= MACHINE_WAIT_ADOPT_BUDGET {
                // Counted all the same; named as a process the run did not take in, unless
                // it runs later (its sample takes it in then).
                left += 1;
                continue;
            }
            self.adopt(program, slot, pid, true);
            let key = (slot.program_id, slot.run, pid);
            if let Some(p) = self.processes.get_mut(&key) {
                if let Some(runtime) = &mut p.runtime {
                    runtime.read_wait_stacks(&p.target, &mut waits);
                }
            }
            program.keep_waits(waits);
        }
        if left > 0 {
            log::info!(
                "{left} processes waiting at the start not taken in (at most {} s of it): \
                 their waits are counted, under their pids",
                MACHINE_WAIT_ADOPT_BUDGET.as_secs()
            );
        }
    }

    /// Captures what symbolization needs and starts keeping the samples of `target`.
    ///
    /// With a shared pool (the daemon's), the slow parts (building the target's unwind tables,
    /// waiting for the walker's verification) run without holding it, so that the other runs
    /// of the pool keep ticking meanwhile.
    pub fn add_target(&mut self, pool: &mut impl PoolAccess, target: Target) -> Result<()> {
        if self.is_system() {
            return Err(crate::error::Error::Usage(
                "a system-wide recording has no targets".into(),
            ));
        }
        let mut steps = crate::clock::Steps::start(format!("pid {}", target.pid));
        let maps = ProcessMaps::capture(target.pid, target.ns_pid, &self.copies)?;
        // The row array is sized from the objects the target maps (read here, not under the
        // pool).
        let table_rows = match self.unwind {
            crate::unwind::UnwindMode::Fp => 1,
            _ => crate::unwind::table_rows_for(Some(target.pid), self.table_rows_cap),
        };
        steps.done("maps read and tables sized");
        let owner_uid = self.owner_uid();
        if self.slots.iter().all(|(_, ns)| *ns != target.ns) {
            // A program to load is loaded before taking the pool (verifying it is most of a
            // first run's start), so that a shared pool's other runs keep ticking meanwhile.
            let load = pool.with_pool(|pool| {
                pool.load_needed(&self.request, self.unwind, table_rows, owner_uid)
            });
            if let Some(load) = load {
                // A running process waits for the walker (whole stacks from its first sample):
                // verified alongside the sampling program. A launched command starts at once.
                let program = if crate::unwind::loader::is_unexeced_child(target.pid) {
                    load.walker(crate::kernel::WalkerLoad::Background).load()?
                } else {
                    load.load()?
                };
                pool.with_pool(|pool| pool.offer(program));
            }
        }
        let slot = pool.with_pool(|pool| -> Result<_> {
            let slot = match self.slots.iter().find(|(_, ns)| *ns == target.ns) {
                Some((slot, _)) => *slot,
                None => {
                    let (slot, sampling) =
                        pool.acquire(&self.request, self.unwind, table_rows, owner_uid)?;
                    let checks_execs = self.owner.is_some();
                    self.arm_slot(pool, slot, |p| {
                        // Before any process of the run is registered: none of them is
                        // sampled past an exec its owner has not been checked against.
                        if checks_execs {
                            p.stop_at_exec(slot.run, true)?;
                        }
                        Ok(())
                    })?;
                    if self.slots.is_empty() {
                        self.started = Instant::now();
                        self.window_started = self.started;
                        self.delivery_at_start = pool.program(slot)?.delivery();
                        self.max_sample_rate_at_start = KernelLimits::read().max_sample_rate;
                    }
                    self.sampling = Some(sampling);
                    self.slots.push((slot, target.ns));
                    slot
                }
            };
            // The target's tables are queued now, to build on the table thread while the
            // walker verifies; no sample of the target is taken before it is registered.
            let tracked = pool.program(slot).and_then(|p| {
                p.unwind
                    .track_maps(target.pid, owner_uid, Some(maps.last_read()))
            });
            if let Err(e) = tracked {
                self.release_unused(pool, slot);
                return Err(e);
            }
            Ok(slot)
        })?;
        steps.done("program attached and tables queued");
        // Outside the pool, looking in briefly: the walker's verification (0.1 s, more on a
        // loaded machine) and the first tables (see `table_deadline`), so that the other runs
        // of a shared pool keep ticking meanwhile.
        let deadline = table_deadline(self.unwind);
        let off_cpu = self.request.off_cpu.is_some();
        loop {
            let (walker, tables) = pool.with_pool(|pool| match pool.program(slot) {
                Ok(p) => {
                    p.unwind.poll();
                    let tracked = p.unwind.is_tracked(target.pid);
                    (
                        // Off-CPU time needs its program, verified after the walker.
                        (tracked || off_cpu) && p.walker_pending(),
                        tracked && p.unwind.pending(target.pid),
                    )
                }
                Err(_) => (false, false),
            });
            if !walker && (!tables || Instant::now() >= deadline) {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        steps.done("waited for the walker and first tables");
        let registered = pool.with_pool(|pool| self.register(pool, slot, target, maps));
        steps.done("registered: sampling");
        registered
    }

    /// Waits for the walker program of every slot in use to be verified (or to fail): a
    /// launched command is held at its exec until then, so that its stacks are whole from the
    /// first sample and the kernel's verification (15-20 ms of CPU) is not taken from it.
    pub fn wait_for_walker(&mut self, pool: &mut impl PoolAccess) {
        for (slot, _) in self.slots.clone() {
            while pool.with_pool(|pool| pool.program(slot).is_ok_and(|p| p.walker_pending())) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Frees `slot` when no process of this recording uses it (a target that failed to register).
    fn release_unused(&mut self, pool: &mut ProgramPool, slot: Slot) {
        if !self
            .processes
            .keys()
            .any(|k| k.0 == slot.program_id && k.1 == slot.run)
        {
            self.slots.retain(|(s, _)| *s != slot);
            pool.release(slot);
        }
    }

    /// The part of [`Self::add_target`] that needs the kernel program: the target's tables
    /// written in, the target registered in `slot`.
    fn register(
        &mut self,
        pool: &mut ProgramPool,
        slot: Slot,
        target: Target,
        maps: ProcessMaps,
    ) -> Result<()> {
        let mut waited = false;
        let mut sampled_from = None;
        let owner = self.owner;
        let mut maps = maps;
        let registered = pool.program(slot).and_then(|program| {
            if program.unwind.is_tracked(target.pid) {
                // A running process is profiled from its first sample with whole stacks: its
                // samples wait for the CFI walker (verifying since the program loaded). A
                // launched command, added before it execs with no tables, waits for it at its
                // exec ([`Self::wait_for_walker`]).
                if let Err(e) = program.wait_walker() {
                    log::warn!("CFI walker unavailable ({e}): stacks use frame pointers");
                }
                waited = true;
            }
            if self.request.off_cpu.is_some() {
                program.attach_off_cpu()?;
            }
            if self.launched == Some(target.pid) {
                program.await_exec(target.pid)?;
            }
            program.add_target(slot.run, &target, self.follow_children)?;
            sampled_from = Some(Instant::now());
            if let Some(owner) = owner {
                // Checked again now that the kernel watches it (an exec from now on stops its
                // sampling and is reported), and its maps read again after the check: those
                // read before may be of a program it exec'd since the caller's check.
                let recaptured = ProcessMaps::capture(target.pid, target.ns_pid, &self.copies);
                match recaptured {
                    Ok(fresh) if target.profilable_by(owner) => maps = fresh,
                    _ => {
                        let _ = program.remove_target(slot.run, &target);
                        return Err(crate::error::Error::PermissionDenied(format!(
                            "you may not profile pid {}",
                            target.pid
                        )));
                    }
                }
            }
            // Its threads already waiting: their waits count from when it became a target,
            // not from their next switch-out (a thread blocked throughout would not show).
            // Right after the owner's check: a thread that wakes before the scan loses the
            // part of its wait until then.
            let mut waits = if self.request.off_cpu.is_some() {
                program.scan_waits(slot.run, &target)
            } else {
                Vec::new()
            };
            let mut refused = None;
            let naming = Naming {
                shares: &self.naming,
                owner: self.owner_uid(),
                objects: &self.objects,
            };
            let mut runtime = crate::runtime::attach(
                program,
                target.pid,
                &naming,
                self.runtimes,
                &mut refused,
                &[],
            );
            if let Some(runtime) = &mut runtime {
                runtime.read_wait_stacks(&target, &mut waits);
            }
            program.keep_waits(waits);
            Ok((runtime, refused))
        });
        if waited && self.processes.is_empty() {
            // The run's duration counts from its first sample, not from the program's load:
            // on a loaded machine the walker's verification takes a good part of a short run.
            // The throttling check counts from the same moment: samples the kernel cut while
            // the walker verified are not the run's.
            // From the target's first possible sample, not after its interpreter was looked
            // at (a tenth of a second and more on a loaded machine, sampled all along).
            self.started = sampled_from.unwrap_or_else(Instant::now);
            self.window_started = self.started;
            self.delivery_at_start = pool.program(slot).ok().and_then(|p| p.delivery());
        }
        let (runtime, runtime_refused) = match registered {
            Ok(runtime) => runtime,
            Err(e) => {
                self.release_unused(pool, slot);
                return Err(e);
            }
        };
        let exit = ExitWatch::open(&target, &self.exit_watches);
        self.processes.insert(
            (slot.program_id, slot.run, target.ns_pid),
            ProcessRecording {
                slot,
                sample_pid: target.ns_pid,
                target,
                maps,
                direct: true,
                exited: false,
                runtime,
                runtime_refused,
                young_until: Some(Instant::now() + YOUNG_PROCESS),
                refreshed_at: Instant::now(),
                executable_kib: None,
                untabled: Vec::new(),
                tabled_late: Vec::new(),
                cfi_walked: waited,
                revoked: false,
                exit,
                threads_listed_at: Instant::now(),
                checked_stacks: Default::default(),
            },
        );
        Ok(())
    }

    /// Re-reads the memory maps and unwind tables of `pid` now (a launched command that just
    /// exec'd: before, they were bpfprof's own).
    pub fn refresh_maps(&mut self, pool: &mut ProgramPool, pid: u32) {
        let owner_uid = self.owner_uid();
        for p in self.processes.values_mut() {
            if p.target.pid == pid {
                p.young_until = Some(Instant::now() + YOUNG_PROCESS);
                if let Err(e) = p.maps.refresh() {
                    log::debug!("maps of pid {pid}: {e}");
                }
                if let Ok(program) = pool.program(p.slot) {
                    let _ = program
                        .unwind
                        .track_maps(pid, owner_uid, Some(p.maps.last_read()));
                    p.cfi_walked |= program.unwind.is_tracked(pid);
                    program.unwind.settle(pid, table_deadline(self.unwind));
                    // A launched command runs its runtime (is a CPython) only once it has
                    // exec'd.
                    if p.runtime.is_none() {
                        let naming = Naming {
                            shares: &self.naming,
                            owner: owner_uid,
                            objects: &self.objects,
                        };
                        // Its maps are read here (not those read before its exec, where the
                        // re-read above failed).
                        p.runtime = crate::runtime::attach(
                            program,
                            pid,
                            &naming,
                            self.runtimes,
                            &mut p.runtime_refused,
                            &[],
                        );
                    }
                }
            }
        }
    }
}

/// Until when a new process's start waits for its unwind tables: with `--unwind cfi` until
/// they are all built; otherwise briefly, so that small objects (an executable, libc) have
/// theirs from the first sample while a huge one's table comes a little later.
fn table_deadline(mode: crate::unwind::UnwindMode) -> Instant {
    Instant::now()
        + match mode {
            crate::unwind::UnwindMode::Cfi => crate::unwind::CFI_TABLE_WAIT,
            _ => crate::unwind::TABLE_WAIT,
        }
}

/// The most time a system-wide run's start spends taking in the processes found waiting
/// (their maps read, unwind tables queued, interpreters looked for): a busy host has
/// thousands, and the run's duration is running meanwhile.
const MACHINE_WAIT_ADOPT_BUDGET: Duration = Duration::from_secs(2);

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags.
const PF_KTHREAD: u32 = 0x0020_0000;

/// The processes a system-wide run of `scope` records now, by global pid (bpfprof's own left
/// out): those of its cgroup and the cgroups below it, else every process of the machine,
/// kernel threads only where the scope keeps them. One look at each process's `stat`.
fn scope_pids(scope: &SystemScope) -> Vec<u32> {
    let own = std::process::id();
    let candidates: Vec<u32> = match &scope.cgroup {
        Some(cgroup) => {
            let mut pids = Vec::new();
            let mut dirs = vec![cgroup.clone()];
            while let Some(dir) = dirs.pop() {
                if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                    pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
                }
                if let Ok(entries) = std::fs::read_dir(&dir) {
                    dirs.extend(
                        entries
                            .filter_map(|e| e.ok())
                            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                            .map(|e| e.path()),
                    );
                }
            }
            pids
        }
        None => procfs::process::all_processes()
            .map(|all| all.filter_map(|p| p.ok()).map(|p| p.pid as u32).collect())
            .unwrap_or_default(),
    };
    candidates
        .into_iter()
        .filter(|&pid| pid != own)
        .filter(|&pid| {
            scope.kernel_threads
                || procfs::process::Process::new(pid as i32)
                    .and_then(|p| p.stat())
                    .is_ok_and(|stat| stat.flags & PF_KTHREAD == 0)
        })
        .collect()
}
