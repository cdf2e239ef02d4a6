//! Who is sampled: the maps of targets, followed children and pid namespaces, the tracepoint
//! programs that keep them (fork, exit, exec), and the lookup every sample starts with.

use crate::config;
use aya_ebpf::{
    bindings::{bpf_pidns_info, BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{
        bpf_get_current_ancestor_cgroup_id, bpf_get_current_pid_tgid, bpf_get_ns_current_pid_tgid,
        bpf_get_stack,
    },
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
    EbpfContext,
};
use profiler_common::{
    Config, PidNamespace, TargetInfo, TargetKey, FORK_CHILD_PID_OFFSETS, MAX_EXECED, MAX_FOLLOWED,
    MAX_PID_NAMESPACES, MAX_SYSTEM_SEEN, MAX_TARGETS, NEW_PROCESS_RING_BYTES,
};

/// Pid namespaces that hold at least one target; slots with `ino == 0` are free.
#[map]
pub(crate) static PID_NAMESPACES: Array<PidNamespace> =
    Array::with_max_entries(MAX_PID_NAMESPACES, 0);

/// Target processes, by namespace and in-namespace tgid, and the runs each belongs to.
#[map]
pub(crate) static TARGETS: HashMap<TargetKey, TargetInfo> =
    HashMap::with_max_entries(MAX_TARGETS, 0);

/// Children of targets forked while a run follows children, by global pid (the fork
/// tracepoint knows no other), and the runs they belong to. Thread creations land here too
/// (the tracepoint does not tell them apart); userspace prunes them.
#[map]
pub(crate) static FOLLOWED: HashMap<u32, TargetInfo> = HashMap::with_max_entries(MAX_FOLLOWED, 0);

/// Processes that exec'd while runs of [`Config::StopAtExec`] sampled them, by global tgid, and
/// those runs (bits), which stopped sampling them at the exec: userspace re-checks the run's
/// owner against the new program and resumes or drops the process, then clears its bit.
#[map]
pub(crate) static EXECED: HashMap<u32, u64> = HashMap::with_max_entries(MAX_EXECED, 0);

/// Processes a system-wide run has reported in [`NEW_PROCESSES`], by global tgid. Userspace
/// removes a process when it sees it exit, so that a reused pid is reported again.
#[map]
pub(crate) static SYSTEM_SEEN: LruHashMap<u32, u8> =
    LruHashMap::with_max_entries(MAX_SYSTEM_SEEN, 0);

/// Global tgids of processes a system-wide run sampled for the first time: userspace reads
/// their maps at its next tick (0.1 s) instead of finding them in the sample map at its next
/// refresh (0.5 s), which a process that lives 0.2 s may not outlive.
#[map]
pub(crate) static NEW_PROCESSES: RingBuf = RingBuf::with_byte_size(NEW_PROCESS_RING_BYTES, 0);

tracepoint_program! {
    /// sched_process_fork with the record layout of kernels before 6.10 (`child_pid` at byte
    /// 44, after two inline 16-byte comm arrays). Tracepoint records can only be read at
    /// constant offsets, so each layout gets its own program and userspace loads the one this
    /// kernel has.
    bpfprof_fork => follow_fork::<{ FORK_CHILD_PID_OFFSETS[0] }>
}

tracepoint_program! {
    /// sched_process_fork with the record layout of 6.10 and later (`child_pid` at byte 20,
    /// comms moved out of line as `__data_loc` strings).
    bpfprof_fork_data_loc => follow_fork::<{ FORK_CHILD_PID_OFFSETS[1] }>
}

/// Follows a target's new child (or thread) into the runs that follow the target's children.
#[inline(always)]
pub(crate) fn follow_fork<const CHILD_PID_OFFSET: usize>(ctx: &TracePointContext) {
    // The parent is the current task.
    let Some(parent) = current_target() else {
        return;
    };
    if parent.follow == 0 {
        return;
    }
    // SAFETY: a constant offset inside this kernel's record, checked by userspace against the
    // tracepoint's format before this program was chosen.
    let child = match unsafe { ctx.read_at::<i32>(CHILD_PID_OFFSET) } {
        Ok(child) => child,
        Err(_) => return,
    };
    if child > 0 {
        let inherited = TargetInfo {
            runs: parent.follow,
            follow: parent.follow,
        };
        let _ = FOLLOWED.insert(child as u32, inherited, 0);
    }
}

tracepoint_program! {
    /// Forgets a followed child (or thread) when it exits, so that its pid can be reused.
    bpfprof_exit => forget_exited
}

#[inline(always)]
pub(crate) fn forget_exited(_ctx: &TracePointContext) {
    // The exiting task is the current one; the low half is its global thread id.
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: only tested for presence.
    if unsafe { FOLLOWED.get(tid) }.is_some() {
        let _ = FOLLOWED.remove(tid);
    }
}

tracepoint_program! {
    /// Stops the runs of [`Config::StopAtExec`] from sampling the current process as it
    /// execs, and tells userspace (`EXECED`). The tracepoint fires after the new program is
    /// loaded and its credentials are committed, before it runs an instruction: none of its
    /// samples reaches a run whose owner has not been checked against it (a setuid program, or
    /// one its user cannot read).
    bpfprof_exec => stop_at_exec
}

#[inline(always)]
pub(crate) fn stop_at_exec(_ctx: &TracePointContext) {
    let awaiting = config(Config::AwaitingExec);
    if awaiting != 0 && awaiting == bpf_get_current_pid_tgid() >> 32 {
        // The launched command runs its own program from here on: sampled from now.
        if let Some(entry) = crate::CONFIG.get_ptr_mut(Config::AwaitingExec as u32) {
            // SAFETY: a valid entry of the array; only this program and userspace write it.
            unsafe { *entry = 0 };
        }
    }
    let stopping = config(Config::StopAtExec);
    if stopping == 0 {
        return;
    }
    let global_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let mut stopped = 0;
    if let Some(key) = current_target_key() {
        if let Some(info) = TARGETS.get_ptr_mut(key) {
            // SAFETY: a valid entry of the map; racing updates can only lose a bit userspace
            // sets again or clears anyway.
            stopped |= unsafe { stop_runs(&mut *info, stopping) };
        }
    }
    if let Some(info) = FOLLOWED.get_ptr_mut(global_tgid) {
        // SAFETY: as above.
        stopped |= unsafe { stop_runs(&mut *info, stopping) };
    }
    if stopped != 0 {
        // SAFETY: the value is copied out at once.
        let before = match unsafe { EXECED.get(global_tgid) } {
            Some(runs) => *runs,
            None => 0,
        };
        let _ = EXECED.insert(global_tgid, before | stopped, 0);
    }
}

/// Clears the runs of `stopping` from `info`; returns those that were sampling it.
#[inline(always)]
pub(crate) fn stop_runs(info: &mut TargetInfo, stopping: u64) -> u64 {
    let stopped = info.runs & stopping;
    info.runs &= !stopping;
    info.follow &= !stopping;
    stopped
}

/// The current task's key in the target map, if its process's pid namespace is watched.
#[inline(always)]
pub(crate) fn current_target_key() -> Option<TargetKey> {
    let (ns, task) = current_ns_task()?;
    Some(TargetKey {
        ns,
        tgid: task.tgid,
        reserved: 0,
    })
}

/// The current task's watched pid namespace and its ids there, if its namespace is watched.
#[inline(always)]
pub(crate) fn current_ns_task() -> Option<(PidNamespace, bpf_pidns_info)> {
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
                    return Some((*ns, info));
                }
            }
        }
        i += 1;
    }
    None
}

/// The sampling program's answer for the sample it hands to the walker program: the walker
/// would otherwise ask again (the pid namespace helper and the target lookup: a sample that
/// asked once cost 1390 ns at 13 frames, asking twice).
#[repr(C)]
pub(crate) struct Handoff {
    /// The thread it was asked for (`bpf_get_current_pid_tgid`).
    pid_tgid: u64,
    /// Its runs; 0 once taken.
    runs: u64,
    pid: u32,
    tgid: u32,
}

/// Each CPU's [`Handoff`]: the walker runs only by tail call from the sampling program, on
/// the same CPU and for the same sample, and programs do not nest on a CPU.
#[map]
static HANDOFF: PerCpuArray<Handoff> = PerCpuArray::with_max_entries(1, 0);

/// Leaves `target` for the walker program the sampling program is about to tail-call.
#[inline(always)]
pub(crate) fn hand_off(target: &CurrentTarget) {
    if let Some(slot) = HANDOFF.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; programs do not nest on a CPU.
        unsafe {
            *slot = Handoff {
                pid_tgid: bpf_get_current_pid_tgid(),
                runs: target.runs,
                pid: target.task.pid,
                tgid: target.task.tgid,
            }
        };
    }
}

/// Takes what [`hand_off`] left for this thread's sample; `None` when nothing was left for it
/// (the caller then asks [`current_target`]).
#[inline(always)]
pub(crate) fn handed_target() -> Option<CurrentTarget> {
    let slot = HANDOFF.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot; programs do not nest on a CPU.
    let handoff = unsafe { &mut *slot };
    if handoff.runs == 0 || handoff.pid_tgid != bpf_get_current_pid_tgid() {
        return None;
    }
    let runs = core::mem::replace(&mut handoff.runs, 0);
    Some(CurrentTarget {
        runs,
        follow: 0,
        task: bpf_pidns_info {
            pid: handoff.pid,
            tgid: handoff.tgid,
        },
        // Both were acted on by the sampling program, before it handed the sample off.
        skip_kernel_threads: false,
        system: false,
    })
}

/// The current task as a target: the runs it belongs to and its ids in its pid namespace
/// (the initial one for a system-wide run).
pub(crate) struct CurrentTarget {
    pub(crate) runs: u64,
    follow: u64,
    pub(crate) task: bpf_pidns_info,
    /// Whether it is recorded by a system-wide run that leaves out kernel threads.
    pub(crate) skip_kernel_threads: bool,
    /// Whether it is recorded by a system-wide run, which learns of processes from the kernel.
    pub(crate) system: bool,
}

/// Returns the current task as a target, if its process is one or a followed child, or a
/// system-wide run records it.
#[inline(always)]
pub(crate) fn current_target() -> Option<CurrentTarget> {
    let system = config(Config::SystemRuns);
    let mut target = if system != 0 {
        // A program with a system-wide run has no other run.
        system_target(system)?
    } else {
        let awaiting = config(Config::AwaitingExec);
        if awaiting != 0 && awaiting == bpf_get_current_pid_tgid() >> 32 {
            // A launched command before its exec runs bpfprof's own code.
            return None;
        }
        let (ns, task) = current_ns_task()?;
        lookup(&ns, task)?
    };
    let stopped = config(Config::StoppedRuns);
    if stopped != 0 {
        target.runs &= !stopped;
        target.follow &= !stopped;
        if target.runs == 0 {
            return None;
        }
    }
    Some(target)
}

/// The current task for the system-wide `runs`, unless it is left out: the idle task,
/// bpfprof itself, a task outside the run's cgroup.
#[inline(always)]
pub(crate) fn system_target(runs: u64) -> Option<CurrentTarget> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // The idle task (pid 0) is no process: idle CPUs are not work to profile.
    if tgid == 0 || u64::from(tgid) == config(Config::SystemExcludeTgid) {
        return None;
    }
    let cgroup = config(Config::SystemCgroupId);
    if cgroup != 0 {
        // The task's ancestor at the cgroup's depth is the cgroup itself for every task in it
        // or below it; one helper call, no map (cgroup ids are never reused).
        let level = config(Config::SystemCgroupLevel) as i32;
        // SAFETY: a helper without pointer arguments.
        if unsafe { bpf_get_current_ancestor_cgroup_id(level) } != cgroup {
            return None;
        }
    }
    Some(CurrentTarget {
        runs,
        follow: 0,
        task: bpf_pidns_info {
            pid: pid_tgid as u32,
            tgid,
        },
        skip_kernel_threads: config(Config::SystemNoKernelThreads) != 0,
        system: true,
    })
}

/// Reports `tgid` to userspace if this system-wide run has not yet: one map lookup for a
/// process already reported. A report that does not fit the ring is forgotten, so that the
/// process's next sample tries again.
#[inline(always)]
pub(crate) fn report_new_process(tgid: u32) {
    // SAFETY: only tested for presence.
    if unsafe { SYSTEM_SEEN.get(tgid) }.is_some() {
        return;
    }
    if SYSTEM_SEEN.insert(tgid, 0u8, BPF_NOEXIST as u64).is_err() {
        // Another CPU reported it meanwhile.
        return;
    }
    if NEW_PROCESSES.output::<u32>(tgid, 0).is_err() {
        let _ = SYSTEM_SEEN.remove(tgid);
    }
}

/// Whether the current task is a kernel thread: it has no user stack (the kernel gives no
/// user frame to a task without user memory, while every user task has at least its pc).
#[inline(always)]
pub(crate) fn is_kernel_thread(ctx: &impl EbpfContext) -> bool {
    let mut ip: u64 = 0;
    // SAFETY: `ip` is writable for the 8 bytes passed.
    let bytes = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            (&mut ip as *mut u64).cast(),
            8,
            BPF_F_USER_STACK as u64,
        )
    };
    bytes == 0
}

#[inline(always)]
pub(crate) fn lookup(ns: &PidNamespace, task: bpf_pidns_info) -> Option<CurrentTarget> {
    let key = TargetKey {
        ns: *ns,
        tgid: task.tgid,
        reserved: 0,
    };
    // SAFETY: the value is copied out at once; a concurrent removal can only make us
    // attribute one sample to a run that just ended.
    if let Some(t) = unsafe { TARGETS.get(key) } {
        return Some(CurrentTarget {
            runs: t.runs,
            follow: t.follow,
            task,
            skip_kernel_threads: false,
            system: false,
        });
    }
    if config(Config::Following) == 0 {
        return None;
    }
    let global_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // An explicit match, not `Option::map`: with the closure LLVM emitted a read of a register
    // left unset on the None path, which the verifier rejects ("R2 !read_ok").
    #[allow(clippy::manual_map)]
    // SAFETY: as above.
    match unsafe { FOLLOWED.get(global_tgid) } {
        Some(t) => Some(CurrentTarget {
            runs: t.runs,
            follow: t.follow,
            task,
            skip_kernel_threads: false,
            system: false,
        }),
        None => None,
    }
}
