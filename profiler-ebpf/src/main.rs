//! bpfprof's kernel side: a perf_event program that keeps only the samples of target
//! processes and counts them per (run, thread, user stack, kernel stack).
//!
//! The program runs on every sample of every CPU, so the common case — a sample of some other
//! process — must be cheap: it costs one helper call per watched pid namespace and one hash
//! lookup. Everything that can be done later (symbols, tags, truncation) is left to userspace.
#![no_std]
#![no_main]
// The BPF atomic add is reached through inline asm: the bpf target has no compare-and-swap, so
// `AtomicU64::fetch_add` does not exist there.
#![feature(asm_experimental_arch)]

use aya_ebpf::{
    bindings::{bpf_pidns_info, BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{bpf_get_ns_current_pid_tgid, bpf_get_stack},
    macros::{map, perf_event},
    maps::{Array, HashMap, PerCpuArray},
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::{
    Counter, PidNamespace, SampleKey, StackFrames, StackId, TargetInfo, TargetKey,
    ALL_RUNS_SAMPLES_INDEX, COUNTER_ENTRIES, MAX_PID_NAMESPACES, MAX_RUNS, MAX_STACK_DEPTH,
    MAX_TARGETS, SAMPLE_MAP_ENTRIES, STACK_MAP_ENTRIES,
};

mod unwind;

const EEXIST: i32 = 17;

/// Pid namespaces that hold at least one target; slots with `ino == 0` are free.
#[map]
static PID_NAMESPACES: Array<PidNamespace> = Array::with_max_entries(MAX_PID_NAMESPACES, 0);

/// Target processes, by namespace and in-namespace tgid, and the run each belongs to.
#[map]
static TARGETS: HashMap<TargetKey, TargetInfo> = HashMap::with_max_entries(MAX_TARGETS, 0);

/// User and kernel stacks by a hash of their frames. A hash map rather than the kernel's stack
/// trace map: the latter keeps one stack per bucket and refuses a colliding stack, which loses
/// samples long before it is full on a program with many distinct stacks. Preallocated:
/// allocating 1 KiB entries in interrupt context fails (ENOMEM) in bursts of new stacks.
#[map]
static STACKS: HashMap<StackId, StackFrames> = HashMap::with_max_entries(STACK_MAP_ENTRIES, 0);

/// Per-CPU room to read a stack into: 1 KiB does not fit on the 512-byte BPF stack.
#[map]
static SCRATCH: PerCpuArray<StackFrames> = PerCpuArray::with_max_entries(1, 0);

/// Sample counts by (run, thread, user stack, kernel stack).
#[map]
static SAMPLES: HashMap<SampleKey, u64> = HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);

/// Per-run counters (`Counter`), per CPU so that no atomics are needed.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_ENTRIES, 0);

#[perf_event]
pub fn bpfprof_sample(ctx: PerfEventContext) -> u32 {
    if let Some((run, task)) = target_run() {
        record(&ctx, run, task);
    }
    0
}

/// Returns the run of the current task's process, if it is a target, with the task's ids as
/// seen in the target's pid namespace.
#[inline(always)]
fn target_run() -> Option<(u32, bpf_pidns_info)> {
    let mut i = 0;
    while i < MAX_PID_NAMESPACES {
        if let Some(ns) = PID_NAMESPACES.get(i) {
            if ns.ino != 0 {
                let mut info = bpf_pidns_info { pid: 0, tgid: 0 };
                // SAFETY: `info` is a valid, writable bpf_pidns_info of the size passed.
                let rc = unsafe {
                    bpf_get_ns_current_pid_tgid(
                        ns.dev,
                        ns.ino,
                        &mut info,
                        core::mem::size_of::<bpf_pidns_info>() as u32,
                    )
                };
                // A task has one active pid namespace, so at most one slot can match.
                if rc == 0 {
                    let key = TargetKey {
                        ns: *ns,
                        tgid: info.tgid,
                        reserved: 0,
                    };
                    // SAFETY: the value is copied out at once; a concurrent removal can only
                    // make us attribute one sample to a run that just ended.
                    return unsafe { TARGETS.get(&key) }
                        .map(|t| (t.run, info))
                        .filter(|(run, _)| *run < MAX_RUNS);
                }
            }
        }
        i += 1;
    }
    None
}

#[inline(always)]
fn record(ctx: &PerfEventContext, run: u32, task: bpf_pidns_info) {
    count(run, Counter::Samples);
    increment(ALL_RUNS_SAMPLES_INDEX);
    // Processes userspace loaded CFI tables for are walked by `unwind`; the rest by the kernel.
    let user_stack = match unwind::walk_user_stack(ctx, run, &SCRATCH) {
        Some(len) => store_frames(run, len, Counter::UserStackMapFull),
        None => store_stack(
            ctx,
            run,
            BPF_F_USER_STACK as u64,
            Counter::UserStackMapFull,
            Counter::UserStackError,
        ),
    };
    let kernel_stack = store_stack(
        ctx,
        run,
        0,
        Counter::KernelStackMapFull,
        Counter::KernelStackError,
    );
    let key = SampleKey {
        run,
        pid: task.tgid,
        tid: task.pid,
        reserved: 0,
        user_stack,
        kernel_stack,
    };
    if let Some(value) = SAMPLES.get_ptr_mut(&key) {
        atomic_add(value, 1);
        return;
    }
    match SAMPLES.insert(&key, &1, BPF_NOEXIST as u64) {
        Ok(()) => {}
        // Another CPU inserted the same key between our lookup and insert.
        Err(e) if e == -EEXIST => {
            if let Some(value) = SAMPLES.get_ptr_mut(&key) {
                atomic_add(value, 1);
            }
        }
        Err(_) => count(run, Counter::SampleMapFull),
    }
}

/// Reads the current user or kernel stack (`flags`), stores it under its hash unless already
/// there, and returns the hash; 0 for an empty stack (a kernel stack of a sample taken in user
/// mode) or one that could not be read or stored, which `error` or `full` then counts.
#[inline(always)]
fn store_stack(
    ctx: &PerfEventContext,
    run: u32,
    flags: u64,
    full: Counter,
    error: Counter,
) -> StackId {
    let Some(frames) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: `frames` is this CPU's scratch slot and perf_event programs do not nest on a CPU.
    let frames = unsafe { &mut *frames };
    let size = core::mem::size_of::<[u64; MAX_STACK_DEPTH]>() as u32;
    // SAFETY: `ips` is writable for `size` bytes; the kernel zero-fills what it does not use.
    let bytes = unsafe { bpf_get_stack(ctx.as_ptr(), frames.ips.as_mut_ptr().cast(), size, flags) };
    if bytes <= 0 {
        if bytes < 0 {
            count(run, error);
        }
        return 0;
    }
    let len = (bytes as usize / 8).min(MAX_STACK_DEPTH);
    frames.len = len as u64;
    store_frames(run, len, full)
}

/// Stores the `len` frames in this CPU's scratch slot under their hash unless already there,
/// and returns the hash; 0 when the stack map is full, which `full` counts.
#[inline(always)]
fn store_frames(run: u32, len: usize, full: Counter) -> StackId {
    let Some(frames) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's scratch slot; perf_event programs do not nest on a CPU.
    let frames = unsafe { &*frames };
    let id = stack_hash(&frames.ips, len);
    // SAFETY: only tested for presence.
    if unsafe { STACKS.get(&id) }.is_some() {
        return id;
    }
    match STACKS.insert(&id, frames, BPF_NOEXIST as u64) {
        Ok(()) => id,
        Err(e) if e == -EEXIST => id,
        Err(_) => {
            count(run, full);
            0
        }
    }
}

/// A 64-bit hash of the first `len` frames, never 0. With 64 bits, two distinct stacks of one
/// run share an id with probability about n²/2⁶⁵: one in 10⁹ for a million stacks.
#[inline(always)]
fn stack_hash(ips: &[u64; MAX_STACK_DEPTH], len: usize) -> StackId {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = (len as u64).wrapping_mul(K);
    for ip in ips.iter().take(len) {
        h = (h ^ *ip).wrapping_mul(K);
        h ^= h >> 29;
    }
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

#[inline(always)]
fn count(run: u32, counter: Counter) {
    increment(counter.index(run));
}

#[inline(always)]
fn increment(index: u32) {
    if let Some(value) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, and perf_event programs do not nest on one CPU.
        unsafe { *value += 1 };
    }
}

#[inline(always)]
fn atomic_add(ptr: *mut u64, value: u64) {
    // SAFETY: `ptr` points into a map value that stays valid while the program runs.
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({ptr} + 0) += {value}",
            ptr = in(reg) ptr,
            value = in(reg) value,
        )
    };
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
