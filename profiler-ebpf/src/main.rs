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
    helpers::{
        bpf_get_current_ancestor_cgroup_id, bpf_get_current_pid_tgid, bpf_get_ns_current_pid_tgid,
        bpf_get_stack, generated::bpf_loop,
    },
    macros::{map, perf_event},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
    programs::{PerfEventContext, TracePointContext},
    EbpfContext,
};
use profiler_common::{
    Config, Counter, PidNamespace, SampleKey, SampleKind, SampleValue, StackFrames, StackId,
    TargetInfo, TargetKey, ALL_RUNS_SAMPLES_INDEX, COUNTER_ENTRIES, FORK_CHILD_PID_OFFSETS,
    INVOCATIONS_INDEX, KERNEL_STACK_DEPTH, MAX_EXECED, MAX_FOLLOWED, MAX_PID_NAMESPACES, MAX_RUNS,
    MAX_STACK_DEPTH, MAX_SYSTEM_SEEN, MAX_TARGETS, NEW_PROCESS_RING_BYTES, SAMPLE_MAP_ENTRIES,
    STACKS_STORED_INDEX, STACK_MAP_ENTRIES, WALKER_SLOT,
};

/// Declares a classic tracepoint program `$name` that runs `$handler` on the tracepoint's
/// record and returns [`TRACEPOINT_KEEP_EVENT`].
///
/// aya-ebpf's `#[tracepoint]` cannot do this: the function it generates discards the value of
/// the one it wraps and returns 0, which drops the event for every other tool (see
/// [`TRACEPOINT_KEEP_EVENT`]). This is the same entry point (the `tracepoint` section, which
/// userspace loads and attaches by name) with the value kept.
macro_rules! tracepoint_program {
    ($(#[$doc:meta])* $name:ident => $handler:path) => {
        $(#[$doc])*
        #[no_mangle]
        #[link_section = "tracepoint"]
        pub fn $name(ctx: *mut core::ffi::c_void) -> u32 {
            $handler(&aya_ebpf::programs::TracePointContext::new(ctx));
            $crate::TRACEPOINT_KEEP_EVENT
        }
    };
}

/// What every classic tracepoint program returns: "pass the event on". The kernel runs the
/// programs attached to a tracepoint (`trace_call_bpf`, the AND of all their return values)
/// before the tracepoint's perf events, and a 0 drops the event for every perf event of that
/// tracepoint, machine-wide: `perf record -e sched:sched_switch`, `perf sched`, bpftrace and
/// another bpfprof would see none while a run is on. 1 leaves them as they were.
///
/// The perf_event programs return 0 instead: `bpf_overflow_handler` reads their value only to
/// decide whether the sample also goes to the ring buffer of the perf event they are attached
/// to, which is bpfprof's own (opened for it, never mapped), so other tools' events are
/// unaffected and 0 saves the copy.
pub(crate) const TRACEPOINT_KEEP_EVENT: u32 = 1;

mod off_cpu;
mod python;
mod timeline;
mod unwind;
mod v8;
mod waits;

const EEXIST: i32 = 17;

/// Pid namespaces that hold at least one target; slots with `ino == 0` are free.
#[map]
static PID_NAMESPACES: Array<PidNamespace> = Array::with_max_entries(MAX_PID_NAMESPACES, 0);

/// Target processes, by namespace and in-namespace tgid, and the runs each belongs to.
#[map]
static TARGETS: HashMap<TargetKey, TargetInfo> = HashMap::with_max_entries(MAX_TARGETS, 0);

/// Children of targets forked while a run follows children, by global pid (the fork
/// tracepoint knows no other), and the runs they belong to. Thread creations land here too
/// (the tracepoint does not tell them apart); userspace prunes them.
#[map]
static FOLLOWED: HashMap<u32, TargetInfo> = HashMap::with_max_entries(MAX_FOLLOWED, 0);

/// Processes that exec'd while runs of [`Config::StopAtExec`] sampled them, by global tgid, and
/// those runs (bits), which stopped sampling them at the exec: userspace re-checks the run's
/// owner against the new program and resumes or drops the process, then clears its bit.
#[map]
static EXECED: HashMap<u32, u64> = HashMap::with_max_entries(MAX_EXECED, 0);

/// Processes a system-wide run has reported in [`NEW_PROCESSES`], by global tgid. Userspace
/// removes a process when it sees it exit, so that a reused pid is reported again.
#[map]
static SYSTEM_SEEN: LruHashMap<u32, u8> = LruHashMap::with_max_entries(MAX_SYSTEM_SEEN, 0);

/// Global tgids of processes a system-wide run sampled for the first time: userspace reads
/// their maps at its next tick (0.1 s) instead of finding them in the sample map at its next
/// refresh (0.5 s), which a process that lives 0.2 s may not outlive.
#[map]
static NEW_PROCESSES: RingBuf = RingBuf::with_byte_size(NEW_PROCESS_RING_BYTES, 0);

/// Settings userspace writes before attaching (`Config`).
#[map]
static CONFIG: Array<u64> = Array::with_max_entries(Config::COUNT, 0);

/// User and kernel stacks by a hash of their frames. A hash map rather than the kernel's stack
/// trace map: the latter keeps one stack per bucket and refuses a colliding stack, which loses
/// samples long before it is full on a program with many distinct stacks. Preallocated:
/// allocating 1 KiB entries in interrupt context fails (ENOMEM) in bursts of new stacks.
#[map]
static STACKS: HashMap<StackId, StackFrames> = HashMap::with_max_entries(STACK_MAP_ENTRIES, 0);

/// Per-CPU room to read a stack into: 1 KiB does not fit on the 512-byte BPF stack.
#[map]
pub(crate) static SCRATCH: PerCpuArray<StackFrames> = PerCpuArray::with_max_entries(1, 0);

/// Sample counts (and off-CPU time) by (runs, thread, user stack, kernel stack, Python stack,
/// kind).
#[map]
static SAMPLES: HashMap<SampleKey, SampleValue> = HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);

/// Per-run counters (`Counter`), per CPU so that no atomics are needed.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_ENTRIES, 0);

/// The walker program (CFI and Python walks) at [`WALKER_SLOT`] once userspace has loaded it.
/// It takes twice as long to verify as the sampling program (20k verified instructions against
/// 10k), so userspace starts sampling with the sampling program alone and adds the walker from
/// a background thread: samples taken before that use frame pointers and are counted as such.
#[map]
static WALKERS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The sampling program: keeps target samples, with frame-pointer stacks, and hands samples of
/// processes that need the CFI or Python walk to the walker program.
#[perf_event]
pub fn bpfprof_sample(ctx: PerfEventContext) -> u32 {
    increment(INVOCATIONS_INDEX);
    if let Some(target) = current_target() {
        if target.skip_kernel_threads && is_kernel_thread(&ctx) {
            return 0;
        }
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if target.system {
            report_new_process(tgid);
        }
        let wants_walker = unwind::is_unwound(tgid) || python::is_python(tgid);
        if wants_walker {
            // SAFETY: the context is this program's own; the call does not return when the
            // walker is loaded.
            unsafe { WALKERS.tail_call(&ctx, WALKER_SLOT) };
        }
        record::<false>(&ctx, &target, wants_walker);
    }
    0
}

/// The walker program: records the sample with the CFI walk of its user stack and the Python
/// walk of its interpreter frames. Reached only by tail call from `bpfprof_sample`.
#[perf_event]
pub fn bpfprof_walk(ctx: PerfEventContext) -> u32 {
    if let Some(target) = current_target() {
        record::<true>(&ctx, &target, false);
    }
    0
}

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
fn follow_fork<const CHILD_PID_OFFSET: usize>(ctx: &TracePointContext) {
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
fn forget_exited(_ctx: &TracePointContext) {
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
fn stop_at_exec(_ctx: &TracePointContext) {
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
fn stop_runs(info: &mut TargetInfo, stopping: u64) -> u64 {
    let stopped = info.runs & stopping;
    info.runs &= !stopping;
    info.follow &= !stopping;
    stopped
}

/// The current task's key in the target map, if its process's pid namespace is watched.
#[inline(always)]
fn current_target_key() -> Option<TargetKey> {
    let (ns, task) = current_ns_task()?;
    Some(TargetKey {
        ns,
        tgid: task.tgid,
        reserved: 0,
    })
}

/// The current task's watched pid namespace and its ids there, if its namespace is watched.
#[inline(always)]
fn current_ns_task() -> Option<(PidNamespace, bpf_pidns_info)> {
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
    if system != 0 {
        // A program with a system-wide run has no other run.
        return system_target(system);
    }
    let (ns, task) = current_ns_task()?;
    lookup(&ns, task)
}

/// The current task for the system-wide `runs`, unless it is left out: the idle task,
/// bpfprof itself, a task outside the run's cgroup.
#[inline(always)]
fn system_target(runs: u64) -> Option<CurrentTarget> {
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

/// An entry of the configuration array; 0 when unset.
#[inline(always)]
pub(crate) fn config(entry: Config) -> u64 {
    match CONFIG.get(entry as u32) {
        Some(v) => *v,
        None => 0,
    }
}

#[inline(always)]
fn lookup(ns: &PidNamespace, task: bpf_pidns_info) -> Option<CurrentTarget> {
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

/// Records one sample for every run of `target`: the stacks are stored once and one count
/// (keyed by the set of runs) goes up; only the per-run counters are kept per run. `WALK`
/// (the walker program) walks user stacks by CFI and Python frames; without it the kernel's
/// frame-pointer walk is used, and `walker_missed` says the process wanted the walker.
#[inline(always)]
fn record<const WALK: bool>(ctx: &PerfEventContext, target: &CurrentTarget, walker_missed: bool) {
    let runs = target.runs;
    if runs == 0 {
        return;
    }
    increment(ALL_RUNS_SAMPLES_INDEX);
    // The walks' own statistics (CFI stacks, walks that ended early, frame-pointer frames,
    // Python stacks) go to the lowest run of the sample only: they describe the unwinder, and
    // one count per sample is what they need.
    let stats_run = lowest_bit(runs);
    let user_stack = if WALK {
        // Processes userspace loaded CFI tables for are walked by `unwind`; the rest by the
        // kernel's frame-pointer walk.
        let id = match unwind::user_registers(ctx) {
            Some((ip, sp, bp)) => unwind::cfi_stack(ip, sp, bp, stats_run),
            None => unwind::NOT_UNWOUND,
        };
        if id == unwind::NOT_UNWOUND {
            store_stack(ctx, BPF_F_USER_STACK as u64)
        } else {
            Ok(id)
        }
    } else {
        store_stack(ctx, BPF_F_USER_STACK as u64)
    };
    let kernel_stack = store_stack(ctx, 0);
    let python_stack = if WALK {
        match python::bpfprof_python_stack(stats_run) {
            // A process runs one runtime: V8's frames, recorded by the CFI walk, otherwise.
            0 => v8::store(stats_run),
            id => id,
        }
    } else {
        0
    };
    let key = SampleKey {
        runs,
        pid: target.task.tgid,
        tid: target.task.pid,
        user_stack: user_stack.unwrap_or(0),
        kernel_stack: kernel_stack.unwrap_or(0),
        runtime_stack: python_stack,
        kind: SampleKind::Cpu as u32,
        reserved: 0,
    };
    let map_full = !increment_sample(&key, 0);
    let timeline_lost = !timeline::record(&key);
    // One set of counter bits rather than the counters themselves: to the verifier, every
    // combination of these outcomes is then the same unknown number, and it checks what follows
    // once instead of once per combination (it followed this tail up to 143 times).
    let mut counters = 1 << Counter::Samples as u32;
    if let Err(c) = user_stack {
        counters |= 1 << c as u32;
    }
    if let Err(c) = kernel_stack {
        counters |= 1 << c as u32;
    }
    if map_full {
        counters |= 1 << Counter::SampleMapFull as u32;
    }
    if timeline_lost {
        counters |= 1 << Counter::TimelineLost as u32;
    }
    if walker_missed {
        counters |= 1 << Counter::CfiNotReady as u32;
    }
    count_runs(runs, counters);
}

/// Adds one to each counter of the set `counters` (bit `c` for `Counter` `c`) for every run
/// of `runs`.
#[inline(always)]
pub(crate) fn count_runs(runs: u64, counters: u64) {
    bpfprof_count_runs(runs, counters);
}

/// [`count_runs`] itself. A global function, which the verifier checks once on its own, with
/// both arguments unknown: inlined, it was checked again for every combination of counters its
/// callers could pass (each a constant to the verifier).
#[no_mangle]
#[inline(never)]
pub extern "C" fn bpfprof_count_runs(runs: u64, counters: u64) -> u64 {
    if runs == 0 {
        return 0;
    }
    if runs & (runs - 1) == 0 {
        // One run, the common case: no loop at all.
        count_run_counters(lowest_bit(runs), counters);
    } else {
        // Several runs watch this process. A bounded loop over every run slot would be
        // verified once per slot; under bpf_loop the body is verified once.
        let mut counts = RunCounts { runs, counters };
        // SAFETY: `count_run` has the callback signature bpf_loop expects, and `counts`
        // outlives the call.
        unsafe {
            bpf_loop(
                MAX_RUNS,
                count_run as *mut _,
                (&mut counts as *mut RunCounts).cast(),
                0,
            )
        };
    }
    0
}

/// What to count for each run of a sample, shared with the `bpf_loop` callback.
#[repr(C)]
struct RunCounts {
    runs: u64,
    /// The counters to add one to, as bits (bit `c` for `Counter` `c`).
    counters: u64,
}

/// The bit of `counter` in a set for [`count_runs`]; none for [`NO_COUNTER`].
#[inline(always)]
pub(crate) fn counter_bit(counter: u32) -> u64 {
    if counter < Counter::COUNT {
        1 << counter
    } else {
        0
    }
}

/// No counter: a loss that did not happen (see `OffCpuPending::stack_losses`).
pub(crate) const NO_COUNTER: u32 = u32::MAX;

/// The `bpf_loop` callback: counts one sample for run `index` if the sample belongs to it.
extern "C" fn count_run(index: u64, counts: *mut core::ffi::c_void) -> i64 {
    // SAFETY: bpf_loop passes back the pointer `bpfprof_count_runs` gave it.
    let counts = unsafe { &*(counts as *const RunCounts) };
    let run = index as u32;
    if run >= MAX_RUNS {
        return 1;
    }
    if counts.runs & (1u64 << run) != 0 {
        count_run_counters(run, counts.counters);
    }
    0
}

/// Adds one to each counter of `counters` for `run`: one step per counter set, most often one.
#[inline(always)]
fn count_run_counters(run: u32, counters: u64) {
    if run >= MAX_RUNS {
        return;
    }
    let mut left = counters & ((1 << Counter::COUNT) - 1);
    let mut n = 0;
    while n < Counter::COUNT && left != 0 {
        increment(run * Counter::COUNT + lowest_bit(left));
        left &= left - 1;
        n += 1;
    }
}

/// Index of the lowest set bit of a non-zero `v` (BPF has no count-trailing-zeros): the number
/// of ones below it, counted without a branch. With branches the verifier would follow each of
/// the 64 possible results separately through everything after (the CFI walk included) and run
/// out of its instruction budget.
#[inline(always)]
fn lowest_bit(v: u64) -> u32 {
    let below = (v & v.wrapping_neg()).wrapping_sub(1);
    let mut c = below - ((below >> 1) & 0x5555_5555_5555_5555);
    c = (c & 0x3333_3333_3333_3333) + ((c >> 2) & 0x3333_3333_3333_3333);
    c = (c + (c >> 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    (c.wrapping_mul(0x0101_0101_0101_0101) >> 56) as u32
}

/// Adds one to the count of `key` and `off_cpu_ns` to its time, inserting it if new; false
/// when the map is full.
#[inline(always)]
pub(crate) fn increment_sample(key: &SampleKey, off_cpu_ns: u64) -> bool {
    if let Some(value) = SAMPLES.get_ptr_mut(key) {
        add_sample(value, off_cpu_ns);
        return true;
    }
    let first = SampleValue {
        count: 1,
        off_cpu_ns,
    };
    match SAMPLES.insert(key, first, BPF_NOEXIST as u64) {
        Ok(()) => true,
        // Another CPU inserted the same key between our lookup and insert.
        Err(e) if e == -EEXIST => {
            if let Some(value) = SAMPLES.get_ptr_mut(key) {
                add_sample(value, off_cpu_ns);
            }
            true
        }
        Err(_) => false,
    }
}

#[inline(always)]
fn add_sample(value: *mut SampleValue, off_cpu_ns: u64) {
    // SAFETY: a field of a map value that stays valid while the program runs.
    unsafe {
        atomic_add(core::ptr::addr_of_mut!((*value).count), 1);
        if off_cpu_ns != 0 {
            atomic_add(core::ptr::addr_of_mut!((*value).off_cpu_ns), off_cpu_ns);
        }
    }
}

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
const HASH_K: u64 = 0x9e37_79b9_7f4a_7c15;
/// Frames [`stack_hash`] mixes in one `bpf_loop` iteration: a few, so that the loop's cost
/// per frame stays that of a plain loop.
const HASH_CHUNK: usize = 8;
const _: () = assert!(MAX_STACK_DEPTH.is_multiple_of(HASH_CHUNK));

/// [`stack_hash`]'s state, shared with its `bpf_loop` callback.
#[repr(C)]
struct Hashing {
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
fn stack_hash(frames: &StackFrames, len: usize) -> StackId {
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

/// Adds one to `counter` of `run`; nothing for a run out of range (the off-CPU program's walks
/// pass [`MAX_RUNS`]: the unwinders' statistics describe samples).
#[inline(always)]
fn count(run: u32, counter: Counter) {
    if run < MAX_RUNS {
        increment(counter.index(run));
    }
}

/// This CPU's value of counter `index` (0 where it cannot be read).
#[inline(always)]
pub(crate) fn counter_value(index: u32) -> u64 {
    COUNTERS.get(index).copied().unwrap_or(0)
}

#[inline(always)]
pub(crate) fn increment(index: u32) {
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
