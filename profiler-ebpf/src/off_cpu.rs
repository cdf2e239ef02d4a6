//! Off-CPU time (`--off-cpu`, `--mode wall`): where target threads wait, and for how long.
//!
//! One program on the `sched:sched_switch` tracepoint does both halves of every switch. At the
//! switch-out of a target thread that blocks (or, in wall mode, is preempted) it walks the
//! thread's stacks as the sampling walker would (CFI and Python walks, the kernel stack from
//! the tracepoint: `schedule` under `do_nanosleep`, `pipe_read`, `futex_wait`...) and remembers
//! them with the time, by the thread's global id. At the switch-in of a thread it finds there,
//! it adds the time off the CPU to the sample map under those stacks and the thread's state:
//! an off-CPU record is a sample with a kind and a weight in nanoseconds, drained like any
//! other.
//!
//! The common case, a switch of some other thread, costs one config read, one hash lookup
//! (the incoming thread) and the target check of the outgoing thread. The walks run at the
//! switch-out, before the length of the wait is known, so short waits cost their walk even
//! when `--off-cpu-min` drops them at the switch-in; the stacks are those of the moment the
//! thread stopped, which is the point.
//!
//! The scheduler runs this with interrupts off, so no cpu-clock sample interrupts it and the
//! per-CPU scratch slot it shares with the sampling programs is its own while it runs. A
//! hardware PMU's NMI can interrupt it, but the kernel then skips the sampling program: both
//! a tracepoint program (`trace_call_bpf`) and a perf_event program (`bpf_overflow_handler`)
//! run only when the CPU's `bpf_prog_active` count was zero, so the two never nest on one CPU
//! (the skipped sample is counted in the program's `misses`, not as a wrong stack).

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_F_USER_STACK},
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::map,
    maps::HashMap,
    programs::TracePointContext,
};
use profiler_common::{
    Config, Counter, OffCpuPending, SampleKey, SampleKind, ALL_RUNS_SAMPLES_INDEX,
    MAX_OFF_CPU_PENDING, MAX_RUNS, SCHED_SWITCH_OFFSETS, TASK_REPORT_DISK, TASK_REPORT_PREEMPTED,
    TASK_REPORT_SLEEPING,
};

use crate::{
    config, count_runs, counter_bit, current_target, increment, increment_sample, is_kernel_thread,
    python, report_new_process, store_stack, unwind, NO_COUNTER,
};

/// Target threads off the CPU, by global thread id: their stacks and state at the
/// switch-out, and its time.
#[map]
pub(crate) static OFF_CPU_PENDING: HashMap<u32, OffCpuPending> =
    HashMap::with_max_entries(MAX_OFF_CPU_PENDING, 0);

tracepoint_program! {
    /// `sched:sched_switch`: ends the off-CPU interval of the incoming thread, then starts that
    /// of the outgoing one (the current task) if it is a target that blocks. It returns 1 as
    /// every tracepoint program here: 0 would hide every sched_switch from perf and other
    /// tools while a run is on.
    bpfprof_off_cpu => sched_switch
}

#[inline(always)]
fn sched_switch(ctx: &TracePointContext) {
    switch_in(ctx);
    switch_out(ctx);
}

/// Adds the incoming thread's time off the CPU to its stacks, if it was remembered.
#[inline(always)]
fn switch_in(ctx: &TracePointContext) {
    // SAFETY: a constant offset inside the record, checked by userspace against the
    // tracepoint's format before attaching.
    let Ok(next) = (unsafe { ctx.read_at::<i32>(SCHED_SWITCH_OFFSETS.1) }) else {
        return;
    };
    let tid = next as u32;
    // SAFETY: the value is copied out at once.
    let Some(pending) = (unsafe { OFF_CPU_PENDING.get(tid) }).copied() else {
        return;
    };
    let _ = OFF_CPU_PENDING.remove(tid);
    // Runs that ended since the switch-out no longer get time (their bit is cleared first).
    let runs = pending.key.runs & config(Config::OffCpuRuns);
    if runs == 0 {
        return;
    }
    let ns = now_ns().saturating_sub(pending.since_ns);
    if ns < config(Config::OffCpuMinNs) {
        return;
    }
    let key = SampleKey {
        runs,
        ..pending.key
    };
    increment(ALL_RUNS_SAMPLES_INDEX);
    let map_full = !increment_sample(&key, ns);
    let mut counters = 1 << Counter::OffCpuIntervals as u32;
    counters |= counter_bit(pending.stack_losses[0]) | counter_bit(pending.stack_losses[1]);
    if map_full {
        counters |= 1 << Counter::SampleMapFull as u32;
    }
    count_runs(runs, counters);
}

/// Remembers the outgoing thread's stacks, state and time if it is a target of an off-CPU run
/// and leaves the CPU to wait.
#[inline(always)]
fn switch_out(ctx: &TracePointContext) {
    let off_cpu_runs = config(Config::OffCpuRuns);
    if off_cpu_runs == 0 {
        return;
    }
    // SAFETY: as in `switch_in`.
    let Ok(state) = (unsafe { ctx.read_at::<i64>(SCHED_SWITCH_OFFSETS.0) }) else {
        return;
    };
    let state = state as u64;
    let kind = if state == 0 || state & TASK_REPORT_PREEMPTED != 0 {
        if config(Config::OffCpuPreempted) == 0 {
            return;
        }
        SampleKind::Preempted
    } else if state & TASK_REPORT_DISK != 0 {
        SampleKind::Disk
    } else if state & TASK_REPORT_SLEEPING != 0 {
        SampleKind::Sleeping
    } else {
        // Stopped, traced, exiting, parked or idle kernel threads: not a wait of the program.
        return;
    };
    let Some(target) = current_target() else {
        return;
    };
    let runs = target.runs & off_cpu_runs;
    if runs == 0 || (target.skip_kernel_threads && is_kernel_thread(ctx)) {
        return;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if target.system {
        // A process that only waits is taken in as one that runs is: its maps read, its
        // tables built.
        report_new_process(tgid);
    }
    let user_stack = match bpfprof_off_cpu_cfi_stack(tgid) {
        unwind::NOT_UNWOUND => store_stack(ctx, BPF_F_USER_STACK as u64),
        0 => Err(Counter::UserStackMapFull),
        id => Ok(id),
    };
    let kernel_stack = store_stack(ctx, 0);
    let python_stack = if python::is_python(tgid) {
        python::bpfprof_python_stack(MAX_RUNS)
    } else {
        0
    };
    let pending = OffCpuPending {
        key: SampleKey {
            runs,
            pid: target.task.tgid,
            tid: target.task.pid,
            user_stack: user_stack.unwrap_or(0),
            kernel_stack: kernel_stack.unwrap_or(0),
            runtime_stack: python_stack,
            kind: kind as u32,
            reserved: 0,
        },
        since_ns: now_ns(),
        stack_losses: [
            user_stack.err().map_or(NO_COUNTER, |c| c as u32),
            kernel_stack.err().map_or(NO_COUNTER, |c| c as u32),
        ],
    };
    if OFF_CPU_PENDING
        .insert(pid_tgid as u32, pending, BPF_ANY as u64)
        .is_err()
    {
        count_runs(runs, 1 << Counter::OffCpuPendingFull as u32);
    }
}

/// The monotonic clock, in nanoseconds.
#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// The current task's user stack walked by CFI from its saved user registers, stored: its id,
/// [`unwind::NOT_UNWOUND`] for a process without tables, or 0 when the stack map was full.
///
/// A global function, which the verifier checks once on its own: inlined, the walk was checked
/// again for every state of the switch-out's branches (thread states, runs) and the program
/// passed the verifier's million-instruction limit.
#[no_mangle]
#[inline(never)]
pub extern "C" fn bpfprof_off_cpu_cfi_stack(tgid: u32) -> u64 {
    if !unwind::is_unwound(tgid) {
        return unwind::NOT_UNWOUND;
    }
    match unwind::task_user_registers() {
        // The walks' statistics describe samples: `MAX_RUNS` keeps them out of every run's.
        Some((ip, sp, bp)) => unwind::cfi_stack(ip, sp, bp, MAX_RUNS),
        None => unwind::NOT_UNWOUND,
    }
}
