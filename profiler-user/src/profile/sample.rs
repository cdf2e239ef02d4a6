//! The unit every later stage works on: a target, its thread, its frames, how often that
//! combination was seen and, for a run that records a timeline, when. Whatever walks stacks in the kernel (frame pointers, the CFI walker,
//! a runtime's frame walk) produces these through [`crate::kernel::drain`]; symbolization and
//! the writers never see how frames were found.

use std::sync::Arc;

/// One distinct stack of one thread, with its sample count. Its frames are shared with the
/// other samples of the same stack (other threads, other kinds), not copied for each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Run slot: which target (and its tags) the sample belongs to.
    pub run: u32,
    /// Process id as seen in the target's pid namespace.
    pub pid: u32,
    /// Thread id as seen in the target's pid namespace.
    pub tid: u32,
    /// User-space instruction pointers, leaf first; return addresses after the first.
    pub user_frames: Arc<[u64]>,
    /// Kernel instruction pointers, leaf first.
    pub kernel_frames: Arc<[u64]>,
    /// The frames the kernel read from the process's runtime (its interpreter), leaf first,
    /// packed as that runtime packs them (CPython: [`profiler_common::PythonFrame`]s); empty
    /// for processes without one.
    pub runtime_frames: Arc<[u64]>,
    /// Whether the unwinder stopped at its depth limit, so outer frames are missing.
    pub truncated: bool,
    /// How many samples had exactly this run, thread and stack (for off-CPU time: how many
    /// intervals off the CPU).
    pub count: u64,
    /// CPU samples, or time off the CPU in one thread state.
    pub kind: profiler_common::SampleKind,
    /// Nanoseconds off the CPU (0 for CPU samples, whose time is the sampling period's).
    pub off_cpu_ns: u64,
    /// When each of the samples was taken (`CLOCK_MONOTONIC` nanoseconds, ascending), for a
    /// run that records a timeline; empty otherwise. Fewer than `count` where the timeline
    /// ring had no room (counted as lost).
    pub times_ns: Vec<u64>,
}

/// How many items a [`take_shrinking`] list gives out between two shrinks: often enough that
/// a list of 27k samples gives back its memory as it goes, rarely enough to cost nothing.
const SHRINK_EVERY: usize = 4096;

/// The items of `items` from last to first, the list's memory given back as it empties, so
/// that a stage of the run's end builds its output in the memory of its input rather than
/// beside it (the drain's counts and the aggregation's samples: 2-3 MB each at 27k samples).
pub fn take_shrinking<T>(mut items: Vec<T>) -> impl Iterator<Item = T> {
    std::iter::from_fn(move || {
        let item = items.pop()?;
        if items.len().is_multiple_of(SHRINK_EVERY) {
            items.shrink_to_fit();
        }
        Some(item)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrinking_take_gives_every_item_last_first() {
        let items: Vec<u32> = (0..10_000).collect();
        let taken: Vec<u32> = take_shrinking(items).collect();
        assert_eq!(taken, (0..10_000).rev().collect::<Vec<_>>());
    }
}
