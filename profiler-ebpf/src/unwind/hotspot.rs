//! HotSpot's part of the CFI walk: the JVMs whose code cache frames are recorded, the
//! interpreter frame (walked by its frame pointer, its `Method*` recorded), and the stack of
//! JVM frames a sample keeps.

use super::*;

/// The JVMs whose code cache frames the walk records ([`HotspotProcess`]), by host tgid.
#[map]
pub(super) static HOTSPOT_PROCESSES: HashMap<u32, HotspotProcess> =
    HashMap::with_max_entries(MAX_HOTSPOT_PROCESSES, 0);

/// Stores the walk's JVM frames as a stack (through the scratch slot, whose user frames are
/// stored already) and returns its id, 0 when the map was full.
#[inline(always)]
pub(super) fn store_hotspot_frames(
    walk: &Walk,
    frames: &mut profiler_common::StackFrames,
    run: u32,
) -> u64 {
    let len = (walk.java_len as usize).min(MAX_STACK_DEPTH);
    // One helper call copies the whole array: a loop over `len` costs the verifier a path
    // per length.
    // SAFETY: both are this CPU's map values, of the same size.
    let copied = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            frames.ips.as_mut_ptr().cast(),
            (MAX_STACK_DEPTH * 8) as u32,
            walk.java.as_ptr().cast(),
        )
    };
    if copied != 0 {
        return 0;
    }
    frames.len = len as u64;
    match crate::store_frames(len, Counter::UserStackMapFull) {
        Ok(id) => id,
        Err(counter) => {
            crate::count(run, counter);
            0
        }
    }
}

/// The stack id of the JVM frames of the last CFI walk on this CPU (0 when it had none),
/// cleared: the sample's runtime stack for a JVM.
#[inline(always)]
pub fn take_hotspot_stack() -> u64 {
    let Some(walk) = WALKS.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot; perf_event programs do not nest on a CPU.
    let walk = unsafe { &mut *walk };
    let id = walk.java_id;
    walk.java_id = 0;
    id
}

/// How far above an interpreter frame's rbp its sender sp may lie: the caller's outgoing
/// arguments, never more than a Java method's 255 argument slots and some alignment.
pub(super) const SENDER_SP_REACH: u64 = 4096;

/// Unwinds a HotSpot interpreter frame by its frame pointer: rbp holds the caller's rbp, the
/// return address above it; the caller's stack pointer is the sender sp the frame saved (a
/// compiled caller's frame starts there, above the arguments an adapter may have pushed), and
/// the frame's `Method*` replaces its pc among the recorded JVM frames.
#[inline(always)]
pub(super) fn hotspot_interpreter_frame(walk: &mut Walk) -> WalkEnd {
    let bp = walk.bp;
    if bp < walk.sp {
        return WalkEnd::Early;
    }
    // The lowest slot first, so that one window holds the rest.
    let method = read_stack(walk, bp.wrapping_add(walk.hotspot.method_at as u64));
    let sender_sp = read_stack(walk, bp.wrapping_add(walk.hotspot.sender_sp_at as u64));
    let next_bp = read_stack(walk, bp);
    let ra = read_stack(walk, bp.wrapping_add(8));
    let (Some(next_bp), Some(ra)) = (next_bp, ra) else {
        return WalkEnd::Early;
    };
    let j = walk.java_len as usize;
    if j > 0 {
        if let Some(method) = method {
            // Masked: the verifier does not carry the length's bound through `j - 1`.
            walk.java[(j - 1) & (MAX_STACK_DEPTH - 1)] = method | HOTSPOT_INTERPRETED;
        }
    }
    if ra == 0 {
        return WalkEnd::Complete;
    }
    let cfa = bp.wrapping_add(16);
    let sp = match sender_sp {
        Some(s) if s >= cfa && s - cfa <= SENDER_SP_REACH => s,
        _ => cfa,
    };
    walk.ip = ra;
    walk.sp = sp;
    walk.bp = next_bp;
    WalkEnd::Running
}
