//! Plain `#[repr(C)]` types shared by the bpfprof kernel program and its userspace.
//!
//! Everything that crosses the kernel/user boundary is defined here once, so both sides
//! agree on layout by construction. Field order keeps every struct free of implicit padding:
//! BPF hash maps compare keys byte by byte, and padding bytes would make equal keys differ.
#![no_std]

/// Name of the perf_event program in the kernel object (and in `bpftool prog list`).
pub const PROGRAM_NAME: &str = "bpfprof_sample";
/// Names of the `sched:sched_process_fork` tracepoint programs that follow targets' children,
/// one per record layout, in the order of [`FORK_CHILD_PID_OFFSETS`].
pub const FORK_PROGRAM_NAMES: [&str; 2] = ["bpfprof_fork", "bpfprof_fork_data_loc"];
/// Byte offsets of `child_pid` in the `sched_process_fork` record: before 6.10 (inline comm
/// arrays) and from 6.10 on (`__data_loc` comms).
pub const FORK_CHILD_PID_OFFSETS: [usize; 2] = [44, 20];
/// Name of the `sched:sched_process_exit` tracepoint program that forgets exited children.
pub const EXIT_PROGRAM_NAME: &str = "bpfprof_exit";

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
/// Deepest stack the kernel collects; matches the kernel's default `perf_event_max_stack`.
pub const MAX_STACK_DEPTH: usize = 127;
/// Entries of the stack map: distinct user or kernel stacks the kernel holds at once (about
/// 1 KiB each, preallocated). Userspace moves stacks out while recording, so this bounds the
/// new stacks per offload interval, not per run.
pub const STACK_MAP_ENTRIES: u32 = 16384;
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
}

impl Config {
    /// Entries of the configuration array.
    pub const COUNT: u32 = 1;
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
}

impl Counter {
    /// Number of counters per run.
    pub const COUNT: u32 = 6;
    /// Every counter, in index order.
    pub const ALL: [Counter; Self::COUNT as usize] = [
        Counter::Samples,
        Counter::SampleMapFull,
        Counter::UserStackMapFull,
        Counter::UserStackError,
        Counter::KernelStackMapFull,
        Counter::KernelStackError,
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
/// Entries of the per-CPU counter array: every run's counters, then the program-wide counts.
pub const COUNTER_ENTRIES: u32 = INVOCATIONS_INDEX + 1;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are #[repr(C)] with integer fields only and no padding.
    unsafe impl aya::Pod for super::PidNamespace {}
    unsafe impl aya::Pod for super::TargetKey {}
    unsafe impl aya::Pod for super::TargetInfo {}
    unsafe impl aya::Pod for super::SampleKey {}
    unsafe impl aya::Pod for super::StackFrames {}
}
