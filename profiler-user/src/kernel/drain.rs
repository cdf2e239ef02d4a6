//! Map draining: reads the kernel program's sample counts and stack traces into [`Sample`]s.

use std::sync::Arc;

use profiler_common::{SampleKind, StackId, KERNEL_STACK_DEPTH, MAX_STACK_DEPTH};

use crate::{
    error::Result,
    kernel::KernelProgram,
    profile::sample::{take_shrinking, Sample},
};

/// Reads every sample of `run`, removing them from the kernel map so the slot can be reused;
/// a run that records a timeline ([`KernelProgram::record_timeline`]) gets each sample's times.
///
/// Call after the run's targets were removed for a complete count. A count that another CPU
/// increments between its read and its deletion loses that increment; the kernel's per-run
/// sample counter still has it, so the profile's `lost_in_transfer` shows it.
pub fn drain(program: &mut KernelProgram, run: u32) -> Result<Vec<Sample>> {
    let counts = program.take_samples(run);
    // Times whose key has no count (the sample map was full) go with the samples lost.
    let mut times = program.take_times(run);
    // Every stack moved out of the kernel first: each sample then shares its stack's one copy
    // (no stack is read twice, and no table of the stacks read is built beside the samples).
    program.offload_stacks();
    // One empty stack for all: most samples have no kernel or no runtime stack.
    let empty: Arc<[u64]> = Arc::from([]);
    let stack = |id: StackId| match id {
        0 => Ok(empty.clone()),
        id => program.stack(id),
    };
    let mut out = Vec::with_capacity(counts.len());
    // The counts' memory goes to the samples made of them.
    for (key, value) in take_shrinking(counts) {
        let user_frames = stack(key.user_stack)?;
        let kernel_frames = stack(key.kernel_stack)?;
        let runtime_frames = stack(key.runtime_stack)?;
        let mut times_ns = times.remove(&key).unwrap_or_default();
        times_ns.sort_unstable();
        out.push(Sample {
            run,
            pid: key.pid,
            tid: key.tid,
            truncated: user_truncated(user_frames.len())
                || kernel_frames.len() >= KERNEL_STACK_DEPTH,
            user_frames,
            kernel_frames,
            runtime_frames,
            count: value.count,
            kind: SampleKind::from_u32(key.kind).unwrap_or(SampleKind::Cpu),
            off_cpu_ns: value.off_cpu_ns,
            times_ns,
        });
    }
    Ok(out)
}

/// Whether a user stack of `len` frames was cut by the kernel: a CFI walk stops at
/// [`MAX_STACK_DEPTH`], a frame-pointer walk (`bpf_get_stack`) at [`KERNEL_STACK_DEPTH`]. The
/// key does not say which walk took it, so a CFI stack of exactly 127 frames counts as cut.
fn user_truncated(len: usize) -> bool {
    len == KERNEL_STACK_DEPTH || len >= MAX_STACK_DEPTH
}
