//! Plain `#[repr(C)]` types shared by the bpfprof kernel program and its userspace.
//!
//! Everything that crosses the kernel/user boundary is defined here once, so both sides
//! agree on layout by construction. Field order keeps every struct free of implicit padding:
//! BPF hash maps compare keys byte by byte, and padding bytes would make equal keys differ.
#![no_std]

/// Name of the perf_event program in the kernel object (and in `bpftool prog list`).
pub const PROGRAM_NAME: &str = "bpfprof_sample";
/// Name of the walker program (CFI and Python walks) the sampling program tail-calls.
pub const WALKER_PROGRAM_NAME: &str = "bpfprof_walk";
/// Index of the walker program in the kernel program's program array.
pub const WALKER_SLOT: u32 = 0;
/// Names of the `sched:sched_process_fork` tracepoint programs that follow targets' children,
/// one per record layout, in the order of [`FORK_CHILD_PID_OFFSETS`].
pub const FORK_PROGRAM_NAMES: [&str; 2] = ["bpfprof_fork", "bpfprof_fork_data_loc"];
/// Byte offsets of `child_pid` in the `sched_process_fork` record: before 6.10 (inline comm
/// arrays) and from 6.10 on (`__data_loc` comms).
pub const FORK_CHILD_PID_OFFSETS: [usize; 2] = [44, 20];
/// Name of the `sched:sched_process_exit` tracepoint program that forgets exited children.
pub const EXIT_PROGRAM_NAME: &str = "bpfprof_exit";
/// Name of the `sched:sched_process_exec` tracepoint program that stops the runs of
/// [`Config::StopAtExec`] from sampling a process the moment it execs.
pub const EXEC_PROGRAM_NAME: &str = "bpfprof_exec";

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

/// How many distinct pid namespaces the kernel program can watch at once.
pub const MAX_PID_NAMESPACES: u32 = 8;
/// How many target processes, over all runs, the kernel program can watch at once.
pub const MAX_TARGETS: u32 = 1024;
/// How many runs (sets of targets with their own samples and counters) can be active at once:
/// the bits of [`TargetInfo::runs`].
pub const MAX_RUNS: u32 = 64;
/// How many children of targets (processes, or threads until userspace prunes them) the kernel
/// program can follow at once.
pub const MAX_FOLLOWED: u32 = 8192;
/// How many exec'd processes the kernel program can report at once: every target and every
/// followed child may exec before userspace looks.
pub const MAX_EXECED: u32 = MAX_TARGETS + MAX_FOLLOWED;
/// How many processes a system-wide run remembers having reported as new
/// ([`MAX_SYSTEM_SEEN`] in an LRU map): one forgotten is reported again, and userspace, which
/// knows it, ignores the report.
pub const MAX_SYSTEM_SEEN: u32 = 8192;
/// Bytes of the ring buffer that reports a system-wide run's new processes (16 bytes a
/// report): room for 4,096 new processes between two of userspace's reads.
pub const NEW_PROCESS_RING_BYTES: u32 = 64 * 1024;
/// Deepest stack the kernel collects: user stacks walked with CFI tables and Python stacks.
/// Kernel stacks and frame-pointer user stacks (`bpf_get_stack`) stop at
/// [`KERNEL_STACK_DEPTH`].
pub const MAX_STACK_DEPTH: usize = 512;
/// Deepest stack `bpf_get_stack` is asked for (kernel stacks, frame-pointer user stacks): the
/// kernel's default `kernel.perf_event_max_stack`, which bounds that helper anyway.
pub const KERNEL_STACK_DEPTH: usize = 127;
/// Deepest stack kept when a run asks for no depth.
pub const DEFAULT_STACK_DEPTH: usize = 127;
/// Entries of the stack map: distinct user or kernel stacks the kernel holds at once (about
/// 4 KiB each, preallocated: 16 MiB). Userspace moves stacks out while recording, so this
/// bounds the new stacks per offload interval, not per run.
pub const STACK_MAP_ENTRIES: u32 = 4096;
/// Entries of the sample map: distinct (run, thread, user stack, kernel stack) combinations.
pub const SAMPLE_MAP_ENTRIES: u32 = 65536;

/// A pid namespace as the kernel identifies it: nsfs device (kernel `dev_t` encoding) and inode.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PidNamespace {
    /// Device of the nsfs mount, encoded as the kernel's internal `dev_t` (`major << 20 | minor`).
    pub dev: u64,
    /// Inode number of the namespace, as in `/proc/PID/ns/pid`; zero marks an unused slot.
    pub ino: u64,
}

/// Key of the target map: a process named by its pid namespace and its tgid inside it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TargetKey {
    /// The target's pid namespace.
    pub ns: PidNamespace,
    /// The target's process id as seen inside `ns`.
    pub tgid: u32,
    /// Always zero; keeps the key free of padding.
    pub reserved: u32,
}

/// Value of the target and followed-children maps: which runs a process's samples belong to.
/// Several runs may watch one process; each gets every sample.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TargetInfo {
    /// Bit `r` set: run slot `r` records this process.
    pub runs: u64,
    /// Bit `r` set: run slot `r` also records the children this process forks from now on
    /// (and theirs): perf's `--inherit`.
    pub follow: u64,
}

/// Indexes of the kernel program's configuration array, written by userspace before attach.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Config {
    /// Number of runs that follow children; zero skips the followed-children lookup.
    Following = 0,
    /// Runs (bit `r` for slot `r`) that stop sampling a process when it execs, until
    /// userspace has checked that the run's owner may still profile the new program (a
    /// non-root user's runs: the new program may be setuid or unreadable to them).
    StopAtExec = 1,
    /// Runs (bit `r` for slot `r`) that record every task on the machine rather than
    /// registered targets (`bpfprof --all`); their samples carry pids as the initial pid
    /// namespace sees them. A program with such a run has no other run (the pool gives a
    /// system-wide run a program of its own), so the settings below are the program's.
    SystemRuns = 2,
    /// Host tgid a system-wide run leaves out: bpfprof's own process.
    SystemExcludeTgid = 3,
    /// Non-zero: a system-wide run leaves out kernel threads (tasks without a user stack).
    SystemNoKernelThreads = 4,
    /// Non-zero: a system-wide run keeps only tasks in this cgroup v2 (its id, the inode of
    /// its directory) or below it.
    SystemCgroupId = 5,
    /// Depth of [`Config::SystemCgroupId`] below the root cgroup (the root is level 0).
    SystemCgroupLevel = 6,
    /// Runs (bit `r` for slot `r`) that record off-CPU time: at a target thread's switch-out
    /// its stacks and the time are remembered, and at its switch-in the time off the CPU is
    /// added to those stacks. A run's bit is cleared before its samples are drained.
    OffCpuRuns = 7,
    /// Non-zero: a switch-out of a runnable thread (preempted, or yielding) counts as off-CPU
    /// too ([`SampleKind::Preempted`]), so that CPU and off-CPU time add up to wall time
    /// (`--mode wall`). Program-wide: runs that differ in it get different programs.
    OffCpuPreempted = 8,
    /// Shortest time off the CPU recorded, in nanoseconds (`--off-cpu-min`); shorter ones are
    /// dropped at switch-in. Program-wide, as [`Config::OffCpuPreempted`].
    OffCpuMinNs = 9,
    /// Runs (bit `r` for slot `r`) that record a timeline: each of their CPU samples also
    /// goes to the timeline ring ([`TimelineRecord`]: its key and the time), besides its count.
    /// Runs without the bit pay one branch per sample.
    TimelineRuns = 10,
    /// Byte offset of `task_struct.pid` in this kernel (from its BTF), for the wait scan
    /// ([`WaitScan`]), which reads tasks other than the current one; 0 until userspace set
    /// the offsets, and then the scan does nothing.
    TaskPidOffset = 11,
    /// Byte offset of `task_struct.__state` (an `unsigned int`).
    TaskStateOffset = 12,
    /// Byte offset of `task_struct.on_cpu` (an `int`).
    TaskOnCpuOffset = 13,
    /// Byte offset of `task_struct.nvcsw` (an `unsigned long`, followed by `nivcsw`).
    TaskNvcswOffset = 14,
    /// Byte offset of `task_struct.nivcsw`.
    TaskNivcswOffset = 15,
}

impl Config {
    /// Entries of the configuration array.
    pub const COUNT: u32 = 16;
}

/// What a sample map entry records: CPU samples or time off the CPU, by the thread's state
/// when it left the CPU ([`SampleKey::kind`]).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleKind {
    /// Samples of the sampling event: the thread was running.
    Cpu = 0,
    /// Off the CPU in an interruptible sleep (`S`: a futex, a pipe, a socket, a sleep).
    Sleeping = 1,
    /// Off the CPU in an uninterruptible sleep (`D`: disk I/O, some locks).
    Disk = 2,
    /// Off the CPU while runnable: preempted or yielding, waiting for a CPU (wall mode only).
    Preempted = 3,
}

impl SampleKind {
    /// The kind of a [`SampleKey::kind`] value; `None` for a value no kernel program writes.
    pub const fn from_u32(v: u32) -> Option<SampleKind> {
        match v {
            0 => Some(SampleKind::Cpu),
            1 => Some(SampleKind::Sleeping),
            2 => Some(SampleKind::Disk),
            3 => Some(SampleKind::Preempted),
            _ => None,
        }
    }
}

/// Id of a stack in the stack map: a 64-bit hash of its frames, so the same stack always gets
/// the same id and userspace may move stacks out of the kernel at any time. Zero means "no
/// stack" (none taken, or it could not be stored).
pub type StackId = u64;

/// A stack as the kernel program stores it: instruction pointers, innermost frame first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackFrames {
    /// Number of valid entries at the start of `ips`.
    pub len: u64,
    /// The frames; entries from `len` on are zero.
    pub ips: [u64; MAX_STACK_DEPTH],
}

/// Key of the sample map; its value is the number of samples with this key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// The run slots the sample was recorded for (bit `r` for slot `r`): one increment serves
    /// every run watching the process; userspace splits counts per run when it moves them.
    pub runs: u64,
    /// Process id as seen in the target's pid namespace.
    pub pid: u32,
    /// Thread id as seen in the target's pid namespace.
    pub tid: u32,
    /// The user stack, or 0 when none was recorded.
    pub user_stack: StackId,
    /// The kernel stack, or 0 when the sample was taken in user mode or none was recorded.
    pub kernel_stack: StackId,
    /// The stack of the process's runtime ([`RuntimeTag`]; CPython's frames encoded by
    /// [`PythonFrame`]), or 0 when the process runs no runtime the kernel walks or the thread
    /// runs none of its code.
    pub runtime_stack: StackId,
    /// A [`SampleKind`] value: CPU samples, or off-CPU time in one thread state.
    pub kind: u32,
    /// Always zero; keeps the key free of padding.
    pub reserved: u32,
}

/// Value of the sample map: how often the key was seen and, for off-CPU keys, the time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SampleValue {
    /// CPU samples, or off-CPU intervals (switch-out to switch-in) recorded.
    pub count: u64,
    /// Nanoseconds off the CPU over those intervals; 0 for CPU samples, whose time userspace
    /// derives from the sampling period.
    pub off_cpu_ns: u64,
}

/// What the kernel remembers of a target thread between its switch-out and its switch-in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OffCpuPending {
    /// The key the off-CPU time goes to: runs, thread, stacks at the switch-out, and state.
    pub key: SampleKey,
    /// `bpf_ktime_get_ns` at the switch-out.
    pub since_ns: u64,
    /// The [`Counter`]s of the user and kernel stacks that could not be read or stored at the
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
    /// Out: the [`SampleKind`] of the wait.
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

/// Name of the timeline ring map in the kernel object.
pub const TIMELINE_MAP: &str = "TIMELINE";
/// Bytes of the timeline ring: 72 bytes a sample (a [`TimelineRecord`] and the ring's 8-byte
/// header), so 14,563 samples between two of userspace's reads (every 100 ms): 145,000
/// samples a second over all CPUs, 36 CPUs at 4 kHz. Allocated when the program loads, used
/// only by runs that ask for a timeline; a sample that finds it full is counted
/// ([`Counter::TimelineLost`]).
pub const TIMELINE_RING_BYTES: u32 = 1 << 20;

/// One sample of a run that records a timeline: what it was counted under and when.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TimelineRecord {
    /// The sample map key the sample was counted under, with `runs` narrowed to the runs that
    /// record a timeline.
    pub key: SampleKey,
    /// `bpf_ktime_get_ns` (`CLOCK_MONOTONIC`) when the sample was taken.
    pub time_ns: u64,
}

/// Per-run counters the kernel program keeps in a per-CPU array at `run * Counter::COUNT + counter`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Samples that hit a target of the run, recorded or not.
    Samples = 0,
    /// Samples lost because the sample map was full.
    SampleMapFull = 1,
    /// User stacks lost because the stack map was full.
    UserStackMapFull = 2,
    /// User stacks that could not be read.
    UserStackError = 3,
    /// Kernel stacks lost because the stack map was full.
    KernelStackMapFull = 4,
    /// Kernel stacks that could not be read.
    KernelStackError = 5,
    /// User stacks walked through CFI tables (the rest used frame pointers throughout).
    CfiStacks = 6,
    /// CFI walks that stopped before the outermost frame: a bad read, a loop, a pc outside
    /// executable memory; the stack keeps the frames found until then.
    StackEndedEarly = 7,
    /// Frames of CFI walks that no table covered and were unwound by frame pointer.
    FramePointerFrames = 8,
    /// Samples of CPython processes whose Python frames were walked.
    PythonStacks = 9,
    /// Samples of CPython threads the kernel did not know yet (started since userspace last
    /// listed the interpreter's threads) or whose frames could not be read: no Python frames.
    PythonStackMissing = 10,
    /// Samples of processes with CFI tables or Python frames that were taken before the walker
    /// program was loaded (it verifies in the background while sampling starts): their user
    /// stacks come from frame pointers and they have no Python frames.
    CfiNotReady = 11,
    /// Frames of CFI walks found by scanning the stack: the frame below had no CFI and no
    /// usable frame pointer (JIT code, hand-written assembly), and the walk took the nearest
    /// word above its stack pointer that returns, right after a call instruction, into code
    /// with CFI.
    ScannedFrames = 12,
    /// Off-CPU intervals recorded (a target thread's switch-out to its switch-in, at least
    /// [`Config::OffCpuMinNs`] long), each one entry in the sample map; their losses share the
    /// counters above (a full sample or stack map).
    OffCpuIntervals = 13,
    /// Switch-outs of target threads not recorded because the pending map
    /// ([`MAX_OFF_CPU_PENDING`]) was full: their time off the CPU is missing.
    OffCpuPendingFull = 14,
    /// Samples of runs that record a timeline ([`Config::TimelineRuns`]) whose time did not
    /// fit the timeline ring ([`TIMELINE_RING_BYTES`]): counted in the profile, missing from
    /// the timeline.
    TimelineLost = 15,
    /// CFI walks with at least one frame that no table covered (unwound by frame pointer or
    /// found by a stack scan): code with no CFI (JIT code, assembly), or an object whose table
    /// was not in the kernel yet (still building, too large, evicted).
    UntabledStacks = 16,
}

impl Counter {
    /// Number of counters per run.
    pub const COUNT: u32 = 17;
    /// Every counter, in index order.
    pub const ALL: [Counter; Self::COUNT as usize] = [
        Counter::Samples,
        Counter::SampleMapFull,
        Counter::UserStackMapFull,
        Counter::UserStackError,
        Counter::KernelStackMapFull,
        Counter::KernelStackError,
        Counter::CfiStacks,
        Counter::StackEndedEarly,
        Counter::FramePointerFrames,
        Counter::PythonStacks,
        Counter::PythonStackMissing,
        Counter::CfiNotReady,
        Counter::ScannedFrames,
        Counter::OffCpuIntervals,
        Counter::OffCpuPendingFull,
        Counter::TimelineLost,
        Counter::UntabledStacks,
    ];

    /// Index of this counter of `run` in the counter array.
    pub const fn index(self, run: u32) -> u32 {
        run * Self::COUNT + self as u32
    }
}

/// Index, in the counter array, of the program-wide count of recorded samples (all runs; one
/// per sample, however many runs it serves), which tells userspace how fast the sample map fills.
pub const ALL_RUNS_SAMPLES_INDEX: u32 = MAX_RUNS * Counter::COUNT;
/// Index, in the counter array, of how often the program ran (every sample of every process on
/// every CPU): against the events' own counts it tells whether the kernel throttled sampling.
pub const INVOCATIONS_INDEX: u32 = ALL_RUNS_SAMPLES_INDEX + 1;
/// Index, in the counter array, of the program-wide count of stacks stored new in the stack
/// map (all kinds).
pub const STACKS_STORED_INDEX: u32 = INVOCATIONS_INDEX + 1;
/// Index, in the counter array, of the program-wide count of Python stacks stored new in the
/// stack map: while it stands still no sample brought a Python stack not seen before, so
/// userspace need not look for new code objects to name.
pub const PYTHON_STACKS_STORED_INDEX: u32 = STACKS_STORED_INDEX + 1;
/// Entries of the per-CPU counter array: every run's counters, then the program-wide counts.
pub const COUNTER_ENTRIES: u32 = PYTHON_STACKS_STORED_INDEX + 1;

/// Rows of every loaded unwind table, end to end, in the kernel's row array: the memory bound
/// of CFI unwinding (8 bytes a row, so 16 MiB, preallocated when the program loads).
pub const MAX_UNWIND_ROWS: u32 = 1 << 21;
/// Processes whose mappings the kernel program can unwind through CFI tables at once.
pub const MAX_UNWIND_PROCESSES: u32 = 1024;
/// Executable mappings per process the CFI walk knows about; further ones unwind by frame pointer.
pub const MAX_UNWIND_MAPPINGS: usize = 256;
/// Bisection steps over one table's rows: enough for 2^22 rows.
pub const UNWIND_TABLE_SEARCH_STEPS: u32 = 22;
/// Bisection steps over one process's mappings: enough for [`MAX_UNWIND_MAPPINGS`].
pub const UNWIND_MAPPING_SEARCH_STEPS: u32 = 9;
/// Stack words the CFI walk scans above a frame that has neither CFI nor a usable frame
/// pointer, looking for its return address: oneDNN's JIT kernels keep up to a few hundred
/// bytes of locals and saved registers below theirs (Breakpad scans 40 words, 160 for the
/// innermost frame).
pub const STACK_SCAN_WORDS: u32 = 160;
/// Scans one walk may make (each up to [`STACK_SCAN_WORDS`] words): a JIT kernel that calls
/// another, or assembly called from JIT code.
pub const STACK_SCANS: u32 = 2;

/// Whether the 8 bytes before a return address (`bytes`, read as a little-endian u64: the
/// byte just before the address is the top byte) end with an x86-64 call instruction: `call
/// rel32`, or `call r/m64` (`FF /2`, any REX prefix) through a register, a memory operand with
/// or without SIB, an 8- or 32-bit displacement, or rip-relative. The stack scan takes a word
/// as a return address only if it follows a call, as a real one always does.
pub const fn follows_call(bytes: u64) -> bool {
    // The byte `k` bytes before the return address.
    const fn before(bytes: u64, k: u32) -> u8 {
        (bytes >> (64 - 8 * k)) as u8
    }
    // A ModRM byte of `FF /2` (reg field 2), split into mod and rm.
    const fn call_modrm(m: u8) -> Option<(u8, u8)> {
        if m & 0x38 == 0x10 {
            Some((m >> 6, m & 7))
        } else {
            None
        }
    }
    if before(bytes, 5) == 0xe8 {
        return true;
    }
    // FF modrm: a register (mod 3) or [reg] (mod 0, rm neither SIB nor rip-relative).
    if before(bytes, 2) == 0xff {
        if let Some((md, rm)) = call_modrm(before(bytes, 1)) {
            if md == 3 || (md == 0 && rm != 4 && rm != 5) {
                return true;
            }
        }
    }
    // FF modrm disp8 (mod 1, no SIB), or FF modrm sib (mod 0, SIB without a disp32 base).
    if before(bytes, 3) == 0xff {
        if let Some((md, rm)) = call_modrm(before(bytes, 2)) {
            if (md == 1 && rm != 4) || (md == 0 && rm == 4 && before(bytes, 1) & 7 != 5) {
                return true;
            }
        }
    }
    // FF modrm sib disp8.
    if before(bytes, 4) == 0xff {
        if let Some((md, rm)) = call_modrm(before(bytes, 3)) {
            if md == 1 && rm == 4 {
                return true;
            }
        }
    }
    // FF modrm disp32 (mod 2, no SIB), or rip-relative (mod 0, rm 5).
    if before(bytes, 6) == 0xff {
        if let Some((md, rm)) = call_modrm(before(bytes, 5)) {
            if (md == 2 && rm != 4) || (md == 0 && rm == 5) {
                return true;
            }
        }
    }
    // FF modrm sib disp32 (mod 2), or SIB with a disp32 and no base (mod 0, base 5).
    if before(bytes, 7) == 0xff {
        if let Some((md, rm)) = call_modrm(before(bytes, 6)) {
            if rm == 4 && (md == 2 || (md == 0 && before(bytes, 5) & 7 == 5)) {
                return true;
            }
        }
    }
    false
}

/// How a row computes the canonical frame address (CFA, the caller's stack pointer).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CfaRule {
    /// No CFI covers this pc: the walk falls back to the frame pointer for this frame.
    NoInfo = 0,
    /// CFA = rsp + offset.
    Rsp = 1,
    /// CFA = rbp + offset.
    Rbp = 2,
    /// The expression compilers emit for PLT stubs: CFA = rsp + offset, plus 8 when
    /// `(rip & 15) >= plt_threshold` (the stub has pushed its relocation index).
    Plt = 3,
    /// The return address is undefined: the outermost frame (`_start`, a thread's entry).
    EndOfStack = 4,
    /// A signal trampoline (`__restore_rt`): rsp points at the `ucontext_t` the kernel saved,
    /// and the interrupted frame's rip, rsp and rbp are read from its `uc_mcontext`.
    SignalFrame = 5,
    /// A frame that realigned its stack (gcc's dynamic realignment for 32- and 64-byte
    /// aligned locals, common in AVX code): CFA = *(rbp - offset), the caller's rbp saved at
    /// rbp. Its CFI is `DW_CFA_def_cfa_expression (DW_OP_breg6 -offset; DW_OP_deref)` with
    /// `DW_CFA_expression: rbp (DW_OP_breg6 0)`.
    RbpDeref = 6,
}

/// Offsets in the x86-64 `ucontext_t` the kernel pushes for a signal handler, from rsp at the
/// signal trampoline: `uc_mcontext.rsp`, `.rip` and `.rbp` (gregs after 40 bytes of uc_flags,
/// uc_link and uc_stack; rsp is greg 15, rip 16, rbp 10).
pub const SIGNAL_FRAME_RSP: u64 = 160;
/// See [`SIGNAL_FRAME_RSP`].
pub const SIGNAL_FRAME_RIP: u64 = 168;
/// See [`SIGNAL_FRAME_RSP`].
pub const SIGNAL_FRAME_RBP: u64 = 120;

/// One row of an unwind table: the rules that hold from `pc` up to the next row's `pc`.
///
/// 8 bytes (BPF array elements are padded to 8 bytes, so 12 would cost 16). The return
/// address is always at CFA - 8, as on every x86-64 ABI frame; rows where CFI says otherwise
/// are stored as [`CfaRule::NoInfo`]. `info` packs: bits 0-2 the [`CfaRule`]; bit 3 set when
/// the caller's rbp is saved; bits 4-15 the rbp save slot's offset from the CFA in 8-byte
/// units (12-bit signed), or for [`CfaRule::Plt`] the `rip & 15` threshold.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindRow {
    /// Start of the range, as an ELF virtual address of the object (before load bias).
    pub pc: u32,
    /// Offset added to the CFA rule's register (CFA offsets are never negative).
    pub cfa_offset: u16,
    /// The packed rules (see the type's documentation).
    pub info: u16,
}

/// Where the return address is, relative to the CFA, in every row.
pub const RETURN_ADDRESS_OFFSET: i64 = -8;
const RBP_SAVED: u16 = 1 << 3;

impl UnwindRow {
    /// A row; `None` when the rbp offset is not a multiple of 8 within ±16 KiB.
    pub const fn new(
        pc: u32,
        rule: CfaRule,
        cfa_offset: u16,
        rbp_offset: Option<i16>,
        plt_threshold: u8,
    ) -> Option<UnwindRow> {
        let mut info = rule as u16;
        if let Some(off) = rbp_offset {
            if off % 8 != 0 || off / 8 < -2048 || off / 8 > 2047 {
                return None;
            }
            info |= RBP_SAVED | (((off / 8) as u16) << 4);
        } else if plt_threshold > 15 {
            return None;
        } else {
            info |= (plt_threshold as u16) << 4;
        }
        Some(UnwindRow {
            pc,
            cfa_offset,
            info,
        })
    }

    /// The row's [`CfaRule`] as its u8 value.
    #[inline(always)]
    pub const fn cfa_rule(&self) -> u8 {
        (self.info & 7) as u8
    }

    /// Where the caller's rbp is saved relative to the CFA, or `None` when rbp is unchanged.
    #[inline(always)]
    pub const fn rbp_offset(&self) -> Option<i16> {
        if self.info & RBP_SAVED != 0 {
            Some(((self.info as i16) >> 4) * 8)
        } else {
            None
        }
    }

    /// For [`CfaRule::Plt`]: the `rip & 15` from which the extra 8 bytes apply.
    #[inline(always)]
    pub const fn plt_threshold(&self) -> u8 {
        (self.info >> 4) as u8 & 15
    }
}

/// One executable mapping of a process, for the CFI walk.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindMapping {
    /// First address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// Runtime address minus ELF virtual address for this mapping's object.
    pub bias: u64,
    /// Index of the object's first row in the row array.
    pub first_row: u32,
    /// Number of rows; zero when the object has no table (walk by frame pointer).
    pub rows: u32,
}

/// The executable mappings of one process, sorted by `start`, as the CFI walk sees them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessMappings {
    /// Number of valid entries at the start of `mappings`.
    pub len: u64,
    /// The mappings; entries from `len` on are zero.
    pub mappings: [UnwindMapping; MAX_UNWIND_MAPPINGS],
}

/// A language runtime whose frames the kernel program walks beside the native stack: the tag
/// userspace gives the frames it names from a runtime's stacks (each runtime has its own
/// walker, maps and frame encoding; a process runs one).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuntimeTag {
    /// CPython 3.10 and later: [`PythonProcess`] per process, frames packed as [`PythonFrame`].
    CPython = 1,
}

impl RuntimeTag {
    /// The runtime's name where outputs tag frames by their runtime (trace event categories,
    /// pprof function names without a file).
    pub const fn name(self) -> &'static str {
        match self {
            RuntimeTag::CPython => "python",
        }
    }

    /// The runtime's OpenTelemetry `profile.frame.type`.
    pub const fn otel_frame_type(self) -> &'static str {
        match self {
            RuntimeTag::CPython => "cpython",
        }
    }
}

/// Processes whose Python frames the kernel program can walk at once.
pub const MAX_PYTHON_PROCESSES: u32 = 1024;
/// Python threads (over all processes) the kernel program knows the thread state of.
pub const MAX_PYTHON_THREADS: u32 = 16384;

/// How a CPython version marks where one `_PyEval_EvalFrameDefault` call's frames end.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PythonEntryRule {
    /// Every frame is its own eval call (3.10: `PyFrameObject`s, one C call each).
    EveryFrame = 0,
    /// A byte at [`PythonProcess::frame_entry`] is non-zero in an eval call's first frame
    /// (3.11's `is_entry`).
    EntryFlag = 1,
    /// Each eval call links a shim frame whose owner byte at [`PythonProcess::frame_entry`] is
    /// [`PYTHON_FRAME_OWNED_BY_CSTACK`] (3.12 and later); the shim itself is not a frame.
    ShimFrame = 2,
}

/// Bytes of a frame the kernel reads at once: every field of [`PythonProcess`] that is read
/// from a frame must end within them (3.10's `f_lasti`, the farthest, ends at byte 100), and
/// pointer fields must be 8-aligned, `int`s 4-aligned (the kernel takes them from whole words).
pub const PYTHON_FRAME_BYTES: usize = 104;

/// Most bytes of memory the kernel copies at once for the Python walk
/// ([`PythonProcess::frame_window`]): 3.11 and later keep a thread's frames one after another
/// on its data stack, each caller just below its callee (about 130 bytes for a function with a
/// few locals), so one copy of the 1 KiB below a frame holds its next callers too.
pub const PYTHON_FRAME_WINDOW_BYTES: usize = 1024;

/// The owner value of the frame each eval call links first (3.12 and 3.13's
/// `FRAME_OWNED_BY_CSTACK`, 3.14 and 3.15's `FRAME_OWNED_BY_INTERPRETER`, which 3.15's
/// thread's base frame also has).
pub const PYTHON_FRAME_OWNED_BY_CSTACK: u8 = 3;

/// Tag bits of a `_PyStackRef` (3.14+'s `f_executable`): 3.14 tags deferred references in
/// bit 0, 3.15 uses bits 0-1 (`Py_TAG_BITS`). Cleared before the pointer is followed; the
/// plain pointers of earlier versions have them clear (objects are at least 8-aligned).
pub const PYTHON_STACKREF_TAG_BITS: u64 = 3;

/// How a CPython version records a frame's current instruction.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PythonInstrRule {
    /// A C `int` holding the instruction's index in code units (3.10's `f_lasti`).
    LastiIndex = 0,
    /// A pointer into the code object's instructions, which start at
    /// [`PythonProcess::code_instructions`] (3.11's and 3.12's `prev_instr`, 3.13's `instr_ptr`).
    Pointer = 1,
}

/// What the kernel program needs to walk one CPython process's frames: byte offsets of the
/// interpreter's structures for its version. Userspace fills it per process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PythonProcess {
    /// Offset in `PyThreadState` of the pointer to the current frame (3.10 `frame`, 3.13
    /// `current_frame`) or to the current `_PyCFrame` (3.11 and 3.12 `cframe`).
    pub tstate_frame: u32,
    /// Offset of `current_frame` in `_PyCFrame` when `tstate_frame` points to one, else
    /// `u32::MAX` (the pointer is the frame itself).
    pub cframe_current_frame: u32,
    /// Offset of the caller's frame pointer in a frame (`previous`, 3.10 `f_back`).
    pub frame_previous: u32,
    /// Offset of the code object pointer in a frame (`f_code`, 3.13 `f_executable`).
    pub frame_code: u32,
    /// Offset of the current instruction in a frame (see `instr_rule`).
    pub frame_instr: u32,
    /// A [`PythonInstrRule`] value.
    pub instr_rule: u32,
    /// Offset of the byte [`PythonEntryRule`] reads (`is_entry`, `owner`); unused for
    /// [`PythonEntryRule::EveryFrame`].
    pub frame_entry: u32,
    /// A [`PythonEntryRule`] value.
    pub entry_rule: u32,
    /// Offset of the first instruction in a code object (`co_code_adaptive`; 0 for 3.10).
    pub code_instructions: u32,
    /// CPython's version, `major << 8 | minor` (0x030c for 3.12); for userspace and bpftool.
    pub version: u32,
    /// Address of the GIL's `last_holder` (the `PyThreadState` that last took it), or 0 when
    /// unknown (then no sample says whether its thread held the GIL).
    pub gil_holder: u64,
    /// Address of the GIL's `locked` flag (a C `int`); read with `gil_holder`, in the same
    /// read where it follows it (at `gil_holder + 8`, as in every version's
    /// `_gil_runtime_state`).
    pub gil_locked: u64,
    /// Bytes the kernel copies at once to read a frame: the frame's [`PYTHON_FRAME_BYTES`]
    /// and up to this many bytes in all below them (never below the frame's page, which is
    /// mapped since the frame is), from which its callers are read while they lie there.
    /// [`PYTHON_FRAME_BYTES`] for 3.10, whose frames are separate heap objects;
    /// [`PYTHON_FRAME_WINDOW_BYTES`] at most.
    pub frame_window: u32,
    /// Offset in a code object of the 8 bytes the kernel reads to tell code objects at one
    /// address apart ([`PythonFrame::identity_of`]): `co_nfreevars` and `co_version` (3.12
    /// and later, which number each code object), `co_name` (3.10, 3.11).
    pub code_identity: u32,
    /// When not 0, those 8 bytes are a pointer, and the identity word is the 8 bytes this
    /// far into the object it points to: `co_name`'s cached string hash (3.10, 3.11), which,
    /// unlike the name's address, a new name at a freed name's address does not keep.
    pub code_identity_deref: u32,
    /// Offset in a frame of its `tlbc_index` (a C `int32_t`: which thread-local copy of its
    /// code's bytecode the frame runs), or 0 where the build has none (GIL builds, 3.13t):
    /// free-threaded 3.14+ give each thread its own copy of the bytecode it specializes, and
    /// `instr_ptr` points into that copy, not into `co_code_adaptive`.
    pub frame_tlbc_index: u32,
    /// Offset in a code object of `co_tlbc`, the pointer to its `_PyCodeArray` of
    /// thread-local copies (`Py_ssize_t size; char *entries[]`, entry 0 the code object's
    /// own `co_code_adaptive`); 0 with `frame_tlbc_index`.
    pub code_tlbc: u32,
    /// Non-zero for a free-threaded (no-GIL) build: the kernel appends
    /// [`PythonFrame::NO_GIL`] to its stacks where a GIL build's get a GIL entry.
    pub free_threaded: u32,
    /// Offset in the thread state of `asyncio_running_task` (CPython 3.14+: the asyncio task
    /// the thread runs, or NULL), or 0: the kernel records no task. Where set, a stack whose
    /// thread runs a task ends with [`PythonFrame::task_entry`] and the task's address.
    pub tstate_running_task: u32,
    /// Offset in a task of its coroutine pointer, whose identity bits the task entry keeps
    /// (a task freed and another put at its address has another coroutine).
    pub task_coro: u32,
}

/// One Python frame as the kernel records it in a Python stack: the code object's address,
/// the instruction index and a few bits of the code object's identity packed into 64 bits,
/// plus whether the frame is the first one of an `_PyEval_EvalFrameDefault` call (where the
/// native stack has that C function).
///
/// Bits 0-42: the code object's address divided by 16 (CPython allocates objects 16-aligned
/// on 64-bit machines, pymalloc and malloc alike, and user addresses fit 47 bits); bits
/// 43-55: the instruction index in code units, saturated at [`PythonFrame::MAX_INSTRUCTION`];
/// bits 56-62: the identity ([`PythonFrame::identity_of`]); bit 63: the eval-entry flag.
///
/// The identity is there because CPython frees code objects and puts others at their
/// addresses (code made by `exec`, `compile`, or reloaded): without it the new function's
/// frames are the old one's, one stack and one name for both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PythonFrame {
    /// Address of the frame's code object in the target's memory.
    pub code: u64,
    /// Index of the current instruction in code units (2 bytes each).
    pub instruction: u32,
    /// [`PythonFrame::identity_of`] the code object's identity word when the frame was read.
    pub identity: u8,
    /// Whether this frame is the first (outermost) of one `_PyEval_EvalFrameDefault` call.
    pub eval_entry: bool,
}

impl PythonFrame {
    /// Largest instruction index a packed frame holds (16 KiB of bytecode, more than all
    /// but generated functions have); larger ones are clamped to it, and their line is the
    /// function's first.
    pub const MAX_INSTRUCTION: u32 = (1 << 13) - 1;
    const CODE_BITS: u32 = 43;
    const CODE_SHIFT: u32 = 4;
    const INSTRUCTION_BITS: u32 = 13;
    const IDENTITY_SHIFT: u32 = Self::CODE_BITS + Self::INSTRUCTION_BITS;
    /// Bits of identity a frame keeps: a code object put where another was is told apart
    /// from it about 125 times in 126 (0 is [`PythonFrame::UNKNOWN_IDENTITY`], and 1 takes
    /// its words).
    pub const IDENTITY_MASK: u8 = 0x7f;
    const ENTRY_BIT: u64 = 1 << 63;

    /// The identity bits of a frame whose code object's identity word could not be had: the
    /// read failed, or (3.10, 3.11) the name's hash was not computed yet. Such a frame is
    /// named after whatever object is at its address, as all were before identity bits;
    /// [`PythonFrame::identity_of`] never gives it.
    pub const UNKNOWN_IDENTITY: u8 = 0;

    /// What a `str`'s cached hash is until something hashes it (3.10, 3.11 names): a word
    /// that changes later, so that frames recorded before and after would differ.
    pub const HASH_NOT_COMPUTED: u64 = u64::MAX;

    /// The identity bits of a code object whose identity word ([`PythonProcess`]'s
    /// `code_identity` field) is `word`: the top bits of MurmurHash3's 64-bit finalizer of
    /// it, in which every bit of the word moves them (a pointer's low bits are alignment, a
    /// version counter's high bits rarely change); 1 where they are 0, which is
    /// [`PythonFrame::UNKNOWN_IDENTITY`].
    #[inline(always)]
    pub const fn identity_of(word: u64) -> u8 {
        let mut x = word;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^= x >> 33;
        let bits = (x >> 57) as u8 & Self::IDENTITY_MASK;
        if bits == Self::UNKNOWN_IDENTITY {
            1
        } else {
            bits
        }
    }

    /// Whether a frame recorded with identity bits `frame` may be named after an object
    /// whose bits are `object`: when they are equal, or either is unknown.
    #[inline(always)]
    pub const fn identities_match(frame: u8, object: u8) -> bool {
        frame == object || frame == Self::UNKNOWN_IDENTITY || object == Self::UNKNOWN_IDENTITY
    }

    /// Packs the frame into one stack entry.
    #[inline(always)]
    pub const fn pack(code: u64, instruction: u32, identity: u8, eval_entry: bool) -> u64 {
        let instruction = if instruction > Self::MAX_INSTRUCTION {
            Self::MAX_INSTRUCTION
        } else {
            instruction
        };
        let mut v = ((code >> Self::CODE_SHIFT) & ((1 << Self::CODE_BITS) - 1))
            | ((instruction as u64) << Self::CODE_BITS)
            | (((identity & Self::IDENTITY_MASK) as u64) << Self::IDENTITY_SHIFT);
        if eval_entry {
            v |= Self::ENTRY_BIT;
        }
        v
    }

    /// The entry the kernel appends, outermost, to the Python stack of a thread that holds the
    /// GIL (code address 0 is never a frame).
    pub const GIL_HELD: u64 = 1 << Self::CODE_BITS;
    /// The entry appended to the Python stack of a thread that does not hold the GIL.
    pub const GIL_NOT_HELD: u64 = 2 << Self::CODE_BITS;
    /// The entry appended to the Python stack of a thread of a free-threaded build, which
    /// has no GIL to hold.
    pub const NO_GIL: u64 = 3 << Self::CODE_BITS;

    /// The entry the kernel appends, after the GIL entry, to the Python stack of a thread
    /// that runs an asyncio task, with the task coroutine's identity bits
    /// ([`PythonFrame::identity_of`] its address); the task's address follows it, last.
    #[inline(always)]
    pub const fn task_entry(identity: u8) -> u64 {
        (4 << Self::CODE_BITS) | (((identity & Self::IDENTITY_MASK) as u64) << Self::IDENTITY_SHIFT)
    }

    /// The identity bits of a task entry, or `None` for any other entry.
    #[inline(always)]
    pub const fn task_entry_identity(packed: u64) -> Option<u8> {
        let low =
            packed & !(((Self::IDENTITY_MASK as u64) << Self::IDENTITY_SHIFT) | Self::ENTRY_BIT);
        if low == 4 << Self::CODE_BITS {
            Some((packed >> Self::IDENTITY_SHIFT) as u8 & Self::IDENTITY_MASK)
        } else {
            None
        }
    }

    /// Whether a packed entry is one of the kernel's GIL entries (outermost), not a frame.
    #[inline(always)]
    pub const fn is_gil_entry(packed: u64) -> bool {
        packed == Self::GIL_HELD || packed == Self::GIL_NOT_HELD || packed == Self::NO_GIL
    }

    /// Marks a packed frame as the first of an eval call.
    #[inline(always)]
    pub const fn with_eval_entry(packed: u64) -> u64 {
        packed | Self::ENTRY_BIT
    }

    /// A packed frame without its eval-entry flag: what names it.
    #[inline(always)]
    pub const fn without_eval_entry(packed: u64) -> u64 {
        packed & !Self::ENTRY_BIT
    }

    /// Unpacks a stack entry.
    pub const fn unpack(packed: u64) -> PythonFrame {
        PythonFrame {
            code: (packed & ((1 << Self::CODE_BITS) - 1)) << Self::CODE_SHIFT,
            instruction: ((packed >> Self::CODE_BITS) as u32) & Self::MAX_INSTRUCTION,
            identity: (packed >> Self::IDENTITY_SHIFT) as u8 & Self::IDENTITY_MASK,
            eval_entry: packed & Self::ENTRY_BIT != 0,
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are #[repr(C)] with integer fields only and no padding.
    unsafe impl aya::Pod for super::PidNamespace {}
    unsafe impl aya::Pod for super::TargetKey {}
    unsafe impl aya::Pod for super::TargetInfo {}
    unsafe impl aya::Pod for super::SampleKey {}
    unsafe impl aya::Pod for super::SampleValue {}
    unsafe impl aya::Pod for super::OffCpuPending {}
    unsafe impl aya::Pod for super::WaitScan {}
    unsafe impl aya::Pod for super::TimelineRecord {}
    unsafe impl aya::Pod for super::StackFrames {}
    unsafe impl aya::Pod for super::UnwindRow {}
    unsafe impl aya::Pod for super::ProcessMappings {}
    unsafe impl aya::Pod for super::PythonProcess {}
}

#[cfg(test)]
mod tests {
    use super::{follows_call, PythonFrame};

    /// The 8 bytes before a return address that follows `call`, padded in front with `pad`.
    fn before_return(call: &[u8], pad: u8) -> u64 {
        let mut bytes = [pad; 8];
        bytes[8 - call.len()..].copy_from_slice(call);
        u64::from_le_bytes(bytes)
    }

    #[test]
    fn call_instructions_are_recognised_before_a_return_address() {
        // Encodings as gcc and as(1) emit them.
        let calls: &[&[u8]] = &[
            &[0xe8, 0x10, 0x20, 0x30, 0x40],             // call rel32
            &[0xff, 0xd0],                               // call *%rax
            &[0x41, 0xff, 0xd3],                         // call *%r11
            &[0xff, 0x10],                               // call *(%rax)
            &[0xff, 0x50, 0x18],                         // call *0x18(%rax)
            &[0x41, 0xff, 0x54, 0x24, 0x08],             // call *0x8(%r12)
            &[0xff, 0x14, 0xc1],                         // call *(%rcx,%rax,8)
            &[0xff, 0x15, 0x00, 0x10, 0x00, 0x00],       // call *0x1000(%rip)
            &[0xff, 0x90, 0x00, 0x01, 0x00, 0x00],       // call *0x100(%rax)
            &[0xff, 0x94, 0x24, 0x00, 0x01, 0x00, 0x00], // call *0x100(%rsp)
        ];
        for call in calls {
            // Padding that is no call itself (nop).
            assert!(follows_call(before_return(call, 0x90)), "{call:x?}");
        }
        let not_calls: &[&[u8]] = &[
            &[0x90, 0x90],                   // nops
            &[0xff, 0xe0],                   // jmp *%rax (FF /4)
            &[0xff, 0xc0],                   // inc %eax (FF /0)
            &[0x48, 0x89, 0xe5],             // mov %rsp,%rbp
            &[0xe9, 0x10, 0x20, 0x30, 0x40], // jmp rel32
        ];
        for bytes in not_calls {
            assert!(!follows_call(before_return(bytes, 0x90)), "{bytes:x?}");
        }
    }

    #[test]
    fn python_frames_round_trip_and_saturate() {
        let code = 0x7fff_ffff_fff0u64;
        for identity in 0..=PythonFrame::IDENTITY_MASK {
            let f = PythonFrame::unpack(PythonFrame::pack(code, 1234, identity, true));
            assert_eq!(
                f,
                PythonFrame {
                    code,
                    instruction: 1234,
                    identity,
                    eval_entry: true
                }
            );
        }
        let f = PythonFrame::unpack(PythonFrame::pack(code, u32::MAX, 0xff, false));
        assert_eq!(f.instruction, PythonFrame::MAX_INSTRUCTION);
        assert_eq!(f.identity, PythonFrame::IDENTITY_MASK);
        assert_eq!(f.code, code);
        assert!(!f.eval_entry);
        let marked = PythonFrame::with_eval_entry(PythonFrame::pack(code, 7, 3, false));
        assert!(PythonFrame::unpack(marked).eval_entry);
        assert_eq!(
            PythonFrame::without_eval_entry(marked),
            PythonFrame::pack(code, 7, 3, false)
        );
    }

    #[test]
    fn identities_of_nearby_words_spread_over_every_value() {
        // Names are objects a few dozen bytes apart, 8- or 16-aligned; versions (3.12+) are
        // counted up in the word's high half, a few apart.
        let pointer = |i: u64| 0x7f00_0000_0000 + i * 48;
        let version = |i: u64| (900 + 2 * i) << 32;
        for word in [&pointer as &dyn Fn(u64) -> u64, &version] {
            let mut seen = [0u32; 128];
            for i in 0..1600 {
                seen[PythonFrame::identity_of(word(i)) as usize] += 1;
            }
            // 12.5 words a value on average; 1 takes 0's too, and 0 (unknown) none.
            assert_eq!(seen[0], 0);
            assert!((5..=50).contains(&seen[1]), "{seen:?}");
            assert!(seen[2..].iter().all(|&n| (2..=30).contains(&n)), "{seen:?}");
            // Neighbours alike about 1 time in 128, as by chance.
            let alike = (1..1600)
                .filter(|&i| {
                    PythonFrame::identity_of(word(i - 1)) == PythonFrame::identity_of(word(i))
                })
                .count();
            assert!(alike < 40, "{alike} neighbours alike");
        }
        // The same word as Python's test helpers compute it (tests/workloads/pyshortcode.py).
        assert_eq!(PythonFrame::identity_of(0), 1);
        // No word gives the unknown identity.
        assert!((0..100_000u64)
            .flat_map(|i| [i, i << 32, 0x7f00_0000_0000 + i * 16, u64::MAX - i])
            .all(|w| PythonFrame::identity_of(w) != PythonFrame::UNKNOWN_IDENTITY));
        assert_eq!(PythonFrame::identity_of(901 << 32), 73);
    }
}
