//! Off-CPU time: the `sched_switch` program's record layout and thread states, a switched-out
//! thread's pending wait, and the wait scan that finds threads already waiting when a run starts.

use crate::{SampleKey, StackId};

/// Name of the `sched:sched_switch` tracepoint program that records off-CPU time (`--off-cpu`,
/// `--mode wall`): attached only while a run asks for it.
pub const OFF_CPU_PROGRAM_NAME: &str = "bpfprof_off_cpu";
/// Byte offsets in the `sched_switch` record of `prev_state` (a `long`) and `next_pid` (an
/// `int`), as every kernel since 4.x lays it out (the comms are inline 16-byte arrays); userspace
/// checks them against the tracepoint's format before attaching.
pub const SCHED_SWITCH_OFFSETS: (usize, usize) = (32, 56);
/// Bits of the `sched_switch` record's `prev_state` (the kernel's `TASK_REPORT` encoding):
/// interruptible sleep (`S`).
pub const TASK_REPORT_SLEEPING: u64 = 0x1;
/// See [`TASK_REPORT_SLEEPING`]: uninterruptible sleep (`D`, disk and other unkillable waits).
pub const TASK_REPORT_DISK: u64 = 0x2;
/// See [`TASK_REPORT_SLEEPING`]: set when the task was preempted while runnable (`R+`); a
/// `prev_state` of 0 is a runnable task that yielded.
pub const TASK_REPORT_PREEMPTED: u64 = 0x100;
/// Threads that can be off the CPU at once with their switch-out remembered (64 bytes each,
/// preallocated: 4 MiB): more than every thread of the largest target (a PyTorch dataloader
/// pool has hundreds); a switch-out that finds the map full is counted, not recorded.
pub const MAX_OFF_CPU_PENDING: u32 = 65536;
/// Name of the wait scan program (`iter/task`, see [`WaitScan`]) in the kernel object.
pub const WAIT_SCAN_PROGRAM_NAME: &str = "bpfprof_wait_scan";
/// Name of the wait scan's map ([`WaitScan`] by global tid).
pub const WAIT_SCAN_MAP: &str = "WAIT_SCAN";
/// Most threads one wait scan looks at.
pub const MAX_WAIT_SCAN: u32 = 16384;
/// [`WaitScan::outcome`]: the thread was not seen off the CPU (or not seen at all).
pub const WAIT_SCAN_NOT_WAITING: u32 = 0;
/// [`WaitScan::outcome`]: its wait is now pending, as if it had left the CPU at `since_ns`.
pub const WAIT_SCAN_PENDING: u32 = 1;
/// [`WaitScan::outcome`]: it already had a pending wait (its switch-out came after the
/// off-CPU program was attached), which is kept.
pub const WAIT_SCAN_ALREADY_PENDING: u32 = 2;
/// [`WaitScan::outcome`]: it ran while it was being read: nothing was left pending.
pub const WAIT_SCAN_RAN: u32 = 3;

/// What the kernel remembers of a target thread between its switch-out and its switch-in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OffCpuPending {
    /// The key the off-CPU time goes to: runs, thread, stacks at the switch-out, and state.
    pub key: SampleKey,
    /// `bpf_ktime_get_ns` at the switch-out.
    pub since_ns: u64,
    /// The [`Counter`](crate::Counter)s of the user and kernel stacks that could not be read or stored at the
    /// switch-out, or `u32::MAX`: counted at the switch-in, with the interval they belong to.
    pub stack_losses: [u32; 2],
}

/// One thread of a wait scan: a run's off-CPU time starts with the waits that began before
/// it. Userspace lists the threads of a target it has just taken in (global tid -> this,
/// `runs`, `pid` and `tid` filled) and runs the scan (an `iter/task` program over every task):
/// each listed thread found off the CPU gets an [`OffCpuPending`] entry as a switch-out would
/// have made it, with its kernel stack and the scan's time, and its user registers here, from
/// which userspace walks its user (native, Python) stacks, since a BPF program reads only the
/// current task's memory. Those stacks are stored by userspace under the ids the entry
/// already holds (`user_stack`, `python_stack`), fixed by the scan so that the entry never has
/// to be changed once the thread may have woken.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WaitScan {
    /// In: the runs whose off-CPU time the thread's wait goes to.
    pub runs: u64,
    /// In: the process id in the target's pid namespace ([`SampleKey::pid`]).
    pub pid: u32,
    /// In: the thread id in the target's pid namespace.
    pub tid: u32,
    /// In: non-zero when userspace walks the thread's Python frames (`python_stack` is set).
    pub python: u32,
    /// Out: a `WAIT_SCAN_*` value.
    pub outcome: u32,
    /// Out: the [`SampleKind`](crate::SampleKind) of the wait.
    pub kind: u32,
    /// Always zero; keeps the struct free of padding.
    pub reserved: u32,
    /// Out: the user registers (rip, rsp, rbp) as the thread last entered the kernel.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// In: when the process became a target (`CLOCK_MONOTONIC`, `bpf_ktime_get_ns`'s clock),
    /// the start of its waits for the runs; 0 for the scan's own time. Out: the time used.
    pub since_ns: u64,
    /// Out: the ids userspace stores the walked stacks under (0: none to store).
    pub user_stack: StackId,
    pub python_stack: StackId,
    /// Out: its context switches (`nvcsw + nivcsw`) when read: a thread whose count differs
    /// afterwards ran meanwhile, and its user stack is no longer the one of its wait.
    pub switches: u64,
}
