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
    helpers::bpf_get_ns_current_pid_tgid,
    macros::{map, perf_event},
    maps::{Array, HashMap, PerCpuArray, StackTrace},
    programs::{tracing::StackIdContext, PerfEventContext},
};
use profiler_common::{
    Counter, PidNamespace, SampleKey, TargetInfo, TargetKey, COUNTER_ENTRIES, MAX_PID_NAMESPACES,
    MAX_RUNS, MAX_TARGETS, SAMPLE_MAP_ENTRIES, STACK_MAP_ENTRIES,
};

const EFAULT: i32 = 14;
const EEXIST: i32 = 17;
const ENOMEM: i32 = 12;
const E2BIG: i32 = 7;

/// Pid namespaces that hold at least one target; slots with `ino == 0` are free.
#[map]
static PID_NAMESPACES: Array<PidNamespace> = Array::with_max_entries(MAX_PID_NAMESPACES, 0);

/// Target processes, by namespace and in-namespace tgid, and the run each belongs to.
#[map]
static TARGETS: HashMap<TargetKey, TargetInfo> = HashMap::with_max_entries(MAX_TARGETS, 0);

/// User and kernel stacks, deduplicated by the kernel.
#[map]
static STACKS: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);

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
    let user_stack_id = match ctx.get_stackid(&STACKS, BPF_F_USER_STACK as u64) {
        Ok(id) => id as i32,
        Err(e) => {
            count(run, stack_error(e, Counter::UserStackCollision));
            e
        }
    };
    let kernel_stack_id = match ctx.get_stackid(&STACKS, 0) {
        Ok(id) => id as i32,
        // A sample taken in user mode has no kernel stack: that is not a loss.
        Err(e) if e == -EFAULT => e,
        Err(e) => {
            count(run, stack_error(e, Counter::KernelStackCollision));
            e
        }
    };
    let key = SampleKey {
        run,
        pid: task.tgid,
        tid: task.pid,
        user_stack_id,
        kernel_stack_id,
        reserved: 0,
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

/// Maps a `bpf_get_stackid` error to its counter; `collision` is the user or kernel family's
/// first counter (collision, map full, other error follow it in that order).
#[inline(always)]
fn stack_error(e: i32, collision: Counter) -> Counter {
    let user = collision == Counter::UserStackCollision;
    match (-e, user) {
        (EEXIST, true) => Counter::UserStackCollision,
        (ENOMEM | E2BIG, true) => Counter::UserStackMapFull,
        (_, true) => Counter::UserStackError,
        (EEXIST, false) => Counter::KernelStackCollision,
        (ENOMEM | E2BIG, false) => Counter::KernelStackMapFull,
        (_, false) => Counter::KernelStackError,
    }
}

#[inline(always)]
fn count(run: u32, counter: Counter) {
    if let Some(value) = COUNTERS.get_ptr_mut(counter.index(run)) {
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
