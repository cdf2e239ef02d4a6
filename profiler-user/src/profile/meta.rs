//! What a profile says about its run beside the stacks: targets, settings, how the run ended,
//! what was lost or could not be unwound, throttling, and bpfprof's own cost.

use std::time::Duration;

use serde::Serialize;

use super::Tag;
use crate::sampling::Sampling;

/// Why a recording ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunEnd {
    /// The requested duration passed, or a launched command finished.
    Completed,
    /// Every target exited before the requested duration.
    TargetExited,
    /// SIGINT or SIGTERM.
    Interrupted,
}

/// A target as recorded in a profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProfiledTarget {
    /// Pid in bpfprof's own namespace.
    pub pid: u32,
    /// Pid inside the target's pid namespace.
    pub ns_pid: u32,
    /// Inode of the target's pid namespace.
    pub pid_ns: u64,
    /// Process name.
    pub comm: String,
}

/// Samples that were taken but are missing from, or incomplete in, the profile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Losses {
    /// Samples dropped because the kernel's sample map was full.
    pub sample_map_full: u64,
    /// User stacks lost because the stack map was full.
    pub user_stack_map_full: u64,
    /// User stacks that could not be read.
    pub user_stack_error: u64,
    /// Kernel stacks lost because the stack map was full.
    pub kernel_stack_map_full: u64,
    /// Kernel stacks that could not be read.
    pub kernel_stack_error: u64,
    /// Samples the kernel counted that are missing from the drained counts: increments that
    /// raced with moving their count to userspace during the run.
    pub lost_in_transfer: u64,
    /// Samples whose stack was cut at the depth limit (kept, marked `[truncated]`).
    pub truncated: u64,
    /// User stacks whose CFI walk stopped before the outermost frame (a bad read, a loop, a pc
    /// outside executable memory): kept with the frames found until then.
    pub stack_ended_early: u64,
    /// Samples of processes the run's owner could no longer profile (they exec'd a setuid
    /// program or one their user cannot read, or made themselves undumpable): dropped unnamed.
    pub not_profilable: u64,
    /// Switch-outs of target threads whose time off the CPU was not recorded: the kernel's
    /// table of threads off the CPU was full.
    pub off_cpu_pending_full: u64,
    /// Samples in the profile whose time is missing from its timeline: the kernel's timeline
    /// ring was full (only for runs that record a timeline).
    pub timeline_lost: u64,
}

impl Losses {
    /// Each non-zero loss with a readable name.
    pub fn nonzero(&self) -> Vec<(&'static str, u64)> {
        [
            ("sample map full", self.sample_map_full),
            ("user stack map full", self.user_stack_map_full),
            ("user stack unreadable", self.user_stack_error),
            ("kernel stack map full", self.kernel_stack_map_full),
            ("kernel stack unreadable", self.kernel_stack_error),
            ("lost moving counts to userspace", self.lost_in_transfer),
            ("truncated stacks", self.truncated),
            ("user stacks ended early", self.stack_ended_early),
            (
                "dropped: processes no longer yours to profile",
                self.not_profilable,
            ),
            ("off-CPU waits lost: table full", self.off_cpu_pending_full),
            ("timeline samples lost: ring full", self.timeline_lost),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
    }
}

/// Facts about how a profile was taken.
#[derive(Clone, Debug)]
pub struct ProfileMeta {
    /// The processes profiled.
    pub targets: Vec<ProfiledTarget>,
    /// The event and rate really used.
    pub sampling: Sampling,
    /// Wall-clock length of the recording.
    pub duration: Duration,
    /// Samples the kernel program saw for the targets, recorded or not.
    pub samples_seen: u64,
    /// Samples lost or incomplete, by reason.
    pub losses: Losses,
    /// Why the recording ended.
    pub end: RunEnd,
    /// Kernel id of the sampling program.
    pub program_id: u32,
    /// The run's sample tags, on every sample.
    pub tags: Vec<Tag>,
    /// Deepest stack kept, in frames; deeper stacks keep their leaf-most frames.
    pub max_stack_length: usize,
    /// What the profile cost to take.
    pub cost: RunCost,
    /// Samples the kernel did not take (it throttles events that fire faster than
    /// `kernel.perf_event_max_sample_rate` or that use more than `perf_cpu_time_max_percent`
    /// of CPU time), where that was measured and more than a tenth were missing.
    pub throttled: Option<Throttled>,
    /// How the user stacks were walked.
    pub unwound: Unwound,
    /// The objects the targets ran in without an unwind table, most samples first.
    pub untabled: Vec<UntabledObject>,
    /// The objects whose table went into the kernel during the run, after samples had run in
    /// them without it (a table built on demand), earliest first.
    pub tabled_late: Vec<LateTable>,
    /// Off-CPU time recorded alongside the samples (`--off-cpu`, `--mode wall`): then every
    /// writer weighs stacks in nanoseconds ([`Profile::stack_nanos`]).
    pub off_cpu: Option<crate::sampling::OffCpu>,
    /// What the daemon's bounds on reading a target left out (mappings, Python threads,
    /// frames or code objects past a cap), one sentence per process: a target that maps,
    /// lists or points at more than any real program is profiled in part, and says so.
    pub limits_hit: Vec<String>,
    /// The objects the targets ran in that could not be read to name their frames (a copy
    /// past the driver's copy budget, a file its user could truncate that is too large to
    /// copy), each with why: their frames are `module+0xOFFSET`. Named `Unavailable` in the
    /// run's summary.
    pub unavailable: Vec<UnavailableObject>,
    /// The CPythons among the targets whose Python frames bpfprof cannot walk, one sentence
    /// each ("python3.16 (CPython 3.16.0, pid 4711): Python frames not supported by this
    /// bpfprof: <reason>; native frames only"): their profiles have native frames only, and
    /// say why.
    pub python_unsupported: Vec<String>,
}

/// How many user stacks each unwinder produced (`--unwind`), for the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Unwound {
    /// Stacks walked by the kernel program with CFI tables.
    pub cfi_stacks: u64,
    /// Stacks walked by the kernel's frame-pointer walk (processes without tables).
    pub frame_pointer_stacks: u64,
    /// Frames inside CFI walks that had no table and were taken by frame pointer (JIT code,
    /// objects without CFI).
    pub frame_pointer_frames_in_cfi_stacks: u64,
    /// Frames inside CFI walks found by scanning the stack above a frame with neither CFI nor
    /// a usable frame pointer (JIT code, hand-written assembly): a return address right after
    /// a call into code with CFI, so frames between may be missing.
    pub scanned_frames_in_cfi_stacks: u64,
    /// Stacks of processes with CFI tables (or Python frames) taken by frame pointers because
    /// the walker program was still verifying (the first ~0.2 s of a launched command).
    pub before_walker_ready: u64,
    /// Samples with Python frames read from the interpreter.
    pub python_stacks: u64,
    /// Samples of Python threads whose frames could not be read (a thread started since the
    /// last refresh, or an unreadable frame); threads that never had a Python thread state
    /// (OpenMP and other native workers) are not counted.
    pub python_stacks_missing: u64,
    /// Samples with a runtime's frame (Python, Java, JavaScript) left unnamed (`[unknown
    /// Python code]` and the like): its code was freed, or its process exited, before
    /// bpfprof read it. The name is older than the other runtimes.
    pub python_unnamed: u64,
    /// CFI walks with a frame that no unwind table covered, walked there by frame pointer or
    /// a stack scan (which code without frame pointers can lead astray): JIT code, objects
    /// without CFI, objects whose table was not in the kernel yet. Counted by the kernel.
    pub stacks_through_untabled: u64,
}

/// An object that could not be read to name its frames, for the summary.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct UnavailableObject {
    /// Its path (as the target sees it).
    pub name: String,
    /// Why it could not be read.
    pub why: String,
}

/// An object whose unwind table went into the kernel during the run, after samples had run in
/// it without it, for the summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LateTable {
    /// Its path.
    pub name: String,
    /// Seconds from the run's first sample to its table going in.
    pub after_secs: f64,
}

/// An object the targets ran in without an unwind table, for the summary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UntabledObject {
    /// Its path.
    pub name: String,
    /// Why it had no table.
    pub why: String,
    /// Samples whose user stack ran through it.
    pub samples: u64,
}

/// How far the events fell short of the requested rate over a recording, on every CPU.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Throttled {
    /// Samples the events should have delivered at the requested rate.
    pub expected_samples: u64,
    /// Samples they did deliver.
    pub taken_samples: u64,
    /// Why, as far as can be told.
    pub cause: ShortfallCause,
}

/// Why sampling delivered fewer samples than asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShortfallCause {
    /// The kernel throttled the events: the rate is near `kernel.perf_event_max_sample_rate`,
    /// or the kernel lowered that limit during the run (interrupts over
    /// `kernel.perf_cpu_time_max_percent`).
    KernelThrottling,
    /// Well below the kernel's limits: timer interrupts came late or were merged (a loaded
    /// machine, or a VM whose virtual CPUs wait for the host).
    LateTimerInterrupts,
}

impl Throttled {
    /// Below this share of the expected samples, a recording is reported as throttled.
    pub const THRESHOLD: f64 = 0.9;

    /// The share of the expected samples that were taken.
    pub fn taken_share(&self) -> f64 {
        self.taken_samples as f64 / self.expected_samples.max(1) as f64
    }
}

/// Nanoseconds a sample stands for when the profile does not know its rate (1 ms).
pub const FALLBACK_SAMPLE_NANOS: u64 = 1_000_000;

impl ProfileMeta {
    /// Nanoseconds of CPU time one sample stands for: the cpu-clock period, else the time
    /// between samples at the nominal rate (cycles periods vary with the clock speed).
    pub fn sample_nanos(&self) -> u64 {
        let hz = self.sampling.nominal_hz;
        match (self.sampling.event, self.sampling.rate) {
            (crate::sampling::Event::CpuClock, crate::sampling::Rate::Period(ns)) if ns > 0 => ns,
            _ if hz.is_finite() && hz > 0.0 => (1e9 / hz).round() as u64,
            _ => FALLBACK_SAMPLE_NANOS,
        }
    }

    /// The tags as `key=value` joined by `sep`.
    pub fn tag_list(&self, sep: &str) -> String {
        let tags: Vec<String> = self.tags.iter().map(Tag::to_string).collect();
        tags.join(sep)
    }
}

/// What a recording cost, so that every profile states its own overhead.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunCost {
    /// Time the kernel program ran, over all its invocations (including samples of other
    /// processes, which it rejects), where `kernel.bpf_stats_enabled` is on.
    pub bpf_run_time_ns: Option<u64>,
    /// Invocations of the kernel program over the run, where stats are on.
    pub bpf_run_count: Option<u64>,
    /// Time the off-CPU program ran (`--off-cpu`, `--mode wall`: at every context switch of
    /// the machine, recording target threads' switches), where stats are on.
    pub off_cpu_bpf_run_time_ns: Option<u64>,
    /// Its invocations (context switches) over the run, where stats are on.
    pub off_cpu_bpf_run_count: Option<u64>,
    /// bpfprof's own CPU time (user + system) over the run, in seconds.
    pub profiler_cpu_secs: f64,
    /// bpfprof's peak resident memory, in bytes.
    pub profiler_peak_rss_bytes: u64,
    /// Code objects read from the targets' memory to name Python frames.
    pub python_code_objects: u64,
    /// Time spent naming Python frames (reading code objects and line tables), in seconds.
    pub python_naming_secs: f64,
    /// Unwind tables the run's kernel program built so far (every run it served).
    pub unwind_tables_built: u64,
    /// Of those, the tables read from the on-disk cache instead of built.
    pub unwind_tables_cached: u64,
    /// Their rows.
    pub unwind_rows_built: u64,
    /// The build thread's time on them, in seconds (off the thread that samples and answers).
    pub unwind_build_secs: f64,
    /// Bytes of tables resident in the kernel's row array at the end.
    pub unwind_resident_bytes: u64,
    /// Bytes of the kernel's row array (preallocated kernel memory).
    pub unwind_array_bytes: u64,
    /// What the CPU and memory figures measure.
    pub scope: CostScope,
}

/// What [`RunCost::profiler_cpu_secs`] and [`RunCost::profiler_peak_rss_bytes`] measure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CostScope {
    /// The bpfprof process, which made only this profile (the command line).
    #[default]
    Process,
    /// CPU: the daemon's work for this run alone (attach, ticks, collection, processing);
    /// memory: the whole daemon's peak, which its runs share.
    DaemonRun,
}

impl RunCost {
    /// Mean kernel-program time per invocation, when stats were on.
    pub fn bpf_ns_per_run(&self) -> Option<f64> {
        match (self.bpf_run_time_ns, self.bpf_run_count) {
            (Some(t), Some(n)) if n > 0 => Some(t as f64 / n as f64),
            _ => None,
        }
    }
}

impl Losses {
    /// Adds `other`'s losses to these, reason by reason.
    pub fn add(&mut self, other: &Losses) {
        self.sample_map_full += other.sample_map_full;
        self.user_stack_map_full += other.user_stack_map_full;
        self.user_stack_error += other.user_stack_error;
        self.kernel_stack_map_full += other.kernel_stack_map_full;
        self.kernel_stack_error += other.kernel_stack_error;
        self.lost_in_transfer += other.lost_in_transfer;
        self.truncated += other.truncated;
        self.stack_ended_early += other.stack_ended_early;
        self.not_profilable += other.not_profilable;
        self.off_cpu_pending_full += other.off_cpu_pending_full;
        self.timeline_lost += other.timeline_lost;
    }
}

impl Unwound {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Unwound) {
        self.cfi_stacks += other.cfi_stacks;
        self.frame_pointer_stacks += other.frame_pointer_stacks;
        self.frame_pointer_frames_in_cfi_stacks += other.frame_pointer_frames_in_cfi_stacks;
        self.before_walker_ready += other.before_walker_ready;
        self.python_stacks += other.python_stacks;
        self.python_stacks_missing += other.python_stacks_missing;
        self.python_unnamed += other.python_unnamed;
        self.stacks_through_untabled += other.stacks_through_untabled;
    }
}
