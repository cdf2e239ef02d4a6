//! The kernel object's programs: their names, as userspace finds them, and the tracepoint
//! record layouts they read.

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
/// [`Config::StopAtExec`](crate::Config::StopAtExec) from sampling a process the moment it execs.
pub const EXEC_PROGRAM_NAME: &str = "bpfprof_exec";
