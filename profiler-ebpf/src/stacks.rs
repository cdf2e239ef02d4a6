//! Stacks stored once under a hash of their frames.

use crate::{increment, EEXIST};
use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{bpf_get_stack, generated::bpf_loop},
    macros::map,
    maps::{HashMap, PerCpuArray},
    EbpfContext,
};
use profiler_common::{
    Counter, StackFrames, StackId, KERNEL_STACK_DEPTH, MAX_STACK_DEPTH, STACKS_STORED_INDEX,
    STACK_MAP_ENTRIES,
};

/// User and kernel stacks by a hash of their frames. A hash map rather than the kernel's stack
/// trace map: the latter keeps one stack per bucket and refuses a colliding stack, which loses
/// samples long before it is full on a program with many distinct stacks. Preallocated:
/// allocating 1 KiB entries in interrupt context fails (ENOMEM) in bursts of new stacks.
#[map]
pub(crate) static STACKS: HashMap<StackId, StackFrames> =
    HashMap::with_max_entries(STACK_MAP_ENTRIES, 0);

/// Per-CPU room to read a stack into: 1 KiB does not fit on the 512-byte BPF stack.
#[map]
pub(crate) static SCRATCH: PerCpuArray<StackFrames> = PerCpuArray::with_max_entries(1, 0);

/// Reads the current user or kernel stack (`flags`), stores it under its hash unless already
/// there, and returns the hash; 0 for an empty stack (a kernel stack of a sample taken in user
/// mode). A stack that could not be read or stored gives the counter that says why.
#[inline(always)]
pub(crate) fn store_stack(ctx: &impl EbpfContext, flags: u64) -> Result<StackId, Counter> {
    let user = flags & BPF_F_USER_STACK as u64 != 0;
    let (full, error) = if user {
        (Counter::UserStackMapFull, Counter::UserStackError)
    } else {
        (Counter::KernelStackMapFull, Counter::KernelStackError)
    };
    let Some(frames) = SCRATCH.get_ptr_mut(0) else {
        return Err(error);
    };
    // SAFETY: `frames` is this CPU's scratch slot; perf_event programs do not nest on a CPU,
    // and the off-CPU program runs with interrupts off (in the scheduler), so no cpu-clock
    // sample interrupts it. (A hardware PMU's NMI could: see `off_cpu`.)
    let frames = unsafe { &mut *frames };
    // The kernel's `perf_event_max_stack` bounds this helper anyway; asking for more than its
    // default would only cost time (and old kernels mishandle a buffer above the sysctl).
    let size = core::mem::size_of::<[u64; KERNEL_STACK_DEPTH]>() as u32;
    // SAFETY: `ips` is writable for `size` bytes; the kernel zero-fills what it does not use.
    let bytes = unsafe { bpf_get_stack(ctx.as_ptr(), frames.ips.as_mut_ptr().cast(), size, flags) };
    if bytes < 0 {
        return Err(error);
    }
    if bytes == 0 {
        return Ok(0);
    }
    let len = (bytes as usize / 8).min(KERNEL_STACK_DEPTH);
    frames.len = len as u64;
    store_frames(len, full)
}

/// Stores the `len` frames in this CPU's scratch slot under their hash unless already there,
/// and returns the hash; `full` when the stack map has no room.
#[inline(always)]
pub(crate) fn store_frames(len: usize, full: Counter) -> Result<StackId, Counter> {
    match bpfprof_store_frames(len.min(MAX_STACK_DEPTH) as u64) {
        0 => Err(full),
        id => Ok(id),
    }
}

/// [`store_frames`] itself: the stack's id, or 0 when the stack map has no room (a hash is
/// never 0).
///
/// A global function, which the verifier checks once on its own: inlined at each of its four
/// callers, its hash loop was checked again for every state of every caller (the walker
/// program took 220k verified instructions with it inlined, 108k without; the sampling
/// program 33k and 8.5k).
#[no_mangle]
#[inline(never)]
pub extern "C" fn bpfprof_store_frames(len: u64) -> u64 {
    let Some(frames) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's scratch slot; perf_event programs do not nest on a CPU.
    let frames = unsafe { &mut *frames };
    let len = (len as usize).min(MAX_STACK_DEPTH);
    frames.len = len as u64;
    let id = stack_hash(frames, len);
    // SAFETY: only tested for presence.
    if unsafe { STACKS.get(id) }.is_some() {
        return id;
    }
    match STACKS.insert(id, frames, BPF_NOEXIST as u64) {
        Ok(()) => {
            increment(STACKS_STORED_INDEX);
            id
        }
        Err(e) if e == -EEXIST => id,
        Err(_) => 0,
    }
}

/// The hash's multiplier (the golden ratio's, as in Fibonacci hashing).
pub(crate) const HASH_K: u64 = 0x9e37_79b9_7f4a_7c15;
/// Frames [`stack_hash`] mixes in one `bpf_loop` iteration: a few, so that the loop's cost
/// per frame stays that of a plain loop.
pub(crate) const HASH_CHUNK: usize = 8;
const _: () = assert!(MAX_STACK_DEPTH.is_multiple_of(HASH_CHUNK));

/// [`stack_hash`]'s state, shared with its `bpf_loop` callback.
#[repr(C)]
pub(crate) struct Hashing {
    frames: *const StackFrames,
    len: u64,
    h: u64,
}

/// A 64-bit hash of the first `len` frames, never 0. With 64 bits, two distinct stacks of one
/// run share an id with probability about n²/2⁶⁵: one in 10⁹ for a million stacks.
///
/// The frames are mixed under `bpf_loop`, [`HASH_CHUNK`] an iteration: as a bounded loop the
/// verifier checked the loop body once per possible frame (512 times: 13k of the sampling
/// program's 36k verified instructions, in each of the three programs).
#[inline(always)]
pub(crate) fn stack_hash(frames: &StackFrames, len: usize) -> StackId {
    let mut state = Hashing {
        frames,
        len: len as u64,
        h: (len as u64).wrapping_mul(HASH_K),
    };
    // SAFETY: `hash_chunk` has the callback signature bpf_loop expects, and `state` outlives
    // the call.
    unsafe {
        bpf_loop(
            len.div_ceil(HASH_CHUNK) as u32,
            hash_chunk as *mut _,
            (&mut state as *mut Hashing).cast(),
            0,
        )
    };
    let mut h = state.h;
    // murmur3's finalizer, so that every input bit reaches every output bit.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    if h == 0 {
        1
    } else {
        h
    }
}

/// The `bpf_loop` callback of [`stack_hash`]: mixes frames `index * HASH_CHUNK` on, up to the
/// stack's length.
#[inline(never)]
extern "C" fn hash_chunk(index: u64, state: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the pointer `stack_hash` gave it.
    let state = unsafe { &mut *(state as *mut Hashing) };
    let first = index.wrapping_mul(HASH_CHUNK as u64);
    if first > (MAX_STACK_DEPTH - HASH_CHUNK) as u64 {
        return 1;
    }
    let first = first as usize;
    // SAFETY: the scratch slot `stack_hash` was given, valid while the program runs.
    let frames = unsafe { &*state.frames };
    let len = state.len as usize;
    let mut h = state.h;
    for j in 0..HASH_CHUNK {
        if first + j < len {
            h = (h ^ frames.ips[first + j]).wrapping_mul(HASH_K);
            h ^= h >> 29;
        }
    }
    state.h = h;
    0
}
