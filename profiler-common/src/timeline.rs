//! The timeline ring: each sample of a run that asks for a timeline, with its time.

use crate::SampleKey;

/// Name of the timeline ring map in the kernel object.
pub const TIMELINE_MAP: &str = "TIMELINE";
/// Bytes of the timeline ring: 72 bytes a sample (a [`TimelineRecord`] and the ring's 8-byte
/// header), so 14,563 samples between two of userspace's reads (every 100 ms): 145,000
/// samples a second over all CPUs, 36 CPUs at 4 kHz. Allocated when the program loads, used
/// only by runs that ask for a timeline; a sample that finds it full is counted
/// ([`Counter::TimelineLost`](crate::Counter::TimelineLost)).
pub const TIMELINE_RING_BYTES: u32 = 1 << 20;

/// One sample of a run that records a timeline: what it was counted under and when.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TimelineRecord {
    /// The sample map key the sample was counted under, with `runs` narrowed to the runs that
    /// record a timeline.
    pub key: SampleKey,
    /// `bpf_ktime_get_ns` (`CLOCK_MONOTONIC`) when the sample was taken.
    pub time_ns: u64,
}
