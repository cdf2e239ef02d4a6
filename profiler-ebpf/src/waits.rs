//! The wait scan (`iter/task`): at a run's start, and when a run takes a process in, the
//! target threads already off the CPU get the pending off-CPU entry their switch-out would
//! have made before the run (see [`WaitScan`]). Without it a thread blocked since before the
//! run appears in no wall or off-CPU profile, and a wait that ends in the run counts only
//! from its first switch-out in the run.
//!
//! The kernel stack is taken here (`bpf_get_task_stack` reads a sleeping task's saved kernel
//! stack); the user stacks cannot be (a BPF program reads only the current task's user
//! memory, and a sleepable `iter.s` program would need a second walker built on
//! `bpf_copy_from_user_task`), so the scan hands userspace the task's saved user registers
//! and the ids under which userspace stores the stacks it walks from them.
//!
//! Task fields are read at the offsets userspace found in the kernel's BTF (`Config::Task*`):
//! this object carries no CO-RE relocations.

use aya_ebpf::{
    bindings::{pt_regs, BPF_NOEXIST},
    helpers::{
        bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::{bpf_get_task_stack, bpf_task_pt_regs},
    },
    macros::map,
    maps::HashMap,
};
use profiler_common::{
    Config, Counter, OffCpuPending, SampleKey, SampleKind, StackId, WaitScan, KERNEL_STACK_DEPTH,
    MAX_WAIT_SCAN, WAIT_SCAN_ALREADY_PENDING, WAIT_SCAN_PENDING, WAIT_SCAN_RAN,
};

use crate::{config, off_cpu::OFF_CPU_PENDING, store_frames, NO_COUNTER, SCRATCH};

/// The threads of the scan, by global tid: filled by userspace, answered here.
#[map]
static WAIT_SCAN: HashMap<u32, WaitScan> = HashMap::with_max_entries(MAX_WAIT_SCAN, 0);

/// `TASK_INTERRUPTIBLE`, `TASK_UNINTERRUPTIBLE` and `TASK_NOLOAD` in `task_struct.__state`
/// (include/linux/sched.h, unchanged since 4.14); `TASK_IDLE` is the last two, a kernel
/// thread's idle wait, which no switch-out reports as a wait either.
const TASK_INTERRUPTIBLE: u32 = 0x1;
const TASK_UNINTERRUPTIBLE: u32 = 0x2;
const TASK_NOLOAD: u32 = 0x400;

/// The wait scan: called once per task of the machine, then once with no task.
#[no_mangle]
#[link_section = "iter/task"]
pub fn bpfprof_wait_scan(ctx: *mut core::ffi::c_void) -> i32 {
    // `struct bpf_iter__task`: the meta pointer, then the task (each in an 8-byte slot).
    // SAFETY: the context of an iter/task program, read at its task field.
    let task = unsafe { *(ctx as *const *mut aya_ebpf::bindings::task_struct).add(1) };
    if !task.is_null() {
        // The same pointer as a plain number, for the field reads: the verifier allows no
        // offset unknown to it on the trusted pointer the helpers take.
        // SAFETY: a read of the context through the checked helper.
        let address = unsafe { bpf_probe_read_kernel((ctx as *const u64).add(1)) }.unwrap_or(0);
        if address != 0 {
            scan(task, address);
        }
    }
    0
}

/// Reads the `T` at byte `offset` of the task at `address` (0 on a failed read).
#[inline(always)]
fn field<T: Default>(address: u64, offset: Config) -> T {
    let at = address.wrapping_add(config(offset));
    // SAFETY: a kernel read through the checked helper.
    unsafe { bpf_probe_read_kernel(at as *const T) }.unwrap_or_default()
}

#[inline(always)]
fn scan(task: *mut aya_ebpf::bindings::task_struct, address: u64) {
    if config(Config::TaskPidOffset) == 0 {
        return;
    }
    let tid: i32 = field(address, Config::TaskPidOffset);
    let Some(entry) = WAIT_SCAN.get_ptr_mut(tid as u32) else {
        return;
    };
    // SAFETY: a valid entry of the map; only this scan writes it while userspace waits.
    let entry = unsafe { &mut *entry };
    let runs = entry.runs & config(Config::OffCpuRuns);
    if runs == 0 {
        return;
    }
    let on_cpu: i32 = field(address, Config::TaskOnCpuOffset);
    if on_cpu != 0 {
        // Running: its switch-out, whenever it comes, starts its wait.
        return;
    }
    let state: u32 = field(address, Config::TaskStateOffset);
    let kind = if state == 0 {
        // Runnable, waiting for a CPU.
        if config(Config::OffCpuPreempted) == 0 {
            return;
        }
        SampleKind::Preempted
    } else if state & (TASK_UNINTERRUPTIBLE | TASK_NOLOAD) == TASK_UNINTERRUPTIBLE {
        SampleKind::Disk
    } else if state & TASK_INTERRUPTIBLE != 0 {
        SampleKind::Sleeping
    } else {
        // Stopped, traced, exiting, idle: not a wait of the program (as at a switch-out).
        return;
    };
    let switches = switch_count(address);
    // The target's waits count from when it became one (userspace's time): a thread off the
    // CPU now with no pending entry has been off it since before then, or its switch-out
    // would have made one.
    let since = if entry.since_ns != 0 {
        entry.since_ns
    } else {
        now_ns()
    };
    // SAFETY: the scan's task, a trusted pointer the helper takes.
    let user = unsafe { bpf_task_pt_regs(task) } as *const pt_regs;
    let regs: Option<pt_regs> = if user.is_null() {
        None
    } else {
        // SAFETY: kernel memory read through the checked helper.
        unsafe { bpf_probe_read_kernel(user) }.ok()
    };
    let (ip, sp, bp) = regs.map_or((0, 0, 0), |r| (r.rip, r.rsp, r.rbp));
    let kernel_stack = task_kernel_stack(task);
    // Ids no walk produces (a walk's id is a hash of its frames): one per thread and scan.
    let user_stack = if ip != 0 {
        scan_id(tid as u32, since, 1)
    } else {
        0
    };
    let python_stack = if entry.python != 0 {
        scan_id(tid as u32, since, 2)
    } else {
        0
    };
    let pending = OffCpuPending {
        key: SampleKey {
            runs,
            pid: entry.pid,
            tid: entry.tid,
            user_stack,
            kernel_stack: kernel_stack.unwrap_or(0),
            runtime_stack: python_stack,
            kind: kind as u32,
            reserved: 0,
        },
        since_ns: since,
        stack_losses: [
            NO_COUNTER,
            kernel_stack.err().map_or(NO_COUNTER, |c| c as u32),
        ],
    };
    let tid = tid as u32;
    // A pending entry already there came from a switch-out since the off-CPU program was
    // attached: it is newer than anything read here, and kept.
    let outcome = if OFF_CPU_PENDING
        .insert(tid, pending, BPF_NOEXIST as u64)
        .is_err()
    {
        WAIT_SCAN_ALREADY_PENDING
    } else {
        let on_cpu: i32 = field(address, Config::TaskOnCpuOffset);
        if on_cpu != 0 || switch_count(address) != switches {
            // It woke while being read: what was read may not be its wait. Its switch-in
            // may already have taken the entry; if not, it goes, unless it is a newer one.
            // SAFETY: the value is copied out at once.
            if unsafe { OFF_CPU_PENDING.get(tid) }.is_some_and(|p| p.since_ns == since) {
                let _ = OFF_CPU_PENDING.remove(tid);
            }
            WAIT_SCAN_RAN
        } else {
            WAIT_SCAN_PENDING
        }
    };
    entry.outcome = outcome;
    entry.kind = kind as u32;
    entry.ip = ip;
    entry.sp = sp;
    entry.bp = bp;
    entry.since_ns = since;
    entry.user_stack = user_stack;
    entry.python_stack = python_stack;
    entry.switches = switches;
}

/// The task's voluntary and involuntary context switches.
#[inline(always)]
fn switch_count(address: u64) -> u64 {
    let voluntary: u64 = field(address, Config::TaskNvcswOffset);
    let involuntary: u64 = field(address, Config::TaskNivcswOffset);
    voluntary.wrapping_add(involuntary)
}

/// The task's saved kernel stack, stored as a switch-out's would be.
#[inline(always)]
fn task_kernel_stack(task: *mut aya_ebpf::bindings::task_struct) -> Result<StackId, Counter> {
    let Some(frames) = SCRATCH.get_ptr_mut(0) else {
        return Err(Counter::KernelStackError);
    };
    // SAFETY: this CPU's scratch slot. The scan runs in bpfprof's own thread, which is never
    // a target: neither a sample nor a switch-out program that would write the slot runs for
    // it (both return at the target check).
    let frames = unsafe { &mut *frames };
    let size = core::mem::size_of::<[u64; KERNEL_STACK_DEPTH]>() as u32;
    // SAFETY: `ips` is writable for `size` bytes; the task is the scan's trusted pointer.
    let bytes = unsafe { bpf_get_task_stack(task, frames.ips.as_mut_ptr().cast(), size, 0) };
    if bytes < 0 {
        return Err(Counter::KernelStackError);
    }
    if bytes == 0 {
        return Ok(0);
    }
    let len = (bytes as usize / 8).min(KERNEL_STACK_DEPTH);
    frames.len = len as u64;
    store_frames(len, Counter::KernelStackMapFull)
}

/// An id for a stack userspace stores for the scan of thread `tid` at `since`: a hash, as a
/// stored stack's id is, of values no stack's frames give (`which` tells the user stack from
/// the Python one).
#[inline(always)]
fn scan_id(tid: u32, since: u64, which: u64) -> StackId {
    let mut h = since ^ (u64::from(tid) << 32) ^ which.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h | 1
}

/// The monotonic clock, in nanoseconds.
#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}
