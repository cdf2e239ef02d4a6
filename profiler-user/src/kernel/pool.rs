//! The kernel programs in use: one loaded and attached program per distinct sampling request,
//! each with up to [`MAX_RUNS`] run slots. A program is detached when its last slot is
//! released, so nothing samples while no run needs it; a pool that lingers (the daemon's)
//! keeps one detached program loaded for a while, so that the next run starts without
//! loading and verifying the program again (its walker takes ~0.2 s to verify) and finds
//! its unwind tables resident.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use profiler_common::MAX_RUNS;

use crate::{
    error::{Error, Result},
    kernel::{KernelProgram, WalkerLoad},
    sampling::{KernelLimits, Sampling, SamplingRequest},
    unwind::{BuildPriority, UnwindMode},
};

/// Most programs attached at once: each one costs a perf event and a timer per CPU, so a
/// client cannot multiply them by asking for many distinct rates.
pub const MAX_PROGRAMS: usize = 4;

/// Distinct sampling settings one non-root user may hold alone (programs whose every run is
/// theirs): with [`MAX_PROGRAMS`] settings in all, one user asking for several nearby rates
/// (101, 102, 103, 104 Hz) took every place and refused every other user for as long as
/// their runs lasted. A user's further runs share their setting, another user's, or the
/// default.
pub const OWN_PROGRAMS_PER_USER: usize = 1;

/// Program places a non-root user's new non-default setting may not take: kept for the
/// default setting (the daemon's default event and rate, and the default unwinder), so that
/// any user can always start a run with it, however the other places are used.
pub const PLACES_KEPT_FOR_DEFAULT: usize = 1;

/// A run slot of one pooled program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The kernel id of the program the slot belongs to.
    pub program_id: u32,
    /// The run slot in that program.
    pub run: u32,
}

struct Pooled {
    request: SamplingRequest,
    /// How the program walks user stacks: runs asking for another mode get another program.
    unwind: UnwindMode,
    program: KernelProgram,
    sampling: Sampling,
    /// Bit `r` set: run slot `r` is taken.
    used: u64,
    /// Who holds each taken run slot (uid; 0 for root and the command line).
    owners: BTreeMap<u32, u32>,
    /// Whether its run records every task (its samples carry the initial namespace's pids,
    /// which no other run's may share): never shared.
    system: bool,
}

/// The attached kernel programs, by kernel program id.
#[derive(Default)]
pub struct ProgramPool {
    programs: BTreeMap<u32, Pooled>,
    bpf_stats: bool,
    /// How long a detached program stays loaded for the next run; `None`: unloaded at once.
    linger: Option<Duration>,
    /// The detached program kept for the next run, and since when.
    spare: Option<(KernelProgram, Instant)>,
    /// Whether unwind table builds yield to the rest of the process.
    build_priority: BuildPriority,
    /// Where built unwind tables are kept between processes (see [`crate::unwind::cache`]).
    table_cache: Option<std::sync::Arc<crate::unwind::TableCache>>,
}

impl ProgramPool {
    /// An empty pool; with `bpf_stats` each program measures its own run time.
    pub fn new(bpf_stats: bool) -> ProgramPool {
        ProgramPool {
            programs: BTreeMap::new(),
            bpf_stats,
            linger: None,
            spare: None,
            build_priority: BuildPriority::Foreground,
            table_cache: None,
        }
    }

    /// Reads and files unwind tables in `cache` (none: every table is built).
    pub fn with_table_cache(
        mut self,
        cache: Option<std::sync::Arc<crate::unwind::TableCache>>,
    ) -> ProgramPool {
        self.table_cache = cache;
        self
    }

    /// Builds unwind tables at `priority` (a daemon's or an agent's pool: see
    /// [`BuildPriority`]); a command line's builds are [`BuildPriority::Foreground`].
    pub fn with_build_priority(mut self, priority: BuildPriority) -> ProgramPool {
        self.build_priority = priority;
        self
    }

    /// Keeps the last detached program loaded for `linger` after its last run (see the
    /// module's documentation); call [`Self::expire_idle`] to unload it once that has passed.
    pub fn with_linger(mut self, linger: Duration) -> ProgramPool {
        self.linger = Some(linger);
        self
    }

    /// Unloads the spare program once it has been idle for the linger time.
    pub fn expire_idle(&mut self) {
        if let (Some((_, since)), Some(linger)) = (&self.spare, self.linger) {
            if since.elapsed() >= linger {
                self.spare = None;
                log::info!("unloaded the idle kernel program");
            }
        }
    }

    /// Takes a free run slot of the program that samples as `request` asks and walks user
    /// stacks as `unwind` says, loading and attaching one when none has a free slot; a program
    /// loaded for it gets an unwind row array of `table_rows` rows (the idle spare serves when
    /// its array is as large). `uid` is who the run is for (0: root or the command line,
    /// which no fairness limit applies to).
    pub fn acquire(
        &mut self,
        request: &SamplingRequest,
        unwind: UnwindMode,
        table_rows: u32,
        uid: u32,
    ) -> Result<(Slot, Sampling)> {
        self.acquire_in(request, unwind, table_rows, uid, false)
    }

    /// Like [`Self::acquire`], for a run that records every task: always a program of its
    /// own, which no other run joins.
    pub fn acquire_system(
        &mut self,
        request: &SamplingRequest,
        unwind: UnwindMode,
        table_rows: u32,
    ) -> Result<(Slot, Sampling)> {
        self.acquire_in(request, unwind, table_rows, 0, true)
    }

    /// What [`Self::acquire`] would load now for `request`, `unwind` and `table_rows` asked by
    /// `uid`: `None` when a program in use has a free slot, the spare serves, or the request
    /// would be refused (no place free, over the user's share). A caller that shares the pool
    /// loads it without the pool's lock ([`PoolLoad::load`]) and hands it over with
    /// [`Self::offer`] before acquiring, so that other runs keep ticking meanwhile.
    pub fn load_needed(
        &self,
        request: &SamplingRequest,
        unwind: UnwindMode,
        table_rows: u32,
        uid: u32,
    ) -> Option<PoolLoad> {
        let joins = self.programs.values().any(|p| {
            !p.system && p.request == *request && p.unwind == unwind && p.used != u64::MAX
        });
        let table_bytes = table_rows as usize * std::mem::size_of::<profiler_common::UnwindRow>();
        let spare_serves = self
            .spare
            .as_ref()
            .is_some_and(|(p, _)| p.unwind.capacity_bytes() >= table_bytes);
        let refused = self.programs.len() >= MAX_PROGRAMS
            || (uid != 0 && self.check_fair_share(request, unwind, uid).is_err());
        (!joins && !spare_serves && !refused).then_some(PoolLoad {
            table_rows,
            build_priority: self.build_priority,
            bpf_stats: self.bpf_stats,
            walker_load: WalkerLoad::WithSampling,
            table_cache: self.table_cache.clone(),
        })
    }

    /// Takes `program` (from [`PoolLoad::load`]) as the spare that the next acquisition uses,
    /// unless the spare already serves as large an unwind array.
    pub fn offer(&mut self, program: KernelProgram) {
        let better = self
            .spare
            .as_ref()
            .is_none_or(|(p, _)| p.unwind.capacity_bytes() < program.unwind.capacity_bytes());
        if better {
            self.spare = Some((program, Instant::now()));
        }
    }

    fn acquire_in(
        &mut self,
        request: &SamplingRequest,
        unwind: UnwindMode,
        table_rows: u32,
        uid: u32,
        system: bool,
    ) -> Result<(Slot, Sampling)> {
        for (id, p) in &mut self.programs {
            if !system
                && !p.system
                && p.request == *request
                && p.unwind == unwind
                && p.used != u64::MAX
            {
                let run = p.used.trailing_ones();
                p.used |= 1 << run;
                p.owners.insert(run, uid);
                p.program.reset_counters(run)?;
                let slot = Slot {
                    program_id: *id,
                    run,
                };
                return Ok((slot, p.sampling));
            }
        }
        if self.programs.len() >= MAX_PROGRAMS {
            return Err(Error::Busy(format!(
                "{MAX_PROGRAMS} distinct sampling settings are in use, the most at once; \
                 use the same event and rate as a running profile, or wait for one to end"
            )));
        }
        if uid != 0 {
            self.check_fair_share(request, unwind, uid)?;
        }
        let plan = request.plan(&KernelLimits::read())?;
        let table_bytes = table_rows as usize * std::mem::size_of::<profiler_common::UnwindRow>();
        let spare = self
            .spare
            .take()
            .filter(|(p, _)| p.unwind.capacity_bytes() >= table_bytes);
        let mut program = match spare {
            Some((program, _)) => program,
            None => PoolLoad {
                table_rows,
                build_priority: self.build_priority,
                bpf_stats: self.bpf_stats,
                walker_load: WalkerLoad::Background,
                table_cache: self.table_cache.clone(),
            }
            .load()?,
        };
        program.unwind.set_mode(unwind);
        let sampling = program.attach(&plan)?;
        program.reset_counters(0)?;
        let id = program.program_id();
        log::info!("attached program {id}: {}", sampling.describe());
        self.programs.insert(
            id,
            Pooled {
                request: *request,
                unwind,
                program,
                sampling,
                used: 1,
                owners: BTreeMap::from([(0, uid)]),
                system,
            },
        );
        Ok((
            Slot {
                program_id: id,
                run: 0,
            },
            sampling,
        ))
    }

    /// Refuses non-root user `uid` a new program for `request` where it would take more than
    /// the user's share of the settings ([`OWN_PROGRAMS_PER_USER`], [`PLACES_KEPT_FOR_DEFAULT`]).
    /// The default setting is shared by everyone and always allowed. The refusals name no other
    /// user's settings.
    fn check_fair_share(
        &self,
        request: &SamplingRequest,
        unwind: UnwindMode,
        uid: u32,
    ) -> Result<()> {
        let is_default = *request == SamplingRequest::default() && unwind == UnwindMode::Auto;
        if is_default {
            // Shared by everyone: the place kept for it is any user's.
            return Ok(());
        }
        let has_default = self
            .programs
            .values()
            .any(|p| p.request == SamplingRequest::default() && p.unwind == UnwindMode::Auto);
        // The default setting's program is everyone's place, whoever happens to use it.
        let own = self
            .programs
            .values()
            .filter(|p| !(p.request == SamplingRequest::default() && p.unwind == UnwindMode::Auto))
            .filter(|p| p.owners.values().all(|owner| *owner == uid))
            .count();
        if own >= OWN_PROGRAMS_PER_USER {
            return Err(Error::Busy(format!(
                "your runs already use {own} distinct sampling setting(s) of their own, the most \
                 one user may while others may need a place; use the same event and rate as \
                 your running profile (or the default ones), or wait for it to end"
            )));
        }
        let free = MAX_PROGRAMS - self.programs.len();
        if !has_default && free <= PLACES_KEPT_FOR_DEFAULT {
            return Err(Error::Busy(format!(
                "{} distinct sampling settings are in use and the last place is kept for the \
                 default event and rate; use those (no --event, -F or --sample-interval), or \
                 the same as a running profile, or wait for one to end",
                self.programs.len()
            )));
        }
        Ok(())
    }

    /// The program a slot belongs to.
    pub fn program(&mut self, slot: Slot) -> Result<&mut KernelProgram> {
        self.programs
            .get_mut(&slot.program_id)
            .map(|p| &mut p.program)
            .ok_or_else(|| Error::Other(anyhow::anyhow!("program {} is gone", slot.program_id)))
    }

    /// Frees a slot; the last slot of a program detaches and unloads it.
    pub fn release(&mut self, slot: Slot) {
        let Some(p) = self.programs.get_mut(&slot.program_id) else {
            return;
        };
        p.used &= !(1 << slot.run);
        p.owners.remove(&slot.run);
        // A spare program may serve a run of targets next.
        p.program.end_system(slot.run);
        // The next run in the slot may be root's, or the command line's: no stop at exec.
        if let Err(e) = p.program.stop_at_exec(slot.run, false) {
            log::warn!("clearing stop-at-exec of run slot {}: {e}", slot.run);
        }
        if p.used == 0 {
            if let Some(mut p) = self.programs.remove(&slot.program_id) {
                p.program.detach();
                log::info!("detached program {}: no run uses it", slot.program_id);
                if self.linger.is_some() {
                    p.program.clear_stacks();
                    self.spare = Some((p.program, Instant::now()));
                }
            }
        }
    }

    /// How many programs are attached.
    pub fn len(&self) -> usize {
        self.programs.len()
    }

    /// Whether no program is attached.
    pub fn is_empty(&self) -> bool {
        self.programs.is_empty()
    }
}

/// A program load the pool needs ([`ProgramPool::load_needed`]), to be done without its lock.
pub struct PoolLoad {
    table_rows: u32,
    build_priority: BuildPriority,
    bpf_stats: bool,
    walker_load: WalkerLoad,
    table_cache: Option<std::sync::Arc<crate::unwind::TableCache>>,
}

impl PoolLoad {
    /// Verifies the walker as `walker_load` says (with the sampling program by default: the
    /// caller waits for it).
    pub fn walker(mut self, walker_load: WalkerLoad) -> PoolLoad {
        self.walker_load = walker_load;
        self
    }

    /// Loads the program (the slow part of a first run's start: the kernel verifies it).
    pub fn load(self) -> Result<KernelProgram> {
        let mut program =
            KernelProgram::load(self.table_rows, self.build_priority, self.walker_load)?;
        program.unwind.set_cache(self.table_cache);
        if self.bpf_stats {
            program.enable_run_stats()?;
        }
        Ok(program)
    }
}

const _: () = assert!(MAX_RUNS == 64, "slots are the bits of a u64");
