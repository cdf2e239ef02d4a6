//! Stacks and sample counts: moved from the kernel maps to userspace while a run goes on (so
//! that neither map fills up), taken per run, and read by id.

use std::collections::HashMap as StdHashMap;

use anyhow::anyhow;
use profiler_common::{
    SampleKey, SampleValue, StackFrames, StackId, ALL_RUNS_SAMPLES_INDEX, MAX_RUNS,
    MAX_STACK_DEPTH, SAMPLE_MAP_ENTRIES, STACK_MAP_ENTRIES,
};

use super::program::{kernel_err, KernelProgram};
use crate::error::Result;

/// The most addresses kept for [`KernelProgram::take_fresh_frames`] between two takes: a
/// bound on memory where no run takes them.
const FRESH_FRAMES_MAX: usize = 1 << 18;

/// How often stacks move from the kernel map to userspace when few new ones arrive.
const OFFLOAD_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// How often they move while tables are still to be built: a moved stack is how the loader
/// learns which objects run (built first, boosted in a daemon), and on a daemon's first call
/// of a PyTorch step every stack in libtorch_cpu.so ended early until its table was in.
const OFFLOAD_INTERVAL_WHILE_BUILDING: std::time::Duration = std::time::Duration::from_millis(100);

impl KernelProgram {
    /// Deletes every stack, in the kernel and offloaded; call when no run is recording, so
    /// that a long-lived daemon does not keep the stacks of finished runs.
    pub fn clear_stacks(&mut self) {
        let ids: Vec<StackId> = self.stacks.keys().filter_map(|id| id.ok()).collect();
        for id in ids {
            let _ = self.stacks.remove(&id);
        }
        self.offloaded_stacks = StdHashMap::new();
        self.fresh_frames = std::collections::HashSet::new();
    }

    /// Forgets the stacks moved to userspace that no sample count still refers to (in the
    /// kernel map or moved out): for a recording that takes its samples out in windows while
    /// it runs, so that the stacks of windows already taken do not pile up. A stack that
    /// recurs is stored again by the kernel (its map no longer has it since the move).
    pub fn forget_taken_stacks(&mut self) -> usize {
        let mut wanted: std::collections::HashSet<StackId> = self
            .samples
            .keys()
            .filter_map(|k| k.ok())
            .chain(self.offloaded_samples.iter().map(|(k, _)| *k))
            // Waits still going: their switch-in (or the run's end) counts them under these.
            .chain(
                self.off_cpu_pending
                    .iter()
                    .filter_map(|e| e.ok())
                    .map(|(_, p)| p.key),
            )
            .flat_map(|k| [k.user_stack, k.kernel_stack, k.runtime_stack])
            .collect();
        wanted.remove(&0);
        let before = self.offloaded_stacks.len();
        self.offloaded_stacks.retain(|id, _| wanted.contains(id));
        self.offloaded_stacks.shrink_to_fit();
        before - self.offloaded_stacks.len()
    }

    /// Stacks moved to userspace and kept there.
    pub fn offloaded_stack_count(&self) -> usize {
        self.offloaded_stacks.len()
    }

    /// Takes the addresses of the stacks moved to userspace since the last call (symbolizing
    /// them while the run goes on leaves less to do when it ends).
    pub fn take_fresh_frames(&mut self) -> Vec<u64> {
        self.fresh_frames.drain().collect()
    }

    /// Moves stacks and sample counts from the kernel maps to userspace when due, so that
    /// neither map fills up however many distinct stacks a long run sees; call it often
    /// (every 100-200 ms). Samples keep referring to the same stack ids.
    ///
    /// Stacks move every half second, and at every call while new ones keep arriving (more
    /// than 1/64 of the map since the last move): the map holds 4096 deep stacks, so a burst
    /// of new stacks is moved every 100-200 ms instead of waiting for the half second. Sample
    /// counts move once a quarter of the sample map's size in samples has been recorded since
    /// the last move (so at most that many new keys can have appeared): a count incremented
    /// between its read and its deletion loses that increment, which [`Self::take_samples`]'s
    /// callers see as `samples_seen` above the samples drained, so moves are kept rare.
    pub fn offload_when_due(&mut self) {
        self.walker_ready();
        if self.timeline_runs != 0 {
            self.read_timeline();
        }
        let recorded: Option<u64> = self
            .counters
            .get(&ALL_RUNS_SAMPLES_INDEX, 0)
            .ok()
            .map(|r| r.iter().sum());
        let (at, moved) = self.last_offload;
        // Each sample adds at most one stack: once a quarter of the map's size in samples
        // came since the last move, the map may be filling, whatever the last move found (a
        // run sampling at once fills it within the half second at 4999 Hz on a program of
        // many distinct stacks: section 4 lost 660 of 27.8k samples).
        let busy = moved >= STACK_MAP_ENTRIES as usize / 64
            || recorded.is_some_and(|r| {
                r.saturating_sub(self.samples_at_last_offload) >= STACK_MAP_ENTRIES as u64 / 4
            });
        let interval = if self.unwind.awaits_samples() {
            OFFLOAD_INTERVAL_WHILE_BUILDING
        } else {
            OFFLOAD_INTERVAL
        };
        if busy || at.elapsed() >= interval {
            let moved = self.offload_stacks();
            self.last_offload = (std::time::Instant::now(), moved);
            self.samples_at_last_offload = recorded.unwrap_or(self.samples_at_last_offload);
        }
        let Some(recorded) = recorded else {
            return;
        };
        if recorded.saturating_sub(self.samples_at_last_move) >= SAMPLE_MAP_ENTRIES as u64 / 4 {
            self.samples_at_last_move = recorded;
            let moved = self.move_sample_counts(|_| true);
            log::debug!("moved {moved} sample counts to userspace");
        }
    }

    /// Moves the kernel's sample counts whose key `select` picks into `offloaded_samples`,
    /// one count per run the key serves; returns how many keys moved.
    fn move_sample_counts(&mut self, select: impl Fn(&SampleKey) -> bool) -> usize {
        let keys: Vec<SampleKey> = self
            .samples
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| select(k))
            .collect();
        let mut moved = 0;
        for key in keys {
            if let Ok(value) = self.samples.get(&key, 0) {
                let _ = self.samples.remove(&key);
                for run in 0..MAX_RUNS {
                    if key.runs & (1 << run) != 0 {
                        let per_run = SampleKey {
                            runs: 1 << run,
                            ..key
                        };
                        self.offloaded_samples.push((per_run, value));
                    }
                }
                moved += 1;
            }
        }
        if moved > 0 {
            merge_counts(&mut self.offloaded_samples);
        }
        moved
    }

    /// Takes every sample count of `run`, from the kernel map and from userspace, so that the
    /// run's slot can be reused. Call after [`Self::detach`] or [`Self::remove_target`] for a
    /// complete count.
    pub(crate) fn take_samples(&mut self, run: u32) -> Vec<(SampleKey, SampleValue)> {
        let bit = 1u64 << run;
        self.move_sample_counts(|key| key.runs & bit != 0);
        if self
            .offloaded_samples
            .iter()
            .all(|(key, _)| key.runs == bit)
        {
            // The one run (a command line's): its list is taken, not copied.
            return std::mem::take(&mut self.offloaded_samples);
        }
        let mut counts = Vec::new();
        self.offloaded_samples.retain(|(key, count)| {
            if key.runs == bit {
                counts.push((*key, *count));
                false
            } else {
                true
            }
        });
        counts
    }

    /// Moves every stack from the kernel map to userspace; returns how many moved.
    pub(super) fn offload_stacks(&mut self) -> usize {
        let ids: Vec<StackId> = self.stacks.keys().filter_map(|id| id.ok()).collect();
        let mut moved = 0;
        for id in ids {
            if let Ok(frames) = self.stacks.get(&id, 0) {
                let frames = frames_of(&frames);
                // A stack is the kernel's report of where targets run: objects without a
                // table yet get theirs first.
                self.unwind.note_sampled(frames.iter().copied());
                // Best effort: past the cap, the rest is symbolized when the run ends.
                if self.fresh_frames.len() < FRESH_FRAMES_MAX {
                    self.fresh_frames
                        .extend(crate::symbolize::lookup_addresses(&frames));
                }
                self.offloaded_stacks.insert(id, frames.into());
                moved += 1;
            }
            let _ = self.stacks.remove(&id);
        }
        if moved > 0 {
            log::debug!("moved {moved} stacks to userspace");
        }
        moved
    }

    /// The keys of every sample recorded since the last take (in the kernel map or moved
    /// out): which threads ran which stacks. A system-wide run reads them every half second
    /// to find the processes whose maps or Python thread lists their samples show stale, so
    /// that only those are read again (see `Recording::tick`).
    pub fn sample_keys(&self) -> Vec<SampleKey> {
        self.samples
            .keys()
            .filter_map(|k| k.ok())
            .chain(self.offloaded_samples.iter().map(|(k, _)| *k))
            .collect()
    }

    /// The runtime stacks (see `crate::runtime`) recorded so far, with the runs (bit mask) and the pid (in its
    /// namespace) of the process they belong to: what userspace must name while the process
    /// still lives. A pid alone could be another namespace's process in another run.
    pub fn runtime_stack_ids(&self) -> Vec<(u64, u32, StackId)> {
        let kernel = self.samples.keys().filter_map(|k| k.ok());
        let moved = self.offloaded_samples.iter().map(|(k, _)| *k);
        // Waits still going, which a run's end counts: named while their process lives.
        let pending = self
            .off_cpu_pending
            .iter()
            .filter_map(|e| e.ok())
            .map(|(_, p)| p.key);
        let mut ids: Vec<(u64, u32, StackId)> = kernel
            .chain(moved)
            .chain(pending)
            .filter(|k| k.runtime_stack != 0)
            .map(|k| (k.runs, k.pid, k.runtime_stack))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The frames of stack `id` (innermost first), wherever it is; empty for id 0 or a stack
    /// that was never stored. A stack moved to userspace is shared, not copied.
    pub(crate) fn stack(&self, id: StackId) -> Result<std::sync::Arc<[u64]>> {
        if id == 0 {
            return Ok(std::sync::Arc::from([]));
        }
        if let Some(frames) = self.offloaded_stacks.get(&id) {
            return Ok(frames.clone());
        }
        match self.stacks.get(&id, 0) {
            Ok(frames) => Ok(frames_of(&frames).into()),
            Err(aya::maps::MapError::KeyNotFound) => Ok(std::sync::Arc::from([])),
            Err(e) => Err(kernel_err(
                anyhow!(e).context(format!("reading stack {id:#x}")),
            )),
        }
    }
}

/// Sorts moved sample counts by key and adds up the counts of each key into one entry, in
/// place: a key the kernel made again after its count moved comes back at the next move.
pub(super) fn merge_counts(counts: &mut Vec<(SampleKey, SampleValue)>) {
    let order = |k: &SampleKey| {
        (
            k.runs,
            k.pid,
            k.tid,
            k.user_stack,
            k.kernel_stack,
            k.runtime_stack,
            k.kind,
            k.reserved,
        )
    };
    counts.sort_unstable_by_key(|(k, _)| order(k));
    counts.dedup_by(|(key, value), (kept_key, kept)| {
        let same = key == kept_key;
        if same {
            kept.count += value.count;
            kept.off_cpu_ns += value.off_cpu_ns;
        }
        same
    });
}

fn frames_of(stack: &StackFrames) -> Vec<u64> {
    let len = (stack.len as usize).min(MAX_STACK_DEPTH);
    stack.ips[..len].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moved counts of one key, moved twice, become one entry with their sums; other keys stay.
    #[test]
    fn moved_counts_of_one_key_are_added_up() {
        let key = |tid, user_stack| SampleKey {
            runs: 1,
            pid: 7,
            tid,
            user_stack,
            ..Default::default()
        };
        let value = |count, off_cpu_ns| SampleValue { count, off_cpu_ns };
        let mut counts = vec![
            (key(2, 10), value(3, 0)),
            (key(1, 10), value(1, 5)),
            (key(2, 10), value(4, 1)),
            (key(2, 11), value(1, 0)),
            (key(1, 10), value(2, 0)),
        ];
        merge_counts(&mut counts);
        assert_eq!(
            counts,
            vec![
                (key(1, 10), value(3, 5)),
                (key(2, 10), value(7, 1)),
                (key(2, 11), value(1, 0)),
            ]
        );
    }
}
