//! The timeline: each CPU sample of a run that asks for one ([`Config::TimelineRuns`]) is also
//! written, with its time, to a ring buffer that userspace reads at every tick. The sample map
//! still counts every sample, so the profile is the same with or without it; the ring adds
//! only when each sample happened.

use aya_ebpf::{bindings::BPF_RB_NO_WAKEUP, helpers::bpf_ktime_get_ns, macros::map, maps::RingBuf};
use profiler_common::{Config, SampleKey, TimelineRecord, TIMELINE_RING_BYTES};

/// Samples of runs that record a timeline, with their times (see [`TimelineRecord`]).
#[map]
static TIMELINE: RingBuf = RingBuf::with_byte_size(TIMELINE_RING_BYTES, 0);

/// Writes the sample counted under `key` to the timeline when one of its runs records one;
/// false when the ring was full (the caller counts it lost).
#[inline(always)]
pub(crate) fn record(key: &SampleKey) -> bool {
    let runs = key.runs & crate::config(Config::TimelineRuns);
    if runs == 0 {
        return true;
    }
    let Some(mut entry) = TIMELINE.reserve::<TimelineRecord>(0) else {
        return false;
    };
    // SAFETY: a helper without arguments.
    let time_ns = unsafe { bpf_ktime_get_ns() };
    entry.write(TimelineRecord {
        key: SampleKey { runs, ..*key },
        time_ns,
    });
    // Userspace polls the ring at every tick: no wakeup (an irq_work per sample) is needed.
    entry.submit(BPF_RB_NO_WAKEUP as u64);
    true
}
