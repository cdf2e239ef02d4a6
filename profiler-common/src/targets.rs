//! Who is sampled: pid namespaces, targets and the runs they belong to, and the run-wide
//! settings userspace writes into the kernel program's configuration array.

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
    /// too ([`SampleKind::Preempted`](crate::SampleKind::Preempted)), so that CPU and off-CPU time add up to wall time
    /// (`--mode wall`). Program-wide: runs that differ in it get different programs.
    OffCpuPreempted = 8,
    /// Shortest time off the CPU recorded, in nanoseconds (`--off-cpu-min`); shorter ones are
    /// dropped at switch-in. Program-wide, as [`Config::OffCpuPreempted`].
    OffCpuMinNs = 9,
    /// Runs (bit `r` for slot `r`) that record a timeline: each of their CPU samples also
    /// goes to the timeline ring ([`TimelineRecord`](crate::TimelineRecord): its key and the time), besides its count.
    /// Runs without the bit pay one branch per sample.
    TimelineRuns = 10,
    /// Byte offset of `task_struct.pid` in this kernel (from its BTF), for the wait scan
    /// ([`WaitScan`](crate::WaitScan)), which reads tasks other than the current one; 0 until userspace set
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
    /// Runs (bit `r` for slot `r`) past their deadline: no sample and no new wait is recorded
    /// for them (a wait already begun still ends), whatever their targets' entries say. Set
    /// by a run's deadline thread, which holds no lock the run's ticks hold, so that a run
    /// ends on time even while a tick takes seconds; cleared when a new run takes the slot.
    StoppedRuns = 16,
    /// Global tgid of a launched command that has not exec'd yet (0: none): its samples and
    /// waits are bpfprof's own code before the exec (`Command::do_exec;execve`), not the
    /// command's, and are not recorded. The exec tracepoint clears it as the command execs.
    AwaitingExec = 17,
}

impl Config {
    /// Entries of the configuration array.
    pub const COUNT: u32 = 18;
}
