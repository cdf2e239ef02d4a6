//! What a sample records: its kind, the stacks it names and the key it is counted under.

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
    /// The stack of the process's runtime ([`RuntimeTag`](crate::RuntimeTag); CPython's frames encoded by
    /// [`PythonFrame`](crate::PythonFrame)), or 0 when the process runs no runtime the kernel walks or the thread
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
