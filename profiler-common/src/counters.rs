//! The kernel program's per-run and program-wide counters.

use crate::MAX_RUNS;

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
    /// [`Config::OffCpuMinNs`](crate::Config::OffCpuMinNs) long), each one entry in the sample map; their losses share the
    /// counters above (a full sample or stack map).
    OffCpuIntervals = 13,
    /// Switch-outs of target threads not recorded because the pending map
    /// ([`MAX_OFF_CPU_PENDING`](crate::MAX_OFF_CPU_PENDING)) was full: their time off the CPU is missing.
    OffCpuPendingFull = 14,
    /// Samples of runs that record a timeline ([`Config::TimelineRuns`](crate::Config::TimelineRuns)) whose time did not
    /// fit the timeline ring ([`TIMELINE_RING_BYTES`](crate::TIMELINE_RING_BYTES)): counted in the profile, missing from
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
