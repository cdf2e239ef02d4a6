//! Taking what the kernel recorded out of it: at a recording's end ([`Recording::collect`],
//! into [`Collected`]) or as a window of a recording that goes on ([`Recording::take_window`]).

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
    time::Instant,
};

use profiler_common::Counter;

use super::{
    assemble::{assemble_samples, Head, TableCost, TimelineClock},
    naming::RuntimeStackIds,
};
use crate::{
    error::{Error, Result},
    kernel::drain::drain,
    kernel::pool::{ProgramPool, Slot},
    kernel::{Counters, KernelProgram},
    profile::sample::Sample,
    profile::{Profile, RunEnd, ShortfallCause, Throttled},
    recording::aggregate::AggregateOptions,
    recording::process::ProcessRecording,
    recording::Recording,
    sampling::KernelLimits,
    symbolize::Symbolizer,
};

impl Recording {
    /// Stops keeping samples, takes everything recorded out of the kernel and frees the run
    /// slots (unloading programs no run needs any more).
    pub fn collect(mut self, pool: &mut ProgramPool) -> Result<Collected> {
        if let Some(owner) = self.owner {
            for (slot, _) in self.slots.clone() {
                if let Ok(program) = pool.program(slot) {
                    for pid in program.take_execed(slot.run) {
                        self.after_exec(program, slot, pid, owner);
                    }
                }
            }
        }
        let mut runtime_ids = RuntimeStackIds::default();
        for p in self.processes.values_mut() {
            if p.exited || !p.target.is_alive() {
                continue;
            }
            // The last runtime stacks are named while the process may still live.
            runtime_ids.queue(p, pool);
            let _ = p.maps.refresh();
        }
        // Within what is left of the owner's share: a daemon names a run's queue before it
        // collects, off the programs' lock (see `name_runtime_frames`).
        self.name_runtime_frames(false);
        for runtime in self
            .processes
            .values_mut()
            .filter_map(|p| p.runtime.as_mut())
        {
            runtime.abandon_queued();
        }
        if self.owner.is_some() {
            // A process that exec'd while it was read last may have been read as the new
            // program: it is revoked rather than read again.
            for (slot, _) in self.slots.clone() {
                let Ok(program) = pool.program(slot) else {
                    continue;
                };
                for pid in program.take_execed(slot.run) {
                    match self
                        .processes
                        .values_mut()
                        .find(|p| p.slot == slot && p.target.pid == pid && !p.revoked)
                    {
                        Some(p) => p.revoke(program),
                        None => program.drop_followed(slot.run, pid),
                    }
                }
            }
        }
        let started = self.started;
        for p in self.processes.values_mut() {
            if let (Some(runtime), Ok(program)) = (&mut p.runtime, pool.program(p.slot)) {
                runtime.stop(program);
            }
            if p.direct {
                if let Ok(program) = pool.program(p.slot) {
                    let _ = program.remove_target(p.slot.run, &p.target);
                }
            }
            if p.revoked {
                continue;
            }
            if let Ok(program) = pool.program(p.slot) {
                if program.unwind.is_tracked(p.target.pid) {
                    p.note_tables(&program.unwind, started);
                    p.cfi_walked = true;
                }
            }
        }
        if self.is_system() {
            // Sampling stops before the counts are taken, as removing targets does.
            for (slot, _) in &self.slots {
                if let Ok(program) = pool.program(*slot) {
                    program.end_system(slot.run);
                }
            }
        }
        // The run's span ends as sampling stops, before the samples are drained (a
        // system-wide run's drain takes a good part of a second): the waits still going are
        // counted up to this moment too (`end_off_cpu`, just below).
        let timeline_clock = self.timeline.then(|| TimelineClock::ending(self.started));
        let multi_process = self.is_multi_process();
        let mut drained = Drained::default();
        let mut bpf_run = None;
        let mut off_cpu_bpf_run = None;
        let throttled = self.throttled(pool);
        for (slot, _) in &self.slots {
            let Ok(program) = pool.program(*slot) else {
                continue;
            };
            program.end_following(slot.run);
            program.end_off_cpu(slot.run);
            program.end_timeline(slot.run);
            drained.take(program, *slot);
            bpf_run = bpf_run.or_else(|| program.run_stats());
            off_cpu_bpf_run = off_cpu_bpf_run.or_else(|| program.off_cpu_run_stats());
        }
        for (slot, _) in &self.slots {
            pool.release(*slot);
        }
        let Drained {
            counters,
            samples,
            tables,
            error,
        } = drained;
        if let Some(e) = error {
            return Err(e);
        }
        Ok(Collected {
            head: Head {
                sampling: self.sampling,
                program_id: self.program_id().unwrap_or(0),
                duration: self.started.elapsed(),
                counters,
                bpf_run,
                off_cpu_bpf_run,
                throttled,
                tables,
                multi_process,
                system: self.is_system(),
                over_cap: self.over_cap.len(),
                off_cpu: self.request.off_cpu,
                timeline_clock,
            },
            processes: std::mem::take(&mut self.processes),
            samples,
        })
    }

    /// How far the kernel throttled the program since this recording attached, when it cut
    /// more than a tenth of the samples.
    fn throttled(&self, pool: &mut ProgramPool) -> Option<Throttled> {
        let (slot, _) = self.slots.first()?;
        let (expected0, taken0) = self.delivery_at_start?;
        let (expected1, taken1) = pool.program(*slot).ok()?.delivery()?;
        // The kernel throttles an event per tick beyond its share of the limit, and the
        // randomized periods reach 1.5 times the mean rate.
        let limit = KernelLimits::read().max_sample_rate;
        let hz = self.sampling.map_or(0.0, |s| s.nominal_hz);
        let cause = if limit < self.max_sample_rate_at_start || 1.5 * hz >= limit as f64 {
            ShortfallCause::KernelThrottling
        } else {
            ShortfallCause::LateTimerInterrupts
        };
        let throttled = Throttled {
            expected_samples: (expected1 - expected0).max(0.0).round() as u64,
            taken_samples: taken1.saturating_sub(taken0),
            cause,
        };
        // Too few samples to tell a shortfall from the randomized periods' spread.
        (throttled.expected_samples >= 200 && throttled.taken_share() < Throttled::THRESHOLD)
            .then_some(throttled)
    }

    /// Cuts a window from the running recording, without stopping it: takes the samples
    /// recorded since the last window (or the start) out of the kernel, and symbolizes and
    /// aggregates them with the processes as they are now into a profile of that window
    /// (the same [`aggregate`](super::aggregate::aggregate) as a whole recording's, so
    /// writers see the same model).
    /// Processes seen to exit are dropped after it (their last samples are in it), with what
    /// the kernel program and the unwinder kept of them, and so are the stacks the window
    /// took: a recording that runs for days keeps only what its living processes need.
    pub fn take_window(
        &mut self,
        pool: &mut ProgramPool,
        symbolizer: &mut Symbolizer,
        options: &AggregateOptions,
    ) -> Result<Profile> {
        let mut runtime_ids = RuntimeStackIds::default();
        let system = self.is_system();
        let exited = self.kernel_exits();
        for (key, p) in self.processes.iter_mut() {
            if p.exited {
                continue;
            }
            // Exits are noted now; a system-wide run's maps are re-read below, for the
            // processes whose samples ran outside them.
            if system && p.poll(exited.contains(key), false, false) {
                // It exited: a new process may get its pid (the next tick unloads the rest).
                if let Ok(program) = pool.program(p.slot) {
                    program.forget_system_process(p.target.pid);
                }
                continue;
            }
            // Runtime stacks are named while their process may still live.
            runtime_ids.queue(p, pool);
        }
        self.name_runtime_frames(true);
        let mut drained = Drained::default();
        for (slot, _) in &self.slots {
            let Ok(program) = pool.program(*slot) else {
                continue;
            };
            drained.take(program, *slot);
        }
        for (slot, _) in &self.slots {
            if let Ok(program) = pool.program(*slot) {
                program.forget_taken_stacks();
            }
        }
        let Drained {
            counters: total,
            samples,
            tables,
            error,
        } = drained;
        if let Some(e) = error {
            return Err(e);
        }
        if system {
            self.reread_uncovered(pool, &samples);
        }
        // The kernel's counters run on from the recording's start: a window's are the
        // difference.
        let counters = counters_since(&total, &self.counters_at_window);
        self.counters_at_window = total;
        let head = Head {
            sampling: self.sampling,
            program_id: self.program_id().unwrap_or(0),
            duration: self.window_started.elapsed(),
            counters,
            bpf_run: None,
            off_cpu_bpf_run: None,
            throttled: None,
            tables,
            multi_process: self.is_multi_process(),
            system: self.is_system(),
            over_cap: self.over_cap.len(),
            off_cpu: self.request.off_cpu,
            // Windows record no timeline.
            timeline_clock: None,
        };
        self.window_started = Instant::now();
        let profile = assemble_samples(
            &mut self.processes,
            samples,
            head,
            RunEnd::Completed,
            symbolizer,
            options,
            // The next window names the same code: the symbolizer keeps its files.
            |_| {},
        );
        self.drop_exited(pool);
        // The stacks the window took are checked again if they recur (the set stays small).
        for p in self.processes.values_mut() {
            p.checked_stacks = Default::default();
        }
        // The files of the processes dropped (their sealed copies above all) go with them.
        symbolizer.release_unmapped();
        Ok(profile)
    }

    /// Re-reads the maps (and unwind tables) of the living processes of which a sample of
    /// `samples` ran at an address outside them: a system-wide run does not re-read them on
    /// a timer, and a library loaded since the last read is named right all the same.
    fn reread_uncovered(&mut self, pool: &mut ProgramPool, samples: &[(u32, Vec<Sample>)]) {
        let mut stale = std::collections::HashSet::new();
        for (program_id, samples) in samples {
            for sample in samples {
                let key = (*program_id, sample.run, sample.pid);
                if stale.contains(&key) {
                    continue;
                }
                let Some(p) = self.processes.get(&key) else {
                    continue;
                };
                let outside = sample
                    .user_frames
                    .first()
                    .is_some_and(|leaf| !p.maps.covers_now(*leaf));
                if outside && !p.exited && p.maps.is_known() {
                    stale.insert(key);
                }
            }
        }
        let (owner_uid, started) = (self.owner_uid(), self.started);
        for key in stale {
            let Some(p) = self.processes.get_mut(&key) else {
                continue;
            };
            log::debug!(
                "pid {}: a sample ran outside its maps: read again",
                p.target.pid
            );
            if p.maps.refresh().is_err() {
                continue;
            }
            p.refreshed_at = Instant::now();
            if let Ok(program) = pool.program(p.slot) {
                let _ =
                    program
                        .unwind
                        .track_maps(p.target.pid, owner_uid, Some(p.maps.last_read()));
                p.note_tables(&program.unwind, started);
            }
        }
    }

    /// Forgets every process seen to exit (or known only by its samples), and what the kernel
    /// program, the unwinder and the runtime walk kept of it.
    fn drop_exited(&mut self, pool: &mut ProgramPool) {
        let gone: Vec<(u32, u32, u32)> = self
            .processes
            .iter()
            .filter(|(_, p)| p.exited)
            .map(|(k, _)| *k)
            .collect();
        for key in gone {
            let Some(mut p) = self.processes.remove(&key) else {
                continue;
            };
            let Ok(program) = pool.program(p.slot) else {
                continue;
            };
            if let Some(mut runtime) = p.runtime.take() {
                runtime.stop(program);
            }
            if p.target.pid != 0 {
                if p.direct {
                    let _ = program.remove_target(p.slot.run, &p.target);
                } else {
                    program.forget_followed(p.target.pid);
                }
                program.unwind.unload_process(p.target.pid);
            }
        }
        // Pids seen as threads, or past the system-wide cap, are looked at again once a
        // window: pids are reused, and the cap counts living processes.
        self.ignored = HashSet::new();
        self.over_cap = HashSet::new();
    }
}

/// What the kernel recorded for a recording, out of the kernel.
pub struct Collected {
    /// What the profile says besides its processes' samples.
    head: Head,
    processes: BTreeMap<(u32, u32, u32), ProcessRecording>,
    /// Samples by the id of the program that recorded them (as drained: copied into one list,
    /// two lists of 25k samples were held at once, the peak of a run's end).
    samples: Vec<(u32, Vec<Sample>)>,
}

impl Collected {
    /// Forgets every kernel frame: for a client the kernel would not show them to.
    pub fn drop_kernel_frames(&mut self) {
        for sample in self.samples.iter_mut().flat_map(|(_, s)| s) {
            sample.kernel_frames = Arc::from([]);
        }
    }

    /// Samples seen by the kernel so far (recorded or lost).
    pub fn samples_seen(&self) -> u64 {
        self.head.counters.get(Counter::Samples)
    }

    /// Symbolizes and aggregates the samples into a profile that ended as `end`; `after_naming`
    /// gets the symbolizer once every address is named, before the stacks are built (see
    /// [`aggregate`](super::aggregate::aggregate)): [`Symbolizer::release`] where it serves
    /// later runs, [`Symbolizer::unload`] where it serves nothing more.
    pub fn assemble(
        self,
        end: RunEnd,
        symbolizer: &mut Symbolizer,
        options: &AggregateOptions,
        after_naming: impl FnOnce(&mut Symbolizer),
    ) -> Profile {
        let Collected {
            head,
            mut processes,
            samples,
        } = self;
        assemble_samples(
            &mut processes,
            samples,
            head,
            end,
            symbolizer,
            options,
            after_naming,
        )
    }
}

/// What the kernel recorded for a recording's run slots, taken out of it slot by slot: the
/// counters summed, the samples by the id of the program that recorded them, and the unwind
/// tables' cost (of the last program).
#[derive(Default)]
struct Drained {
    counters: Counters,
    samples: Vec<(u32, Vec<Sample>)>,
    tables: TableCost,
    /// Why a slot's samples could not be taken, where one failed (the last such).
    error: Option<Error>,
}

impl Drained {
    /// Adds the counters of `slot`'s run to the sums and takes its samples out of `program`.
    fn take(&mut self, program: &mut KernelProgram, slot: Slot) {
        let counters = &mut self.counters;
        let drained = program.counters(slot.run).and_then(|c| {
            add_counters(counters, &c);
            drain(program, slot.run)
        });
        match drained {
            Ok(s) => self.samples.push((slot.program_id, s)),
            Err(e) => self.error = Some(e),
        }
        self.tables = TableCost::of(&program.unwind);
    }
}

/// Adds `counts` to `total`, counter by counter.
fn add_counters(total: &mut Counters, counts: &Counters) {
    for (total, value) in total.0.iter_mut().zip(counts.0) {
        *total += value;
    }
}

/// What the counters `now` counted since they read `before` (none below zero).
fn counters_since(now: &Counters, before: &Counters) -> Counters {
    let mut since = *now;
    for (now, before) in since.0.iter_mut().zip(before.0) {
        *now = now.saturating_sub(before);
    }
    since
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(values: &[(Counter, u64)]) -> Counters {
        let mut c = Counters::default();
        for (counter, value) in values {
            c.0[*counter as usize] = *value;
        }
        c
    }

    /// Slots' counters add up counter by counter.
    #[test]
    fn counters_of_slots_add_up() {
        let mut total = counters(&[(Counter::Samples, 5), (Counter::CfiStacks, 1)]);
        add_counters(
            &mut total,
            &counters(&[(Counter::Samples, 7), (Counter::SampleMapFull, 2)]),
        );
        assert_eq!(
            total,
            counters(&[
                (Counter::Samples, 12),
                (Counter::CfiStacks, 1),
                (Counter::SampleMapFull, 2)
            ])
        );
    }

    /// A window's counters are what the kernel counted since the last window; a counter
    /// found lower than before counts none, never a wrapped-around number.
    #[test]
    fn a_windows_counters_are_the_difference() {
        let before = counters(&[(Counter::Samples, 100), (Counter::CfiStacks, 40)]);
        let now = counters(&[(Counter::Samples, 130), (Counter::CfiStacks, 30)]);
        assert_eq!(
            counters_since(&now, &before),
            counters(&[(Counter::Samples, 30)])
        );
        assert_eq!(counters_since(&now, &Counters::default()), now);
    }
}
